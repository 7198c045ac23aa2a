/*
 * test_biased_lock_threads.c — the biased lock (pool/base/biased_lock.h), as a plain program so that
 * ThreadSanitizer runs it too.
 *
 * One owner thread and two other threads update the same plain (non-atomic) data under the lock: two
 * counters that a holder moves apart and back together, so a second holder inside at the same time
 * sees them apart (and TSan sees the unordered accesses), and a total that loses updates. Phases:
 * others rare (the owner keeps its bias and the others pay the heavy barrier); others once in 16 of
 * the owner's takes (the bias is given up, the lock is a spin lock); the owner alone (the bias comes back); others rare
 * while the heavy barrier is refused as the kernel can refuse it (ENOMEM, with and without the global
 * barrier to fall back on; EPERM); others once in 4 windows with barriers so slow that the bias no
 * longer pays (given up); then with the bias disabled for the process (the fallback where
 * membarrier is missing). Where this kernel has no membarrier the bias checks are skipped, with a
 * message; the exclusion checks run.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#include "base/biased_lock.h"

#include "../stress/expect.h"

static gp_biased_lock lock;
static long total;         /* every holder adds 1 */
static long left, right;   /* equal whenever nobody is inside */
static atomic_bool stop;
static atomic_long apart;  /* holders that found left != right */

/* The others stay inside long (microseconds) and the owner briefly, so that an owner that came in
 * while another is inside would almost surely be seen: it takes the lock thousands of times a
 * millisecond. */
#define OWNER_SPIN 20
#define OTHER_SPIN 20000

static void critical_section(int spin)
{
    if (left != right)
        atomic_fetch_add(&apart, 1);
    left++;
    for (volatile int i = 0; i < spin; i++) {
    }
    total++;
    if (left != right + 1)
        atomic_fetch_add(&apart, 1);
    right++;
}

typedef struct {
    bool rare; /* take only with a ticket from the owner; else all the time */
    long takes;
} other_args;

/* Rare takes: the owner hands out one ticket per `every` of its takes, and only when the last one was
 * used, so the others come at most that often however the threads are scheduled. RARE: once in 32
 * windows of the owner, which the bias pays for with barriers up to 65 us (biased_lock.h). */
#define RARE (32 * GP_BL_WINDOW)
static atomic_int tickets;

static void *other_thread(void *arg)
{
    other_args *a = arg;
    while (!atomic_load(&stop)) {
        if (a->rare) {
            int have = atomic_load(&tickets);
            if (have == 0 || !atomic_compare_exchange_weak(&tickets, &have, have - 1)) {
                sched_yield();
                continue;
            }
        }
        gp_biased_lock_take_other(&lock);
        critical_section(OTHER_SPIN);
        gp_biased_lock_drop(&lock, GP_BL_OTHER);
        a->takes++;
        sched_yield();
    }
    return NULL;
}

typedef struct {
    bool biased_at_end;
    long unbiased_takes; /* owner takes that found the lock a plain spin lock */
    unsigned heavy;      /* other takes that paid the heavy barrier */
} phase_result;

/* The owner takes the lock `takes` times while two other threads take it, once per `every` owner
 * takes at most, or all the time (every 0); with `wait`, exactly once per `every`: the owner waits for
 * each ticket to be used, so the rate does not depend on how the threads are scheduled. Checks that no
 * update was lost and that no holder found another inside. */
