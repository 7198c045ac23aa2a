/*
 * biased_lock.c — the biased lock's rare paths (biased_lock.h): the heavy barrier, decided once per
 * process; the owner's review of its bias; a take by another thread.
 */
#define _DEFAULT_SOURCE /* syscall */
#include "base/biased_lock.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#endif

static pthread_once_t heavy_once = PTHREAD_ONCE_INIT;
static atomic_bool heavy_ok;      /* membarrier PRIVATE_EXPEDITED registered for this process */
static atomic_bool bias_disabled; /* gp_biased_lock_disable_bias */
static bool heavy_global;         /* MEMBARRIER_CMD_GLOBAL too (written once, before heavy_ok) */

#if defined(__linux__) && defined(SYS_membarrier)
static long membarrier_syscall(int cmd)
{
    return syscall(SYS_membarrier, cmd, 0, 0);
}

/* The heavy barrier's system call; tests put a failing one in front (gp_biased_lock_set_membarrier). */
static _Atomic(gp_membarrier_fn) membarrier_call = membarrier_syscall;
#endif

gp_membarrier_fn gp_biased_lock_set_membarrier(gp_membarrier_fn fn)
{
#if defined(__linux__) && defined(SYS_membarrier)
    return atomic_exchange(&membarrier_call, fn != NULL ? fn : membarrier_syscall);
#else
    (void)fn;
    return NULL;
#endif
}

static void heavy_probe(void)
{
#if defined(__linux__) && defined(SYS_membarrier)
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
        return;
    heavy_global = (cmds & MEMBARRIER_CMD_GLOBAL) != 0;
    /* Registration is process-wide and lasts; PRIVATE_EXPEDITED is refused without it. */
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0)
        return;
    atomic_store(&heavy_ok, true);
#endif
}

bool gp_biased_lock_heavy_available(void)
{
    pthread_once(&heavy_once, heavy_probe);
    return atomic_load(&heavy_ok);
}

void gp_biased_lock_disable_bias(void)
{
    atomic_store(&bias_disabled, true);
}

/*
 * Returns once every running thread of the process has executed a full memory barrier. Registered,
 * the expedited call fails only when the kernel cannot allocate its CPU mask (ENOMEM), which passes:
 * then the global one (an RCU grace period, milliseconds, no allocation), else it tries again; EPERM
 * (this process not registered: a fork's child where the kernel does not carry it over) registers. It
 * cannot give up: without the barrier the owner's fast path could be inside unseen.
 */
static void heavy_barrier(void)
{
#if defined(__linux__) && defined(SYS_membarrier)
    gp_membarrier_fn call = atomic_load(&membarrier_call);
    while (call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
        if (errno == EPERM) /* not registered in this process (a fork's child on some kernels) */
            (void)call(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
        else if (heavy_global && call(MEMBARRIER_CMD_GLOBAL) == 0)
            return;
        sched_yield();
    }
#else
    assert(!"heavy_barrier without membarrier: no lock is biased there");
#endif
}

void gp_biased_lock_init(gp_biased_lock *l)
{
    atomic_init(&l->busy, 0);
    atomic_init(&l->revoke, 0);
    atomic_init(&l->guard, 0);
    atomic_init(&l->biased, gp_biased_lock_heavy_available() && !atomic_load(&bias_disabled));
    atomic_init(&l->other_takes, 0);
    atomic_init(&l->heavy_takes, 0);
    atomic_init(&l->barrier_ns, GP_BL_BARRIER_NS_FIRST);
    l->owner_takes = 0;
    l->others_seen = 0;
    l->others_rate256 = 0;
}

/* mean moved 1/weight of the way to sample, rounded away from mean so that it reaches the sample. */
static unsigned running_mean(unsigned mean, uint64_t sample, unsigned weight)
{
    if (sample >= mean)
        return mean + (unsigned)((sample - mean + weight - 1) / weight);
    return mean - (unsigned)((mean - sample + weight - 1) / weight);
}

void gp_biased_lock_review(gp_biased_lock *l)
{
    unsigned others = atomic_load_explicit(&l->other_takes, memory_order_relaxed);
    uint64_t came = others - l->others_seen;
    l->others_seen = others;
    l->owner_takes = 0;
    if (came > GP_BL_WINDOW) /* a window of the owner's counts at most this many (keeps x256 in range) */
        came = GP_BL_WINDOW;
    l->others_rate256 = running_mean(l->others_rate256, came * 256u, GP_BL_RATE_WEIGHT);
    double cost = (double)l->others_rate256 / 256.0 * (double)atomic_load_explicit(&l->barrier_ns, memory_order_relaxed);
    bool want = cost <= (double)GP_BL_WINDOW * GP_BL_EXCHANGE_NS && gp_biased_lock_heavy_available() &&
                !atomic_load_explicit(&bias_disabled, memory_order_relaxed);
    if (want == atomic_load_explicit(&l->biased, memory_order_relaxed))
        return;
    /* Holding the guard: no other thread is inside (in biased mode it would hold the guard too), and
     * the next one reads the new value under the guard. The owner is not inside: this runs at the
     * start of its take. */
    gp_bl_spin_take(&l->guard);
    atomic_store_explicit(&l->biased, want, memory_order_relaxed);
    gp_bl_spin_drop(&l->guard);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void gp_biased_lock_take_other(gp_biased_lock *l)
{
    gp_bl_spin_take(&l->guard);
    atomic_fetch_add_explicit(&l->other_takes, 1, memory_order_relaxed);
    if (!atomic_load_explicit(&l->biased, memory_order_relaxed))
        return; /* the owner takes the guard too */
    atomic_fetch_add_explicit(&l->heavy_takes, 1, memory_order_relaxed);
    atomic_store_explicit(&l->revoke, 1, memory_order_relaxed);
    uint64_t start = now_ns();
    heavy_barrier();
    uint64_t took = now_ns() - start;
    if (took > GP_BL_BARRIER_NS_MAX)
        took = GP_BL_BARRIER_NS_MAX;
    /* Under the guard: the only writer now. */
    unsigned mean = running_mean(atomic_load_explicit(&l->barrier_ns, memory_order_relaxed), took, GP_BL_BARRIER_WEIGHT);
    atomic_store_explicit(&l->barrier_ns, mean, memory_order_relaxed);
    while (atomic_load_explicit(&l->busy, memory_order_acquire) != 0)
        sched_yield();
}
