/*
 * pool_state.h — the state behind a gp_pool handle, and the accounting of its bytes (gp_account,
 * gp_flush). It lives with the providers (provider/), which change it under the locks below; the API
 * paths (api/) are the only way in from a gp_pool handle (api/api.h). Nothing declared here calls the
 * device (pool_state.c).
 *
 * Locks, always taken in this order: pool->lock, then stream locks in ascending stream index, then the
 * event pool's lock; the per-GPU ledger's lock (provider/ledger.c) is a leaf, held by no caller of
 * anything else. The allocation and free fast paths take one stream lock and nothing else. Slow
 * paths hold the pool lock and one stream lock at a time; only whole-pool walks (stats, gp_check,
 * destroy) hold every stream lock, taken in index order.
 *
 * Accounting invariant (checked by gp_check and, under assertions, by gp_get_stats):
 *     allocated + cached == reserved,  allocated == sum of LIVE block sizes,
 *     cached == sum of heap free_bytes + sum of pending_bytes + pooled_count * page,
 *     reserved == sum of segment sizes (device allocations), or, on a virtual memory backend,
 *     reserved == physical bytes == sum of segments' mapped_bytes + pooled_count * page;
 * while tenants are paused, allocated + cached == reserved + paused_bytes (their blocks hold nothing).
 */
#ifndef GP_POOL_STATE_H
#define GP_POOL_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <assert.h>

#include "backend/backend.h"
#include "ds/block.h"
#include "base/config.h"
#include "base/peak.h"
#include "provider/event_pool.h"
#include "ds/stream.h"
#include "ds/tenant.h"
#include "base/trace_log.h"
#include "ds/history.h"
#include "policy/working_set.h"

#define GP_POOL_MAGIC_LIVE 0x6770706f6f6c4c56ull /* "gppoolLV" */
#define GP_POOL_MAGIC_DEAD 0x6770706f6f6c4444ull /* "gppoolDD" */

typedef struct gp_pool_state {
    uint64_t serial; /* unique per pool in this process (per-thread caches compare it) */
    int device;
    gp_config cfg;
    const gp_backend_ops *ops;
    void *ctx;
    const struct gp_provider *provider; /* cudaMalloc segments or vmm pages (provider/provider.h) */
    size_t device_total; /* the device's total memory, read at create */

    pthread_mutex_t lock; /* the pool lock: segments list, new streams, device allocation, steals */
    gp_stream_table streams;
    gp_tenant_registry tenants;
    gp_event_pool events;
    gp_segment *segments_head, *segments_tail; /* oldest first */
    size_t segment_count;
    uint64_t next_serial;
    gp_trace_log *log;
    struct gp_pool_ledger *ledger; /* the per-GPU ledger (provider/pool_ledger.c); NULL when ledger:off */
    /* Recent allocation events for snapshots (ds/history.h, api/snapshot.c): NULL until
     * gp_history_record turns recording on; then it lives until destroy. history_on says whether the
     * hooks add to it. */
    _Atomic(gp_history *) history;
    atomic_bool history_on;
    gp_working_set working_set; /* empty_cache:working-set's recent calls (pool lock; api/working_set.c) */

    /* Virtual memory backends (provider/vmm.c): page is the mapping granularity (0 on other backends);
     * the pooled handles are physical pages mapped nowhere, kept for reuse (pool lock). */
    size_t page;
    size_t paused_bytes;     /* bytes of paused ranges' blocks, which hold no device memory (api/pause.c) */
    void *staging_hooks;     /* provider/staging.c: the jemalloc arena's hooks, NULL before first use */
    unsigned staging_arena;
    gp_phys *pooled;
    uint64_t *pooled_since;
    size_t pooled_count, pooled_capacity;
    atomic_uint_fast64_t num_maps, num_unmaps, num_stitches, idle_released_bytes;
    uint64_t alias_clock; /* hand-outs of stitched ranges so far (provider/alias.c; pool lock) */
    atomic_uint_fast64_t coarse_now;     /* the clock (ns) as of the last slow path or maintenance */
    atomic_uint_fast64_t frees_since_maintain;
    bool maintains;                      /* release_threshold or idle_release is set */

    /* Allocated bytes are exact per stream (stream->allocated_bytes); the shared total below lags
     * each stream by its `unflushed` delta, under GP_FLUSH_BYTES, so that the fast paths of several
     * streams do not write one cache line. See gp_account. */
    atomic_int_fast64_t allocated_flushed;
    atomic_size_t allocated_peak;
    atomic_size_t window_peak; /* allocated peak since the last gp_release_unused (api/working_set.c) */
    /* Changed under the pool lock only; atomic so that readers need no lock. */
    atomic_size_t reserved, reserved_peak;
    atomic_uint_fast64_t num_device_allocs, num_device_frees, num_alloc_retries, num_ooms;
    atomic_uint_fast64_t num_stream_steals, num_stream_waits;
    atomic_uint_fast64_t num_unmap_waits, num_device_syncs; /* before unmapping: provider/pages.c */
    /* What reserved memory was made of at the last raise of reserved_peak, with peak_composition:on
     * (api/peak.c; pool lock). */
    gp_peak_composition peak_composition;

    /* CUDA graph capture (api/capture.c): the private pools of this pool's graphs (NULL before the
     * first gp_graph_pool_begin), and for a private pool itself: graph_parent, its parent (which
     * outlives it, and whose tenant its tenant is charged to; NULL in any other pool), and graph_window
     * while its graph is being captured. */
    struct gp_capture_pools *capture;
    struct gp_pool_state *graph_parent;
    /* Whether gp_alloc/gp_free ask the backend if the stream captures: its backend can capture
     * (ops->stream_capturing) and this is no graph pool. Set before the pool is reachable, then read
     * only: one byte tested inline on every call (api.h, gp_capture_route). */
    bool routes_captures;
    /* The quick lists age (ds/heap.h) on a pool of pages: a small page that aging empties moves where
     * memory is needed with no device allocation, while on the cudaMalloc path an emptied 2 MiB small
     * segment can only go back with cudaFree and come again with cudaMalloc (device calls in every
     * step), and moving when small segments empty reshuffles the cap's steals (bench/RESULTS.md,
     * 2026-12-02 evening: two of 22 traces worse there, none better). */
    bool quick_aging;
    atomic_bool graph_window;
    /* Set by gp_pool_destroy once the streams' fences are given back (pool lock and every stream lock
     * held): unmapping then synchronizes the device instead of waiting on a fence (provider/pages.c). */
    bool destroying;
} gp_pool_state;

