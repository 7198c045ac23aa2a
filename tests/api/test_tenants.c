/*
 * test_tenants.c — per-model budgets through the public API on the sim: attribution (thread tenant,
 * stream binding, default), max with GP_ERR_QUOTA and its message, high trimming the tenant's own
 * cache, min guarantees, lowering max at run time, per-tenant stats and JSON, and pause/resume with
 * contents on the virtual memory sim (checked with pattern kernels).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)

static gp_pool *pool;
static gp_sim *sim;

static void open_pool(const char *backend, const char *config)
{
    unsetenv("GPUPOOL_CONF");
    cr_assert_eq(gp_pool_create(&pool, 0, backend, config), GP_OK, "%s", gp_last_error());
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
}

static void teardown(void)
{
    if (pool != NULL) {
        cr_expect_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
        gp_pool_destroy(pool, NULL);
        gp_sim_report r;
        gp_sim_get_report(sim, &r);
        cr_expect_eq(r.leaked_bytes_at_close, 0, "%s", gp_sim_first_violation(sim));
        cr_expect_eq(r.races, 0, "%s", gp_sim_first_violation(sim));
        cr_expect_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    }
    if (sim != NULL)
        gp_sim_release(sim);
    pool = NULL;
    sim = NULL;
}

static gp_tenant_stats tenant(const char *name)
{
    gp_tenant_stats s = {.size = sizeof s, .version = GP_TENANT_STATS_VERSION};
    cr_assert_eq(gp_tenant_get_stats(pool, name, &s), GP_OK, "%s", gp_last_error());
    return s;
}

static void create(const char *name, size_t max, size_t high, size_t min)
{
    gp_tenant_limits l = {max, high, min};
    cr_assert_eq(gp_tenant_create(pool, name, &l), GP_OK, "%s", gp_last_error());
}

/* Runs the sim's queued work out and expects no pattern mismatch and no bad device call so far. */
static void expect_sim_clean(const char *what)
{
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_expect_eq(r.pattern_mismatches, 0, "%s: %s", what, gp_sim_first_violation(sim));
    cr_expect_eq(r.bad_calls, 0, "%s: %s", what, gp_sim_first_violation(sim));
}

TestSuite(tenants, .fini = teardown);

Test(tenants, attribution_thread_then_stream_then_default)
{
    open_pool("sim", "device_memory:1GiB");
    create("a", 0, 0, 0);
    create("b", 0, 0, 0);
    gp_stream s1 = gp_sim_stream_create(sim), s2 = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "b", s2), GP_OK);
    void *p0, *pa, *pb, *pnested;
    cr_assert_eq(gp_alloc(pool, &p0, 3 * MIB, s1), GP_OK);
    cr_assert_eq(gp_alloc(pool, &pb, 3 * MIB, s2), GP_OK);
    cr_assert_eq(gp_tenant_push(pool, "a"), GP_OK);
    cr_assert_eq(gp_alloc(pool, &pa, 3 * MIB, s2), GP_OK, "the thread's tenant wins over the binding");
    cr_assert_eq(gp_tenant_push(pool, "b"), GP_OK);
    cr_assert_eq(gp_alloc(pool, &pnested, 1 * MIB, s1), GP_OK);
    cr_assert_eq(gp_tenant_pop(pool), GP_OK);
    cr_assert_eq(gp_tenant_pop(pool), GP_OK);
    cr_assert_eq(gp_tenant_pop(pool), GP_ERR_INVALID, "nothing left to pop");
    cr_assert_eq(tenant("default").allocated_bytes, 3 * MIB);
    cr_assert_eq(tenant("a").allocated_bytes, 3 * MIB);
    cr_assert_eq(tenant("b").allocated_bytes, 4 * MIB);
    /* a free from any thread and tenant credits the block's own tenant */
    cr_assert_eq(gp_free(pool, pa, s2), GP_OK);
    cr_assert_eq(gp_free(pool, pnested, s1), GP_OK);
    cr_assert_eq(tenant("a").allocated_bytes, 0);
    cr_assert_eq(tenant("b").allocated_bytes, 3 * MIB);
    /* held bytes add up to the pool's reserved bytes */
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(tenant("default").held_bytes + tenant("a").held_bytes + tenant("b").held_bytes, st.reserved_bytes);
    cr_assert_eq(gp_free(pool, p0, s1), GP_OK);
    cr_assert_eq(gp_free(pool, pb, s2), GP_OK);
}

Test(tenants, max_refuses_with_a_message_and_others_are_unaffected)
{
    open_pool("sim", "device_memory:1GiB");
    create("llama", 64 * MIB, 0, 0);
    create("bert", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    void *p[8];
    cr_assert_eq(gp_tenant_push(pool, "llama"), GP_OK);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(gp_alloc(pool, &p[i], 20 * MIB, s), GP_OK, "%s", gp_last_error());
    void *over = (void *)1;
    cr_assert_eq(gp_alloc(pool, &over, 20 * MIB, s), GP_ERR_QUOTA);
    cr_assert_null(over);
    const char *msg = gp_last_error();
    cr_assert(strstr(msg, "llama") && strstr(msg, "max 64.0 MiB") && strstr(msg, "request 20.0 MiB"), "%s", msg);
    cr_assert_eq(tenant("llama").refusals, 1);
    cr_assert(tenant("llama").held_bytes <= 64 * MIB);
    cr_assert_eq(gp_tenant_pop(pool), GP_OK);
    cr_assert_eq(gp_tenant_push(pool, "bert"), GP_OK);
    cr_assert_eq(gp_alloc(pool, &p[3], 200 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_tenant_pop(pool), GP_OK);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gp_free(pool, p[i], s), GP_OK);
}

Test(tenants, max_trims_the_tenants_own_cache_before_refusing)
{
    open_pool("sim", "device_memory:1GiB");
    create("m", 64 * MIB, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "m", s), GP_OK);
    void *a, *b;
    cr_assert_eq(gp_alloc(pool, &a, 40 * MIB, s), GP_OK);
    cr_assert_eq(gp_free(pool, a, s), GP_OK); /* 40 MiB cached by m */
    cr_assert_eq(gp_alloc(pool, &b, 50 * MIB, s), GP_OK, "the cache goes first: %s", gp_last_error());
    cr_assert_eq(tenant("m").held_bytes, 50 * MIB);
    cr_assert_eq(tenant("m").refusals, 0);
    cr_assert_eq(gp_free(pool, b, s), GP_OK);
}

