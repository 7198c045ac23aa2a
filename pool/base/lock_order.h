/*
 * lock_order.h — the pool's lock order (pool/README.md, "Lock order"), checked at run time in builds
 * with assertions, as jemalloc's witness.h checks its own: every thread records which ranked locks it
 * holds, and a blocking acquire that breaks the order aborts, naming both locks, before it can
 * deadlock (a deadlock needs two threads; the check needs only one to take the wrong path once). A
 * trylock never waits, so it is never out of order; it is recorded when it succeeds.
 *
 * Where it runs: in builds with assertions, when the process starts with GPUPOOL_CHECK_LOCK_ORDER=1,
 * which every CTest test sets (gpupool_check_lock_order in CMakeLists.txt). Builds with assertions are
 * also what serves real work by default, and recording every lock made the cached allocate+free pair
 * 2.6x jemalloc's where it was 1.4-2.7x (bench/RESULTS.md, session 43): elsewhere each function here
 * is one branch on a flag set once at load. Builds without assertions (NDEBUG: the benchmarks')
 * compile them out.
 *
 * The order, lowest rank first: the pool lock; stream locks, in ascending stream index; a thread
 * cache's lock; the event pool's lock. A lock may be taken while holding only locks of a lower rank,
 * or, for stream locks, only streams of a lower index. Unranked locks (the history's, the allocation
 * log's, the capture lock, the simulated GPU's, the ledger's) are leaves or come before all of these,
 * as the README says.
 */
#ifndef GP_LOCK_ORDER_H
#define GP_LOCK_ORDER_H

typedef enum {
    GP_RANK_POOL = 1,         /* gp_pool_state.lock */
    GP_RANK_STREAM = 2,       /* gp_stream_state.lock; `sub` is the stream's index */
    GP_RANK_THREAD_CACHE = 3, /* gp_thread_cache.lock (a biased lock), one at a time */
    GP_RANK_EVENT_POOL = 4,   /* gp_event_pool.lock */
} gp_lock_rank;

#ifdef NDEBUG
static inline void gp_order_lock(gp_lock_rank rank, unsigned sub)
{
    (void)rank;
    (void)sub;
}
static inline void gp_order_locked(gp_lock_rank rank, unsigned sub)
{
    (void)rank;
    (void)sub;
}
static inline void gp_order_unlock(gp_lock_rank rank, unsigned sub)
{
    (void)rank;
    (void)sub;
}
static inline unsigned gp_order_held(void)
{
    return 0;
}
#else
#include <stdbool.h>

/* Whether the check runs: set when the library loads, before any lock can be held, and never again
 * (tests/unit/test_lock_order.c, holding none, sets it too). */
extern bool gp_order_on;

void gp_order_check_and_record(gp_lock_rank rank, unsigned sub);
void gp_order_record(gp_lock_rank rank, unsigned sub);
void gp_order_forget(gp_lock_rank rank, unsigned sub);

/* Before a blocking acquire of (rank, sub): aborts when this thread holds a lock that must come after
 * it; then records it as held. */
static inline void gp_order_lock(gp_lock_rank rank, unsigned sub)
{
    if (gp_order_on)
        gp_order_check_and_record(rank, sub);
}

/* After a trylock of (rank, sub) succeeded: records it as held (no check: it did not wait). */
static inline void gp_order_locked(gp_lock_rank rank, unsigned sub)
{
    if (gp_order_on)
        gp_order_record(rank, sub);
}

/* After releasing (rank, sub): forgets it. Releasing a lock this thread does not hold aborts. */
static inline void gp_order_unlock(gp_lock_rank rank, unsigned sub)
{
    if (gp_order_on)
        gp_order_forget(rank, sub);
}

/* How many ranked locks this thread holds (tests). */
unsigned gp_order_held(void);
#endif

#endif /* GP_LOCK_ORDER_H */
