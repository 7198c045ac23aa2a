/*
 * vmm.c — the pool over virtual memory (backends vmm and sim-vmm): physical pages mapped behind
 * reserved address ranges, so that memory can be moved instead of allocated.
 *
 * A stream's heap of one kind (small or large) grows in place: its ranges reserve far more address
 * space than they map (vmm_reserve, by default the device's whole memory), and a miss maps new pages
 * at the front of an UNMAPPED stretch, preferably right after a FREE block, which it extends (the idea
 * of PyTorch's expandable segments). The pages come, in this order, from
 *   1. the page pool: physical handles mapped nowhere, kept for reuse;
 *   2. stitching (defrag:on): whole free pages cut out of FREE blocks anywhere in the pool, unmapped
 *      and mapped again where they make one contiguous block (the idea of GMLake, ASPLOS 2024);
 *   3. the device (phys_create).
 * Moved pages change owner and address but never contents that matter: only pages inside FREE blocks
 * move, and unmap waits for all device work first, so no stream can still be using them. Ranges stay
 * as they are once grown, so a steady workload maps nothing after warm-up.
 *
 * Every change is done one page at a time and leaves the pool consistent: a map or unmap that fails
 * stops the operation with the pages done so far in place (FREE and usable, or back in the page pool)
 * and fails only the request that asked for it.
 *
 * Locks: the pool lock is held throughout; a range's blocks change under its owner's stream lock,
 * which is held across the map/unmap calls on that range (slow path only). UNMAPPED blocks are created
 * and removed only here, under the pool lock.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pool_state.h"

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

static size_t page_index(const gp_pool_state *p, const gp_segment *seg, uintptr_t addr)
{
    return (addr - seg->addr) / p->page;
}

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

static void page_put(gp_pool_state *p, gp_phys handle)
{
    assert(p->pooled_count < p->pooled_capacity);
    p->pooled_since[p->pooled_count] = atomic_load(&p->coarse_now);
    p->pooled[p->pooled_count++] = handle;
}

/* A page from the pool, or a new one from the device. */
int gp_vmm_page_get(gp_pool_state *p, gp_phys *out)
{
    if (p->pooled_count > 0) {
        *out = p->pooled[--p->pooled_count];
        return GP_OK;
    }
    if (!page_pool_reserve(p))
        return gp_error_set(GP_ERR_OOM, "out of host memory for the page pool");
    int rc = p->ops->phys_create(p->ctx, p->page, out);
    if (rc != GP_OK)
        return rc;
    size_t reserved = atomic_fetch_add(&p->reserved, p->page) + p->page;
    gp_raise_peak(&p->reserved_peak, reserved);
    atomic_fetch_add(&p->num_device_allocs, 1);
    return GP_OK;
}

/* Gives a page back to the device; on failure it stays in the page pool (nothing lost). */
int gp_vmm_page_release(gp_pool_state *p, gp_phys handle)
{
    int rc = p->ops->phys_release(p->ctx, handle);
    if (rc != GP_OK) {
        page_put(p, handle);
        return rc;
    }
    atomic_fetch_sub(&p->reserved, p->page);
    atomic_fetch_add(&p->num_device_frees, 1);
    return GP_OK;
}

/* ---- block surgery (owner locked) ------------------------------------------------------------- */

/* Splits b at `offset` into b and a new block `right` (given, so that this cannot fail) of the same
 * state, linked after it. Neither is put on a list. */
static gp_block *split_at(gp_block *b, size_t offset, gp_block *right)
{
    assert(offset > 0 && offset < b->size);
    right->addr = b->addr + offset;
    right->size = b->size - offset;
    right->segment = b->segment;
    right->state = b->state;
    right->free_since = b->free_since;
    right->prev = b;
    right->next = b->next;
    if (b->next != NULL)
        b->next->prev = right;
    b->next = right;
    b->size = offset;
    return right;
}