Test(tenants, high_trims_before_growing)
{
    open_pool("sim", "device_memory:1GiB");
    create("h", 0, 48 * MIB, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "h", s), GP_OK);
    void *a, *b;
    cr_assert_eq(gp_alloc(pool, &a, 40 * MIB, s), GP_OK);
    cr_assert_eq(gp_free(pool, a, s), GP_OK);
    cr_assert_eq(gp_alloc(pool, &b, 44 * MIB, s), GP_OK);
    cr_assert_eq(tenant("h").held_bytes, 44 * MIB, "the 40 MiB cached segment went back first");
    cr_assert_eq(gp_free(pool, b, s), GP_OK);
}

Test(tenants, min_is_guaranteed_against_other_tenants)
{
    open_pool("sim", "device_memory:256MiB");
    create("guarded", 0, 0, 100 * MIB);
    create("greedy", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim), g = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "greedy", s), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "guarded", g), GP_OK);
    void *p, *q;
    cr_assert_eq(gp_alloc(pool, &p, 150 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &q, 20 * MIB, s), GP_ERR_OOM, "would eat into guarded's 100 MiB");
    cr_assert(strstr(gp_last_error(), "guarded") != NULL, "%s", gp_last_error());
    void *r;
    cr_assert_eq(gp_alloc(pool, &r, 100 * MIB, g), GP_OK, "guarded reaches its min: %s", gp_last_error());
    cr_assert_eq(gp_free(pool, r, g), GP_OK);
    /* guarded's cache above nothing: it is at its min, so greedy cannot take it */
    cr_assert_eq(gp_alloc(pool, &q, 90 * MIB, s), GP_ERR_OOM);
    cr_assert_eq(tenant("guarded").held_bytes, 100 * MIB);
    cr_assert_eq(gp_free(pool, p, s), GP_OK);
}

Test(tenants, lowering_max_trims_cache_and_refuses_until_it_fits)
{
    open_pool("sim", "device_memory:1GiB");
    create("t", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "t", s), GP_OK);
    void *live, *cached, *small;
    cr_assert_eq(gp_alloc(pool, &live, 60 * MIB, s), GP_OK);
    cr_assert_eq(gp_alloc(pool, &cached, 30 * MIB, s), GP_OK);
    cr_assert_eq(gp_alloc(pool, &small, 1000, s), GP_OK);
    cr_assert_eq(gp_free(pool, cached, s), GP_OK);
    gp_tenant_limits l = {40 * MIB, 0, 0};
    cr_assert_eq(gp_tenant_set_limits(pool, "t", &l), GP_OK);
    gp_tenant_stats st = tenant("t");
    cr_assert_eq(st.held_bytes, 60 * MIB + 2 * MIB, "the cached 30 MiB went back; live blocks stay");
    void *x;
    cr_assert_eq(gp_alloc(pool, &x, 512, s), GP_ERR_QUOTA, "refused while over max, even from its cache");
    cr_assert_eq(gp_free(pool, live, s), GP_OK);
    cr_assert_eq(gp_alloc(pool, &x, 512, s), GP_OK, "fits again once its cache is trimmed: %s", gp_last_error());
    cr_assert(tenant("t").held_bytes <= 40 * MIB);
    cr_assert_eq(gp_free(pool, x, s), GP_OK);
    cr_assert_eq(gp_free(pool, small, s), GP_OK);
}

Test(tenants, bad_input)
{
    open_pool("sim", "device_memory:1GiB");
    gp_tenant_limits bad = {10 * MIB, 0, 20 * MIB};
    cr_assert_eq(gp_tenant_create(pool, "x", &bad), GP_ERR_INVALID);
    cr_assert(strstr(gp_last_error(), "min") != NULL);
    cr_assert_eq(gp_tenant_create(pool, "", NULL), GP_ERR_INVALID);
    cr_assert_eq(gp_tenant_create(pool, "default", NULL), GP_ERR_INVALID, "exists already");
    cr_assert_eq(gp_tenant_push(pool, "nobody"), GP_ERR_INVALID);
    cr_assert(strstr(gp_last_error(), "nobody") != NULL);
    cr_assert_eq(gp_tenant_pause(pool, "default", 0), GP_ERR_INVALID, "needs a virtual memory backend");
    size_t n = 0;
    cr_assert_eq(gp_tenant_count(pool, &n), GP_OK);
    cr_assert_eq(n, 1);
    char name[8];
    cr_assert_eq(gp_tenant_name(pool, 0, name, sizeof name), GP_OK);
    cr_assert_str_eq(name, "default");
}

Test(tenants, stats_json_and_print_list_tenants)
{
    open_pool("sim", "device_memory:1GiB");
    create("model-a", 32 * MIB, 0, 0);
    char json[16384];
    cr_assert_eq(gp_stats_json(pool, json, sizeof json, NULL), GP_OK);
    cr_assert(strstr(json, "\"tenants\":[{\"name\":\"default\"") != NULL, "%s", json);
    cr_assert(strstr(json, "\"name\":\"model-a\"") != NULL && strstr(json, "\"max\":33554432") != NULL, "%s", json);
}

