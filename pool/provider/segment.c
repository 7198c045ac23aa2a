/*
 * segment.c — the segment provider (provider.h): device memory in segments of one device allocation
 * each (backends cuda and sim). A stream grows by a new segment; free segments move whole to other
 * streams (ordered by a fence event) and go back to the device whole (on OOM, above the cache cap,
 * idle_release, release_threshold, gp_trim).
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "policy/cache_cap.h"
#include "policy/segment_size.h"
#include "provider/capture_window.h"
#include "provider/pending.h"
#include "provider/thread_cache.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"

/* st's fence event (st locked), taken from the event pool on first use; NULL when none is to be had
 * or a graph is being captured (no event record or query then). */
static gp_event fence_event(gp_pool_state *p, gp_stream_state *st)
{
    if (gp_capture_underway())
        return NULL;
    if (st->fence == NULL && gp_event_pool_get(&p->events, &st->fence) != GP_OK)
        st->fence = NULL;
    return st->fence;
}

/* Records st's fence now (st locked): it covers everything st has freed so far. */
static bool fence_record(gp_pool_state *p, gp_stream_state *st)
{
    if (p->ops->event_record(p->ctx, st->fence, st->handle) != GP_OK)
        return false;
    st->fence_seq = st->free_seq;
    st->fence_recorded = true;
    return true;
}

/* st's fence in flight has completed: what it covers is idle on the device. st locked. */
static void fence_completed(gp_stream_state *st)
{
    st->done_seq = st->fence_seq;
    st->fence_recorded = false;
}

/* Whether st's fence in flight covers the uses stamped up to `seq`, recording it now where it does not
 * (which replaces it: done_seq moves when the new one completes); false when the record fails.
 * pre: fence_event(p, st) != NULL. st locked. */
static bool fence_covers(gp_pool_state *p, gp_stream_state *st, uint64_t seq)
{
    return (st->fence_recorded && st->fence_seq >= seq) || fence_record(p, st);
}

/* Polls st's fence (provider.h: generations) and returns done_seq. st locked. */
static uint64_t fence_poll(gp_pool_state *p, gp_stream_state *st)
{
    if (st->lenders != NULL) /* a block lent to a thread cache is stamped when it comes back */
        gp_thread_cache_return(p, st);
    if (st->done_seq == st->free_seq || fence_event(p, st) == NULL)
        return st->done_seq;
    if (st->fence_recorded) {
        if (p->ops->event_query(p->ctx, st->fence) != GP_OK)
            return st->done_seq; /* still in flight: it is not recorded anew (provider.h: why) */
        fence_completed(st);
    }
    if (st->done_seq < st->free_seq && fence_record(p, st) && p->ops->event_query(p->ctx, st->fence) == GP_OK)
        fence_completed(st);
    assert(st->done_seq <= st->free_seq && (!st->fence_recorded || st->fence_seq <= st->free_seq));
    return st->done_seq;
}

uint64_t gp_stream_done(gp_pool_state *p, gp_stream_state *st)
{
    return fence_poll(p, st);
}

bool gp_stream_done_upto(gp_pool_state *p, gp_stream_state *st, uint64_t seq)
{
    return seq <= st->done_seq || seq <= fence_poll(p, st);
}

/* Blocks the host on st's fence in flight when `covered` (it covers what the caller waits for), else
 * synchronizes the device (no event to be had, or its record failed). st locked. */
static int host_wait(gp_pool_state *p, gp_stream_state *st, bool covered)
{
    if (!covered) {
        atomic_fetch_add(&p->num_device_syncs, 1);
        return p->ops->device_synchronize(p->ctx);
    }
    int rc = p->ops->event_synchronize(p->ctx, st->fence);
    if (rc != GP_OK)
        return rc; /* the record stays in flight; a later poll completes it */
    atomic_fetch_add(&p->num_unmap_waits, 1);
    fence_completed(st);
    return GP_OK;
}

