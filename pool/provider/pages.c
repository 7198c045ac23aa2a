/*
 * pages.c — the vmm provider's physical pages and the block surgery that maps and unmaps them: the
 * page pool (handles mapped nowhere, kept for reuse), mapping pages at the front of an UNMAPPED block
 * and unmapping whole pages out of a FREE one. Pages are mapped in runs with one access call per run
 * and unmapped in runs (the backend's map_run / unmap_run); a call that fails stops with the pages
 * done so far in place, and nothing is lost.
 *
 * Before unmapping: cuMemUnmap does not wait for queued work (backend.h), so the pool waits first for
 * what may still use the pages (gp_pages_quiesce). Free memory of a stream's heap is used by no other
 * stream's work any more (stream-ordered reuse hands it to another stream only once its events say
 * so), so the stream's own fence at the memory's free stamp is all there is to wait for: one model's
 * unmap does not wait for the other models' queued work, as a device synchronize did. A pause waits
 * for its tenant's streams first (api/pause.c: gp_stream_drain) and then unmaps with no wait
 * (gp_pages_unmap_quiesced), as does the undoing of a failed resume (no work has seen those pages).
 * Where the pool cannot name one stream (destroy; a stitched range taking over its home page without
 * the home owner's lock, alias.c: gp_alias_own_page, which no caller does now), or has no event to
 * wait on, it synchronizes the device.
 * Pool lock held; a range's blocks change under its owner's stream lock.
 */
#include <assert.h>
#include <stdlib.h>

#include "base/error.h"
#include "provider/pages.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"

/* ---- the page pool ---------------------------------------------------------------------------- */

/* Keeps room for every physical page in the pool array, so that putting a page back never fails. */
static bool page_pool_reserve(gp_pool_state *p)
{
    size_t pages = atomic_load(&p->reserved) / p->page + 1;
    if (pages <= p->pooled_capacity)
        return true;
    size_t capacity = p->pooled_capacity ? p->pooled_capacity * 2 : 64;
    while (capacity < pages)
        capacity *= 2;
    gp_phys *pooled = realloc(p->pooled, capacity * sizeof *pooled);
    if (pooled == NULL)
        return false;
    p->pooled = pooled;
    uint64_t *since = realloc(p->pooled_since, capacity * sizeof *since);
    if (since == NULL)
        return false;
    p->pooled_since = since;
    p->pooled_capacity = capacity;
    return true;
}

void gp_page_put(gp_pool_state *p, gp_phys handle)
{
    assert(p->pooled_count < p->pooled_capacity);
    p->pooled_since[p->pooled_count] = atomic_load(&p->coarse_now);
    p->pooled[p->pooled_count++] = handle;
}

/* A page from the pool, or a new one from the device (charged to the ledger first, for tenant t). */
int gp_page_get(gp_pool_state *p, gp_tenant *t, gp_phys *out)
{
    if (p->pooled_count > 0) {
        *out = p->pooled[--p->pooled_count];
        return GP_OK;
    }
    if (!page_pool_reserve(p))
        return gp_error_set(GP_ERR_OOM, "out of host memory for the page pool");
    int rc = gp_pool_ledger_charge(p, t, p->page, 0, false);
    if (rc != GP_OK)
        return rc;
    rc = p->ops->phys_create(p->ctx, p->page, out);
    if (rc != GP_OK) {
        gp_pool_ledger_credit(p, t, p->page, 0);
        return rc;
    }
    size_t reserved = atomic_fetch_add(&p->reserved, p->page) + p->page;
    gp_raise_peak(&p->reserved_peak, reserved);
    atomic_fetch_add(&p->num_device_allocs, 1);
    return GP_OK;
}

/* Gives a page back to the device; on failure it stays in the page pool (nothing lost). */
int gp_page_release(gp_pool_state *p, gp_phys handle)
{
    int rc = p->ops->phys_release(p->ctx, handle);
    if (rc != GP_OK) {
        gp_page_put(p, handle);
        return rc;
    }
    atomic_fetch_sub(&p->reserved, p->page);
    atomic_fetch_add(&p->num_device_frees, 1);
    gp_pool_ledger_credit(p, NULL, p->page, 0);
    return GP_OK;
}

/* ---- block surgery (owner locked) ------------------------------------------------------------- */

gp_block *gp_pages_block_at(const gp_segment *seg, uintptr_t va)
{
    gp_block *b = seg->first;
    assert(b != NULL); /* a segment's blocks tile it (ds/block.h) */
    while (b->next != NULL && b->addr + b->size <= va) /* va lies in seg: the last block holds it at most */
        b = b->next;
    return b;
}

gp_block *gp_pages_split(gp_block *b, size_t offset, gp_block *right)
{
    assert(offset > 0 && offset < b->size);
    right->addr = b->addr + offset;
    right->size = b->size - offset;
    right->segment = b->segment;
    right->state = b->state;
    right->free_since = b->free_since;
    right->free_seq = b->free_seq;
    right->prev = b;
    right->next = b->next;
    if (b->next != NULL)
        b->next->prev = right;
    b->next = right;
    b->size = offset;
    return right;
}

