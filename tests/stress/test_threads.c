/*
 * test_threads.c — many threads on many streams against one pool, as a plain program (not Criterion)
 * so that it also runs under ThreadSanitizer (Criterion cannot; see tests/CMakeLists.txt).
 *
 * Each thread owns two simulated streams. It allocates random sizes, has a simulated kernel write a
 * pattern derived from a per-block seed, and later checks the pattern on the stream where it frees the
 * block. Some blocks are used on the thread's second stream too (gp_record_stream), some are freed on
 * the other stream, and some are handed to another thread, which checks and frees them on the block's
 * own stream. The device is small, so OOM release, cross-stream steals and stream waits all happen.
 * At the end: no race and no pattern mismatch in the sim's ledger, gp_check clean, nothing live, and
 * destroy gives every byte and event back. Not a benchmark.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#include "expect.h"

#define THREADS 4
#define LIVE_PER_THREAD 24
#define HANDOFF_SLOTS 64

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STEPS 1500
#else
#define STEPS 6000
#endif

typedef struct block {
    void *ptr;
    size_t size;
    uint64_t seed;
    gp_stream stream; /* where it was allocated and written */
} block;

static gp_pool *pool;
static gp_sim *sim;
static pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;
static block handoff[HANDOFF_SLOTS];
static int handoff_count;

static uint64_t next_random(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Log-uniform sizes from 1 B to 8 MiB, so both heaps are used. */
static size_t random_size(uint64_t *rng)
{
    unsigned bits = (unsigned)(next_random(rng) % 23);
    return 1 + (size_t)(next_random(rng) % ((size_t)1 << bits));
}

static void check_and_free(block *b, gp_stream free_stream)
{
    EXPECT(gp_sim_launch(sim, free_stream, b->ptr, b->size, GP_SIM_CHECK, b->seed, 200) == GP_OK, "check launch");
    EXPECT(gp_free(pool, b->ptr, free_stream) == GP_OK, "free %p", b->ptr);
}

static void *worker(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    uint64_t rng = 0xC0FFEEull * (id + 1);
    gp_stream streams[2] = {gp_sim_stream_create(sim), gp_sim_stream_create(sim)};
    block live[LIVE_PER_THREAD];
    int count = 0;
    for (int step = 0; step < STEPS; step++) {
        unsigned action = (unsigned)(next_random(&rng) % 100);
        if (action < 45 && count < LIVE_PER_THREAD) {
            block b = {NULL, random_size(&rng), next_random(&rng), streams[next_random(&rng) % 2]};
            int rc = gp_alloc(pool, &b.ptr, b.size, b.stream);
            if (rc == GP_ERR_OOM)
                continue; /* allowed: the device is small on purpose */
            EXPECT(rc == GP_OK, "alloc %zu", b.size);
            if (rc != GP_OK)
                continue;
            EXPECT(gp_sim_launch(sim, b.stream, b.ptr, b.size, GP_SIM_WRITE, b.seed, next_random(&rng) % 4000) ==
                       GP_OK,
                   "write launch");
            live[count++] = b;
        } else if (action < 85 && count > 0) {
            int i = (int)(next_random(&rng) % (unsigned)count);
            block b = live[i];
            live[i] = live[--count];
            gp_stream other = b.stream == streams[0] ? streams[1] : streams[0];
            unsigned how = (unsigned)(next_random(&rng) % 10);
            if (how == 0) { /* also used on the other stream, after the writer (the test orders it) */
                gp_sim_stream_synchronize(sim, b.stream);
                EXPECT(gp_record_stream(pool, b.ptr, other) == GP_OK, "record_stream");
                EXPECT(gp_sim_launch(sim, other, b.ptr, b.size, GP_SIM_READ, 0, 1000) == GP_OK, "read launch");
                check_and_free(&b, b.stream);
            } else if (how == 1) { /* freed on the other stream, ordered after its own */
                gp_sim_stream_synchronize(sim, b.stream);
                check_and_free(&b, other);
            } else if (how == 2) { /* handed to another thread */
                pthread_mutex_lock(&handoff_lock);
                if (handoff_count < HANDOFF_SLOTS)
                    handoff[handoff_count++] = b;
                else
                    check_and_free(&b, b.stream);
                pthread_mutex_unlock(&handoff_lock);
            } else {
                check_and_free(&b, b.stream);
            }
        } else if (action < 92) {
            pthread_mutex_lock(&handoff_lock);
            if (handoff_count > 0) {
                block b = handoff[--handoff_count];
                pthread_mutex_unlock(&handoff_lock);
                check_and_free(&b, b.stream);
            } else {
                pthread_mutex_unlock(&handoff_lock);
            }
        } else if (action < 99) {
            gp_sim_advance(sim, next_random(&rng) % 3000);
        } else {
            size_t released;
            EXPECT(gp_trim(pool, (size_t)(next_random(&rng) % (64u << 20)), &released) == GP_OK, "trim");
        }
    }
    for (int i = 0; i < count; i++)
        check_and_free(&live[i], live[i].stream);
    return NULL;
}

int main(void)
{
    unsetenv("GPUPOOL_CONF");
    if (gp_pool_create(&pool, 0, "sim", "device_memory:96MiB") != GP_OK) {
        fprintf(stderr, "test_threads: create: %s\n", gp_last_error());
        return 1;
    }
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    pthread_t threads[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    while (handoff_count > 0) {
        block b = handoff[--handoff_count];
        check_and_free(&b, b.stream);
    }
    gp_sim_synchronize(sim);

    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    EXPECT(r.races == 0, "%llu races: %s", (unsigned long long)r.races, gp_sim_first_violation(sim));
    EXPECT(r.pattern_mismatches == 0, "%llu mismatches: %s", (unsigned long long)r.pattern_mismatches,
           gp_sim_first_violation(sim));
    EXPECT(r.bad_calls == 0, "%llu bad calls: %s", (unsigned long long)r.bad_calls, gp_sim_first_violation(sim));
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    EXPECT(gp_get_stats(pool, &s) == GP_OK, "stats");
    EXPECT(s.allocated_bytes == 0, "%llu bytes still allocated", (unsigned long long)s.allocated_bytes);
    printf("test_threads: %d threads, %llu allocations, %llu OOMs, %llu device allocs, %llu steals, %llu stream "
           "waits, %llu retries\n",
           THREADS, (unsigned long long)s.num_allocs, (unsigned long long)s.num_ooms,
           (unsigned long long)s.num_device_allocs, (unsigned long long)s.num_stream_steals,
           (unsigned long long)s.num_stream_waits, (unsigned long long)s.num_alloc_retries);
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK, "destroy");
    EXPECT(leaks.live_blocks == 0, "%zu blocks leaked", leaks.live_blocks);
    gp_sim_get_report(sim, &r);
    EXPECT(r.leaked_bytes_at_close == 0 && r.leaked_events_at_close == 0, "device leak: %llu bytes, %llu events",
           (unsigned long long)r.leaked_bytes_at_close, (unsigned long long)r.leaked_events_at_close);
    gp_sim_release(sim);
    printf("%d passed, %d failed\n", failures == 0 ? 1 : 0, failures == 0 ? 0 : 1);
    return failures == 0 ? 0 : 1;
}
