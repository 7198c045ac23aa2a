/*
 * alloc.c — gp_alloc: the fast path (the caller's (stream, tenant) heap: a quick list or the free
 * lists, one lock, no device call; before it, the thread's cache of small freed blocks of that
 * stream, provider/thread_cache.h, with no stream lock) and the slow path (pool lock: maintenance, then the provider's
 * growth chain: pending frees, tenant admission, other streams' free segments, a new device segment,
 * release and retry in provider/segment.c; pages in provider/vmm.c).
 */
#include <assert.h>
#include <stdlib.h>

#include "api/api.h"
#include "base/error.h"
#include "base/format.h"
#include "ds/size_class.h"
#include "provider/pending.h"
#include "provider/provider.h"
#include "provider/thread_cache.h"

/* An allocation in a tenant whose gate is closed: paused, or over a max that was lowered. Gives the
 * tenant's cache back and reopens the gate when it fits again. */
static int gated(gp_pool_state *p, gp_tenant *t, size_t size)
{
    gp_pool_lock(p);
    int rc = GP_OK;
    if (t->paused) {
        rc = gp_error_set(GP_ERR_PAUSED, "gp_alloc: tenant '%s' is paused: resume it before allocating (request %zu bytes)",
                          t->name, size);
    } else {
        size_t held = gp_tenant_charged(t), max = atomic_load(&t->max);
        if (max != 0 && held > max)
            rc = gp_provider_admit(p, t, held - max, size); /* trims; refuses while it cannot fit */
        gp_tenant_update_gate(t);
        if (rc == GP_OK && atomic_load(&t->gate) != GP_OK) {
            atomic_fetch_add(&t->refusals, 1);
            rc = gp_error_set(GP_ERR_QUOTA, "tenant '%s' over budget: it holds more than its lowered max of %zu bytes",
                              t->name, max);
        }
    }
    gp_pool_unlock(p);
    return rc;
}

