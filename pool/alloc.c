/*
 * alloc.c — gp_alloc: the fast path (the caller's (stream, tenant) heap: a quick list or the free
 * lists, one lock, no device call) and the slow path (pool lock: maintenance, pending frees, tenant
 * admission, other streams' free segments, a new device segment — or pages, vmm.c — release and
 * retry).
 */
#include <assert.h>
#include <stdlib.h>

#include "error.h"
#include "format.h"
#include "pool_state.h"
#include "size_class.h"

/* Marks b LIVE for a request of `size` on st (locked) and accounts for it. */
static void hand_out(gp_pool_state *p, gp_stream_state *st, gp_block *b, size_t size)
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
}

/* The device allocation that will hold a request of `rsize` bytes (rounded). */
static size_t segment_size_for(const gp_config *cfg, size_t rsize, bool small)
{
    if (small)
        return cfg->small_segment;
    size_t pages = gp_round_up(rsize, GP_DEVICE_PAGE);
    if (rsize >= cfg->huge_size || pages >= cfg->large_segment)
        return pages;
    return cfg->large_segment;
}

/* Allocates a new segment of `bytes` on the device for st, returned with its single FREE block on no
 * list (the caller adopts it), charged to st's tenant once its budget admits it. Pool lock held, no
 * stream lock. */
static int grow(gp_pool_state *p, gp_stream_state *st, size_t bytes, bool small, gp_segment **out)
{
    int admitted = gp_tenant_admit(p, st->tenant, bytes, bytes);
    if (admitted != GP_OK)
        return admitted;
    gp_segment *seg = calloc(1, sizeof *seg);
    gp_block *b = calloc(1, sizeof *b);
    if (seg == NULL || b == NULL) {
        free(seg);
        free(b);
        return gp_error_set(GP_ERR_OOM, "out of host memory for segment metadata");
    }
    gp_devptr addr = 0;
    int rc = p->ops->mem_alloc(p->ctx, bytes, &addr);
    if (rc != GP_OK) {
        free(seg);
        free(b);
        return rc;
    }
    seg->addr = addr;
    seg->size = bytes;
    seg->mapped_bytes = bytes;
    seg->small = small;
    seg->serial = p->next_serial++;
    seg->first = b;
    seg->owner = st;
    gp_segment_link(p, seg);
    b->addr = addr;
    b->size = bytes;
    b->segment = seg;
    b->state = GP_BLOCK_FREE;
    size_t reserved = atomic_fetch_add(&p->reserved, bytes) + bytes;
    gp_raise_peak(&p->reserved_peak, reserved);
    atomic_fetch_add(&p->num_device_allocs, 1);
    gp_tenant_charge(st->tenant, (int64_t)bytes);
    *out = seg;
    return GP_OK;
}

/*
 * Under st's lock: puts `seg` (NULL, or a segment in transit to st from grow or a steal) into st's
 * heap, returns completed pending frees to it, and takes the request from it. NULL when nothing fits
 * (or host memory for metadata is out). Pool lock held.
 */
static gp_block *adopt_and_take(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, bool small, size_t rsize,
                                size_t size)
{
    gp_heap *heap = gp_heap_of(st, small);
    pthread_mutex_lock(&st->lock);
    if (seg != NULL) {
        assert(seg->owner == st && seg->small == small);
        for (gp_block *fb = seg->first; fb != NULL; fb = fb->next)
            if (fb->state == GP_BLOCK_FREE)
                gp_heap_insert(heap, fb);
    }
    gp_pending_collect(p, st, 0);
    gp_heap_quick_flush(heap, &st->blocks); /* small freed blocks may coalesce into what fits */
    gp_block *b = NULL;
    if (gp_block_map_reserve(&st->live))
        b = gp_heap_take(heap, &st->blocks, rsize);
    if (b != NULL)
        hand_out(p, st, b, size);
    pthread_mutex_unlock(&st->lock);
    return b;
}

/*
 * Borrowing: the smallest free block that fits among the heaps (of kind `small`) of the other streams of
 * st's tenant whose work is done (gp_stream_idle), handed out to st without a device or map call.
 * The block stays in its lender's segment and live map, with st recorded as its user, so that its free
 * on st takes free.c's cross-stream path: it becomes PENDING on an event recorded on st and returns to
 * the lender's heap once st's work on it has completed. Several models (or replicas) on one GPU take
 * turns at their peaks; borrowing lets one stream's peak use another's idle cache where it lies, so
 * that the streams together need about the memory of their combined peak instead of the sum of their
 * own peaks, and nothing has to be unmapped or mapped again to move it. Pool lock held, no stream lock.
 */