int gp_stream_wait_upto(gp_pool_state *p, gp_stream_state *st, uint64_t seq)
{
    assert(seq <= st->free_seq);
    if (gp_stream_done_upto(p, st, seq))
        return GP_OK;
    bool covered = fence_event(p, st) != NULL && fence_covers(p, st, seq);
    int rc = host_wait(p, st, covered);
    assert(rc != GP_OK || !covered || seq <= st->done_seq);
    return rc;
}

int gp_stream_drain(gp_pool_state *p, gp_stream_state *st)
{
    bool recorded = fence_event(p, st) != NULL && fence_record(p, st); /* covers all queued so far */
    int rc = host_wait(p, st, recorded);
    assert(rc != GP_OK || !recorded || st->done_seq == st->free_seq);
    return rc;
}

/* Whether taker's stream can be made to wait for the uses of owner's blocks stamped `seq` (owner
 * locked), and with `commit` the wait, on the fence that covers seq (fence_covers). */
static bool fence_wait(gp_pool_state *p, gp_stream_state *owner, gp_stream_state *taker, uint64_t seq, bool commit)
{
    if (fence_event(p, owner) == NULL)
        return false;
    if (!commit)
        return true;
    if (!fence_covers(p, owner, seq))
        return false;
    if (p->ops->stream_wait_event(p->ctx, taker->handle, owner->fence) != GP_OK)
        return false;
    atomic_fetch_add(&p->num_stream_waits, 1);
    return true;
}

bool gp_stream_reusable(gp_pool_state *p, gp_stream_state *owner, gp_stream_state *taker, uint64_t seq, bool commit)
{
    if (gp_stream_done_upto(p, owner, seq))
        return true;
    if (!p->cfg.reuse_wait || owner->tenant != taker->tenant || owner->handle == taker->handle)
        return false;
    return fence_wait(p, owner, taker, seq, commit);
}

void gp_segment_restamp(gp_stream_state *st, gp_segment *seg, bool waited)
{
    if (waited)
        gp_stream_lock(st);
    for (gp_block *b = seg->first; b != NULL; b = b->next)
        if (b->state == GP_BLOCK_FREE)
            b->free_seq = waited ? gp_heap_free_stamp(gp_heap_of(st, seg->small)) : 0;
    if (waited)
        gp_stream_unlock(st);
}

/*
 * Takes the smallest wholly free segment of another stream that fits `size`: only one whose owner's
 * fence has completed or, when `wait` (at device OOM, with steal_wait) or the owner is a stream of st's
 * tenant (with steal_wait), one whose fence st is then made to wait on. Within a tenant the wait is
 * what the cache cap's alternative costs less than: past the cap, a stream that cannot take a free
 * segment gives unfit ones back (cudaFree, which synchronizes the whole device) and allocates anew;
 * a wait delays one stream by one other stream's queued work, and only on these rare steals.
 * Replayed with busy streams (--stream-work 1) it keeps the idle-stream figures (sets J and K:
 * geomean 1.2013 -> 1.1742 and 1.2309 -> 1.2139 against no wait; bench/RESULTS.md). Across tenants
 * only at OOM: one model's stream does not wait on another's work otherwise. The segment is
 * returned with owner == st and its single FREE block on no list: the caller puts it in st's heap.
 * While in transit it is reachable only through the segment list, i.e. by pool-lock holders.
 * Pool lock held, no stream lock. NULL when none may be taken.
 */
