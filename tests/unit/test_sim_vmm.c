/*
 * test_sim_vmm.c — unit tests of the simulated GPU with virtual memory management ("sim-vmm":
 * pool/sim/sim_vmm.c and its operations in backend_sim.c), driven directly through gp_backend_sim_vmm and
 * gpupool_sim.h, without a pool.
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

static const gp_backend_ops *const B = &gp_backend_sim_vmm;

static gp_sim *open_sim(size_t capacity, void **ctx)
{
    gp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    strcpy(cfg.backend, "sim-vmm");
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

static void *ptr(gp_devptr p)
{
    return (void *)p;
}

static gp_devptr reserve_ok(void *ctx, size_t size)
{
    gp_devptr va = 0;
    cr_assert_eq(B->va_reserve(ctx, size, &va), GP_OK, "va_reserve(%zu): %s", size, gp_last_error());
    return va;
}

static gp_phys create_ok(void *ctx, size_t size)
{
    gp_phys h = 0;
    cr_assert_eq(B->phys_create(ctx, size, &h), GP_OK, "phys_create(%zu): %s", size, gp_last_error());
    return h;
}

static void map_ok(void *ctx, gp_devptr va, size_t size, gp_phys h)
{
    cr_assert_eq(B->map(ctx, va, size, h), GP_OK, "map: %s", gp_last_error());
}

/* cuMemUnmap does not wait for queued work (backend.h): a test unmaps only what no queued kernel uses. */
static void unmap_ok(void *ctx, gp_devptr va, size_t size)
{
    cr_assert_eq(B->unmap(ctx, va, size), GP_OK, "unmap: %s", gp_last_error());
}

/* device_synchronize: what the pool calls before unmapping memory it cannot tie to one stream. */
static void sync_ok(void *ctx)
{
    cr_assert_eq(B->device_synchronize(ctx), GP_OK, "device_synchronize: %s", gp_last_error());
}

/* Two pages of two handles mapped next to each other in a new 4 MiB range (*va); freed by
 * release_two_pages once nothing uses them. */
static void map_two_pages(void *ctx, gp_devptr *va, gp_phys *h1, gp_phys *h2)
{
    *va = reserve_ok(ctx, 4 * MiB);
    *h1 = create_ok(ctx, 2 * MiB);
    *h2 = create_ok(ctx, 2 * MiB);
    map_ok(ctx, *va, 2 * MiB, *h1);
    map_ok(ctx, *va + 2 * MiB, 2 * MiB, *h2);
}

static void release_two_pages(void *ctx, gp_devptr va, gp_phys h1, gp_phys h2)
{
    unmap_ok(ctx, va, 2 * MiB);
    unmap_ok(ctx, va + 2 * MiB, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, h1), GP_OK);
    cr_assert_eq(B->phys_release(ctx, h2), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 4 * MiB), GP_OK);
}

/* ---- the table -------------------------------------------------------------------------------- */

Test(sim_vmm, registry_and_table)
{
    cr_expect_eq(gp_backend_find("sim-vmm"), &gp_backend_sim_vmm);
    cr_expect_str_eq(gp_backend_sim_vmm.name, "sim-vmm");
    cr_expect(gp_backend_has_vmm(&gp_backend_sim_vmm));
    cr_expect(!gp_backend_has_vmm(&gp_backend_sim), "plain sim keeps no vmm operations");
    cr_expect_null(gp_backend_find("no-such"));
    cr_expect(strstr(gp_last_error(), "sim, sim-vmm") != NULL, "%s", gp_last_error());
#ifdef GPUPOOL_WITH_CUDA
    cr_expect(strstr(gp_last_error(), "cuda, vmm") != NULL, "%s", gp_last_error());
#endif
}

Test(sim_vmm, granularity_is_2mib_and_not_a_counted_call)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    size_t g = 0;
    cr_assert_eq(B->vm_granularity(ctx, &g), GP_OK);
    cr_expect_eq(g, 2 * MiB);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_ALL), 0);
    B->close(ctx);
}

/* ---- reservations, handles, mappings ---------------------------------------------------------- */

Test(sim_vmm, reserve_map_unmap_release_round_trip)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_sim_retain(sim);
    gp_devptr va = reserve_ok(ctx, 8 * MiB);
    cr_expect_eq(va % (2 * MiB), 0);
    gp_devptr other = reserve_ok(ctx, 2 * MiB);
    cr_expect(other >= va + 8 * MiB || other + 2 * MiB <= va, "reservations do not overlap");
    gp_phys h1 = create_ok(ctx, 2 * MiB), h2 = create_ok(ctx, 4 * MiB);
    cr_expect_neq(h1, h2);
    map_ok(ctx, va, 2 * MiB, h1);
    map_ok(ctx, va + 2 * MiB, 4 * MiB, h2);

    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.reservations, 2);
    cr_expect_eq(r.reserved_bytes, 10 * MiB);
    cr_expect_eq(r.handles, 2);
    cr_expect_eq(r.mappings, 2);
    cr_expect_eq(r.mapped_bytes, 6 * MiB);
    cr_expect_eq(r.allocated_bytes, 6 * MiB, "physical memory");
    cr_expect_eq(r.allocations, 0, "mem_alloc's only");

    /* one kernel over both mappings (adjacent addresses, different handles) */
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va + 1 * MiB), 3 * MiB, GP_SIM_WRITE, 5, 10), GP_OK, "%s",
                 gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va + 1 * MiB), 3 * MiB, GP_SIM_CHECK, 5, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));

    unmap_ok(ctx, va, 2 * MiB);
    unmap_ok(ctx, va + 2 * MiB, 4 * MiB);
    cr_assert_eq(B->phys_release(ctx, h1), GP_OK);
    cr_assert_eq(B->phys_release(ctx, h2), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 8 * MiB), GP_OK);
    cr_assert_eq(B->va_release(ctx, other, 2 * MiB), GP_OK);

    r = report_of(sim);
    cr_expect_eq(r.reservations + r.handles + r.mappings + r.mapped_bytes + r.reserved_bytes, 0);
    cr_expect_eq(r.allocated_bytes, 0);
    cr_expect_eq(r.allocated_peak, 6 * MiB);
    cr_expect_eq(r.bad_calls, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_VA_RESERVE), 2);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_VA_RELEASE), 2);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE), 2);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_PHYS_RELEASE), 2);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MAP), 2);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_UNMAP), 2);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_SET_ACCESS), 2, "each map sets access once");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC), 0, "an unmap does not synchronize");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_ALL), 14);

    /* the freed address space is reused (first fit) */
    gp_devptr again = reserve_ok(ctx, 8 * MiB);
    cr_expect_eq(again, va < other ? va : other);
    cr_assert_eq(B->va_release(ctx, again, 8 * MiB), GP_OK);
    B->close(ctx);
    r = report_of(sim);
    cr_expect_eq(r.leaked_bytes_at_close + r.leaked_handles_at_close + r.leaked_mappings_at_close +
                     r.leaked_reservations_at_close + r.leaked_events_at_close,
                 0);
    cr_expect_str_eq(gp_sim_first_violation(sim), "");
    gp_sim_release(sim);
}