static gp_block *borrow(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool small)
{
    gp_stream_state *lender = NULL;
    size_t best = 0;
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *o = p->streams.by_index[i];
        if (o == st || o->handle == st->handle || o->tenant != st->tenant)
            continue;
        pthread_mutex_lock(&o->lock);
        gp_heap *heap = gp_heap_of(o, small);
        size_t fit = 0;
        if (heap->free_bytes >= rsize) {
            gp_pending_collect(p, o, 0);
            fit = gp_heap_fit(heap, rsize);
        }
        if (fit != 0 && (best == 0 || fit < best) && gp_stream_idle(p, o)) {
            lender = o;
            best = fit;
        }
        pthread_mutex_unlock(&o->lock);
    }
    if (lender == NULL)
        return NULL;
    pthread_mutex_lock(&lender->lock);
    gp_block *b = NULL;
    if (gp_stream_idle(p, lender) && gp_block_map_reserve(&lender->live))
        b = gp_heap_take(gp_heap_of(lender, small), &lender->blocks, rsize);
    if (b != NULL) {
        hand_out(p, lender, b, size);
        gp_stream_state **uses = b->uses != NULL ? b->uses : b->uses_inline;
        uses[0] = st; /* capacity >= GP_BLOCK_INLINE_USES >= 1 */
        b->use_count = 1;
        atomic_fetch_add(&p->num_borrows, 1);
    }
    pthread_mutex_unlock(&lender->lock);
    return b;
}

/* Fills the thread's message for a request the device cannot hold. */
static int out_of_memory(gp_pool_state *p, size_t size, gp_stream stream)
{
    char req[GP_SIZE_TEXT_MAX], cached[GP_SIZE_TEXT_MAX], dev_free[GP_SIZE_TEXT_MAX], total[GP_SIZE_TEXT_MAX];
    size_t free_bytes = 0, total_bytes = 0;
    bool known = p->ops->mem_info(p->ctx, &free_bytes, &total_bytes) == GP_OK;
    gp_flush_all(p);
    size_t reserved = atomic_load(&p->reserved), allocated = gp_allocated_estimate(p);
    atomic_fetch_add(&p->num_ooms, 1);
    gp_format_size(size, req);
    gp_format_size(reserved - allocated, cached);
    gp_format_size(p->device_total, total);
    if (known)
        gp_format_size(free_bytes, dev_free);
    return gp_error_set(GP_ERR_OOM,
                        "out of device memory: requested %s on stream %p, %s cached but fragmented or busy, "
                        "%s free on the device (%s total)",
                        req, stream, cached, known ? dev_free : "unknown", total);
}

/* An allocation in a tenant whose gate is closed: paused, or over a max that was lowered. Gives the
 * tenant's cache back and reopens the gate when it fits again. */
