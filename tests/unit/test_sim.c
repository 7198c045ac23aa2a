/*
 * test_sim.c — unit tests of the simulated GPU (pool/sim/backend_sim.c, sim_memory.c, sim_clock.c),
 * driven directly through gp_backend_sim and gpupool_sim.h, without a pool.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "sim/sim_backend.h"
#include "base/config.h"
#include "gpupool_sim.h"

#define MiB ((size_t)1 << 20)

static const gp_backend_ops *const B = &gp_backend_sim;

/* Opens a sim of `capacity` bytes without a pool (the config is filled by hand, not by config.c). */
static gp_sim *open_sim(size_t capacity, void **ctx)
{
    gp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    strcpy(cfg.backend, "sim");
    cfg.device_memory = capacity;
    cr_assert_eq(B->open(&cfg, 0, ctx), GP_OK, "open: %s", gp_last_error());
    gp_sim *sim = gp_backend_sim_instance(*ctx);
    cr_assert_not_null(sim);
    return sim;
}

static gp_sim_report report_of(gp_sim *sim)
{
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    return r;
}

static gp_devptr alloc_ok(void *ctx, size_t size)
{
    gp_devptr p = 0;
    cr_assert_eq(B->mem_alloc(ctx, size, &p), GP_OK, "mem_alloc(%zu): %s", size, gp_last_error());
    return p;
}

static void *ptr(gp_devptr p)
{
    return (void *)p;
}

/* ---- memory ----------------------------------------------------------------------------------- */

Test(sim_memory, alloc_free_ledger)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_devptr b = alloc_ok(ctx, 4 * MiB);
    cr_expect_eq(a % (2 * MiB), 0);
    cr_expect_eq(b % (2 * MiB), 0);
    cr_expect_neq(a, b);

    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.allocated_bytes, 6 * MiB);
    cr_expect_eq(r.allocations, 2);
    size_t free_bytes = 0, total = 0;
    cr_assert_eq(B->mem_info(ctx, &free_bytes, &total), GP_OK);
    cr_expect_eq(free_bytes, 58 * MiB);
    cr_expect_eq(total, 64 * MiB);

    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    r = report_of(sim);
    cr_expect_eq(r.allocated_bytes, 4 * MiB);
    cr_expect_eq(r.allocated_peak, 6 * MiB);
    cr_expect_eq(r.allocations, 1);

    gp_devptr c = alloc_ok(ctx, 2 * MiB); /* first fit: the hole left by a */
    cr_expect_eq(c, a);
    cr_assert_eq(B->mem_free(ctx, c, 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, b, 4 * MiB), GP_OK);

    r = report_of(sim);
    cr_expect_eq(r.allocated_bytes, 0);
    cr_expect_eq(r.bad_calls, 0);
    cr_expect_str_eq(gp_sim_first_violation(sim), "");
    B->close(ctx);
}

Test(sim_memory, capacity_rounds_up_to_2mib)
{
    void *ctx;
    open_sim(3 * MiB, &ctx);
    size_t free_bytes = 0, total = 0;
    cr_assert_eq(B->mem_info(ctx, &free_bytes, &total), GP_OK);
    cr_expect_eq(total, 4 * MiB);
    cr_expect_eq(free_bytes, 4 * MiB);
    B->close(ctx);
}

Test(sim_memory, sizes_must_be_positive_multiples_of_2mib)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_devptr p = 0;
    cr_expect_eq(B->mem_alloc(ctx, 0, &p), GP_ERR_INVALID);
    cr_expect_eq(B->mem_alloc(ctx, 1 * MiB, &p), GP_ERR_INVALID);
    cr_expect_eq(B->mem_alloc(ctx, 3 * MiB, &p), GP_ERR_INVALID);
    cr_expect(strstr(gp_last_error(), "multiple of 2 MiB") != NULL, "%s", gp_last_error());
    cr_expect_eq(p, 0, "out-parameter written on failure");
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.bad_calls, 3);
    cr_expect_eq(r.allocated_bytes, 0);
    B->close(ctx);
}

