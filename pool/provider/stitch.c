/*
 * stitch.c — stitching (defrag:on): before the vmm provider asks the device for new pages past the
 * cache cap, it moves whole free pages cut out of FREE blocks anywhere in the pool into the range that
 * grows, so that they make one contiguous block there (the idea of GMLake, ASPLOS 2024). Cutting free
 * pages out (gp_vmm_unmap_free_pages) also serves giving memory back (release=true). Only pages
 * inside FREE blocks move, and unmapping waits first for the work of the stream whose free memory they
 * are (its fence, provider/pages.c), so no stream can still be using them; contents that matter never
 * move.
 *
 * Idle pages first. A free page whose stream's last uses of it are still queued can be unmapped only
 * after the host waits for that stream's work, which on a busy stream lasts as long as the kernel in
 * flight (with several models, another model's step). So the pages are taken in two rounds: first
 * only those whose stream's fence already says their uses are over (asked without waiting,
 * gp_stream_done), then, where those do not suffice, the others, with the wait. Which pages move
 * changes nothing in how many: the same number of pages leaves the same ranges' free memory either
 * way, only in other places, so this costs no memory and waits only when the pool holds no idle page
 * to take instead. Pages parked with another stream's idle stitched block (alias.h: loans) are free
 * memory too: when free pages fall short, stitching waits for their holder's fence and takes them
 * back rather than ask the device for more (one stream's kernel against memory the workload's peak
 * does not need).
 */
#include <stdint.h>

#include "policy/cache_cap.h"
#include "provider/alias.h"
#include "provider/capture_window.h"
#include "provider/pages.h"
#include "provider/pending.h"
#include "provider/provider.h"
#include "provider/vmm.h"

/* Whether b is a FREE block a growth at `spot` extends or must leave in place (vmm.h): the one before
 * it, and with growth at its back (a stretch filled whole among them) the one after it too. Unmapping
 * pages at the end of the one before would merge the UNMAPPED spot into them (recycling its struct); at
 * the front of the one after, they join the spot and the block the growth extends is no longer next to
 * where it maps. */
static bool around_spot(const gp_block *b, const gp_block *spot, bool spot_back)
{
    return spot != NULL && (b->next == spot || (spot_back && b->prev == spot));
}

/*
 * One range's part of gp_vmm_unmap_free_pages (owner locked): up to `want` whole pages of its FREE
 * blocks stamped up to `done_upto` (the owner's free clock: UINT64_MAX takes any, waiting for the
 * owner's work where it is still queued); with `others`, only as far as the owner's tenant may give;
 * in the first pass (`shared` false) only pages that have no second address. Returns the pages done;
 * *rc gets the first failure.
 */
static size_t unmap_in_range(gp_pool_state *p, gp_segment *seg, size_t want, const gp_block *spot,
                             bool spot_back, uint64_t idle_before, uint64_t done_upto, bool release, bool others,
                             bool shared, int *rc)
{
    gp_stream_state *owner = seg->owner;
    size_t got = 0;
    bool progress = true;
    while (progress && got < want) {
        progress = false;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            /* The size before the state: a block smaller than a page holds no whole page (skipped
             * below anyway), and a block lent to a thread cache (under 8 KiB, never its size
             * written) has its state written by that thread without the stream's lock
             * (provider/thread_cache.h; TSan, multiprocess_ledger_threads: gp_tc_pop against this
             * read from a tenant's trim). */
            if (b->size < p->page || b->state != GP_BLOCK_FREE || around_spot(b, spot, spot_back) ||
                b->free_since > idle_before || b->free_seq > done_upto)
                continue;
            uintptr_t first = seg->addr + gp_div_up(b->addr - seg->addr, p->page) * p->page;
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
            /* Pages with a second address: a stitched range's are released at their home; a home's
             * alias slots (idle, as the page is free here) are unmapped first (alias.h). */
            bool home = !seg->stitched && seg->aliased != 0;
            if (seg->stitched && gp_alias_has_homes(p, seg, first, n))
                continue;
            if (home && !shared && (n = gp_alias_unshared_run(p, seg, &first, n)) == 0)
                continue;
            int one = GP_OK;
            if (home && (n = gp_alias_unshare(p, seg, first, n, &one)) == 0) {
                if (*rc == GP_OK)
                    *rc = one;
                continue;
            }
            size_t done = gp_pages_unmap(p, owner, seg, b, first, n, release, &one);
            got += done;
            if (one != GP_OK && *rc == GP_OK)
                *rc = one;
            progress = done > 0; /* the chain changed: rescan the range */
            break;
        }
    }
    return got;
}

/* gp_vmm_unmap_free_pages; with `idle_only`, only its first two rounds (below): pages whose stream's
 * work on them is done, taken with no wait. */
