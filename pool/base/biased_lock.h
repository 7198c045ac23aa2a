/*
 * biased_lock.h — a lock biased toward one thread, its owner: for data that one thread touches on
 * every call and other threads rarely (a per-thread cache that others sometimes empty). The owner
 * takes and drops it with a plain store and load each (no atomic read-modify-write, no fence
 * instruction); any other thread pays instead, with a spin lock and one process-wide memory barrier
 * (membarrier(2), MEMBARRIER_CMD_PRIVATE_EXPEDITED). The asymmetric fence of Linux's userspace RCU and
 * folly, used as JVMs used biased locking: while others come rarely.
 *
 * The protocol (Dekker's, with the owner's half of the fence moved to the other side):
 *   owner, biased:  busy = 1; (compiler fence); if revoke == 0 the owner holds it (GP_BL_FAST);
 *                   else busy = 0 and it takes `guard`, the spin lock (GP_BL_GUARD).
 *   owner, not biased: takes `guard` (GP_BL_GUARD): a plain spin lock, one exchange.
 *   any other thread: takes `guard`; when biased, revoke = 1, then the heavy barrier, then it waits
 *                   until busy == 0 (GP_BL_OTHER). Dropping: revoke = 0, then guard.
 * Why no two hold it: membarrier returns only after every running thread of the process has executed
 * a full memory barrier (a thread not running passes one at its context switch). If the owner's
 * barrier falls before its store busy = 1, its load of revoke comes after the barrier and sees the
 * 1 stored before the call: it backs off to the guard, which the other holds. If it falls after that
 * store, the store is visible when the call returns and the other waits for busy == 0. The guard
 * excludes the others from each other and from an owner that backed off or is not biased.
 * What a race checker sees: the barrier gives exclusion only; every ordering between holders is an
 * atomic with acquire and release (an owner's section before another's: busy's release store 0 read
 * by the other's acquire load; another's before the owner's: the guard, or revoke's release store 0
 * read by the owner's acquire load), so ThreadSanitizer checks the same code that runs.
 *
 * When the bias pays: it saves the owner one atomic exchange per take (GP_BL_EXCHANGE_NS, about 4 ns:
 * the cached pair went from 20.5 to 12.8 ns without its two, bench/RESULTS.md); each take by another
 * thread costs a heavy barrier, one system call plus an interrupt to every CPU that runs a thread of
 * the process: 0.3 us with the other CPUs idle, 12-13 us on this 2-vCPU virtual machine with one of
 * them busy (measured), more with interrupts through a hypervisor to many busy CPUs. That cost is a
 * property of the machine and the process, not a constant, so the lock measures it: every other
 * thread times its barrier, and the lock keeps a running mean (barrier_ns). The owner, every
 * GP_BL_WINDOW takes, updates a running mean of how many times others came per window (others_rate)
 * and keeps (or takes back) the bias while
 *     others_rate x barrier_ns <= GP_BL_WINDOW x GP_BL_EXCHANGE_NS,
 * i.e. while the barriers it causes cost no more than the exchanges it saves; else the lock is a plain
 * spin lock. Others keep coming while it is not biased (counted all the same), so the rate stays
 * known and the bias comes back once they come rarely enough. The rate moves 1/16 of the way to each
 * window's count, so that it measures sparse visits (one in 16 windows reads about 1/16, not 1 then
 * 0) and forgets a burst within tens of windows (64 here after 20 visits a window with 13 us barriers:
 * 64,000 owner takes, about a millisecond of cached calls). The barrier's mean moves 1/8 of the way
 * to each timed barrier, and one barrier counts at most 100 us: a longer one is a delay (the caller or
 * the interrupted CPU descheduled), not what the next barrier will cost, and 100 us already says that
 * the bias pays only while others come less than once in 25 windows. Only the owner changes the bias, holding the guard, so every other taker (which holds
 * the guard when it reads it) sees its current value.
 *
 * Where membarrier is missing (kernels before 4.14, a seccomp filter) or refused, no lock is ever
 * biased: every take is the spin lock, as before this lock existed.
 *
 * Invariants: at most one holder; revoke != 0 only while another thread holds the guard in biased
 * mode; busy != 0 only while the owner is inside or on its way in or out on the fast path; `biased`
 * changes only with the guard held by the owner.
 */
