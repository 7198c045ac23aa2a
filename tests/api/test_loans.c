/*
 * test_loans.c — loans (loans:on, backend sim-vmm; provider/alias.h): two streams whose peaks take
 * turns, each with its free memory in holes that its own peak does not fit, reach a steady state with
 * no map, unmap or device call, where moving pages (loans:off) pays map calls in every step; a page
 * lent to another stream's stitched block goes back to its owner only once that stream's work on it
 * is done; trim gives parked pages back; growth under the cache cap that would raise the pool's
 * high-water mark borrows an idle stream's free pages instead (and not those of a stream still at
 * work on them), and without loans moves them (no wait for a stream at work; one stream alone grows);
 * gp_check holds throughout. borrow:off, so that no free block is borrowed whole and
 * the pages have to be stitched.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)
#define H ((size_t)40 * MIB)
/* No cache slack: every growth past the peak allocation stitches (or moves) pages. */
#define LOANS_CONFIG "device_memory:1GiB,cache_slack:0,borrow:off"

static gp_pool *pool;
static gp_sim *sim;
static gp_stream a, b;

static void open_pool(const char *config)
{
    unsetenv("GPUPOOL_CONF");
    cr_assert_eq(gp_pool_create(&pool, 0, "sim-vmm", config), GP_OK, "%s", gp_last_error());
    sim = gp_sim_of(pool);
    cr_assert_not_null(sim);
    gp_sim_retain(sim);
    a = gp_sim_stream_create(sim);
    b = gp_sim_stream_create(sim);
}

static void teardown(void)
{
    if (pool != NULL) {
        cr_expect_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
        gp_leak_report leaks;
        cr_expect_eq(gp_pool_destroy(pool, &leaks), GP_OK, "%s", gp_last_error());
        pool = NULL;
    }
    if (sim != NULL) {
        gp_sim_report r;
        gp_sim_get_report(sim, &r);
        cr_expect_eq(r.leaked_bytes_at_close, 0, "%s", gp_sim_first_violation(sim));
        cr_expect_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
        cr_expect_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
        gp_sim_release(sim);
        sim = NULL;
    }
}

TestSuite(loans, .fini = teardown);

static gp_stats stats_now(void)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK, "%s", gp_last_error());
    return s;
}

static void *alloc_written(gp_stream s, size_t size, uint64_t seed, uint64_t duration)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, size, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, p, size, GP_SIM_WRITE, seed, duration), GP_OK, "%s",
                 gp_sim_first_violation(sim));
    return p;
}

static void check_pattern(gp_stream s, void *p, size_t size, uint64_t seed)
{
    cr_assert_eq(gp_sim_launch(sim, s, p, size, GP_SIM_CHECK, seed, 1000), GP_OK, "%s", gp_sim_first_violation(sim));
}

/* Four 40 MiB blocks on each stream, the 1st and 3rd freed once all are live (so that no growth
 * passes the cap meanwhile): 80 MiB free on each in two holes; pa[], pb[] stay live. */
static void two_holes_each(void **pa, void **pb)
{
    void *holes[4];
    holes[0] = alloc_written(a, H, 100, 1000);
    pa[0] = alloc_written(a, H, 101, 1000);
    holes[1] = alloc_written(a, H, 102, 1000);
    pa[1] = alloc_written(a, H, 103, 1000);
    holes[2] = alloc_written(b, H, 200, 1000);
    pb[0] = alloc_written(b, H, 201, 1000);
    holes[3] = alloc_written(b, H, 202, 1000);
    pb[1] = alloc_written(b, H, 203, 1000);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_free(pool, holes[i], i < 2 ? a : b), GP_OK);
    gp_sim_synchronize(sim);
}

/* One step: a's peak (120 MiB: more than its 80 MiB of holes, less than both streams' 160 MiB), then
 * b's, each written, checked and freed, with the device idle in between. */