Test(sim_memory, out_of_memory_message)
{
    void *ctx;
    gp_sim *sim = open_sim(8 * MiB, &ctx);
    gp_devptr big = alloc_ok(ctx, 6 * MiB);
    gp_devptr p = 0;
    cr_assert_eq(B->mem_alloc(ctx, 4 * MiB, &p), GP_ERR_OOM);
    cr_expect_str_eq(gp_last_error(), "sim: out of device memory: requested 4.0 MiB, 2.0 MiB free of 8.0 MiB");
    cr_expect_eq(B->mem_alloc(ctx, 64 * MiB, &p), GP_ERR_OOM);
    cr_expect_eq(report_of(sim).bad_calls, 0, "OOM is not a bad call");
    cr_assert_eq(B->mem_free(ctx, big, 6 * MiB), GP_OK);

    /* 4 MiB free in two separate holes still serve a 4 MiB request, as on a real GPU: the sim's
     * address space is larger than its capacity, so only the capacity limits allocation */
    gp_devptr q[4];
    for (int i = 0; i < 4; i++)
        q[i] = alloc_ok(ctx, 2 * MiB);
    cr_assert_eq(B->mem_free(ctx, q[0], 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, q[2], 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_alloc(ctx, 4 * MiB, &p), GP_OK, "%s", gp_last_error());
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &big), GP_ERR_OOM, "the capacity is used up");
    cr_assert_eq(B->mem_free(ctx, p, 4 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, q[1], 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, q[3], 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_memory, bad_free_detected)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 4 * MiB);
    cr_expect_eq(B->mem_free(ctx, a + 2 * MiB, 2 * MiB), GP_ERR_INVALID); /* interior */
    cr_expect(strstr(gp_last_error(), "bad free") != NULL, "%s", gp_last_error());
    cr_expect_eq(B->mem_free(ctx, a, 2 * MiB), GP_ERR_INVALID);           /* wrong size */
    cr_expect_eq(B->mem_free(ctx, 0x1000, 2 * MiB), GP_ERR_INVALID);      /* never allocated */
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.bad_calls, 3);
    cr_expect_eq(r.allocated_bytes, 4 * MiB, "a bad free frees nothing");
    cr_expect(strncmp(gp_sim_first_violation(sim), "bad call: bad free: mem_free(", 29) == 0, "%s",
              gp_sim_first_violation(sim));

    cr_assert_eq(B->mem_free(ctx, a, 4 * MiB), GP_OK);
    cr_expect_eq(B->mem_free(ctx, a, 4 * MiB), GP_ERR_INVALID); /* double free */
    cr_expect_eq(report_of(sim).bad_calls, 4);
    B->close(ctx);
}

Test(sim_memory, leak_at_close_reported)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_sim_retain(sim);
    alloc_ok(ctx, 2 * MiB);
    alloc_ok(ctx, 4 * MiB);
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(ctx, &ev), GP_OK);
    cr_expect_eq(report_of(sim).events, 1);
    B->close(ctx);

    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.closed, 1);
    cr_expect_eq(r.leaked_bytes_at_close, 6 * MiB);
    cr_expect_eq(r.leaked_events_at_close, 1);
    cr_expect(strstr(gp_sim_first_violation(sim), "leak at close: 6.0 MiB") != NULL, "%s",
              gp_sim_first_violation(sim));
    /* a closed sim does nothing else */
    cr_expect_eq(gp_sim_launch(sim, NULL, NULL, 0, GP_SIM_READ, 0, 1), GP_ERR_DESTROYED);
    gp_sim_advance(sim, 100);
    cr_expect_eq(gp_sim_now(sim), 0);
    cr_expect_neq(gp_sim_stream_create(sim), NULL);
    gp_sim_release(sim);
}

Test(sim_memory, clean_close_reports_nothing)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_sim_retain(sim);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(ctx, &ev), GP_OK);
    cr_assert_eq(B->event_destroy(ctx, ev), GP_OK);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.closed, 1);
    cr_expect_eq(r.leaked_bytes_at_close, 0);
    cr_expect_eq(r.leaked_events_at_close, 0);
    cr_expect_eq(r.allocated_peak, 2 * MiB);
    cr_expect_str_eq(gp_sim_first_violation(sim), "");
    gp_sim_release(sim);
}

Test(sim_memory, host_access_crashes, .signal = SIGSEGV)
{
    void *ctx;
    open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    signal(SIGSEGV, SIG_DFL); /* die by the signal even under a sanitizer's SEGV handler */
    *(volatile char *)ptr(a) = 1;
}

