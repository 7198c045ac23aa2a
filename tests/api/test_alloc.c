/*
 * test_alloc.c — allocation behaviour through the public API on the sim: caching (no device calls on
 * the fast path), packing of small requests, own segments for huge ones, OOM release and retry, trim,
 * stats and their JSON, and destroy's leak report checked against the sim's own ledger.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)

static gp_pool *pool;
static gp_sim *sim;

static void setup(void)
{
    unsetenv("GPUPOOL_CONF");
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", "device_memory:1GiB"), GP_OK, "%s", gp_last_error());
    sim = gp_sim_of(pool);
    cr_assert_not_null(sim);
    gp_sim_retain(sim);
}

static void teardown(void)
{
    if (pool != NULL)
        gp_pool_destroy(pool, NULL);
    gp_sim_release(sim);
}

static gp_stats stats_now(void)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK, "%s", gp_last_error());
    return s;
}

static uint64_t device_calls(void)
{
    return gp_sim_calls(sim, GP_SIM_CALL_ALL);
}

TestSuite(alloc, .init = setup, .fini = teardown);

Test(alloc, cached_size_on_the_same_stream_makes_no_device_call)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 3000, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
    uint64_t calls = device_calls();
    for (int i = 0; i < 1000; i++) {
        void *q;
        cr_assert_eq(gp_alloc(pool, &q, 3000, NULL), GP_OK);
        cr_assert_eq(q, p, "a block freed on a stream is reused at once on it");
        cr_assert_eq(gp_free(pool, q, NULL), GP_OK);
    }
    cr_assert_eq(device_calls(), calls, "the fast path made device calls");
}

Test(alloc, pointers_are_aligned_and_disjoint_and_usable_by_kernels)
{
    enum { N = 200 };
    void *p[N];
    size_t size[N];
    gp_stream s = gp_sim_stream_create(sim);
    for (int i = 0; i < N; i++) {
        size[i] = 1 + (size_t)(i * 7919) % (3 * MIB);
        cr_assert_eq(gp_alloc(pool, &p[i], size[i], s), GP_OK, "%s", gp_last_error());
        cr_assert_eq((uintptr_t)p[i] % 512, 0);
        cr_assert_eq(gp_sim_launch(sim, s, p[i], size[i], GP_SIM_WRITE, (uint64_t)i, 100), GP_OK, "%s",
                     gp_sim_first_violation(sim));
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(gp_sim_launch(sim, s, p[i], size[i], GP_SIM_CHECK, (uint64_t)i, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
    for (int i = 0; i < N; i++)
        cr_assert_eq(gp_free(pool, p[i], s), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

Test(alloc, small_requests_share_a_2MiB_segment)
{
    void *p[64];
    for (int i = 0; i < 64; i++)
        cr_assert_eq(gp_alloc(pool, &p[i], 16 * 1024, NULL), GP_OK);
    gp_stats s = stats_now();
    cr_assert_eq(s.num_device_allocs, 1, "64 x 16 KiB fit one 2 MiB segment");
    cr_assert_eq(s.reserved_bytes, 2 * MIB);
    cr_assert_eq(s.allocated_bytes, 64 * 16 * 1024);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(gp_free(pool, p[i], NULL), GP_OK);
}

Test(alloc, rounding_to_512_bytes_only)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 1000, NULL), GP_OK);
    gp_stats s = stats_now();
    cr_assert_eq(s.allocated_bytes, 1024);
    cr_assert_eq(s.requested_bytes, 1000);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &p, 5 * MIB + 1, NULL), GP_OK);
    s = stats_now();
    cr_assert_eq(s.allocated_bytes, 5 * MIB + 512, "a large request consumes its size rounded to 512 B");
    cr_assert_eq(s.reserved_bytes, 2 * MIB + 20 * MIB, "a 2 MiB small segment and a 20 MiB large one");
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
}

Test(alloc, huge_requests_get_their_own_segment)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 33 * MIB, NULL), GP_OK);
    gp_stats s = stats_now();
    cr_assert_eq(s.reserved_bytes, 34 * MIB, "rounded up to whole 2 MiB pages");
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.allocated_bytes, 34 * MIB, "the sim's ledger agrees");
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
}

Test(alloc, freed_neighbours_coalesce_into_a_larger_block)
{
    void *a, *b, *c;
    cr_assert_eq(gp_alloc(pool, &a, 6 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &b, 6 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &c, 6 * MIB, NULL), GP_OK);
    cr_assert_eq(stats_now().num_device_allocs, 1);
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, b, NULL), GP_OK);
    void *d;
    cr_assert_eq(gp_alloc(pool, &d, 12 * MIB - 4096, NULL), GP_OK);
    cr_assert_eq(d, a, "the two freed neighbours serve one larger request");
    cr_assert_eq(stats_now().num_device_allocs, 1);
    cr_assert_eq(gp_free(pool, c, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, d, NULL), GP_OK);
}

/* Replaces the suite's pool with one made from `config`. */
static void recreate(const char *config)
{
    gp_pool_destroy(pool, NULL);
    gp_sim_release(sim);
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", config), GP_OK, "%s", gp_last_error());
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
}