gp_block *gp_pages_merge(gp_block_cache *cache, gp_block *b)
{
    assert(b->state == GP_BLOCK_UNMAPPED || b->state == GP_BLOCK_SHADOW);
    if (b->next != NULL && b->next->state == b->state) {
        gp_block *right = b->next;
        b->size += right->size;
        if (right->free_seq > b->free_seq) /* the latest stamp covers both parts' last uses */
            b->free_seq = right->free_seq;
        b->next = right->next;
        if (right->next != NULL)
            right->next->prev = b;
        gp_block_recycle(cache, right);
    }
    if (b->prev != NULL && b->prev->state == b->state) {
        gp_block *left = b->prev;
        left->size += b->size;
        if (b->free_seq > left->free_seq)
            left->free_seq = b->free_seq;
        left->next = b->next;
        if (b->next != NULL)
            b->next->prev = left;
        gp_block_recycle(cache, b);
        b = left;
    }
    if (b->prev == NULL)
        b->segment->first = b;
    return b;
}

gp_block *gp_pages_carve(gp_heap *heap, gp_block *b, uintptr_t from, size_t bytes, gp_block **spare, size_t *nspare)
{
    assert(from >= b->addr && from + bytes <= b->addr + b->size);
    gp_block *mid = b;
    if (from > b->addr) {
        mid = gp_pages_split(b, from - b->addr, spare[--*nspare]);
        if (heap != NULL)
            gp_heap_insert(heap, b);
    }
    if (mid->size > bytes) {
        gp_block *right = gp_pages_split(mid, bytes, spare[--*nspare]);
        if (heap != NULL)
            gp_heap_insert(heap, right);
    }
    return mid;
}

/* Pages mapped with one access call at most (a bound for the stack array; 512 MiB of 2 MiB pages). */
#define GP_MAP_RUN_PAGES 256

