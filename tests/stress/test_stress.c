/*
 * test_stress.c — randomized multi-thread, multi-stream stress of the pool on the simulated GPU.
 *
 * Not a benchmark (see mimalloc's test-stress.c, which this follows): each thread owns a few simulated
 * streams and, for a fixed number of steps chosen from a seeded generator, allocates blocks of random
 * sizes (log-uniform, mostly 1 B..1 MiB, a quarter 1..32 MiB) and launches a WRITE kernel of a pattern
 * derived from the block's own seed; frees random blocks after a CHECK kernel of that pattern on the
 * stream of the free; records blocks on other streams (a READ there) and frees them on either; frees
 * blocks on a stream other than their own; passes blocks to other threads through a shared list;
 * advances virtual time; trims. The device is small (512 MiB) so that device OOM, the release and
 * retry paths, and steals between streams all happen. GP_ERR_OOM from gp_alloc is counted, anything
 * else fails the run.
 *
 * Ordering is the test's job where the API says so: before a block is used on a second stream (a
 * record_stream, a free on another stream), the test synchronises the block's stream, so that its
 * WRITE has completed. Everything else is the pool's job, and the sim checks it: a block handed out
 * while another stream's kernel still uses it is a race; a block handed out twice is a pattern
 * mismatch at its CHECK.
 *
 * Between rounds (threads joined) and at the end: gp_check, the sim's ledger (no race, no mismatch, no
 * bad call; device memory == the pool's reserved bytes), and the pool's live accounting against the
 * test's own list of live blocks. At the end everything is freed, destroy reports no live block and
 * the ledger no leaked byte or event.
 *
 * The runs are deterministic per thread (fixed seeds), not across threads: interleavings vary.
 * GPUPOOL_STRESS_STEPS=n sets the steps of one run, shared among its threads (default 2000, or 400 in
 * sanitizer builds: kernels cost host time in proportion to their bytes).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GP_SANITIZED 1
#endif
#endif
#ifndef GP_SANITIZED
#define GP_SANITIZED 0
#endif

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define MAX_THREADS 4
#define MAX_STREAMS 4 /* per thread */
#define LIVE_TOTAL 192 /* live blocks across all threads at most */
#define HANDOFF_MAX 32
#define ROUNDS 4
#define CONFIG "device_memory:512MiB"

/* ---- random numbers ---------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t below(uint64_t *state, uint64_t n)
{
    return n == 0 ? 0 : splitmix64(state) % n;
}

/* Log-uniform by powers of two: 3 in 4 requests in [1 B, 1 MiB), 1 in 4 in [1 MiB, 32 MiB). */
static size_t random_size(uint64_t *rng)
{
    unsigned k = below(rng, 4) != 0 ? (unsigned)below(rng, 20) : 20 + (unsigned)below(rng, 5);
    size_t base = (size_t)1 << k;
    return base + (size_t)below(rng, base);
}

/* ---- shared state ------------------------------------------------------------------------------ */

typedef struct live_block {
    void *p;
    size_t size;
    gp_stream stream;   /* allocated on */
    gp_stream recorded; /* record_stream'd on (NULL: none) */
    uint64_t seed;      /* of its WRITE */
} live_block;

typedef struct counters {
    uint64_t allocs, ooms, frees, cross_frees, records, handoffs, received, advances, trims, syncs, checks;
} counters;

struct shared;

typedef struct worker {
    struct shared *sh;
    unsigned index;
    uint64_t rng;
    gp_stream own[MAX_STREAMS];
    unsigned nown;
    live_block live[LIVE_TOTAL];
    unsigned nlive, max_live;
    uint64_t next_seed;
    unsigned steps; /* this round */
    counters n;
    bool failed;
    char error[512];
} worker;