static void step(uint64_t seed)
{
    void *x = alloc_written(a, 3 * H, seed, 1000);
    check_pattern(a, x, 3 * H, seed);
    cr_assert_eq(gp_free(pool, x, a), GP_OK);
    gp_sim_synchronize(sim);
    void *y = alloc_written(b, 3 * H, seed + 1, 1000);
    check_pattern(b, y, 3 * H, seed + 1);
    cr_assert_eq(gp_free(pool, y, b), GP_OK);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

static uint64_t page_calls(void)
{
    return gp_sim_calls(sim, GP_SIM_CALL_MAP | GP_SIM_CALL_UNMAP | GP_SIM_CALL_PHYS_CREATE | GP_SIM_CALL_PHYS_RELEASE);
}

static void free_pins(void **pa, void **pb)
{
    check_pattern(a, pa[0], H, 101);
    check_pattern(a, pa[1], H, 103);
    check_pattern(b, pb[0], H, 201);
    check_pattern(b, pb[1], H, 203);
    gp_sim_synchronize(sim);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(gp_free(pool, pa[i], a), GP_OK);
        cr_assert_eq(gp_free(pool, pb[i], b), GP_OK);
    }
}

Test(loans, peaks_that_take_turns_settle_with_no_map_calls)
{
    open_pool(LOANS_CONFIG ",loans:on");
    void *pa[2], *pb[2];
    two_holes_each(pa, pb);
    gp_stats before = stats_now();
    cr_assert_eq(before.reserved_bytes, 8 * H, "reserved %zu", (size_t)before.reserved_bytes);
    step(1); /* each stream stitches its peak once: its own holes and the other's free pages */
    step(3);
    uint64_t calls = page_calls();
    for (uint64_t k = 5; k < 15; k += 2)
        step(k);
    cr_assert_eq(page_calls(), calls, "the stitched blocks are handed out again with no map, unmap or device call");
    gp_stats after = stats_now();
    cr_assert_eq(after.reserved_bytes, 8 * H, "no memory beyond the two streams' 320 MiB");
    cr_assert_eq(after.num_device_allocs, before.num_device_allocs);
    free_pins(pa, pb);
}

Test(loans, without_loans_the_pages_move_in_every_step)
{
    open_pool(LOANS_CONFIG ",loans:off");
    void *pa[2], *pb[2];
    two_holes_each(pa, pb);
    step(1);
    step(3);
    uint64_t calls = page_calls();
    step(5);
    cr_assert_gt(page_calls(), calls, "moving stitch: the other stream's pages are unmapped and mapped each step");
    free_pins(pa, pb);
}

/* Two steps of peaks taking turns, then a's stitched block (with pages of b) written by a 100 ms kernel
 * and freed while it runs: those pages stay parked with a until a's kernel is done. */
static void pages_of_b_parked_with_busy_a(void **pa, void **pb)
{
    open_pool(LOANS_CONFIG ",loans:on");
    two_holes_each(pa, pb);
    step(1);
    step(3);
    void *x = alloc_written(a, 3 * H, 7, 100000000);
    cr_assert_eq(gp_free(pool, x, a), GP_OK);
}

