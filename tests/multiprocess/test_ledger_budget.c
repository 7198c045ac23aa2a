/*
 * test_ledger_budget.c — GPU-wide budgets across processes sharing one ledger, each process with its
 * own simulated GPU (ledger_worker):
 *   1. under concurrent load (four processes, two tenants, sim and sim-vmm), a sampler taking the
 *      ledger's lock sees the sum of a tenant's charges above its max at no instant, and the device's
 *      above its capacity at none; the budgets were binding (refusals seen), every worker's gp_check
 *      (which compares its pool with the ledger) held, and the ledger is empty afterwards;
 *   2. min across processes: a tenant's guaranteed memory cannot be taken by another process's growth,
 *      and is there when its owner asks for it;
 *   3. pressure: a process that needs memory another holds only as cache asks it to trim, and gets
 *      the memory within the bounded wait;
 *   4. high: growth past a tenant's GPU-wide high is not refused, but the processes holding its cache
 *      are asked to give it back, and do.
 */
#include "mp_harness.h"

#include "gpupool.h"

#define MIB (1ull << 20)

static void concurrent_budgets(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    mp_ledger_name("budget", value, shm);
    gp_ledger *l;
    CHECK(gp_ledger_open(&l, shm, 1ull << 30) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "alpha", 64 * MIB, 0, 0, GP_LEDGER_SET_MAX) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "beta", 48 * MIB, 0, 0, GP_LEDGER_SET_MAX) == GP_OK, "%s", gp_last_error());
    mp_worker w[4];
    const char *tenants[4] = {"alpha", "alpha", "beta", "beta"};
    const char *backends[4] = {"sim", "sim-vmm", "sim-vmm", "sim"};
    for (int i = 0; i < 4; i++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 17 + i);
        w[i] = mp_start((char *[]){"", value, (char *)backends[i], "load", (char *)tenants[i], "12000", seed, NULL});
    }
    /* The sampler: until every worker has printed its result. */
    unsigned long samples = 0, over = 0, device_over = 0;
    uint64_t seen_alpha = 0, seen_beta = 0;
    static gp_ledger_view v;
    int done[4] = {0}, remaining = 4;
    while (remaining > 0) {
        gp_ledger_view_read(l, &v, true);
        samples++;
        for (unsigned t = 0; t < v.num_tenants; t++) {
            if (v.tenants[t].max != 0 && v.tenants[t].held > v.tenants[t].max) {
                over++;
                fprintf(stderr, "tenant %s: held %llu > max %llu\n", v.tenants[t].name,
                        (unsigned long long)v.tenants[t].held, (unsigned long long)v.tenants[t].max);
            }
            if (strcmp(v.tenants[t].name, "alpha") == 0 && v.tenants[t].held > seen_alpha)
                seen_alpha = v.tenants[t].held;
            if (strcmp(v.tenants[t].name, "beta") == 0 && v.tenants[t].held > seen_beta)
                seen_beta = v.tenants[t].held;
        }
        device_over += v.device_held > v.capacity;
        usleep(200); /* the lock is not fair: a sampler that never lets go would starve the workers */
        if (getenv("MP_DEBUG") && samples % 100 == 0)
            fprintf(stderr, "sample %lu: %u pools, %u tenants, %llu charged\n", samples, v.num_pools, v.num_tenants,
                    (unsigned long long)v.device_held);
        for (int i = 0; i < 4; i++) {
            if (done[i])
                continue;
            int status;
            if (waitpid(w[i].pid, &status, WNOHANG) == w[i].pid) {
                mp_read_line(&w[i]);
                done[i] = 1;
                remaining--;
                int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                CHECK(code == 0, "worker %d (%s, %s) exited %d", i, tenants[i], backends[i], code);
                unsigned long ok = 0, quota = 0, oom = 0, other = 0;
                CHECK(sscanf(w[i].line, "ok %lu quota %lu oom %lu other %lu", &ok, &quota, &oom, &other) == 4,
                      "worker %d printed '%s'", i, w[i].line);
                CHECK(ok > 0, "worker %d allocated nothing", i);
                fprintf(stderr, "worker %d (%s, %s): %s\n", i, tenants[i], backends[i], w[i].line);
                close(w[i].from_child);
                close(w[i].to_child);
            }
        }
    }
    gp_ledger_view_read(l, &v, true);
    uint64_t refusals = v.refusals;
    fprintf(stderr, "sampler: %lu samples, highest held alpha %llu MiB (max 64), beta %llu MiB (max 48), "
                    "%llu refusals\n",
            samples, (unsigned long long)(seen_alpha / MIB), (unsigned long long)(seen_beta / MIB),
            (unsigned long long)refusals);
    CHECK(over == 0, "%lu samples saw a tenant above its max", over);
    /* The ledger's own peaks: the sum over processes, taken at every charge under the lock. */
    for (unsigned t = 0; t < v.num_tenants; t++)
        CHECK(v.tenants[t].max == 0 || v.tenants[t].peak <= v.tenants[t].max, "tenant %s peaked at %llu, max %llu",
              v.tenants[t].name, (unsigned long long)v.tenants[t].peak, (unsigned long long)v.tenants[t].max);
    CHECK(device_over == 0, "%lu samples saw the device above its capacity", device_over);
    CHECK(samples > 10, "only %lu samples", samples);
    CHECK(refusals > 0, "no charge was refused: the budgets never bound, so the test proved nothing");
    CHECK(v.num_pools == 0 && v.device_held == 0, "after the workers: %u pools, %llu bytes still charged",
          v.num_pools, (unsigned long long)v.device_held);
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static void min_across_processes(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    mp_ledger_name("min", value, shm);
    gp_ledger *l;
    CHECK(gp_ledger_open(&l, shm, 1ull << 30) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "guarded", 0, 0, 384 * MIB, GP_LEDGER_SET_MIN) == GP_OK, "%s", gp_last_error());
    /* The guarded tenant's process holds 64 MiB; a greedy one in another process takes what it can. */
    mp_worker guard = mp_start((char *[]){"", value, "sim-vmm", "hold", "guarded", "67108864", NULL});
    mp_read_line(&guard);
    CHECK(strncmp(guard.line, "held 67108864 rc 0", 18) == 0, "guard: '%s'", guard.line);
    mp_worker greedy = mp_start((char *[]){"", value, "sim", "grab", "greedy", NULL});
    mp_read_line(&greedy);
    unsigned long long grabbed = 0;
    int rc = 0;
    CHECK(sscanf(greedy.line, "grabbed %llu rc %d", &grabbed, &rc) == 2, "greedy: '%s'", greedy.line);
    /* 1 GiB device: 64 MiB held by guarded, 320 MiB more owed to it: greedy stops at 640 MiB. */
    CHECK(rc == GP_ERR_OOM, "greedy stopped with %d, not GP_ERR_OOM", rc);
    CHECK(grabbed <= 640 * MIB && grabbed >= 600 * MIB, "greedy grabbed %llu MiB (the min leaves it 640)",
          grabbed / MIB);
    /* The guarded tenant gets its minimum in a third process while greedy still holds everything. */
    mp_worker more = mp_start((char *[]){"", value, "sim-vmm", "hold", "guarded", "322961408", NULL}); /* 308 MiB */
    mp_read_line(&more);
    CHECK(strncmp(more.line, "held 322961408 rc 0", 19) == 0, "guarded's second process: '%s'", more.line);
    CHECK(mp_finish(&more) == 0, "second guarded process failed");
    CHECK(mp_finish(&greedy) == 0, "greedy failed");
    CHECK(mp_finish(&guard) == 0, "guard failed");
    CHECK(mp_tenant_held(l, "guarded") == 0 && mp_tenant_held(l, "greedy") == 0, "charges left behind");
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static void pressure_trims_another_process(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    mp_ledger_name("pressure", value, shm);
    gp_ledger *l;
    CHECK(gp_ledger_open(&l, shm, 1ull << 30) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "shared", 256 * MIB, 0, 0, GP_LEDGER_SET_MAX) == GP_OK, "%s", gp_last_error());
    /* One process leaves 200 MiB of "shared" cached; another then needs 128 MiB of it. */
    mp_worker holder = mp_start((char *[]){"", value, "sim", "cache", "shared", "209715200", NULL});
    mp_read_line(&holder);
    CHECK(strncmp(holder.line, "held 209715200 rc 0", 19) == 0, "holder: '%s'", holder.line);
    CHECK(mp_tenant_held(l, "shared") >= 200 * MIB, "the holder's cache is not charged");
    setenv("GPUPOOL_TEST_WAIT", "5s", 1); /* bounded; the holder answers within milliseconds */
    mp_worker asker = mp_start((char *[]){"", value, "sim-vmm", "hold", "shared", "134217728", NULL});
    unsetenv("GPUPOOL_TEST_WAIT");
    mp_read_line(&asker);
    CHECK(strncmp(asker.line, "held 134217728 rc 0", 19) == 0,
          "the asker did not get memory the other process held only as cache: '%s'", asker.line);
    static gp_ledger_view v;
    gp_ledger_view_read(l, &v, true);
    CHECK(v.pressure_asks > 0, "nobody was asked to trim");
    CHECK(mp_tenant_held(l, "shared") <= 256 * MIB, "over max");
    CHECK(mp_finish(&asker) == 0, "asker failed");
    CHECK(mp_finish(&holder) == 0, "holder failed");
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