typedef struct shared {
    gp_pool *pool;
    gp_sim *sim;
    unsigned threads, streams_per_thread;
    gp_stream all[MAX_THREADS * MAX_STREAMS];
    unsigned nall;
    pthread_mutex_t lock; /* the hand-off list */
    live_block handoff[HANDOFF_MAX];
    unsigned nhandoff;
    worker workers[MAX_THREADS];
} shared;

/* Records the first failure of a worker (Criterion's asserts belong to the main thread). */
static bool fail(worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(worker *w, const char *fmt, ...)
{
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        int used = snprintf(w->error, sizeof w->error, "thread %u: ", w->index);
        vsnprintf(w->error + used, sizeof w->error - (size_t)used, fmt, ap);
        va_end(ap);
        w->failed = true;
    }
    return false;
}

static uint64_t duration(worker *w)
{
    return below(&w->rng, 5001);
}

/* Uses on a second stream run longer, so that their blocks stay busy across many later steps. */
static uint64_t long_duration(worker *w)
{
    return below(&w->rng, 50001);
}

/* A stream other than `not`: one of the worker's own, or, when it has only one, any stream. */
static gp_stream other_stream(worker *w, gp_stream not)
{
    const gp_stream *set = w->nown > 1 ? w->own : w->sh->all;
    unsigned n = w->nown > 1 ? w->nown : w->sh->nall;
    for (unsigned tries = 0; tries < 8; tries++) {
        gp_stream s = set[below(&w->rng, n)];
        if (s != not)
            return s;
    }
    return NULL;
}

static bool launch(worker *w, gp_stream s, const live_block *b, int op, uint64_t ns)
{
    int rc = gp_sim_launch(w->sh->sim, s, b->p, b->size, op, op == GP_SIM_READ ? 0 : b->seed, ns);
    if (rc != GP_OK)
        return fail(w, "gp_sim_launch(%p, %p, %zu): %s", s, b->p, b->size, gp_last_error());
    return true;
}

static void remove_live(worker *w, unsigned i)
{
    w->live[i] = w->live[--w->nlive];
}

/* ---- the actions ------------------------------------------------------------------------------- */

static bool do_free(worker *w, unsigned i)
{
    live_block b = w->live[i];
    gp_stream at = b.stream;
    unsigned pick = (unsigned)below(&w->rng, 4);
    if (b.recorded != NULL && pick < 2) {
        at = b.recorded; /* ordered after the block's WRITE when it was recorded */
    } else if (pick == 0) {
        gp_stream other = other_stream(w, b.stream);
        if (other != NULL) {
            gp_sim_stream_synchronize(w->sh->sim, b.stream); /* its WRITE completes before `other` uses it */
            at = other;
        }
    }
    if (!launch(w, at, &b, GP_SIM_CHECK, at == b.stream ? duration(w) : long_duration(w)))
        return false;
    int rc = gp_free(w->sh->pool, b.p, at);
    if (rc != GP_OK)
        return fail(w, "gp_free(%p, %p): %d %s", b.p, at, rc, gp_last_error());
    remove_live(w, i);
    w->n.frees++;
    if (at != b.stream)
        w->n.cross_frees++;
    return true;
}

static bool do_alloc(worker *w)
{
    if (w->nlive >= w->max_live)
        return do_free(w, (unsigned)below(&w->rng, w->nlive));
    size_t size = random_size(&w->rng);
    gp_stream s = w->own[below(&w->rng, w->nown)];
    void *p = NULL;
    int rc = gp_alloc(w->sh->pool, &p, size, s);
    if (rc == GP_ERR_OOM) {
        w->n.ooms++;
        if (p != NULL)
            return fail(w, "gp_alloc failed with GP_ERR_OOM but set *out to %p", p);
        if (gp_last_error()[0] == '\0')
            return fail(w, "GP_ERR_OOM without a message");
        /* make room: free a couple of this thread's blocks */
        for (int k = 0; k < 2 && w->nlive > 0; k++)
            if (!do_free(w, (unsigned)below(&w->rng, w->nlive)))
                return false;
        return true;
    }
    if (rc != GP_OK)
        return fail(w, "gp_alloc(%zu, %p): %d %s", size, s, rc, gp_last_error());
    if (p == NULL || (uintptr_t)p % 512 != 0)
        return fail(w, "gp_alloc(%zu) returned %p", size, p);
    live_block b = {.p = p, .size = size, .stream = s, .recorded = NULL,
                    .seed = ((uint64_t)w->index << 48) ^ (w->next_seed++ * 0x9e3779b97f4a7c15ull)};
    if (!launch(w, s, &b, GP_SIM_WRITE, duration(w)))
        return false;
    w->live[w->nlive++] = b;
    w->n.allocs++;
    return true;
}

