/*
 * test_thread_cache_neutral.c — the per-thread cache of small freed blocks changes host cost only
 * (pool/provider/thread_cache.h, "Layout neutrality"): the same calls on a pool with thread_cache:on and
 * on one with thread_cache:off get the same block addresses, and end with the same reserved bytes,
 * peaks and device calls, on both simulated backends. A plain program (one thread; it also runs under
 * ThreadSanitizer with the threaded label).
 *
 * Each scenario exercises one way the cache once decided differently from the heap's quick lists:
 *   - more frees of one size than an entry holds: LIFO across the entry and the quick list;
 *   - a return (a stats call) between a free and the next allocation: the order the blocks come back in;
 *   - blocks freed into the cache that a larger request needs coalesced before the stream grows;
 *   - a peak reached by cached allocations while the stream's own delta is large (the cap's input);
 *   - a pseudo-random mix of sizes on two streams with cross-stream frees, record_stream, kernels that
 *     keep frees pending, stats calls and trims.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

static int failures;

#define EXPECT(cond, ...)                                                                                      \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            failures++;                                                                                        \
            fprintf(stderr, "test_thread_cache_neutral: %s:%d: ", __FILE__, __LINE__);                        \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, " [%s]\n", gp_last_error());                                                      \
        }                                                                                                      \
    } while (0)

#define MAX_ADDRS 40000

/* What one run records: every address handed out, in order, and the figures at the end. */
typedef struct run_record {
    uintptr_t addrs[MAX_ADDRS];
    size_t count;
    gp_stats stats;
} run_record;

typedef struct run {
    gp_pool *pool;
    gp_sim *sim;
    gp_stream streams[2];
    run_record *rec;
} run;

static void start(run *r, const char *backend, const char *cache, run_record *rec)
{
    char conf[128];
    snprintf(conf, sizeof conf, "device_memory:1GiB,thread_cache:%s", cache);
    memset(rec, 0, sizeof *rec);
    r->rec = rec;
    r->pool = NULL;
    int rc = gp_pool_create(&r->pool, 0, backend, conf);
    EXPECT(rc == GP_OK, "gp_pool_create(%s, %s): %d", backend, conf, rc);
    if (rc != GP_OK)
        exit(1);
    r->sim = gp_sim_of(r->pool);
    r->streams[0] = gp_sim_stream_create(r->sim);
    r->streams[1] = gp_sim_stream_create(r->sim);
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

static void *take(run *r, size_t size, int stream)
{
    void *p = NULL;
    EXPECT(gp_alloc(r->pool, &p, size, r->streams[stream]) == GP_OK && p != NULL, "gp_alloc(%zu)", size);
    if (r->rec->count < MAX_ADDRS)
        r->rec->addrs[r->rec->count++] = (uintptr_t)p;
    return p;
}

static void give(run *r, void *p, int stream)
{
    EXPECT(gp_free(r->pool, p, r->streams[stream]) == GP_OK, "gp_free(%p)", p);
}

static void finish(run *r)
{
    EXPECT(gp_check(r->pool) == GP_OK, "gp_check");
    r->rec->stats = stats_of(r->pool);
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(r->pool, &leaks) == GP_OK, "gp_pool_destroy");
}

/* 100 blocks of 512 B freed, then allocated again: the last freed comes first, across the 64 an
 * entry holds and the quick list under them. */
static void lifo_beyond_the_entry(run *r)
{
    enum { N = 100 };
    void *p[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++)
            p[i] = take(r, 512, 0);
        for (int i = 0; i < N; i++)
            give(r, p[i], 0);
    }
}

/* Blocks freed, a stats call (which returns the thread caches' blocks to their streams), then the
 * same sizes again: they come back in the order they would from the quick lists. */
static void return_keeps_the_order(run *r)
{
    enum { N = 12 };
    void *p[N];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++)
            p[i] = take(r, 512 * (1 + (size_t)(i % 3)), 0);
        for (int i = 0; i < N; i++)
            give(r, p[i], 0);
        (void)stats_of(r->pool);
    }
    for (int i = 0; i < N; i++)
        give(r, take(r, 512 * (1 + (size_t)(i % 3)), 0), 0);
}

/* A small segment tiled with 4 KiB blocks, a run of them freed side by side, then 128 KiB on the
 * stream: the freed run coalesces into it, with or without the cache, instead of growing. */
static void coalesce_before_growth(run *r)
{
    enum { BLOCK = 4096, COUNT = (2 << 20) / BLOCK };
    static void *blocks[COUNT];
    for (int i = 0; i < COUNT; i++)
        blocks[i] = take(r, BLOCK, 0);
    for (int i = COUNT / 4; i < COUNT / 4 + 80; i++) {
        give(r, blocks[i], 0);
        blocks[i] = NULL;
    }
    void *big = take(r, 128 << 10, 0);
    give(r, big, 0);
    for (int i = 0; i < COUNT; i++)
        if (blocks[i] != NULL)
            give(r, blocks[i], 0);
}

/* 15 MiB in large blocks allocated and freed (the heap keeps them); 64 blocks of 4 KiB freed into the
 * cache; the 15 MiB again from the heap, on the stream's own path; then the 64 again from the cache:
 * the peak is 15 MiB + 256 KiB either way (the peak feeds the cache cap). */
