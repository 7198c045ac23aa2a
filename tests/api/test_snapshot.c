/*
 * test_snapshot.c — the PyTorch-facing entry points through the public header: gp_snapshot_write
 * (bad input refused, changing nothing and leaving no file; the pickle's frame), gp_history_record,
 * gp_get_breakdown (small/large figures that add up to gp_stats), gp_reset_peaks, and
 * gp_release_unused (the window; a device free that fails loses nothing).
 * What the snapshot holds is checked by python/tests/test_snapshot.py with real readers.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)

static gp_pool *pool;

static void setup(void)
{
    unsetenv("GPUPOOL_CONF");
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", "device_memory:256MiB"), GP_OK, "%s", gp_last_error());
}

static void teardown(void)
{
    if (pool != NULL)
        gp_pool_destroy(pool, NULL);
}

static gp_stats stats_now(void)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK, "%s", gp_last_error());
    return s;
}

static size_t read_file(const char *path, unsigned char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

TestSuite(snapshot, .init = setup, .fini = teardown);
TestSuite(breakdown, .init = setup, .fini = teardown);
TestSuite(working_set, .init = setup, .fini = teardown);

Test(snapshot, bad_input_is_refused_and_leaves_no_file)
{
    char dir[] = "/tmp/gp_snap_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/s.pickle", dir);
    cr_assert_eq(gp_snapshot_write(NULL, 1, path, 0), GP_ERR_INVALID);
    cr_assert_eq(gp_snapshot_write(&pool, 0, path, 0), GP_ERR_INVALID);
    cr_assert_eq(gp_snapshot_write(&pool, 1, NULL, 0), GP_ERR_INVALID);
    cr_assert_eq(gp_snapshot_write(&pool, 1, "", 0), GP_ERR_INVALID);
    cr_assert_eq(gp_snapshot_write(&pool, 1, path, 0x10), GP_ERR_INVALID);
    cr_assert(strstr(gp_last_error(), "flags") != NULL, "%s", gp_last_error());
    gp_pool *two[2] = {pool, pool};
    cr_assert_eq(gp_snapshot_write(two, 2, path, 0), GP_ERR_INVALID);
    cr_assert(strstr(gp_last_error(), "device 0") != NULL, "%s", gp_last_error());
    cr_assert_eq(access(path, F_OK), -1, "no file after a refused call");
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no-such-dir/s.pickle", dir);
    cr_assert_eq(gp_snapshot_write(&pool, 1, bad, 0), GP_ERR_INVALID);
    cr_assert(strstr(gp_last_error(), bad) != NULL, "the message names the path: %s", gp_last_error());
    cr_assert_eq(gp_history_record(NULL, 10), GP_ERR_INVALID);
    cr_assert_eq(gp_history_record(pool, ((size_t)1 << 32) + 1), GP_ERR_INVALID);
    rmdir(dir);
}

Test(snapshot, writes_a_pickle_of_either_shape)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 5 * MIB, NULL), GP_OK);
    char dir[] = "/tmp/gp_snap_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], list[256];
    snprintf(path, sizeof path, "%s/s.pickle", dir);
    snprintf(list, sizeof list, "%s/l.pickle", dir);
    cr_assert_eq(gp_history_record(pool, 100), GP_OK);
    cr_assert_eq(gp_snapshot_write(&pool, 1, path, 0), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_snapshot_write(&pool, 1, list, GP_SNAPSHOT_LIST), GP_OK, "%s", gp_last_error());
    unsigned char buf[65536];
    size_t n = read_file(path, buf, sizeof buf);
    cr_assert_gt(n, 16);
    cr_assert_eq(buf[0], 0x80);
    cr_assert_eq(buf[1], 2);
    cr_assert_eq(buf[2], '}', "the dict of _snapshot()");
    cr_assert_eq(buf[n - 1], '.');
    n = read_file(list, buf, sizeof buf);
    cr_assert_eq(buf[2], ']', "the list of segments");
    cr_assert_eq(buf[n - 1], '.');
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_eq(access(tmp, F_OK), -1, "the temporary file is renamed away");
    unlink(path);
    unlink(list);
    rmdir(dir);
    gp_free(pool, p, NULL);
}

Test(snapshot, destroyed_pool_is_refused)
{
    gp_pool *dead;
    cr_assert_eq(gp_pool_create(&dead, 0, "sim", "device_memory:64MiB"), GP_OK);
    gp_pool_destroy(dead, NULL);
    cr_assert_eq(gp_snapshot_write(&dead, 1, "/tmp/never.pickle", 0), GP_ERR_DESTROYED);
    cr_assert_eq(gp_history_record(dead, 1), GP_ERR_DESTROYED);
    gp_breakdown b = {.size = sizeof b, .version = GP_BREAKDOWN_VERSION};
    cr_assert_eq(gp_get_breakdown(dead, &b), GP_ERR_DESTROYED);
    cr_assert_eq(gp_reset_peaks(dead), GP_ERR_DESTROYED);
    cr_assert_eq(gp_release_unused(dead, NULL), GP_ERR_DESTROYED);
    cr_assert_eq(access("/tmp/never.pickle", F_OK), -1);
}

Test(breakdown, small_and_large_add_up_to_the_pools_figures)
{
    void *a, *b, *c;
    cr_assert_eq(gp_alloc(pool, &a, 1000, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &b, 30 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &c, 3 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, c, NULL), GP_OK);
    gp_breakdown bad = {.size = sizeof bad, .version = 99};
    cr_assert_eq(gp_get_breakdown(pool, &bad), GP_ERR_INVALID);
    cr_assert_eq(gp_get_breakdown(pool, NULL), GP_ERR_INVALID);
    gp_breakdown k = {.size = sizeof k, .version = GP_BREAKDOWN_VERSION};
    cr_assert_eq(gp_get_breakdown(pool, &k), GP_OK, "%s", gp_last_error());
    gp_stats s = stats_now();
    cr_assert_eq(k.small.allocated_bytes, 1024);
    cr_assert_eq(k.large.allocated_bytes, 30 * MIB);
    cr_assert_eq(k.small.requested_bytes + k.large.requested_bytes, s.requested_bytes);
    cr_assert_eq(k.small.reserved_bytes + k.large.reserved_bytes, s.reserved_bytes);
    cr_assert_eq(k.small.segments + k.large.segments, s.segments);
    cr_assert_eq(k.large.num_allocs_total, 2);
    cr_assert_eq(k.large.num_frees_total, 1);
    cr_assert_eq(k.large.free_bytes_total, 3 * MIB);
    cr_assert_eq(k.small.inactive_split, 1, "the small segment's free rest");
    gp_free(pool, a, NULL);
    gp_free(pool, b, NULL);
}

Test(breakdown, reset_peaks_starts_again_from_now)
{
    void *a, *b;
    cr_assert_eq(gp_alloc(pool, &a, 40 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &b, 2 * MIB, NULL), GP_OK);
    cr_assert_eq(stats_now().allocated_bytes_peak, 40 * MIB);
    cr_assert_eq(gp_reset_peaks(pool), GP_OK);
    gp_stats s = stats_now();
    cr_assert_eq(s.allocated_bytes_peak, 2 * MIB);
    cr_assert_eq(s.reserved_bytes_peak, s.reserved_bytes);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    gp_free(pool, b, NULL);
}

Test(working_set, memory_unused_for_the_window_goes_back_and_a_failing_free_loses_nothing)
{
    void *big;
    cr_assert_eq(gp_alloc(pool, &big, 40 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, big, NULL), GP_OK);
    size_t released = 1;
    for (int i = 0; i < 8; i++) { /* the window fills; the 40 MiB segment is not used again */
        cr_assert_eq(gp_release_unused(pool, &released), GP_OK, "%s", gp_last_error());
        cr_assert_eq(released, 0, "call %d: nothing goes back before the window is full", i);
    }
    gp_sim *sim = gp_sim_of(pool);
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_MEM_FREE, GP_ERR_DEVICE);
    gp_stats before = stats_now();
    cr_assert_eq(gp_release_unused(pool, &released), GP_ERR_DEVICE, "the device's failure is reported");
    cr_assert_eq(stats_now().reserved_bytes, before.reserved_bytes, "nothing lost: it stays cached");
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    for (int i = 0; i < 8 && released == 0; i++)
        cr_assert_eq(gp_release_unused(pool, &released), GP_OK, "%s", gp_last_error());
    cr_assert_eq(released, 40 * MIB);
    cr_assert_eq(stats_now().reserved_bytes, 0);
}