Test(sim_memory, contents_gone_after_free_and_realloc)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 4096, GP_SIM_WRITE, 7, 10), GP_OK);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    gp_devptr b = alloc_ok(ctx, 2 * MiB);
    cr_assert_eq(b, a);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(b), 4096, GP_SIM_CHECK, 7, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 1);
    cr_assert_eq(B->mem_free(ctx, b, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_memory, mem_free_waits_for_the_device)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_devptr b = alloc_ok(ctx, 2 * MiB);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(a), 64, GP_SIM_WRITE, 1, 1000), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 0);
    cr_assert_eq(B->mem_free(ctx, b, 2 * MiB), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 1000);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

/* ---- kernels and patterns --------------------------------------------------------------------- */

Test(sim_kernel, write_then_check)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 4 * MiB);
    size_t lengths[] = {1, 7, 8, 1001, 4096, 3 * MiB + 5};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        gp_devptr at = a + 3 + i * 16;
        cr_assert_eq(gp_sim_launch(sim, NULL, ptr(at), lengths[i], GP_SIM_WRITE, 42 + i, 5), GP_OK);
        cr_assert_eq(gp_sim_launch(sim, NULL, ptr(at), lengths[i], GP_SIM_CHECK, 42 + i, 5), GP_OK);
        cr_assert_eq(gp_sim_launch(sim, NULL, ptr(at), lengths[i], GP_SIM_READ, 0, 5), GP_OK);
    }
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));

    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 4096, GP_SIM_WRITE, 1, 5), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 4096, GP_SIM_CHECK, 2, 5), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 1);
    cr_expect(strstr(gp_sim_first_violation(sim), "pattern mismatch: CHECK(seed 2)") != NULL, "%s",
              gp_sim_first_violation(sim));
    cr_expect(strstr(gp_sim_first_violation(sim), "differs at byte offset 0") != NULL, "%s",
              gp_sim_first_violation(sim));
    cr_assert_eq(B->mem_free(ctx, a, 4 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_kernel, mismatch_reports_first_differing_offset)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 1000, GP_SIM_WRITE, 9, 1), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a + 800), 100, GP_SIM_WRITE, 10, 1), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 1000, GP_SIM_CHECK, 9, 1), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 1);
    /* the overwrite starts at offset 800; its first byte could equal by chance, so accept 800..807 */
    const char *v = gp_sim_first_violation(sim);
    const char *at = strstr(v, "byte offset 80");
    cr_expect(at != NULL && at[15] == '\0', "%s", v);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_kernel, launch_outside_allocations_is_a_bad_call)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_devptr b = alloc_ok(ctx, 2 * MiB);
    cr_assert_eq(b, a + 2 * MiB, "first fit places b right after a");
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(a + 2 * MiB - 8), 16, GP_SIM_WRITE, 1, 1), GP_ERR_INVALID,
                 "a range across two allocations");
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(0x1000), 16, GP_SIM_READ, 1, 1), GP_ERR_INVALID);
    cr_assert_eq(B->mem_free(ctx, b, 2 * MiB), GP_OK);
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(b), 16, GP_SIM_READ, 1, 1), GP_ERR_INVALID, "use after free");
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(a), 16, 7, 1, 1), GP_ERR_INVALID, "unknown op");
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.bad_calls, 3);
    cr_expect(strstr(gp_sim_first_violation(sim), "kernel on unallocated memory: WRITE") != NULL, "%s",
              gp_sim_first_violation(sim));
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(a), 2 * MiB, GP_SIM_WRITE, 1, 1), GP_OK);
    cr_expect_eq(gp_sim_launch(sim, NULL, NULL, 0, GP_SIM_WRITE, 1, 1), GP_OK, "an empty range is fine");
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

/* ---- races ------------------------------------------------------------------------------------ */

typedef struct race_fixture {
    void *ctx;
    gp_sim *sim;
    gp_devptr a;
    gp_stream s, g;
} race_fixture;

static race_fixture race_setup(void)
{
    race_fixture f;
    f.sim = open_sim(16 * MiB, &f.ctx);
    f.a = alloc_ok(f.ctx, 2 * MiB);
    f.s = gp_sim_stream_create(f.sim);
    f.g = gp_sim_stream_create(f.sim);
    return f;
}

static void race_teardown(race_fixture *f)
{
    cr_assert_eq(B->mem_free(f->ctx, f->a, 2 * MiB), GP_OK);
    B->close(f->ctx);
}