Test(alloc, growth_past_the_slack_first_gives_back_unfit_free_segments)
{
    void *big[4], *p;
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_alloc(pool, &big[i], 100 * MIB, NULL), GP_OK, "%s", gp_last_error());
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_free(pool, big[i], NULL), GP_OK);
    /* peak allocated 400 MiB; growing by 150 MiB would hold 550 MiB > 1.04 x 400 MiB: the two oldest
     * free segments go back first */
    cr_assert_eq(gp_alloc(pool, &p, 150 * MIB, NULL), GP_OK, "%s", gp_last_error());
    gp_stats s = stats_now();
    cr_assert_eq(s.num_device_frees, 2);
    cr_assert_eq(s.reserved_bytes, 350 * MIB);
    cr_assert_eq(s.num_alloc_retries, 0, "no OOM was involved");
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);

    recreate("device_memory:1GiB,cache_slack:off");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_alloc(pool, &big[i], 100 * MIB, NULL), GP_OK, "%s", gp_last_error());
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_free(pool, big[i], NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &p, 150 * MIB, NULL), GP_OK, "%s", gp_last_error());
    s = stats_now();
    cr_assert_eq(s.num_device_frees, 0, "cache_slack:off keeps everything cached");
    cr_assert_eq(s.reserved_bytes, 550 * MIB);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
}

Test(alloc, growth_past_the_peak_gives_back_the_streams_own_unfit_segments_even_short_of_the_cap)
{
    /* One 20 MiB large segment holding four 5 MiB blocks, then a 100 MiB segment of its own: peak
     * allocated 120 MiB. Three of the 5 MiB blocks and the 100 MiB one are freed: 15 MiB free inside the
     * shared segment (not releasable) and one wholly free 100 MiB segment. */
    void *q[4], *w, *r;
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_alloc(pool, &q[i], 5 * MIB, NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &w, 100 * MIB, NULL), GP_OK, "%s", gp_last_error());
    for (int i = 1; i < 4; i++)
        cr_assert_eq(gp_free(pool, q[i], NULL), GP_OK);
    cr_assert_eq(gp_free(pool, w, NULL), GP_OK);
    cr_assert_eq(stats_now().reserved_bytes, 120 * MIB);
    /* 110 MiB fits neither. The cap is 1.04 x 120 MiB; growing would hold 230 MiB, and the 100 MiB wholly
     * free segment cannot bring the pool under the cap, but it cannot serve the request either and the
     * growth would raise the high-water mark: it goes back before the new segment comes. */
    cr_assert_eq(gp_alloc(pool, &r, 110 * MIB, NULL), GP_OK, "%s", gp_last_error());
    gp_stats s = stats_now();
    cr_assert_eq(s.num_device_frees, 1, "the unfit 100 MiB segment was given back (%llu device frees)",
                 (unsigned long long)s.num_device_frees);
    cr_assert_eq(s.reserved_bytes, 130 * MIB, "reserved %llu", (unsigned long long)s.reserved_bytes);
    cr_assert_eq(s.reserved_bytes_peak, 130 * MIB, "the peak is 130 MiB, not 230 MiB (%llu)",
                 (unsigned long long)s.reserved_bytes_peak);
    cr_assert_eq(gp_free(pool, r, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, q[0], NULL), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

Test(alloc, device_oom_releases_free_segments_and_retries)
{
    recreate("device_memory:1GiB,cache_slack:off");
    void *big[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_alloc(pool, &big[i], 200 * MIB, NULL), GP_OK, "%s", gp_last_error());
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_free(pool, big[i], NULL), GP_OK);
    /* 800 MiB cached in 200 MiB pieces; 500 MiB fits none of them and not the device's free 224 MiB */
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 500 * MIB, NULL), GP_OK, "%s", gp_last_error());
    gp_stats s = stats_now();
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert(s.num_device_frees >= 2, "free segments were given back (%llu)", (unsigned long long)s.num_device_frees);
    cr_assert_eq(s.num_ooms, 0);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