static void peak_through_the_cache(run *r)
{
    enum { N = 64, LARGE = 15 };
    void *small[N], *large[LARGE];
    for (int i = 0; i < LARGE; i++)
        large[i] = take(r, 1 << 20, 0);
    for (int i = 0; i < LARGE; i++)
        give(r, large[i], 0);
    for (int i = 0; i < N; i++)
        small[i] = take(r, 4096, 0);
    for (int i = 0; i < N; i++)
        give(r, small[i], 0);
    for (int i = 0; i < LARGE; i++)
        large[i] = take(r, 1 << 20, 0);
    for (int i = 0; i < N; i++)
        small[i] = take(r, 4096, 0);
    for (int i = 0; i < N; i++)
        give(r, small[i], 0);
    for (int i = 0; i < LARGE; i++)
        give(r, large[i], 0);
}

static uint64_t next_random(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

/* Sizes as a model's: small blocks of a few sizes coming and going fast (slots 0..SMALL-1), medium
 * and large ones living longer (the other slots, picked less often). */
static void mixed_two_streams(run *r)
{
    enum { SMALL = 24, LIVE = 88, OPS = 20000 };
    static const size_t small_sizes[] = {512, 1024, 1536, 4096, 7680, 3000};
    void *live[LIVE] = {0};
    int owner[LIVE];
    uint64_t seed = 42;
    for (int op = 0; op < OPS; op++) {
        int slot = next_random(&seed) % 4 != 0 ? (int)(next_random(&seed) % SMALL)
                                                : SMALL + (int)(next_random(&seed) % (LIVE - SMALL));
        int stream = (op / 250) % 2; /* the two streams take turns, as two models' steps */
        if (live[slot] == NULL) {
            uint64_t kind = next_random(&seed) % 10, spread = next_random(&seed);
            size_t size = slot < SMALL ? small_sizes[spread % 6]
                          : kind != 0  ? 8192 + (size_t)(spread % (600 << 10))
                                       : (1 << 20) + (size_t)(spread % (12 << 20));
            live[slot] = take(r, size, stream);
            owner[slot] = stream;
            if (next_random(&seed) % 64 == 0) /* a kernel on the other stream uses it: its free waits for it */
                EXPECT(gp_record_stream(r->pool, live[slot], r->streams[1 - stream]) == GP_OK, "record_stream");
            if (next_random(&seed) % 8 == 0)
                gp_sim_launch(r->sim, r->streams[stream], live[slot], 512, GP_SIM_WRITE, 1, 20000);
        } else {
            int on = next_random(&seed) % 50 == 0 ? 1 - owner[slot] : owner[slot]; /* sometimes a cross-stream free */
            give(r, live[slot], on);
            live[slot] = NULL;
        }
        if (op % 997 == 0)
            gp_sim_advance(r->sim, 50000);
        if (op % 4999 == 0)
            (void)stats_of(r->pool);
        if (op % 9973 == 0)
            EXPECT(gp_trim(r->pool, 0, NULL) == GP_OK, "gp_trim");
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i] != NULL)
            give(r, live[i], owner[i]);
    gp_sim_synchronize(r->sim);
}

typedef struct scenario {
    const char *name;
    void (*body)(run *r);
} scenario;

static const scenario scenarios[] = {
    {"lifo_beyond_the_entry", lifo_beyond_the_entry},
    {"return_keeps_the_order", return_keeps_the_order},
    {"coalesce_before_growth", coalesce_before_growth},
    {"peak_through_the_cache", peak_through_the_cache},
    {"mixed_two_streams", mixed_two_streams},
};

static void compare(const char *backend, const scenario *sc, const run_record *on, const run_record *off)
{
    EXPECT(on->count == off->count, "%s %s: %zu allocations with the cache, %zu without", backend, sc->name,
           on->count, off->count);
    for (size_t i = 0; i < on->count && i < off->count; i++)
        if (on->addrs[i] != off->addrs[i]) {
            EXPECT(0, "%s %s: allocation %zu got %#lx with the cache, %#lx without", backend, sc->name, i,
                   (unsigned long)on->addrs[i], (unsigned long)off->addrs[i]);
            break;
        }
    const gp_stats *a = &on->stats, *b = &off->stats;
#define SAME(field)                                                                                            \
    EXPECT(a->field == b->field, "%s %s: " #field " %llu with the cache, %llu without", backend, sc->name,    \
           (unsigned long long)a->field, (unsigned long long)b->field)
    SAME(reserved_bytes);
    SAME(reserved_bytes_peak);
    SAME(allocated_bytes_peak);
    SAME(cached_bytes);
    SAME(num_device_allocs);
    SAME(num_device_frees);
    SAME(num_stream_steals);
    SAME(num_maps);
    SAME(num_stitches);
    SAME(num_allocs);
    SAME(num_frees);
#undef SAME
}

int main(void)
{
    static run_record on, off;
    const char *backends[] = {"sim", "sim-vmm"};
    for (size_t b = 0; b < 2; b++)
        for (size_t s = 0; s < sizeof scenarios / sizeof scenarios[0]; s++) {
            run r;
            start(&r, backends[b], "on", &on);
            scenarios[s].body(&r);
            finish(&r);
            start(&r, backends[b], "off", &off);
            scenarios[s].body(&r);
            finish(&r);
            compare(backends[b], &scenarios[s], &on, &off);
            if (scenarios[s].body == peak_through_the_cache) /* the true figure, not only the same one */
                EXPECT(on.stats.allocated_bytes_peak == (15u << 20) + 64 * 4096, "%s: allocated peak %llu",
                       backends[b], (unsigned long long)on.stats.allocated_bytes_peak);
        }
    if (failures == 0)
        printf("test_thread_cache_neutral: every scenario identical with and without the cache\n");
    return failures == 0 ? 0 : 1;
}