Test(sim_vmm, sizes_must_be_positive_multiples_of_2mib)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va = 0;
    gp_phys h = 0;
    cr_expect_eq(B->va_reserve(ctx, 0, &va), GP_ERR_INVALID);
    cr_expect_eq(B->va_reserve(ctx, 3 * MiB, &va), GP_ERR_INVALID);
    cr_expect(strstr(gp_last_error(), "multiple of 2 MiB") != NULL, "%s", gp_last_error());
    cr_expect_eq(B->phys_create(ctx, 0, &h), GP_ERR_INVALID);
    cr_expect_eq(B->phys_create(ctx, 1 * MiB, &h), GP_ERR_INVALID);
    cr_expect_eq(va, 0, "out-parameter written on failure");
    cr_expect_eq(h, 0, "out-parameter written on failure");
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.bad_calls, 4);
    cr_expect_eq(r.reservations + r.handles, 0);
    B->close(ctx);
}

Test(sim_vmm, capacity_accounting_and_oom_from_phys_create)
{
    void *ctx;
    gp_sim *sim = open_sim(8 * MiB, &ctx);
    gp_phys big = create_ok(ctx, 6 * MiB);
    size_t free_bytes = 0, total = 0;
    cr_assert_eq(B->mem_info(ctx, &free_bytes, &total), GP_OK);
    cr_expect_eq(free_bytes, 2 * MiB);
    cr_expect_eq(total, 8 * MiB);

    gp_phys h = 0;
    cr_assert_eq(B->phys_create(ctx, 4 * MiB, &h), GP_ERR_OOM);
    cr_expect_str_eq(gp_last_error(), "sim: out of device memory: requested 4.0 MiB, 2.0 MiB free of 8.0 MiB");
    cr_expect_eq(h, 0);
    cr_expect_eq(report_of(sim).bad_calls, 0, "OOM is not a bad call");

    /* mem_alloc draws from the same physical memory */
    gp_devptr p = 0;
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &p), GP_OK, "%s", gp_last_error());
    cr_expect_eq(report_of(sim).allocated_bytes, 8 * MiB);
    cr_expect_eq(report_of(sim).allocations, 1);
    cr_assert_eq(B->phys_create(ctx, 2 * MiB, &h), GP_ERR_OOM);
    gp_devptr q = 0;
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &q), GP_ERR_OOM);
    cr_assert_eq(B->mem_info(ctx, &free_bytes, &total), GP_OK);
    cr_expect_eq(free_bytes, 0);
    cr_assert_eq(B->mem_free(ctx, p, 2 * MiB), GP_OK);
    cr_assert_eq(B->phys_release(ctx, big), GP_OK);

    /* physical pages need not be contiguous: 4 MiB in two separate holes still make a handle */
    gp_phys q4[4];
    for (int i = 0; i < 4; i++)
        q4[i] = create_ok(ctx, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, q4[0]), GP_OK);
    cr_assert_eq(B->phys_release(ctx, q4[2]), GP_OK);
    gp_phys split = create_ok(ctx, 4 * MiB);
    cr_assert_eq(B->phys_create(ctx, 2 * MiB, &h), GP_ERR_OOM, "the capacity is used up");
    /* and such a handle maps and holds data like any other */
    gp_devptr va = reserve_ok(ctx, 4 * MiB);
    map_ok(ctx, va, 4 * MiB, split);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 4 * MiB, GP_SIM_WRITE, 9, 1), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 4 * MiB, GP_SIM_CHECK, 9, 1), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    unmap_ok(ctx, va, 4 * MiB);
    cr_assert_eq(B->va_release(ctx, va, 4 * MiB), GP_OK);
    cr_assert_eq(B->phys_release(ctx, split), GP_OK);
    cr_assert_eq(B->phys_release(ctx, q4[1]), GP_OK);
    cr_assert_eq(B->phys_release(ctx, q4[3]), GP_OK);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.allocated_bytes, 0);
    cr_expect_eq(r.allocated_peak, 8 * MiB);
    cr_expect_eq(r.bad_calls, 0, "%s", gp_sim_first_violation(sim));
    B->close(ctx);
}

Test(sim_vmm, address_space_exhaustion_is_oom)
{
    void *ctx;
    gp_sim *sim = open_sim(2 * MiB, &ctx);
    gp_devptr va = 0;
    /* the span is 64 * capacity + 64 GiB (64 GiB + 128 MiB here) */
    cr_assert_eq(B->va_reserve(ctx, (size_t)128 << 30, &va), GP_ERR_OOM);
    cr_expect(strstr(gp_last_error(), "out of virtual address space") != NULL, "%s", gp_last_error());
    gp_devptr most = reserve_ok(ctx, (size_t)64 << 30);
    cr_expect_eq(report_of(sim).bad_calls, 0);
    cr_assert_eq(B->va_release(ctx, most, (size_t)64 << 30), GP_OK);
    B->close(ctx);
}

/* ---- contents ----------------------------------------------------------------------------------- */

