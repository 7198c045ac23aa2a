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

#include "backend.h"
#include "block.h"
#include "config.h"
#include "event_pool.h"
#include "stream.h"
#include "tenant.h"
#include "trace_log.h"

#define GP_POOL_MAGIC_LIVE 0x6770706f6f6c4c56ull /* "gppoolLV" */
#define GP_POOL_MAGIC_DEAD 0x6770706f6f6c4444ull /* "gppoolDD" */

typedef struct gp_pool_state {
    uint64_t serial; /* unique per pool in this process (per-thread caches compare it) */
    int device;
    gp_config cfg;
    const gp_backend_ops *ops;
    void *ctx;
    size_t device_total; /* the device's total memory, read at create */

    pthread_mutex_t lock; /* the pool lock: segments list, new streams, device allocation, steals */
    gp_stream_table streams;
    gp_tenant_registry tenants;
    gp_event_pool events;
    gp_segment *segments_head, *segments_tail; /* oldest first */
    size_t segment_count;
    uint64_t next_serial;
    gp_trace_log *log;

    /* Virtual memory backends (vmm.c): page is the mapping granularity (0 on other backends); the
     * pooled handles are physical pages mapped nowhere, kept for reuse (pool lock). */
    size_t page;
    size_t paused_bytes;     /* bytes of paused ranges' blocks, which hold no device memory (pause.c) */
    void *staging_hooks;     /* staging.c: the jemalloc arena's hooks, NULL before first use */
    unsigned staging_arena;
    gp_phys *pooled;
    uint64_t *pooled_since;
    size_t pooled_count, pooled_capacity;
    atomic_uint_fast64_t num_maps, num_unmaps, num_stitches, idle_released_bytes;
    atomic_uint_fast64_t coarse_now;     /* the clock (ns) as of the last slow path or maintenance */
    atomic_uint_fast64_t frees_since_maintain;
    bool maintains;                      /* release_threshold or idle_release is set */

    /* Allocated bytes are exact per stream (stream->allocated_bytes); the shared total below lags
     * each stream by its `unflushed` delta, under GP_FLUSH_BYTES, so that the fast paths of several
     * streams do not write one cache line. See gp_account. */
    atomic_int_fast64_t allocated_flushed;
    atomic_size_t allocated_peak;
    /* Changed under the pool lock only; atomic so that readers need no lock. */
    atomic_size_t reserved, reserved_peak;
    atomic_uint_fast64_t num_device_allocs, num_device_frees, num_alloc_retries, num_ooms;
    atomic_uint_fast64_t num_stream_steals, num_stream_waits;
    atomic_uint_fast64_t num_borrows; /* blocks handed out from another stream's heap (alloc.c) */
} gp_pool_state;

struct gp_pool {
    uint64_t magic;
    gp_pool_state *state;   /* NULL once destroyed */
    struct gp_pool *grave_next; /* destroyed shells are kept so stale handles are recognised */
};

/* Validates a handle; on success *out is its state. `fn` names the API call in messages. */
int gp_pool_enter(gp_pool *pool, const char *fn, gp_pool_state **out);

/*
 * The calling thread's state for `stream`: its tenant resolved (gp_tenant_resolve), added when `add`
 * and the pool has not seen the pair (else *out may be NULL). A one-entry per-thread cache keyed by the
 * pool's serial, the stream, the thread's tenant generation and the pool's bind epoch answers repeated
 * calls without the two hash lookups.
 */
int gp_pool_current_state(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out);

/* The state of (stream, tenant index), adding it (under the pool lock) when the pool has not seen it. */
int gp_pool_stream(gp_pool_state *p, gp_stream handle, unsigned tenant, gp_stream_state **out);

/* Appends seg to the pool's list of segments (newest last) / takes it out. Pool lock held. */
void gp_segment_link(gp_pool_state *p, gp_segment *seg);
void gp_segment_unlink(gp_pool_state *p, gp_segment *seg);

/* Locks / unlocks every stream in index order (caller holds the pool lock). */
void gp_lock_all_streams(gp_pool_state *p);
void gp_unlock_all_streams(gp_pool_state *p);

