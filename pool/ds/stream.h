/*
 * stream.h — per-stream state and the table that finds it without a lock.
 *
 * Each stream the pool has seen owns two heaps (small and large), the map of the live blocks it
 * allocated, and the list of its blocks that were freed while other streams still used them (PENDING,
 * each waiting for events). All of it is guarded by the stream's own lock, so threads working on
 * different streams never contend on the fast path.
 *
 * The table is open-addressed and fixed in size; slots are written once, under the pool lock, and read
 * with acquire loads by anyone. Streams are never removed before destroy.
 *
 * max_streams counts the pairs that have served a call: a state is `claimed` (under the pool lock) by
 * the first allocation that succeeds on it, or that leaves memory in it, and by a recorded use. A call
 * that fails (an allocation refused as paused, over quota or out of memory) leaves its new state
 * unclaimed, and unclaimed states do not count: failed calls cannot use up the pool's streams. The
 * table holds up to max_streams unclaimed states besides, so that it stays bounded:
 *     claimed <= max_streams,  count <= 2 * max_streams.
 */
#ifndef GP_STREAM_H
#define GP_STREAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/lock_order.h"
#include "ds/block_map.h"
#include "gpupool.h"
#include "ds/heap.h"
#include "ds/size_class.h"

struct gp_tenant;
struct gp_tc_entry;

/* One per (stream, tenant) pair: a tenant's memory on a stream is its own. */
typedef struct gp_stream_state {
    gp_stream handle;
    struct gp_tenant *tenant;
    unsigned index; /* order of first sight; locks of several streams are taken in this order */
    bool claimed;   /* counted against max_streams (pool lock; see above) */
    pthread_mutex_t lock;

    gp_heap small, large;
    gp_block_cache blocks;
    gp_block_map live;     /* LIVE blocks of this stream's segments */
    gp_block *pending;     /* PENDING blocks, oldest first (list_prev/list_next) */
    gp_block *pending_tail;
    size_t pending_bytes;
    /* Pages of other streams held for this stream's idle stitched blocks (provider/alias.h: loans),
     * in use nowhere: cached memory, as free blocks are. */
    size_t parked_bytes;
    atomic_size_t pending_count; /* read without the lock to skip the pending scan */
    /* Thread caches holding blocks of this stream (provider/thread_cache.h), linked under this lock. */
    struct gp_tc_entry *lenders;

    /* The fence (provider/provider.h: gp_stream_done): which of this stream's frees are finished on
     * the device, for other streams that would take its free memory. free_seq is the free clock of
     * both heaps (ds/heap.h: every block freed is stamped with it, advanced); the event `fence`, while
     * fence_recorded, was recorded when the clock read fence_seq; done_seq: every block stamped at or
     * before it is used by no work of this stream any more. done_seq <= fence_seq <= free_seq. */
    uint64_t free_seq, fence_seq, done_seq;
    gp_event fence;
    bool fence_recorded;
    /* gp_stream_forget ran (the application destroys the handle after it), when this stream's
     * allocations + frees were forgotten_ops: while they still are, nothing the pool knows of has run
     * on the handle since, and a pause does not record on it (api/pause.c). */
    bool forgotten;
    uint64_t forgotten_ops;

    /* Counters owned by this stream (summed by gp_get_stats); live blocks are live.count. */
    uint64_t num_allocs, num_frees;
    size_t requested_bytes; /* sizes asked for by the LIVE blocks of this stream's segments */
    size_t allocated_bytes; /* their rounded sizes: exact */
    /* allocated_bytes not yet added to the pool's shared total (see gp_account in pool_state.h);
     * written under this lock only, read without it by this stream's thread caches (relaxed) */
    _Atomic(int64_t) unflushed;
    unsigned frees_since_maintain;
    /* Accumulated per heap kind, [0] large, [1] small (PyTorch's allocation.*.allocated/.freed and
     * allocated_bytes.*.allocated/.freed): blocks handed out and freed, and their rounded bytes. */
    uint64_t kind_allocs[2], kind_frees[2], kind_alloc_bytes[2], kind_free_bytes[2];
    uint64_t size_class_allocs[GP_SIZE_CLASS_COUNT];
} gp_stream_state;

/* A stream's lock, taken and released through these so that builds with assertions check the lock
 * order (base/lock_order.h): several streams' locks only by ascending index, none under a thread
 * cache's or the event pool's lock. gp_stream_trylock may take any (it never waits); true when it did. */
static inline void gp_stream_lock(gp_stream_state *st)
{
    gp_order_lock(GP_RANK_STREAM, st->index);
    pthread_mutex_lock(&st->lock);
}

static inline bool gp_stream_trylock(gp_stream_state *st)
{
    if (pthread_mutex_trylock(&st->lock) != 0)
        return false;
    gp_order_locked(GP_RANK_STREAM, st->index);
    return true;
}

static inline void gp_stream_unlock(gp_stream_state *st)
{
    pthread_mutex_unlock(&st->lock);
    gp_order_unlock(GP_RANK_STREAM, st->index);
}

/* True when gp_stream_forget ran on st and the pool has seen no allocation or free on it since, so
 * that nothing it knows of has run on the handle since (which may be dead). st locked, its thread
 * caches returned (their counts are then current). */
static inline bool gp_stream_unused_since_forget(const gp_stream_state *st)
{
    return st->forgotten && st->num_allocs + st->num_frees == st->forgotten_ops;
}

typedef struct gp_stream_table {
    _Atomic(gp_stream_state *) *slots;
    unsigned capacity;        /* at least 2 * (2 * max_streams), a power of two */
    unsigned max_streams;
    gp_stream_state **by_index; /* streams in order of first sight (2 * max_streams of room) */
    atomic_uint count;
    unsigned claimed;         /* states counted against max_streams (pool lock) */
} gp_stream_table;

int gp_stream_table_init(gp_stream_table *table, unsigned max_streams);
void gp_stream_table_free(gp_stream_table *table); /* frees the states too */

/* The state of (handle, tenant), or NULL when the pool has not seen that pair. Lock-free. */
gp_stream_state *gp_stream_find(const gp_stream_table *table, gp_stream handle, const struct gp_tenant *tenant);

/* Adds (handle, tenant) (caller holds the pool lock and checked it is absent). GP_ERR_INVALID when the
 * table is full, with a message naming max_streams. */
int gp_stream_add(gp_stream_table *table, gp_stream handle, struct gp_tenant *tenant, gp_stream_state **out);

/* Counts st against max_streams if it is not yet (pool lock held); GP_ERR_INVALID when that is full. */
int gp_stream_claim(gp_stream_table *table, gp_stream_state *st);

/* True when some state has this handle (any tenant). */
bool gp_stream_seen(const gp_stream_table *table, gp_stream handle);

/* The size class buckets of stats: see gp_stats_bucket. */

#endif /* GP_STREAM_H */