static gp_segment *steal_segment(gp_pool_state *p, gp_stream_state *st, size_t size, bool small, bool wait)
{
    /* The smallest wholly free segment of another stream that fits and may be taken. */
    gp_segment *best = NULL;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->owner == st || seg->small != small || seg->size < size || seg->pages != NULL)
            continue;
        if (seg->owner->tenant != st->tenant) { /* memory changes tenant: both budgets must allow it */
            size_t max = atomic_load(&st->tenant->max);
            if (!gp_tenant_can_give(seg->owner->tenant, seg->size) || st->tenant->paused ||
                (max != 0 && gp_tenant_charged(st->tenant) + seg->size > max))
                continue;
        }
        if (best != NULL && seg->size >= best->size)
            continue;
        gp_stream_state *owner = seg->owner;
        gp_stream_lock(owner);
        bool may_wait = wait || (p->cfg.steal_wait && owner->tenant == st->tenant);
        uint64_t seq = seg->first->free_seq;
        bool usable = gp_segment_wholly_free(seg) &&
                      (gp_stream_done_upto(p, owner, seq) || (may_wait && fence_wait(p, owner, st, seq, false)));
        gp_stream_unlock(owner);
        if (usable)
            best = seg;
    }
    if (best == NULL)
        return NULL;
    gp_stream_state *owner = best->owner;
    gp_stream_lock(owner);
    bool taken = false, waited = false;
    if (gp_segment_wholly_free(best)) { /* the owner may have allocated from it since */
        uint64_t seq = best->first->free_seq;
        bool ready = gp_stream_done_upto(p, owner, seq);
        bool may_wait = wait || (p->cfg.steal_wait && owner->tenant == st->tenant);
        if (!ready && may_wait && fence_wait(p, owner, st, seq, true))
            ready = waited = true;
        if (ready && gp_pool_ledger_move(p, owner->tenant, st->tenant, best->size) != GP_OK)
            ready = false; /* the taker's GPU-wide max does not allow it */
        if (ready) {
            gp_heap_remove(gp_heap_of(owner, small), best->first);
            best->owner = st;
            gp_tenant_charge(owner->tenant, -(int64_t)best->size);
            gp_tenant_charge(st->tenant, (int64_t)best->size);
            atomic_fetch_add(&p->num_stream_steals, 1);
            taken = true;
        }
    }
    gp_stream_unlock(owner);
    if (taken)
        gp_segment_restamp(st, best, waited);
    return taken ? best : NULL;
}

/* Gives one wholly free segment (owner locked) back to the device; GP_OK or the backend's error. */
static int release_segment_locked(gp_pool_state *p, gp_segment *seg)
{
    gp_stream_state *owner = seg->owner;
    gp_heap *heap = gp_heap_of(owner, seg->small);
    gp_heap_remove(heap, seg->first);
    int rc = p->ops->mem_free(p->ctx, seg->addr, seg->size);
    if (rc != GP_OK) {
        gp_heap_insert(heap, seg->first); /* nothing lost: it stays cached */
        return rc;
    }
    gp_segment_unlink(p, seg);
    gp_history_note(p, GP_HIST_SEGMENT_FREE, seg->addr, seg->size, owner->handle, owner->tenant->index);
    atomic_fetch_sub(&p->reserved, seg->size);
    atomic_fetch_add(&p->num_device_frees, 1);
    gp_tenant_charge(owner->tenant, -(int64_t)seg->size);
    gp_pool_ledger_credit(p, owner->tenant, seg->size, seg->size);
    gp_block_recycle(&owner->blocks, seg->first);
    free(seg);
    return GP_OK;
}

/* Gives one wholly free segment back (GP_ERR_INVALID if it is not wholly free). */
static int release_segment(gp_pool_state *p, gp_segment *seg)
{
    gp_stream_state *owner = seg->owner;
    gp_stream_lock(owner);
    int rc = gp_segment_wholly_free(seg) ? release_segment_locked(p, seg) : GP_ERR_INVALID;
    gp_stream_unlock(owner);
    return rc;
}

/* Gives wholly free segments back to the device, oldest first, until `want` bytes are released or
 * cached bytes are at most `keep` (whichever comes first); returns bytes released. Device failures keep
 * the segment cached; *failed (optional) receives the first failure's code. `only` (NULL = any) limits
 * it to one tenant's segments; a `taker` (NULL = none) releases memory of other tenants only down to
 * their min. */
