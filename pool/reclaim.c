/*
 * reclaim.c — moving cached memory where it is needed: free segments from one stream to another
 * (ordered by a fence event), and wholly free segments back to the device (on OOM, and gp_trim).
 */
#include <assert.h>
#include <stdlib.h>

#include "error.h"
#include "pool_state.h"

/*
 * True when every use of st's free memory so far is known to be finished: st's fence event, recorded
 * after the last free into its heap, has completed. Records the fence anew when st freed since.
 * st locked; *recorded tells the caller that a fence exists to wait on.
 */
static bool fence_ready(gp_pool_state *p, gp_stream_state *st, bool *recorded)
{
    *recorded = false;
    if (st->fence == NULL && gp_event_pool_get(&p->events, &st->fence) != GP_OK) {
        st->fence = NULL;
        return false;
    }
    if (!st->fence_recorded || st->fence_dirty) {
        if (p->ops->event_record(p->ctx, st->fence, st->handle) != GP_OK)
            return false;
        st->fence_recorded = true;
        st->fence_dirty = false;
    }
    *recorded = true;
    return p->ops->event_query(p->ctx, st->fence) == GP_OK;
}

bool gp_stream_idle(gp_pool_state *p, gp_stream_state *st)
{
    bool recorded;
    return fence_ready(p, st, &recorded);
}

gp_segment *gp_steal_segment(gp_pool_state *p, gp_stream_state *st, size_t size, bool small, bool wait)
{
    /* The smallest unused segment of another stream that holds `size` bytes and may be taken: a wholly
     * free device allocation, or a virtual range whose mapped pages are all free (its UNMAPPED address
     * space goes with it, so the new owner can grow it in place). */
    gp_segment *best = NULL;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->owner == st || seg->small != small || seg->paused || seg->mapped_bytes < size)
            continue;
        if (seg->owner->tenant != st->tenant) { /* memory changes tenant: both budgets must allow it */
            size_t max = atomic_load(&st->tenant->max);
            if (!gp_tenant_can_give(seg->owner->tenant, seg->mapped_bytes) || st->tenant->paused ||
                (max != 0 && atomic_load(&st->tenant->held) + seg->mapped_bytes > max))
                continue;
        }
        if (best != NULL && seg->mapped_bytes >= best->mapped_bytes)
            continue;
        gp_stream_state *owner = seg->owner;
        pthread_mutex_lock(&owner->lock);
        bool recorded = false;
        bool usable = gp_segment_unused(seg) && (fence_ready(p, owner, &recorded) || (wait && recorded));
        pthread_mutex_unlock(&owner->lock);
        if (usable)
            best = seg;
    }
    if (best == NULL)
        return NULL;
    gp_stream_state *owner = best->owner;
    pthread_mutex_lock(&owner->lock);
    bool taken = false;
    bool recorded = false;
    if (gp_segment_unused(best)) { /* the owner may have allocated from it since */
        bool ready = fence_ready(p, owner, &recorded);
        if (!ready && wait && recorded && p->ops->stream_wait_event(p->ctx, st->handle, owner->fence) == GP_OK) {
            atomic_fetch_add(&p->num_stream_waits, 1);
            ready = true;
        }
        if (ready) {
            for (gp_block *b = best->first; b != NULL; b = b->next)
                if (b->state == GP_BLOCK_FREE)
                    gp_heap_remove(gp_heap_of(owner, small), b);
            best->owner = st;
            gp_tenant_charge(owner->tenant, -(int64_t)best->mapped_bytes);
            gp_tenant_charge(st->tenant, (int64_t)best->mapped_bytes);
            atomic_fetch_add(&p->num_stream_steals, 1);
            taken = true;
        }
    }
    pthread_mutex_unlock(&owner->lock);
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
    atomic_fetch_sub(&p->reserved, seg->size);
    atomic_fetch_add(&p->num_device_frees, 1);
    gp_tenant_charge(owner->tenant, -(int64_t)seg->size);
    gp_block_recycle(&owner->blocks, seg->first);
    free(seg);
    return GP_OK;
}

