/*
 * test_tenant_threads.c — several tenants, two threads each, allocating random sizes on their own
 * streams against one pool while another thread changes their limits; a plain program so that it also
 * runs under ThreadSanitizer.
 *
 * Checked against the simulated GPU's own ledger, not the pool's counters: the most device memory the
 * sim ever had allocated is at most the sum of the tenants' largest max (each tenant can hold at most
 * its max at any instant, so all of them together never more). Checked on the pool: no refusal other
 * than GP_ERR_QUOTA / GP_ERR_OOM, every tenant's held bytes never above the largest max it had, the
 * tenants' held bytes add up to the pool's reserved bytes, gp_check is clean, nothing leaks, and the
 * pattern kernels find every live block intact. Not a benchmark.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)
#define TENANTS 3
#define THREADS_PER_TENANT 2
#define LIVE 12
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STEPS 800
#else
#define STEPS 3000
#endif

static gp_pool *pool;
static gp_sim *sim;
static const char *names[TENANTS] = {"alpha", "beta", "gamma"};
static const size_t max_high[TENANTS] = {48 * MIB, 32 * MIB, 24 * MIB}; /* largest max each ever has */
static atomic_int failures;
static atomic_bool stop;
static atomic_ullong quota_refusals;

#define EXPECT(cond, ...)                                                                                      \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            atomic_fetch_add(&failures, 1);                                                                    \
            fprintf(stderr, "test_tenant_threads: %s:%d: ", __FILE__, __LINE__);                               \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, " [%s]\n", gp_last_error());                                                      \
        }                                                                                                      \
    } while (0)

