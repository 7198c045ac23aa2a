/*
 * vmm.c — the vmm provider (provider.h): the pool over virtual memory (backends vmm and sim-vmm),
 * physical pages mapped behind reserved address ranges, so that memory can be moved instead of
 * allocated. Stitching (step 2 below) is provider/stitch.c; pausing a range, for api/pause.c, is
 * provider/vmm_pause.c.
 *
 * A stream's heap of one kind (small or large) grows in place: its ranges reserve far more address
 * space than they map (vmm_reserve, by default the device's whole memory), and a miss maps new pages
 * in an UNMAPPED stretch, next to a FREE block, which it extends, wherever that maps the fewest (the
 * idea of PyTorch's expandable segments; growth_spot). The pages come, in this order, from
 *   1. the page pool: physical handles mapped nowhere, kept for reuse;
 *   2. stitching (defrag:on): whole free pages cut out of FREE blocks anywhere in the pool, unmapped
 *      and mapped again where they make one contiguous block (the idea of GMLake, ASPLOS 2024);
 *   3. the device (phys_create).
 * Before any of these, a stream whose heap misses takes another stream's unused range or borrows
 * another stream's idle free block (provider/vmm_streams.c): memory moves between streams without a
 * device or map call. Moved pages change owner and address but never contents that matter: only pages inside
 * FREE blocks move, and unmap waits for all device work first, so no stream can still be using them.
 *
 * Pages are mapped and unmapped in runs (provider/pages.c) and every change leaves the pool
 * consistent: a map or unmap that fails stops the operation with the pages done so far in place (FREE
 * and usable, or back in the page pool) and fails only the request that asked for it.
 *
 * Locks: the pool lock is held throughout; a range's blocks change under its owner's stream lock,
 * which is held across the map/unmap calls on that range (slow path only). UNMAPPED blocks are created
 * and removed only here, under the pool lock.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "policy/cache_cap.h"
#include "provider/alias.h"
#include "provider/capture_window.h"
#include "provider/pending.h"
#include "provider/thread_cache.h"
#include "provider/provider.h"
#include "provider/pages.h"
#include "provider/pool_ledger.h"
#include "provider/vmm.h"
#include "provider/vmm_streams.h"

/* ---- growth ----------------------------------------------------------------------------------- */

/* The bytes mapped in st's ordinary ranges of kind `small` (what that heap holds). Pool lock held. */
static size_t heap_mapped(const gp_pool_state *p, const gp_stream_state *st, bool small)
{
    size_t mapped = 0;
    for (const gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (seg->owner == st && seg->small == small && seg->pages != NULL && !seg->stitched)
            mapped += seg->mapped_bytes;
    return mapped;
}

/* The most any stream's heap of kind `small` maps. Pool lock held. */
static size_t largest_heap(const gp_pool_state *p, bool small)
{
    size_t most = 0;
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        size_t mapped = heap_mapped(p, p->streams.by_index[i], small);
        if (mapped > most)
            most = mapped;
    }
    return most;
}

/*
 * A new range of at least `bytes` for st's heap of kind `small`: reserved, nothing mapped.
 *
 * A range reserves the device's whole memory (vmm_reserve), so that one heap can grow in place up to
 * any peak. The address space is finite, though (a process's, or a ulimit's; the simulated device's
 * room for 64 such ranges), and every stream has a small and a large heap, plus a stitched range per
 * layout: enough heaps use it up with their first ranges. Past that, a range that reserved only the
 * request's pages, as it did, cannot grow: the tail of its last page stays free beside the block as
 * long as the block lives, and every further miss of that heap makes another such range with its own
 * stranded tail. On three replicas of one training step (three streams, six heaps) on an address
 * space of room for four such ranges (the simulator's before), 210 MiB of 3.7 GiB reserved sat in
 * those tails when reserved peaked, free and usable by no request; the cache cap cannot see them, as
 * no page of them is whole.
 *
 * So when the whole reservation is refused, the range reserves twice what the largest heap of its kind
 * maps now, plus the request: memory moves between the streams of a pool (steals, borrowing,
 * stitching), so any heap may come to hold what one heap holds already, and doubling, as a vector
 * grows, leaves a heap a number of ranges logarithmic in its peak while the address space it takes
 * stays within a small multiple of the memory. Where even that is refused, twice what st's heap maps
 * and the request, and only then the request's pages alone. A refused reservation costs no device
 * memory and no map call.
 */