/* The pool lock, through these so that builds with assertions check the lock order
 * (base/lock_order.h): never under another ranked lock (a stream's, a thread cache's, the event
 * pool's), except by trylock. */
static inline void gp_pool_lock(gp_pool_state *p)
{
    gp_order_lock(GP_RANK_POOL, 0);
    pthread_mutex_lock(&p->lock);
}

static inline bool gp_pool_trylock(gp_pool_state *p)
{
    if (pthread_mutex_trylock(&p->lock) != 0)
        return false;
    gp_order_locked(GP_RANK_POOL, 0);
    return true;
}

static inline void gp_pool_unlock(gp_pool_state *p)
{
    pthread_mutex_unlock(&p->lock);
    gp_order_unlock(GP_RANK_POOL, 0);
}

struct gp_pool {
    uint64_t magic;
    gp_pool_state *state;   /* NULL once destroyed */
    struct gp_pool *grave_next; /* destroyed shells are kept so stale handles are recognised */
};

/* Appends seg to the pool's list of segments (newest last) / takes it out. Pool lock held. */
void gp_segment_link(gp_pool_state *p, gp_segment *seg);
void gp_segment_unlink(gp_pool_state *p, gp_segment *seg);

/* Fills seg in as [addr, addr + size) of st's heap of kind `small`, with `mapped` bytes of device
 * memory behind it, tiled by its single first block in `state` (FREE for a device allocation, UNMAPPED
 * for a new virtual range), and links it last in the pool's list. Pool lock held. */
void gp_segment_place(gp_pool_state *p, gp_segment *seg, gp_stream_state *st, uintptr_t addr, size_t size, bool small,
                      size_t mapped, gp_block_state state);
/* Frees the metadata of every segment (blocks, page tables) at destroy; the device memory was given
 * back by the provider. */
void gp_segments_free_all(gp_pool_state *p);

/* Locks / unlocks every stream in index order (caller holds the pool lock); locking also returns the
 * blocks lent to thread caches (provider/thread_cache.h), so that a whole-pool walk sees them all. */
void gp_lock_all_streams(gp_pool_state *p);
void gp_unlock_all_streams(gp_pool_state *p);

/*
 * The streams whose work may use tenant t's memory: t's own (its blocks are handed out on them and
 * borrowed only among them, and its ranges' homes and loans are its own: provider/alias.h) and every
 * stream one of t's blocks is recorded for (gp_record_stream, or freed on another stream). A pause or
 * resume of t touches the blocks of t's ranges only, so it locks these rather than every stream, and
 * the other models' allocations and frees go on while it waits for t's work and copies t's contents.
 * gp_lock_tenant_streams (pool lock held) locks them in index order, returning their thread caches'
 * blocks; the recorded streams are read under t's locks, and the set grows and is locked again until
 * it holds them all. Out of host memory for the set, it locks every stream instead (member NULL).
 * gp_unlock_stream_set unlocks and frees the set.
 */
