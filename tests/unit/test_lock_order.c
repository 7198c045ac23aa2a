/*
 * test_lock_order.c — the run-time check of the lock order (pool/base/lock_order.h): the order of
 * pool/README.md passes and leaves nothing held, each way of breaking it aborts before the lock is
 * taken, a trylock is never out of order, and releasing a lock not held aborts. Every other suite runs
 * with the check on too (builds with assertions), so the pool's own paths are checked wherever a test
 * drives them; this suite checks the checker. Skipped in builds without assertions, where it is off.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>

#include "base/lock_order.h"

#ifdef NDEBUG
#define SKIP_WITHOUT_ASSERTS() cr_skip_test("the lock order is checked only in builds with assertions")
#else
#define SKIP_WITHOUT_ASSERTS() (void)0
#endif

/* Each test runs in a process of its own that holds no lock yet: the check may be turned on there. */
static void check_on(void)
{
#ifndef NDEBUG
    gp_order_on = true;
#endif
}

TestSuite(lock_order, .init = check_on);

/* CTest runs every test with GPUPOOL_CHECK_LOCK_ORDER=1 (CMakeLists.txt), and the library reads it as
 * it loads: the whole suite runs with the check on (a suite of its own, without check_on). */
Test(lock_order_switch, ctest_turns_the_check_on)
{
    SKIP_WITHOUT_ASSERTS();
    const char *v = getenv("GPUPOOL_CHECK_LOCK_ORDER");
    if (v == NULL)
        cr_skip_test("run outside CTest");
    cr_assert_str_eq(v, "1");
#ifndef NDEBUG
    cr_assert(gp_order_on, "set as the library loaded");
#endif
    gp_order_lock(GP_RANK_STREAM, 0);
    cr_assert_eq(gp_order_held(), 1, "recorded");
    gp_order_unlock(GP_RANK_STREAM, 0);
}

Test(lock_order, the_documented_order_passes_and_leaves_nothing_held)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_POOL, 0);
    gp_order_lock(GP_RANK_STREAM, 0);
    gp_order_lock(GP_RANK_STREAM, 2);
    gp_order_lock(GP_RANK_STREAM, 7);
    gp_order_lock(GP_RANK_THREAD_CACHE, 0);
    gp_order_lock(GP_RANK_EVENT_POOL, 0);
    cr_assert_eq(gp_order_held(), 6);
    /* released in any order */
    gp_order_unlock(GP_RANK_THREAD_CACHE, 0);
    gp_order_unlock(GP_RANK_STREAM, 2);
    gp_order_unlock(GP_RANK_EVENT_POOL, 0);
    gp_order_unlock(GP_RANK_POOL, 0);
    gp_order_unlock(GP_RANK_STREAM, 7);
    gp_order_unlock(GP_RANK_STREAM, 0);
    cr_assert_eq(gp_order_held(), 0);
    /* a stream alone, then the pool once it is released: the fast path, then the slow path */
    gp_order_lock(GP_RANK_STREAM, 3);
    gp_order_unlock(GP_RANK_STREAM, 3);
    gp_order_lock(GP_RANK_POOL, 0);
    gp_order_unlock(GP_RANK_POOL, 0);
    cr_assert_eq(gp_order_held(), 0);
}

Test(lock_order, a_trylock_is_never_out_of_order)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_STREAM, 5);
    gp_order_locked(GP_RANK_STREAM, 1); /* a lower index, by trylock (gp_alias_unshare) */
    gp_order_locked(GP_RANK_POOL, 0);   /* the pool, by trylock (gp_free's maintenance) */
    gp_order_lock(GP_RANK_THREAD_CACHE, 0);
    gp_order_locked(GP_RANK_STREAM, 0); /* under a thread cache's lock, by trylock (its entry's victim) */
    cr_assert_eq(gp_order_held(), 5);
    gp_order_unlock(GP_RANK_STREAM, 0);
    gp_order_unlock(GP_RANK_THREAD_CACHE, 0);
    gp_order_unlock(GP_RANK_POOL, 0);
    gp_order_unlock(GP_RANK_STREAM, 1);
    gp_order_unlock(GP_RANK_STREAM, 5);
    cr_assert_eq(gp_order_held(), 0);
}

Test(lock_order, the_pool_lock_under_a_stream_lock_aborts, .signal = SIGABRT)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_STREAM, 0);
    gp_order_lock(GP_RANK_POOL, 0);
#ifndef NDEBUG
    cr_assert_fail("not reached");
#endif
}

Test(lock_order, a_lower_stream_index_under_a_higher_aborts, .signal = SIGABRT)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_POOL, 0);
    gp_order_lock(GP_RANK_STREAM, 4);
    gp_order_lock(GP_RANK_STREAM, 3);
#ifndef NDEBUG
    cr_assert_fail("not reached");
#endif
}

Test(lock_order, the_same_stream_twice_aborts, .signal = SIGABRT)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_STREAM, 4);
    gp_order_lock(GP_RANK_STREAM, 4);
#ifndef NDEBUG
    cr_assert_fail("not reached");
#endif
}

Test(lock_order, a_stream_under_a_thread_cache_aborts, .signal = SIGABRT)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_THREAD_CACHE, 0);
    gp_order_lock(GP_RANK_STREAM, 1);
#ifndef NDEBUG
    cr_assert_fail("not reached");
#endif
}

Test(lock_order, a_stream_under_the_event_pool_aborts, .signal = SIGABRT)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_EVENT_POOL, 0);
    gp_order_lock(GP_RANK_STREAM, 9);
#ifndef NDEBUG
    cr_assert_fail("not reached");
#endif
}

Test(lock_order, releasing_a_lock_not_held_aborts, .signal = SIGABRT)
{
    SKIP_WITHOUT_ASSERTS();
    gp_order_lock(GP_RANK_STREAM, 1);
    gp_order_unlock(GP_RANK_STREAM, 2);
#ifndef NDEBUG
    cr_assert_fail("not reached");
#endif
}

/* Every stream of a pool at once (gp_lock_all_streams; max_streams up to 65536): past the record's
 * room the locks are counted, and all of them are released without a false report. */
Test(lock_order, more_streams_than_the_record_holds)
{
    SKIP_WITHOUT_ASSERTS();
    const unsigned n = 2000;
    gp_order_lock(GP_RANK_POOL, 0);
    for (unsigned i = 0; i < n; i++)
        gp_order_lock(GP_RANK_STREAM, i);
    cr_assert_eq(gp_order_held(), n + 1);
    for (unsigned i = n; i-- > 0;)
        gp_order_unlock(GP_RANK_STREAM, i);
    gp_order_unlock(GP_RANK_POOL, 0);
    cr_assert_eq(gp_order_held(), 0);
}