/* Once the device is idle: no race, and the pool checks. */
static void no_race_and_consistent(void)
{
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

/* b's peak must not take the pages parked with busy a back before a's kernel is done. */
Test(loans, a_lent_page_goes_home_only_once_the_holder_is_done)
{
    void *pa[2], *pb[2];
    pages_of_b_parked_with_busy_a(pa, pb);
    void *y = alloc_written(b, 3 * H, 8, 1000);
    check_pattern(b, y, 3 * H, 8);
    no_race_and_consistent();
    cr_assert_eq(gp_free(pool, y, b), GP_OK);
    gp_sim_synchronize(sim);
    free_pins(pa, pb);
}

/* The same, with b's peak past the cache cap and a's own holes taken again: the pages b lent to a's
 * stitched block, parked with a while a's kernel on them runs, are the only free memory b could stitch.
 * Rather than new memory for them, b waits for a's fence (one stream's kernel) and takes them back
 * (stitch.c: gp_alias_reclaim_waiting); only what nothing free covers comes from the device. No race. */
Test(loans, past_the_cap_a_page_parked_with_a_busy_holder_is_waited_for_not_replaced)
{
    void *pa[2], *pb[2];
    pages_of_b_parked_with_busy_a(pa, pb);
    void *a1 = alloc_written(a, H, 9, 1000), *a2 = alloc_written(a, H, 10, 1000); /* a's own holes */
    gp_stats before = stats_now();
    cr_assert_eq(before.reserved_bytes, 8 * H);
    uint64_t t0 = gp_sim_now(sim);
    void *y = alloc_written(b, 3 * H, 8, 1000);
    gp_stats after = stats_now();
    cr_expect_eq(after.reserved_bytes, 9 * H, "b's free hole and its page back from a, new memory for the rest only");
    cr_expect_gt(after.num_unmap_waits, before.num_unmap_waits, "b waited for a's fence");
    cr_expect_eq(after.num_device_syncs, before.num_device_syncs, "not for the device");
    cr_expect_geq(gp_sim_now(sim), t0 + 100000000, "held up until a's kernel ended");
    check_pattern(b, y, 3 * H, 8);
    check_pattern(a, a1, H, 9);
    check_pattern(a, a2, H, 10);
    no_race_and_consistent();
    cr_assert_eq(gp_free(pool, y, b), GP_OK);
    cr_assert_eq(gp_free(pool, a1, a), GP_OK);
    cr_assert_eq(gp_free(pool, a2, a), GP_OK);
    gp_sim_synchronize(sim);
    free_pins(pa, pb);
}

Test(loans, trim_gives_parked_pages_back)
{
    open_pool(LOANS_CONFIG ",loans:on");
    void *pa[2], *pb[2];
    two_holes_each(pa, pb);
    step(1);
    step(3);
    gp_stats held = stats_now();
    cr_assert_eq(held.cached_bytes + held.allocated_bytes, held.reserved_bytes, "parked pages count as cached memory: live + cached == reserved (%zu %zu %zu)", (size_t)held.cached_bytes, (size_t)held.allocated_bytes, (size_t)held.reserved_bytes);
    free_pins(pa, pb);
    gp_sim_synchronize(sim);
    size_t released = 0;
    cr_assert_eq(gp_trim(pool, 0, &released), GP_OK, "%s", gp_last_error());
    gp_stats s = stats_now();
    cr_assert_eq(s.reserved_bytes, 0, "every page went back, those parked with the other stream too");
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

Test(loans, a_failed_map_while_lending_loses_nothing)
{
    open_pool(LOANS_CONFIG ",loans:on");
    void *pa[2], *pb[2];
    two_holes_each(pa, pb);
    for (int n = 1; n <= 3; n++) {
        gp_sim_fail_call(sim, n, GP_SIM_CALL_MAP, GP_ERR_DEVICE);
        void *x = NULL;
        int rc = gp_alloc(pool, &x, 3 * H, a);
        cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
        if (rc == GP_OK) {
            cr_assert_eq(gp_sim_launch(sim, a, x, 3 * H, GP_SIM_WRITE, 9, 1000), GP_OK, "%s",
                         gp_sim_first_violation(sim));
            cr_assert_eq(gp_free(pool, x, a), GP_OK);
        }
        gp_sim_fail_call(sim, 0, GP_SIM_CALL_MAP, GP_OK);
        gp_sim_synchronize(sim);
    }
    step(11);
    free_pins(pa, pb);
}

/* Destroy with a pending free next to a page parked with the other stream: pool destroy drains the
 * pending block (its events waited for) and then undoes the aliases, whose homes go FREE and coalesce
 * with their neighbours, that block among them. It must be back in its heap by then (once, a drained
 * block was marked FREE off the free lists, and the coalescing home broke the heap's accounting). */
Test(loans, destroy_with_a_pending_free_beside_a_parked_page)
{
    open_pool(LOANS_CONFIG ",loans:on");
    void *pa[2], *pb[2];
    two_holes_each(pa, pb);
    step(1);
    step(3); /* b's peak holds a's pages (parked with b), one hole of a's either side of pa[0] */
    check_pattern(b, pb[0], H, 201);
    check_pattern(b, pb[1], H, 203);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_free(pool, pb[0], b), GP_OK);
    cr_assert_eq(gp_free(pool, pb[1], b), GP_OK);
    /* pa[0] read on b by a long kernel, then freed on a: pending until b's event completes */
    cr_assert_eq(gp_sim_launch(sim, b, pa[0], H, GP_SIM_CHECK, 101, 100000000), GP_OK, "%s",
                 gp_sim_first_violation(sim));
    cr_assert_eq(gp_record_stream(pool, pa[0], b), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, pa[0], a), GP_OK);
    gp_stats s = stats_now();
    cr_assert_gt(s.pending_bytes, 0, "the free waits for b's kernel");
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    /* pa[1] stays live: a's heap then holds no free block but the drained one (with more, the
     * broken accounting went unseen) */
    gp_leak_report leaks;
    cr_assert_eq(gp_pool_destroy(pool, &leaks), GP_OK, "%s", gp_last_error());
    pool = NULL;
    cr_assert_eq(leaks.live_blocks, 1, "pa[1], reported as a leak");
}

