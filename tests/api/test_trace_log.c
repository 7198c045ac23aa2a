/*
 * test_trace_log.c — the pool's allocation log (config key log:PATH) read back by the trace reader:
 * every allocate, free and failed allocate of a run on the sim appears, in order, with the pointers
 * the pool returned, the sizes asked for and the streams used; and the log replays to the same peak.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpupool.h"
#include "gpupool_sim.h"
#include "replay.h"
#include "trace.h"

static void no_env_config(void)
{
    unsetenv("GPUPOOL_CONF");
}

Test(trace_log, pool_writes_a_replayable_log, .init = no_env_config)
{
    char path[] = "/tmp/gpupool_test_pool_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char conf[256];
    snprintf(conf, sizeof conf, "device_memory:1GiB,log:%s", path);
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", conf), GP_OK, "%s", gp_last_error());
    gp_stream s1 = gp_sim_stream_create(gp_sim_of(pool));

    /* first a failed allocation: 600 MiB cannot fit beside another 600 MiB on a 1 GiB device */
    void *big1, *big2;
    cr_assert_eq(gp_alloc(pool, &big1, (size_t)600 << 20, NULL), GP_OK, "%s", gp_last_error());
    int rc = gp_alloc(pool, &big2, (size_t)600 << 20, NULL);
    cr_assert_eq(rc, GP_ERR_OOM, "expected OOM, got %d (%s)", rc, gp_last_error());
    cr_assert_eq(gp_free(pool, big1, NULL), GP_OK, "%s", gp_last_error());

    enum { N = 64 };
    void *p[N];
    size_t sizes[N];
    gp_stream streams[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)(i + 1) * 7919u * (i % 3 == 0 ? 100u : 1u);
        streams[i] = (i % 2) ? s1 : NULL;
        cr_assert_eq(gp_alloc(pool, &p[i], sizes[i], streams[i]), GP_OK, "%s", gp_last_error());
    }
    for (int i = 0; i < N; i += 2)
        cr_assert_eq(gp_free(pool, p[i], streams[i]), GP_OK, "%s", gp_last_error());
    for (int i = 1; i < N; i += 2)
        cr_assert_eq(gp_free(pool, p[i], streams[i]), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());

    gp_trace t;
    char err[1024] = "";
    cr_assert_eq(gp_trace_read(&t, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num_allocs, N + 1, "allocations logged: %zu", t.num_allocs);
    cr_assert_eq(t.num_frees, N + 1, "frees logged: %zu", t.num_frees);
    cr_assert_eq(t.num_alloc_failures, 1, "allocate failures logged: %zu", t.num_alloc_failures);
    cr_assert_eq(t.unknown_frees, 0);
    cr_assert_eq(t.num_events, 2 * N + 3);
    cr_assert_eq(t.events[0].kind, GP_EV_ALLOC);
    cr_assert_eq(t.events[0].ptr, (uint64_t)(uintptr_t)big1);
    cr_assert_eq(t.events[1].kind, GP_EV_ALLOC_FAILURE);
    cr_assert_eq(t.events[1].size, (uint64_t)600 << 20);
    cr_assert_eq(t.events[2].kind, GP_EV_FREE);
    cr_assert_eq(t.events[2].slot, t.events[0].slot);
    for (int i = 0; i < N; i++) {
        const gp_trace_event *ev = &t.events[3 + i];
        cr_assert_eq(ev->kind, GP_EV_ALLOC);
        cr_assert_eq(ev->ptr, (uint64_t)(uintptr_t)p[i], "event %d: pointer 0x%llx, pool returned %p", i,
                     (unsigned long long)ev->ptr, p[i]);
        cr_assert_eq(ev->size, sizes[i], "event %d: size %llu, asked %zu", i, (unsigned long long)ev->size,
                     sizes[i]);
        cr_assert_eq(t.streams[ev->stream], (uint64_t)(uintptr_t)streams[i]);
    }
    for (size_t i = 1; i < t.num_events; i++)
        cr_assert_geq(t.events[i].time_us, t.events[i - 1].time_us);
    cr_assert_eq(t.end_live_bytes, 0);

    /* the log is a trace: it replays on a fresh pool to the same live peak */
    gp_replay_options opt = {.device_memory = "1GiB", .repeat = 1};
    gp_replay_result *r = malloc(sizeof *r);
    cr_assert_not_null(r);
    cr_assert_eq(gp_replay_run(&t, &opt, r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r->peak_live_bytes, t.peak_live_bytes);
    cr_assert_eq(r->failed_allocations, 0, "%s", r->first_failure);
    free(r);
    gp_trace_free(&t);
    unlink(path);
}