Test(sim_race, unordered_writes_race)
{
    race_fixture f = race_setup();
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a + 1024), 4096, GP_SIM_WRITE, 2, 100), GP_OK);
    gp_sim_report r = report_of(f.sim);
    cr_expect_eq(r.races, 1);
    const char *v = gp_sim_first_violation(f.sim);
    cr_expect(strncmp(v, "race: WRITE on stream 0x", 24) == 0, "%s", v);
    cr_expect(strstr(v, "while WRITE on stream") != NULL && strstr(v, "(op #1) is not ordered before it"), "%s", v);
    race_teardown(&f);
}

Test(sim_race, wait_on_event_recorded_after_orders)
{
    race_fixture f = race_setup();
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(f.ctx, &ev), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(B->event_record(f.ctx, ev, f.s), GP_OK);
    cr_assert_eq(B->stream_wait_event(f.ctx, f.g, ev), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 0, "%s", gp_sim_first_violation(f.sim));
    cr_assert_eq(B->event_destroy(f.ctx, ev), GP_OK);
    race_teardown(&f);
}

Test(sim_race, event_recorded_before_the_kernel_does_not_order)
{
    race_fixture f = race_setup();
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(f.ctx, &ev), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_READ, 1, 100), GP_OK);
    cr_assert_eq(B->event_record(f.ctx, ev, f.s), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(B->stream_wait_event(f.ctx, f.g, ev), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_READ, 2, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1, "the WRITE after the record is not ordered");
    cr_expect(strstr(gp_sim_first_violation(f.sim), "(op #3)") != NULL, "%s", gp_sim_first_violation(f.sim));
    cr_assert_eq(B->event_destroy(f.ctx, ev), GP_OK);
    race_teardown(&f);
}

Test(sim_race, completed_kernel_does_not_race)
{
    race_fixture f = race_setup();
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_WRITE, 1, 100), GP_OK);
    gp_sim_advance(f.sim, 99);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 8, GP_SIM_READ, 2, 1), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1, "still running at 99 ns");
    gp_sim_advance(f.sim, 1);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1, "finished at 100 ns");
    race_teardown(&f);
}

/* deepest_queue: the most ops queued on one stream at once, kept after they complete */
Test(sim_race, deepest_queue_counts_what_one_stream_has_queued)
{
    race_fixture f = race_setup();
    cr_expect_eq(report_of(f.sim).deepest_queue, 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_USE, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a) + 8192, 8, GP_SIM_USE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).deepest_queue, 3, "three kernels on s, one on g");
    gp_sim_advance(f.sim, 150); /* the first on s is done: two left */
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_USE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).deepest_queue, 3, "three again, not four");
    gp_sim_synchronize(f.sim);
    cr_expect_eq(report_of(f.sim).deepest_queue, 3, "the most at once, after they completed too");
    race_teardown(&f);
}

Test(sim_race, reads_do_not_race_and_disjoint_ranges_do_not_race)
{
    race_fixture f = race_setup();
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_READ, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_READ, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_CHECK, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a + 4096), 4096, GP_SIM_WRITE, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a + 8192), 4096, GP_SIM_WRITE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 0, "%s", gp_sim_first_violation(f.sim));
    /* same stream never races with itself */
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a + 8192), 4096, GP_SIM_WRITE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 0);
    /* a READ on G of what S writes does */
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a + 4096 + 100), 1, GP_SIM_READ, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1);
    cr_expect(strncmp(gp_sim_first_violation(f.sim), "race: READ on stream", 20) == 0, "%s",
              gp_sim_first_violation(f.sim));
    race_teardown(&f);
}