/* Merges the UNMAPPED block b with UNMAPPED neighbours; returns the result. */
static gp_block *merge_unmapped(gp_block_cache *cache, gp_block *b)
{
    assert(b->state == GP_BLOCK_UNMAPPED);
    if (b->next != NULL && b->next->state == GP_BLOCK_UNMAPPED) {
        gp_block *right = b->next;
        b->size += right->size;
        b->next = right->next;
        if (right->next != NULL)
            right->next->prev = b;
        gp_block_recycle(cache, right);
    }
    if (b->prev != NULL && b->prev->state == GP_BLOCK_UNMAPPED) {
        gp_block *left = b->prev;
        left->size += b->size;
        left->next = b->next;
        if (b->next != NULL)
            b->next->prev = left;
        gp_block_recycle(cache, b);
        b = left;
    }
    return b;
}

/* Pages mapped with one access call at most (a bound for the stack array; 512 MiB of 2 MiB pages). */
#define GP_MAP_RUN_PAGES 256

/* Maps handles[0..n) at va, va + page, ...: with the backend's map_run (one access call for the run,
 * all or nothing) or, without it, page by page (stopping at the first failure). *mapped receives the
 * pages mapped, which are always the first ones. */
static int map_run(gp_pool_state *p, uintptr_t va, const gp_phys *handles, size_t n, size_t *mapped)
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

int gp_vmm_unmap_run(gp_pool_state *p, uintptr_t va, size_t n, size_t *done)
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

/*
 * Maps up to n pages at the front of the UNMAPPED block u of seg (owner st locked) and turns them into
 * FREE memory of st's heap, coalesced with a FREE block before them. Returns the pages mapped; stops at
 * the first failure, with *rc set.
 */
static size_t map_front(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, gp_block *u, size_t n, int *rc)
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
        for (; got < want; got++) {
            if ((*rc = gp_vmm_page_get(p, &handles[got])) != GP_OK)
                break;
        }
        uintptr_t va = u->addr + done * p->page;
        size_t mapped = 0;
        int mrc = got > 0 ? map_run(p, va, handles, got, &mapped) : GP_OK;
        for (size_t i = mapped; i < got; i++)
            page_put(p, handles[i]); /* not mapped: back to the page pool, nothing lost */
        for (size_t i = 0; i < mapped; i++)
            seg->pages[page_index(p, seg, va) + i] = handles[i];
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
        split_at(u, done * p->page, rest != NULL ? rest : gp_block_new(&st->blocks));
    else if (rest != NULL)
        gp_block_recycle(&st->blocks, rest);
    seg->mapped_bytes += done * p->page;
    gp_tenant_charge(st->tenant, (int64_t)(done * p->page));
    gp_block *merged = gp_heap_release(gp_heap_of(st, seg->small), &st->blocks, u);
    merged->free_since = atomic_load(&p->coarse_now);
    return done;
}

/*
 * Unmaps the n whole pages starting at `first` inside the FREE block b of seg (owner locked): the
 * handles go to the page pool or, with `release`, back to the device. Returns the pages done; stops at
 * the first failure (*rc), leaving the rest of b FREE.
 */