static uint64_t next_random(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void *worker(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    unsigned t = id / THREADS_PER_TENANT;
    uint64_t rng = 0xABCDEFull * (id + 7);
    gp_stream stream = gp_sim_stream_create(sim);
    EXPECT(gp_tenant_push(pool, names[t]) == GP_OK, "push");
    struct { void *p; size_t size; uint64_t seed; } live[LIVE];
    int count = 0;
    for (int step = 0; step < STEPS; step++) {
        if (count < LIVE && next_random(&rng) % 2 == 0) {
            size_t size = 1 + (size_t)(next_random(&rng) % (3 * MIB));
            void *p = NULL;
            int rc = gp_alloc(pool, &p, size, stream);
            if (rc == GP_ERR_QUOTA || rc == GP_ERR_OOM) {
                atomic_fetch_add(&quota_refusals, 1);
                continue;
            }
            EXPECT(rc == GP_OK, "alloc %zu in %s: %d", size, names[t], rc);
            if (rc != GP_OK)
                continue;
            uint64_t seed = next_random(&rng);
            EXPECT(gp_sim_launch(sim, stream, p, size, GP_SIM_WRITE, seed, 500) == GP_OK, "write");
            live[count].p = p;
            live[count].size = size;
            live[count].seed = seed;
            count++;
        } else if (count > 0) {
            int i = (int)(next_random(&rng) % (unsigned)count);
            EXPECT(gp_sim_launch(sim, stream, live[i].p, live[i].size, GP_SIM_CHECK, live[i].seed, 500) == GP_OK,
                   "check");
            EXPECT(gp_free(pool, live[i].p, stream) == GP_OK, "free");
            live[i] = live[--count];
        }
        if (step % 64 == 0) {
            gp_tenant_stats s = {.size = sizeof s, .version = GP_TENANT_STATS_VERSION};
            EXPECT(gp_tenant_get_stats(pool, names[t], &s) == GP_OK, "stats");
            EXPECT(s.held_bytes <= max_high[t], "%s holds %llu > its largest max", names[t],
                   (unsigned long long)s.held_bytes);
            gp_sim_advance(sim, 2000);
        }
    }
    for (int i = 0; i < count; i++) {
        EXPECT(gp_sim_launch(sim, stream, live[i].p, live[i].size, GP_SIM_CHECK, live[i].seed, 500) == GP_OK, "check");
        EXPECT(gp_free(pool, live[i].p, stream) == GP_OK, "free");
    }
    EXPECT(gp_tenant_pop(pool) == GP_OK, "pop");
    return NULL;
}

/* Moves each tenant's max between half and all of its largest max while the workers run. */
static void *limiter(void *arg)
{
    (void)arg;
    uint64_t rng = 42;
    while (!atomic_load(&stop)) {
        unsigned t = (unsigned)(next_random(&rng) % TENANTS);
        gp_tenant_limits l = {max_high[t] / 2 + (size_t)(next_random(&rng) % (max_high[t] / 2 + 1)) / MIB * MIB, 0, 0};
        if (l.max < max_high[t] / 2)
            l.max = max_high[t] / 2;
        EXPECT(gp_tenant_set_limits(pool, names[t], &l) == GP_OK, "set_limits");
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(void)
{
    unsetenv("GPUPOOL_CONF");
    if (gp_pool_create(&pool, 0, "sim", "device_memory:1GiB") != GP_OK) {
        fprintf(stderr, "create: %s\n", gp_last_error());
        return 1;
    }
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    for (unsigned t = 0; t < TENANTS; t++) {
        gp_tenant_limits l = {max_high[t], 0, 0};
        EXPECT(gp_tenant_create(pool, names[t], &l) == GP_OK, "create %s", names[t]);
    }
    pthread_t threads[TENANTS * THREADS_PER_TENANT], lim;
    for (unsigned i = 0; i < TENANTS * THREADS_PER_TENANT; i++)
        pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)i);
    pthread_create(&lim, NULL, limiter, NULL);
    for (unsigned i = 0; i < TENANTS * THREADS_PER_TENANT; i++)
        pthread_join(threads[i], NULL);
    atomic_store(&stop, true);
    pthread_join(lim, NULL);
    gp_sim_synchronize(sim);

    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    size_t sum_max = 0;
    for (unsigned t = 0; t < TENANTS; t++)
        sum_max += max_high[t];
    EXPECT(r.allocated_peak <= sum_max, "the sim's peak %llu passed the sum of the maxes %zu",
           (unsigned long long)r.allocated_peak, sum_max);
    EXPECT(r.races == 0 && r.pattern_mismatches == 0 && r.bad_calls == 0, "sim: %s", gp_sim_first_violation(sim));
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    EXPECT(gp_get_stats(pool, &s) == GP_OK, "stats");
    size_t held = 0;
    gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
    EXPECT(gp_tenant_get_stats(pool, "default", &ts) == GP_OK, "stats");
    held += ts.held_bytes;
    for (unsigned t = 0; t < TENANTS; t++) {
        EXPECT(gp_tenant_get_stats(pool, names[t], &ts) == GP_OK, "stats");
        held += ts.held_bytes;
    }
    EXPECT(held == s.reserved_bytes, "tenants hold %zu, the pool reserves %llu", held,
           (unsigned long long)s.reserved_bytes);
    EXPECT(r.allocated_bytes == s.reserved_bytes, "the sim holds %llu, the pool reserves %llu",
           (unsigned long long)r.allocated_bytes, (unsigned long long)s.reserved_bytes);
    EXPECT(s.allocated_bytes == 0, "%llu bytes still allocated", (unsigned long long)s.allocated_bytes);
    printf("test_tenant_threads: %d threads in %d tenants, %llu allocations, %llu refused, sim peak %.1f MiB "
           "(sum of maxes %.1f MiB)\n",
           TENANTS * THREADS_PER_TENANT, TENANTS, (unsigned long long)s.num_allocs,
           (unsigned long long)atomic_load(&quota_refusals), (double)r.allocated_peak / MIB, (double)sum_max / MIB);
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK && leaks.live_blocks == 0, "destroy");
    gp_sim_get_report(sim, &r);
    EXPECT(r.leaked_bytes_at_close == 0 && r.leaked_events_at_close == 0, "leaks at close");
    gp_sim_release(sim);
    int failed = atomic_load(&failures);
    printf("%d passed, %d failed\n", failed == 0 ? 1 : 0, failed == 0 ? 0 : 1);
    return failed == 0 ? 0 : 1;
}