static bool do_record(worker *w)
{
    if (w->nlive == 0)
        return true;
    live_block *b = &w->live[below(&w->rng, w->nlive)];
    if (b->recorded != NULL)
        return true;
    gp_stream other = other_stream(w, b->stream);
    if (other == NULL)
        return true;
    gp_sim_stream_synchronize(w->sh->sim, b->stream); /* the test orders `other` after the WRITE */
    int rc = gp_record_stream(w->sh->pool, b->p, other);
    if (rc != GP_OK)
        return fail(w, "gp_record_stream(%p, %p): %d %s", b->p, other, rc, gp_last_error());
    b->recorded = other;
    w->n.records++;
    return launch(w, other, b, GP_SIM_READ, long_duration(w));
}

/* Passes one of this thread's blocks to whichever thread takes it next. */
static bool do_handoff(worker *w)
{
    if (w->nlive == 0 || w->sh->threads == 1)
        return true;
    unsigned i = (unsigned)below(&w->rng, w->nlive);
    bool sent = false;
    pthread_mutex_lock(&w->sh->lock);
    if (w->sh->nhandoff < HANDOFF_MAX) {
        w->sh->handoff[w->sh->nhandoff++] = w->live[i];
        sent = true;
    }
    pthread_mutex_unlock(&w->sh->lock);
    if (sent) {
        remove_live(w, i);
        w->n.handoffs++;
    }
    return true;
}

/* Takes a block another thread passed on. It keeps its stream: later frees happen there, or on another
 * stream after synchronising that one (do_free). */
static bool do_receive(worker *w)
{
    if (w->nlive >= w->max_live)
        return true;
    live_block b;
    bool got = false;
    pthread_mutex_lock(&w->sh->lock);
    if (w->sh->nhandoff > 0) {
        unsigned i = (unsigned)below(&w->rng, w->sh->nhandoff);
        b = w->sh->handoff[i];
        w->sh->handoff[i] = w->sh->handoff[--w->sh->nhandoff];
        got = true;
    }
    pthread_mutex_unlock(&w->sh->lock);
    if (got) {
        w->live[w->nlive++] = b;
        w->n.received++;
    }
    return true;
}

static bool step(worker *w)
{
    if (w->sh->threads > 1 && below(&w->rng, 8) == 0 && !do_receive(w))
        return false;
    unsigned r = (unsigned)below(&w->rng, 100);
    if (w->nlive == 0 || r < 40)
        return do_alloc(w);
    if (r < 66)
        return do_free(w, (unsigned)below(&w->rng, w->nlive));
    if (r < 74)
        return do_record(w);
    if (r < 78)
        return do_handoff(w);
    if (r < 90) {
        gp_sim_advance(w->sh->sim, below(&w->rng, 50000));
        w->n.advances++;
        return true;
    }
    if (r < 92) {
        size_t released = 0;
        int rc = gp_trim(w->sh->pool, (size_t)below(&w->rng, 256 * MIB), &released);
        if (rc != GP_OK)
            return fail(w, "gp_trim: %d %s", rc, gp_last_error());
        w->n.trims++;
        return true;
    }
    if (r < 95) {
        gp_sim_stream_synchronize(w->sh->sim, w->own[below(&w->rng, w->nown)]);
        w->n.syncs++;
        return true;
    }
    if (r < 96) {
        int rc = gp_check(w->sh->pool); /* takes every lock: safe while other threads run */
        if (rc != GP_OK)
            return fail(w, "gp_check while running: %s", gp_last_error());
        w->n.checks++;
        return true;
    }
    return do_alloc(w);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    for (unsigned i = 0; i < w->steps && !w->failed; i++)
        if (!step(w))
            break;
    return NULL;
}

