/*
 * test_loans_threads.c — loans (loans:on, provider/alias.h) with one thread per stream, as a plain
 * program so that it also runs under ThreadSanitizer (Criterion cannot; see tests/CMakeLists.txt).
 *
 * Each thread owns a stream with free memory in holes between live pins, and repeatedly asks for a
 * peak larger than its own holes: the pool stitches its own and the other streams' free pages (loans),
 * parks them after the free, and gives them back to their owners when those miss, while the other
 * threads allocate and free on their streams at the same time. Every block is written by a simulated
 * kernel with a pattern from a seed and checked before its free. At the end: no race and no pattern
 * mismatch in the sim's ledger, gp_check clean, nothing live, destroy gives everything back. Not a
 * benchmark.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#include "expect.h"

#define THREADS 4
#define MIB ((size_t)1 << 20)
#define H ((size_t)8 * MIB)
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STEPS 16
#else
#define STEPS 48
#endif

static gp_pool *pool;
static gp_sim *sim;

static void *written(gp_stream s, size_t size, uint64_t seed)
{
    void *p = NULL;
    int rc = gp_alloc(pool, &p, size, s);
    EXPECT(rc == GP_OK, "alloc %zu: %s", size, gp_strerror(rc));
    if (rc != GP_OK)
        return NULL;
    EXPECT(gp_sim_launch(sim, s, p, size, GP_SIM_WRITE, seed, 1000) == GP_OK, "write: %s",
           gp_sim_first_violation(sim));
    return p;
}

static void checked_free(gp_stream s, void *p, size_t size, uint64_t seed)
{
    if (p == NULL)
        return;
    EXPECT(gp_sim_launch(sim, s, p, size, GP_SIM_CHECK, seed, 1000) == GP_OK, "check: %s",
           gp_sim_first_violation(sim));
    EXPECT(gp_free(pool, p, s) == GP_OK, "free");
}

static void *worker(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    gp_stream s = gp_sim_stream_create(sim);
    uint64_t base = 1000u * (id + 1);
    /* holes: four blocks, the 1st and 3rd freed */
    void *hole0 = written(s, H, base), *pin0 = written(s, H, base + 1);
    void *hole1 = written(s, H, base + 2), *pin1 = written(s, H, base + 3);
    checked_free(s, hole0, H, base);
    checked_free(s, hole1, H, base + 2);
    for (unsigned k = 0; k < STEPS; k++) {
        uint64_t seed = base + 10 + k;
        size_t size = (3 + (k + id) % 2) * H; /* a peak above the stream's own 2 x H of holes */
        void *peak = written(s, size, seed);
        checked_free(s, peak, size, seed);
        if (k % 8 == id % 8)
            gp_sim_synchronize(sim); /* the streams' work done: their free pages may be lent */
    }
    checked_free(s, pin0, H, base + 1);
    checked_free(s, pin1, H, base + 3);
    return NULL;
}

int main(void)
{
    unsetenv("GPUPOOL_CONF");
    int rc = gp_pool_create(&pool, 0, "sim-vmm", "device_memory:512MiB,cache_slack:0,borrow:off,loans:on");
    if (rc != GP_OK) {
        fprintf(stderr, "test_loans_threads: gp_pool_create: %s\n", gp_last_error());
        return 1;
    }
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    pthread_t threads[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    gp_sim_synchronize(sim);
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    EXPECT(gp_get_stats(pool, &st) == GP_OK, "stats");
    EXPECT(st.allocated_bytes == 0, "%zu bytes still allocated", (size_t)st.allocated_bytes);
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK, "destroy");
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    EXPECT(r.races == 0, "races: %s", gp_sim_first_violation(sim));
    EXPECT(r.pattern_mismatches == 0, "pattern mismatches: %s", gp_sim_first_violation(sim));
    EXPECT(r.leaked_bytes_at_close == 0, "leaked %zu bytes", (size_t)r.leaked_bytes_at_close);
    gp_sim_release(sim);
    if (failures == 0)
        printf("test_loans_threads: %d threads x %d steps, stitches %llu: every check held\n", THREADS, STEPS,
               (unsigned long long)st.num_stitches);
    return failures == 0 ? 0 : 1;
}
