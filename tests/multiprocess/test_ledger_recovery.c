/*
 * test_ledger_recovery.c — the ledger when processes die and when it is not what it should be:
 *   1. a process killed (SIGKILL) while it holds device memory: its charges are reclaimed by the next
 *      process that needs them, which then gets the memory the dead one's charges would have refused;
 *   2. a process killed in the middle of an allocation (charged, device call not returned);
 *   3. a process killed holding the ledger's lock: the next one recovers the robust mutex;
 *   4. processes under load killed at random moments (mostly inside gp_alloc/gp_free): the others go
 *      on, and every charge of the dead is gone once the survivors have looked;
 *   5. a ledger of a wrong layout version, or of a wrong size, is refused with a message that says
 *      which, and is left as it was;
 *   6. a stale ledger from a crashed run (pools of dead processes, or made half-way) is recovered;
 *   7. a process killed but not yet reaped by its parent (a zombie: kill(pid, 0) still succeeds and its
 *      start time still matches) is dead to the ledger: its charges go at the next look, before the
 *      parent collects it.
 */
#include "mp_harness.h"

#include <fcntl.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "gpupool.h"

#define MIB (1ull << 20)

static gp_ledger *open_with_max(const char *test, char value[48], char shm[GP_LEDGER_NAME_MAX], const char *tenant,
                                uint64_t max)
{
    mp_ledger_name(test, value, shm);
    gp_ledger *l = NULL;
    CHECK(gp_ledger_open(&l, shm, 1ull << 30) == GP_OK, "%s", gp_last_error());
    if (tenant != NULL)
        CHECK(gp_ledger_set_budget(l, tenant, max, 0, 0, GP_LEDGER_SET_MAX) == GP_OK, "%s", gp_last_error());
    return l;
}