static void high_asks_holders_to_trim(void)
{
    char value[48], shm[GP_LEDGER_NAME_MAX];
    mp_ledger_name("high", value, shm);
    gp_ledger *l;
    CHECK(gp_ledger_open(&l, shm, 1ull << 30) == GP_OK, "%s", gp_last_error());
    CHECK(gp_ledger_set_budget(l, "served", 0, 64 * MIB, 0, GP_LEDGER_SET_HIGH) == GP_OK, "%s", gp_last_error());
    mp_worker holder = mp_start((char *[]){"", value, "sim", "cache", "served", "62914560", NULL}); /* 60 MiB */
    mp_read_line(&holder);
    CHECK(strncmp(holder.line, "held 62914560 rc 0", 18) == 0, "holder: '%s'", holder.line);
    uint64_t before = mp_tenant_held(l, "served");
    mp_worker grower = mp_start((char *[]){"", value, "sim-vmm", "hold", "served", "33554432", NULL}); /* 32 MiB */
    mp_read_line(&grower);
    CHECK(strncmp(grower.line, "held 33554432 rc 0", 18) == 0, "growth past high was refused: '%s'", grower.line);
    uint64_t after = mp_tenant_held(l, "served");
    for (int i = 0; i < 2000 && after > 64 * MIB; i++) { /* the holder answers within milliseconds */
        usleep(1000);
        after = mp_tenant_held(l, "served");
    }
    CHECK(after <= 64 * MIB, "held %llu MiB (before %llu MiB): the holder did not give its cache back",
          (unsigned long long)(after / MIB), (unsigned long long)(before / MIB));
    CHECK(mp_finish(&grower) == 0, "grower failed");
    CHECK(mp_finish(&holder) == 0, "holder failed");
    gp_ledger_close(l);
    gp_ledger_unlink(shm);
}

int main(void)
{
    concurrent_budgets();
    min_across_processes();
    pressure_trims_another_process();
    high_asks_holders_to_trim();
    if (mp_failures != 0) {
        fprintf(stderr, "test_ledger_budget: %d checks failed\n", mp_failures);
        return 1;
    }
    printf("test_ledger_budget: all checks passed\n");
    return 0;
}