/* ---- the driver -------------------------------------------------------------------------------- */

static unsigned steps_per_run(void)
{
    const char *env = getenv("GPUPOOL_STRESS_STEPS");
    if (env != NULL && atoi(env) > 0)
        return (unsigned)atoi(env);
    return GP_SANITIZED ? 400 : 2000;
}

static gp_stats stats_of(gp_pool *pool)
{
    gp_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    s.version = GP_STATS_VERSION;
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK, "gp_get_stats: %s", gp_last_error());
    return s;
}

static void assert_ledger_clean(gp_sim *sim, const char *when)
{
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_eq(rep.races, 0, "%s: %llu races; first violation: %s", when, (unsigned long long)rep.races,
                 gp_sim_first_violation(sim));
    cr_assert_eq(rep.pattern_mismatches, 0, "%s: %llu pattern mismatches; first violation: %s", when,
                 (unsigned long long)rep.pattern_mismatches, gp_sim_first_violation(sim));
    cr_assert_eq(rep.bad_calls, 0, "%s: %llu bad device calls; first violation: %s", when,
                 (unsigned long long)rep.bad_calls, gp_sim_first_violation(sim));
}

/* Single-threaded, between rounds: the pool, the sim and the test agree. */
static void check_quiescent(shared *sh, unsigned round)
{
    char when[64];
    snprintf(when, sizeof when, "after round %u", round);
    cr_assert_eq(gp_check(sh->pool), GP_OK, "%s: gp_check: %s", when, gp_last_error());
    assert_ledger_clean(sh->sim, when);
    uint64_t blocks = sh->nhandoff, requested = 0;
    for (unsigned i = 0; i < sh->nhandoff; i++)
        requested += sh->handoff[i].size;
    for (unsigned t = 0; t < sh->threads; t++) {
        blocks += sh->workers[t].nlive;
        for (unsigned i = 0; i < sh->workers[t].nlive; i++)
            requested += sh->workers[t].live[i].size;
    }
    gp_stats s = stats_of(sh->pool);
    cr_assert_eq(s.active_blocks, blocks, "%s: the pool counts %llu live blocks, the test holds %llu", when,
                 (unsigned long long)s.active_blocks, (unsigned long long)blocks);
    cr_assert_eq(s.requested_bytes, requested, "%s: the pool counts %llu requested bytes, the test %llu", when,
                 (unsigned long long)s.requested_bytes, (unsigned long long)requested);
    cr_assert(s.allocated_bytes >= requested && s.allocated_bytes - requested < 512 * blocks + 1,
              "%s: allocated %llu for %llu requested in %llu blocks", when, (unsigned long long)s.allocated_bytes,
              (unsigned long long)requested, (unsigned long long)blocks);
    cr_assert_eq(s.allocated_bytes + s.cached_bytes, s.reserved_bytes);
    gp_sim_report rep;
    gp_sim_get_report(sh->sim, &rep);
    cr_assert_eq(rep.allocated_bytes, s.reserved_bytes, "%s: the device holds %llu bytes, the pool reserves %llu",
                 when, (unsigned long long)rep.allocated_bytes, (unsigned long long)s.reserved_bytes);
    cr_assert_eq(rep.allocations, s.segments, "%s: %llu device allocations, %llu segments", when,
                 (unsigned long long)rep.allocations, (unsigned long long)s.segments);
}