static int new_range(gp_pool_state *p, gp_stream_state *st, size_t bytes, bool small, gp_segment **out)
{
    size_t want = p->cfg.vmm_reserve != 0 ? p->cfg.vmm_reserve : p->device_total;
    size_t least = gp_round_up(bytes, p->page);
    want = gp_round_up(want > bytes ? want : bytes, p->page);
    gp_segment *seg = gp_segment_new();
    if (seg == NULL)
        return gp_error_set(GP_ERR_OOM, "out of host memory for a virtual range");
    gp_devptr va = 0;
    int rc = p->ops->va_reserve(p->ctx, want, &va);
    /* address space is short: room to double the largest heap, then this one, then just enough */
    size_t fallback[3] = {2 * (largest_heap(p, small) + least), 2 * (heap_mapped(p, st, small) + least), least};
    for (int i = 0; i < 3 && rc == GP_ERR_OOM; i++) {
        if (fallback[i] >= want)
            continue;
        want = fallback[i];
        rc = p->ops->va_reserve(p->ctx, want, &va);
    }
    if (rc == GP_OK && (seg->pages = calloc(want / p->page, sizeof *seg->pages)) == NULL) {
        p->ops->va_release(p->ctx, va, want);
        rc = gp_error_set(GP_ERR_OOM, "out of host memory for a page table of %zu pages", want / p->page);
    }
    if (rc != GP_OK) {
        gp_segment_discard(seg);
        return rc;
    }
    gp_segment_place(p, seg, st, va, want, small, 0, GP_BLOCK_UNMAPPED);
    *out = seg;
    return GP_OK;
}

/* Whether the neighbour b of an UNMAPPED block is a FREE block that growth next to it extends. Sizes
 * before states: a block lent to a thread cache (under GP_QUICK_CLASSES granules, its size never
 * written) has its state written by that thread without st's lock (provider/thread_cache.h); such a
 * small block is taken as not extending (at most one page more grown, where the request's last bytes
 * would have fitted in it; no figure of bench/RESULTS.md moves). */
static bool extendable(const gp_block *b)
{
    return b != NULL && b->size >= GP_QUICK_CLASSES * GP_GRANULE && b->state == GP_BLOCK_FREE;
}

/*
 * The UNMAPPED block of st's ranges of kind `small` where mapping the fewest pages yields a FREE block
 * of rsize, and on which side of it (*back) they go: at its front, extending the FREE block before it,
 * or, with `both_sides`, at its back, extending the FREE block after it (and, for a stretch filled
 * whole, the one before it too). st locked.
 *
 * Why both sides. An UNMAPPED stretch inside a range is where whole free pages were cut out of a FREE
 * block (stitching, giving memory back: provider/stitch.c), and the cut leaves that block's partly
 * used first and last pages FREE on either side of it. Growth at the front only ever reuses the free
 * bytes on the left; where the right holds more, it maps a page more than needed and strands the right
 * one's free bytes in a partly used page, next to a new partly used page of its own. Mapping next to
 * whichever side holds more maps the fewest pages, the rule this function has always followed, over
 * both neighbours; a stretch filled whole joins both.
 */
static gp_block *growth_spot(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small, bool both_sides,
                             size_t *pages, bool *back)
{
    gp_block *spot = NULL;
    *pages = SIZE_MAX;
    *back = false;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->owner != st || seg->small != small || seg->pages == NULL || seg->stitched ||
            seg->mapped_bytes == seg->size)
            continue;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            /* An UNMAPPED block is whole pages (sizes before states, as in extendable) */
            if (b->size < p->page || b->state != GP_BLOCK_UNMAPPED)
                continue;
            size_t gap = b->size / p->page;
            size_t before = extendable(b->prev) ? b->prev->size : 0;
            size_t after = both_sides && extendable(b->next) ? b->next->size : 0;
            size_t need = rsize > before ? gp_div_up(rsize - before, p->page) : 1;
            if (need <= gap && need < *pages) {
                spot = b;
                *pages = need;
                *back = false;
            }
            if (after == 0)
                continue;
            need = rsize > after ? gp_div_up(rsize - after, p->page) : 1;
            if (need <= gap && need < *pages) {
                spot = b;
                *pages = need;
                *back = true;
            }
            if (gap < *pages && before + b->size + after >= rsize) {
                /* Filled whole, it joins both neighbours: mapped at the back, which for the whole
                 * stretch is its front too, so that stitching leaves the block after it alone as well
                 * (gp_stitch's spot_back); moved, its pages would leave the grown block short. */
                spot = b;
                *pages = gap;
                *back = true;
            }
        }
    }
    return spot;
}

/* Where st's heap of kind `small` grows for rsize (growth_spot, *back its side; NULL: in a new range)
 * and, in *pages, how many pages that growth maps: `exact` when non-zero (the spot then only where they
 * all fit, at its front, which is where grow_and_stitch looks for them), else growth_spot's count, or
 * the request's pages for a new range. st locked. */
