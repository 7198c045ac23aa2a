/*
 * ledger_worker.c — the small program the multi-process tests fork and exec: one process with its own
 * simulated GPU and one pool on a shared ledger, doing one thing the test asks for and printing one
 * line of results on stdout. Not a test itself.
 *
 *   ledger_worker LEDGER BACKEND load TENANT ITERATIONS SEED
 *       random allocations and frees (1 KiB .. 16 MiB, up to 32 live) in TENANT; prints
 *       "ok N quota N oom N" and exits 0 when gp_check held throughout and the pool was destroyed clean;
 *       ITERATIONS 0: until stdin closes (a victim the test kills: it cannot have finished and left the
 *       ledger on its own before the kill, however slowly the test gets to it)
 *   ledger_worker LEDGER BACKEND hold TENANT BYTES
 *       allocates BYTES in 2 MiB pieces, prints "held N rc CODE", then waits (calling gp_maintain every
 *       millisecond, so it answers requests to trim) until stdin closes; frees, destroys, exits 0
 *   ledger_worker LEDGER BACKEND cache TENANT BYTES
 *       as hold, but frees everything at once: the memory stays cached (held, not live)
 *   ledger_worker LEDGER BACKEND grab TENANT
 *       allocates 2 MiB pieces until refused; prints "grabbed N rc CODE", then waits as hold does
 *   ledger_worker LEDGER - charge-then-die TENANT BYTES
 *       charges the ledger directly as a pool does before its device call, prints "charged", and
 *       sleeps: the test kills it there, in the middle of an allocation
 *   ledger_worker LEDGER - lock-then-die
 *       takes the ledger's lock, prints "locked", and sleeps until killed
 * The device has 1 GiB; the ledger's name comes from the test (one per test, so that parallel CTest
 * runs do not collide). GPUPOOL_TEST_WAIT overrides ledger_wait.
 */
#define _DEFAULT_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include "gpupool.h"
#include "gpupool_sim.h"
#include "provider/ledger.h"

static int pool_for(gp_pool **pool, const char *ledger, const char *backend)
{
    char conf[512];
    const char *wait = getenv("GPUPOOL_TEST_WAIT");
    snprintf(conf, sizeof conf, "backend:%s,device_memory:1GiB,ledger:%s,ledger_wait:%s", backend, ledger,
             wait != NULL ? wait : "50ms");
    int rc = gp_pool_create(pool, 0, NULL, conf);
    if (rc != GP_OK)
        fprintf(stderr, "worker %d: gp_pool_create(%s): %s\n", (int)getpid(), conf, gp_last_error());
    return rc;
}

static int enter_tenant(gp_pool *pool, const char *tenant)
{
    if (strcmp(tenant, "default") == 0)
        return GP_OK;
    int rc = gp_tenant_create(pool, tenant, NULL);
    if (rc == GP_OK)
        rc = gp_tenant_push(pool, tenant);
    if (rc != GP_OK)
        fprintf(stderr, "worker: tenant %s: %s\n", tenant, gp_last_error());
    return rc;
}

/* Has stdin closed (the test ended this worker, or died itself)? Does not block. */
static bool stdin_closed(void)
{
    fd_set set;
    FD_ZERO(&set);
    FD_SET(0, &set);
    struct timeval tv = {0, 0};
    char c;
    return select(1, &set, NULL, NULL, &tv) > 0 && read(0, &c, 1) <= 0;
}

/* Waits for stdin to close, answering other processes' requests to trim meanwhile. */
static void wait_for_stdin(gp_pool *pool)
{
    fd_set set;
    for (;;) {
        FD_ZERO(&set);
        FD_SET(0, &set);
        struct timeval tv = {0, 1000};
        if (select(1, &set, NULL, NULL, &tv) > 0) {
            char c;
            if (read(0, &c, 1) <= 0)
                return;
        }
        gp_maintain(pool, NULL);
    }
}

static int finish(gp_pool *pool, void **ptrs, size_t n, gp_stream s)
{
    for (size_t i = 0; i < n; i++)
        if (ptrs[i] != NULL)
            gp_free(pool, ptrs[i], s);
    int rc = gp_check(pool);
    if (rc != GP_OK)
        fprintf(stderr, "worker %d: gp_check: %s\n", (int)getpid(), gp_last_error());
    gp_leak_report leaks;
    int drc = gp_pool_destroy(pool, &leaks);
    return rc == GP_OK && drc == GP_OK && leaks.live_blocks == 0 ? 0 : 1;
}