/* a's peak (3H, freed) beside a block a keeps live (so its range cannot change stream whole), then a
 * 4 MiB request on b: growth would stay under the cache cap (default slack) but raise the pool's
 * high-water mark. Returns b's block; *held is a's live block. `a_busy`: a's peak is freed while a
 * long kernel on a still writes it. */
static void *past_the_peak_on_b(void **held, bool a_busy)
{
    *held = alloc_written(a, H, 300, 1000);
    void *peak = alloc_written(a, 3 * H, 301, a_busy ? 100000000 : 1000);
    cr_assert_eq(gp_free(pool, peak, a), GP_OK);
    if (!a_busy)
        gp_sim_synchronize(sim);
    gp_stats before = stats_now();
    cr_assert_eq(before.reserved_bytes, 4 * H, "reserved %zu", (size_t)before.reserved_bytes);
    return alloc_written(b, 4 * MIB, 302, 1000);
}

/* Frees what past_the_peak_on_b left live and lets the device finish. */
static void free_past_the_peak(void *y, void *held)
{
    cr_assert_eq(gp_free(pool, y, b), GP_OK);
    cr_assert_eq(gp_free(pool, held, a), GP_OK);
    gp_sim_synchronize(sim);
}

Test(loans, growth_that_would_raise_the_peak_borrows_an_idle_streams_free_pages)
{
    open_pool("device_memory:1GiB,borrow:off,loans:on");
    uint64_t creates = gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE);
    void *held, *y = past_the_peak_on_b(&held, false);
    cr_assert_eq(stats_now().reserved_bytes, 4 * H, "b's block is two of a's free pages, lent: no new memory");
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE), creates + 4 * H / (2 * MIB));
    check_pattern(b, y, 4 * MIB, 302);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, y, b), GP_OK);
    gp_sim_synchronize(sim);
    /* a's peak again: its pages come home from b (done) with no new memory */
    void *x = alloc_written(a, 3 * H, 303, 1000);
    check_pattern(a, x, 3 * H, 303);
    cr_assert_eq(stats_now().reserved_bytes, 4 * H);
    cr_assert_eq(gp_free(pool, x, a), GP_OK);
    cr_assert_eq(gp_free(pool, held, a), GP_OK);
    gp_sim_synchronize(sim);
}

Test(loans, pages_of_a_stream_still_at_work_are_not_lent_past_the_peak)
{
    open_pool("device_memory:1GiB,borrow:off,loans:on");
    void *held, *y = past_the_peak_on_b(&held, true);
    cr_assert_eq(stats_now().reserved_bytes, 4 * H + 4 * MIB, "a's kernel still writes its free pages: b grows");
    check_pattern(b, y, 4 * MIB, 302);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    free_past_the_peak(y, held);
}

/* Without loans the same growth moves two of a's idle free pages into b's range (stitch.c, hold_peak):
 * map calls, no new memory; a's peak then grows them back. */
Test(loans, without_loans_growth_past_the_peak_moves_an_idle_streams_free_pages)
{
    open_pool("device_memory:1GiB,borrow:off,loans:off");
    uint64_t creates = gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE);
    void *held, *y = past_the_peak_on_b(&held, false);
    cr_assert_eq(stats_now().reserved_bytes, 4 * H, "b's growth took two of a's idle free pages: no new memory");
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE), creates + 4 * H / (2 * MIB));
    cr_assert_eq(stats_now().reserved_bytes_peak, 4 * H, "the high-water mark held");
    check_pattern(b, y, 4 * MIB, 302);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    free_past_the_peak(y, held);
}

/* The same with a's kernel still writing its freed peak: b grows (4 MiB of new memory) rather than wait
 * for a's work under the cache cap, and no unmap waited for a. */