/* CHECK on the block's stream, then free it there (single-threaded). */
static void free_at_end(shared *sh, const live_block *b)
{
    int rc = gp_sim_launch(sh->sim, b->stream, b->p, b->size, GP_SIM_CHECK, b->seed, 100);
    cr_assert_eq(rc, GP_OK, "final CHECK: %s", gp_last_error());
    rc = gp_free(sh->pool, b->p, b->stream);
    cr_assert_eq(rc, GP_OK, "final gp_free(%p): %s", b->p, gp_last_error());
}

static void run_stress(uint64_t seed, unsigned threads, unsigned streams)
{
    static shared sh; /* large: keep it off the stack */
    memset(&sh, 0, sizeof sh);
    sh.threads = threads;
    sh.streams_per_thread = streams;
    pthread_mutex_init(&sh.lock, NULL);
    int rc = gp_pool_create(&sh.pool, 0, "sim", CONFIG);
    cr_assert_eq(rc, GP_OK, "gp_pool_create: %s", gp_last_error());
    sh.sim = gp_sim_of(sh.pool);
    cr_assert_not_null(sh.sim);
    gp_sim_retain(sh.sim);

    /* Streams, each seen by the pool before any thread frees on it. */
    for (unsigned i = 0; i < threads * streams; i++) {
        sh.all[i] = gp_sim_stream_create(sh.sim);
        void *p = NULL;
        cr_assert_eq(gp_alloc(sh.pool, &p, 1, sh.all[i]), GP_OK, "%s", gp_last_error());
        cr_assert_eq(gp_free(sh.pool, p, sh.all[i]), GP_OK, "%s", gp_last_error());
    }
    sh.nall = threads * streams;
    unsigned steps = steps_per_run() / threads; /* per thread */
    if (steps < ROUNDS)
        steps = ROUNDS;
    for (unsigned t = 0; t < threads; t++) {
        worker *w = &sh.workers[t];
        w->sh = &sh;
        w->index = t;
        w->rng = seed * 0x100000001b3ull + t;
        w->nown = streams;
        w->max_live = LIVE_TOTAL / threads;
        for (unsigned i = 0; i < streams; i++)
            w->own[i] = sh.all[t * streams + i];
    }

    for (unsigned round = 0; round < ROUNDS; round++) {
        pthread_t tid[MAX_THREADS];
        for (unsigned t = 0; t < threads; t++) {
            sh.workers[t].steps = steps / ROUNDS;
            cr_assert_eq(pthread_create(&tid[t], NULL, worker_main, &sh.workers[t]), 0);
        }
        for (unsigned t = 0; t < threads; t++)
            pthread_join(tid[t], NULL);
        for (unsigned t = 0; t < threads; t++)
            cr_assert(!sh.workers[t].failed, "round %u: %s", round, sh.workers[t].error);
        check_quiescent(&sh, round);
    }

    /* Counts, before the final frees change them. */
    counters total;
    memset(&total, 0, sizeof total);
    for (unsigned t = 0; t < threads; t++) {
        const counters *c = &sh.workers[t].n;
        total.allocs += c->allocs, total.ooms += c->ooms, total.frees += c->frees;
        total.cross_frees += c->cross_frees, total.records += c->records, total.handoffs += c->handoffs;
        total.received += c->received, total.trims += c->trims, total.advances += c->advances;
        total.syncs += c->syncs, total.checks += c->checks;
    }
    gp_stats s = stats_of(sh.pool);
    gp_sim_report rep;
    gp_sim_get_report(sh.sim, &rep);
    cr_log_info("seed %llu, %u threads x %u streams, %u steps each: %llu allocs, %llu OOMs, %llu frees (%llu on "
                "another stream), %llu record_stream, %llu hand-offs (%llu taken), %llu trims, %llu advances; "
                "pool: %llu steals, %llu stream waits, %llu alloc retries, %llu device allocs, %llu device frees, "
                "%llu events, peak reserved %llu MiB, device peak %llu MiB",
                (unsigned long long)seed, threads, streams, steps, (unsigned long long)total.allocs,
                (unsigned long long)total.ooms, (unsigned long long)total.frees,
                (unsigned long long)total.cross_frees, (unsigned long long)total.records,
                (unsigned long long)total.handoffs, (unsigned long long)total.received,
                (unsigned long long)total.trims, (unsigned long long)total.advances,
                (unsigned long long)s.num_stream_steals, (unsigned long long)s.num_stream_waits,
                (unsigned long long)s.num_alloc_retries, (unsigned long long)s.num_device_allocs,
                (unsigned long long)s.num_device_frees, (unsigned long long)s.num_events_created,
                (unsigned long long)(s.reserved_bytes_peak / MIB), (unsigned long long)(rep.allocated_peak / MIB));
    cr_assert_gt(total.allocs, steps / 10, "the run allocated almost nothing");
    cr_assert_eq(s.num_ooms, total.ooms, "the pool counts %llu OOMs, the threads saw %llu",
                 (unsigned long long)s.num_ooms, (unsigned long long)total.ooms);

    /* Free everything, wait for the device, and check the whole ledger. */
    for (unsigned t = 0; t < threads; t++)
        for (unsigned i = 0; i < sh.workers[t].nlive; i++)
            free_at_end(&sh, &sh.workers[t].live[i]);
    for (unsigned i = 0; i < sh.nhandoff; i++)
        free_at_end(&sh, &sh.handoff[i]);
    gp_sim_synchronize(sh.sim);
    assert_ledger_clean(sh.sim, "at the end");
    cr_assert_eq(gp_check(sh.pool), GP_OK, "gp_check at the end: %s", gp_last_error());
    s = stats_of(sh.pool);
    cr_assert_eq(s.allocated_bytes, 0, "%llu bytes still allocated", (unsigned long long)s.allocated_bytes);
    cr_assert_eq(s.active_blocks, 0);
    cr_assert_eq(s.requested_bytes, 0);

    gp_leak_report leaks = {99, 99};
    rc = gp_pool_destroy(sh.pool, &leaks);
    cr_assert_eq(rc, GP_OK, "gp_pool_destroy: %s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, 0, "destroy found %zu live blocks", leaks.live_blocks);
    cr_assert_eq(leaks.live_bytes, 0);
    gp_sim_get_report(sh.sim, &rep);
    cr_assert(rep.closed);
    cr_assert_eq(rep.leaked_bytes_at_close, 0, "%llu bytes leaked: %s", (unsigned long long)rep.leaked_bytes_at_close,
                 gp_sim_first_violation(sh.sim));
    cr_assert_eq(rep.leaked_events_at_close, 0, "%llu events leaked: %s",
                 (unsigned long long)rep.leaked_events_at_close, gp_sim_first_violation(sh.sim));
    assert_ledger_clean(sh.sim, "after destroy");
    gp_sim_release(sh.sim);
    pthread_mutex_destroy(&sh.lock);
}

#define STRESS(SEED, THREADS, STREAMS)                                                                         \
    Test(stress, seed##SEED##_t##THREADS##_s##STREAMS, .timeout = 240)                                       \
    {                                                                                                          \
        run_stress(SEED, THREADS, STREAMS);                                                                    \
    }

STRESS(1, 1, 1)
STRESS(1, 1, 4)
STRESS(1, 4, 1)
STRESS(1, 4, 4)
STRESS(2, 1, 1)
STRESS(2, 1, 4)
STRESS(2, 4, 1)
STRESS(2, 4, 4)
STRESS(3, 1, 1)
STRESS(3, 1, 4)
STRESS(3, 4, 1)
STRESS(3, 4, 4)

/* ---- the harness can fail ---------------------------------------------------------------------- */

/* The same checks that judge the pool above, shown to fire on a misuse made on purpose: a block freed
 * on A while A's long WRITE still runs, then written on B without the pool (as a buggy allocator would
 * hand it to B). */
Test(stress_harness, race_checker_sees_unordered_reuse_on_another_stream)
{
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", CONFIG), GP_OK, "%s", gp_last_error());
    gp_sim *sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    gp_stream a = gp_sim_stream_create(sim), b = gp_sim_stream_create(sim);
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 64 * KIB, a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, a, p, 64 * KIB, GP_SIM_WRITE, 1, 1000000), GP_OK);
    cr_assert_eq(gp_free(pool, p, a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, b, p, 64 * KIB, GP_SIM_WRITE, 2, 100), GP_OK);
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_gt(rep.races, 0, "the race checker missed a WRITE on B over A's running WRITE");
    cr_assert_neq(gp_sim_first_violation(sim)[0], '\0');
    cr_log_info("as intended: %s", gp_sim_first_violation(sim));
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());
    gp_sim_get_report(sim, &rep);
    cr_assert_eq(rep.leaked_bytes_at_close + rep.leaked_events_at_close + rep.bad_calls, 0);
    gp_sim_release(sim);
}