static size_t release_free_segments(gp_pool_state *p, size_t want, size_t keep, int *failed, const gp_tenant *only,
                                const gp_tenant *taker)
{
    size_t released = 0;
    if (failed != NULL)
        *failed = GP_OK;
    if (gp_capture_underway()) /* cudaFree synchronises the device: never while a graph is captured */
        return 0;
    gp_segment *seg = p->segments_head;
    while (seg != NULL && released < want) {
        size_t cached = gp_cached_estimate(p);
        if (cached <= keep)
            break;
        gp_segment *next = seg->next;
        gp_stream_state *owner = seg->owner;
        if ((only != NULL && owner->tenant != only) ||
            (taker != NULL && owner->tenant != taker && !gp_tenant_can_give(owner->tenant, seg->size))) {
            seg = next;
            continue;
        }
        gp_stream_lock(owner);
        if (seg->pages == NULL && gp_segment_wholly_free(seg)) {
            size_t size = seg->size;
            int rc = release_segment_locked(p, seg);
            if (rc == GP_OK)
                released += size;
            else if (failed != NULL && *failed == GP_OK)
                *failed = rc;
        }
        gp_stream_unlock(owner);
        seg = next;
    }
    return released;
}

/*
 * Gives back st's own wholly free segments of the kind (small or large) it is about to grow, oldest
 * first, until `want` bytes are released; returns bytes released. Pool lock held, no stream lock.
 */
static size_t release_own_unfit(gp_pool_state *p, gp_stream_state *st, bool small, size_t want)
{
    size_t released = 0;
    for (gp_segment *seg = p->segments_head, *next; seg != NULL && released < want; seg = next) {
        next = seg->next;
        if (seg->owner != st || seg->small != small || seg->pages != NULL)
            continue;
        size_t size = seg->size;
        if (release_segment(p, seg) == GP_OK) /* not wholly free, or a failure: it stays cached */
            released += size;
    }
    return released;
}

/*
 * Before st grows its `small` (or large) heap by `bytes` past `cap`: gives back wholly free segments.
 *
 * When the wholly free segments of the whole pool can bring it under the cap, they go, oldest first,
 * whatever their stream or kind: the pool then holds no more than the demand it has seen.
 *
 * When they cannot, st's own wholly free segments of the kind it grows still go, as many as the excess
 * (oldest first), but only when the growth would raise the pool's high-water mark (reserved_peak).
 * Why these: st's heap has just missed with them in it, so they are sizes its work no longer fits at
 * this point (a serving loop whose batch grew, a step whose shapes changed); kept, the new segment
 * would stack on top of them, and every byte of them released before the growth is a byte off the
 * high-water mark (growth follows anyway, so releasing part is not "device calls for nothing").
 * Why only those: other streams' free segments are their own next steps' working set (released, they
 * come back as growth of those streams, device calls in every pass), and free segments of the other
 * kind cannot hold this request while its kind's demand returns with the next small (or large) request.
 * Why only above the high-water mark: below it the growth takes nothing the device has not already
 * given this pool; releasing there would not lower the peak, only cost device calls in steady state.
 */
static void release_over_cap(gp_pool_state *p, gp_stream_state *st, bool small, size_t bytes, size_t cap)
{
    size_t reserved = atomic_load(&p->reserved);
    if (cap == SIZE_MAX || reserved + bytes <= cap || gp_capture_underway())
        return;
    const gp_tenant *taker = st->tenant;
    size_t releasable = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        gp_stream_lock(seg->owner);
        if (seg->pages == NULL && gp_segment_wholly_free(seg) &&
            (seg->owner->tenant == taker || gp_tenant_can_give(seg->owner->tenant, seg->size)))
            releasable += seg->size;
        gp_stream_unlock(seg->owner);
    }
    size_t excess = reserved + bytes - cap;
    if (releasable >= excess)
        release_free_segments(p, excess, 0, NULL, NULL, taker);
    else if (reserved + bytes > atomic_load(&p->reserved_peak))
        release_own_unfit(p, st, small, excess);
}

