/*
 * test_thread_cache.c — the per-thread cache of small freed blocks (pool/provider/thread_cache.h)
 * through the public API, as a plain program so that it also runs under ThreadSanitizer.
 *
 * Each check targets one promise of the cache: reuse on the freeing stream only; exact stats and a
 * clean gp_check while blocks sit in a cache; a block that one thread's cache handed out can be freed,
 * recorded on another stream, or double-freed from another thread with the ordinary results; thread
 * exit gives the blocks back (gp_trim then releases everything); a pool destroyed while another thread
 * still caches its blocks leaves that thread's cache usable; more streams than a cache has entries;
 * lent blocks coalesce back into their stream's heap before the stream grows.
 * Then two threads allocate on one stream and free each other's blocks, with the race checker on.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#include "expect.h"

static gp_pool *make_pool(void)
{
    gp_pool *pool = NULL;
    int rc = gp_pool_create(&pool, 0, "sim", "device_memory:256MiB");
    EXPECT(rc == GP_OK, "gp_pool_create: %d", rc);
    if (rc != GP_OK)
        exit(1);
    return pool;
}

static gp_stats stats_of(gp_pool *pool)
{
    gp_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    s.version = GP_STATS_VERSION;
    EXPECT(gp_get_stats(pool, &s) == GP_OK, "gp_get_stats");
    return s;
}

static void *alloc_on(gp_pool *pool, size_t size, gp_stream s)
{
    void *p = NULL;
    EXPECT(gp_alloc(pool, &p, size, s) == GP_OK && p != NULL, "gp_alloc(%zu)", size);
    return p;
}

/* A block freed on S comes back on S at once, and not on another stream. */
static void reuse_on_own_stream_only(void)
{
    gp_pool *pool = make_pool();
    gp_sim *sim = gp_sim_of(pool);
    gp_stream S = gp_sim_stream_create(sim), T = gp_sim_stream_create(sim);
    void *a = alloc_on(pool, 512, S);
    EXPECT(gp_free(pool, a, S) == GP_OK, "free a");
    void *b = alloc_on(pool, 512, S); /* from the thread cache */
    EXPECT(b == a, "a block freed on S is reused on S (%p, then %p)", a, b);
    EXPECT(gp_free(pool, b, S) == GP_OK, "free b");
    void *c = alloc_on(pool, 512, T);
    EXPECT(c != a, "a block freed on S went to stream T without an event");
    gp_stats st = stats_of(pool);
    EXPECT(st.num_allocs == 3 && st.num_frees == 2, "counts %llu allocs, %llu frees",
           (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees);
    EXPECT(st.allocated_bytes == 512 && st.requested_bytes == 512 && st.active_blocks == 1,
           "allocated %llu requested %llu active %llu", (unsigned long long)st.allocated_bytes,
           (unsigned long long)st.requested_bytes, (unsigned long long)st.active_blocks);
    EXPECT(st.allocated_bytes + st.cached_bytes == st.reserved_bytes, "allocated + cached != reserved");
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    EXPECT(gp_free(pool, c, T) == GP_OK, "free c");
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK && leaks.live_blocks == 0, "destroy");
}

/* Blocks lent to the cache are the stream's free memory: a request its heap cannot serve without
 * them coalesces them first instead of growing. A full 2 MiB small segment of 4 KiB blocks, 64 of
 * them freed side by side (all lent), then 128 KiB on the same stream: served from the freed run. */
static int by_address(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

static void lent_blocks_coalesce_before_the_stream_grows(void)
{
    gp_pool *pool = make_pool();
    gp_sim *sim = gp_sim_of(pool);
    gp_stream S = gp_sim_stream_create(sim);
    enum { BLOCK = 4096, COUNT = (2 << 20) / BLOCK, FREED = 64 };
    static void *blocks[COUNT];
    for (int i = 0; i < COUNT; i++)
        blocks[i] = alloc_on(pool, BLOCK, S);
    gp_stats before = stats_of(pool);
    EXPECT(before.num_device_allocs == 1, "%d blocks of 4 KiB took %llu device allocations, expected one segment",
           COUNT, (unsigned long long)before.num_device_allocs);
    qsort(blocks, COUNT, sizeof blocks[0], by_address); /* they tile the segment: neighbours in order */
    int first = COUNT / 2;
    EXPECT((uintptr_t)blocks[first + FREED - 1] - (uintptr_t)blocks[first] == (FREED - 1) * BLOCK,
           "the blocks to free are not side by side");
    for (int i = first; i < first + FREED; i++) {
        EXPECT(gp_free(pool, blocks[i], S) == GP_OK, "free block %d", i);
        blocks[i] = NULL;
    }
    void *big = alloc_on(pool, 128 << 10, S);
    gp_stats after = stats_of(pool);
    EXPECT(after.num_device_allocs == before.num_device_allocs,
           "128 KiB grew the pool (%llu device allocations, %llu before) while 256 KiB of lent blocks lay free",
           (unsigned long long)after.num_device_allocs, (unsigned long long)before.num_device_allocs);
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    EXPECT(gp_free(pool, big, S) == GP_OK, "free big");
    for (int i = 0; i < COUNT; i++)
        if (blocks[i] != NULL)
            EXPECT(gp_free(pool, blocks[i], S) == GP_OK, "free block %d", i);
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK && leaks.live_blocks == 0, "destroy");
}