Test(tenants, pause_and_resume_round_trip_contents)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("idle", 0, 0, 0);
    create("busy", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim), t = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "idle", s), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "busy", t), GP_OK);
    enum { N = 6 };
    void *p[N];
    size_t size[N];
    for (int i = 0; i < N; i++) {
        size[i] = (size_t)(i + 1) * 3 * MIB + 1000;
        cr_assert_eq(gp_alloc(pool, &p[i], size[i], s), GP_OK, "%s", gp_last_error());
        cr_assert_eq(gp_sim_launch(sim, s, p[i], size[i], GP_SIM_WRITE, (uint64_t)i, 100), GP_OK);
    }
    void *cached;
    cr_assert_eq(gp_alloc(pool, &cached, 5 * MIB, s), GP_OK);
    cr_assert_eq(gp_free(pool, cached, s), GP_OK);
    gp_sim_synchronize(sim);
    size_t held = tenant("idle").held_bytes;
    gp_sim_report before;
    gp_sim_get_report(sim, &before);

    cr_assert_eq(gp_tenant_pause(pool, "idle", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    gp_tenant_stats st = tenant("idle");
    cr_assert(st.paused);
    cr_assert_eq(st.held_bytes, 0);
    gp_sim_report during;
    gp_sim_get_report(sim, &during);
    cr_assert_eq(during.allocated_bytes, before.allocated_bytes - held, "the sim got the physical memory back");
    void *x;
    cr_assert_eq(gp_alloc(pool, &x, 1000, s), GP_ERR_PAUSED);
    cr_assert(strstr(gp_last_error(), "paused") != NULL);
    /* another tenant uses the memory meanwhile */
    void *other;
    cr_assert_eq(gp_alloc(pool, &other, held, t), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, t, other, held, GP_SIM_WRITE, 99, 100), GP_OK);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_free(pool, other, t), GP_OK);
    cr_assert_eq(gp_trim(pool, 0, NULL), GP_OK);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());

    cr_assert_eq(gp_tenant_resume(pool, "idle"), GP_OK, "%s", gp_last_error());
    /* The pause gave the tenant's cache (the free 5 MiB block's whole pages) back first, so resume maps
     * only the pages its live blocks need: less than it held, and exactly what the device gave again. */
    size_t resumed = tenant("idle").held_bytes;
    gp_sim_report back;
    gp_sim_get_report(sim, &back);
    cr_assert_lt(resumed, held, "the cache went back at the pause: %zu of %zu held after resume", resumed, held);
    cr_assert_geq(held - resumed, 2 * 2 * MIB, "at least the cached block's two whole pages: %zu", held - resumed);
    cr_assert_eq(back.allocated_bytes, during.allocated_bytes + resumed, "resume mapped what the tenant holds");
    cr_assert_eq(tenant("idle").pauses, 1);
    for (int i = 0; i < N; i++)
        cr_assert_eq(gp_sim_launch(sim, s, p[i], size[i], GP_SIM_CHECK, (uint64_t)i, 100), GP_OK,
                     "same addresses after resume");
    gp_sim_synchronize(sim);
    gp_sim_report after;
    gp_sim_get_report(sim, &after);
    cr_assert_eq(after.pattern_mismatches, 0, "contents came back exactly: %s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_alloc(pool, &x, 1000, s), GP_OK, "allocating works again");
    /* The staging buffer came from the jemalloc arena when jemalloc can be opened in this process
     * (CTest sets GLIBC_TUNABLES so that it can: see tests/CMakeLists.txt). */
    char json[16384];
    cr_assert_eq(gp_stats_json(pool, json, sizeof json, NULL), GP_OK);
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (tunables != NULL && strstr(tunables, "optional_static_tls") != NULL)
        cr_assert(strstr(json, "\"staging\":\"jemalloc\"") != NULL, "%s", json);
    else
        cr_assert(strstr(json, "\"staging\":\"") != NULL, "%s", json);
    cr_assert_eq(gp_free(pool, x, s), GP_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(gp_free(pool, p[i], s), GP_OK);
}

/* A sim-vmm pool with tenant m bound to a new stream (returned) holding one 9 MiB block, written with
 * pattern 7, in *p. */
static gp_stream tenant_m_with_a_block(void **p)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("m", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "m", s), GP_OK);
    cr_assert_eq(gp_alloc(pool, p, 9 * MIB, s), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, *p, 9 * MIB, GP_SIM_WRITE, 7, 100), GP_OK);
    gp_sim_synchronize(sim);
    return s;
}

/* Pauses m with the n-th device call of `kinds` failing: the pause fails, rolled back, and the pool
 * checks out with m not paused. */
static void pause_m_rolls_back(uint64_t n, unsigned kinds, unsigned flags)
{
    gp_sim_fail_call(sim, n, kinds, GP_ERR_DEVICE);
    cr_assert_eq(gp_tenant_pause(pool, "m", flags), GP_ERR_DEVICE);
    cr_assert(strstr(gp_last_error(), "rolled back") != NULL, "%s", gp_last_error());
    cr_assert(!tenant("m").paused);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

/* Frees p on s and trims: no range may stay behind (a paused one would: trims skip it). */
static void free_and_trim_to_nothing(void *p, gp_stream s)
{
    cr_assert_eq(gp_free(pool, p, s), GP_OK);
    cr_assert_eq(gp_trim(pool, 0, NULL), GP_OK);
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(st.reserved_bytes, 0, "a trim gives every range's pages back");
}

Test(tenants, pause_fault_rolls_back)
{
    void *p;
    gp_stream s = tenant_m_with_a_block(&p);
    pause_m_rolls_back(3, GP_SIM_CALL_UNMAP, GP_PAUSE_KEEP_CONTENTS);
    cr_assert_eq(gp_sim_launch(sim, s, p, 9 * MIB, GP_SIM_CHECK, 7, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_free(pool, p, s), GP_OK);
}

/* A pause whose very first unmap fails holds no page of that range back: the rollback must still
 * unpause the range, or it stays flagged paused with its memory mapped, skipped by trims, steals and
 * the statistics' walk (found by fuzz_api through the peak composition's sum). The cache is trimmed
 * first, so that the pause's first unmap is the range's. */
Test(tenants, pause_failing_before_any_unmap_leaves_no_range_paused)
{
    void *p;
    gp_stream s = tenant_m_with_a_block(&p);
    cr_assert_eq(gp_trim(pool, 0, NULL), GP_OK);
    pause_m_rolls_back(1, GP_SIM_CALL_UNMAP, 0);
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    gp_breakdown b = {.size = sizeof b, .version = GP_BREAKDOWN_VERSION};
    cr_assert_eq(gp_get_breakdown(pool, &b), GP_OK);
    cr_assert_eq(b.small.reserved_bytes + b.large.reserved_bytes, st.reserved_bytes,
                 "the statistics' walk sees every mapped range");
    free_and_trim_to_nothing(p, s);
}

/* A range of the tenant with nothing in use gives up no page when paused; when a later range's unmap
 * fails, the rollback must unpause it too (fuzz_api: crash-pause-rollback-left-empty-range-paused). */
Test(tenants, pause_failing_on_a_later_range_leaves_no_range_paused)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("m", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "m", s), GP_OK);
    void *small, *p;
    cr_assert_eq(gp_alloc(pool, &small, 4096, s), GP_OK); /* m's small range first, then emptied */
    cr_assert_eq(gp_alloc(pool, &p, 9 * MIB, s), GP_OK);
    cr_assert_eq(gp_free(pool, small, s), GP_OK);
    gp_sim_synchronize(sim);
    /* the pause trims the small range's free page first (unmap 1), then fails on the large one's first
     * unmap (2) */
    pause_m_rolls_back(2, GP_SIM_CALL_UNMAP, 0);
    free_and_trim_to_nothing(p, s);
}

/* A pause waits for the work that may use the tenant's memory, and for no other model's: its own
 * streams' queued kernels and those of a stream one of its blocks was recorded for (gp_record_stream),
 * not another tenant's long kernel, and it never synchronizes the device; its staging copies do not
 * wait for the other tenant either. An unmap or a copy under a kernel still queued would be a bad call
 * of the sim, so the pause succeeding with no bad call shows that it waited for what it had to. */