#define GP_FLUSH_BYTES ((int64_t)16 << 20)
#define GP_MAINTAIN_FREES 4096 /* frees on one stream between maintenance runs (when configured) */

/* Raises *peak to at least value. */
static inline void gp_raise_peak(atomic_size_t *peak, size_t value)
{
    size_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (seen < value && !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed,
                                                                  memory_order_relaxed)) {
    }
}

/*
 * Accounts `delta` allocated bytes (+ on hand-out, - on free) to st (locked). The stream's share is
 * exact; the pool's shared total is updated only when the stream's unflushed delta reaches
 * GP_FLUSH_BYTES either way. The peak is raised to the shared total plus this stream's unflushed delta:
 * exact for one stream, and short by less than GP_FLUSH_BYTES per other active stream otherwise.
 */
static inline void gp_account(gp_pool_state *p, gp_stream_state *st, int64_t delta)
{
    st->allocated_bytes += (size_t)delta;
    st->unflushed += delta;
    int64_t shared = atomic_load_explicit(&p->allocated_flushed, memory_order_relaxed);
    if (st->unflushed >= GP_FLUSH_BYTES || st->unflushed <= -GP_FLUSH_BYTES) {
        shared = atomic_fetch_add_explicit(&p->allocated_flushed, st->unflushed, memory_order_relaxed) +
                 st->unflushed;
        st->unflushed = 0;
    }
    if (delta > 0)
        gp_raise_peak(&p->allocated_peak, (size_t)(shared + st->unflushed));
}

/* Adds st's (locked) unflushed delta to the shared total. */
static inline void gp_flush(gp_pool_state *p, gp_stream_state *st)
{
    atomic_fetch_add_explicit(&p->allocated_flushed, st->unflushed, memory_order_relaxed);
    st->unflushed = 0;
}

/* The pool's allocated bytes as the shared total says (exact after gp_flush_all). */
static inline size_t gp_allocated_estimate(gp_pool_state *p)
{
    int64_t v = atomic_load_explicit(&p->allocated_flushed, memory_order_relaxed);
    return v > 0 ? (size_t)v : 0;
}

/* Flushes every stream, so that the shared total is exact. Pool lock held, no stream lock. */
void gp_flush_all(gp_pool_state *p);

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
/* True when all of st's work up to its last free into its heap has completed (its fence event, recorded
 * anew if st freed since, has completed): st's free blocks are then idle on the device. st locked. */
bool gp_stream_idle(gp_pool_state *p, gp_stream_state *st);
/*
 * Takes the smallest unused segment of another stream that holds `size` bytes (a wholly free device
 * allocation, or a virtual range with nothing live in it: gp_segment_unused): only one whose owner's
 * fence has completed or, when `wait`, one whose fence st is then made to wait on. The segment is
 * returned with owner == st and its FREE blocks on no list: the caller puts them in st's heap.
 * While in transit it is reachable only through the segment list, i.e. by pool-lock holders.
 * Pool lock held, no stream lock. NULL when none may be taken.
 */
gp_segment *gp_steal_segment(gp_pool_state *p, gp_stream_state *st, size_t size, bool small, bool wait);
/* Gives wholly free segments back to the device, oldest first, until `want` bytes are released or
 * cached bytes are at most `keep` (whichever comes first); returns bytes released. Pool lock held, no
 * stream lock. Device failures keep the segment cached; *failed (optional) receives the first
 * failure's code. `only` (NULL = any) limits it to one tenant's segments; a `taker` (NULL = none)
 * releases memory of other tenants only down to their min. */
size_t gp_release_free_segments(gp_pool_state *p, size_t want, size_t keep, int *failed, const gp_tenant *only,
                                const gp_tenant *taker);
/* Gives one wholly free device-allocation segment back (GP_ERR_INVALID if it is not wholly free). Pool
 * lock held, no stream lock. */