Test(sim_vmm, one_handle_at_two_addresses_aliases)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 8 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB);
    gp_devptr a = va, b = va + 4 * MiB;
    map_ok(ctx, a, 2 * MiB, h);
    map_ok(ctx, b, 2 * MiB, h);
    cr_expect_eq(report_of(sim).allocated_bytes, 2 * MiB, "one handle, mapped twice");

    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a + 4096), 100000, GP_SIM_WRITE, 77, 10), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(b + 4096), 100000, GP_SIM_CHECK, 77, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "a WRITE through one address is seen through the other: %s",
                 gp_sim_first_violation(sim));
    /* and the other way round, over the whole page */
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(b), 2 * MiB, GP_SIM_WRITE, 78, 10), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a), 2 * MiB, GP_SIM_CHECK, 78, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    /* a different handle is different memory */
    gp_phys other = create_ok(ctx, 2 * MiB);
    map_ok(ctx, va + 2 * MiB, 2 * MiB, other);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va + 2 * MiB), 4096, GP_SIM_CHECK, 78, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 1);
    cr_expect_eq(report_of(sim).races, 0, "one stream");

    unmap_ok(ctx, a, 2 * MiB);
    unmap_ok(ctx, b, 2 * MiB);
    unmap_ok(ctx, va + 2 * MiB, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_assert_eq(B->phys_release(ctx, other), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 8 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_vmm, contents_survive_remapping_to_a_new_address)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr r1 = reserve_ok(ctx, 4 * MiB), r2 = reserve_ok(ctx, 8 * MiB);
    gp_phys h = create_ok(ctx, 4 * MiB);
    map_ok(ctx, r1, 4 * MiB, h);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(r1 + 123), 3 * MiB, GP_SIM_WRITE, 31, 10), GP_OK);
    sync_ok(ctx);
    unmap_ok(ctx, r1, 4 * MiB);
    cr_expect_eq(report_of(sim).handles, 1);
    map_ok(ctx, r2 + 4 * MiB, 4 * MiB, h);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(r2 + 4 * MiB + 123), 3 * MiB, GP_SIM_CHECK, 31, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    /* the old address holds nothing any more */
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(r1), 64, GP_SIM_READ, 0, 1), GP_ERR_INVALID);
    unmap_ok(ctx, r2 + 4 * MiB, 4 * MiB);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_assert_eq(B->va_release(ctx, r1, 4 * MiB), GP_OK);
    cr_assert_eq(B->va_release(ctx, r2, 8 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_vmm, contents_gone_after_phys_release_and_create)
{
    void *ctx;
    gp_sim *sim = open_sim(2 * MiB, &ctx); /* one physical page: the new handle gets the same one */
    gp_devptr va = reserve_ok(ctx, 2 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB);
    map_ok(ctx, va, 2 * MiB, h);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 4096, GP_SIM_WRITE, 7, 10), GP_OK);
    sync_ok(ctx);
    unmap_ok(ctx, va, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    gp_phys again = create_ok(ctx, 2 * MiB);
    map_ok(ctx, va, 2 * MiB, again);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 4096, GP_SIM_CHECK, 7, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 1);
    cr_expect(strstr(gp_sim_first_violation(sim), "differs at byte offset 0") != NULL, "%s",
              gp_sim_first_violation(sim));
    unmap_ok(ctx, va, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, again), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 2 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_vmm, mem_alloc_still_works)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr a = 0, b = 0;
    cr_assert_eq(B->mem_alloc(ctx, 4 * MiB, &a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &b), GP_OK);
    cr_expect_eq(a % (2 * MiB), 0);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.allocations, 2);
    cr_expect_eq(r.allocated_bytes, 6 * MiB);
    cr_expect_eq(r.reservations + r.handles + r.mappings, 0, "not the pool's own");
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a + 8), 3 * MiB, GP_SIM_WRITE, 3, 10), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(a + 8), 3 * MiB, GP_SIM_CHECK, 3, 10), GP_OK);
    /* a kernel stays inside one allocation */
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(a + 3 * MiB), 2 * MiB, GP_SIM_READ, 0, 10), GP_ERR_INVALID);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(report_of(sim).bad_calls, 1);
    /* unmap / va_release / phys_release do not apply to mem_alloc's memory */
    cr_expect_eq(B->unmap(ctx, a, 4 * MiB), GP_ERR_INVALID);
    cr_expect_eq(B->va_release(ctx, a, 4 * MiB), GP_ERR_INVALID);
    cr_expect_eq(B->mem_free(ctx, a, 2 * MiB), GP_ERR_INVALID, "wrong size");
    cr_expect_eq(report_of(sim).bad_calls, 4);

    cr_assert_eq(B->mem_free(ctx, a, 4 * MiB), GP_OK);
    gp_devptr c = 0;
    cr_assert_eq(B->mem_alloc(ctx, 4 * MiB, &c), GP_OK);
    cr_expect_eq(c, a, "first fit");
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(c + 8), 4096, GP_SIM_CHECK, 3, 10), GP_OK);
    gp_sim_synchronize(sim);
    cr_expect_eq(report_of(sim).pattern_mismatches, 1, "contents gone after free");
    cr_assert_eq(B->mem_free(ctx, b, 2 * MiB), GP_OK);
    cr_assert_eq(B->mem_free(ctx, c, 4 * MiB), GP_OK);
    cr_expect_eq(report_of(sim).allocated_bytes, 0);
    B->close(ctx);
}

/* ---- races on physical memory ----------------------------------------------------------------- */

typedef struct alias_fixture {
    void *ctx;
    gp_sim *sim;
    gp_devptr va, a, b; /* one reservation; a and b map the same handle */
    gp_phys h;
    gp_stream s, g;
} alias_fixture;

static alias_fixture alias_setup(void)
{
    alias_fixture f;
    f.sim = open_sim(16 * MiB, &f.ctx);
    f.va = reserve_ok(f.ctx, 8 * MiB);
    f.h = create_ok(f.ctx, 2 * MiB);
    f.a = f.va;
    f.b = f.va + 4 * MiB;
    map_ok(f.ctx, f.a, 2 * MiB, f.h);
    map_ok(f.ctx, f.b, 2 * MiB, f.h);
    f.s = gp_sim_stream_create(f.sim);
    f.g = gp_sim_stream_create(f.sim);
    return f;
}

static void alias_teardown(alias_fixture *f)
{
    sync_ok(f->ctx);
    unmap_ok(f->ctx, f->a, 2 * MiB);
    unmap_ok(f->ctx, f->b, 2 * MiB);
    cr_assert_eq(B->phys_release(f->ctx, f->h), GP_OK);
    cr_assert_eq(B->va_release(f->ctx, f->va, 8 * MiB), GP_OK);
    B->close(f->ctx);
}

Test(sim_vmm_race, unordered_kernels_through_two_addresses_race)
{
    alias_fixture f = alias_setup();
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a + 4096), 4096, GP_SIM_WRITE, 1, 100), GP_OK);
    /* different addresses, same physical bytes */
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.b + 4096 + 100), 8, GP_SIM_READ, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1);
    cr_expect(strstr(gp_sim_first_violation(f.sim), "race: READ on stream") != NULL, "%s",
              gp_sim_first_violation(f.sim));
    cr_expect(strstr(gp_sim_first_violation(f.sim), "physical memory at offset") != NULL, "%s",
              gp_sim_first_violation(f.sim));
    /* different physical bytes of the same page do not race */
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.b + 3 * 4096), 4096, GP_SIM_WRITE, 0, 100), GP_OK);
    cr_expect_eq(report_of(f.sim).races, 1);
    alias_teardown(&f);
}

Test(sim_vmm_race, ordered_kernels_through_two_addresses_do_not_race)
{
    alias_fixture f = alias_setup();
    gp_event ev = NULL;
    cr_assert_eq(B->event_create(f.ctx, &ev), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.s, ptr(f.a), 2 * MiB, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(B->event_record(f.ctx, ev, f.s), GP_OK);
    cr_assert_eq(B->stream_wait_event(f.ctx, f.g, ev), GP_OK);
    cr_assert_eq(gp_sim_launch(f.sim, f.g, ptr(f.b), 2 * MiB, GP_SIM_CHECK, 1, 100), GP_OK);
    gp_sim_synchronize(f.sim);
    gp_sim_report r = report_of(f.sim);
    cr_expect_eq(r.races, 0, "%s", gp_sim_first_violation(f.sim));
    cr_expect_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(f.sim));
    cr_assert_eq(B->event_destroy(f.ctx, ev), GP_OK);
    alias_teardown(&f);
}