static int run_load(const char *ledger, const char *backend, const char *tenant, long iterations, unsigned seed)
{
    gp_pool *pool;
    if (pool_for(&pool, ledger, backend) != GP_OK || enter_tenant(pool, tenant) != GP_OK)
        return 1;
    gp_stream s = gp_sim_stream_create(gp_sim_of(pool));
    enum { LIVE = 32 };
    void *ptrs[LIVE] = {0};
    unsigned long ok = 0, quota = 0, oom = 0, other = 0;
    int checked = 0;
    for (long i = 0; iterations == 0 || i < iterations; i++) {
        if (iterations == 0 && i % 64 == 0 && stdin_closed())
            break;
        unsigned slot = (unsigned)rand_r(&seed) % LIVE;
        if (ptrs[slot] != NULL) {
            gp_free(pool, ptrs[slot], s);
            ptrs[slot] = NULL;
            continue;
        }
        size_t size = (size_t)1024 << (rand_r(&seed) % 15); /* 1 KiB .. 16 MiB */
        int rc = gp_alloc(pool, &ptrs[slot], size, s);
        ok += rc == GP_OK;
        quota += rc == GP_ERR_QUOTA;
        oom += rc == GP_ERR_OOM;
        other += rc != GP_OK && rc != GP_ERR_QUOTA && rc != GP_ERR_OOM;
        if (rc != GP_OK && rc != GP_ERR_QUOTA && rc != GP_ERR_OOM)
            fprintf(stderr, "worker %d: gp_alloc: %s\n", (int)getpid(), gp_last_error());
        if (i % 64 == 0)
            gp_maintain(pool, NULL);
        if (i % 512 == 0 && gp_check(pool) != GP_OK) {
            fprintf(stderr, "worker %d: gp_check: %s\n", (int)getpid(), gp_last_error());
            checked = 1;
        }
    }
    printf("ok %lu quota %lu oom %lu other %lu\n", ok, quota, oom, other);
    fflush(stdout);
    return finish(pool, ptrs, LIVE, s) | checked | (other != 0);
}

static int run_hold(const char *ledger, const char *backend, const char *tenant, size_t bytes, int mode)
{
    gp_pool *pool;
    if (pool_for(&pool, ledger, backend) != GP_OK || enter_tenant(pool, tenant) != GP_OK)
        return 1;
    gp_stream s = gp_sim_stream_create(gp_sim_of(pool));
    size_t n = mode == 2 ? 512 : bytes / (2u << 20);
    void **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    size_t got = 0;
    int rc = GP_OK;
    for (size_t i = 0; i < n; i++) {
        rc = gp_alloc(pool, &ptrs[i], 2u << 20, s);
        if (rc != GP_OK) {
            fprintf(stderr, "worker %d: %s\n", (int)getpid(), gp_last_error());
            break;
        }
        got += 2u << 20;
    }
    if (mode == 1) /* cache: free everything; the pool keeps it */
        for (size_t i = 0; i < n; i++)
            if (ptrs[i] != NULL) {
                gp_free(pool, ptrs[i], s);
                ptrs[i] = NULL;
            }
    gp_maintain(pool, NULL); /* publishes: live and cached as of now */
    printf("%s %zu rc %d\n", mode == 2 ? "grabbed" : "held", got, rc);
    fflush(stdout);
    wait_for_stdin(pool);
    int st = finish(pool, ptrs, n, s);
    free(ptrs);
    return st;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: ledger_worker LEDGER BACKEND MODE ARGS (see the file's header)\n");
        return 2;
    }
    const char *ledger = argv[1], *backend = argv[2], *mode = argv[3];
    if (strcmp(mode, "load") == 0 && argc == 7)
        return run_load(ledger, backend, argv[4], atol(argv[5]), (unsigned)atol(argv[6]));
    if (strcmp(mode, "hold") == 0 && argc == 6)
        return run_hold(ledger, backend, argv[4], (size_t)atoll(argv[5]), 0);
    if (strcmp(mode, "cache") == 0 && argc == 6)
        return run_hold(ledger, backend, argv[4], (size_t)atoll(argv[5]), 1);
    if (strcmp(mode, "grab") == 0 && argc == 5)
        return run_hold(ledger, backend, argv[4], 0, 2);
    char shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l;
    if (gp_ledger_shm_name(ledger, 0, NULL, shm) != GP_OK || gp_ledger_open(&l, shm, 1ull << 30) != GP_OK) {
        fprintf(stderr, "worker: %s\n", gp_last_error());
        return 1;
    }
    if (strcmp(mode, "charge-then-die") == 0 && argc == 6) {
        unsigned slot, tenant;
        if (gp_ledger_register(l, 0, &slot) != GP_OK || gp_ledger_tenant(l, argv[4], &tenant) != GP_OK ||
            gp_ledger_charge(l, slot, tenant, (uint64_t)atoll(argv[5]), (uint64_t)atoll(argv[5]), NULL) != GP_OK) {
            fprintf(stderr, "worker: %s\n", gp_last_error());
            return 1;
        }
        printf("charged\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    if (strcmp(mode, "lock-then-die") == 0) {
        gp_ledger_test_hold_lock(l);
        printf("locked\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    fprintf(stderr, "ledger_worker: unknown mode or wrong arguments: %s\n", mode);
    return 2;
}