Test(alloc, trim_keeps_at_most_the_given_bytes)
{
    void *p[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(gp_alloc(pool, &p[i], 16 * MIB, NULL), GP_OK);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(gp_free(pool, p[i], NULL), GP_OK);
    gp_stats before = stats_now();
    size_t released = 0;
    cr_assert_eq(gp_trim(pool, 40 * MIB, &released), GP_OK, "%s", gp_last_error());
    gp_stats after = stats_now();
    cr_assert(after.cached_bytes <= 40 * MIB, "cached %llu", (unsigned long long)after.cached_bytes);
    cr_assert_eq(before.reserved_bytes - after.reserved_bytes, released);
    cr_assert_eq(gp_trim(pool, 0, &released), GP_OK);
    cr_assert_eq(stats_now().reserved_bytes, 0);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.allocated_bytes, 0, "the sim holds nothing after trim(0)");
}

Test(alloc, trim_never_releases_live_memory)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 1000, NULL), GP_OK);
    size_t released = 1;
    cr_assert_eq(gp_trim(pool, 0, &released), GP_OK);
    cr_assert_eq(released, 0, "the only segment holds a live block");
    cr_assert_eq(stats_now().reserved_bytes, 2 * MIB);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
}

Test(alloc, peaks_and_json)
{
    void *a, *b;
    cr_assert_eq(gp_alloc(pool, &a, 4 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &b, 4 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, b, NULL), GP_OK);
    gp_stats s = stats_now();
    cr_assert_eq(s.allocated_bytes, 0);
    cr_assert_eq(s.allocated_bytes_peak, 8 * MIB);
    cr_assert_eq(s.reserved_bytes_peak, 20 * MIB);
    cr_assert_eq(s.allocated_bytes + s.cached_bytes, s.reserved_bytes);
    cr_assert_eq(s.num_allocs, 2);
    cr_assert_eq(s.num_frees, 2);
    cr_assert_eq(s.size_class_allocs[14], 2, "4 MiB requests are counted in bucket 14, [4 MiB, 8 MiB)");
    char json[4096];
    size_t needed;
    cr_assert_eq(gp_stats_json(pool, json, sizeof json, &needed), GP_OK);
    cr_assert(needed < sizeof json);
    cr_assert(strstr(json, "\"allocated_bytes_peak\":8388608") != NULL, "%s", json);
    cr_assert(strstr(json, "\"reserved_bytes\":20971520") != NULL, "%s", json);
    cr_assert(strstr(json, "\"num_ooms\":0") != NULL, "%s", json);
    cr_assert_eq(json[0], '{');
    cr_assert_eq(json[needed - 1], '}');
}

/*
 * Streams keep their allocated counts apart and add them to the pool's shared total 16 MiB at a time
 * (pool_state.h: GP_FLUSH_BYTES), so that one stream's total may be behind what another freed. The
 * peak is never raised past what was allocated at once: here b's four 5 MiB blocks (20 MiB, the true
 * peak) reach the shared total, b frees three of them (15 MiB, not added yet), and a's two bring
 * the estimate to 30 MiB while 15 MiB is allocated.
 */