Test(sim_vmm_race, stitching_a_page_still_in_use_is_caught)
{
    /* a pool maps a page that a kernel on S still writes into a new range and hands it to G */
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr old_range = reserve_ok(ctx, 4 * MiB), new_range = reserve_ok(ctx, 4 * MiB);
    gp_phys p0 = create_ok(ctx, 2 * MiB), p1 = create_ok(ctx, 2 * MiB), p2 = create_ok(ctx, 2 * MiB);
    map_ok(ctx, old_range, 2 * MiB, p0);
    map_ok(ctx, old_range + 2 * MiB, 2 * MiB, p1);
    gp_stream s = gp_sim_stream_create(sim), g = gp_sim_stream_create(sim);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(old_range + 2 * MiB), 2 * MiB, GP_SIM_WRITE, 1, 1000), GP_OK);

    map_ok(ctx, new_range, 2 * MiB, p2);
    map_ok(ctx, new_range + 2 * MiB, 2 * MiB, p1); /* map does not wait for the device */
    cr_assert_eq(gp_sim_launch(sim, g, ptr(new_range), 2 * MiB, GP_SIM_WRITE, 2, 10), GP_OK);
    cr_expect_eq(report_of(sim).races, 0, "p2 is not in use");
    cr_assert_eq(gp_sim_launch(sim, g, ptr(new_range), 4 * MiB, GP_SIM_WRITE, 2, 10), GP_OK);
    cr_expect_eq(report_of(sim).races, 1, "p1 is: %s", gp_sim_first_violation(sim));

    unmap_ok(ctx, old_range, 2 * MiB); /* p0: no kernel uses it */
    cr_expect_eq(gp_sim_now(sim), 0, "an unmap does not wait");
    cr_expect_eq(B->unmap(ctx, old_range + 2 * MiB, 2 * MiB), GP_ERR_INVALID, "S's kernel still uses it");
    cr_expect(strstr(gp_last_error(), "unmap under work in flight") != NULL, "%s", gp_last_error());
    cr_expect_eq(report_of(sim).bad_calls, 1);
    sync_ok(ctx);
    cr_expect_eq(gp_sim_now(sim), 1000, "the synchronize waited for S's kernel");
    unmap_ok(ctx, old_range + 2 * MiB, 2 * MiB);
    unmap_ok(ctx, new_range, 2 * MiB);
    unmap_ok(ctx, new_range + 2 * MiB, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, p0), GP_OK);
    cr_assert_eq(B->phys_release(ctx, p1), GP_OK);
    cr_assert_eq(B->phys_release(ctx, p2), GP_OK);
    cr_assert_eq(B->va_release(ctx, old_range, 4 * MiB), GP_OK);
    cr_assert_eq(B->va_release(ctx, new_range, 4 * MiB), GP_OK);
    B->close(ctx);
}

Test(sim_vmm_race, different_physical_memory_does_not_race)
{
    /* adjacent mappings of different handles, written at once by two unordered streams */
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va;
    gp_phys h1, h2;
    map_two_pages(ctx, &va, &h1, &h2);
    gp_stream s = gp_sim_stream_create(sim), g = gp_sim_stream_create(sim);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(va), 2 * MiB, GP_SIM_WRITE, 1, 1000), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, g, ptr(va + 2 * MiB), 2 * MiB, GP_SIM_WRITE, 1, 1000), GP_OK);
    cr_expect_eq(report_of(sim).races, 0);
    sync_ok(ctx);
    release_two_pages(ctx, va, h1, h2);
    B->close(ctx);
}

/* ---- bad calls -------------------------------------------------------------------------------- */

Test(sim_vmm_bad, kernel_on_unmapped_memory_is_a_bad_call)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 8 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB);
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va), 64, GP_SIM_WRITE, 1, 10), GP_ERR_INVALID, "reserved only");
    cr_expect(strstr(gp_sim_first_violation(sim), "kernel on unmapped memory") != NULL, "%s",
              gp_sim_first_violation(sim));
    map_ok(ctx, va, 2 * MiB, h);
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va + 2 * MiB - 64), 128, GP_SIM_WRITE, 1, 10), GP_ERR_INVALID,
                 "runs past the mapping");
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va - 64), 128, GP_SIM_WRITE, 1, 10), GP_ERR_INVALID,
                 "starts before it");
    cr_expect_eq(gp_sim_launch(sim, NULL, (void *)0x1000, 128, GP_SIM_WRITE, 1, 10), GP_ERR_INVALID,
                 "nowhere near");
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va + 4 * MiB), 128, GP_SIM_WRITE, 1, 10), GP_ERR_INVALID);
    cr_expect_eq(report_of(sim).bad_calls, 5);
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va + 2 * MiB - 64), 64, GP_SIM_WRITE, 1, 10), GP_OK);
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va + 4 * MiB), 0, GP_SIM_WRITE, 1, 10), GP_OK,
                 "a zero-length kernel touches nothing");
    sync_ok(ctx);
    unmap_ok(ctx, va, 2 * MiB);
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va), 64, GP_SIM_READ, 0, 10), GP_ERR_INVALID, "unmapped again");
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 8 * MiB), GP_OK);
    cr_expect_eq(report_of(sim).bad_calls, 6);
    B->close(ctx);
}

Test(sim_vmm_bad, broken_preconditions_are_bad_calls_and_change_nothing)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 8 * MiB), small = reserve_ok(ctx, 2 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB), h4 = create_ok(ctx, 4 * MiB);
    map_ok(ctx, va, 2 * MiB, h);
    gp_sim_report before = report_of(sim);

    int n = 0;
#define BAD(call, why)                                   \
    do {                                                 \
        cr_expect_eq((call), GP_ERR_INVALID, "%s", why); \
        n++;                                             \
    } while (0)
    BAD(B->map(ctx, va, 2 * MiB, h), "over a mapping");
    cr_expect(strstr(gp_last_error(), "overlaps 1 mapping") != NULL, "%s", gp_last_error());
    BAD(B->map(ctx, va + 2 * MiB, 4 * MiB, h), "size is not the handle's");
    BAD(B->map(ctx, va + 1 * MiB, 4 * MiB, h4), "misaligned");
    BAD(B->map(ctx, va + 6 * MiB, 4 * MiB, h4), "past the reservation");
    BAD(B->map(ctx, small, 4 * MiB, h4), "larger than the reservation");
    BAD(B->map(ctx, va + 2 * MiB, 2 * MiB, (gp_phys)12345), "unknown handle");
    BAD(B->unmap(ctx, va, 4 * MiB), "not exactly one mapping");
    BAD(B->unmap(ctx, va + 2 * MiB, 2 * MiB), "nothing mapped there");
    BAD(B->phys_release(ctx, h), "still mapped");
    cr_expect(strstr(gp_last_error(), "still mapped") != NULL, "%s", gp_last_error());
    BAD(B->phys_release(ctx, (gp_phys)12345), "unknown handle");
    BAD(B->va_release(ctx, va, 8 * MiB), "a mapping in it");
    cr_expect(strstr(gp_last_error(), "1 mapping is still in it") != NULL, "%s", gp_last_error());
    BAD(B->va_release(ctx, va, 2 * MiB), "not a whole reservation");
    BAD(B->va_release(ctx, va + 2 * MiB, 6 * MiB), "interior");

    gp_sim_report after = report_of(sim);
    cr_expect_eq(after.bad_calls, before.bad_calls + (uint64_t)n);
    cr_expect_eq(after.handles, before.handles);
    cr_expect_eq(after.mappings, before.mappings);
    cr_expect_eq(after.reservations, before.reservations);
    cr_expect_eq(after.mapped_bytes, before.mapped_bytes);
    cr_expect_eq(after.allocated_bytes, before.allocated_bytes);

    unmap_ok(ctx, va, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_expect_eq(B->phys_release(ctx, h), GP_ERR_INVALID, "double release");
    cr_assert_eq(B->phys_release(ctx, h4), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 8 * MiB), GP_OK);
    cr_expect_eq(B->va_release(ctx, va, 8 * MiB), GP_ERR_INVALID, "double release");
    cr_assert_eq(B->va_release(ctx, small, 2 * MiB), GP_OK);
    cr_expect_eq(report_of(sim).bad_calls, before.bad_calls + (uint64_t)n + 2);
    B->close(ctx);
}

