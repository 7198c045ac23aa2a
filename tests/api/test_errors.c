/*
 * test_errors.c — bad input through the public API: each gets a clear error and changes nothing.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* The counters that a call that fails must leave alone. */
static void assert_same(gp_stats a, gp_stats b)
{
    cr_assert_eq(a.allocated_bytes, b.allocated_bytes);
    cr_assert_eq(a.reserved_bytes, b.reserved_bytes);
    cr_assert_eq(a.active_blocks, b.active_blocks);
    cr_assert_eq(a.num_device_allocs, b.num_device_allocs);
    cr_assert_eq(a.num_frees, b.num_frees);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
}

static void assert_message(const char *needle)
{
    cr_assert(strstr(gp_last_error(), needle) != NULL, "message '%s' lacks '%s'", gp_last_error(), needle);
}

TestSuite(errors, .init = setup, .fini = teardown);

Test(errors, null_pool)
{
    void *p = (void *)1;
    cr_assert_eq(gp_alloc(NULL, &p, 64, NULL), GP_ERR_INVALID);
    cr_assert_null(p);
    assert_message("pool is NULL");
    cr_assert_eq(gp_free(NULL, (void *)0x1000, NULL), GP_ERR_INVALID);
    cr_assert_eq(gp_record_stream(NULL, (void *)0x1000, NULL), GP_ERR_INVALID);
    cr_assert_eq(gp_trim(NULL, 0, NULL), GP_ERR_INVALID);
    cr_assert_eq(gp_check(NULL), GP_ERR_INVALID);
    cr_assert_eq(gp_pool_destroy(NULL, NULL), GP_ERR_INVALID);
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(NULL, &s), GP_ERR_INVALID);
}

Test(errors, null_out_pointer)
{
    cr_assert_eq(gp_alloc(pool, NULL, 64, NULL), GP_ERR_INVALID);
    assert_message("out is NULL");
    cr_assert_eq(gp_pool_create(NULL, 0, "sim", NULL), GP_ERR_INVALID);
}

Test(errors, size_zero_returns_null_and_allocates_nothing)
{
    gp_stats before = stats_now();
    void *p = (void *)1;
    cr_assert_eq(gp_alloc(pool, &p, 0, NULL), GP_OK);
    cr_assert_null(p);
    cr_assert_eq(gp_free(pool, NULL, NULL), GP_OK, "freeing NULL is a no-op");
    assert_same(before, stats_now());
}

Test(errors, larger_than_the_device)
{
    gp_stats before = stats_now();
    void *p = (void *)1;
    cr_assert_eq(gp_alloc(pool, &p, 257 * MIB, NULL), GP_ERR_INVALID);
    cr_assert_null(p);
    assert_message("more than the device has");
    cr_assert_eq(gp_alloc(pool, &p, SIZE_MAX, NULL), GP_ERR_INVALID);
    cr_assert_eq(gp_alloc(pool, &p, SIZE_MAX - 100, NULL), GP_ERR_INVALID);
    assert_same(before, stats_now());
}

Test(errors, out_of_memory_says_what_and_why)
{
    void *a, *b = (void *)1;
    cr_assert_eq(gp_alloc(pool, &a, 200 * MIB, NULL), GP_OK, "%s", gp_last_error());
    gp_stats before = stats_now();
    cr_assert_eq(gp_alloc(pool, &b, 100 * MIB, NULL), GP_ERR_OOM);
    cr_assert_null(b);
    assert_message("out of device memory: requested 100.0 MiB on stream");
    assert_message("free on the device");
    gp_stats after = stats_now();
    cr_assert_eq(after.num_ooms, before.num_ooms + 1);
    cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
}

Test(errors, double_free)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 4096, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
    gp_stats before = stats_now();
    cr_assert_eq(gp_free(pool, p, NULL), GP_ERR_DOUBLE_FREE);
    assert_message("double free");
    assert_same(before, stats_now());
}

Test(errors, pointer_never_returned)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 4096, NULL), GP_OK); /* the pool has seen the stream */
    gp_stats before = stats_now();
    int host_variable;
    cr_assert_eq(gp_free(pool, &host_variable, NULL), GP_ERR_NOT_OWNED);
    assert_message("not allocated by this pool");
    assert_same(before, stats_now());
}