static size_t unmap_pages(gp_pool_state *p, gp_stream_state *owner, gp_segment *seg, gp_block *b, uintptr_t first,
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
    *rc = gp_vmm_unmap_run(p, first, n, &done); /* one synchronize for the run */
    atomic_fetch_add(&p->num_unmaps, done);
    for (size_t i = 0; i < done; i++) {
        uintptr_t va = first + i * p->page;
        gp_phys handle = seg->pages[page_index(p, seg, va)];
        if (release)
            gp_vmm_page_release(p, handle); /* a page the device refuses stays in the page pool */
        else
            page_put(p, handle);
    }
    if (done == 0) {
        gp_heap_insert(heap, b);
        gp_block_recycle(&owner->blocks, spare[0]);
        gp_block_recycle(&owner->blocks, spare[1]);
        return 0;
    }
    gp_block *mid = b, *left = NULL, *right = NULL;
    int used = 0;
    if (first > b->addr) {
        left = b;
        mid = split_at(b, first - b->addr, spare[used++]);
    }
    if (mid->size > done * p->page)
        right = split_at(mid, done * p->page, spare[used++]);
    for (int i = used; i < 2; i++)
        gp_block_recycle(&owner->blocks, spare[i]);
    mid->state = GP_BLOCK_UNMAPPED;
    if (left != NULL)
        gp_heap_insert(heap, left);
    if (right != NULL)
        gp_heap_insert(heap, right);
    if (mid->prev == NULL)
        seg->first = mid;
    mid = merge_unmapped(&owner->blocks, mid);
    if (mid->prev == NULL)
        seg->first = mid;
    seg->mapped_bytes -= done * p->page;
    gp_tenant_charge(owner->tenant, -(int64_t)(done * p->page));
    return done;
}

/*
 * Unmaps up to `want` whole pages of FREE blocks anywhere in the pool (oldest ranges first), except
 * inside `keep` (NULL or a FREE block to leave alone) and in blocks free since after `idle_before`;
 * only in tenant `only` (NULL = any); for a `taker` (NULL = none), other tenants' pages only down to
 * their min. Returns the pages done; *rc gets the first failure.
 */
static size_t unmap_free_pages(gp_pool_state *p, size_t want, const gp_block *keep, uint64_t idle_before,
                               bool release, int *rc, const gp_tenant *only, const gp_tenant *taker)
{
    size_t got = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL && got < want; seg = seg->next) {
        gp_stream_state *owner = seg->owner;
        if (seg->pages == NULL || seg->paused || (only != NULL && owner->tenant != only))
            continue;
        bool others = taker != NULL && owner->tenant != taker;
        pthread_mutex_lock(&owner->lock);
        bool progress = true;
        while (progress && got < want) {
            progress = false;
            for (gp_block *b = seg->first; b != NULL; b = b->next) {
                if (b->state != GP_BLOCK_FREE || b == keep || b->free_since > idle_before)
                    continue;
                uintptr_t first = seg->addr + div_up(b->addr - seg->addr, p->page) * p->page;
                uintptr_t end = seg->addr + (b->addr + b->size - seg->addr) / p->page * p->page;
                if (end <= first)
                    continue;
                size_t n = (end - first) / p->page;
                if (n > want - got)
                    n = want - got;
                while (others && n > 0 && !gp_tenant_can_give(owner->tenant, n * p->page))
                    n--;
                if (n == 0)
                    continue;
                int one = GP_OK;
                size_t done = unmap_pages(p, owner, seg, b, first, n, release, &one);
                got += done;
                if (one != GP_OK && *rc == GP_OK)
                    *rc = one;
                progress = done > 0; /* the chain changed: rescan the range */
                break;
            }
        }
        pthread_mutex_unlock(&owner->lock);
    }
    return got;
}

/* ---- growth ----------------------------------------------------------------------------------- */