Test(sim_vmm_bad, host_access_to_mapped_memory_crashes, .signal = SIGSEGV)
{
    void *ctx;
    open_sim(16 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 2 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB);
    map_ok(ctx, va, 2 * MiB, h);
    signal(SIGSEGV, SIG_DFL); /* die by the signal even under a sanitizer's SEGV handler */
    *(volatile char *)ptr(va + 100) = 1;
}

Test(sim_vmm_bad, calls_after_close_are_bad_calls)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_sim_retain(sim);
    B->close(ctx);
    gp_devptr va = 0;
    gp_phys h = 0;
    size_t g = 0;
    cr_expect_eq(B->va_reserve(ctx, 2 * MiB, &va), GP_ERR_DEVICE);
    cr_expect_eq(B->phys_create(ctx, 2 * MiB, &h), GP_ERR_DEVICE);
    cr_expect_eq(B->vm_granularity(ctx, &g), GP_ERR_DEVICE);
    cr_expect_eq(report_of(sim).bad_calls, 3);
    gp_sim_release(sim);
}

/* ---- device work and unmap -------------------------------------------------------------------- */

/* Neither map nor unmap waits for device work (cuMemUnmap does not): an unmap of a range that a queued
 * kernel still uses is a bad call that unmaps nothing; once the stream that uses it is waited for (its
 * event, as the pool waits for a stream's fence), the unmap goes through, while another stream's work
 * on other memory is still running. */
Test(sim_vmm, unmap_does_not_wait_and_refuses_a_range_in_use)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 6 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB), other = create_ok(ctx, 2 * MiB), busy = create_ok(ctx, 2 * MiB);
    map_ok(ctx, va, 2 * MiB, h);
    map_ok(ctx, va + 4 * MiB, 2 * MiB, busy);
    gp_stream s = gp_sim_stream_create(sim), g = gp_sim_stream_create(sim);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(va), 64, GP_SIM_WRITE, 1, 1000), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, g, ptr(va + 4 * MiB), 64, GP_SIM_WRITE, 1, 5000), GP_OK);
    map_ok(ctx, va + 2 * MiB, 2 * MiB, other);
    cr_expect_eq(gp_sim_now(sim), 0);
    cr_assert_eq(B->phys_release(ctx, create_ok(ctx, 2 * MiB)), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 0, "create and release of unmapped memory do not wait");
    unmap_ok(ctx, va + 2 * MiB, 2 * MiB);
    cr_expect_eq(gp_sim_now(sim), 0, "an unmap of memory no kernel uses does not wait");

    gp_sim_report before = report_of(sim);
    cr_expect_eq(B->unmap(ctx, va, 2 * MiB), GP_ERR_INVALID, "s's kernel still uses it");
    cr_expect(strstr(gp_sim_first_violation(sim), "unmap under work in flight") != NULL, "%s",
              gp_sim_first_violation(sim));
    cr_expect_eq(report_of(sim).mappings, before.mappings, "nothing unmapped");
    cr_expect_eq(report_of(sim).bad_calls, before.bad_calls + 1);

    gp_event ev = NULL;
    cr_assert_eq(B->event_create(ctx, &ev), GP_OK);
    cr_assert_eq(B->event_record(ctx, ev, s), GP_OK);
    cr_assert_eq(B->event_synchronize(ctx, ev), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 1000, "waiting for s lasts s's work, not g's");
    unmap_ok(ctx, va, 2 * MiB);
    cr_expect_eq(gp_sim_now(sim), 1000);
    cr_expect_eq(B->unmap(ctx, va + 4 * MiB, 2 * MiB), GP_ERR_INVALID, "g's kernel still runs");
    sync_ok(ctx);
    cr_expect_eq(gp_sim_now(sim), 5000, "a device synchronize waits for every stream");
    unmap_ok(ctx, va + 4 * MiB, 2 * MiB);
    cr_assert_eq(B->event_destroy(ctx, ev), GP_OK);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_assert_eq(B->phys_release(ctx, other), GP_OK);
    cr_assert_eq(B->phys_release(ctx, busy), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 6 * MiB), GP_OK);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(r.bad_calls, 2, "the two refused unmaps");
    cr_expect_eq(r.mappings, 0);
    B->close(ctx);
}

/* A copy (staging a paused tenant) waits for no queued work either: the cuda backends copy on a stream
 * of their own (backend.h). Copying a range a queued kernel still uses is a bad call; other streams'
 * kernels stay queued through a copy. */
Test(sim_vmm, copies_do_not_wait_and_refuse_a_range_in_use)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va;
    gp_phys a, b;
    map_two_pages(ctx, &va, &a, &b);
    gp_stream s = gp_sim_stream_create(sim), g = gp_sim_stream_create(sim);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(va), 4096, GP_SIM_WRITE, 3, 1000), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, g, ptr(va + 2 * MiB), 64, GP_SIM_WRITE, 1, 5000), GP_OK);
    unsigned char host[4096];
    cr_expect_eq(B->copy_to_host(ctx, host, va, sizeof host), GP_ERR_INVALID, "s's kernel still writes it");
    cr_expect(strstr(gp_sim_first_violation(sim), "copy under work in flight") != NULL, "%s",
              gp_sim_first_violation(sim));
    cr_expect_eq(B->copy_to_device(ctx, va + 2 * MiB, host, 64), GP_ERR_INVALID, "g's kernel still uses it");
    cr_expect_eq(gp_sim_now(sim), 0, "a refused copy waits for nothing");

    gp_sim_stream_synchronize(sim, s);
    cr_expect_eq(gp_sim_now(sim), 1000);
    cr_assert_eq(B->copy_to_host(ctx, host, va, sizeof host), GP_OK);
    cr_expect_eq(gp_sim_now(sim), 1000, "the copy did not wait for g's kernel");
    cr_assert_eq(B->copy_to_device(ctx, va + 1 * MiB, host, sizeof host), GP_OK, "s's range, g still busy");
    cr_assert_eq(gp_sim_launch(sim, s, ptr(va + 1 * MiB), sizeof host, GP_SIM_CHECK, 3, 10), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.pattern_mismatches, 0, "the bytes s wrote were copied out and back: %s",
                 gp_sim_first_violation(sim));
    cr_expect_eq(r.bad_calls, 2, "the two refused copies");
    cr_expect_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
    release_two_pages(ctx, va, a, b);
    B->close(ctx);
}