typedef struct gp_stream_set {
    bool *member; /* by stream index (gp_stream_state.index); NULL: every stream */
    bool *recorded; /* of those, the streams t's blocks are recorded for (not t's own only) */
    unsigned count; /* streams in the table when the set was made (the pool lock keeps it) */
} gp_stream_set;
void gp_lock_tenant_streams(gp_pool_state *p, const struct gp_tenant *t, gp_stream_set *set);
void gp_unlock_stream_set(gp_pool_state *p, gp_stream_set *set);

#define GP_FLUSH_BYTES ((int64_t)16 << 20)
#define GP_MAINTAIN_FREES 4096 /* frees on one stream between maintenance runs (when configured) */

/* The unflushed deltas of the thread caches holding blocks of st (locked; provider/thread_cache.c). */
int64_t gp_thread_cache_unflushed(const gp_stream_state *st);

/*
 * The shared total's update for one stream and its thread caches (gp_account, and the caches' own
 * accounting in provider/thread_cache.h): `mine` is the caller's unflushed delta with the change in,
 * `others` what the rest of the stream's deltas (its own or its caches') hold. Together they are one
 * accumulator: when their sum reaches GP_FLUSH_BYTES either way, the sum goes to the shared total and
 * the caller keeps -others, so that the sum is 0 again. The caller stores *mine back; the return
 * value is the shared total plus the sum, which is what the peak is raised to.
 */
static inline int64_t gp_account_flush(gp_pool_state *p, int64_t *mine, int64_t others)
{
    int64_t sum = *mine + others;
    int64_t shared = atomic_load_explicit(&p->allocated_flushed, memory_order_relaxed);
    if (sum >= GP_FLUSH_BYTES || sum <= -GP_FLUSH_BYTES) {
        shared = atomic_fetch_add_explicit(&p->allocated_flushed, sum, memory_order_relaxed) + sum;
        *mine = -others;
        sum = 0;
    }
    return shared + sum;
}

/*
 * The pool's allocated bytes counted now: the shared total plus every stream's unflushed delta and its
 * thread caches' (gp_allocated_peak_candidate). `held` is a stream whose lock the caller holds, or
 * NULL; the other streams' locks (which keep their thread caches' list) are tried, never waited for,
 * since the caller holds a stream lock or a thread cache's (lock order: pool_state.h, thread_cache.h).
 * Where one is held (by another thread, or by the caller's own stream path), `estimate` is returned
 * as it is.
 */
int64_t gp_allocated_now(gp_pool_state *p, gp_stream_state *held, int64_t estimate);

/*
 * The value a new allocated peak is raised to, from `estimate`: the shared total plus the caller's
 * stream's unflushed delta (and its caches'). With one stream that is exact. With several it is over
 * by what the others freed and have not added to the shared total yet (up to GP_FLUSH_BYTES each), and
 * a peak raised to it stays over for good: the cache cap, which is (1 + cache_slack) x that peak
 * (policy/cache_cap.h), then lets the pool keep the bookkeeping's slack as if the workload had needed
 * it, up to 16 MiB per other stream (on four streams with 362 MiB live, 4% of the cap). So where the
 * estimate would raise the peak, the streams' deltas are counted (gp_allocated_now): an estimate that
 * does not pass the peak changes nothing, and one that does is rare once a workload has reached its
 * peak (a loop's later steps), so the count is paid where the peak moves (first steps, ramps), at one
 * try-lock and a few loads per stream. What stays is the other side: a peak reached while another
 * stream holds allocations it has not added yet is recorded short by those, as before.
 */
static inline int64_t gp_allocated_peak_candidate(gp_pool_state *p, gp_stream_state *held, int64_t estimate)
{
    if (estimate <= (int64_t)atomic_load_explicit(&p->allocated_peak, memory_order_relaxed) ||
        atomic_load_explicit(&p->streams.count, memory_order_relaxed) < 2)
        return estimate;
    return gp_allocated_now(p, held, estimate);
}

/*
 * Accounts `delta` allocated bytes (+ on hand-out, - on free) to st (locked). The stream's share is
 * exact; the pool's shared total is updated only when the stream's unflushed delta reaches
 * GP_FLUSH_BYTES either way. The peak is raised to the allocated bytes counted when it moves
 * (gp_allocated_peak_candidate): exact for one stream, and for several never over what was allocated
 * at once; short by less than GP_FLUSH_BYTES per other active stream while another stream's unflushed
 * delta is positive (allocated bytes not flushed yet).
 * A stream with blocks in thread caches counts their deltas as its own (gp_account_flush): the shared
 * total, and so every peak and cache cap, moves exactly as it would without the caches (one thread).
 */