static int gated(gp_pool_state *p, gp_tenant *t, size_t size)
{
    pthread_mutex_lock(&p->lock);
    int rc = GP_OK;
    if (t->paused) {
        rc = gp_error_set(GP_ERR_PAUSED, "gp_alloc: tenant '%s' is paused: resume it before allocating (request %zu bytes)",
                          t->name, size);
    } else {
        size_t held = atomic_load(&t->held), max = atomic_load(&t->max);
        if (max != 0 && held > max)
            rc = gp_tenant_admit(p, t, held - max, size); /* trims; refuses while it cannot fit */
        gp_tenant_update_gate(t);
        if (rc == GP_OK && atomic_load(&t->gate) != GP_OK) {
            atomic_fetch_add(&t->refusals, 1);
            rc = gp_error_set(GP_ERR_QUOTA, "tenant '%s' over budget: it holds more than its lowered max of %zu bytes",
                              t->name, max);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* The slow path on a virtual memory backend (vmm.c): take another stream's unused range, or grow in
 * place, stitch, or map new pages. A fast path on st may take the new memory between growth and
 * adoption, so growth is retried. */
static int alloc_slow_vmm(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool small, void **out)
{
    gp_block *b = adopt_and_take(p, st, NULL, small, rsize, size);
    int rc = GP_OK;
    /* Another stream's range that holds nothing live (its fence completed) changes owner with its
     * mapped pages: memory moves between streams without a device or map call, before any is made. */
    gp_segment *seg;
    if (b == NULL && (seg = gp_steal_segment(p, st, rsize, small, false)) != NULL)
        b = adopt_and_take(p, st, seg, small, rsize, size);
    if (b == NULL && p->cfg.borrow)
        b = borrow(p, st, rsize, size, small);
    for (int attempt = 0; b == NULL && attempt < 3; attempt++) {
        rc = gp_vmm_grow(p, st, rsize, small);
        if (rc != GP_OK)
            break;
        b = adopt_and_take(p, st, NULL, small, rsize, size);
    }
    if (b != NULL) {
        *out = (void *)b->addr;
        return GP_OK;
    }
    if (rc == GP_OK)
        rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
    if (rc == GP_ERR_MIN_GUARANTEE) {
        atomic_fetch_add(&p->num_ooms, 1);
        return GP_ERR_OOM;
    }
    return rc == GP_ERR_OOM ? out_of_memory(p, size, st->handle) : rc;
}

/* The slow path: called with no lock held. */
static int alloc_slow(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool small, void **out)
{
    pthread_mutex_lock(&p->lock);
    int failed;
    gp_maintain_locked(p, &failed); /* a failure to give memory back does not fail the allocation */
    if (p->page != 0) {
        int rc = alloc_slow_vmm(p, st, size, rsize, small, out);
        if (rc == GP_ERR_QUOTA)
            atomic_fetch_add(&st->tenant->refusals, 1);
        pthread_mutex_unlock(&p->lock);
        return rc;
    }
    int rc = GP_OK;
    gp_block *b = adopt_and_take(p, st, NULL, small, rsize, size);
    gp_segment *seg = NULL;
    size_t bytes = segment_size_for(&p->cfg, rsize, small);
    size_t cap = gp_cache_cap(p, rsize);
    bool over_cap = cap != SIZE_MAX && atomic_load(&p->reserved) + bytes > cap;
    /* Under the cap the stream grows; above it, it first takes a free segment another stream no
     * longer uses (whose fence has completed), then gives unfit free segments back. */
    if (b == NULL && over_cap && (seg = gp_steal_segment(p, st, rsize, small, false)) != NULL)
        b = adopt_and_take(p, st, seg, small, rsize, size);
    if (b == NULL) {
        size_t just_enough = gp_round_up(rsize, GP_DEVICE_PAGE);
        if (over_cap)
            gp_release_over_cap(p, bytes, cap, st->tenant);
        rc = grow(p, st, bytes, small, &seg);
        if ((rc == GP_ERR_OOM || rc == GP_ERR_QUOTA || rc == GP_ERR_MIN_GUARANTEE) && bytes > just_enough) {
            bytes = just_enough;
            rc = grow(p, st, bytes, small, &seg);
        }
        if (rc == GP_ERR_OOM) /* other streams' completed cross-stream frees may free whole segments */
            gp_collect_all_pending(p);
        if (rc == GP_ERR_OOM && (seg = gp_steal_segment(p, st, rsize, small, p->cfg.steal_wait)) != NULL)
            rc = GP_OK;
        if (rc == GP_ERR_OOM || rc == GP_ERR_MIN_GUARANTEE) {
            /* Give wholly free segments back, oldest first (others' only down to their min), and try
             * once more. */
            atomic_fetch_add(&p->num_alloc_retries, 1);
            if (gp_release_free_segments(p, bytes, 0, NULL, NULL, st->tenant) > 0)
                rc = grow(p, st, bytes, small, &seg);
        }
        if (rc == GP_OK) {
            b = adopt_and_take(p, st, seg, small, rsize, size);
            if (b == NULL)
                rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
        } else if (rc == GP_ERR_MIN_GUARANTEE) {
            atomic_fetch_add(&p->num_ooms, 1);
            rc = GP_ERR_OOM; /* the admission's message says whose guarantee */
        } else if (rc == GP_ERR_OOM) {
            rc = out_of_memory(p, size, st->handle);
        }
    }
    if (b != NULL)
        *out = (void *)b->addr;
    if (rc == GP_ERR_QUOTA)
        atomic_fetch_add(&st->tenant->refusals, 1);
    pthread_mutex_unlock(&p->lock);
    return rc;
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
    gp_stream_state *st;
    rc = gp_pool_current_state(p, stream, true, &st);
    if (rc != GP_OK)
        return rc;
    bool small = rsize <= p->cfg.small_size;
    if (atomic_load_explicit(&st->tenant->gate, memory_order_relaxed) != GP_OK) {
        rc = gated(p, st->tenant, size);
        if (rc != GP_OK) {
            if (p->log != NULL)
                gp_trace_log_event(p->log, GP_TRACE_ALLOCATE_FAILURE, 0, size, stream);
            return rc;
        }
    }

    pthread_mutex_lock(&st->lock);
    if (atomic_load_explicit(&st->pending_count, memory_order_relaxed) != 0)
        gp_pending_collect(p, st, p->cfg.pending_scan);
    gp_block *b = NULL;
    if (gp_block_map_reserve(&st->live)) {
        gp_heap *heap = gp_heap_of(st, small);
        b = gp_heap_quick_take(heap, rsize); /* a small size freed before: no split */
        if (b == NULL)
            b = gp_heap_take(heap, &st->blocks, rsize);
    }
    if (b != NULL) {
        hand_out(p, st, b, size);
        *out = (void *)b->addr;
    }
    pthread_mutex_unlock(&st->lock);
    if (b == NULL)
        rc = alloc_slow(p, st, size, rsize, small, out);
    if (p->log != NULL)
        gp_trace_log_event(p->log, rc == GP_OK ? GP_TRACE_ALLOCATE : GP_TRACE_ALLOCATE_FAILURE,
                           (uintptr_t)*out, size, stream);
    return rc;
}