static gp_block *growth_plan(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small, size_t exact,
                             size_t *pages, bool *back)
{
    gp_block *spot = growth_spot(p, st, rsize, small, exact == 0, pages, back);
    if (exact != 0) {
        *pages = exact;
        return spot != NULL && spot->size >= exact * p->page ? spot : NULL;
    }
    if (spot == NULL)
        *pages = gp_div_up(rsize, p->page);
    return spot;
}

/* Maps n pages at the spot growth_spot chose, on its side; `from` gets the first page's address. */
static size_t map_spot(gp_pool_state *p, gp_stream_state *st, gp_block *spot, bool back, size_t n, uintptr_t *from,
                       int *rc)
{
    *from = back ? spot->addr + spot->size - n * p->page : spot->addr;
    return back ? gp_pages_map_back(p, st, spot->segment, spot, n, rc)
                : gp_pages_map_front(p, st, spot->segment, spot, n, rc);
}

/*
 * Undoes a growth that failed part-way: the n pages mapped at `from` go back to the page pool (mapped
 * nowhere, reusable by anyone), so that the failed request changes nothing but the pool's page cache.
 * Skipped when a fast path has taken part of them meanwhile (they are in use, and stay), or when an
 * unmap fails (they stay FREE in st's heap: nothing is lost). Pool lock held, st not locked.
 */
static void undo_growth(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, uintptr_t from, size_t n)
{
    if (n == 0)
        return;
    gp_stream_lock(st);
    gp_block *b = seg->first;
    while (b != NULL && b->addr + b->size <= from)
        b = b->next;
    if (b != NULL && b->state == GP_BLOCK_FREE && b->addr <= from && from + n * p->page <= b->addr + b->size) {
        int rc = GP_OK;
        gp_pages_unmap(p, st, seg, b, from, n, false, &rc);
    }
    gp_stream_unlock(st);
}

/* Whether st's tenant has another stream, which may lend it pages (pool lock held). */
static bool tenant_has_other_streams(const gp_pool_state *p, const gp_stream_state *st)
{
    unsigned streams = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < streams; i++)
        if (p->streams.by_index[i] != st && p->streams.by_index[i]->tenant == st->tenant)
            return true;
    return false;
}

/*
 * Makes a FREE block of at least `rsize` in st's heap of kind `small` (or, with `exact` non-zero,
 * maps exactly that many pages where that block would grow: grow_and_stitch) by mapping pooled,
 * stitched or new physical pages into st's ranges, one step per paragraph:
 *
 * 1. Admission decides first. It may trim the tenant's own cache, which unmaps free pages of the
 *    tenant's ranges and merges UNMAPPED blocks (recycling their structs), so no block found before it
 *    may be used after it: the spot is found again once admission is done. Admission is told what the
 *    best spot needs now; its trimming can only make that more (the FREE block before the spot may
 *    shrink), so it is asked again until the spot needs no more than it admitted. The need never
 *    exceeds div_up(rsize, page) and the admitted count grows every round, so this ends.
 * 2. No spot: a new range (after admission, so that a refused request reserves nothing).
 * 3. Stitching (defrag) moves free pages elsewhere into the page pool; it leaves alone the FREE block
 *    right before the spot, so the spot and what it needs stay as they are (only pool-lock holders
 *    change UNMAPPED blocks).
 * 4. The pages are mapped. At device OOM, what was mapped goes back to the page pool, every free page
 *    anywhere may serve (making room may trim this pool and release its empty ranges, so nothing found
 *    before it is used after it), and the growth is mapped at the spot found then (again protected),
 *    within what admission allowed.
 * 5. A growth that still falls short gives the pages it mapped back to the page pool (undo_growth):
 *    a failed request leaves no memory behind in st's heap.
 */