Test(loans, without_loans_growth_past_the_peak_does_not_wait_for_a_stream_at_work)
{
    open_pool("device_memory:1GiB,borrow:off,loans:off");
    void *held, *y = past_the_peak_on_b(&held, true);
    gp_stats s = stats_now();
    cr_assert_eq(s.reserved_bytes, 4 * H + 4 * MIB, "a's kernel still writes its free pages: b grows");
    cr_assert_eq(s.num_unmap_waits, 0, "no wait for a's work");
    check_pattern(b, y, 4 * MIB, 302);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    free_past_the_peak(y, held);
}

/* On a: 20 MiB live, a 20 MiB hole, 20 MiB live, a 20 MiB free end (the pool at its high-water mark,
 * the cache cap far away), then 50 MiB: a's whole free pages (20) are too few to stitch it, so the end
 * grows in place by 15 pages. With `b_too`, b has been used (a's tenant has two streams). Returns the
 * growth in reserved bytes. */
static size_t growth_for_50_mib(bool b_too)
{
    open_pool("device_memory:1GiB,borrow:off,loans:off,cache_slack:1");
    if (b_too) {
        void *t = alloc_written(b, 4 * MIB, 399, 1000);
        cr_assert_eq(gp_free(pool, t, b), GP_OK);
    }
    void *p1 = alloc_written(a, 20 * MIB, 400, 1000), *hole = alloc_written(a, 20 * MIB, 401, 1000);
    void *p2 = alloc_written(a, 20 * MIB, 402, 1000), *end = alloc_written(a, 20 * MIB, 403, 1000);
    cr_assert_eq(gp_free(pool, hole, a), GP_OK);
    cr_assert_eq(gp_free(pool, end, a), GP_OK);
    gp_sim_synchronize(sim);
    gp_stats before = stats_now();
    cr_assert_eq(before.reserved_bytes, before.reserved_bytes_peak, "at the high-water mark");
    void *y = alloc_written(a, 50 * MIB, 404, 1000);
    size_t grown = stats_now().reserved_bytes - before.reserved_bytes;
    check_pattern(a, p1, 20 * MIB, 400);
    check_pattern(a, p2, 20 * MIB, 402);
    check_pattern(a, y, 50 * MIB, 404);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, y, a), GP_OK);
    cr_assert_eq(gp_free(pool, p1, a), GP_OK);
    cr_assert_eq(gp_free(pool, p2, a), GP_OK);
    gp_sim_synchronize(sim);
    return grown;
}

/* One stream alone keeps the cap's rule: its growth under the cap past the peak makes all 15 pages
 * rather than cut its own hole's pages out (its layout for later in its step). */
Test(loans, one_stream_alone_grows_under_the_cap_past_the_peak)
{
    cr_assert_eq(growth_for_50_mib(false), 30 * MIB);
}

/* A tenant with two streams: the same growth takes the idle free pages first, the hole's 10 and the 2
 * of b's range (its 4 MiB block, freed), and makes only 3. */
Test(loans, with_two_streams_growth_past_the_peak_takes_idle_pages_first)
{
    size_t g = growth_for_50_mib(true);
    cr_assert_eq(g, 6 * MIB, "grew %zu MiB", g / MIB);
}

/* a's three holes of H (its pins between them), and a hole of H on b: a's 3H peak is stitched from its
 * own holes (no loan needed), freed; then a block of H on a fills one of those holes, so that a third of
 * the stitched range's homes are in use. *pa: a's pins and that block; *pb: b's pin. */
static void a_range_with_a_third_in_use(void **pa, void **pb, void **z)
{
    void *holes[4];
    for (int i = 0; i < 4; i++) { /* hole, pin, hole, pin, ...: pins seeded 401, 403, 405 (a), 407 (b) */
        gp_stream s = i < 3 ? a : b;
        void **pin = i < 3 ? &pa[i] : &pb[0];
        holes[i] = alloc_written(s, H, 400 + 2 * (uint64_t)i, 1000);
        *pin = alloc_written(s, H, 401 + 2 * (uint64_t)i, 1000);
    }
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_free(pool, holes[i], i < 3 ? a : b), GP_OK);
    gp_sim_synchronize(sim);
    void *x = alloc_written(a, 3 * H, 408, 1000);
    check_pattern(a, x, 3 * H, 408);
    cr_assert_eq(gp_free(pool, x, a), GP_OK);
    gp_sim_synchronize(sim);
    *z = alloc_written(a, H, 409, 1000);
}