/* A block handed out twice: the second owner's WRITE destroys the first owner's pattern, and the first
 * owner's CHECK at its free says so. */
Test(stress_harness, pattern_check_sees_a_block_handed_out_twice)
{
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", CONFIG), GP_OK, "%s", gp_last_error());
    gp_sim *sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    gp_stream a = gp_sim_stream_create(sim);
    void *p, *q;
    cr_assert_eq(gp_alloc(pool, &p, 3000, a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, a, p, 3000, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(gp_free(pool, p, a), GP_OK, "%s", gp_last_error()); /* freed too early, on purpose */
    cr_assert_eq(gp_alloc(pool, &q, 3000, a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(q, p, "reuse on the same stream");
    cr_assert_eq(gp_sim_launch(sim, a, q, 3000, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, a, p, 3000, GP_SIM_CHECK, 1, 100), GP_OK); /* the first owner checks */
    gp_sim_synchronize(sim);
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_gt(rep.pattern_mismatches, 0, "the pattern check missed an overwritten block");
    cr_assert_eq(rep.races, 0);
    cr_log_info("as intended: %s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_free(pool, q, a), GP_OK);
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());
    gp_sim_release(sim);
}

/* A kernel on memory the device never allocated is a bad call. */
Test(stress_harness, bad_call_check_sees_a_kernel_on_unallocated_memory)
{
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", CONFIG), GP_OK, "%s", gp_last_error());
    gp_sim *sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    gp_stream a = gp_sim_stream_create(sim);
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 4096, a), GP_OK, "%s", gp_last_error());
    /* the pool holds one 2 MiB segment; 256 MiB further lies inside the device but in no allocation */
    int rc = gp_sim_launch(sim, a, (char *)p + 256 * MIB, 4096, GP_SIM_WRITE, 1, 100);
    cr_assert_eq(rc, GP_ERR_INVALID, "a kernel outside every allocation: %d", rc);
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_gt(rep.bad_calls, 0);
    cr_assert_eq(gp_free(pool, p, a), GP_OK);
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());
    gp_sim_release(sim);
}

/* The ledger the stress test compares the pool with moves with the pool's device memory. */
Test(stress_harness, ledger_tracks_device_memory)
{
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", CONFIG), GP_OK, "%s", gp_last_error());
    gp_sim *sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    gp_stream a = gp_sim_stream_create(sim);
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 20 * MIB, a), GP_OK, "%s", gp_last_error());
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_geq(rep.allocated_bytes, 20 * MIB);
    cr_assert_geq(rep.allocations, 1);
    cr_assert_eq(gp_free(pool, p, a), GP_OK);
    cr_assert_eq(gp_trim(pool, 0, NULL), GP_OK, "%s", gp_last_error());
    gp_sim_get_report(sim, &rep);
    cr_assert_eq(rep.allocated_bytes, 0);
    cr_assert_eq(rep.allocations, 0);
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());
    gp_sim_release(sim);
}