static int grow(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small, size_t exact)
{
    size_t pages = 0, admitted = 0;
    gp_block *spot = NULL;
    bool back = false;
    int rc = GP_OK;
    uint64_t allocs = 0; /* st->num_allocs when the spot was planned (the invariant after the mapping) */
    for (;;) {
        gp_stream_lock(st);
        spot = growth_plan(p, st, rsize, small, exact, &pages, &back);
        allocs = st->num_allocs;
        gp_stream_unlock(st);
        if (pages <= admitted)
            break;
        rc = gp_provider_admit(p, st->tenant, pages * p->page, rsize);
        if (rc != GP_OK)
            return rc;
        admitted = pages;
    }
    /* GPU-wide: the tenant bytes of every page about to be mapped, before any is */
    rc = gp_pool_ledger_charge(p, st->tenant, 0, pages * p->page, true);
    if (rc != GP_OK)
        return rc;
    size_t charged = pages * p->page;
    if (p->ledger != NULL) {
        /* The charge may have given this pool's free pages back (to make room): find the spot again. */
        gp_stream_lock(st);
        spot = growth_plan(p, st, rsize, small, exact, &pages, &back);
        allocs = st->num_allocs;
        gp_stream_unlock(st);
        if (pages * p->page > charged) {
            rc = gp_pool_ledger_charge(p, st->tenant, 0, pages * p->page - charged, false);
            if (rc != GP_OK) {
                gp_pool_ledger_credit(p, st->tenant, 0, charged);
                return rc;
            }
            charged = pages * p->page;
        }
    }
    if (spot == NULL) {
        gp_segment *seg = NULL;
        rc = new_range(p, st, rsize, small, &seg);
        if (rc != GP_OK) {
            gp_pool_ledger_credit(p, st->tenant, 0, charged);
            return rc;
        }
        spot = seg->first;
        back = false;
    }
    if (p->cfg.defrag && pages > p->pooled_count && !gp_capture_underway()) /* stitching unmaps */
        gp_stitch(p, st, rsize, pages, spot, back, !small && tenant_has_other_streams(p, st));
    gp_stream_lock(st);
    assert(spot->state == GP_BLOCK_UNMAPPED); /* only pool-lock holders change UNMAPPED blocks */
    gp_segment *grown = spot->segment;
    uintptr_t from = 0;
    size_t done = map_spot(p, st, spot, back, pages, &from, &rc);
    /* Where nothing was allocated on st since the plan (a fast path on another thread may take the FREE
     * neighbour the plan counted: alloc_vmm then grows again), the neighbours are as the plan saw them
     * or larger (frees only merge; stitching leaves them alone), so the FREE block the mapped pages
     * joined (the one holding `from`) holds rsize. Outside the pool lock (held here) a FREE block of st
     * leaves its heap only to be handed out in the same hold of st's lock, which counts it in
     * num_allocs. A plan that counted a neighbour stitching then moved (the stretch filled whole,
     * before 3ae135b) fails here. */
    assert(exact != 0 || pages == 0 || done != pages || st->num_allocs != allocs ||
           gp_pages_block_at(grown, from)->size >= rsize);
    (void)allocs; /* builds without asserts (the benchmarks') */
    gp_stream_unlock(st);
    gp_pool_ledger_credit(p, st->tenant, 0, charged - done * p->page); /* what was not mapped */
    if (done == pages)
        return GP_OK;
    if (rc == GP_ERR_OOM || (rc == GP_ERR_MIN_GUARANTEE && p->ledger != NULL)) {
        /* The device is full: every free page anywhere may serve (other processes' cache too, when a
         * ledger is shared), then try again at the spot found then (protected), within what admission
         * allowed. The pages this growth mapped go back to the page pool first, and the retry maps
         * them again: making room may trim this pool, which unmaps free pages — these among them —
         * and releases ranges left with nothing mapped, so `grown` may be gone after it (fuzz_config
         * found the use after free with a named ledger on sim-vmm). */
        int urc = GP_OK;
        size_t more = 0;
        undo_growth(p, st, grown, from, done); /* neither is used after: this branch returns */
        gp_pool_ledger_make_room(p, st->tenant, pages * p->page);
        gp_collect_all_pending(p);
        gp_stream_lock(st);
        spot = growth_spot(p, st, rsize, small, exact == 0, &more, &back);
        gp_stream_unlock(st);
        if (spot != NULL && more <= admitted &&
            (rc = gp_pool_ledger_charge(p, st->tenant, 0, more * p->page, false)) == GP_OK) {
            gp_vmm_unmap_free_pages(p, more, spot, back, UINT64_MAX, false, &urc, NULL, st->tenant);
            gp_stream_lock(st);
            assert(spot->state == GP_BLOCK_UNMAPPED);
            gp_segment *seg2 = spot->segment;
            uintptr_t from2 = 0;
            size_t again = map_spot(p, st, spot, back, more, &from2, &rc);
            gp_stream_unlock(st);
            gp_pool_ledger_credit(p, st->tenant, 0, (more - again) * p->page);
            if (again == more)
                return GP_OK;
            undo_growth(p, st, seg2, from2, again);
        }
        return rc != GP_OK ? rc : gp_error_set(GP_ERR_OOM, "could not map %zu pages", pages);
    }
    undo_growth(p, st, grown, from, done);
    return rc != GP_OK ? rc : gp_error_set(GP_ERR_OOM, "could not map %zu pages", pages);
}

/*
 * The pages a growth in place of st's heap of kind `small` for rsize would map (*need; a new range
 * needs every page), and how many of them the page pool cannot supply, returned: those are new memory,
 * or past the cache cap pages moved from elsewhere (pooled pages are no new memory). st not locked.
 */