int gp_release_segment(gp_pool_state *p, gp_segment *seg);
/* Returns every stream's completed pending blocks and quick-listed blocks to its free lists
 * (coalescing), so that wholly free segments and pages show. Pool lock held, no stream lock. */
void gp_collect_all_pending(gp_pool_state *p);
/*
 * The most device memory the pool means to hold once it serves a request of `rsize`:
 * (1 + cache_slack) x max(peak allocated, allocated + rsize), and at least GP_CAP_FLOOR_SEGMENTS large
 * segments (so that small workloads on several streams simply grow); SIZE_MAX when cache_slack is off.
 * Below the cap a stream that misses grows; above it, it first takes another stream's free segment or
 * gives unfit free segments back.
 */
size_t gp_cache_cap(gp_pool_state *p, size_t rsize);
#define GP_CAP_FLOOR_SEGMENTS 4
/*
 * Before growing by `bytes` past `cap`: gives back wholly free segments, oldest first, but only when
 * that brings the pool under the cap (releasing less would only trade device calls for nothing).
 * Pool lock held, no stream lock.
 */
void gp_release_over_cap(gp_pool_state *p, size_t bytes, size_t cap, const gp_tenant *taker);

/* ---- vmm.c ---- */
/* The slow-path growth on a virtual memory backend: makes a FREE block of at least `rsize` in st's
 * heap of kind `small` by mapping pooled, stitched or new physical pages into st's ranges. Pool lock
 * held, no stream lock. */
int gp_vmm_grow(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small);
/* Gives back physical memory until at most `keep` bytes are cached, taking only pages idle since
 * before `idle_before` (UINT64_MAX = any). Returns bytes released; *failed gets the first error. Pool
 * lock held, no stream lock. */
size_t gp_vmm_release(gp_pool_state *p, size_t keep, uint64_t idle_before, int *failed);
/* Unmaps the n mappings of one page each from va: with the backend's unmap_run (one device synchronize
 * for all) or page by page. *done receives the pages unmapped, always the first ones; a failure stops
 * there (the rest stay mapped). Counts nothing: the caller accounts for the pages. */
int gp_vmm_unmap_run(gp_pool_state *p, uintptr_t va, size_t n, size_t *done);
/* A physical page: from the page pool, else new from the device (reserved bytes and peak counted). */
int gp_vmm_page_get(gp_pool_state *p, gp_phys *out);
/* Gives a page back to the device; one the device refuses stays in the page pool (nothing lost). */
int gp_vmm_page_release(gp_pool_state *p, gp_phys handle);
/* Gives back up to `want` bytes of tenant t's free pages. Pool lock held, no stream lock. */
size_t gp_vmm_release_tenant(gp_pool_state *p, gp_tenant *t, size_t want, int *failed);
/* Unmaps and releases everything at destroy; returns bytes that could not be given back. */
size_t gp_vmm_destroy(gp_pool_state *p, int *failed);
/* Checks the virtual-memory invariants of seg (owner locked); NULL or the broken one's description. */
const char *gp_vmm_check_segment(gp_pool_state *p, gp_segment *seg);

/* ---- tenant.c ---- */
/* Fills out[0..capacity) for every tenant (pool lock and every stream lock held); returns the count. */
int gp_tenant_snapshot_all(gp_pool_state *p, gp_tenant_stats *out, unsigned capacity);

/* ---- staging.c ---- */
int gp_staging_alloc(gp_pool_state *p, size_t size, void **out);
void gp_staging_free(gp_pool_state *p, void *mem, size_t size);
void gp_staging_destroy(gp_pool_state *p);
/* "jemalloc" (an arena over host_alloc) or "host_alloc" (jemalloc could not be opened: one per buffer). */
const char *gp_staging_kind(gp_pool_state *p);

/* ---- maintain.c ---- */
/* The pool's clock in ns: virtual time on the simulated GPU, CLOCK_MONOTONIC otherwise. */
uint64_t gp_clock_now(gp_pool_state *p);
/* Runs release_threshold and idle_release. Pool lock held. */
size_t gp_maintain_locked(gp_pool_state *p, int *failed);

#endif /* GP_POOL_STATE_H */