Test(sim_race, ordering_is_transitive)
{
    race_fixture f = race_setup();
    gp_stream t = gp_sim_stream_create(f.sim);
    gp_event e1 = NULL, e2 = NULL;
    cr_assert_eq(B->event_create(f.ctx, &e1), GP_OK);
    cr_assert_eq(B->event_create(f.ctx, &e2), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(B->event_record(f.ctx, e1, f.s), GP_OK);
    cr_assert_eq(B->stream_wait_event(f.ctx, t, e1), GP_OK);
    cr_assert_eq(B->event_record(f.ctx, e2, t), GP_OK);
    cr_assert_eq(B->stream_wait_event(f.ctx, f.g, e2), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 0, "%s", gp_sim_first_violation(f.sim));
    gp_sim_synchronize(f.sim);
    cr_expect_eq(gp_sim_now(f.sim), 200);
    cr_assert_eq(B->event_destroy(f.ctx, e1), GP_OK);
    cr_assert_eq(B->event_destroy(f.ctx, e2), GP_OK);
    race_teardown(&f);
}

/* USE (replays): ordered and race-checked as a write, with no effect on the contents. */
Test(sim_race, use_races_as_a_write_and_leaves_the_contents)
{
    race_fixture f = race_setup();
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_WRITE, 7, 10), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_USE, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_CHECK, 7, 10), GP_OK);
    gp_sim_synchronize(f.sim);
    cr_expect_eq(report_of(f.sim).pattern_mismatches, 0, "USE changed the contents: %s", gp_sim_first_violation(f.sim));
    cr_expect_eq(report_of(f.sim).races, 0, "one stream never races with itself");
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 4096, GP_SIM_USE, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a + 4000), 8, GP_SIM_READ, 0, 1), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1, "a READ of what a USE still uses races");
    cr_expect(strstr(gp_sim_first_violation(f.sim), "while USE on stream") != NULL, "%s",
              gp_sim_first_violation(f.sim));
    gp_sim_advance(f.sim, 100);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.a), 4096, GP_SIM_USE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1, "the first USE has completed");
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a + 8192), 4096, GP_SIM_USE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1, "disjoint ranges do not race");
    race_teardown(&f);
}

/* ---- events, waits and virtual time ----------------------------------------------------------- */

