/*
 * test_pause_threads.c — one model paused and resumed again and again, keeping its contents, while two
 * other models allocate, write, check and free on their own streams from threads of their own, on the
 * virtual memory sim; a plain program so that it also runs under ThreadSanitizer.
 *
 * The paused model's thread queues work on its blocks right before each pause (the pause must wait for
 * it: an unmap or a copy under a queued kernel is a bad call of the sim), frees one block while paused
 * (allowed) and checks that allocating is refused, then resumes and checks every block it still holds
 * with the pattern kernels. Checked at the end: no race, no pattern mismatch and no bad call in the
 * sim, gp_check clean, the tenants' held bytes add up to the pool's reserved bytes, no refusal other
 * than GP_ERR_OOM / GP_ERR_PAUSED where expected, no leak. Not a benchmark.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "expect.h"
#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)
#define SERVERS 2
#define THREADS_PER_SERVER 2
#define LIVE 10
#define NAPPER_BLOCKS 8
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STEPS 600
#define PAUSES 8
#else
#define STEPS 2500
#define PAUSES 24
#endif

static gp_pool *pool;
static gp_sim *sim;
static const char *servers[SERVERS] = {"serve-a", "serve-b"};
static atomic_bool napping_done;

static uint64_t next_random(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct live_block {
    void *p;
    size_t size;
    uint64_t seed;
} live_block;

/* A server's kernel on b: the whole block used (race-checked, contents not simulated), and its first
 * 4 KiB written or checked with b's pattern (enough to see another model's pause touch it; writing
 * whole blocks of megabytes would make this test a benchmark of the sim's patterns). */
static void use(gp_stream stream, live_block b, int op)
{
    size_t head = b.size < 4096 ? b.size : 4096;
    EXPECT(gp_sim_launch(sim, stream, b.p, head, op, b.seed, 400) == GP_OK, "pattern kernel");
    EXPECT(gp_sim_launch(sim, stream, b.p, b.size, GP_SIM_USE, 0, 400) == GP_OK, "kernel");
}

/* A serving model's thread: random sizes on its own stream, each block written and checked. It runs
 * until the napper is done, at least STEPS steps. */
static void *server(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    uint64_t rng = 0x5EEDull * (id + 3);
    gp_stream stream = gp_sim_stream_create(sim);
    EXPECT(gp_tenant_push(pool, servers[id / THREADS_PER_SERVER]) == GP_OK, "push");
    live_block live[LIVE];
    int count = 0;
    for (int step = 0; step < STEPS || !atomic_load(&napping_done); step++) {
        if (count < LIVE && next_random(&rng) % 2 == 0) {
            size_t size = 1 + (size_t)(next_random(&rng) % (5 * MIB));
            void *p = NULL;
            int rc = gp_alloc(pool, &p, size, stream);
            EXPECT(rc == GP_OK || rc == GP_ERR_OOM, "alloc %zu: %d", size, rc);
            if (rc != GP_OK)
                continue;
            uint64_t seed = next_random(&rng);
            use(stream, (live_block){p, size, seed}, GP_SIM_WRITE);
            live[count++] = (live_block){p, size, seed};
        } else if (count > 0) {
            int i = (int)(next_random(&rng) % (unsigned)count);
            use(stream, live[i], GP_SIM_CHECK);
            EXPECT(gp_free(pool, live[i].p, stream) == GP_OK, "free");
            live[i] = live[--count];
        }
        /* The GPU keeps pace with this thread: every 32 steps the clock moves by the work they queued
         * (two 400 ns kernels a step). At 1 us per 32 steps, as before, the streams fell ever further
         * behind (up to 1.9 million ops queued on one), and the sim's checks against queued work made
         * a run take from 1 s to over 280 s with the same code, depending on how long the napper took. */
        if (step % 32 == 0)
            gp_sim_advance(sim, 32 * 2 * 400);
    }
    for (int i = 0; i < count; i++) {
        use(stream, live[i], GP_SIM_CHECK);
        EXPECT(gp_free(pool, live[i].p, stream) == GP_OK, "free");
    }
    EXPECT(gp_tenant_pop(pool) == GP_OK, "pop");
    return NULL;
}

/* Fills the napper's empty slots with new blocks, each written. */
static void refill(gp_stream stream, live_block *blocks, uint64_t *rng)
{
    for (int i = 0; i < NAPPER_BLOCKS; i++) {
        if (blocks[i].p != NULL)
            continue;
        size_t size = 64 * 1024 + (size_t)(next_random(rng) % (3 * MIB));
        void *p = NULL;
        int rc = gp_alloc(pool, &p, size, stream);
        EXPECT(rc == GP_OK || rc == GP_ERR_OOM, "napper alloc %zu: %d", size, rc);
        if (rc != GP_OK)
            continue;
        blocks[i] = (live_block){p, size, next_random(rng)};
        EXPECT(gp_sim_launch(sim, stream, p, size, GP_SIM_WRITE, blocks[i].seed, 5000) == GP_OK, "napper write");
    }
}

/* The paused model: its work queued, then paused with its contents, one block freed while paused,
 * resumed, every block checked. */