Test(tenants, pause_waits_for_its_own_streams_not_another_tenants_work)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("idle", 0, 0, 0);
    create("busy", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim), t = gp_sim_stream_create(sim), u = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "idle", s), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "busy", t), GP_OK);
    void *a, *b, *other;
    cr_assert_eq(gp_alloc(pool, &a, 9 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &b, 3 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &other, 8 * MIB, t), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_record_stream(pool, b, u), GP_OK, "%s", gp_last_error());
    uint64_t t0 = gp_sim_now(sim);
    cr_assert_eq(gp_sim_launch(sim, s, a, 9 * MIB, GP_SIM_WRITE, 21, 1000000), GP_OK); /* 1 ms */
    cr_assert_eq(gp_sim_launch(sim, u, b, 3 * MIB, GP_SIM_WRITE, 22, 2000000), GP_OK); /* 2 ms */
    cr_assert_eq(gp_sim_launch(sim, t, other, 8 * MIB, GP_SIM_WRITE, 23, 1000000000), GP_OK); /* 1 s */
    uint64_t syncs = gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC);
    gp_sim_report before;
    gp_sim_get_report(sim, &before);

    cr_assert_eq(gp_tenant_pause(pool, "idle", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    gp_sim_report during;
    gp_sim_get_report(sim, &during);
    cr_expect_eq(during.bad_calls, before.bad_calls, "no unmap or copy under a queued kernel: %s",
                 gp_sim_first_violation(sim));
    cr_expect_eq(gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC), syncs, "the pause synchronized the device");
    cr_expect_geq(gp_sim_now(sim) - t0, 2000000, "it waited for the recorded stream's kernel");
    cr_expect_lt(gp_sim_now(sim) - t0, 1000000000, "it waited for the other tenant's kernel");
    cr_expect_eq(tenant("idle").held_bytes, 0);
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_expect_eq(st.num_device_syncs, 0);
    cr_expect_geq(st.num_unmap_waits, 2, "one wait per stream drained (s and u)");

    cr_assert_eq(gp_tenant_resume(pool, "idle"), GP_OK, "%s", gp_last_error());
    cr_expect_lt(gp_sim_now(sim) - t0, 1000000000, "resuming waits for no one either");
    cr_assert_eq(gp_sim_launch(sim, s, a, 9 * MIB, GP_SIM_CHECK, 21, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, b, 3 * MIB, GP_SIM_CHECK, 22, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report after;
    gp_sim_get_report(sim, &after);
    cr_expect_eq(after.pattern_mismatches, 0, "the contents the kernels wrote came back: %s",
                 gp_sim_first_violation(sim));
    cr_expect_eq(after.bad_calls, before.bad_calls, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_free(pool, a, s), GP_OK);
    cr_assert_eq(gp_free(pool, b, s), GP_OK);
    cr_assert_eq(gp_free(pool, other, t), GP_OK);
}

/* Another model's allocation and free, made from another thread while a pause of "idle" is in its
 * wait or its staging copy (the sim's call hook), with the pause's locks held. */
static struct {
    gp_stream stream;       /* busy's stream, with a cached block of `size` */
    size_t size;
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    bool done, ok, tried, in_time;
    pthread_t thread;
} other_model = {.lock = PTHREAD_MUTEX_INITIALIZER, .done_cond = PTHREAD_COND_INITIALIZER};

static void *other_model_allocates(void *arg)
{
    (void)arg;
    void *q = NULL;
    bool ok = gp_alloc(pool, &q, other_model.size, other_model.stream) == GP_OK &&
              gp_free(pool, q, other_model.stream) == GP_OK;
    pthread_mutex_lock(&other_model.lock);
    other_model.done = true;
    other_model.ok = ok;
    pthread_cond_signal(&other_model.done_cond);
    pthread_mutex_unlock(&other_model.lock);
    return NULL;
}

/* The hook: once, starts the other model's thread and gives it 5 s to finish. A pause holding every
 * stream's lock would keep it waiting until the pause returns; the hook then gives up, the pause goes
 * on, and the test fails on `done` rather than hanging. */
static void during_pause(void *arg, unsigned kind)
{
    (void)arg;
    (void)kind;
    if (other_model.tried)
        return;
    other_model.tried = true;
    pthread_create(&other_model.thread, NULL, other_model_allocates, NULL);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&other_model.lock);
    while (!other_model.done && pthread_cond_timedwait(&other_model.done_cond, &other_model.lock, &until) != ETIMEDOUT)
        ;
    other_model.in_time = other_model.done; /* finished while the pause held its locks */
    pthread_mutex_unlock(&other_model.lock);
}

Test(tenants, other_models_allocate_and_free_while_a_pause_waits_and_copies)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("idle", 0, 0, 0);
    create("busy", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    other_model.stream = gp_sim_stream_create(sim);
    other_model.size = 3 * MIB;
    cr_assert_eq(gp_tenant_bind_stream(pool, "idle", s), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "busy", other_model.stream), GP_OK);
    void *a, *warm;
    cr_assert_eq(gp_alloc(pool, &a, 9 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 9 * MIB, GP_SIM_WRITE, 31, 1000000), GP_OK);
    cr_assert_eq(gp_alloc(pool, &warm, other_model.size, other_model.stream), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, warm, other_model.stream), GP_OK); /* cached: no growth, no pool lock */

    gp_sim_set_call_hook(sim, GP_SIM_CALL_EVENT_SYNC | GP_SIM_CALL_COPY, during_pause, NULL);
    cr_assert_eq(gp_tenant_pause(pool, "idle", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    gp_sim_set_call_hook(sim, 0, NULL, NULL);
    cr_assert(other_model.tried, "the pause made no wait and no copy");
    pthread_join(other_model.thread, NULL);
    cr_expect(other_model.in_time, "the other model's allocation waited for the pause to end");
    cr_expect(other_model.done && other_model.ok, "the other model's allocation or free failed");
    cr_assert_eq(gp_tenant_resume(pool, "idle"), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 9 * MIB, GP_SIM_CHECK, 31, 100), GP_OK);
    expect_sim_clean("the contents after pause and resume");
    cr_assert_eq(gp_free(pool, a, s), GP_OK);
}

/* A model of many small tensors, allocated one after another (its parameters), is staged in a few
 * copies, not one per tensor: neighbouring live blocks go in one copy. A tensor freed while paused
 * splits the run it was in on the way back, and only live bytes are copied back. */