Test(errors, pointer_into_the_middle_of_a_block)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 8192, NULL), GP_OK);
    gp_stats before = stats_now();
    cr_assert_eq(gp_free(pool, (char *)p + 1024, NULL), GP_ERR_INTERIOR);
    assert_message("1024 bytes into the live block");
    assert_same(before, stats_now());
    cr_assert_eq(gp_record_stream(pool, (char *)p + 512, NULL), GP_ERR_INTERIOR);
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
}

Test(errors, free_on_a_stream_never_seen)
{
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 4096, NULL), GP_OK);
    gp_stats before = stats_now();
    cr_assert_eq(gp_free(pool, p, (gp_stream)0xdead0), GP_ERR_UNKNOWN_STREAM);
    assert_message("never used with this pool");
    assert_same(before, stats_now());
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK, "the block is still live and freeable");
}

Test(errors, bad_config)
{
    gp_pool *other = (gp_pool *)1;
    cr_assert_eq(gp_pool_create(&other, 0, "sim", "no_such_key:1"), GP_ERR_CONFIG);
    cr_assert_null(other);
    assert_message("no_such_key");
    cr_assert_eq(gp_pool_create(&other, 0, "sim", "small_size:big"), GP_ERR_CONFIG);
    assert_message("small_size");
    setenv("GPUPOOL_CONF", "device_memory:lots", 1);
    cr_assert_eq(gp_pool_create(&other, 0, "sim", NULL), GP_ERR_CONFIG);
    assert_message("GPUPOOL_CONF");
    unsetenv("GPUPOOL_CONF");
    cr_assert_eq(gp_pool_create(&other, 0, "opencl", NULL), GP_ERR_CONFIG);
    cr_assert_eq(gp_pool_create(&other, -1, "sim", NULL), GP_ERR_INVALID);
}

Test(errors, config_from_the_environment_is_overridden_by_the_string)
{
    setenv("GPUPOOL_CONF", "device_memory:64MiB", 1);
    gp_pool *other;
    cr_assert_eq(gp_pool_create(&other, 0, "sim", NULL), GP_OK, "%s", gp_last_error());
    void *p;
    cr_assert_eq(gp_alloc(other, &p, 100 * MIB, NULL), GP_ERR_INVALID, "the env's 64 MiB device applies");
    gp_pool_destroy(other, NULL);
    cr_assert_eq(gp_pool_create(&other, 0, "sim", "device_memory:128MiB"), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(other, &p, 100 * MIB, NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_free(other, p, NULL), GP_OK);
    gp_pool_destroy(other, NULL);
    unsetenv("GPUPOOL_CONF");
}

Test(errors, calls_after_destroy)
{
    gp_pool *dead = pool;
    pool = NULL;
    cr_assert_eq(gp_pool_destroy(dead, NULL), GP_OK);
    void *p = (void *)1;
    cr_assert_eq(gp_alloc(dead, &p, 64, NULL), GP_ERR_DESTROYED);
    cr_assert_null(p);
    assert_message("destroyed");
    cr_assert_eq(gp_free(dead, (void *)0x1000, NULL), GP_ERR_DESTROYED);
    cr_assert_eq(gp_trim(dead, 0, NULL), GP_ERR_DESTROYED);
    cr_assert_eq(gp_pool_destroy(dead, NULL), GP_ERR_DESTROYED);
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(dead, &s), GP_ERR_DESTROYED);
}

Test(errors, stats_version_mismatch)
{
    gp_stats s = {.size = 8, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &s), GP_ERR_INVALID);
    assert_message("version");
    char buf[8];
    cr_assert_eq(gp_stats_json(pool, NULL, 8, NULL), GP_ERR_INVALID);
    size_t needed = 0;
    cr_assert_eq(gp_stats_json(pool, buf, sizeof buf, &needed), GP_OK);
    cr_assert(needed >= sizeof buf, "the JSON does not fit in 8 bytes and says so");
    cr_assert_eq(buf[7], '\0');
}

Test(errors, strerror_covers_every_code)
{
    for (int code = 0; code >= GP_ERR_CORRUPT; code--)
        cr_assert_str_neq(gp_strerror(code), "unknown error", "code %d", code);
    cr_assert_str_eq(gp_strerror(12345), "unknown error");
}
