/*
 * test_ledger_threads.c — the ledger under threads in one process (run under TSan: label threaded):
 * six pools (sim and sim-vmm, each its own simulated GPU) on one ledger, two threads per pool,
 * allocating and freeing at random in two tenants with GPU-wide maxima, while a sampler thread takes
 * locked views: no tenant is ever above its max, every pool's gp_check (which compares the pool with
 * the ledger) holds, the budgets were binding, and nothing is left charged at the end.
 */
#include "mp_harness.h"

#include <pthread.h>
#include <stdatomic.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB (1ull << 20)
#define POOLS 6
#define THREADS_PER_POOL 2

static char ledger_value[48], shm[GP_LEDGER_NAME_MAX];
static gp_pool *pools[POOLS];
static atomic_int running;
static atomic_ulong refused, over_max, samples, check_failures;

typedef struct job {
    int pool;
    unsigned seed;
    const char *tenant;
} job;

static void *worker(void *arg)
{
    job *j = arg;
    gp_pool *pool = pools[j->pool];
    gp_tenant_push(pool, j->tenant);
    gp_stream s = gp_sim_stream_create(gp_sim_of(pool));
    void *ptrs[16] = {0};
    for (int i = 0; i < 3000; i++) {
        unsigned slot = (unsigned)rand_r(&j->seed) % 16;
        if (ptrs[slot] != NULL) {
            gp_free(pool, ptrs[slot], s);
            ptrs[slot] = NULL;
            continue;
        }
        int rc = gp_alloc(pool, &ptrs[slot], (size_t)4096 << (rand_r(&j->seed) % 12), s);
        if (rc == GP_ERR_QUOTA)
            atomic_fetch_add(&refused, 1);
        else if (rc != GP_OK && rc != GP_ERR_OOM)
            fprintf(stderr, "gp_alloc: %s\n", gp_last_error());
        if (i % 200 == 0 && gp_check(pool) != GP_OK) {
            fprintf(stderr, "gp_check: %s\n", gp_last_error());
            atomic_fetch_add(&check_failures, 1);
        }
        if (i % 50 == 0)
            gp_maintain(pool, NULL);
    }
    for (int i = 0; i < 16; i++)
        if (ptrs[i] != NULL)
            gp_free(pool, ptrs[i], s);
    gp_tenant_pop(pool);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

static void *sampler(void *arg)
{
    gp_ledger *l = arg;
    static gp_ledger_view v;
    while (atomic_load(&running) > 0) {
        gp_ledger_view_read(l, &v, true);
        atomic_fetch_add(&samples, 1);
        for (unsigned t = 0; t < v.num_tenants; t++)
            if (v.tenants[t].max != 0 && v.tenants[t].held > v.tenants[t].max)
                atomic_fetch_add(&over_max, 1);
        usleep(200);
    }
    return NULL;
}

int main(void)
{
    mp_ledger_name("threads", ledger_value, shm);
    gp_ledger *l;
    CHECK(gp_ledger_open(&l, shm, 1ull << 30) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "left", 64 * MIB, 0, 0, GP_LEDGER_SET_MAX) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "right", 48 * MIB, 0, 0, GP_LEDGER_SET_MAX) == GP_OK, "%s", gp_last_error());
    for (int i = 0; i < POOLS; i++) {
        char conf[256];
        snprintf(conf, sizeof conf, "backend:%s,device_memory:1GiB,ledger:%s,ledger_wait:5ms",
                 i % 2 ? "sim-vmm" : "sim", ledger_value);
        CHECK(gp_pool_create(&pools[i], 0, NULL, conf) == GP_OK, "%s", gp_last_error());
        CHECK(gp_tenant_create(pools[i], "left", NULL) == GP_OK, "%s", gp_last_error());
        CHECK(gp_tenant_create(pools[i], "right", NULL) == GP_OK, "%s", gp_last_error());
    }
    if (mp_failures)
        return 1;
    pthread_t threads[POOLS * THREADS_PER_POOL], sample;
    job jobs[POOLS * THREADS_PER_POOL];
    atomic_store(&running, POOLS * THREADS_PER_POOL);
    pthread_create(&sample, NULL, sampler, l);
    for (int i = 0; i < POOLS * THREADS_PER_POOL; i++) {
        jobs[i] = (job){i / THREADS_PER_POOL, 7u + (unsigned)i, i % 2 ? "right" : "left"};
        pthread_create(&threads[i], NULL, worker, &jobs[i]);
    }
    for (int i = 0; i < POOLS * THREADS_PER_POOL; i++)
        pthread_join(threads[i], NULL);
    pthread_join(sample, NULL);
    for (int i = 0; i < POOLS; i++) {
        CHECK(gp_check(pools[i]) == GP_OK, "%s", gp_last_error());
        CHECK(gp_pool_destroy(pools[i], NULL) == GP_OK, "%s", gp_last_error());
    }
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, true);
    fprintf(stderr, "%lu samples, %lu refusals, %lu over max\n", atomic_load(&samples), atomic_load(&refused),
            atomic_load(&over_max));
    CHECK(atomic_load(&over_max) == 0, "a tenant was above its GPU-wide max");
    CHECK(atomic_load(&check_failures) == 0, "gp_check failed");
    CHECK(atomic_load(&refused) > 0, "no refusal: the budgets never bound");
    CHECK(v.num_pools == 0 && v.device_held == 0, "left behind: %u pools, %llu bytes", v.num_pools,
          (unsigned long long)v.device_held);
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
    if (mp_failures != 0)
        return 1;
    printf("test_ledger_threads: all checks passed\n");
    return 0;
}