static size_t growth_beyond_pool(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small, size_t *need)
{
    gp_stream_lock(st);
    bool back;
    (void)growth_plan(p, st, rsize, small, 0, need, &back);
    gp_stream_unlock(st);
    return *need > p->pooled_count ? *need - p->pooled_count : 0;
}

/* Whether `fresh` new pages on top of what is reserved pass the pool's high-water mark (reserved_peak). */
static bool past_peak(const gp_pool_state *p, size_t fresh)
{
    return atomic_load(&p->reserved) + fresh * p->page > atomic_load(&p->reserved_peak);
}

/*
 * Whether a new stitched range should serve a request of rsize on st rather than growth in place.
 *
 * A stitched block takes whole free pages (all of the request's pages) out of the holes that the
 * requests after it could use, while growth that extends the FREE block at the end of a range adds only
 * the pages that block lacks. Where that block already holds part of the request, growth needs fewer
 * pages than the stitched block would take and leaves the holes to the rest of the step; stitching pays
 * where growth would need every page of the request anew.
 *
 * Except where the growth would make new memory past the pool's high-water mark (reserved_peak) while
 * st's own whole free pages hold the whole request. Then growth raises the peak now, for certain, by
 * the pages it makes, and that peak is what the device must hold, what a neighbour on the GPU cannot
 * have, and what every figure counts; stitching makes no memory at all. What it costs is uncertain:
 * the later requests that would have filled the holes may grow instead, and they raise the peak only
 * where that growth comes at a live level at least as high as this one while the stitched block lives.
 * Past this point of a step the live level falls, past the cache cap growth moves free pages rather
 * than making them, and in the next step the stitched range serves again (alias.h).
 * Measured on the 27 workloads of bench/RESULTS.md: no single-stream trace worse, gpt_train_s64 1.038
 * -> 1.011 and lstm_varlen_train 1.038 -> 1.029 (its last pass then maps nothing; nor does
 * fasterrcnn_serve's); on several streams more workloads better than worse, a few worse by up to 0.016
 * (bench/RESULTS.md). Both rules compare page counts from the layout; no constant.
 */
static bool stitching_pays(gp_pool_state *p, gp_stream_state *st, size_t rsize)
{
    size_t need = 0, n = gp_div_up(rsize, p->page);
    size_t fresh = growth_beyond_pool(p, st, rsize, false, &need);
    if (need >= n)
        return true;
    return past_peak(p, fresh) && gp_alias_free_pages(p, st) >= n;
}

/*
 * Whether growing st's heap of kind `small` for rsize would pass the cache cap: the pages it needs
 * beyond the page pool's, on top of what is reserved, against the cap of provider/stitch.c. Past it,
 * growth moves other streams' free pages into st's range (or asks the device), and when those
 * streams need their pages back in their own part of the step, they move again: every step pays in
 * map calls. Lending the pages in place instead (a stitched range with loans, alias.h) pays once.
 */
static bool growth_passes_cap(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small)
{
    size_t need = 0, fresh = growth_beyond_pool(p, st, rsize, small, &need);
    size_t cap = gp_cache_cap(&p->cfg, gp_allocated_estimate(p), atomic_load(&p->allocated_peak), rsize);
    return cap != SIZE_MAX && atomic_load(&p->reserved) + fresh * p->page > cap;
}

/*
 * Whether growing st's heap of kind `small` for rsize would make memory past the pool's high-water
 * mark (reserved_peak): the pages it needs beyond the page pool's, on top of what is reserved.
 *
 * Growth under the cache cap is cheap while it stays below the high-water mark: that memory was held
 * before, and the figure that counts (the peak the device must hold, what a neighbour on the GPU
 * cannot have) does not move. Past the mark it moves, for certain and for good, by every page grown.
 * Where other streams of the same tenant are idle with whole free pages (several models or replicas
 * taking turns at their peaks: one stream's peak comes while another's memory lies free), lending
 * those pages to a stitched range (alias.h: loans) serves the request with map calls and no new
 * memory, and the pages stay at home, so their owner takes them back without a call once the holder
 * is done. This is the cap's own rule ("past the cap, lend rather than grow") applied where the peak,
 * rather than the cap, is at stake. The caller tries it only where st's tenant has another stream
 * (tenant_has_other_streams): alone, there is nothing to lend, and the stitch with loans would only
 * repair st's own idle stitched ranges, unmapping and mapping for no memory saved. In a loop that
 * repeats its step, growth past the mark comes in the first steps, so the rule acts there; what
 * follows is the loans' own steady state (alias.h). Measured on
 * 68 several-stream workloads (bench/RESULTS.md), it costs map calls in later passes (a third more in
 * the third) and saves device calls there.
 */
