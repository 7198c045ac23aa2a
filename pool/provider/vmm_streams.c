/*
 * vmm_streams.c — memory that moves between the streams of a tenant on the vmm provider without a
 * device or map call: another stream's unused range changes owner (gp_vmm_steal_range), another
 * stream's idle free block is lent in place (gp_vmm_borrow; with tenant_best_fit:on also where st's
 * own fit is loose), and their completed pending frees come home first (gp_vmm_collect_tenant_pending).
 * Steps 1, 4 and 5 of vmm.c's alloc_vmm, and what its steps 8-9 collect before a loan.
 *
 * Stream order: a block or range changes stream only once its owner's fence says the owner's work on
 * it is done, or the taker's stream waits on that fence (gp_stream_reusable), as for any cross-stream
 * reuse (provider.h). Locks: the pool lock held; each other stream's lock taken alone.
 */
#include <assert.h>
#include <stdint.h>

#include "provider/alias.h"
#include "provider/pending.h"
#include "provider/provider.h"
#include "provider/thread_cache.h"
#include "provider/vmm_streams.h"

/* The latest free stamp among the FREE blocks of seg (owner locked): its fence covers them all then. */
static uint64_t range_free_seq(const gp_segment *seg)
{
    uint64_t seq = 0;
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        if (b->state == GP_BLOCK_FREE && b->free_seq > seq)
            seq = b->free_seq;
    return seq;
}

/*
 * Takes the range of another stream of st's tenant with the fewest mapped bytes that holds `size`
 * bytes and nothing live (every block FREE or UNMAPPED: gp_segment_unused), once its owner's work is
 * done or st's stream waits on it (gp_stream_reusable): the range changes owner with its mapped pages
 * and its UNMAPPED address space, so the new owner can also grow it in place. Returned with owner == st
 * and its FREE blocks on no list (gp_provider_take puts them in st's heap). NULL when none may be taken.
 */
gp_segment *gp_vmm_steal_range(gp_pool_state *p, gp_stream_state *st, size_t size, bool small)
{
    gp_segment *best = NULL;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        /* Ranges with aliases stay with their owner (alias.h: homes and aliases share one stream),
         * unless the aliases are only its owner's small heap's loans, which end first (alias_small.c). */
        if (seg->stitched || seg->owner == st || seg->small != small || seg->paused ||
            seg->pages == NULL || seg->mapped_bytes < size || seg->owner->tenant != st->tenant)
            continue;
        if (best != NULL && seg->mapped_bytes >= best->mapped_bytes)
            continue;
        gp_stream_state *owner = seg->owner;
        gp_stream_lock(owner);
        bool usable = (seg->aliased == 0 ? gp_segment_unused(seg) : gp_alias_small_only_loans(p, seg)) &&
                      gp_stream_reusable(p, owner, st, range_free_seq(seg), false);
        gp_stream_unlock(owner);
        if (usable)
            best = seg;
    }
    if (best == NULL)
        return NULL;
    gp_stream_state *owner = best->owner;
    gp_stream_lock(owner);
    /* the owner may have used it since; its small heap's loans end first (unmapping them synchronizes) */
    uint64_t seq = range_free_seq(best);
    bool done = gp_stream_done_upto(p, owner, seq);
    bool taken = (best->aliased == 0 || gp_alias_small_only_loans(p, best)) &&
                 (done || gp_stream_reusable(p, owner, st, seq, true)) && gp_alias_small_recall(p, best) &&
                 gp_segment_unused(best);
    if (taken) {
        for (gp_block *b = best->first; b != NULL; b = b->next)
            if (b->state == GP_BLOCK_FREE)
                gp_heap_remove(gp_heap_of(owner, small), b);
        best->owner = st;
        gp_tenant_charge(owner->tenant, -(int64_t)best->mapped_bytes);
        gp_tenant_charge(st->tenant, (int64_t)best->mapped_bytes);
        atomic_fetch_add(&p->num_stream_steals, 1);
    }
    gp_stream_unlock(owner);
    if (taken)
        gp_segment_restamp(st, best, !done);
    return taken ? best : NULL;
}

/* Hands out b, a block of lender (locked), to st: LIVE in lender's map, with st as its user. */
static void lend_block(gp_pool_state *p, gp_stream_state *lender, gp_stream_state *st, gp_block *b, size_t size)
{
    gp_hand_out(p, lender, b, size);
    gp_block_uses(b)[0] = st; /* capacity >= GP_BLOCK_INLINE_USES >= 1 */
    b->use_count = 1;
    b->borrowed = true;
}

/* Returns to their heaps the completed pending frees of st's tenant's other streams, each locked
 * alone: what they lent st comes back PENDING on st's events, so their free blocks (what borrowing
 * takes) and whole free pages (what a stitched range with loans maps) include it only once collected.
 * Pool lock held. */
void gp_vmm_collect_tenant_pending(gp_pool_state *p, gp_stream_state *st)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *o = p->streams.by_index[i];
        if (o == st || o->tenant != st->tenant || atomic_load_explicit(&o->pending_count, memory_order_relaxed) == 0)
            continue;
        gp_stream_lock(o);
        gp_pending_collect(p, o, 0);
        gp_stream_unlock(o);
    }
}