int gp_release_segment(gp_pool_state *p, gp_segment *seg)
{
    gp_stream_state *owner = seg->owner;
    pthread_mutex_lock(&owner->lock);
    int rc = gp_segment_wholly_free(seg) ? release_segment_locked(p, seg) : GP_ERR_INVALID;
    pthread_mutex_unlock(&owner->lock);
    return rc;
}

size_t gp_release_free_segments(gp_pool_state *p, size_t want, size_t keep, int *failed, const gp_tenant *only,
                                const gp_tenant *taker)
{
    size_t released = 0;
    if (failed != NULL)
        *failed = GP_OK;
    gp_segment *seg = p->segments_head;
    while (seg != NULL && released < want) {
        size_t cached = atomic_load(&p->reserved) - gp_allocated_estimate(p);
        if (cached <= keep)
            break;
        gp_segment *next = seg->next;
        gp_stream_state *owner = seg->owner;
        if ((only != NULL && owner->tenant != only) ||
            (taker != NULL && owner->tenant != taker && !gp_tenant_can_give(owner->tenant, seg->size))) {
            seg = next;
            continue;
        }
        pthread_mutex_lock(&owner->lock);
        if (seg->pages == NULL && gp_segment_wholly_free(seg)) {
            size_t size = seg->size;
            int rc = release_segment_locked(p, seg);
            if (rc == GP_OK)
                released += size;
            else if (failed != NULL && *failed == GP_OK)
                *failed = rc;
        }
        pthread_mutex_unlock(&owner->lock);
        seg = next;
    }
    return released;
}

void gp_flush_all(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        pthread_mutex_lock(&st->lock);
        gp_flush(p, st);
        pthread_mutex_unlock(&st->lock);
    }
}

void gp_collect_all_pending(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        pthread_mutex_lock(&st->lock);
        gp_pending_collect(p, st, 0);
        gp_heap_quick_flush(&st->small, &st->blocks);
        gp_heap_quick_flush(&st->large, &st->blocks);
        pthread_mutex_unlock(&st->lock);
    }
}

size_t gp_cache_cap(gp_pool_state *p, size_t rsize)
{
    if (p->cfg.cache_slack < 0)
        return SIZE_MAX;
    size_t live = gp_allocated_estimate(p) + rsize, peak = atomic_load(&p->allocated_peak);
    double cap = (double)(live > peak ? live : peak) * (1.0 + p->cfg.cache_slack);
    double floor = (double)p->cfg.large_segment * GP_CAP_FLOOR_SEGMENTS;
    if (cap < floor)
        cap = floor;
    return cap >= (double)SIZE_MAX ? SIZE_MAX : (size_t)cap;
}

void gp_release_over_cap(gp_pool_state *p, size_t bytes, size_t cap, const gp_tenant *taker)
{
    size_t reserved = atomic_load(&p->reserved);
    if (cap == SIZE_MAX || reserved + bytes <= cap)
        return;
    size_t releasable = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        pthread_mutex_lock(&seg->owner->lock);
        if (seg->pages == NULL && gp_segment_wholly_free(seg) &&
            (seg->owner->tenant == taker || gp_tenant_can_give(seg->owner->tenant, seg->size)))
            releasable += seg->size;
        pthread_mutex_unlock(&seg->owner->lock);
    }
    size_t excess = reserved + bytes - cap;
    if (releasable >= excess)
        gp_release_free_segments(p, excess, 0, NULL, NULL, taker);
}

GP_API int gp_trim(gp_pool *pool, size_t keep_bytes, size_t *released)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_trim", &p);
    if (rc != GP_OK)
        return rc;
    pthread_mutex_lock(&p->lock);
    gp_collect_all_pending(p);
    gp_flush_all(p); /* keep_bytes is compared with exact figures */
    int failed = GP_OK;
    size_t bytes = p->page != 0 ? gp_vmm_release(p, keep_bytes, UINT64_MAX, &failed)
                                : gp_release_free_segments(p, SIZE_MAX, keep_bytes, &failed, NULL, NULL);
    pthread_mutex_unlock(&p->lock);
    if (released != NULL)
        *released = bytes;
    if (failed != GP_OK) {
        gp_error_append(" (gp_trim: released %zu bytes; the segment whose release failed stays cached)", bytes);
        return failed;
    }
    return GP_OK;
}