/* Stats and gp_check while blocks sit in the cache, handed out and free, across many pairs. */
static void stats_exact_with_cached_blocks(void)
{
    gp_pool *pool = make_pool();
    gp_stream S = gp_sim_stream_create(gp_sim_of(pool));
    void *held[8];
    for (int i = 0; i < 8; i++)
        held[i] = alloc_on(pool, 1000 + (size_t)i, S);
    for (int i = 0; i < 8; i++)
        EXPECT(gp_free(pool, held[i], S) == GP_OK, "free %d", i);
    for (int round = 0; round < 100; round++) {
        void *p = alloc_on(pool, 1000, S);
        EXPECT(gp_free(pool, p, S) == GP_OK, "free in round %d", round);
    }
    for (int i = 0; i < 4; i++)
        held[i] = alloc_on(pool, 1024, S); /* four handed out by the cache, now live */
    gp_stats st = stats_of(pool);
    EXPECT(st.num_allocs == 112 && st.num_frees == 108, "counts %llu allocs, %llu frees",
           (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees);
    EXPECT(st.allocated_bytes == 4 * 1024 && st.requested_bytes == 4 * 1024 && st.active_blocks == 4,
           "allocated %llu requested %llu active %llu", (unsigned long long)st.allocated_bytes,
           (unsigned long long)st.requested_bytes, (unsigned long long)st.active_blocks);
    EXPECT(st.allocated_bytes_peak == 8 * 1024, "peak %llu", (unsigned long long)st.allocated_bytes_peak);
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    for (int i = 0; i < 4; i++)
        EXPECT(gp_free(pool, held[i], S) == GP_OK, "free held %d", i);
    size_t released = 0;
    EXPECT(gp_trim(pool, 0, &released) == GP_OK, "trim");
    st = stats_of(pool);
    EXPECT(st.reserved_bytes == 0 && released > 0, "trim left %llu reserved (cached blocks not returned?)",
           (unsigned long long)st.reserved_bytes);
    gp_pool_destroy(pool, NULL);
}

typedef struct remote_call {
    gp_pool *pool;
    void *ptr;
    gp_stream stream;
    int op; /* 0 free, 1 record_stream */
    int rc;
} remote_call;

static void *remote_main(void *arg)
{
    remote_call *c = arg;
    c->rc = c->op == 0 ? gp_free(c->pool, c->ptr, c->stream) : gp_record_stream(c->pool, c->ptr, c->stream);
    return NULL;
}

static int on_other_thread(gp_pool *pool, void *ptr, gp_stream stream, int op)
{
    remote_call c = {pool, ptr, stream, op, -1};
    pthread_t t;
    pthread_create(&t, NULL, remote_main, &c);
    pthread_join(t, NULL);
    return c.rc;
}

/* A block handed out by this thread's cache, freed or recorded from another thread. */
static void other_threads_reach_cached_blocks(void)
{
    gp_pool *pool = make_pool();
    gp_sim *sim = gp_sim_of(pool);
    gp_stream S = gp_sim_stream_create(sim), T = gp_sim_stream_create(sim);
    void *a = alloc_on(pool, 4096, S);
    EXPECT(gp_free(pool, a, S) == GP_OK, "free a");
    void *b = alloc_on(pool, 4096, S); /* handed out by this thread's cache */
    EXPECT(on_other_thread(pool, b, S, 0) == GP_OK, "another thread frees a block this thread's cache handed out");
    EXPECT(gp_free(pool, b, S) == GP_ERR_DOUBLE_FREE, "a second free of it is a double free");
    EXPECT(stats_of(pool).allocated_bytes == 0, "nothing live");
    EXPECT(gp_check(pool) == GP_OK, "gp_check after the remote free");

    void *c = alloc_on(pool, 4096, S);
    EXPECT(gp_free(pool, c, S) == GP_OK, "free c");
    c = alloc_on(pool, 4096, S); /* cached again */
    EXPECT(on_other_thread(pool, c, T, 1) == GP_OK, "another thread records the block on stream T");
    EXPECT(gp_sim_launch(sim, T, c, 4096, GP_SIM_WRITE, 7, 1000000) == GP_OK, "kernel on T");
    EXPECT(gp_free(pool, c, S) == GP_OK, "free c on S after its use on T");
    gp_stats st = stats_of(pool);
    EXPECT(st.pending_bytes == 4096, "a block used on T waits for T's event (pending %llu)",
           (unsigned long long)st.pending_bytes);
    void *d = alloc_on(pool, 4096, S);
    EXPECT(d != c, "a block with a use on T pending was reused on S before T's event");
    EXPECT(gp_free(pool, d, S) == GP_OK, "free d");
    gp_sim_synchronize(sim);

    void *e = alloc_on(pool, 512, S);
    EXPECT(gp_free(pool, e, S) == GP_OK, "free e");
    e = alloc_on(pool, 512, S);
    EXPECT(gp_free(pool, e, S) == GP_OK, "free e again");
    EXPECT(on_other_thread(pool, e, S, 0) == GP_ERR_DOUBLE_FREE, "another thread's free of a cached free block");
    EXPECT(gp_free(pool, e, S) == GP_ERR_DOUBLE_FREE, "this thread's second free of it");
    EXPECT(gp_check(pool) == GP_OK, "gp_check at the end");
    EXPECT(stats_of(pool).allocated_bytes == 0, "nothing live at the end");
    gp_pool_destroy(pool, NULL);
}

typedef struct worker_args {
    gp_pool *pool;
    gp_stream stream;
    pthread_mutex_t *lock;
    pthread_cond_t *cond;
    int *stage;
} worker_args;

static void *cache_and_exit(void *arg)
{
    worker_args *w = arg;
    for (int i = 0; i < 10; i++) {
        void *p = alloc_on(w->pool, 2048, w->stream);
        EXPECT(gp_free(w->pool, p, w->stream) == GP_OK, "worker free");
    }
    return NULL;
}

/* Thread exit gives its cached blocks back: trim then releases the segment. */
static void thread_exit_returns_blocks(void)
{
    gp_pool *pool = make_pool();
    worker_args w = {pool, gp_sim_stream_create(gp_sim_of(pool)), NULL, NULL, NULL};
    pthread_t t;
    pthread_create(&t, NULL, cache_and_exit, &w);
    pthread_join(t, NULL);
    EXPECT(gp_check(pool) == GP_OK, "gp_check after the thread exited");
    size_t released = 0;
    EXPECT(gp_trim(pool, 0, &released) == GP_OK, "trim");
    EXPECT(stats_of(pool).reserved_bytes == 0, "the exited thread's cache still holds blocks");
    gp_pool_destroy(pool, NULL);
}

static void wait_stage(worker_args *w, int stage)
{
    pthread_mutex_lock(w->lock);
    while (*w->stage < stage)
        pthread_cond_wait(w->cond, w->lock);
    pthread_mutex_unlock(w->lock);
}

static void set_stage(worker_args *w, int stage)
{
    pthread_mutex_lock(w->lock);
    *w->stage = stage;
    pthread_cond_broadcast(w->cond);
    pthread_mutex_unlock(w->lock);
}

static void *cache_then_outlive_pool(void *arg)
{
    worker_args *w = arg;
    void *p = alloc_on(w->pool, 512, w->stream);
    EXPECT(gp_free(w->pool, p, w->stream) == GP_OK, "worker free");
    p = alloc_on(w->pool, 512, w->stream);
    EXPECT(gp_free(w->pool, p, w->stream) == GP_OK, "worker free (cached)");
    set_stage(w, 1);
    wait_stage(w, 2); /* the pool is destroyed meanwhile */
    gp_pool *other = make_pool();
    gp_stream s = gp_sim_stream_create(gp_sim_of(other));
    for (int i = 0; i < 3; i++) {
        void *q = alloc_on(other, 512, s);
        EXPECT(gp_free(other, q, s) == GP_OK, "free on a new pool");
    }
    EXPECT(gp_check(other) == GP_OK, "gp_check of the new pool");
    gp_pool_destroy(other, NULL);
    return NULL;
}

/* Destroy while another thread caches blocks of the pool: its cache forgets them. */
static void destroy_while_cached(void)
{
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    int stage = 0;
    gp_pool *pool = make_pool();
    worker_args w = {pool, gp_sim_stream_create(gp_sim_of(pool)), &lock, &cond, &stage};
    pthread_t t;
    pthread_create(&t, NULL, cache_then_outlive_pool, &w);
    wait_stage(&w, 1);
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK && leaks.live_blocks == 0 && leaks.live_bytes == 0,
           "destroy with blocks in another thread's cache");
    set_stage(&w, 2);
    pthread_join(t, NULL);
}