/*
 * Borrowing: the smallest free block that fits among the heaps (of kind `small`) of the other streams of
 * st's tenant whose work is done, or whose work st's stream then waits on (gp_stream_reusable: the
 * lender's fence event), handed out to st without a device or map call. The
 * block stays in its lender's range and live map, with st recorded as its user, so that its free on st
 * takes the cross-stream path (api/free.c): it becomes PENDING on an event recorded on st and returns
 * to the lender's heap once st's work on it has completed. Several models (or replicas) on one GPU
 * take turns at their peaks; borrowing lets one stream's peak use another's idle cache where it lies,
 * so that the streams together need about the memory of their combined peak instead of the sum of
 * their own peaks, and nothing has to be unmapped or mapped again to move it. Only a block smaller than
 * `below` is lent (SIZE_MAX: any; tenant_best_fit).
 */
gp_block *gp_vmm_borrow(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool small,
                        size_t below)
{
    gp_stream_state *lender = NULL;
    size_t best = 0;
    unsigned count = atomic_load(&p->streams.count);
    /* First what st borrowed and freed and its own stream may still be using (no wait); what is done
     * goes back to its lender's heap first, to be lent by best fit as any free block (measured: taking
     * back done blocks too held more memory with idle streams, set L 1.0201 -> 1.0238). */
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *o = p->streams.by_index[i];
        if (o == st || o->handle == st->handle || o->tenant != st->tenant ||
            atomic_load_explicit(&o->pending_count, memory_order_relaxed) == 0)
            continue;
        gp_stream_lock(o);
        gp_pending_collect(p, o, 0);
        gp_block *b = gp_block_map_reserve(&o->live) ? gp_pending_take_back(p, o, st, rsize, small) : NULL;
        if (b != NULL)
            lend_block(p, o, st, b, size);
        gp_stream_unlock(o);
        if (b != NULL)
            return b;
    }
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *o = p->streams.by_index[i];
        if (o == st || o->handle == st->handle || o->tenant != st->tenant)
            continue;
        gp_stream_lock(o);
        gp_heap *heap = gp_heap_of(o, small);
        const gp_block *b = NULL;
        if (o->lenders != NULL) /* its thread-cached blocks count as its quick-listed ones (free bytes) */
            gp_thread_cache_return(p, o);
        if (heap->free_bytes >= rsize) /* its completed pending frees were collected in the loop above */
            b = gp_heap_best(heap, rsize);
        size_t fit = b != NULL && b->size < below ? b->size : 0;
        if (fit != 0 && (best == 0 || fit < best) && gp_stream_reusable(p, o, st, b->free_seq, false)) {
            lender = o;
            best = fit;
        }
        gp_stream_unlock(o);
    }
    if (lender == NULL)
        return NULL;
    gp_stream_lock(lender);
    gp_block *b = NULL;
    gp_heap *heap = gp_heap_of(lender, small);
    gp_block *fit = gp_block_map_reserve(&lender->live) ? gp_heap_best(heap, rsize) : NULL;
    if (fit != NULL && fit->size < below && gp_stream_reusable(p, lender, st, fit->free_seq, true))
        b = gp_heap_take_block(heap, &lender->blocks, fit, rsize);
    if (b != NULL)
        lend_block(p, lender, st, b, size);
    gp_stream_unlock(lender);
    return b;
}

/*
 * Best fit over the tenant's idle blocks (`tenant_best_fit:on`; provider.h: borrows_blocks). The
 * streams of one tenant (replicas, or the models of one job) each keep a heap of their own, so that a
 * block freed on a stream is reused on it at once; but what one stream is done with on the device is,
 * to any other stream of the tenant, as free as its own (borrow). A request that st's heap fits only
 * loosely, splitting a larger free block, while another stream holds an idle block that fits it more
 * tightly, is one that best fit over the tenant's free memory would place in the other block: the
 * split cuts a free block that later, larger requests need whole while the tighter block stays idle.
 * Separate heaps as such cost little where whole free pages move freely between streams (the
 * reference models pages-bf and pages-bf-streams agree on average, bench/RESULTS.md, session 34); what
 * this saves is the pages the pool would otherwise grow or move for the split block's later, larger
 * requests. Only blocks whose stream's fence says its work on them is done are taken (no wait), and
 * an exact fit in st's own heap is never passed over (the fast path takes it).
 * Large requests only: small blocks live and die with their stream's own work.
 *
 * Off by default, because of what it costs with busy streams: the borrowed block, freed on the
 * borrower, comes back to its lender only once the borrower's work on it has completed (pending.h), so
 * that a lender working at its peak finds its idle blocks of before pending on another stream and
 * grows. Replayed with idle streams it holds less on every several-stream set; with busy ones more
 * (bench/RESULTS.md, session 33). A deployment whose host waits for its streams between requests
 * (serving one request at a time per model) is the first case.
 */
gp_block *gp_vmm_tenant_best_fit(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool small,
                                  size_t own_fit)
{
    assert(own_fit == 0 || (!small && p->cfg.borrow && p->cfg.tenant_best_fit)); /* api/alloc.c asks so */
    return own_fit != 0 ? gp_vmm_borrow(p, st, rsize, size, small, own_fit) : NULL;
}