static bool growth_raises_peak(gp_pool_state *p, gp_stream_state *st, size_t rsize, bool small)
{
    size_t need = 0, fresh = growth_beyond_pool(p, st, rsize, small, &need);
    return past_peak(p, fresh);
}

/*
 * Whether a stitched block for rsize wastes no more than the cache cap allows: it takes whole pages,
 * and the tail of its last one serves nothing while it lives. A pool of such blocks holds (1 + waste
 * / rsize) x what is asked for; past (1 + cache_slack), the slack the cap grants the whole pool, the
 * block costs more memory than moving pages would, and growth in place (which extends a free block
 * and wastes nothing) serves better.
 */
static bool stitch_waste_fits(const gp_pool_state *p, size_t rsize)
{
    size_t waste = gp_div_up(rsize, p->page) * p->page - rsize;
    return p->cfg.cache_slack < 0 || (double)waste <= p->cfg.cache_slack * (double)rsize;
}

/*
 * A stitched block made partly of new pages (GMLake's partial match), for a request of rsize that no
 * free block of st fits, where st's whole free pages are too few to stitch it from them alone and
 * growth in place would need every page of it anew (stitching_pays): growth maps just the pages that
 * are missing, and a stitched range aliases them together with every whole free page (the holes'
 * first, gp_alias_stitch). The request then adds to reserved memory only the pages nothing held, where
 * growth would add all of them and leave the holes' pages free beside it; those are what stands
 * between a layout's peak and its page floor where large requests come in the holes' shapes (one
 * training step's largest buffer over the free pages of the buffers freed before it). The new pages
 * are homes at the end of the range like any grown pages, free between the block's uses, so that a
 * loop that repeats its step is served by the stitched range again with no map call (alias.h).
 *
 * It is used only where at least as many of the block's pages are already free as must be new: a
 * block that is mostly new memory saves little and takes whole free pages out of holes that the
 * step's later, smaller requests would have filled, stranding the holes' partial pages beside its
 * SHADOW homes while it lives (that trade is growth's, as in stitching_pays). Growth fills the gap
 * when the stitch does not come about (a map fault, pages moved meanwhile): the pages grown here are
 * FREE at the end of the range, which that growth extends, so nothing is lost.
 */
static gp_block *grow_and_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size)
{
    size_t n = gp_div_up(rsize, p->page), have = gp_alias_free_pages(p, st);
    if (have == 0 || have >= n || have < n - have)
        return NULL;
    if (grow(p, st, rsize, false, n - have) != GP_OK)
        return NULL;
    gp_block *b = gp_provider_take(p, st, NULL, false, rsize, size); /* the grown pages may fit it */
    return b != NULL ? b : gp_alias_stitch(p, st, rsize, size, false);
}

/*
 * Before a large request makes new memory: the pages st's small heap has on loan from its large ranges
 * (alias_small.c) that are wholly free now, once its quick lists and thread caches are flushed, go home, so
 * that the large heap has them for its peak. True when st's small heap had any on loan (the caller
 * then looks in the large heap again). Pool lock held, st not locked.
 */
static bool small_pages_home(gp_pool_state *p, gp_stream_state *st)
{
    gp_stream_lock(st);
    bool lent = gp_alias_small_lent(p, st);
    if (lent) {
        if (st->lenders != NULL)
            gp_thread_cache_return(p, st);
        gp_heap_quick_flush(&st->small, &st->blocks);
        gp_alias_small_reclaim(p, st);
    }
    gp_stream_unlock(st);
    return lent;
}

/*
 * The allocation slow path on a virtual memory backend: one chain, cheapest first, each step tried
 * only where the ones before it found nothing. Steps 1-5 make no device call and no map call; 6, 7 and
 * 9 map or unmap pages the pool already has (no new memory); 8 may, and 10 does, make new pages where
 * the pool has too few. A fast path on st may take the new memory between growth and adoption, so
 * growth is retried.
 */