Test(tenants, staging_copies_neighbouring_blocks_together)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("params", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "params", s), GP_OK);
    enum { N = 64 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        cr_assert_eq(gp_alloc(pool, &p[i], 48 * 1024, s), GP_OK, "%s", gp_last_error());
        cr_assert_eq(gp_sim_launch(sim, s, p[i], 48 * 1024, GP_SIM_WRITE, 100 + (uint64_t)i, 100), GP_OK);
    }
    size_t runs = 1;
    for (int i = 1; i < N; i++)
        runs += (char *)p[i] != (char *)p[i - 1] + 48 * 1024;
    uint64_t copies = gp_sim_calls(sim, GP_SIM_CALL_COPY);
    cr_assert_eq(gp_tenant_pause(pool, "params", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    uint64_t staged = gp_sim_calls(sim, GP_SIM_CALL_COPY) - copies;
    cr_expect_leq(staged, runs, "%llu copies for %d tensors in %zu runs of neighbours", (unsigned long long)staged,
                  N, runs);
    cr_expect_lt(staged, N / 4, "%llu copies for %d tensors", (unsigned long long)staged, N);
    cr_assert_eq(gp_free(pool, p[N / 2], s), GP_OK);
    p[N / 2] = NULL;
    copies = gp_sim_calls(sim, GP_SIM_CALL_COPY);
    cr_assert_eq(gp_tenant_resume(pool, "params"), GP_OK, "%s", gp_last_error());
    uint64_t restored = gp_sim_calls(sim, GP_SIM_CALL_COPY) - copies;
    cr_expect_leq(restored, staged + 1, "the freed tensor splits one run: %llu copies back", (unsigned long long)restored);
    for (int i = 0; i < N; i++)
        if (p[i] != NULL)
            cr_assert_eq(gp_sim_launch(sim, s, p[i], 48 * 1024, GP_SIM_CHECK, 100 + (uint64_t)i, 100), GP_OK);
    expect_sim_clean("the tensors after pause and resume");
    for (int i = 0; i < N; i++)
        if (p[i] != NULL)
            cr_assert_eq(gp_free(pool, p[i], s), GP_OK);
}

/* A stream of the tenant that the application had the pool forget and then destroyed: pausing,
 * resuming, trimming and destroying the pool never name its dead handle (the sim's use-after-destroy
 * check is a bad call), as gp_stream_forget promises; a stream forgotten and then used again with the
 * pool is waited for again. */
Test(tenants, a_forgotten_and_destroyed_stream_is_never_named_again)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("m", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim), gone = gp_sim_stream_create(sim), back = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "m", s), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "m", gone), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "m", back), GP_OK);
    void *a, *t, *u;
    cr_assert_eq(gp_alloc(pool, &a, 9 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 9 * MIB, GP_SIM_WRITE, 41, 1000), GP_OK);
    cr_assert_eq(gp_alloc(pool, &t, 5 * MIB, gone), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, gone, t, 5 * MIB, GP_SIM_WRITE, 42, 1000), GP_OK);
    cr_assert_eq(gp_free(pool, t, gone), GP_OK);
    cr_assert_eq(gp_alloc(pool, &u, 3 * MIB, back), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, u, back), GP_OK);
    cr_assert_eq(gp_stream_forget(pool, gone), GP_OK, "%s", gp_last_error());
    gp_sim_stream_destroy(sim, gone);
    cr_assert_eq(gp_stream_forget(pool, back), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &u, 3 * MIB, back), GP_OK, "used again: %s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, back, u, 3 * MIB, GP_SIM_WRITE, 43, 5000000), GP_OK); /* 5 ms */
    uint64_t t0 = gp_sim_now(sim);

    cr_assert_eq(gp_tenant_pause(pool, "m", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    cr_expect_geq(gp_sim_now(sim) - t0, 5000000, "the stream used again after forget was waited for");
    cr_assert_eq(gp_tenant_resume(pool, "m"), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_trim(pool, 0, NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 9 * MIB, GP_SIM_CHECK, 41, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, back, u, 3 * MIB, GP_SIM_CHECK, 43, 100), GP_OK);
    expect_sim_clean("pause, resume and trim after a forgotten stream");
    cr_assert_eq(gp_free(pool, a, s), GP_OK);
    cr_assert_eq(gp_free(pool, u, back), GP_OK);
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());
    pool = NULL;
    expect_sim_clean("destroy after a forgotten stream");
}

/* The wait before a pause's unmaps fails: nothing was unmapped, the pause is rolled back. */
Test(tenants, pause_whose_wait_fails_rolls_back)
{
    void *p;
    gp_stream s = tenant_m_with_a_block(&p);
    pause_m_rolls_back(1, GP_SIM_CALL_EVENT_SYNC, GP_PAUSE_KEEP_CONTENTS);
    cr_assert_eq(gp_sim_launch(sim, s, p, 9 * MIB, GP_SIM_CHECK, 7, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_tenant_pause(pool, "m", 0), GP_OK, "it pauses once the device answers: %s", gp_last_error());
    cr_assert_eq(gp_tenant_resume(pool, "m"), GP_OK, "%s", gp_last_error());
    free_and_trim_to_nothing(p, s);
}

/* ---- issue 9: pause/resume regressions -------------------------------------------------------- */

/* Finding 1: a block freed while its tenant is paused must not shift where the other blocks' contents
 * come back from (the staging is keyed by block, not by position among the live blocks). */
Test(tenants, free_while_paused_keeps_other_blocks_contents)
{
    open_pool("sim-vmm", "device_memory:1GiB");
    create("t", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "t", s), GP_OK);
    void *a, *b, *c;
    cr_assert_eq(gp_alloc(pool, &a, 64 * 1024, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &b, 4 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &c, 3 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 64 * 1024, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, b, 4 * MIB, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, c, 3 * MIB, GP_SIM_WRITE, 3, 100), GP_OK);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_tenant_pause(pool, "t", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, a, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, b, 4 * MIB, GP_SIM_CHECK, 2, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, c, 3 * MIB, GP_SIM_CHECK, 3, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.pattern_mismatches, 0, "B and C came back from the wrong offsets: %s",
                 gp_sim_first_violation(sim));
    /* pause again and free the middle one, then the last: every later block still comes back whole */
    cr_assert_eq(gp_tenant_pause(pool, "t", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, b, s), GP_OK);
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, c, 3 * MIB, GP_SIM_CHECK, 3, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.pattern_mismatches, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_free(pool, c, s), GP_OK);
}