static void *napper(void *arg)
{
    (void)arg;
    uint64_t rng = 77;
    gp_stream stream = gp_sim_stream_create(sim);
    EXPECT(gp_tenant_bind_stream(pool, "napper", stream) == GP_OK, "bind");
    live_block blocks[NAPPER_BLOCKS] = {{0}};
    for (int round = 0; round < PAUSES; round++) {
        refill(stream, blocks, &rng);
        int rc = gp_tenant_pause(pool, "napper", GP_PAUSE_KEEP_CONTENTS);
        EXPECT(rc == GP_OK, "pause: %d", rc);
        if (rc != GP_OK)
            break;
        void *x = NULL;
        EXPECT(gp_alloc(pool, &x, 4096, stream) == GP_ERR_PAUSED, "allocating in a paused tenant");
        int victim = (int)(next_random(&rng) % NAPPER_BLOCKS);
        if (blocks[victim].p != NULL) {
            EXPECT(gp_free(pool, blocks[victim].p, stream) == GP_OK, "free while paused");
            blocks[victim].p = NULL;
        }
        gp_sim_advance(sim, 3000);
        for (int tries = 0; (rc = gp_tenant_resume(pool, "napper")) == GP_ERR_OOM && tries < 1000; tries++)
            gp_sim_advance(sim, 1000); /* the servers hold the device for now */
        EXPECT(rc == GP_OK, "resume: %d", rc);
        if (rc != GP_OK)
            break;
        for (int i = 0; i < NAPPER_BLOCKS; i++)
            if (blocks[i].p != NULL)
                EXPECT(gp_sim_launch(sim, stream, blocks[i].p, blocks[i].size, GP_SIM_CHECK, blocks[i].seed, 2000) ==
                           GP_OK,
                       "napper check");
    }
    for (int i = 0; i < NAPPER_BLOCKS; i++)
        if (blocks[i].p != NULL)
            EXPECT(gp_free(pool, blocks[i].p, stream) == GP_OK, "napper free");
    atomic_store(&napping_done, true);
    return NULL;
}

int main(void)
{
    unsetenv("GPUPOOL_CONF");
    if (gp_pool_create(&pool, 0, "sim-vmm", "device_memory:512MiB") != GP_OK) {
        fprintf(stderr, "create: %s\n", gp_last_error());
        return 1;
    }
    sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    for (unsigned t = 0; t < SERVERS; t++)
        EXPECT(gp_tenant_create(pool, servers[t], NULL) == GP_OK, "create %s", servers[t]);
    EXPECT(gp_tenant_create(pool, "napper", NULL) == GP_OK, "create napper");
    pthread_t threads[SERVERS * THREADS_PER_SERVER], nap;
    for (unsigned i = 0; i < SERVERS * THREADS_PER_SERVER; i++)
        pthread_create(&threads[i], NULL, server, (void *)(uintptr_t)i);
    pthread_create(&nap, NULL, napper, NULL);
    pthread_join(nap, NULL);
    for (unsigned i = 0; i < SERVERS * THREADS_PER_SERVER; i++)
        pthread_join(threads[i], NULL);
    gp_sim_synchronize(sim);

    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    EXPECT(r.races == 0 && r.pattern_mismatches == 0 && r.bad_calls == 0, "sim: %llu races, %llu mismatches, "
           "%llu bad calls: %s", (unsigned long long)r.races, (unsigned long long)r.pattern_mismatches,
           (unsigned long long)r.bad_calls, gp_sim_first_violation(sim));
    EXPECT(gp_check(pool) == GP_OK, "gp_check");
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    EXPECT(gp_get_stats(pool, &s) == GP_OK, "stats");
    gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
    EXPECT(gp_tenant_get_stats(pool, "napper", &ts) == GP_OK, "stats");
    uint64_t pauses = ts.pauses;
    size_t held = ts.held_bytes;
    const char *others[] = {"default", "serve-a", "serve-b"};
    for (unsigned t = 0; t < 3; t++) {
        EXPECT(gp_tenant_get_stats(pool, others[t], &ts) == GP_OK, "stats");
        held += ts.held_bytes;
    }
    EXPECT(held == s.reserved_bytes, "tenants hold %zu, the pool reserves %llu", held,
           (unsigned long long)s.reserved_bytes);
    EXPECT(s.allocated_bytes == 0, "%llu bytes still allocated", (unsigned long long)s.allocated_bytes);
    EXPECT(pauses == PAUSES, "%llu pauses of %d", (unsigned long long)pauses, PAUSES);
    printf("test_pause_threads: %d pauses with contents beside %d serving threads, %llu allocations, "
           "%llu device synchronizes, %llu stream waits, %llu ops queued on one stream at most\n",
           PAUSES, SERVERS * THREADS_PER_SERVER, (unsigned long long)s.num_allocs,
           (unsigned long long)s.num_device_syncs, (unsigned long long)s.num_unmap_waits,
           (unsigned long long)r.deepest_queue);
    EXPECT(s.num_device_syncs == 0, "a pause synchronized the device");
    gp_leak_report leaks;
    EXPECT(gp_pool_destroy(pool, &leaks) == GP_OK && leaks.live_blocks == 0, "destroy");
    gp_sim_get_report(sim, &r);
    EXPECT(r.leaked_bytes_at_close == 0 && r.leaked_events_at_close == 0, "leaks at close");
    gp_sim_release(sim);
    int failed = failures;
    printf("%d passed, %d failed\n", failed == 0 ? 1 : 0, failed == 0 ? 0 : 1);
    return failed == 0 ? 0 : 1;
}
