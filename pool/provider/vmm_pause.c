/*
 * vmm_pause.c — pausing and resuming a range of the vmm provider, for api/pause.c (vmm.h states the
 * two-step protocol of each, so that a failed pause or resume changes nothing): the pages in use are
 * unmapped with their physical handles held until the pause commits, or mapped back; fresh pages are
 * mapped at a resume and unmapped again when it fails. Pool lock held for all of them.
 */
#include <assert.h>

#include "base/error.h"
#include "provider/pages.h"
#include "provider/pool_ledger.h"
#include "provider/vmm.h"

/* True for a page of seg that lies in no UNMAPPED block (it had memory when the range was paused).
 * A paused range has no SHADOW block: pausing dissolves aliases first (gp_alias_dissolve). */
static bool page_in_use(const gp_segment *seg, uintptr_t va)
{
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        if (va >= b->addr && va < b->addr + b->size)
            return !gp_block_unbacked(b);
    return false;
}

/* Maps `handle` at page i of seg and accounts it as memory of the range again. */
static int map_page(gp_pool_state *p, gp_segment *seg, size_t i, gp_phys handle)
{
    int rc = p->ops->map(p->ctx, seg->addr + i * p->page, p->page, handle);
    if (rc != GP_OK)
        return rc;
    seg->pages[i] = handle;
    atomic_fetch_add(&p->num_maps, 1);
    gp_history_note(p, GP_HIST_SEGMENT_MAP, seg->addr + i * p->page, p->page, seg->owner->handle,
                    seg->owner->tenant->index);
    seg->mapped_bytes += p->page;
    p->paused_bytes -= p->page;
    gp_tenant_charge(seg->owner->tenant, (int64_t)p->page);
    return GP_OK;
}

size_t gp_vmm_paused_pages(gp_pool_state *p, const gp_segment *seg)
{
    size_t n = 0;
    for (size_t i = 0; i < seg->size / p->page; i++)
        n += seg->pages[i] == GP_PHYS_NONE && page_in_use(seg, seg->addr + i * p->page);
    return n;
}

/* Accounts page i of seg, whose mapping has just been taken away, as a paused page again (the mirror of
 * map_page) and returns its handle, which the caller gives back or keeps. */
static gp_phys unmapped_page(gp_pool_state *p, gp_segment *seg, size_t i)
{
    gp_phys handle = seg->pages[i];
    assert(seg->paused && handle != GP_PHYS_NONE); /* only a paused range's pages go without memory */
    gp_history_note(p, GP_HIST_SEGMENT_UNMAP, seg->addr + i * p->page, p->page, seg->owner->handle,
                    seg->owner->tenant->index);
    seg->mapped_bytes -= p->page;
    p->paused_bytes += p->page;
    gp_tenant_charge(seg->owner->tenant, -(int64_t)p->page);
    seg->pages[i] = GP_PHYS_NONE;
    return handle;
}

int gp_vmm_resume_range(gp_pool_state *p, gp_segment *seg, gp_held_page *mapped, size_t *nmapped, size_t room)
{
    assert(seg->paused); /* it stays paused until the whole resume commits (gp_vmm_unpause_range) */
    (void)room; /* read by the assertion below only */
    size_t pages = seg->size / p->page;
    for (size_t i = 0; i < pages; i++) {
        if (seg->pages[i] != GP_PHYS_NONE || !page_in_use(seg, seg->addr + i * p->page))
            continue;
        gp_phys handle;
        int rc = gp_pool_ledger_charge(p, seg->owner->tenant, 0, p->page, false); /* GPU-wide max */
        if (rc != GP_OK)
            return rc;
        rc = gp_page_get(p, seg->owner->tenant, &handle);
        if (rc == GP_OK && (rc = map_page(p, seg, i, handle)) != GP_OK)
            gp_page_release(p, handle); /* one the device refuses stays pooled */
        if (rc != GP_OK) {
            gp_pool_ledger_credit(p, seg->owner->tenant, 0, p->page);
            return rc;
        }
        assert(*nmapped < room); /* room: the paused pages of every paused range at the start */
        mapped[(*nmapped)++] = (gp_held_page){seg, i, handle};
    }
    return GP_OK;
}

void gp_vmm_unpause_range(gp_pool_state *p, gp_segment *seg)
{
    assert(seg->paused && gp_vmm_paused_pages(p, seg) == 0); /* every in-use page has memory again */
    (void)p;
    seg->paused = false;
}

int gp_vmm_unmap_resumed(gp_pool_state *p, gp_held_page *mapped, size_t n, size_t *undone)
{
    *undone = 0;
    while (*undone < n) {
        /* a run: consecutive pages of one range. No work uses them: the tenant is paused, and the pool's
         * copies into them (staging) returned only once done. */
        const gp_held_page *first = &mapped[*undone];
        size_t run = 1;
        while (*undone + run < n && mapped[*undone + run].seg == first->seg &&
               mapped[*undone + run].index == first->index + run)
            run++;
        size_t done = 0;
        int rc = gp_pages_unmap_quiesced(p, first->seg->addr + first->index * p->page, run, &done);
        atomic_fetch_add(&p->num_unmaps, done);
        for (size_t k = 0; k < done; k++) {
            gp_held_page *h = &mapped[*undone + k];
            assert(h->seg->pages[h->index] == h->handle); /* nothing else maps or unmaps a paused range */
            unmapped_page(p, h->seg, h->index);
        }
        *undone += done;
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
}

int gp_vmm_pause_range(gp_pool_state *p, gp_segment *seg, gp_held_page *held, size_t *nheld)
{
    size_t pages = seg->size / p->page;
    seg->paused = true;
    for (size_t i = 0; i < pages;) {
        uintptr_t va = seg->addr + i * p->page;
        /* a page of no block in use, or of a paused range that failed to resume part-way: skip */
        if (seg->pages[i] == GP_PHYS_NONE || !page_in_use(seg, va)) {
            i++;
            continue;
        }
        /* a run of consecutive mapped pages; the tenant's streams are drained (api/pause.c) */
        size_t n = 1;
        while (i + n < pages && seg->pages[i + n] != GP_PHYS_NONE && page_in_use(seg, va + n * p->page))
            n++;
        size_t done = 0;
        int rc = gp_pages_unmap_quiesced(p, va, n, &done);
        atomic_fetch_add(&p->num_unmaps, done);
        for (size_t k = 0; k < done; k++, i++)
            held[(*nheld)++] = (gp_held_page){seg, i, unmapped_page(p, seg, i)}; /* the ledger: at commit */
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
}

int gp_vmm_map_back(gp_pool_state *p, const gp_held_page *h)
{
    int rc = map_page(p, h->seg, h->index, h->handle);
    if (rc == GP_OK && gp_vmm_paused_pages(p, h->seg) == 0)
        h->seg->paused = false;
    return rc;
}