static inline void gp_account(gp_pool_state *p, gp_stream_state *st, int64_t delta)
{
    st->allocated_bytes += (size_t)delta;
    int64_t mine = atomic_load_explicit(&st->unflushed, memory_order_relaxed) + delta;
    int64_t others = st->lenders != NULL ? gp_thread_cache_unflushed(st) : 0;
    int64_t total = gp_account_flush(p, &mine, others);
    atomic_store_explicit(&st->unflushed, mine, memory_order_relaxed);
    if (delta > 0) {
        total = gp_allocated_peak_candidate(p, st, total);
        gp_raise_peak(&p->allocated_peak, (size_t)total);
        gp_raise_peak(&p->window_peak, (size_t)total);
    }
}

/* Adds st's (locked) unflushed delta to the shared total (its thread caches returned first). */
static inline void gp_flush(gp_pool_state *p, gp_stream_state *st)
{
    atomic_fetch_add_explicit(&p->allocated_flushed, atomic_load_explicit(&st->unflushed, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_store_explicit(&st->unflushed, 0, memory_order_relaxed);
}

/* The pool's allocated bytes as the shared total says (exact after gp_flush_all). */
static inline size_t gp_allocated_estimate(gp_pool_state *p)
{
    int64_t v = atomic_load_explicit(&p->allocated_flushed, memory_order_relaxed);
    return v > 0 ? (size_t)v : 0;
}

/*
 * Adds one event to the pool's history when recording is on (one relaxed load when it is off). Any
 * lock may be held: the history's mutex is a leaf. The time is the backend's clock.
 */
static inline void gp_history_note(gp_pool_state *p, unsigned action, uintptr_t addr, size_t size, gp_stream stream,
                                   unsigned tenant)
{
    if (atomic_load_explicit(&p->history_on, memory_order_relaxed)) {
        gp_history *h = atomic_load_explicit(&p->history, memory_order_acquire);
        if (h != NULL) {
            gp_history_entry e = {.time_ns = gp_backend_now(p->ops, p->ctx), .addr = addr, .size = size,
                                  .stream = (uint64_t)(uintptr_t)stream, .action = (uint8_t)action,
                                  .tenant = (uint8_t)tenant};
            gp_history_add(h, &e);
        }
    }
}

/* Flushes every stream, so that the shared total is exact. Pool lock held, no stream lock. */
void gp_flush_all(gp_pool_state *p);

/* The pool's cached bytes from the shared totals: reserved + paused - allocated (a paused tenant's
 * blocks count as allocated but hold no device memory; see the invariant above). Pool lock held. */
static inline size_t gp_cached_estimate(gp_pool_state *p)
{
    size_t have = atomic_load(&p->reserved) + p->paused_bytes, allocated = gp_allocated_estimate(p);
    return have > allocated ? have - allocated : 0;
}

/* The heap of `st` that holds blocks of segment kind `small`. */
static inline gp_heap *gp_heap_of(gp_stream_state *st, bool small)
{
    return small ? &st->small : &st->large;
}

/*
 * Marks b LIVE for a request of `size` on st (locked) and accounts for it. pre: room in st->live was
 * reserved (gp_block_map_reserve) before b was taken.
 */
static inline void gp_hand_out(gp_pool_state *p, gp_stream_state *st, gp_block *b, size_t size)
{
    b->state = GP_BLOCK_LIVE;
    b->requested = size;
    b->use_count = 0;
    bool inserted = gp_block_map_insert(&st->live, b);
    assert(inserted); /* room was reserved before the block was taken */
    (void)inserted;
    st->num_allocs++;
    st->size_class_allocs[gp_stats_bucket(size)]++;
    gp_account(p, st, (int64_t)b->size);
    st->requested_bytes += size;
    st->kind_allocs[b->segment->small]++;
    st->kind_alloc_bytes[b->segment->small] += b->size;
    gp_history_note(p, GP_HIST_ALLOC, b->addr, size, st->handle, st->tenant->index);
}

/* ---- checks (gp_check, api/check.c, calls them under every lock) ---- */

/* Checks the pool's accounting against the segments' tally (allocated + cached == reserved + paused,
 * the streams' counters, the shared total; see the top of this file) and each tenant's held bytes
 * against its segments. false with the broken invariant described in why[len]. */
bool gp_accounting_check(gp_pool_state *p, const gp_segment_tally *tally, size_t segments, size_t reserved,
                         char *why, size_t len);

#endif /* GP_POOL_STATE_H */