Test(alloc, allocated_peak_is_not_raised_by_what_another_stream_freed)
{
    gp_stream a = gp_sim_stream_create(sim), b = gp_sim_stream_create(sim);
    void *pb[4], *pa[2];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_alloc(pool, &pb[i], 5 * MIB, b), GP_OK, "%s", gp_last_error());
    for (int i = 0; i < 3; i++)
        cr_assert_eq(gp_free(pool, pb[i], b), GP_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(gp_alloc(pool, &pa[i], 5 * MIB, a), GP_OK, "%s", gp_last_error());
    gp_stats s = stats_now();
    cr_assert_eq(s.allocated_bytes, 15 * MIB);
    cr_assert_eq(s.allocated_bytes_peak, 20 * MIB, "peak %llu MiB",
                 (unsigned long long)(s.allocated_bytes_peak / MIB));
    /* a real new peak on a is still counted: 25 MiB allocated at once */
    cr_assert_eq(gp_alloc(pool, &pb[0], 10 * MIB, a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(stats_now().allocated_bytes_peak, 25 * MIB);
    cr_assert_eq(gp_free(pool, pb[0], a), GP_OK);
    cr_assert_eq(gp_free(pool, pb[3], b), GP_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(gp_free(pool, pa[i], a), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

static void collect(void *opaque, const char *text)
{
    strncat((char *)opaque, text, 4095 - strlen((char *)opaque));
}

Test(alloc, printed_stats)
{
    char out[4096] = "";
    cr_assert_eq(gp_stats_print(pool, collect, out), GP_OK);
    cr_assert(strstr(out, "reserved") != NULL && strstr(out, "backend sim") != NULL, "%s", out);
}

Test(alloc, destroy_reports_live_blocks_and_returns_every_byte)
{
    void *p, *q;
    cr_assert_eq(gp_alloc(pool, &p, 5000, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &q, 50 * MIB, NULL), GP_OK);
    gp_leak_report report;
    cr_assert_eq(gp_pool_destroy(pool, &report), GP_OK);
    pool = NULL;
    cr_assert_eq(report.live_blocks, 2);
    cr_assert_eq(report.live_bytes, 5120 + 50 * MIB);
    cr_assert(strstr(gp_last_error(), "2 blocks") != NULL, "%s", gp_last_error());
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert(r.closed);
    cr_assert_eq(r.leaked_bytes_at_close, 0, "destroy gave every byte back");
    cr_assert_eq(r.leaked_events_at_close, 0);
}

/*
 * Quick lists age (ds/heap.h): a small freed block that nobody asks for again while many other calls
 * go by returns to the free lists and coalesces, so the space around it serves other sizes. Here a
 * 4 KiB block freed before 200 allocate+free pairs of another size (each pair two calls the quick
 * lists do not serve, well past two epochs of GP_QUICK_MAX = 64 calls) merges with its freed 16 KiB
 * neighbour, and a 20 KiB request gets the hole at its address. With 10 pairs (one epoch has not
 * passed) it still waits on its quick list and the request goes elsewhere. The same with the thread
 * cache on and off: the cache's blocks are the tops of the quick lists and age with them. Only a pool
 * of pages ages its quick lists (provider/pool_state.h: quick_aging), so on the cudaMalloc path the
 * block waits either way.
 */
static void *placed_after_pairs(const char *backend, const char *config, int pairs)
{
    gp_pool_destroy(pool, NULL);
    gp_sim_release(sim);
    cr_assert_eq(gp_pool_create(&pool, 0, backend, config), GP_OK, "%s", gp_last_error());
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    void *a, *b, *c, *x, *d;
    cr_assert_eq(gp_alloc(pool, &a, 4096, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &b, 16384, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &c, 16384, NULL), GP_OK); /* keeps the hole at a closed */
    cr_assert_eq((uintptr_t)b, (uintptr_t)a + 4096, "a fresh small segment is filled in order");
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK); /* onto the 4 KiB quick list */
    for (int i = 0; i < pairs; i++) {
        cr_assert_eq(gp_alloc(pool, &x, 32768, NULL), GP_OK);
        cr_assert_eq(gp_free(pool, x, NULL), GP_OK);
    }
    cr_assert_eq(gp_free(pool, b, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &d, 20480, NULL), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, c, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, d, NULL), GP_OK);
    return (uintptr_t)d == (uintptr_t)a ? a : NULL;
}

Test(alloc, a_small_block_nobody_asks_for_again_leaves_its_quick_list_and_coalesces)
{
    const char *backends[] = {"sim", "sim-vmm"};
    const char *configs[] = {"device_memory:1GiB,thread_cache:on", "device_memory:1GiB,thread_cache:off"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            bool ages = strcmp(backends[i], "sim-vmm") == 0;
            cr_assert_eq(placed_after_pairs(backends[i], configs[j], 200) != NULL, ages,
                         "%s %s: after 400 other calls the 4 KiB block %s", backends[i], configs[j],
                         ages ? "coalesced with its neighbour" : "waits on its quick list (no aging)");
            cr_assert_null(placed_after_pairs(backends[i], configs[j], 10),
                           "%s %s: after 20 other calls the 4 KiB block still waits on its quick list",
                           backends[i], configs[j]);
        }
}