#ifndef GP_BIASED_LOCK_H
#define GP_BIASED_LOCK_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#define GP_BL_WINDOW 1024u       /* owner takes between two looks at how often others came */
#define GP_BL_EXCHANGE_NS 4u     /* what the bias saves the owner per take (measured, above) */
#define GP_BL_BARRIER_NS_FIRST 1000u /* barrier_ns until a barrier was timed */
#define GP_BL_BARRIER_NS_MAX 100000u /* one timed barrier counts at most 100 us (above, a delay) */
#define GP_BL_RATE_WEIGHT 16u    /* others_rate moves 1/16 of the way to each window's count */
#define GP_BL_BARRIER_WEIGHT 8u  /* barrier_ns moves 1/8 of the way to each timed barrier */

typedef struct gp_biased_lock {
    atomic_int busy;           /* the owner is inside on its fast path */
    atomic_int revoke;         /* another thread holds it, or is getting in, while biased */
    atomic_int guard;          /* the spin lock of every taker but a biased owner */
    atomic_bool biased;        /* written by the owner under the guard */
    atomic_uint other_takes;   /* takes by other threads, ever (relaxed: a count) */
    atomic_uint heavy_takes;   /* of those, the ones that found it biased (paid a heavy barrier) */
    atomic_uint barrier_ns;    /* running mean of a heavy barrier's time (written under the guard) */
    unsigned owner_takes;      /* the owner's takes in this window (owner only) */
    unsigned others_seen;      /* other_takes when this window began (owner only) */
    unsigned others_rate256;   /* running mean of other takes per window, x256 (owner only) */
} gp_biased_lock;

typedef enum { GP_BL_FAST, GP_BL_GUARD, GP_BL_OTHER } gp_bl_hold;

/* Makes l, biased when the heavy barrier is available in this process. */
void gp_biased_lock_init(gp_biased_lock *l);

/* The owner's review of its bias, every GP_BL_WINDOW takes (out of line: rare). */
void gp_biased_lock_review(gp_biased_lock *l);

/* Takes l from any thread but its owner; drop with gp_biased_lock_drop(l, GP_BL_OTHER). */
void gp_biased_lock_take_other(gp_biased_lock *l);

/* True when the heavy barrier is available (process-wide, decided once). */
bool gp_biased_lock_heavy_available(void);

/* The heavy barrier's system call: membarrier(cmd, 0, 0), 0 or -1 with errno. */
typedef long (*gp_membarrier_fn)(int cmd);

/* Tests only: puts fn in front of the heavy barrier's system call (NULL: the real one again); returns
 * the one before. A fn that fails must fail as the kernel does (errno set); one that succeeds must
 * have made the barrier (call the real one). */
gp_membarrier_fn gp_biased_lock_set_membarrier(gp_membarrier_fn fn);

/* Tests only: from now on no lock is biased (as without membarrier); each lock follows at its owner's
 * next review. */
void gp_biased_lock_disable_bias(void);

static inline void gp_bl_spin_take(atomic_int *guard)
{
    while (atomic_exchange_explicit(guard, 1, memory_order_acquire) != 0)
        sched_yield(); /* held for a few dozen instructions, never across a wait */
}

static inline void gp_bl_spin_drop(atomic_int *guard)
{
    atomic_store_explicit(guard, 0, memory_order_release);
}

/* Takes l; only its owner thread may call this. */
static inline gp_bl_hold gp_biased_lock_take_owner(gp_biased_lock *l)
{
    if (++l->owner_takes == GP_BL_WINDOW)
        gp_biased_lock_review(l);
    if (atomic_load_explicit(&l->biased, memory_order_relaxed)) {
        atomic_store_explicit(&l->busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst); /* the heavy barrier is the fence's other half */
        if (atomic_load_explicit(&l->revoke, memory_order_acquire) == 0)
            return GP_BL_FAST;
        atomic_store_explicit(&l->busy, 0, memory_order_release);
    }
    gp_bl_spin_take(&l->guard);
    return GP_BL_GUARD;
}

static inline void gp_biased_lock_drop(gp_biased_lock *l, gp_bl_hold how)
{
    if (how == GP_BL_FAST) {
        atomic_store_explicit(&l->busy, 0, memory_order_release);
        return;
    }
    if (how == GP_BL_OTHER)
        atomic_store_explicit(&l->revoke, 0, memory_order_release);
    gp_bl_spin_drop(&l->guard);
}

#endif /* GP_BIASED_LOCK_H */