/* Finding 3: a pause without GP_PAUSE_KEEP_CONTENTS that fails part-way is rolled back with the
 * tenant's own pages (the same physical memory), so its contents survive the failed pause. */
Test(tenants, failed_pause_without_staging_keeps_contents)
{
    for (uint64_t k = 1; k <= 5; k++) {
        open_pool("sim-vmm", "device_memory:1GiB");
        create("m", 0, 0, 0);
        gp_stream s = gp_sim_stream_create(sim);
        cr_assert_eq(gp_tenant_bind_stream(pool, "m", s), GP_OK);
        void *p;
        cr_assert_eq(gp_alloc(pool, &p, 9 * MIB, s), GP_OK);
        cr_assert_eq(gp_sim_launch(sim, s, p, 9 * MIB, GP_SIM_WRITE, 7, 100), GP_OK);
        gp_sim_synchronize(sim);
        gp_sim_fail_call(sim, k, GP_SIM_CALL_UNMAP, GP_ERR_DEVICE);
        cr_assert_eq(gp_tenant_pause(pool, "m", 0), GP_ERR_DEVICE, "unmap fault %llu", (unsigned long long)k);
        cr_assert(strstr(gp_last_error(), "rolled back") != NULL, "%s", gp_last_error());
        cr_assert(!tenant("m").paused);
        cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
        cr_assert_eq(gp_sim_launch(sim, s, p, 9 * MIB, GP_SIM_CHECK, 7, 100), GP_OK);
        gp_sim_synchronize(sim);
        gp_sim_report r;
        gp_sim_get_report(sim, &r);
        cr_assert_eq(r.pattern_mismatches, 0, "unmap fault %llu: the rollback lost the contents: %s",
                     (unsigned long long)k, gp_sim_first_violation(sim));
        cr_assert_eq(gp_free(pool, p, s), GP_OK);
        teardown();
    }
}

/* Finding 5: resume gives cached memory back when the device is full, and a trim after a pause gives
 * back every cached byte (cached = reserved + paused - allocated). */
Test(tenants, resume_releases_cache_and_trim_after_pause_releases_all)
{
    open_pool("sim-vmm", "device_memory:64MiB");
    create("idle", 0, 0, 0);
    create("busy", 0, 0, 0);
    gp_stream s = gp_sim_stream_create(sim), t = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "idle", s), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(pool, "busy", t), GP_OK);
    void *a, *keep;
    cr_assert_eq(gp_alloc(pool, &a, 30 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 30 * MIB, GP_SIM_WRITE, 4, 100), GP_OK);
    cr_assert_eq(gp_alloc(pool, &keep, 6 * MIB, t), GP_OK, "%s", gp_last_error());
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_tenant_pause(pool, "idle", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    /* busy fills the device, then frees: 30 MiB sit in busy's cache */
    void *b;
    cr_assert_eq(gp_alloc(pool, &b, 50 * MIB, t), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, b, t), GP_OK);
    cr_assert_eq(gp_tenant_resume(pool, "idle"), GP_OK, "resume must release cache first: %s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 30 * MIB, GP_SIM_CHECK, 4, 100), GP_OK);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    /* paused with blocks, trim(0) leaves nothing cached */
    cr_assert_eq(gp_tenant_pause(pool, "idle", 0), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &b, 20 * MIB, t), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, b, t), GP_OK);
    cr_assert_eq(gp_trim(pool, 0, NULL), GP_OK, "%s", gp_last_error());
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(st.cached_bytes, 0, "trim(0) left %llu bytes cached while a tenant is paused",
                 (unsigned long long)st.cached_bytes);
    cr_assert_eq(st.reserved_bytes, 6 * MIB);
    cr_assert_eq(gp_tenant_resume(pool, "idle"), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(pool, a, s), GP_OK);
    cr_assert_eq(gp_free(pool, keep, t), GP_OK);
}

/* Finding 4: a tenant frame left on the thread by a destroyed pool must not apply to a later pool,
 * even one whose state malloc placed at the old pool's address (tried several times so that the plain
 * build reuses the address; ASan's quarantine would not). */
Test(tenants, frame_of_a_destroyed_pool_does_not_apply_to_a_new_one)
{
    for (int i = 0; i < 8; i++) {
        open_pool("sim", "device_memory:256MiB");
        create("gone", 0, 0, 0);
        create("gone2", 0, 0, 0);
        cr_assert_eq(gp_tenant_push(pool, "gone2"), GP_OK);
        gp_pool_destroy(pool, NULL); /* no pop */
        gp_sim_release(sim);
        open_pool("sim", "device_memory:256MiB");
        void *p;
        cr_assert_eq(gp_alloc(pool, &p, 1 * MIB, NULL), GP_OK, "%s", gp_last_error());
        cr_assert_eq(tenant("default").allocated_bytes, 1 * MIB, "charged to the new pool's default tenant");
        cr_assert_eq(gp_tenant_pop(pool), GP_ERR_INVALID, "the new pool has no frame on this thread");
        cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
        teardown();
    }
    /* frames of destroyed pools do not use up the nesting depth of the destroying thread */
    for (int i = 0; i < 40; i++) {
        open_pool("sim", "device_memory:256MiB");
        create("x", 0, 0, 0);
        cr_assert_eq(gp_tenant_push(pool, "x"), GP_OK, "push %d: %s", i, gp_last_error());
        teardown();
    }
}

/* Finding 9: tenant names are JSON-escaped in gp_stats_json (quotes, backslashes, control bytes, and
 * bytes that are not UTF-8 become U+FFFD), so the output always parses. */
Test(tenants, stats_json_escapes_tenant_names)
{
    open_pool("sim", "device_memory:256MiB");
    create("q\"uote", 0, 0, 0);
    create("back\\slash", 0, 0, 0);
    create("tab\there\x01", 0, 0, 0);
    create("bad\xff utf8 caf\xc3\xa9", 0, 0, 0);
    char json[16384];
    cr_assert_eq(gp_stats_json(pool, json, sizeof json, NULL), GP_OK, "%s", gp_last_error());
    cr_assert(strstr(json, "\"name\":\"q\\\"uote\"") != NULL, "%s", json);
    cr_assert(strstr(json, "\"name\":\"back\\\\slash\"") != NULL, "%s", json);
    cr_assert(strstr(json, "\"name\":\"tab\\there\\u0001\"") != NULL, "%s", json);
    cr_assert(strstr(json, "\"name\":\"bad\\ufffd utf8 caf\xc3\xa9\"") != NULL, "%s", json);
    for (const char *c = json; *c; c++)
        cr_assert((unsigned char)*c >= 0x20, "a raw control byte in the JSON at %zu", (size_t)(c - json));
}