/* More streams than a thread cache has entries. */
static void many_streams(void)
{
    gp_pool *pool = make_pool();
    gp_sim *sim = gp_sim_of(pool);
    gp_stream s[9];
    for (int i = 0; i < 9; i++)
        s[i] = gp_sim_stream_create(sim);
    for (int round = 0; round < 20; round++)
        for (int i = 0; i < 9; i++) {
            void *p = alloc_on(pool, 512 * (size_t)(1 + i), s[i]);
            EXPECT(gp_free(pool, p, s[i]) == GP_OK, "free on stream %d", i);
        }
    gp_stats st = stats_of(pool);
    EXPECT(st.num_allocs == 180 && st.num_frees == 180 && st.allocated_bytes == 0, "counts %llu/%llu, %llu live",
           (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees,
           (unsigned long long)st.allocated_bytes);
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    gp_pool_destroy(pool, NULL);
}

/* Two threads on one stream, each freeing blocks the other allocated (some from its cache). */
#define SHARED_SLOTS 32
#define SHARED_STEPS 4000
static void *shared_slots[SHARED_SLOTS];
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_sim *shared_sim;

static void *swap_blocks(void *arg)
{
    worker_args *w = arg;
    uint64_t seed = (uint64_t)(uintptr_t)&seed;
    for (int i = 0; i < SHARED_STEPS; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t size = 512 * (1 + (size_t)((seed >> 33) % 8));
        void *p = alloc_on(w->pool, size, w->stream);
        EXPECT(gp_sim_launch(shared_sim, w->stream, p, size, GP_SIM_WRITE, seed, 100) == GP_OK, "write");
        pthread_mutex_lock(&shared_lock);
        unsigned slot = (unsigned)(seed >> 40) % SHARED_SLOTS;
        void *old = shared_slots[slot];
        shared_slots[slot] = p;
        pthread_mutex_unlock(&shared_lock);
        if (old != NULL)
            EXPECT(gp_free(w->pool, old, w->stream) == GP_OK, "free the other's block");
        if (i % 500 == 0)
            EXPECT(gp_check(w->pool) == GP_OK, "gp_check while the other thread works");
    }
    return NULL;
}

static void two_threads_one_stream(void)
{
    gp_pool *pool = make_pool();
    shared_sim = gp_sim_of(pool);
    worker_args w = {pool, gp_sim_stream_create(shared_sim), NULL, NULL, NULL};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, swap_blocks, &w);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < SHARED_SLOTS; i++)
        if (shared_slots[i] != NULL)
            EXPECT(gp_free(pool, shared_slots[i], w.stream) == GP_OK, "free slot %d", i);
    gp_sim_synchronize(shared_sim);
    gp_sim_report report;
    gp_sim_get_report(shared_sim, &report);
    EXPECT(report.races == 0 && report.bad_calls == 0, "race checker: %s", gp_sim_first_violation(shared_sim));
    gp_stats st = stats_of(pool);
    EXPECT(st.allocated_bytes == 0 && st.num_allocs == st.num_frees, "%llu live, %llu allocs, %llu frees",
           (unsigned long long)st.allocated_bytes, (unsigned long long)st.num_allocs,
           (unsigned long long)st.num_frees);
    EXPECT(gp_check(pool) == GP_OK, "gp_check at the end");
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK && leaks.live_blocks == 0, "destroy");
}

int main(void)
{
    unsetenv("GPUPOOL_CONF");
    reuse_on_own_stream_only();
    lent_blocks_coalesce_before_the_stream_grows();
    stats_exact_with_cached_blocks();
    other_threads_reach_cached_blocks();
    thread_exit_returns_blocks();
    destroy_while_cached();
    many_streams();
    two_threads_one_stream();
    if (failures != 0) {
        fprintf(stderr, "test_thread_cache: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_thread_cache: all checks passed\n");
    return 0;
}