/* ---- fault injection -------------------------------------------------------------------------- */

/* The state a failed call must leave as it was. */
static void expect_same(gp_sim_report a, gp_sim_report b, const char *what)
{
    cr_expect_eq(a.allocated_bytes, b.allocated_bytes, "%s", what);
    cr_expect_eq(a.handles, b.handles, "%s", what);
    cr_expect_eq(a.mappings, b.mappings, "%s", what);
    cr_expect_eq(a.reservations, b.reservations, "%s", what);
    cr_expect_eq(a.mapped_bytes, b.mapped_bytes, "%s", what);
    cr_expect_eq(a.reserved_bytes, b.reserved_bytes, "%s", what);
    cr_expect_eq(a.bad_calls, b.bad_calls, "%s: an injected fault is not a bad call", what);
}

Test(sim_vmm_fault, each_new_call_kind_fails_once_and_changes_nothing)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 4 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB), unmapped = create_ok(ctx, 2 * MiB);
    map_ok(ctx, va, 2 * MiB, h);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_sim_launch(sim, s, ptr(va), 4096, GP_SIM_WRITE, 4, 500), GP_OK);
    gp_sim_report before = report_of(sim);

    gp_devptr out_va = 0;
    gp_phys out_h = 0;
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_VA_RESERVE, GP_ERR_OOM);
    cr_expect_eq(B->va_reserve(ctx, 2 * MiB, &out_va), GP_ERR_OOM);
    cr_expect_str_eq(gp_last_error(), "sim: injected fault in va_reserve (call #2)");
    cr_expect_eq(out_va, 0);
    expect_same(before, report_of(sim), "va_reserve");

    gp_sim_fail_call(sim, 1, GP_SIM_CALL_PHYS_CREATE, GP_ERR_OOM);
    cr_expect_eq(B->phys_create(ctx, 2 * MiB, &out_h), GP_ERR_OOM);
    cr_expect_eq(out_h, 0);
    expect_same(before, report_of(sim), "phys_create");

    gp_sim_fail_call(sim, 1, GP_SIM_CALL_MAP, GP_ERR_DEVICE);
    cr_expect_eq(B->map(ctx, va + 2 * MiB, 2 * MiB, unmapped), GP_ERR_DEVICE);
    expect_same(before, report_of(sim), "map");
    cr_expect_eq(gp_sim_launch(sim, NULL, ptr(va + 2 * MiB), 64, GP_SIM_READ, 0, 1), GP_ERR_INVALID,
                 "the failed map mapped nothing");
    before = report_of(sim); /* that was a bad call */

    gp_sim_fail_call(sim, 1, GP_SIM_CALL_UNMAP, GP_ERR_DEVICE);
    cr_expect_eq(B->unmap(ctx, va, 2 * MiB), GP_ERR_DEVICE);
    expect_same(before, report_of(sim), "unmap");
    cr_expect_eq(gp_sim_now(sim), 0, "a failed unmap does not synchronize");
    cr_assert_eq(gp_sim_launch(sim, s, ptr(va), 4096, GP_SIM_CHECK, 4, 1), GP_OK, "still mapped");

    gp_sim_fail_call(sim, 1, GP_SIM_CALL_PHYS_RELEASE, GP_ERR_DEVICE);
    cr_expect_eq(B->phys_release(ctx, unmapped), GP_ERR_DEVICE);
    expect_same(before, report_of(sim), "phys_release");

    gp_devptr spare = reserve_ok(ctx, 2 * MiB);
    before = report_of(sim);
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_VA_RELEASE, GP_ERR_DEVICE);
    cr_expect_eq(B->va_release(ctx, spare, 2 * MiB), GP_ERR_DEVICE);
    expect_same(before, report_of(sim), "va_release");

    cr_expect_eq(gp_sim_faults_injected(sim), 6);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MAP), 2, "failed calls count");

    /* the same calls go through once disarmed (and the kernels using va are done) */
    sync_ok(ctx);
    unmap_ok(ctx, va, 2 * MiB);
    cr_assert_eq(B->phys_release(ctx, unmapped), GP_OK);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_assert_eq(B->va_release(ctx, spare, 2 * MiB), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 4 * MiB), GP_OK);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(r.allocated_bytes + r.handles + r.reservations, 0);
    B->close(ctx);
}

/* Four pages of 2 MiB created and mapped as one run at the start of a 16 MiB reservation (returned). */
static gp_devptr four_pages_mapped(void *ctx, gp_phys h[4])
{
    gp_devptr va = reserve_ok(ctx, 16 * MiB);
    for (int i = 0; i < 4; i++)
        h[i] = create_ok(ctx, 2 * MiB);
    cr_assert_eq(B->map_run(ctx, va, 2 * MiB, h, 4), GP_OK, "%s", gp_last_error());
    return va;
}

/* Releases four pages (mapped nowhere by now) and the 16 MiB reservation at va. */
static void release_four_pages(void *ctx, gp_devptr va, const gp_phys h[4])
{
    for (int i = 0; i < 4; i++)
        cr_assert_eq(B->phys_release(ctx, h[i]), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 16 * MiB), GP_OK);
}

/* ---- runs: one access call per map_run, one synchronize per unmap_run -------------------------- */