/* Allocates a new segment of `bytes` on the device for st, returned with its single FREE block on no
 * list (the caller adopts it), charged to st's tenant once its budget admits it. Pool lock held, no
 * stream lock. */
static int grow(gp_pool_state *p, gp_stream_state *st, size_t bytes, bool small, gp_segment **out)
{
    int admitted = gp_provider_admit(p, st->tenant, bytes, bytes);
    if (admitted != GP_OK)
        return admitted;
    gp_segment *seg = gp_segment_new();
    if (seg == NULL)
        return gp_error_set(GP_ERR_OOM, "out of host memory for segment metadata");
    int rc = gp_pool_ledger_charge(p, st->tenant, bytes, bytes, true); /* before the device call */
    if (rc != GP_OK) {
        gp_segment_discard(seg);
        return rc;
    }
    gp_devptr addr = 0;
    rc = p->ops->mem_alloc(p->ctx, bytes, &addr);
    if (rc != GP_OK) {
        gp_pool_ledger_credit(p, st->tenant, bytes, bytes);
        gp_segment_discard(seg);
        return rc;
    }
    gp_segment_place(p, seg, st, addr, bytes, small, bytes, GP_BLOCK_FREE);
    size_t reserved = atomic_fetch_add(&p->reserved, bytes) + bytes;
    gp_raise_peak(&p->reserved_peak, reserved);
    atomic_fetch_add(&p->num_device_allocs, 1);
    gp_tenant_charge(st->tenant, (int64_t)bytes);
    gp_history_note(p, GP_HIST_SEGMENT_ALLOC, addr, bytes, st->handle, st->tenant->index);
    *out = seg;
    return GP_OK;
}

/*
 * The allocation slow path over device allocations, one step at a time (pool lock held):
 *   1. take from st's heap, with completed pending frees returned to it;
 *   2. above the cache cap, take a wholly free segment of another stream (whose fence has completed);
 *   3. above the cap, give unfit free segments back first (release_over_cap: enough of the pool's to
 *      come under the cap, else st's own of the kind it grows, when the growth would set a new
 *      high-water mark), then grow by a new segment of the policy's size (policy/segment_size.c), or of
 *      just enough whole pages when that fails;
 *   4. at device OOM, return all streams' completed pending frees and steal again, waiting on the
 *      owner's fence when steal_wait is set;
 *   5. at OOM, give every wholly free segment back (others' only down to their min) and grow once more.
 */