Test(sim_time, event_query_not_ready_until_time_advances)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(ctx, &ev), GP_OK);
    cr_expect_eq(B->event_query(ctx, ev), GP_OK, "never recorded");
    cr_assert_eq(B->event_record(ctx, ev, NULL), GP_OK);
    cr_expect_eq(B->event_query(ctx, ev), GP_OK, "recorded on an idle stream");

    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 64, GP_SIM_WRITE, 1, 50), GP_OK);
    cr_assert_eq(B->event_record(ctx, ev, NULL), GP_OK);
    cr_expect_eq(B->event_query(ctx, ev), GP_ERR_NOT_READY);
    cr_expect_eq(B->event_query(ctx, ev), GP_ERR_NOT_READY, "a query never advances time");
    gp_sim_advance(sim, 49);
    cr_expect_eq(B->event_query(ctx, ev), GP_ERR_NOT_READY);
    gp_sim_advance(sim, 1);
    cr_expect_eq(B->event_query(ctx, ev), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 50);

    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 64, GP_SIM_WRITE, 1, 30), GP_OK);
    cr_assert_eq(B->event_record(ctx, ev, NULL), GP_OK);
    cr_assert_eq(B->event_synchronize(ctx, ev), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 80);
    cr_expect_eq(B->event_query(ctx, ev), GP_OK);

    cr_assert_eq(B->event_destroy(ctx, ev), GP_OK);
    cr_expect_eq(B->event_query(ctx, ev), GP_ERR_INVALID, "a destroyed event");
    cr_expect_eq(report_of(sim).bad_calls, 1);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_time, stream_wait_event_makes_a_stream_wait)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_stream s = gp_sim_stream_create(sim), g = gp_sim_stream_create(sim);
    gp_event on_s = NULL, on_g = NULL;
    cr_assert_eq(B->event_create(ctx, &on_s), GP_OK);
    cr_assert_eq(B->event_create(ctx, &on_g), GP_OK);

    cr_assert_eq(gp_sim_launch(sim, s, ptr(a), 64, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(B->event_record(ctx, on_s, s), GP_OK);
    cr_assert_eq(B->stream_wait_event(ctx, g, on_s), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, g, ptr(a), 64, GP_SIM_CHECK, 1, 10), GP_OK);
    cr_assert_eq(B->event_record(ctx, on_g, g), GP_OK);

    gp_sim_advance(sim, 100);
    cr_expect_eq(B->event_query(ctx, on_s), GP_OK);
    cr_expect_eq(B->event_query(ctx, on_g), GP_ERR_NOT_READY, "G's kernel starts when S's ends");
    gp_sim_advance(sim, 9);
    cr_expect_eq(B->event_query(ctx, on_g), GP_ERR_NOT_READY);
    gp_sim_advance(sim, 1);
    cr_expect_eq(B->event_query(ctx, on_g), GP_OK);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.races, 0);
    cr_expect_eq(r.pattern_mismatches, 0, "the CHECK ran after the WRITE: %s", gp_sim_first_violation(sim));

    /* waiting on a completed event, or one never recorded, does not delay */
    gp_event fresh = NULL;
    cr_assert_eq(B->event_create(ctx, &fresh), GP_OK);
    cr_assert_eq(B->stream_wait_event(ctx, g, on_s), GP_OK);
    cr_assert_eq(B->stream_wait_event(ctx, g, fresh), GP_OK);
    cr_assert_eq(B->event_record(ctx, on_g, g), GP_OK);
    cr_expect_eq(B->event_query(ctx, on_g), GP_OK);

    cr_assert_eq(B->event_destroy(ctx, on_s), GP_OK);
    cr_assert_eq(B->event_destroy(ctx, on_g), GP_OK);
    cr_assert_eq(B->event_destroy(ctx, fresh), GP_OK);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_time, kernels_on_one_stream_run_in_order_streams_in_parallel)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_stream s = gp_sim_stream_create(sim), t = gp_sim_stream_create(sim);
    gp_sim_advance(sim, 1000); /* idle time: kernels start at launch, not earlier */
    cr_assert_eq(gp_sim_launch(sim, s, ptr(a), 64, GP_SIM_READ, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(a), 64, GP_SIM_READ, 0, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, t, ptr(a), 64, GP_SIM_READ, 0, 150), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(gp_sim_now(sim), 1200);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(a), 64, GP_SIM_READ, 0, 0), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 1200, "a zero-length kernel completes at once");
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_time, stream_synchronize_runs_only_what_it_needs)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_stream slow = gp_sim_stream_create(sim), fast = gp_sim_stream_create(sim),
              g = gp_sim_stream_create(sim);
    gp_event on_fast = NULL, on_slow = NULL;
    cr_assert_eq(B->event_create(ctx, &on_fast), GP_OK);
    cr_assert_eq(B->event_create(ctx, &on_slow), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, slow, ptr(a), 64, GP_SIM_READ, 0, 1000), GP_OK);
    cr_assert_eq(B->event_record(ctx, on_slow, slow), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, fast, ptr(a), 64, GP_SIM_READ, 0, 100), GP_OK);
    cr_assert_eq(B->event_record(ctx, on_fast, fast), GP_OK);
    cr_assert_eq(B->stream_wait_event(ctx, g, on_fast), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, g, ptr(a), 64, GP_SIM_READ, 0, 20), GP_OK);
    gp_sim_stream_synchronize(sim, g);
    cr_expect_eq(gp_sim_now(sim), 120);
    cr_expect_eq(B->event_query(ctx, on_slow), GP_ERR_NOT_READY);
    gp_sim_synchronize(sim);
    cr_expect_eq(gp_sim_now(sim), 1000);
    cr_expect_eq(B->event_query(ctx, on_slow), GP_OK);
    cr_assert_eq(B->event_destroy(ctx, on_fast), GP_OK);
    cr_assert_eq(B->event_destroy(ctx, on_slow), GP_OK);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_time, stream_handles_are_fresh)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(ctx, &ev), GP_OK);
    /* use a value lazily that stream_create might otherwise hand out */
    gp_stream lazy = (gp_stream)(uintptr_t)(0x5151000 + 16);
    cr_assert_eq(B->event_record(ctx, ev, lazy), GP_OK);
    gp_stream seen[64];
    for (int i = 0; i < 64; i++) {
        seen[i] = gp_sim_stream_create(sim);
        cr_assert_not_null(seen[i]);
        cr_assert_neq(seen[i], lazy);
        for (int j = 0; j < i; j++)
            cr_assert_neq(seen[i], seen[j]);
    }
    cr_assert_eq(B->event_destroy(ctx, ev), GP_OK);
    B->close(ctx);
}

/* ---- fault injection -------------------------------------------------------------------------- */