/* a's peak again: the stitched range's homes in use (z's) are a run of slots that must be mapped to
 * other free pages (b's idle hole, lent): a repair (alias.c). The run is replaced as one: its unmaps
 * after one wait for a's fence (no device synchronize), its maps with one access call, no new memory. */
Test(loans, a_repair_replaces_a_run_of_slots_after_one_wait_with_one_access_call)
{
    open_pool(LOANS_CONFIG ",loans:on");
    void *pa[3], *pb[1], *z;
    a_range_with_a_third_in_use(pa, pb, &z);
    gp_stats before = stats_now();
    uint64_t syncs = gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC), access = gp_sim_calls(sim, GP_SIM_CALL_SET_ACCESS);
    uint64_t maps = gp_sim_calls(sim, GP_SIM_CALL_MAP), unmaps = gp_sim_calls(sim, GP_SIM_CALL_UNMAP);
    uint64_t creates = gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE);
    void *x = alloc_written(a, 3 * H, 410, 1000);
    size_t run = H / (2 * MIB);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_UNMAP) - unmaps, run, "the slots of z's pages unmapped");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_MAP) - maps, run, "b's free pages mapped there instead");
    gp_stats after = stats_now();
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC) - syncs, 0, "no device synchronize: a's fence");
    cr_expect_leq(after.num_unmap_waits - before.num_unmap_waits, 1, "one wait at most for the run's unmaps");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_SET_ACCESS) - access, 1, "one access call for the run's maps");
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE), creates, "no new memory");
    cr_expect_eq(stats_now().reserved_bytes, before.reserved_bytes);
    check_pattern(a, x, 3 * H, 410);
    check_pattern(a, z, H, 409);
    check_pattern(a, pa[0], H, 401);
    check_pattern(b, pb[0], H, 407);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, x, a), GP_OK);
    cr_assert_eq(gp_free(pool, z, a), GP_OK);
    gp_sim_synchronize(sim);
}

/* The same repair with each of its device calls failing in turn (the wait for a's fence, an unmap, a
 * map, the access call): the request is served some other way or refused, nothing live is touched, and the
 * pool stays consistent and leaks nothing (teardown). */
Test(loans, a_repair_whose_device_call_fails_loses_nothing)
{
    static const unsigned kinds[] = {GP_SIM_CALL_EVENT_SYNC, GP_SIM_CALL_UNMAP, GP_SIM_CALL_MAP,
                                     GP_SIM_CALL_SET_ACCESS};
    static const uint64_t nth[] = {1, 7, 7, 1};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        open_pool(LOANS_CONFIG ",loans:on");
        void *pa[3], *pb[1], *z;
        a_range_with_a_third_in_use(pa, pb, &z);
        gp_sim_fail_call(sim, nth[k], kinds[k], GP_ERR_DEVICE);
        void *x = NULL;
        uint64_t injected = gp_sim_faults_injected(sim);
        int rc = gp_alloc(pool, &x, 3 * H, a);
        cr_expect_eq(gp_sim_faults_injected(sim), injected + 1, "call kind %u failed once", kinds[k]);
        gp_sim_fail_call(sim, 0, kinds[k], GP_OK);
        cr_assert_eq(gp_check(pool), GP_OK, "call kind %u: %s", kinds[k], gp_last_error());
        if (rc == GP_OK) {
            cr_assert_eq(gp_sim_launch(sim, a, x, 3 * H, GP_SIM_WRITE, 411, 1000), GP_OK, "%s",
                         gp_sim_first_violation(sim));
            check_pattern(a, x, 3 * H, 411);
        }
        check_pattern(a, z, H, 409);
        check_pattern(a, pa[0], H, 401);
        check_pattern(a, pa[1], H, 403);
        check_pattern(a, pa[2], H, 405);
        check_pattern(b, pb[0], H, 407);
        gp_sim_synchronize(sim);
        if (rc == GP_OK)
            cr_assert_eq(gp_free(pool, x, a), GP_OK);
        /* and the peak once more, with nothing failing */
        x = alloc_written(a, 3 * H, 412, 1000);
        check_pattern(a, x, 3 * H, 412);
        gp_sim_synchronize(sim);
        cr_assert_eq(gp_free(pool, x, a), GP_OK);
        cr_assert_eq(gp_free(pool, z, a), GP_OK);
        gp_sim_synchronize(sim);
        teardown();
    }
}