/* A new range of at least `bytes` for st's heap of kind `small`: reserved, nothing mapped. */
static int new_range(gp_pool_state *p, gp_stream_state *st, size_t bytes, bool small, gp_segment **out)
{
    size_t want = p->cfg.vmm_reserve != 0 ? p->cfg.vmm_reserve : p->device_total;
    want = gp_round_up(want > bytes ? want : bytes, p->page);
    gp_segment *seg = calloc(1, sizeof *seg);
    gp_block *u = calloc(1, sizeof *u);
    if (seg == NULL || u == NULL) {
        free(seg);
        free(u);
        return gp_error_set(GP_ERR_OOM, "out of host memory for a virtual range");
    }
    gp_devptr va = 0;
    int rc = p->ops->va_reserve(p->ctx, want, &va);
    if (rc == GP_ERR_OOM && want > gp_round_up(bytes, p->page)) { /* address space is short: just enough */
        want = gp_round_up(bytes, p->page);
        rc = p->ops->va_reserve(p->ctx, want, &va);
    }
    if (rc == GP_OK && (seg->pages = calloc(want / p->page, sizeof *seg->pages)) == NULL) {
        p->ops->va_release(p->ctx, va, want);
        rc = gp_error_set(GP_ERR_OOM, "out of host memory for a page table of %zu pages", want / p->page);
    }
    if (rc != GP_OK) {
        free(seg);
        free(u);
        return rc;
    }
    seg->addr = va;
    seg->size = want;
    seg->small = small;
    seg->serial = p->next_serial++;
    seg->first = u;
    seg->owner = st;
    seg->mapped_bytes = 0;
    u->addr = va;
    u->size = want;
    u->segment = seg;
    u->state = GP_BLOCK_UNMAPPED;
    gp_segment_link(p, seg);
    *out = seg;
    return GP_OK;
}

/* The UNMAPPED block of st's ranges of kind `small` where mapping the fewest pages yields a FREE block
 * of rsize (extending the FREE block before it). st locked. */
static gp_block *growth_spot(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small, size_t *pages)
{
    gp_block *spot = NULL;
    *pages = SIZE_MAX;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->owner != st || seg->small != small || seg->pages == NULL || seg->mapped_bytes == seg->size)
            continue;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_UNMAPPED)
                continue;
            size_t before = b->prev != NULL && b->prev->state == GP_BLOCK_FREE ? b->prev->size : 0;
            size_t need = rsize > before ? div_up(rsize - before, p->page) : 1;
            if (need * p->page <= b->size && need < *pages) {
                spot = b;
                *pages = need;
            }
        }
    }
    return spot;
}

int gp_vmm_grow(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small)
{
    pthread_mutex_lock(&st->lock);
    size_t pages = 0;
    gp_block *spot = growth_spot(p, st, rsize, small, &pages);
    const gp_block *keep = spot != NULL && spot->prev != NULL && spot->prev->state == GP_BLOCK_FREE ? spot->prev : NULL;
    pthread_mutex_unlock(&st->lock);
    int rc = GP_OK;
    if (spot == NULL) {
        gp_segment *seg = NULL;
        rc = new_range(p, st, rsize, small, &seg);
        if (rc != GP_OK)
            return rc;
        spot = seg->first;
        pages = div_up(rsize, p->page);
        keep = NULL;
    }
    rc = gp_tenant_admit(p, st->tenant, pages * p->page, rsize);
    if (rc != GP_OK)
        return rc;
    /* Pages beyond the pool's come from the device while the pool stays under its cache cap
     * ((1 + cache_slack) x the peak of allocated bytes: the demand the workload has shown); past it, from
     * whole free pages anywhere in the pool (stitching), as many as keep it under the cap, and only the
     * rest from the device. The cap does not grow with what was stitched: a pool that held on to every
     * layout it once stitched for ends up with the sum of those layouts (on several streams, the sum of
     * each stream's own peak: 1.3-2.2 x live on the traces of issue 11), while moving free pages to
     * where the demand is keeps it at the demand's peak. The price is paid in map calls where the
     * layout a step needs keeps moving (a serving loop of varying shapes, several streams whose peaks
     * take turns); defrag:off instead grows once and then maps nothing. */
    if (p->cfg.defrag && pages > p->pooled_count) {
        size_t cap = gp_cache_cap(p, rsize);
        size_t after = atomic_load(&p->reserved) + (pages - p->pooled_count) * p->page;
        if (cap != SIZE_MAX && after > cap) {
            int urc = GP_OK;
            gp_collect_all_pending(p); /* quick-listed blocks hide whole free pages */
            size_t want = div_up(after - cap, p->page);
            if (want > pages - p->pooled_count)
                want = pages - p->pooled_count;
            if (unmap_free_pages(p, want, keep, UINT64_MAX, false, &urc, NULL, st->tenant) > 0)
                atomic_fetch_add(&p->num_stitches, 1);
        }
    }
    pthread_mutex_lock(&st->lock);
    assert(spot->state == GP_BLOCK_UNMAPPED); /* only pool-lock holders change UNMAPPED blocks */
    size_t done = map_front(p, st, spot->segment, spot, pages, &rc);
    pthread_mutex_unlock(&st->lock);
    if (done == pages)
        return GP_OK;
    if (rc == GP_ERR_OOM) {
        /* The device is full: every free page anywhere may serve, then try the rest again. */
        int urc = GP_OK;
        gp_collect_all_pending(p);
        unmap_free_pages(p, pages - done, NULL, UINT64_MAX, false, &urc, NULL, st->tenant);
        pthread_mutex_lock(&st->lock);
        spot = growth_spot(p, st, rsize, small, &pages);
        done = spot != NULL ? map_front(p, st, spot->segment, spot, pages, &rc) : 0;
        pthread_mutex_unlock(&st->lock);
        if (spot != NULL && done == pages)
            return GP_OK;
    }
    return rc != GP_OK ? rc : gp_error_set(GP_ERR_OOM, "could not map %zu pages", pages);
}

