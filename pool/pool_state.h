/*
 * pool_state.h — the state behind a gp_pool handle, shared by the files that implement the API:
 * pool.c (create, destroy, check), alloc.c, free.c, reclaim.c (steal, release, trim), stats.c.
 *
 * Locks, always taken in this order: pool->lock, then stream locks in ascending stream index, then the
 * event pool's lock. The allocation and free fast paths take one stream lock and nothing else. Slow
 * paths hold the pool lock and one stream lock at a time; only whole-pool walks (stats, gp_check,
 * destroy) hold every stream lock, taken in index order.
 *
 * Accounting invariant (checked by gp_check and, under assertions, by gp_get_stats):
 *     allocated + cached == reserved,  cached == sum of heap free_bytes + sum of pending_bytes,
 *     reserved == sum of segment sizes,  allocated == sum of LIVE block sizes.
 */
#ifndef GP_POOL_STATE_H
#define GP_POOL_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "block.h"
#include "config.h"
#include "event_pool.h"
#include "stream.h"
#include "trace_log.h"

#define GP_POOL_MAGIC_LIVE 0x6770706f6f6c4c56ull /* "gppoolLV" */
#define GP_POOL_MAGIC_DEAD 0x6770706f6f6c4444ull /* "gppoolDD" */

typedef struct gp_pool_state {
    int device;
    gp_config cfg;
    const gp_backend_ops *ops;
    void *ctx;
    size_t device_total; /* the device's total memory, read at create */

    pthread_mutex_t lock; /* the pool lock: segments list, new streams, device allocation, steals */
    gp_stream_table streams;
    gp_event_pool events;
    gp_segment *segments_head, *segments_tail; /* oldest first */
    size_t segment_count;
    uint64_t next_serial;
    gp_trace_log *log;

    /* Changed on fast paths of several streams at once, hence atomic (the only shared writes there;
     * requested bytes and live block counts are kept per stream and summed by stats). */
    atomic_size_t allocated, allocated_peak;
    /* Changed under the pool lock only; atomic so that readers need no lock. */
    atomic_size_t reserved, reserved_peak;
    atomic_uint_fast64_t num_device_allocs, num_device_frees, num_alloc_retries, num_ooms;
    atomic_uint_fast64_t num_stream_steals, num_stream_waits;
} gp_pool_state;

struct gp_pool {
    uint64_t magic;
    gp_pool_state *state;   /* NULL once destroyed */
    struct gp_pool *grave_next; /* destroyed shells are kept so stale handles are recognised */
};

/* Validates a handle; on success *out is its state. `fn` names the API call in messages. */
int gp_pool_enter(gp_pool *pool, const char *fn, gp_pool_state **out);

/* The stream's state, adding it (under the pool lock) when the pool has not seen it. */
int gp_pool_stream(gp_pool_state *p, gp_stream handle, gp_stream_state **out);

/* Locks / unlocks every stream in index order (caller holds the pool lock). */
void gp_lock_all_streams(gp_pool_state *p);
void gp_unlock_all_streams(gp_pool_state *p);

/* Raises *peak to at least value. */
static inline void gp_raise_peak(atomic_size_t *peak, size_t value)
{
    size_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (seen < value && !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed,
                                                                  memory_order_relaxed)) {
    }
}

/* The heap of `st` that holds blocks of segment kind `small`. */
static inline gp_heap *gp_heap_of(gp_stream_state *st, bool small)
{
    return small ? &st->small : &st->large;
}

/* ---- free.c ---- */
/* Returns a block that is no longer LIVE or PENDING to its owner's heap (owner locked). */
void gp_block_to_heap(gp_pool_state *p, gp_stream_state *owner, gp_block *b);
/* Moves PENDING blocks of st whose events have all completed back to its heap; scans at most `limit`
 * blocks (0 = all). st locked. */
void gp_pending_collect(gp_pool_state *p, gp_stream_state *st, unsigned limit);
/* Says why `addr` is not a live block of this pool: GP_ERR_NOT_OWNED, GP_ERR_INTERIOR or
 * GP_ERR_DOUBLE_FREE, with a message starting with `fn`. Pool lock held, no stream lock. */
int gp_diagnose_pointer(gp_pool_state *p, uintptr_t addr, const char *fn);

/* ---- reclaim.c ---- */
/*
 * Takes the smallest wholly free segment of another stream that fits `size`: only one whose owner's
 * fence has completed or, when `wait`, one whose fence st is then made to wait on. The segment is
 * returned with owner == st and its single FREE block on no list: the caller puts it in st's heap.
 * While in transit it is reachable only through the segment list, i.e. by pool-lock holders.
 * Pool lock held, no stream lock. NULL when none may be taken.
 */
gp_segment *gp_steal_segment(gp_pool_state *p, gp_stream_state *st, size_t size, bool small, bool wait);
/* Gives wholly free segments back to the device, oldest first, until `want` bytes are released or
 * cached bytes are at most `keep` (whichever comes first); returns bytes released. Pool lock held, no
 * stream lock. Device failures keep the segment cached; *failed (optional) receives the first
 * failure's code. */
size_t gp_release_free_segments(gp_pool_state *p, size_t want, size_t keep, int *failed);
/*
 * Keeps cached memory within cache_slack before the pool grows by `bytes` for a request of `rsize`:
 * when reserved + bytes would exceed (1 + cache_slack) x max(peak allocated, allocated + rsize), gives
 * back wholly free segments, oldest first, but only when that brings the pool under the cap (releasing
 * less would only trade device calls for nothing). Pool lock held, no stream lock.
 */
void gp_release_over_slack(gp_pool_state *p, size_t bytes, size_t rsize);

#endif /* GP_POOL_STATE_H */