/* A loans pool where a's stitched range lies idle over its three free holes (z freed, the device idle);
 * *pa: a's pins, *pb: b's pin. */
static void a_stitched_range_idle_over_three_holes(void **pa, void **pb)
{
    open_pool(LOANS_CONFIG ",loans:on");
    void *z;
    a_range_with_a_third_in_use(pa, pb, &z);
    check_pattern(a, z, H, 409);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_free(pool, z, a), GP_OK);
    gp_sim_synchronize(sim);
}

/* The same trim while a runs a long kernel on a small block it has freed since (its page kept by a
 * live neighbour): the slots went idle at their own frees, stamped then, so the wait before unmapping
 * them is for a's fence at those stamps, which has completed, not at a's latest free, which would hold
 * the host until the kernel ends (drop_slot_runs). */
Test(loans, trim_of_slots_idle_since_older_frees_does_not_wait_for_later_work)
{
    void *pa[3], *pb[1];
    a_stitched_range_idle_over_three_holes(pa, pb);
    void *busy = alloc_written(a, 4096, 420, 1000000000), *keep = alloc_written(a, 4096, 421, 1000);
    cr_assert_eq(gp_free(pool, busy, a), GP_OK); /* a's kernel on it runs 1 s more */
    uint64_t t0 = gp_sim_now(sim), unmaps = gp_sim_calls(sim, GP_SIM_CALL_UNMAP);
    gp_stats before = stats_now();
    size_t released = 0;
    cr_assert_eq(gp_trim(pool, 0, &released), GP_OK, "%s", gp_last_error());
    gp_stats after = stats_now();
    size_t pages = H / (2 * MIB);
    /* the small blocks took a page of a's holes (a small range grown by aliasing): it stays */
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_UNMAP) - unmaps, 7 * pages - 1,
                 "a's three holes at their slots and at home, b's hole, but the small blocks' page");
    cr_expect_eq(after.num_device_syncs, before.num_device_syncs, "no device synchronize");
    cr_expect_eq(after.num_unmap_waits, before.num_unmap_waits, "the slots' and holes' uses are over: no wait");
    cr_expect_lt(gp_sim_now(sim), t0 + 1000000000, "the host was not held up for a's later kernel");
    cr_expect_eq(released, 4 * H - 2 * MIB);
    check_pattern(a, pa[0], H, 401);
    check_pattern(b, pb[0], H, 407);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_free(pool, keep, a), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

/* Trim with a's stitched range idle over its three free holes: the range's slots of each hole are
 * unmapped (gp_alias_unshare), and the hole after them, with no device synchronize and, the streams
 * being idle, no wait at all (their fences say so); everything free goes back, the live blocks keep
 * their contents. */
Test(loans, trim_unmaps_the_slots_of_idle_free_pages_without_waiting)
{
    void *pa[3], *pb[1];
    a_stitched_range_idle_over_three_holes(pa, pb);
    uint64_t syncs = gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC), unmaps = gp_sim_calls(sim, GP_SIM_CALL_UNMAP);
    gp_stats before = stats_now();
    size_t released = 0;
    cr_assert_eq(gp_trim(pool, 0, &released), GP_OK, "%s", gp_last_error());
    size_t pages = H / (2 * MIB);
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_UNMAP) - unmaps, 7 * pages,
                 "a's three holes at their slots and at home, b's hole");
    gp_stats after = stats_now();
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC) - syncs, 0, "no device synchronize: the streams' fences");
    cr_expect_eq(after.num_unmap_waits - before.num_unmap_waits, 0, "the streams are idle: nothing to wait for");
    cr_expect_eq(released, 4 * H);
    cr_expect_eq(stats_now().reserved_bytes, 4 * H, "the four live blocks");
    check_pattern(a, pa[0], H, 401);
    check_pattern(a, pa[1], H, 403);
    check_pattern(a, pa[2], H, 405);
    check_pattern(b, pb[0], H, 407);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}