static int alloc_vmm(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool small, size_t own_fit,
                     void **out)
{
    bool alias = p->cfg.defrag && p->cfg.alias && !small, alias_small = p->cfg.defrag && p->cfg.alias && small;
    bool lend = alias && p->cfg.loans; /* other streams' free pages, stitched in place */
    /* 1. Where st's own heap fits a large request only loosely: a tighter idle block of another
     *    stream of its tenant (tenant_best_fit; off by default). */
    gp_block *b = gp_vmm_tenant_best_fit(p, st, rsize, size, small, own_fit);
    /* 2. st's own heap, as the fast path saw it, and again after taking back (loans:on) its pages
     *    held for other streams' idle stitched ranges (alias.h: loans) and, for a large request, the
     *    pages its small heap has on loan and no longer uses (small_pages_home). */
    if (b == NULL)
        b = gp_provider_take(p, st, NULL, small, rsize, size);
    gp_segment *seg;
    if (b == NULL && lend && gp_alias_reclaim(p, st) > 0)
        b = gp_provider_take(p, st, NULL, small, rsize, size);
    if (b == NULL && alias && small_pages_home(p, st))
        b = gp_provider_take(p, st, NULL, false, rsize, size);
    /* 3. A stitched range of st whose homes are free (or held for it). */
    if (b == NULL && alias)
        b = gp_alias_take(p, st, rsize, size);
    /* 4. Another stream's unused range: it changes owner with its pages (gp_vmm_steal_range). */
    if (b == NULL && (seg = gp_vmm_steal_range(p, st, rsize, small)) != NULL)
        b = gp_provider_take(p, st, seg, small, rsize, size);
    /* 5. Another stream's idle free block, borrowed (gp_vmm_borrow). */
    if (b == NULL && p->cfg.borrow)
        b = gp_vmm_borrow(p, st, rsize, size, small, SIZE_MAX);
    /* 6. A small request: an alias of a free page at the frontier of st's large ranges (alias_small.c). */
    if (b == NULL && alias_small && !gp_capture_underway())
        b = gp_alias_small_grow(p, st, rsize, size);
    /* 7. The large heap must make memory: pages its small heap has on loan from the frontier and still
     *    uses become the small heap's own, so that growth in place extends the frontier (alias_small.c). */
    if (b == NULL && alias && !gp_capture_underway()) /* it may unmap */
        gp_alias_small_keep(p, st);
    /* 8. Where stitching pays: a new stitched range of st's own free pages; with loans:on, where growth
     *    would pass the cache cap, one that also maps other idle streams' free pages; else a stitched
     *    range of st's free pages and the pages they lack, grown for it (grow_and_stitch). */
    if (b == NULL && alias && !gp_capture_underway() && stitching_pays(p, st, rsize)) { /* it may unmap */
        b = gp_alias_stitch(p, st, rsize, size, false);
        if (b == NULL && lend && stitch_waste_fits(p, rsize) && growth_passes_cap(p, st, rsize, small)) {
            /* pages held for other streams' idle stitched blocks are free memory too (alias.h) */
            gp_vmm_collect_tenant_pending(p, st);
            gp_alias_reclaim(p, NULL);
            b = gp_alias_stitch(p, st, rsize, size, true);
        }
        if (b == NULL)
            b = grow_and_stitch(p, st, rsize, size);
    }
    /* 9. With loans:on, where growth would raise the pool's high-water mark: the same loan. */
    if (b == NULL && lend && !gp_capture_underway() && stitch_waste_fits(p, rsize) &&
        tenant_has_other_streams(p, st) && growth_raises_peak(p, st, rsize, small)) { /* it may unmap */
        gp_vmm_collect_tenant_pending(p, st);
        gp_alias_reclaim(p, NULL);
        b = gp_alias_stitch(p, st, rsize, size, true);
    }
    /* 10. Growth in place, from pooled, moved (stitch.c) or new pages (grow). */
    int rc = GP_OK;
    for (int attempt = 0; b == NULL && attempt < 3; attempt++) {
        rc = grow(p, st, rsize, small, 0);
        if (rc != GP_OK)
            break;
        b = gp_provider_take(p, st, NULL, small, rsize, size);
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
    return rc == GP_ERR_OOM ? gp_provider_out_of_memory(p, size, st->handle) : rc;
}


/* ---- giving memory back ------------------------------------------------------------------------ */

/* Frees the address space of ranges with nothing mapped. */
static void release_empty_ranges(gp_pool_state *p)
{
    for (gp_segment *seg = p->segments_head, *next; seg != NULL; seg = next) {
        next = seg->next;
        if (seg->pages == NULL || seg->mapped_bytes != 0 || seg->paused || seg->aliased != 0)
            continue;
        if (p->ops->va_release(p->ctx, seg->addr, seg->size) != GP_OK)
            continue; /* keep it; a later pass tries again */
        gp_segment_unlink(p, seg);
        assert(seg->first->state == GP_BLOCK_UNMAPPED && seg->first->next == NULL);
        free(seg->first);
        free(seg->pages);
        free(seg->homes);
        free(seg->alias_count);
        free(seg->loans);
        free(seg);
    }
}

static size_t release(gp_pool_state *p, size_t keep, uint64_t idle_before, int *failed)
{
    size_t before = atomic_load(&p->reserved);
    *failed = GP_OK;
    if (gp_capture_underway()) /* unmapping synchronises the device: never while a graph is captured */
        return 0;
    /* Pages held for idle stitched ranges of other streams are free memory of their owners again, so
     * that they can go back too. Then pooled pages: they are unmapped already. */
    gp_alias_reclaim(p, NULL);
    size_t i = 0;
    while (i < p->pooled_count) {
        size_t cached = gp_cached_estimate(p);
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
        int rc = gp_page_release(p, handle); /* on failure the page is pooled again at the end */
        if (rc != GP_OK) {
            if (*failed == GP_OK)
                *failed = rc;
            break;
        }
    }
    size_t cached = gp_cached_estimate(p);
    if (cached > keep) {
        int rc = GP_OK;
        gp_vmm_unmap_free_pages(p, gp_div_up(cached - keep, p->page), NULL, false, idle_before, true, &rc, NULL, NULL);
        if (rc != GP_OK && *failed == GP_OK)
            *failed = rc;
    }
    release_empty_ranges(p);
    size_t after = atomic_load(&p->reserved);
    return before > after ? before - after : 0;
}

static size_t release_tenant(gp_pool_state *p, gp_tenant *t, size_t want, int *failed)
{
    size_t before = atomic_load(&p->reserved);
    *failed = GP_OK;
    gp_alias_reclaim(p, NULL); /* held pages are free memory of their owners (alias.h) */
    /* want / page rounded up without overflow: a pause asks for SIZE_MAX bytes (all of the cache), which
     * gp_div_up would wrap to 0 pages, and nothing would go back before the pause */
    size_t pages = want / p->page + (want % p->page != 0);
    gp_vmm_unmap_free_pages(p, pages, NULL, false, UINT64_MAX, true, failed, t, NULL);
    size_t after = atomic_load(&p->reserved);
    return before > after ? before - after : 0;
}

/* Gives back one range at destroy: its mapped pages unmapped in runs (one device synchronize each) and
 * released (an alias's handle is released at its home), then its address space. Returns the bytes
 * lost to failed calls. */
static size_t destroy_range(gp_pool_state *p, gp_segment *seg, int *failed)
{
    size_t lost = 0;
    bool clean = true;
    if (seg->paused && seg->mapped_bytes == 0) { /* nothing mapped: only the address range is left */
        if (p->ops->va_release(p->ctx, seg->addr, seg->size) != GP_OK && *failed == GP_OK)
            *failed = GP_ERR_DEVICE;
        return 0;
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
            mapped = b->state != GP_BLOCK_UNMAPPED && seg->pages[gp_page_index(p, seg, va)] != GP_PHYS_NONE;
        }
        if (mapped) {
            if (n++ == 0)
                run = va;
            continue;
        }
        while (n > 0) {
            size_t done = 0;
            int rc = gp_pages_unmap_run(p, NULL, 0, run, n, &done); /* destroy: the device is synchronized */
            for (size_t i = 0; i < done; i++) {
                size_t at = gp_page_index(p, seg, run) + i;
                if (seg->stitched && seg->homes[at].seg != NULL)
                    continue; /* an alias: its home releases the handle */
                int rrc = p->ops->phys_release(p->ctx, seg->pages[at]);
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
    return lost;
}

static size_t destroy(gp_pool_state *p, int *failed)
{
    size_t lost = 0;
    /* One address per page where it can; an alias it could not undo is unmapped below all the same
     * (and its handle released at home), so its failure loses nothing and is not reported. */
    (void)gp_alias_dissolve(p, NULL);
    /* Stitched ranges first (their pages' homes release the handles), then the ordinary ones. */
    for (int stitched = 1; stitched >= 0; stitched--) {
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (seg->pages != NULL && seg->stitched == (bool)stitched)
                lost += destroy_range(p, seg, failed);
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

static const char *check_segment(gp_pool_state *p, gp_segment *seg)
{
    const char *alias = gp_alias_check(p, seg);
    if (alias != NULL)
        return alias;
    if (seg->paused && !seg->owner->tenant->paused)
        return "a range is paused while its tenant is not";
    if (seg->paused) { /* mapped: the pages outside UNMAPPED blocks that have a handle again */
        size_t mapped = 0;
        const gp_block *b = seg->first;
        for (uintptr_t va = seg->addr; va < seg->addr + seg->size; va += p->page) {
            while (b->addr + b->size <= va)
                b = b->next;
            if (b->state != GP_BLOCK_UNMAPPED && seg->pages[gp_page_index(p, seg, va)] != GP_PHYS_NONE)
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
    if (!seg->stitched && seg->mapped_bytes != seg->size - unmapped) /* stitched: gp_alias_check */
        return "mapped_bytes disagrees with the unmapped blocks";
    return NULL;
}

const gp_provider gp_provider_vmm = {
    .name = "vmm",
    .pages = true,
    .borrows_blocks = true,
    .alloc = alloc_vmm,
    .release = release,
    .release_tenant = release_tenant,
    .destroy = destroy,
    .check_segment = check_segment,
};