Test(sim_vmm, map_run_sets_access_once_unmap_run_does_not_synchronize)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 16 * MiB);
    gp_phys h[4];
    for (int i = 0; i < 4; i++)
        h[i] = create_ok(ctx, 2 * MiB);
    uint64_t maps = gp_sim_calls(sim, GP_SIM_CALL_MAP), access = gp_sim_calls(sim, GP_SIM_CALL_SET_ACCESS);
    cr_assert_eq(B->map_run(ctx, va, 2 * MiB, h, 4), GP_OK, "%s", gp_last_error());
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MAP) - maps, 4, "one map per handle");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_SET_ACCESS) - access, 1, "one access call for the run");
    cr_expect_eq(report_of(sim).mappings, 4);
    /* one kernel across the whole run: every page is accessible */
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 8 * MiB, GP_SIM_WRITE, 3, 10), GP_OK, "%s",
                 gp_sim_first_violation(sim));
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 8 * MiB, GP_SIM_CHECK, 3, 10), GP_OK);
    size_t done = 99;
    cr_expect_eq(B->unmap_run(ctx, va, 2 * MiB, 4, &done), GP_ERR_INVALID, "the kernels still use the run");
    cr_expect_eq(done, 0, "nothing unmapped under queued work");
    cr_expect_eq(report_of(sim).mappings, 4);
    sync_ok(ctx);
    cr_expect_eq(gp_sim_now(sim), 20, "the synchronize waited for both kernels");
    uint64_t syncs = gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC), unmaps = gp_sim_calls(sim, GP_SIM_CALL_UNMAP);
    cr_assert_eq(B->unmap_run(ctx, va, 2 * MiB, 4, &done), GP_OK, "%s", gp_last_error());
    cr_expect_eq(done, 4);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC) - syncs, 0, "unmap_run does not synchronize");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_UNMAP) - unmaps, 4);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.mappings, 0);
    cr_expect_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(r.bad_calls, 1, "the refused unmap_run: %s", gp_sim_first_violation(sim));
    release_four_pages(ctx, va, h);
    B->close(ctx);
}

Test(sim_vmm_fault, a_failed_map_run_maps_nothing_a_failed_unmap_run_says_how_far_it_got)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 16 * MiB);
    gp_phys h[4];
    for (int i = 0; i < 4; i++)
        h[i] = create_ok(ctx, 2 * MiB);
    static const unsigned kinds[] = {GP_SIM_CALL_MAP, GP_SIM_CALL_SET_ACCESS};
    for (size_t k = 0; k < 2; k++) {
        gp_sim_report before = report_of(sim);
        gp_sim_fail_call(sim, kinds[k] == GP_SIM_CALL_MAP ? 3 : 1, kinds[k], GP_ERR_DEVICE);
        cr_expect_eq(B->map_run(ctx, va, 2 * MiB, h, 4), GP_ERR_DEVICE);
        expect_same(before, report_of(sim), kinds[k] == GP_SIM_CALL_MAP ? "map_run, 3rd map" : "map_run, access");
        cr_expect_eq(report_of(sim).mappings, 0, "all or nothing");
    }
    cr_assert_eq(B->map_run(ctx, va, 2 * MiB, h, 4), GP_OK, "%s", gp_last_error());
    gp_sim_fail_call(sim, 2, GP_SIM_CALL_UNMAP, GP_ERR_DEVICE);
    size_t done = 99;
    cr_expect_eq(B->unmap_run(ctx, va, 2 * MiB, 4, &done), GP_ERR_DEVICE);
    cr_expect_eq(done, 1, "the first page was unmapped, the second failed");
    cr_expect_eq(report_of(sim).mappings, 3, "the rest stay mapped");
    cr_assert_eq(B->unmap_run(ctx, va + 2 * MiB, 2 * MiB, 3, &done), GP_OK, "%s", gp_last_error());
    cr_expect_eq(done, 3);
    cr_expect_eq(report_of(sim).bad_calls, 0, "%s", gp_sim_first_violation(sim));
    release_four_pages(ctx, va, h);
    B->close(ctx);
}

/* unmap_pages: mappings anywhere (here the 1st, 3rd and 4th of four, in another order), no synchronize
 * (the caller waited); an empty list, or a page not mapped, is a bad call. */
Test(sim_vmm, unmap_pages_unmaps_pages_anywhere_without_synchronizing)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_phys h[4];
    gp_devptr va = four_pages_mapped(ctx, h);
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va), 8 * MiB, GP_SIM_WRITE, 5, 10), GP_OK, "%s",
                 gp_sim_first_violation(sim));
    sync_ok(ctx);
    cr_expect_eq(gp_sim_now(sim), 10);
    uint64_t syncs = gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC), unmaps = gp_sim_calls(sim, GP_SIM_CALL_UNMAP);
    gp_devptr some[3] = {va + 6 * MiB, va, va + 4 * MiB};
    size_t done = 0;
    cr_assert_eq(B->unmap_pages(ctx, some, 2 * MiB, 3, &done), GP_OK, "%s", gp_last_error());
    cr_expect_eq(done, 3);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC) - syncs, 0, "no synchronize");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_UNMAP) - unmaps, 3);
    cr_expect_eq(report_of(sim).mappings, 1, "the 2nd page stays mapped");
    cr_assert_eq(gp_sim_launch(sim, NULL, ptr(va + 2 * MiB), 2 * MiB, GP_SIM_WRITE, 6, 10), GP_OK, "%s",
                 gp_sim_first_violation(sim));
    cr_assert_eq(B->unmap_pages(ctx, some, 2 * MiB, 0, &done), GP_ERR_INVALID, "an empty list");
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.bad_calls, 1, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(B->unmap_pages(ctx, some + 1, 2 * MiB, 1, &done), GP_ERR_INVALID, "a page unmapped already");
    cr_expect_eq(done, 0);
    cr_expect_eq(report_of(sim).bad_calls, 2);
    sync_ok(ctx);
    unmap_ok(ctx, va + 2 * MiB, 2 * MiB);
    release_four_pages(ctx, va, h);
    r = report_of(sim);
    cr_expect_eq(r.allocated_bytes + r.handles + r.reservations + r.mappings, 0);
    B->close(ctx);
}

Test(sim_vmm_fault, a_failed_unmap_pages_says_how_far_it_got)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_phys h[4];
    gp_devptr va = four_pages_mapped(ctx, h);
    gp_devptr all[4] = {va + 6 * MiB, va + 2 * MiB, va, va + 4 * MiB};
    size_t done = 99;
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_UNMAP, GP_ERR_DEVICE);
    cr_expect_eq(B->unmap_pages(ctx, all, 2 * MiB, 4, &done), GP_ERR_DEVICE);
    cr_expect_eq(done, 0, "the first unmap failed: nothing unmapped");
    cr_expect_eq(report_of(sim).mappings, 4);
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_DEVICE_SYNC, GP_ERR_DEVICE);
    cr_expect_eq(B->device_synchronize(ctx), GP_ERR_DEVICE);
    cr_expect_eq(report_of(sim).mappings, 4, "a failed synchronize unmaps nothing");
    gp_sim_fail_call(sim, 3, GP_SIM_CALL_UNMAP, GP_ERR_DEVICE);
    cr_expect_eq(B->unmap_pages(ctx, all, 2 * MiB, 4, &done), GP_ERR_DEVICE);
    cr_expect_eq(done, 2, "the first two were unmapped, the third failed");
    cr_expect_eq(report_of(sim).mappings, 2, "the rest stay mapped");
    cr_assert_eq(B->unmap_pages(ctx, all + 2, 2 * MiB, 2, &done), GP_OK, "%s", gp_last_error());
    cr_expect_eq(done, 2);
    cr_expect_eq(report_of(sim).bad_calls, 0, "%s", gp_sim_first_violation(sim));
    release_four_pages(ctx, va, h);
    B->close(ctx);
}