/* Finding 10: min guarantees are checked against the device: a min above it, or mins adding up past
 * it, are refused (they wrapped the admission's sums and guaranteed nothing, or refused everyone). */
Test(tenants, min_guarantees_cannot_wrap_or_exceed_the_device)
{
    open_pool("sim", "device_memory:256MiB");
    gp_tenant_limits huge = {.min = SIZE_MAX};
    cr_assert_eq(gp_tenant_create(pool, "huge", &huge), GP_ERR_INVALID, "min SIZE_MAX was accepted");
    cr_assert(strstr(gp_last_error(), "min") != NULL, "%s", gp_last_error());
    gp_tenant_limits half = {.min = (size_t)1 << 63};
    cr_assert_eq(gp_tenant_create(pool, "h1", &half), GP_ERR_INVALID, "min 2^63 on a 256 MiB device");
    gp_tenant_limits over = {.min = 300 * MIB};
    cr_assert_eq(gp_tenant_create(pool, "over", &over), GP_ERR_INVALID);
    create("a", 0, 0, 200 * MIB);
    gp_tenant_limits b = {.min = 100 * MIB};
    cr_assert_eq(gp_tenant_create(pool, "b", &b), GP_ERR_INVALID, "200 + 100 MiB of mins on 256 MiB");
    cr_assert(strstr(gp_last_error(), "256.0 MiB") != NULL, "names the device: %s", gp_last_error());
    create("c", 0, 0, 0);
    cr_assert_eq(gp_tenant_set_limits(pool, "c", &b), GP_ERR_INVALID, "set_limits checks the sum too");
    gp_tenant_limits fits = {.min = 56 * MIB};
    cr_assert_eq(gp_tenant_set_limits(pool, "c", &fits), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_tenant_set_limits(pool, "a", &(gp_tenant_limits){.min = 200 * MIB}), GP_OK,
                 "a tenant's own old min does not count against its new one: %s", gp_last_error());
    cr_assert_eq(tenant("c").min, 56 * MIB);
    /* the guarantee holds: the default tenant may take what no min is owed */
    void *p = NULL, *q = NULL;
    cr_assert_eq(gp_alloc(pool, &p, 10 * MIB, NULL), GP_ERR_OOM, "all 256 MiB are owed to a and c");
    cr_assert_eq(gp_tenant_set_limits(pool, "c", &(gp_tenant_limits){.min = 0}), GP_OK);
    cr_assert_eq(gp_alloc(pool, &p, 40 * MIB, NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &q, 30 * MIB, NULL), GP_ERR_OOM, "would eat into a's 200 MiB");
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
}

/* Finding 11: calls that fail do not use up max_streams: with max_streams:2, two refused calls on two
 * new streams leave room for real allocations on two more. */
static void two_failures_then_two_streams(const char *backend, int why)
{
    open_pool(backend, "device_memory:256MiB,max_streams:2");
    gp_stream s[4];
    for (int i = 0; i < 4; i++)
        s[i] = gp_sim_stream_create(sim);
    void *hold = NULL, *p = NULL;
    create("t", why == 1 ? 1 * MIB : 0, 0, 0);
    if (why == 2)
        cr_assert_eq(gp_tenant_pause(pool, "t", 0), GP_OK, "%s", gp_last_error());
    for (int i = 0; i < 2; i++) {
        int rc;
        if (why == 0) {
            rc = gp_record_stream(pool, (void *)(uintptr_t)0x1234000, s[i]);
            cr_assert_eq(rc, GP_ERR_NOT_OWNED, "%s", gp_last_error());
        } else if (why == 3) {
            rc = gp_alloc(pool, &p, 300 * MIB, s[i]);
            cr_assert_eq(rc, GP_ERR_INVALID);
            cr_assert_eq(gp_tenant_push(pool, "t"), GP_OK);
            rc = gp_alloc(pool, &p, 200 * MIB, s[i]);
            cr_assert_eq(gp_tenant_pop(pool), GP_OK);
            if (rc == GP_OK) { /* the first fits the empty device: hold it so the next cannot */
                hold = p;
                continue;
            }
            cr_assert_eq(rc, GP_ERR_OOM, "%s", gp_last_error());
        } else {
            cr_assert_eq(gp_tenant_push(pool, "t"), GP_OK);
            rc = gp_alloc(pool, &p, 4 * MIB, s[i]);
            cr_assert_eq(gp_tenant_pop(pool), GP_OK);
            cr_assert_eq(rc, why == 1 ? GP_ERR_QUOTA : GP_ERR_PAUSED, "%s", gp_last_error());
        }
    }
    void *a, *b;
    int used = hold != NULL ? 1 : 0; /* the held block's pair counts */
    cr_assert_eq(gp_alloc(pool, &a, 1 * MIB, s[2]), GP_OK, "%s %d: failed calls used up max_streams: %s", backend, why,
                 gp_last_error());
    if (used == 0)
        cr_assert_eq(gp_alloc(pool, &b, 1 * MIB, s[3]), GP_OK, "%s", gp_last_error());
    else
        cr_assert_eq(gp_alloc(pool, &b, 1 * MIB, s[3]), GP_ERR_INVALID, "a third pair is one too many");
    cr_assert(used == 1 || strstr(gp_last_error(), "max_streams") == NULL);
    cr_assert_eq(gp_free(pool, a, s[2]), GP_OK);
    if (used == 0)
        cr_assert_eq(gp_free(pool, b, s[3]), GP_OK);
    if (hold != NULL)
        cr_assert_eq(gp_free(pool, hold, s[0]), GP_OK);
    if (why == 2)
        cr_assert_eq(gp_tenant_resume(pool, "t"), GP_OK, "%s", gp_last_error());
}

Test(tenants, failed_record_stream_does_not_use_up_max_streams)
{
    two_failures_then_two_streams("sim", 0);
}

Test(tenants, refused_allocations_do_not_use_up_max_streams)
{
    two_failures_then_two_streams("sim", 1);
    teardown();
    two_failures_then_two_streams("sim-vmm", 1);
    teardown();
    two_failures_then_two_streams("sim-vmm", 2);
    teardown();
    two_failures_then_two_streams("sim", 3);
    teardown();
    two_failures_then_two_streams("sim-vmm", 3);
}

/* ---- a failed resume changes nothing ------------------------------------------------------------ */

static gp_stats pool_stats(void)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK, "%s", gp_last_error());
    return s;
}

/* What a failed call may not change (cached and reserved bytes may move: a resume at device OOM turns
 * other tenants' cache into pooled pages first). */