/* ---- giving memory back ------------------------------------------------------------------------ */

/* Frees the address space of ranges with nothing mapped. */
static void release_empty_ranges(gp_pool_state *p)
{
    for (gp_segment *seg = p->segments_head, *next; seg != NULL; seg = next) {
        next = seg->next;
        if (seg->pages == NULL || seg->mapped_bytes != 0 || seg->paused)
            continue;
        if (p->ops->va_release(p->ctx, seg->addr, seg->size) != GP_OK)
            continue; /* keep it; a later pass tries again */
        gp_segment_unlink(p, seg);
        assert(seg->first->state == GP_BLOCK_UNMAPPED && seg->first->next == NULL);
        free(seg->first);
        free(seg->pages);
        free(seg);
    }
}

size_t gp_vmm_release(gp_pool_state *p, size_t keep, uint64_t idle_before, int *failed)
{
    size_t before = atomic_load(&p->reserved);
    *failed = GP_OK;
    /* Pooled pages first: they are unmapped already. */
    size_t i = 0;
    while (i < p->pooled_count) {
        size_t cached = atomic_load(&p->reserved) - gp_allocated_estimate(p);
        if (cached <= keep)
            break;
        if (p->pooled_since[i] > idle_before) {
            i++;
            continue;
        }
        gp_phys handle = p->pooled[i];
        p->pooled[i] = p->pooled[p->pooled_count - 1];
        p->pooled_since[i] = p->pooled_since[p->pooled_count - 1];
        p->pooled_count--;
        int rc = gp_vmm_page_release(p, handle); /* on failure the page is pooled again at the end */
        if (rc != GP_OK) {
            if (*failed == GP_OK)
                *failed = rc;
            break;
        }
    }
    size_t cached = atomic_load(&p->reserved) - gp_allocated_estimate(p);
    if (cached > keep) {
        int rc = GP_OK;
        unmap_free_pages(p, div_up(cached - keep, p->page), NULL, idle_before, true, &rc, NULL, NULL);
        if (rc != GP_OK && *failed == GP_OK)
            *failed = rc;
    }
    release_empty_ranges(p);
    size_t after = atomic_load(&p->reserved);
    return before > after ? before - after : 0;
}

size_t gp_vmm_release_tenant(gp_pool_state *p, gp_tenant *t, size_t want, int *failed)
{
    size_t before = atomic_load(&p->reserved);
    *failed = GP_OK;
    unmap_free_pages(p, div_up(want, p->page), NULL, UINT64_MAX, true, failed, t, NULL);
    size_t after = atomic_load(&p->reserved);
    return before > after ? before - after : 0;
}