Test(sim_fault, nth_alloc_fails_once_and_changes_nothing)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_sim_fail_call(sim, 3, GP_SIM_CALL_MEM_ALLOC, GP_ERR_OOM);
    gp_devptr p[4] = {0};
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &p[0]), GP_OK);
    size_t free_bytes = 0, total = 0;
    cr_assert_eq(B->mem_info(ctx, &free_bytes, &total), GP_OK, "not in the mask");
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &p[1]), GP_OK);
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &p[2]), GP_ERR_OOM);
    cr_expect_str_eq(gp_last_error(), "sim: injected fault in mem_alloc (call #3)");
    cr_expect_eq(p[2], 0);
    cr_expect_eq(report_of(sim).allocated_bytes, 4 * MiB);
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &p[3]), GP_OK, "one fault per arming");
    cr_expect_eq(gp_sim_faults_injected(sim), 1);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_ALLOC), 4);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_ALLOC | GP_SIM_CALL_MEM_INFO), 5);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_ALL), 5);
    cr_expect_eq(report_of(sim).bad_calls, 0, "an injected fault is not a bad call");
    cr_assert_eq(B->mem_free(ctx, p[0], 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, p[1], 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, p[3], 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_fault, failed_free_and_record_change_nothing)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = alloc_ok(ctx, 2 * MiB);
    gp_stream s = gp_sim_stream_create(sim);
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(ctx, &ev), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(a), 64, GP_SIM_WRITE, 1, 500), GP_OK);

    gp_sim_fail_call(sim, 1, GP_SIM_CALL_MEM_FREE, GP_ERR_DEVICE);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_ERR_DEVICE);
    cr_expect_eq(gp_sim_now(sim), 0, "a failed free does not synchronize");
    cr_expect_eq(report_of(sim).allocated_bytes, 2 * MiB, "a failed free frees nothing");

    gp_sim_fail_call(sim, 2, GP_SIM_CALL_EVENT_RECORD | GP_SIM_CALL_STREAM_WAIT, GP_ERR_DEVICE);
    cr_assert_eq(B->stream_wait_event(ctx, s, ev), GP_OK, "first call in the mask");
    cr_assert_eq(B->event_record(ctx, ev, s), GP_ERR_DEVICE, "second call in the mask");
    cr_expect(strstr(gp_last_error(), "injected fault in event_record (call #1)") != NULL, "%s",
              gp_last_error());
    cr_expect_eq(B->event_query(ctx, ev), GP_OK, "the failed record enqueued nothing");
    cr_assert_eq(B->event_record(ctx, ev, s), GP_OK);
    cr_expect_eq(B->event_query(ctx, ev), GP_ERR_NOT_READY);

    gp_sim_fail_call(sim, 1, GP_SIM_CALL_ALL, GP_ERR_DEVICE);
    gp_sim_fail_call(sim, 0, GP_SIM_CALL_ALL, GP_ERR_DEVICE); /* disarms */
    cr_expect_eq(B->event_query(ctx, ev), GP_ERR_NOT_READY);
    cr_expect_eq(gp_sim_faults_injected(sim), 2);

    cr_assert_eq(B->event_destroy(ctx, ev), GP_OK);
    cr_assert_eq(B->mem_free(ctx, a, 2 * MiB), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 500);
    B->close(ctx);
}

/* ---- threads ---------------------------------------------------------------------------------- */

typedef struct worker_arg {
    void *ctx;
    gp_sim *sim;
    int id;
    int failures;
} worker_arg;

static void *worker(void *opaque)
{
    worker_arg *w = opaque;
    gp_stream stream = gp_sim_stream_create(w->sim);
    gp_event ev = NULL;
    if (B->event_create(w->ctx, &ev) != GP_OK)
        w->failures++;
    for (int i = 0; i < 200; i++) {
        gp_devptr p = 0;
        if (B->mem_alloc(w->ctx, 2 * MiB, &p) != GP_OK) {
            w->failures++;
            continue;
        }
        uint64_t seed = (uint64_t)w->id * 1000 + (uint64_t)i;
        if (gp_sim_launch(w->sim, stream, ptr(p), 4096, GP_SIM_WRITE, seed, 10) != GP_OK ||
            gp_sim_launch(w->sim, stream, ptr(p), 4096, GP_SIM_CHECK, seed, 10) != GP_OK ||
            B->event_record(w->ctx, ev, stream) != GP_OK || B->event_synchronize(w->ctx, ev) != GP_OK)
            w->failures++;
        if (B->mem_free(w->ctx, p, 2 * MiB) != GP_OK)
            w->failures++;
    }
    if (B->event_destroy(w->ctx, ev) != GP_OK)
        w->failures++;
    return NULL;
}

Test(sim_threads, concurrent_calls_are_safe)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    enum { THREADS = 8 };
    pthread_t threads[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){.ctx = ctx, .sim = sim, .id = i};
        cr_assert_eq(pthread_create(&threads[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        cr_expect_eq(args[i].failures, 0, "thread %d", i);
    }
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(r.bad_calls, 0);
    cr_expect_eq(r.allocated_bytes, 0);
    cr_expect_eq(r.events, 0);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_ALLOC), THREADS * 200);
    B->close(ctx);
}