static void assert_unchanged(const gp_stats *a, const gp_tenant_stats *ta, const char *name, const char *when)
{
    gp_stats b = pool_stats();
    gp_tenant_stats tb = tenant(name);
    cr_assert_eq(b.paused_bytes, a->paused_bytes, "%s: paused bytes %llu -> %llu (%s)", when,
                 (unsigned long long)a->paused_bytes, (unsigned long long)b.paused_bytes, gp_last_error());
    cr_assert_eq(b.allocated_bytes, a->allocated_bytes, "%s", when);
    cr_assert_eq(b.active_blocks, a->active_blocks, "%s", when);
    cr_assert_eq(b.num_allocs, a->num_allocs, "%s", when);
    cr_assert_eq(b.num_frees, a->num_frees, "%s", when);
    cr_assert_eq(tb.held_bytes, ta->held_bytes, "%s: '%s' holds %llu -> %llu bytes", when, name,
                 (unsigned long long)ta->held_bytes, (unsigned long long)tb.held_bytes);
    cr_assert_eq(tb.allocated_bytes, ta->allocated_bytes, "%s", when);
    cr_assert(tb.paused, "%s: a failed resume leaves the tenant paused", when);
    cr_assert_eq(gp_check(pool), GP_OK, "%s: %s", when, gp_last_error());
}

/*
 * The layout of the API fuzzer's input crash-resume-undo-fault-left-pages-mapped: tenant t has a small
 * range (a 1 MiB block, freed while paused) and a large one (a 6 MiB block with contents), the default
 * tenant holds 20 of the device's 24 MiB. Resume maps the small range's page and one of the large
 * range's, then the device is full. The small range was whole again and counted as resumed, so the
 * step that turns free pages into memory for the tenant took its free page (the block freed while
 * paused) and mapped it into the large range; the undo then unmapped what it found mapped, and the
 * page under the freed block was gone from the paused tenant: paused bytes 8 -> 6 MiB, and no error
 * said that the undo had failed.
 */
static void *fill_device_and_pause(gp_stream *stream, void **b, void **hold, bool free_small)
{
    open_pool("sim-vmm", "device_memory:24MiB,small_size:1MiB,small_segment:2MiB,large_segment:6MiB,huge_size:4MiB");
    create("t", 0, 0, 0);
    gp_stream s = *stream = gp_sim_stream_create(sim);
    cr_assert_eq(gp_tenant_bind_stream(pool, "t", s), GP_OK);
    void *a;
    cr_assert_eq(gp_alloc(pool, &a, 1 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, b, 6 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, a, 1 * MIB, GP_SIM_WRITE, 11, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, *b, 6 * MIB, GP_SIM_WRITE, 12, 100), GP_OK);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_tenant_pause(pool, "t", GP_PAUSE_KEEP_CONTENTS), GP_OK, "%s", gp_last_error());
    cr_assert_eq(pool_stats().paused_bytes, 8 * MIB);
    if (free_small) {
        cr_assert_eq(gp_free(pool, a, s), GP_OK, "%s", gp_last_error());
        a = NULL;
    }
    cr_assert_eq(gp_alloc(pool, hold, 20 * MIB, NULL), GP_OK, "%s", gp_last_error());
    return a;
}

static void resume_and_check_contents(gp_stream s, void *a, void *b, void *hold)
{
    cr_assert_eq(gp_free(pool, hold, NULL), GP_OK);
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_OK, "once memory is free: %s", gp_last_error());
    cr_assert_eq(pool_stats().paused_bytes, 0);
    if (a != NULL)
        cr_assert_eq(gp_sim_launch(sim, s, a, 1 * MIB, GP_SIM_CHECK, 11, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, s, b, 6 * MIB, GP_SIM_CHECK, 12, 100), GP_OK);
    gp_sim_synchronize(sim);
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    cr_assert_eq(r.pattern_mismatches, 0, "the failed resumes lost contents: %s", gp_sim_first_violation(sim));
    if (a != NULL)
        cr_assert_eq(gp_free(pool, a, s), GP_OK);
    cr_assert_eq(gp_free(pool, b, s), GP_OK);
}

Test(tenants, failed_resume_at_device_full_restores_the_paused_state)
{
    gp_stream s;
    void *b, *hold;
    fill_device_and_pause(&s, &b, &hold, true);
    gp_stats before = pool_stats();
    gp_tenant_stats tbefore = tenant("t");
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_ERR_OOM, "4 MiB free for 6 MiB of live pages");
    cr_assert(strstr(gp_last_error(), "undoing it failed too") == NULL, "no second fault: %s", gp_last_error());
    assert_unchanged(&before, &tbefore, "t", "a resume that failed at device OOM");
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_ERR_OOM, "the device is still full");
    assert_unchanged(&before, &tbefore, "t", "the same resume again");
    resume_and_check_contents(s, NULL, b, hold);
}

/* A resume whose undo met a second fault says so and leaves the pages it could not unmap mapped (the
 * paused tenant's, accounted). A later resume that fails too unmaps exactly the pages it mapped
 * itself, not those: it changes nothing either. */
Test(tenants, failed_resume_after_a_failed_undo_changes_nothing)
{
    gp_stream s;
    void *a, *b, *hold;
    a = fill_device_and_pause(&s, &b, &hold, false);
    gp_stats before = pool_stats();
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_UNMAP, GP_ERR_DEVICE); /* the undo's first unmap */
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_ERR_OOM, "4 MiB free for 8 MiB of live pages");
    cr_assert_eq(gp_sim_faults_injected(sim), 1, "the undo met the fault");
    cr_assert(strstr(gp_last_error(), "undoing it failed too (sim: injected fault in unmap") != NULL,
              "names the second fault: %s", gp_last_error());
    cr_assert(strncmp(gp_last_error(), "sim: out of device memory", 25) == 0, "and the first: %s", gp_last_error());
    cr_assert(tenant("t").paused);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    gp_stats mid = pool_stats();
    cr_assert_lt(mid.paused_bytes, before.paused_bytes, "pages stayed mapped");
    cr_assert_eq(mid.allocated_bytes, before.allocated_bytes);
    gp_tenant_stats tmid = tenant("t");
    cr_assert_eq(gp_tenant_resume(pool, "t"), GP_ERR_OOM, "the device is still full");
    cr_assert(strstr(gp_last_error(), "undoing it failed too") == NULL, "no second fault: %s", gp_last_error());
    assert_unchanged(&mid, &tmid, "t", "a failed resume after a failed undo");
    resume_and_check_contents(s, a, b, hold);
}