size_t gp_vmm_destroy(gp_pool_state *p, int *failed)
{
    size_t lost = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->pages == NULL)
            continue;
        bool clean = true;
        if (seg->paused && seg->mapped_bytes == 0) { /* nothing mapped: only the address range is left */
            if (p->ops->va_release(p->ctx, seg->addr, seg->size) != GP_OK && *failed == GP_OK)
                *failed = GP_ERR_DEVICE;
            continue;
        }
        /* Runs of mapped pages, each unmapped after one device synchronize, then released. */
        gp_block *b = seg->first;
        uintptr_t run = 0;
        size_t n = 0;
        for (uintptr_t va = seg->addr; va <= seg->addr + seg->size; va += p->page) {
            bool mapped = false;
            if (va < seg->addr + seg->size) {
                while (b->addr + b->size <= va)
                    b = b->next;
                /* unmapped blocks are whole pages; paused ranges may have pages without memory */
                mapped = b->state != GP_BLOCK_UNMAPPED && seg->pages[page_index(p, seg, va)] != GP_PHYS_NONE;
            }
            if (mapped) {
                if (n++ == 0)
                    run = va;
                continue;
            }
            while (n > 0) {
                size_t done = 0;
                int rc = gp_vmm_unmap_run(p, run, n, &done);
                for (size_t i = 0; i < done; i++) {
                    int rrc = p->ops->phys_release(p->ctx, seg->pages[page_index(p, seg, run) + i]);
                    if (rrc != GP_OK) {
                        lost += p->page;
                        clean = false;
                        if (*failed == GP_OK)
                            *failed = rrc;
                    }
                }
                if (rc != GP_OK) { /* the page that failed stays mapped and is lost; go on after it */
                    lost += p->page;
                    clean = false;
                    if (*failed == GP_OK)
                        *failed = rc;
                    done++;
                }
                run += done * p->page;
                n -= done;
            }
        }
        if (clean && p->ops->va_release(p->ctx, seg->addr, seg->size) != GP_OK && *failed == GP_OK)
            *failed = GP_ERR_DEVICE;
    }
    for (size_t i = 0; i < p->pooled_count; i++) {
        int rc = p->ops->phys_release(p->ctx, p->pooled[i]);
        if (rc != GP_OK) {
            lost += p->page;
            if (*failed == GP_OK)
                *failed = rc;
        }
    }
    p->pooled_count = 0;
    return lost;
}

const char *gp_vmm_check_segment(gp_pool_state *p, gp_segment *seg)
{
    if (seg->paused) { /* mapped: the pages outside UNMAPPED blocks that have a handle again */
        size_t mapped = 0;
        const gp_block *b = seg->first;
        for (uintptr_t va = seg->addr; va < seg->addr + seg->size; va += p->page) {
            while (b->addr + b->size <= va)
                b = b->next;
            if (b->state != GP_BLOCK_UNMAPPED && seg->pages[page_index(p, seg, va)] != GP_PHYS_NONE)
                mapped += p->page;
        }
        return mapped == seg->mapped_bytes ? NULL : "a paused range's mapped_bytes disagrees with its pages";
    }
    size_t unmapped = 0;
    for (gp_block *b = seg->first; b != NULL; b = b->next) {
        if (b->state != GP_BLOCK_UNMAPPED)
            continue;
        if ((b->addr - seg->addr) % p->page != 0 || b->size % p->page != 0)
            return "an unmapped block is not whole pages";
        if (b->next != NULL && b->next->state == GP_BLOCK_UNMAPPED)
            return "two unmapped blocks stand side by side";
        unmapped += b->size;
    }
    if (seg->mapped_bytes != seg->size - unmapped)
        return "mapped_bytes disagrees with the unmapped blocks";
    return NULL;
}
