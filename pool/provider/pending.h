/*
 * pending.h — freed blocks on their way back to a heap: straight back (gp_block_to_heap), or PENDING
 * until the events recorded on the other streams that used them complete (pending.c).
 */
#ifndef GP_PENDING_H
#define GP_PENDING_H

#include <assert.h>

#include "provider/alias.h"
#include "provider/pool_state.h"
#include "provider/thread_cache.h"

/* Returns a block that is no longer LIVE or PENDING to its owner's heap (owner locked): its quick list
 * when small, else the free lists, coalesced; stamps free_since with the pool's coarse clock. */
static inline void gp_block_to_heap(gp_pool_state *p, gp_stream_state *owner, gp_block *b);
/* Moves PENDING blocks of st whose events have all completed back to its heap; scans at most `limit`
 * blocks (0 = all). st locked. */
void gp_pending_collect(gp_pool_state *p, gp_stream_state *st, unsigned limit);
/*
 * The smallest PENDING block of `lender` (locked) of at least `size` bytes in its `small` heap's ranges
 * that `taker` borrowed (provider/vmm_streams.c) and freed on its own stream, used by no other stream (its one
 * event is on taker) and not by lender's since the borrow: cut to `size` (the rest stays PENDING on the
 * same event, which covers it as before), taken off the list, its event back in the pool when it kept
 * it, to be handed out to taker again (still PENDING). taker's own stream orders its uses, so it may
 * use the block again at once, as any stream reuses its own frees, where every other stream waits for
 * the event. Why: a borrower frees what it borrowed when its step ends and asks for the same sizes in
 * its next step; without this the blocks wait for its event (its last work of the step), and the step
 * grows the pool meanwhile. NULL when none (or host memory for the cut is out).
 */
gp_block *gp_pending_take_back(gp_pool_state *p, gp_stream_state *lender, gp_stream_state *taker, size_t size,
                               bool small);
/* Returns every stream's thread-cached, completed pending and quick-listed blocks to its free lists
 * (coalescing), so that wholly free segments and pages show. Pool lock held, no stream lock. */
void gp_collect_all_pending(gp_pool_state *p);
/* Waits for the events of st's pending blocks, returns the events to the event pool and the blocks to
 * st's heap (destroy only; st locked). GP_OK or the first failure of event_synchronize. */
int gp_pending_drain(gp_pool_state *p, gp_stream_state *st);

/* Ages the quick lists of heap (st's, st locked; ds/heap.h) after returning st's thread-cached blocks,
 * the tops of those lists, so that the same blocks age with the cache as without it. */
void gp_quick_age(gp_pool_state *p, gp_stream_state *st, gp_heap *heap);

/* After a release into owner's heap (owner locked): a stitched range's page that is wholly free in
 * `merged` now swaps back to its home (alias.h: a block that was not whole pages, such as a stitched
 * block's tail, or a small block). The free path and aging (gp_quick_age) both release. */
static inline void gp_settle_released(gp_pool_state *p, gp_stream_state *owner, gp_block *merged)
{
    if (merged->segment->stitched && merged->size >= p->page)
        gp_alias_settle(p, owner, merged);
}

/* Inline: the free fast path ends here. A block for a quick list goes on top of the lenders' blocks
 * of owner (their lists are the top of the quick lists, provider/thread_cache.h): they are returned
 * first, so that the stack keeps the order it has without thread caches. */
static inline void gp_block_to_heap(gp_pool_state *p, gp_stream_state *owner, gp_block *b)
{
    assert(b->segment->owner == owner);
    gp_history_note(p, GP_HIST_FREE_COMPLETED, b->addr, b->requested, owner->handle, owner->tenant->index);
    uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
    gp_heap *heap = gp_heap_of(owner, b->segment->small);
    if (b->state != GP_BLOCK_PENDING) /* a PENDING block was stamped at its free (api/free.c) */
        b->free_seq = gp_heap_free_stamp(heap);
    b->borrowed = false;
    b->free_since = now;
    if (owner->lenders != NULL && b->size < GP_QUICK_CLASSES * GP_GRANULE)
        gp_thread_cache_return(p, owner);
    if (gp_heap_quick_put(heap, b))
        return;
    /* Past the quick lists, which a stitched block (whole pages) never goes on: its homes free again */
    if (b->segment->stitched && !b->segment->small && gp_alias_release(p, owner, b))
        return;
    gp_block *merged = gp_heap_release(heap, &owner->blocks, b);
    merged->free_since = now;
    gp_settle_released(p, owner, merged);
    /* last: aging may coalesce with merged (ds/heap.h) */
    if (p->quick_aging && gp_heap_quick_tick(heap))
        gp_quick_age(p, owner, heap);
}

#endif /* GP_PENDING_H */