/* True when st owns device memory: a segment, or a range with pages mapped (pool lock held). */
static bool owns_memory(gp_pool_state *p, const gp_stream_state *st)
{
    for (const gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (seg->owner == st && seg->mapped_bytes > 0)
            return true;
    return false;
}

/*
 * The slow path: called with no lock held. Maintenance first (a failure to give memory back does not
 * fail the allocation), then the provider's growth chain (provider/segment.c, provider/vmm.c).
 * A state not yet counted against max_streams (ds/stream.h) is counted once the allocation succeeds or
 * leaves memory in it; one that fails and holds nothing stays uncounted, so that refused calls do not
 * use up the pool's streams. Room is checked first, under the same pool lock, so the count never
 * passes max_streams.
 */
static int alloc_slow(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool small, size_t own_fit,
                      void **out)
{
    gp_pool_lock(p);
    int rc = GP_OK;
    if (!st->claimed && p->streams.claimed >= p->streams.max_streams)
        rc = gp_stream_claim(&p->streams, st); /* fails, saying max_streams */
    if (rc == GP_OK) {
        int failed;
        gp_maintain_locked(p, &failed);
        size_t peak_before = atomic_load(&p->reserved_peak);
        rc = p->provider->alloc(p, st, size, rsize, small, own_fit, out);
        if (rc == GP_OK)
            gp_peak_note(p, peak_before, size);
        if (rc == GP_ERR_QUOTA)
            atomic_fetch_add(&st->tenant->refusals, 1);
        if (rc == GP_ERR_OOM)
            gp_history_note(p, GP_HIST_OOM, 0, size, st->handle, st->tenant->index);
        if (!st->claimed && (rc == GP_OK || owns_memory(p, st)))
            gp_stream_claim(&p->streams, st); /* cannot fail: room was checked under this lock */
    }
    gp_pool_unlock(p);
    return rc;
}

/* st's best fit for rsize, taken from heap (st locked); or, with tenant_best_fit where the pool has
 * other streams, NULL for a large request that it fits only loosely, *own_fit set to that fit's size:
 * the slow path looks for a tighter idle block of the tenant's other streams first (provider.h:
 * borrows_blocks). */
static gp_block *take_own_fit(gp_pool_state *p, gp_stream_state *st, gp_heap *heap, size_t rsize, bool small,
                              size_t *own_fit)
{
    if (small || !p->provider->borrows_blocks || !p->cfg.borrow || !p->cfg.tenant_best_fit ||
        atomic_load_explicit(&p->streams.count, memory_order_relaxed) < 2)
        return gp_heap_take(heap, &st->blocks, rsize);
    gp_block *fit = gp_heap_best(heap, rsize);
    if (fit != NULL && fit->size != rsize) {
        *own_fit = fit->size;
        return NULL;
    }
    return fit != NULL ? gp_heap_take_block(heap, &st->blocks, fit, rsize) : NULL;
}

GP_API int gp_alloc(gp_pool *pool, void **out, size_t size, gp_stream stream)
{
    if (out == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_alloc: out is NULL");
    *out = NULL;
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_alloc", &p);
    if (rc != GP_OK)
        return rc;
    if (size == 0)
        return GP_OK;
    size_t rsize = gp_round_granule(size);
    if (rsize == 0 || rsize > p->device_total) {
        char total[GP_SIZE_TEXT_MAX];
        return gp_error_set(GP_ERR_INVALID, "gp_alloc: %zu bytes on stream %p is more than the device has (%s)",
                            size, stream, gp_format_size(p->device_total, total));
    }
    gp_pool *graph = NULL;
    rc = gp_capture_route(p, stream, "gp_alloc", &graph);
    if (rc != GP_OK)
        return rc;
    if (graph != NULL) /* a capture inside a graph pool window: that graph's private pool serves it */
        return gp_alloc(graph, out, size, stream);
    gp_stream_state *st;
    rc = gp_pool_current_state(p, stream, true, &st);
    if (rc != GP_OK)
        return rc;
    bool small = rsize <= p->cfg.small_size;
    if (atomic_load_explicit(&st->tenant->gate, memory_order_relaxed) != GP_OK) {
        rc = gated(p, st->tenant, size); /* a refusal leaves a new st unclaimed (ds/stream.h) */
        if (rc != GP_OK) {
            if (p->log != NULL)
                gp_trace_log_event(p->log, GP_TRACE_ALLOCATE_FAILURE, 0, size, stream);
            return rc;
        }
    }

    /* A small block this thread freed on st, unless st has pending frees (to query first, with
     * pending_scan): then the stream's path collects them and takes from the thread's cache after
     * (thread_cache.h). */
    bool pending = atomic_load_explicit(&st->pending_count, memory_order_relaxed) != 0;
    gp_block *b = pending ? NULL : gp_thread_cache_take(p, st, size, rsize);
    if (b != NULL) {
        *out = (void *)b->addr;
        if (p->log != NULL)
            gp_trace_log_event(p->log, GP_TRACE_ALLOCATE, b->addr, size, stream);
        return GP_OK;
    }
    gp_stream_lock(st);
    /* pending_scan 0 queries none here (gp_pending_collect's own 0 would mean all of them) */
    if (p->cfg.pending_scan != 0 && atomic_load_explicit(&st->pending_count, memory_order_relaxed) != 0) {
        gp_pending_collect(p, st, p->cfg.pending_scan);
        pending = true;
    }
    /* The thread's cached blocks of st are the top of its quick lists: after the pending frees they
     * come first, as the blocks freed last. */
    if (pending && st->lenders != NULL)
        b = gp_thread_cache_take_locked(p, st, size, rsize);
    size_t own_fit = 0;
    if (b == NULL && gp_block_map_reserve(&st->live)) {
        gp_heap *heap = gp_heap_of(st, small);
        b = gp_heap_quick_take(heap, rsize); /* a small size freed before: no split */
        if (b == NULL && p->quick_aging && gp_heap_quick_tick(heap))
            gp_quick_age(p, st, heap); /* quick blocks nobody asked for go back first (ds/heap.h) */
        if (b == NULL)
            b = take_own_fit(p, st, heap, rsize, small, &own_fit);
        if (b != NULL)
            gp_hand_out(p, st, b, size);
    }
    if (b != NULL)
        *out = (void *)b->addr;
    gp_stream_unlock(st);
    if (b == NULL)
        rc = alloc_slow(p, st, size, rsize, small, own_fit, out);
    if (p->log != NULL)
        gp_trace_log_event(p->log, rc == GP_OK ? GP_TRACE_ALLOCATE : GP_TRACE_ALLOCATE_FAILURE,
                           (uintptr_t)*out, size, stream);
    return rc;
}