int gp_pages_map_run(gp_pool_state *p, uintptr_t va, const gp_phys *handles, size_t n, size_t *mapped)
{
    *mapped = 0;
    if (p->ops->map_run != NULL) {
        int rc = p->ops->map_run(p->ctx, va, p->page, handles, n);
        if (rc == GP_OK)
            *mapped = n;
        return rc;
    }
    for (; *mapped < n; (*mapped)++) {
        int rc = p->ops->map(p->ctx, va + *mapped * p->page, p->page, handles[*mapped]);
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
}

int gp_pages_quiesce(gp_pool_state *p, gp_stream_state *user, uint64_t seq)
{
    if (user != NULL && seq <= user->free_seq && !p->destroying)
        return gp_stream_wait_upto(p, user, seq);
    atomic_fetch_add(&p->num_device_syncs, 1);
    return p->ops->device_synchronize(p->ctx);
}

int gp_pages_unmap_quiesced(gp_pool_state *p, uintptr_t va, size_t n, size_t *done)
{
    *done = 0;
    if (p->ops->unmap_run != NULL)
        return p->ops->unmap_run(p->ctx, va, p->page, n, done);
    for (; *done < n; (*done)++) {
        int rc = p->ops->unmap(p->ctx, va + *done * p->page, p->page);
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
}

int gp_pages_unmap_run(gp_pool_state *p, gp_stream_state *user, uint64_t seq, uintptr_t va, size_t n, size_t *done)
{
    *done = 0;
    int rc = gp_pages_quiesce(p, user, seq);
    return rc != GP_OK ? rc : gp_pages_unmap_quiesced(p, va, n, done);
}

int gp_pages_unmap_list(gp_pool_state *p, gp_stream_state *user, uint64_t seq, const uintptr_t *vas, size_t n,
                        size_t *done)
{
    *done = 0;
    int rc = gp_pages_quiesce(p, user, seq);
    if (rc != GP_OK)
        return rc;
    if (p->ops->unmap_pages != NULL)
        return p->ops->unmap_pages(p->ctx, vas, p->page, n, done);
    while (*done < n) {
        size_t run = 1, unmapped = 0;
        while (*done + run < n && vas[*done + run] == vas[*done] + run * p->page)
            run++;
        rc = gp_pages_unmap_quiesced(p, vas[*done], run, &unmapped);
        *done += unmapped;
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
}

/*
 * Maps up to n pages at the front of the UNMAPPED block u of seg (owner st locked) and turns them into
 * FREE memory of st's heap, coalesced with a FREE block before them. Returns the pages mapped; stops at
 * the first failure, with *rc set.
 */
size_t gp_pages_map_front(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, gp_block *u, size_t n, int *rc)
{
    assert(u->state == GP_BLOCK_UNMAPPED && n * p->page <= u->size);
    gp_block *rest = n * p->page < u->size ? gp_block_new(&st->blocks) : NULL;
    if (n * p->page < u->size && rest == NULL) {
        *rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
        return 0;
    }
    size_t done = 0;
    while (done < n) {
        /* A run of pages: taken from the page pool (or created), then mapped with one access call. */
        gp_phys handles[GP_MAP_RUN_PAGES];
        size_t want = n - done < GP_MAP_RUN_PAGES ? n - done : GP_MAP_RUN_PAGES, got = 0;
        for (; got < want; got++)
            if ((*rc = gp_page_get(p, st->tenant, &handles[got])) != GP_OK)
                break;
        uintptr_t va = u->addr + done * p->page;
        size_t mapped = 0;
        int mrc = got > 0 ? gp_pages_map_run(p, va, handles, got, &mapped) : GP_OK;
        for (size_t i = mapped; i < got; i++)
            gp_page_put(p, handles[i]); /* not mapped: back to the page pool, nothing lost */
        for (size_t i = 0; i < mapped; i++) {
            seg->pages[gp_page_index(p, seg, va) + i] = handles[i];
            gp_history_note(p, GP_HIST_SEGMENT_MAP, va + i * p->page, p->page, st->handle, st->tenant->index);
        }
        atomic_fetch_add(&p->num_maps, mapped);
        done += mapped;
        if (mrc != GP_OK)
            *rc = mrc;
        if (*rc != GP_OK || mapped < want)
            break;
    }
    if (done == 0) {
        if (rest != NULL)
            gp_block_recycle(&st->blocks, rest);
        return 0;
    }
    if (done * p->page < u->size)
        gp_pages_split(u, done * p->page, rest != NULL ? rest : gp_block_new(&st->blocks));
    else if (rest != NULL)
        gp_block_recycle(&st->blocks, rest);
    seg->mapped_bytes += done * p->page;
    gp_tenant_charge(st->tenant, (int64_t)(done * p->page));
    u->free_seq = 0; /* pages no stream has used since they were mapped here */
    gp_block *merged = gp_heap_release(gp_heap_of(st, seg->small), &st->blocks, u);
    merged->free_since = atomic_load(&p->coarse_now);
    return done;
}

size_t gp_pages_map_back(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, gp_block *u, size_t n, int *rc)
{
    assert(u->state == GP_BLOCK_UNMAPPED && n * p->page <= u->size);
    if (n * p->page == u->size)
        return gp_pages_map_front(p, st, seg, u, n, rc);
    gp_block *spare = gp_block_new(&st->blocks);
    if (spare == NULL) {
        *rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
        return 0;
    }
    gp_block *back = gp_pages_split(u, u->size - n * p->page, spare);
    size_t done = gp_pages_map_front(p, st, seg, back, n, rc);
    if (done == 0)
        (void)gp_pages_merge(&st->blocks, back); /* nothing mapped: u is one UNMAPPED block again */
    return done;
}

/*
 * Unmaps the n whole pages starting at `first` inside the FREE block b of seg (owner locked): the
 * handles go to the page pool or, with `release`, back to the device. Returns the pages done; stops at
 * the first failure (*rc), leaving the rest of b FREE.
 */
size_t gp_pages_unmap(gp_pool_state *p, gp_stream_state *owner, gp_segment *seg, gp_block *b, uintptr_t first,
                          size_t n, bool release, int *rc)
{
    assert(b->state == GP_BLOCK_FREE && first >= b->addr && first + n * p->page <= b->addr + b->size);
    gp_block *spare[2] = {gp_block_new(&owner->blocks), gp_block_new(&owner->blocks)};
    if (spare[0] == NULL || spare[1] == NULL) {
        for (int i = 0; i < 2; i++)
            if (spare[i] != NULL)
                gp_block_recycle(&owner->blocks, spare[i]);
        *rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
        return 0;
    }
    gp_heap *heap = gp_heap_of(owner, seg->small);
    gp_heap_remove(heap, b); /* off the lists: nobody can allocate it while it is cut */
    size_t done = 0;
    /* A FREE block of owner's heap: other streams' uses of it were over before it became FREE (their
     * events, api/free.c), and owner's are covered by its fence at b's stamp, so waiting for that
     * fence is enough, and often nothing is left to wait for (provider.h: fences). */
    *rc = gp_pages_unmap_run(p, owner, b->free_seq, first, n, &done);
    atomic_fetch_add(&p->num_unmaps, done);
    for (size_t i = 0; i < done; i++) {
        uintptr_t va = first + i * p->page;
        gp_history_note(p, GP_HIST_SEGMENT_UNMAP, va, p->page, seg->owner->handle, seg->owner->tenant->index);
        gp_phys handle = seg->pages[gp_page_index(p, seg, va)];
        if (release)
            gp_page_release(p, handle); /* a page the device refuses stays in the page pool */
        else
            gp_page_put(p, handle);
    }
    if (done == 0) {
        gp_heap_insert(heap, b);
        gp_block_recycle(&owner->blocks, spare[0]);
        gp_block_recycle(&owner->blocks, spare[1]);
        return 0;
    }
    size_t left = 2;
    gp_block *mid = gp_pages_carve(heap, b, first, done * p->page, spare, &left);
    while (left > 0)
        gp_block_recycle(&owner->blocks, spare[--left]);
    mid->state = GP_BLOCK_UNMAPPED;
    gp_pages_merge(&owner->blocks, mid);
    seg->mapped_bytes -= done * p->page;
    gp_tenant_charge(owner->tenant, -(int64_t)(done * p->page));
    gp_pool_ledger_credit(p, owner->tenant, 0, done * p->page);
    return done;
}