Test(sim_vmm_fault, call_kinds_are_distinct_bits_within_all)
{
    unsigned kinds[] = {GP_SIM_CALL_VA_RESERVE, GP_SIM_CALL_VA_RELEASE, GP_SIM_CALL_PHYS_CREATE,
                        GP_SIM_CALL_PHYS_RELEASE, GP_SIM_CALL_MAP, GP_SIM_CALL_UNMAP,
                        GP_SIM_CALL_SET_ACCESS, GP_SIM_CALL_COPY, GP_SIM_CALL_HOST_ALLOC,
                        GP_SIM_CALL_DEVICE_SYNC};
    unsigned seen = GP_SIM_CALL_MEM_ALLOC | GP_SIM_CALL_MEM_FREE | GP_SIM_CALL_MEM_INFO |
                    GP_SIM_CALL_EVENT_CREATE | GP_SIM_CALL_EVENT_DESTROY | GP_SIM_CALL_EVENT_RECORD |
                    GP_SIM_CALL_EVENT_QUERY | GP_SIM_CALL_EVENT_SYNC | GP_SIM_CALL_STREAM_WAIT;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        cr_expect_eq(kinds[i] & (kinds[i] - 1), 0, "one bit");
        cr_expect_eq(seen & kinds[i], 0, "distinct");
        seen |= kinds[i];
    }
    cr_expect_eq(seen, (unsigned)GP_SIM_CALL_ALL);
}

/* A set-access fault after a successful map undoes the mapping, as the vmm backend does: nothing stays
 * mapped, the handle can be mapped again. */
Test(sim_vmm_fault, set_access_fault_leaves_nothing_mapped)
{
    void *ctx;
    gp_sim *sim = open_sim(64 * MiB, &ctx);
    gp_devptr va = reserve_ok(ctx, 4 * MiB);
    gp_phys h = create_ok(ctx, 2 * MiB);
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_SET_ACCESS, GP_ERR_DEVICE);
    cr_assert_eq(B->map(ctx, va, 2 * MiB, h), GP_ERR_DEVICE);
    cr_assert(strstr(gp_last_error(), "set_access") != NULL, "%s", gp_last_error());
    cr_assert_eq(report_of(sim).mappings, 0, "the failed map left a mapping");
    cr_assert_eq(B->map(ctx, va, 2 * MiB, h), GP_OK, "%s", gp_last_error());
    cr_assert_eq(B->unmap(ctx, va, 2 * MiB), GP_OK);
    cr_assert_eq(B->phys_release(ctx, h), GP_OK);
    cr_assert_eq(B->va_release(ctx, va, 4 * MiB), GP_OK);
    cr_expect_eq(report_of(sim).bad_calls, 0, "%s", gp_sim_first_violation(sim));
    B->close(ctx);
}

/* ---- leaks ------------------------------------------------------------------------------------ */

Test(sim_vmm_leak, each_kind_is_reported_at_close)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_sim_retain(sim);
    gp_devptr va = reserve_ok(ctx, 8 * MiB);
    reserve_ok(ctx, 2 * MiB);                 /* a reservation with nothing in it */
    gp_phys h = create_ok(ctx, 2 * MiB);
    create_ok(ctx, 4 * MiB);                  /* a handle never mapped */
    map_ok(ctx, va, 2 * MiB, h);
    map_ok(ctx, va + 4 * MiB, 2 * MiB, h);
    gp_devptr p = 0;
    cr_assert_eq(B->mem_alloc(ctx, 2 * MiB, &p), GP_OK);
    B->close(ctx);

    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.closed, 1);
    cr_expect_eq(r.leaked_bytes_at_close, 8 * MiB, "physical: 2 + 4 MiB of handles, 2 MiB of mem_alloc");
    cr_expect_eq(r.leaked_handles_at_close, 2);
    cr_expect_eq(r.leaked_mappings_at_close, 2);
    cr_expect_eq(r.leaked_reservations_at_close, 2);
    cr_expect_eq(r.leaked_events_at_close, 0);
    cr_expect(strstr(gp_sim_first_violation(sim),
                     "leak at close: 8.0 MiB of device memory in 1 allocations and 2 physical handles, "
                     "2 mappings, 2 reservations and 0 events") != NULL,
              "%s", gp_sim_first_violation(sim));
    gp_sim_release(sim); /* the final release frees what leaked (no sanitizer report) */
}

Test(sim_vmm_leak, a_reservation_alone_is_a_leak)
{
    void *ctx;
    gp_sim *sim = open_sim(16 * MiB, &ctx);
    gp_sim_retain(sim);
    reserve_ok(ctx, 2 * MiB);
    B->close(ctx);
    gp_sim_report r = report_of(sim);
    cr_expect_eq(r.leaked_reservations_at_close, 1);
    cr_expect_eq(r.leaked_bytes_at_close, 0);
    cr_expect(strncmp(gp_sim_first_violation(sim), "leak at close", 13) == 0, "%s", gp_sim_first_violation(sim));
    gp_sim_release(sim);
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
    gp_devptr va = 0;
    gp_event done = NULL; /* before unmapping, the thread waits for its own stream only (as the pool) */
    if (B->va_reserve(w->ctx, 4 * MiB, &va) != GP_OK || B->event_create(w->ctx, &done) != GP_OK) {
        w->failures++;
        return NULL;
    }
    for (int i = 0; i < 100; i++) {
        gp_phys h = 0;
        if (B->phys_create(w->ctx, 2 * MiB, &h) != GP_OK) {
            w->failures++;
            continue;
        }
        uint64_t seed = (uint64_t)w->id * 1000 + (uint64_t)i;
        if (B->map(w->ctx, va, 2 * MiB, h) != GP_OK || B->map(w->ctx, va + 2 * MiB, 2 * MiB, h) != GP_OK ||
            gp_sim_launch(w->sim, stream, ptr(va), 4096, GP_SIM_WRITE, seed, 10) != GP_OK ||
            gp_sim_launch(w->sim, stream, ptr(va + 2 * MiB), 4096, GP_SIM_CHECK, seed, 10) != GP_OK ||
            B->event_record(w->ctx, done, stream) != GP_OK || B->event_synchronize(w->ctx, done) != GP_OK ||
            B->unmap(w->ctx, va, 2 * MiB) != GP_OK || B->unmap(w->ctx, va + 2 * MiB, 2 * MiB) != GP_OK ||
            B->phys_release(w->ctx, h) != GP_OK)
            w->failures++;
    }
    if (B->va_release(w->ctx, va, 4 * MiB) != GP_OK || B->event_destroy(w->ctx, done) != GP_OK)
        w->failures++;
    return NULL;
}

Test(sim_vmm_threads, concurrent_calls_are_safe)
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
    cr_expect_eq(r.bad_calls, 0, "%s", gp_sim_first_violation(sim));
    cr_expect_eq(r.allocated_bytes + r.handles + r.mappings + r.reservations, 0);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MAP), THREADS * 200);
    B->close(ctx);
}