static phase_result phase(const char *name, long takes, long every, bool wait)
{
    bool rare = every != 0;
    phase_result r = {false, 0, 0};
    long before = total;
    unsigned heavy_before = atomic_load(&lock.heavy_takes);
    atomic_store(&stop, false);
    atomic_store(&tickets, 0);
    other_args args[2] = {{rare, 0}, {rare, 0}};
    pthread_t others[2];
    for (int i = 0; i < 2; i++)
        EXPECT(pthread_create(&others[i], NULL, other_thread, &args[i]) == 0, "%s: pthread_create", name);
    long fast = 0;
    for (long i = 0; i < takes; i++) {
        gp_bl_hold how = gp_biased_lock_take_owner(&lock);
        fast += how == GP_BL_FAST;
        r.unbiased_takes += !atomic_load_explicit(&lock.biased, memory_order_relaxed);
        critical_section(OWNER_SPIN);
        gp_biased_lock_drop(&lock, how);
        if (rare && i % every == 0 && atomic_load(&tickets) == 0)
            atomic_store(&tickets, 1);
        while (wait && atomic_load(&tickets) != 0)
            sched_yield();
        if (i % 64 == 0)
            sched_yield(); /* let the others in on a single CPU too */
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(others[i], NULL);
    long expected = takes + args[0].takes + args[1].takes;
    EXPECT(total - before == expected, "%s: %ld updates made under the lock, %ld counted: two holders at once",
           name, expected, total - before);
    EXPECT(left == right, "%s: the two counters differ at rest (%ld, %ld)", name, left, right);
    EXPECT(atomic_load(&apart) == 0, "%s: %ld holders found another inside", name, atomic_load(&apart));
    r.heavy = atomic_load(&lock.heavy_takes) - heavy_before;
    r.biased_at_end = atomic_load(&lock.biased);
    printf("%s: owner %ld takes (%ld on the fast path, %ld unbiased), others %ld (%u through the heavy barrier)\n",
           name, takes, fast, r.unbiased_takes, args[0].takes + args[1].takes, r.heavy);
    return r;
}

/* A heavy barrier that fails as the kernel can: the first `refusals` expedited calls fail with
 * `refusal_errno`, the global one fails with ENOSYS while global_fails; everything else goes to the
 * real call (so that a success is a real barrier). Counts every command it sees. */
static gp_membarrier_fn real_membarrier;
static atomic_int refusals, refusal_errno;
static atomic_bool global_fails;
static atomic_int seen_expedited, seen_register, seen_global;

static long flaky_membarrier(int cmd)
{
    if (cmd == MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        atomic_fetch_add(&seen_expedited, 1);
        if (atomic_load(&refusals) > 0) {
            atomic_fetch_sub(&refusals, 1);
            errno = atomic_load(&refusal_errno);
            return -1;
        }
    } else if (cmd == MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
        atomic_fetch_add(&seen_register, 1);
    } else if (cmd == MEMBARRIER_CMD_GLOBAL) {
        atomic_fetch_add(&seen_global, 1);
        if (atomic_load(&global_fails)) {
            errno = ENOSYS;
            return -1;
        }
    }
    return real_membarrier(cmd);
}

/* A real barrier that takes 2 ms. */
static long slow_membarrier(int cmd)
{
    long rc = real_membarrier(cmd);
    if (cmd == MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
    return rc;
}

/* Others rare while the barrier is refused `count` times with `err` (the global one too when
 * `no_global`): every take still gets in only after a real barrier, so exclusion holds. */
static void refused_barrier(const char *name, int err, int count, bool no_global)
{
    gp_biased_lock_init(&lock); /* biased, its barrier not yet timed: the first rare take is heavy */
    atomic_store(&refusals, count);
    atomic_store(&refusal_errno, err);
    atomic_store(&global_fails, no_global);
    atomic_store(&seen_expedited, 0);
    atomic_store(&seen_register, 0);
    atomic_store(&seen_global, 0);
    real_membarrier = gp_biased_lock_set_membarrier(flaky_membarrier);
    phase_result r = phase(name, 100000, RARE, true);
    gp_biased_lock_set_membarrier(NULL);
    EXPECT(r.heavy > 0, "%s: the others came in through the heavy barrier", name);
    EXPECT(atomic_load(&refusals) == 0, "%s: every refusal was met with a retry", name);
    if (err == EPERM)
        EXPECT(atomic_load(&seen_register) == count, "%s: %d registrations after %d EPERM", name,
               atomic_load(&seen_register), count);
    else if (no_global)
        EXPECT(atomic_load(&seen_expedited) >= count + (int)r.heavy, "%s: retried the expedited call", name);
    else
        EXPECT(atomic_load(&seen_global) >= 1, "%s: fell back to the global barrier", name);
}

int main(void)
{
    gp_biased_lock_init(&lock);
    bool heavy = gp_biased_lock_heavy_available();
    EXPECT(atomic_load(&lock.biased) == heavy, "a new lock is biased exactly when membarrier is available");
    if (!heavy)
        printf("membarrier(PRIVATE_EXPEDITED) is not available here: the bias checks are skipped\n");

    phase_result r = phase("others rare", 200000, RARE, true);
    if (heavy) {
        EXPECT(r.unbiased_takes <= 200000 / 10, "others rare: the owner keeps its bias (%ld unbiased takes)",
               r.unbiased_takes);
        EXPECT(r.heavy > 0, "others rare: the other threads came in through the heavy barrier");
    }
    /* Others once in 16 owner takes, whatever the scheduling (64 a window: even 0.2 us barriers cost
     * more than the bias saves): it is given up. */
    r = phase("others busy", 64000, 16, true);
    if (heavy)
        EXPECT(r.unbiased_takes > 0, "others busy: the bias is given up");
    /* Alone: the bias comes back once the running rate of others has decayed (tens of windows). */
    for (long i = 0; i < 256 * (long)GP_BL_WINDOW; i++) {
        gp_bl_hold how = gp_biased_lock_take_owner(&lock);
        critical_section(OWNER_SPIN);
        gp_biased_lock_drop(&lock, how);
    }
    if (heavy)
        EXPECT(atomic_load(&lock.biased), "alone again, the owner takes its bias back");
    /* The heavy barrier refused: retried (ENOMEM), by the global one or registering again (EPERM). */
    if (heavy) {
        refused_barrier("barrier refused, ENOMEM, global works", ENOMEM, 1, false);
        refused_barrier("barrier refused, ENOMEM, no global", ENOMEM, 3, true);
        refused_barrier("barrier refused, EPERM", EPERM, 2, true);
    }
    /* A barrier that costs 2 ms (counted as 100 us: a hypervisor's interrupts to busy CPUs, say), with
     * others once in 4 windows: they cost more than the bias saves, and it is given up. */
    if (heavy) {
        gp_biased_lock_init(&lock);
        real_membarrier = gp_biased_lock_set_membarrier(slow_membarrier);
        r = phase("barrier slow", 400000, 4 * GP_BL_WINDOW, true);
        gp_biased_lock_set_membarrier(NULL);
        EXPECT(r.unbiased_takes > 0, "barrier slow: the bias is given up when its barriers cost more");
        /* The bias lasts at least two of its clamped 100 us barriers (the running mean from 1 us). */
        EXPECT(atomic_load(&lock.barrier_ns) >= 20000, "barrier slow: the barrier's time is measured (%u ns)",
               atomic_load(&lock.barrier_ns));
    }
    /* Disabled for the process: a spin lock from the owner's next review on. */
    gp_biased_lock_disable_bias();
    r = phase("bias disabled", 100000, 0, false);
    EXPECT(!r.biased_at_end, "bias disabled: the lock is not biased after the owner's next review");
    if (failures == 0)
        printf("test_biased_lock_threads: all checks passed\n");
    return failures == 0 ? 0 : 1;
}