static int alloc_segments(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool small,
                          size_t own_fit, void **out)
{
    (void)own_fit; /* segments move between streams whole (steals), blocks never: 0 */
    int rc = GP_OK;
    gp_block *b = gp_provider_take(p, st, NULL, small, rsize, size);
    gp_segment *seg = NULL;
    size_t bytes = gp_segment_size_for(&p->cfg, rsize, small);
    size_t cap = gp_cache_cap(&p->cfg, gp_allocated_estimate(p), atomic_load(&p->allocated_peak), rsize);
    bool over_cap = cap != SIZE_MAX && atomic_load(&p->reserved) + bytes > cap;
    /* Under the cap the stream grows; above it, it first takes a free segment another stream no
     * longer uses (whose fence has completed), then gives unfit free segments back. */
    if (b == NULL && over_cap && (seg = steal_segment(p, st, rsize, small, false)) != NULL)
        b = gp_provider_take(p, st, seg, small, rsize, size);
    if (b == NULL) {
        size_t just_enough = gp_round_up(rsize, GP_DEVICE_PAGE);
        if (over_cap)
            release_over_cap(p, st, small, bytes, cap);
        rc = grow(p, st, bytes, small, &seg);
        if ((rc == GP_ERR_OOM || rc == GP_ERR_QUOTA || rc == GP_ERR_MIN_GUARANTEE) && bytes > just_enough) {
            bytes = just_enough;
            rc = grow(p, st, bytes, small, &seg);
        }
        if (rc == GP_ERR_OOM) /* other streams' completed cross-stream frees may free whole segments */
            gp_collect_all_pending(p);
        if (rc == GP_ERR_OOM && (seg = steal_segment(p, st, rsize, small, p->cfg.steal_wait)) != NULL)
            rc = GP_OK;
        if (rc == GP_ERR_OOM || rc == GP_ERR_MIN_GUARANTEE) {
            /* Give wholly free segments back, oldest first (others' only down to their min), and try
             * once more. */
            atomic_fetch_add(&p->num_alloc_retries, 1);
            if (release_free_segments(p, bytes, 0, NULL, NULL, st->tenant) > 0)
                rc = grow(p, st, bytes, small, &seg);
        }
        if (rc == GP_OK) {
            b = gp_provider_take(p, st, seg, small, rsize, size);
            if (b == NULL)
                rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
        } else if (rc == GP_ERR_MIN_GUARANTEE) {
            atomic_fetch_add(&p->num_ooms, 1);
            rc = GP_ERR_OOM; /* the admission's message says whose guarantee */
        } else if (rc == GP_ERR_OOM) {
            rc = gp_provider_out_of_memory(p, size, st->handle);
        }
    }
    if (b != NULL)
        *out = (void *)b->addr;
    return rc;
}


/* Gives back wholly free segments (device allocations) free since before idle_before. */
static size_t release_idle_segments(gp_pool_state *p, uint64_t idle_before, int *failed)
{
    size_t released = 0;
    if (gp_capture_underway()) /* cudaFree synchronises the device: never while a graph is captured */
        return 0;
    for (gp_segment *seg = p->segments_head, *next; seg != NULL; seg = next) {
        next = seg->next;
        if (seg->pages != NULL)
            continue;
        gp_stream_state *owner = seg->owner;
        gp_stream_lock(owner);
        bool idle = gp_segment_wholly_free(seg) && seg->first->free_since <= idle_before;
        gp_stream_unlock(owner);
        if (!idle)
            continue;
        size_t size = seg->size;
        int rc = release_segment(p, seg);
        if (rc == GP_OK)
            released += size;
        else if (*failed == GP_OK)
            *failed = rc;
    }
    return released;
}

/* provider.h: with idle_before, what has been free since before it (idle_release, which passes keep
 * 0); else down to `keep` cached bytes (release_threshold, gp_trim). */
static size_t release(gp_pool_state *p, size_t keep, uint64_t idle_before, int *failed)
{
    if (idle_before != UINT64_MAX)
        return release_idle_segments(p, idle_before, failed);
    return release_free_segments(p, SIZE_MAX, keep, failed, NULL, NULL);
}

static size_t release_tenant(gp_pool_state *p, gp_tenant *t, size_t want, int *failed)
{
    return release_free_segments(p, want, 0, failed, t, NULL);
}

static size_t destroy(gp_pool_state *p, int *failed)
{
    size_t not_returned = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        int rc = p->ops->mem_free(p->ctx, seg->addr, seg->size);
        if (rc != GP_OK) {
            not_returned += seg->size;
            if (*failed == GP_OK)
                *failed = rc;
        }
    }
    return not_returned;
}

static const char *check_segment(gp_pool_state *p, gp_segment *seg)
{
    (void)p;
    return seg->mapped_bytes == seg->size ? NULL : "a device allocation's mapped_bytes is not its size";
}

const gp_provider gp_provider_segments = {
    .name = "segments",
    .pages = false,
    .borrows_blocks = false,
    .alloc = alloc_segments,
    .release = release,
    .release_tenant = release_tenant,
    .destroy = destroy,
    .check_segment = check_segment,
};