static void killed_holding_memory(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("kill", value, shm, "model", 128 * MIB);
    mp_worker victim = mp_start((char *[]){"", value, "sim-vmm", "hold", "model", "100663296", NULL}); /* 96 MiB */
    mp_read_line(&victim);
    CHECK(strncmp(victim.line, "held 100663296 rc 0", 19) == 0, "victim: '%s'", victim.line);
    CHECK(mp_tenant_held(l, "model") == 96 * MIB, "victim's charge is %llu", (unsigned long long)mp_tenant_held(l, "model"));
    mp_kill(&victim);
    /* The dead process still counts until someone looks: the next process needs 96 MiB of 128. */
    mp_worker next = mp_start((char *[]){"", value, "sim-vmm", "hold", "model", "100663296", NULL});
    mp_read_line(&next);
    CHECK(strncmp(next.line, "held 100663296 rc 0", 19) == 0, "the dead process's charges were not reclaimed: '%s'",
          next.line);
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, true);
    CHECK(v.reclaimed_pools == 1 && v.reclaimed_bytes == 96 * MIB, "reclaimed %llu pools, %llu bytes",
          (unsigned long long)v.reclaimed_pools, (unsigned long long)v.reclaimed_bytes);
    CHECK(mp_finish(&next) == 0, "next failed");
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static void killed_mid_allocation(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("midalloc", value, shm, "model", 64 * MIB);
    mp_worker victim = mp_start((char *[]){"", value, "-", "charge-then-die", "model", "62914560", NULL}); /* 60 MiB */
    mp_read_line(&victim);
    CHECK(strcmp(victim.line, "charged") == 0, "victim: '%s'", victim.line);
    mp_kill(&victim);
    mp_worker next = mp_start((char *[]){"", value, "sim", "hold", "model", "41943040", NULL}); /* 40 MiB */
    mp_read_line(&next);
    CHECK(strncmp(next.line, "held 41943040 rc 0", 18) == 0, "charges of a process killed mid-allocation stay: '%s'",
          next.line);
    CHECK(mp_finish(&next) == 0, "next failed");
    CHECK(mp_tenant_held(l, "model") == 0, "left behind: %llu", (unsigned long long)mp_tenant_held(l, "model"));
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static void killed_holding_the_lock(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("lock", value, shm, NULL, 0);
    mp_worker victim = mp_start((char *[]){"", value, "-", "lock-then-die", NULL});
    mp_read_line(&victim);
    CHECK(strcmp(victim.line, "locked") == 0, "victim: '%s'", victim.line);
    mp_kill(&victim);
    mp_worker next = mp_start((char *[]){"", value, "sim", "hold", "model", "20971520", NULL});
    mp_read_line(&next);
    CHECK(strncmp(next.line, "held 20971520 rc 0", 18) == 0, "after a lock holder died: '%s'", next.line);
    CHECK(mp_finish(&next) == 0, "next failed");
    static gp_ledger_view v;
    CHECK(gp_ledger_view_read(l, &v, true) == GP_OK, "locked view");
    CHECK(v.lock_recoveries == 1, "%llu lock recoveries", (unsigned long long)v.lock_recoveries);
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The state letter of /proc/PID/stat (the field after the last ')', since comm may hold ')'), or '?'. */
static char proc_state(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && p[2] != '\0' ? p[2] : '?';
}

static void killed_not_reaped(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("zombie", value, shm, "model", 64 * MIB);
    mp_worker victim = mp_start((char *[]){"", value, "-", "charge-then-die", "model", "62914560", NULL}); /* 60 MiB */
    mp_read_line(&victim);
    CHECK(strcmp(victim.line, "charged") == 0, "victim: '%s'", victim.line);
    CHECK(mp_tenant_held(l, "model") == 60 * MIB, "victim's charge is %llu",
          (unsigned long long)mp_tenant_held(l, "model"));
    kill(victim.pid, SIGKILL); /* and no waitpid yet: this process is a parent that has not collected it */
    char state = proc_state(victim.pid);
    for (double deadline = monotonic_s() + 30; state != 'Z' && monotonic_s() < deadline; state = proc_state(victim.pid))
        usleep(1000);
    CHECK(state == 'Z', "the killed victim is not a zombie within 30 s (state '%c')", state);
    CHECK(kill(victim.pid, 0) == 0, "kill(pid, 0) fails on the zombie: the case this test is about is not set up");
    gp_ledger_reclaim_dead(l);
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, true);
    CHECK(v.num_pools == 0 && v.device_held == 0 && v.reclaimed_pools == 1 && v.reclaimed_bytes == 60 * MIB,
          "an unreaped (zombie) process still counts: %u pools, %llu bytes charged, %llu pools / %llu bytes reclaimed",
          v.num_pools, (unsigned long long)v.device_held, (unsigned long long)v.reclaimed_pools,
          (unsigned long long)v.reclaimed_bytes);
    int status = mp_finish(&victim); /* reaped only now */
    CHECK(status == 128 + SIGKILL, "victim was not killed by SIGKILL (exit status %d)", status);
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static void killed_under_load(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("loadkill", value, shm, "model", 160 * MIB);
    mp_worker w[4];
    for (int i = 0; i < 4; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 101 + i);
        w[i] = mp_start((char *[]){"", value, i % 2 ? "sim-vmm" : "sim", "load", "model", i < 2 ? "0" : "4000",
                                   seed, NULL});
    }
    /* Workers 0 and 1 run until stdin closes, so they are still inside the pool when they are killed
     * (almost all of their time is spent in gp_alloc and gp_free), however late the kill comes: a
     * victim with a fixed number of iterations could finish, unregister cleanly and leave nothing to
     * reclaim on a loaded machine. They are killed once both are registered and hold device memory;
     * the wait is bounded by a deadline (not a count of naps), and a victim that never got there is a
     * failure of its own, not a wrong count below. */
    static gp_ledger_view seen;
    int ready = 0;
    for (double deadline = monotonic_s() + 60; ready < 2 && monotonic_s() < deadline;) {
        gp_ledger_view_read(l, &seen, false);
        ready = 0;
        for (unsigned i = 0; i < seen.num_pools; i++)
            ready += (seen.pools[i].pid == w[0].pid || seen.pools[i].pid == w[1].pid) && seen.pools[i].device_held > 0;
        if (ready < 2)
            usleep(1000);
    }
    CHECK(ready == 2, "only %d of the 2 victims registered and charged device memory within 60 s", ready);
    for (int i = 0; i < 2; i++) {
        int status = mp_kill(&w[i]); /* returns once the victim is reaped: no zombie is left to look alive */
        CHECK(status == 128 + SIGKILL, "victim %d was not killed by SIGKILL (exit status %d)", i, status);
    }
    for (int i = 2; i < 4; i++) {
        mp_read_line(&w[i]);
        CHECK(mp_finish(&w[i]) == 0, "survivor %d failed: '%s'", i, w[i].line);
    }
    gp_ledger_reclaim_dead(l);
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, true);
    CHECK(v.num_pools == 0 && v.device_held == 0, "after the kills: %u pools, %llu bytes still charged", v.num_pools,
          (unsigned long long)v.device_held);
    CHECK(v.reclaimed_pools == 2, "%llu pools reclaimed, 2 were killed", (unsigned long long)v.reclaimed_pools);
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

/* Overwrites 4 bytes at `offset` of the shm object / resizes it. */
static void poke(const char *shm, size_t offset, uint32_t value, off_t resize)
{
    int fd = shm_open(shm, O_RDWR, 0);
    CHECK(fd >= 0, "shm_open %s", shm);
    if (resize != 0)
        CHECK(ftruncate(fd, resize) == 0, "ftruncate");
    else
        CHECK(pwrite(fd, &value, sizeof value, (off_t)offset) == sizeof value, "pwrite");
    close(fd);
}

static int create_pool(const char *value, gp_pool **pool)
{
    char conf[256];
    snprintf(conf, sizeof conf, "backend:sim,device_memory:1GiB,ledger:%s", value);
    return gp_pool_create(pool, 0, NULL, conf);
}

static void wrong_layout(void)
{
    gp_pool *bad = NULL;
    CHECK(create_pool("no/slashes", &bad) == GP_ERR_CONFIG && bad == NULL &&
              strstr(gp_last_error(), "may hold only letters") != NULL,
          "a bad ledger name: %s", gp_last_error());
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("layout", value, shm, NULL, 0);
    gp_ledger_close(l);
    poke(shm, 8, 99, 0); /* the version field follows the 8-byte magic */
    gp_pool *pool = NULL;
    int rc = create_pool(value, &pool);
    CHECK(rc == GP_ERR_CONFIG && pool == NULL, "a version-99 ledger was accepted (rc %d)", rc);
    CHECK(strstr(gp_last_error(), "layout version 99") != NULL && strstr(gp_last_error(), "uses version 1") != NULL,
          "unclear message: %s", gp_last_error());
    fprintf(stderr, "wrong version: %s\n", gp_last_error());
    CHECK(gp_ledger_open_readonly(&l, shm) == GP_ERR_CONFIG, "read-only attach of a wrong version");
    /* Nothing changed: the object still says version 99. */
    int fd = shm_open(shm, O_RDONLY, 0);
    uint32_t version = 0;
    CHECK(fd >= 0 && pread(fd, &version, 4, 8) == 4 && version == 99, "the refused ledger was changed (%u)", version);
    close(fd);
    poke(shm, 8, GP_LEDGER_VERSION, 0);
    struct stat st;
    fd = shm_open(shm, O_RDONLY, 0);
    fstat(fd, &st);
    close(fd);
    poke(shm, 0, 0, st.st_size + 4096);
    rc = create_pool(value, &pool);
    CHECK(rc == GP_ERR_CONFIG && pool == NULL, "a ledger of the wrong size was accepted (rc %d)", rc);
    CHECK(strstr(gp_last_error(), "size") != NULL && strstr(gp_last_error(), "built differently") != NULL,
          "unclear message: %s", gp_last_error());
    fprintf(stderr, "wrong size: %s\n", gp_last_error());
    gp_ledger_unlink(shm);
    /* A ledger made for another device's capacity. */
    CHECK(gp_ledger_open(&l, shm, 2ull << 30) == GP_OK, "%s", gp_last_error());
    gp_ledger_close(l);
    rc = create_pool(value, &pool);
    CHECK(rc == GP_ERR_CONFIG && strstr(gp_last_error(), "one ledger per GPU") != NULL, "capacity: %s",
          gp_last_error());
    gp_ledger_unlink(shm);
}

static void stale_ledger(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    gp_ledger *l = open_with_max("stale", value, shm, "model", 64 * MIB);
    gp_ledger_close(l);
    /* A crashed run: a process registered, charged 60 MiB and died without a word. */
    mp_worker victim = mp_start((char *[]){"", value, "-", "charge-then-die", "model", "62914560", NULL});
    mp_read_line(&victim);
    mp_kill(&victim);
    gp_pool *pool = NULL;
    CHECK(create_pool(value, &pool) == GP_OK, "%s", gp_last_error()); /* attach reclaims */
    CHECK(gp_ledger_open_readonly(&l, shm) == GP_OK, "%s", gp_last_error());
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, false);
    CHECK(v.num_pools == 1 && v.reclaimed_pools == 1 && v.device_held == 0,
          "stale ledger: %u pools, %llu reclaimed, %llu bytes charged", v.num_pools,
          (unsigned long long)v.reclaimed_pools, (unsigned long long)v.device_held);
    gp_ledger_close(l);
    CHECK(gp_tenant_create(pool, "model", NULL) == GP_OK && gp_tenant_push(pool, "model") == GP_OK, "tenant");
    void *p = NULL;
    CHECK(gp_alloc(pool, &p, 60 * MIB, NULL) == GP_OK, "%s", gp_last_error());
    void *q = NULL;
    int rc = gp_alloc(pool, &q, 8 * MIB, NULL);
    CHECK(rc == GP_ERR_QUOTA && strstr(gp_last_error(), "'model'") != NULL && strstr(gp_last_error(), "pid") != NULL,
          "over the GPU-wide max: rc %d, %s", rc, gp_last_error());
    fprintf(stderr, "refusal: %s\n", gp_last_error());
    CHECK(gp_check(pool) == GP_OK, "%s", gp_last_error());
    gp_free(pool, p, NULL);
    gp_tenant_pop(pool);
    CHECK(gp_pool_destroy(pool, NULL) == GP_OK, "%s", gp_last_error());
    /* A ledger its maker left half-made: sized, no magic. */
    gp_ledger_unlink(shm);
    int fd = shm_open(shm, O_RDWR | O_CREAT, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)gp_ledger_layout_size()) == 0, "half-made ledger");
    close(fd);
    pool = NULL;
    CHECK(create_pool(value, &pool) == GP_OK, "a half-made ledger was not made again: %s", gp_last_error());
    if (pool != NULL)
        gp_pool_destroy(pool, NULL);
    gp_ledger_unlink(shm);
}

int main(void)
{
    killed_holding_memory();
    killed_mid_allocation();
    killed_holding_the_lock();
    killed_under_load();
    killed_not_reaped();
    wrong_layout();
    stale_ledger();
    if (mp_failures != 0) {
        fprintf(stderr, "test_ledger_recovery: %d checks failed\n", mp_failures);
        return 1;
    }
    printf("test_ledger_recovery: all checks passed\n");
    return 0;
}