static size_t unmap_free_pages(gp_pool_state *p, size_t want, const gp_block *spot, bool spot_back,
                               uint64_t idle_before, bool release, int *rc, const gp_tenant *only,
                               const gp_tenant *taker, bool idle_only)
{
    size_t got = 0;
    if (gp_capture_underway()) /* unmapping synchronises the device: never while a graph is captured */
        return 0;
    /* Idle pages first (the file's header), and within each round pages with no second address first:
     * unmapping a home's alias slots undoes a stitched layout that a later step would map again
     * (alias.h); only when those do not suffice, the others. */
    int rounds = idle_only ? 2 : 4;
    for (int round = 0; round < rounds && got < want; round++) {
        bool idle_round = round < 2, shared = round % 2 == 1;
        for (gp_segment *seg = p->segments_head; seg != NULL && got < want; seg = seg->next) {
            gp_stream_state *owner = seg->owner;
            if (seg->pages == NULL || seg->paused || (only != NULL && owner->tenant != only))
                continue;
            bool others = taker != NULL && owner->tenant != taker;
            gp_stream_lock(owner);
            uint64_t done_upto = idle_round ? gp_stream_done(p, owner) : UINT64_MAX;
            got += unmap_in_range(p, seg, want - got, spot, spot_back, idle_before, done_upto, release, others,
                                  shared, rc);
            gp_stream_unlock(owner);
        }
    }
    return got;
}

size_t gp_vmm_unmap_free_pages(gp_pool_state *p, size_t want, const gp_block *spot, bool spot_back,
                               uint64_t idle_before, bool release, int *rc, const gp_tenant *only,
                               const gp_tenant *taker)
{
    return unmap_free_pages(p, want, spot, spot_back, idle_before, release, rc, only, taker, false);
}

/*
 * Pages beyond the pool's come from the device while the pool stays under its cache cap
 * ((1 + cache_slack) x the peak of allocated bytes: the demand the workload has shown); past it, from
 * whole free pages anywhere in the pool, as many as keep it under the cap, and only the rest from the
 * device. The cap does not grow with what was stitched: a pool that held on to every layout it once
 * stitched for ends up with the sum of those layouts (on several streams, the sum of each stream's own
 * peak: 1.3-2.2 x live on the workloads of issue 11), while moving free pages to where the demand is
 * keeps it at the demand's peak. The price is paid in map calls where the layout a step needs keeps
 * moving (a serving loop of varying shapes, several streams whose peaks take turns); defrag:off
 * instead grows once and then maps nothing.
 *
 * With `hold_peak` (the caller's: a large heap's growth on a tenant with several streams), growth
 * under the cap that would raise the pool's high-water mark (reserved_peak) also moves whole free
 * pages first, down to that mark, but only pages whose stream's work on them is done (the idle
 * rounds of gp_vmm_unmap_free_pages: no wait) and none held for a busy stream's stitched block. Why:
 * several models or replicas on one GPU take turns at their peaks, so when one stream's growth would
 * raise the mark, memory of the others often lies idle; growth under the cap would add to what the
 * device must hold for good (the figure every neighbour on the GPU pays), while idle pages serve with
 * map calls and no memory, as loans do where a request can be stitched whole (vmm.c, step 9). No
 * wait: under the cap the memory is granted anyway, and holding the host up for another model's
 * kernel to save it is the wrong trade (moving pages with waits added a fifth to the host's stalls
 * with busy streams, bench/RESULTS.md, session 45). One stream alone keeps the cap's rule: its free
 * pages are its own layout for later in its step, and cutting them out strands the pieces beside the
 * cut (measured on 40 single-stream traces: as many worse as better, map calls in later passes).
 */
void gp_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t pages, const gp_block *spot, bool spot_back,
               bool hold_peak)
{
    size_t cap = gp_cache_cap(&p->cfg, gp_allocated_estimate(p), atomic_load(&p->allocated_peak), rsize);
    if (cap == SIZE_MAX) /* cache_slack off: growth never moves pages */
        return;
    size_t after = atomic_load(&p->reserved) + (pages - p->pooled_count) * p->page;
    size_t limit = cap, mark = atomic_load(&p->reserved_peak);
    if (hold_peak && mark < cap)
        limit = mark;
    if (after <= limit)
        return;
    bool under_cap = after <= cap; /* only the high-water mark is passed: idle pages, no wait */
    int urc = GP_OK;
    gp_collect_all_pending(p); /* quick-listed blocks hide whole free pages */
    gp_alias_reclaim(p, NULL); /* and so do pages parked with idle stitched blocks (alias.h) */
    size_t want = gp_div_up(after - limit, p->page);
    if (want > pages - p->pooled_count)
        want = pages - p->pooled_count;
    size_t got = unmap_free_pages(p, want, spot, spot_back, UINT64_MAX, false, &urc, NULL, st->tenant, under_cap);
    /* Short of free pages past the cap: pages parked for busy holders are free memory too, once their
     * holder's work on them is done; waiting for that one stream beats growing past the cap. */
    if (got < want && !under_cap && gp_alias_reclaim_waiting(p, want - got) > 0)
        got += gp_vmm_unmap_free_pages(p, want - got, spot, spot_back, UINT64_MAX, false, &urc, NULL, st->tenant);
    if (got > 0)
        atomic_fetch_add(&p->num_stitches, 1);
}
