/*
 * block.h — segments (one device allocation each) and the blocks they are cut into.
 *
 * A segment is one device allocation (cuda, sim) or one reserved virtual address range (vmm, sim-vmm);
 * its blocks tile it in address order through prev/next:
 *     segment->first->addr == segment->addr,  b->next->addr == b->addr + b->size,
 *     sum of the blocks' sizes == segment->size.
 * A block is LIVE (handed out), FREE (in its heap's free lists), QUICK (freed, small, kept whole on
 * its heap's quick list for the next request of its exact size), LENT (freed, small, in one thread's
 * cache for its stream; never seen by a whole-pool walk, which takes it back first), PENDING (freed, but waiting for
 * events on other streams before it may return to the free lists) or, in a virtual range only,
 * UNMAPPED (whole pages with no physical memory behind them; on no list) or SHADOW (whole pages whose
 * physical memory is mapped here AND at a second address, where it is in use now: provider/alias.h;
 * on no list). Two FREE neighbours never
 * stand side by side: freeing coalesces them; neither do two UNMAPPED ones. In a virtual range,
 *     pages[i] is the physical handle mapped at addr + i * page, for every page outside UNMAPPED blocks,
 *     mapped_bytes == size - sum of the UNMAPPED and SHADOW blocks' sizes. All blocks of a segment belong to the heap of one stream
 * (segment->owner) and change only under that stream's lock; a segment changes owner only when it is
 * wholly free, under the pool lock and both streams' locks.
 * Block metadata lives in host memory, out of band: the pool never touches device memory.
 */
#ifndef GP_BLOCK_H
#define GP_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

struct gp_stream_state;
struct gp_segment;

typedef enum gp_block_state {
    GP_BLOCK_FREE = 0,
    GP_BLOCK_LIVE = 1,
    GP_BLOCK_PENDING = 2,
    GP_BLOCK_UNMAPPED = 3,
    GP_BLOCK_QUICK = 4, /* free, but on its heap's quick list: not coalesced yet (heap.h) */
    GP_BLOCK_LENT = 5,  /* free, lent to a thread cache for its next allocation (provider/thread_cache.h) */
    GP_BLOCK_SHADOW = 6 /* virtual range: whole pages mapped, whose memory is in use at another address */
} gp_block_state;

#define GP_BLOCK_INLINE_USES 2

typedef struct gp_block {
    uintptr_t addr;
    size_t size;      /* a multiple of the granule */
    size_t requested; /* LIVE: the size asked for */
    struct gp_block *prev, *next;         /* address neighbours in the segment (NULL at its ends) */
    struct gp_block *list_prev, *list_next; /* FREE: its free list; PENDING: its stream's pending list */
    struct gp_segment *segment;
    gp_block_state state;
    /* LIVE: handed out to another stream of its owner's tenant (provider/vmm_streams.c: borrow) and used on no
     * work of its owner's stream since (a gp_record_stream naming that stream clears it): freed on
     * another stream, it needs no fence of its owner (api/free.c). */
    bool borrowed;
    unsigned size_class; /* FREE: the list it is on */
    uint64_t free_since; /* FREE: the pool's coarse clock when it became free (idle release) */
    /* FREE or QUICK: its heap's free clock (gp_heap.clock) when it was last freed, or of the block it
     * was split from; a fence recorded at a later clock covers every use of it (provider.h). */
    uint64_t free_seq;
    unsigned quick_epoch; /* QUICK: its heap's quick_epoch when it was freed (ds/heap.h: aging) */
    /* Streams other than the owner on which the block is used (gp_record_stream, or a free on another
     * stream). PENDING: events[i] was recorded on uses[i] at the free. */
    unsigned use_count, use_capacity;
    struct gp_stream_state *uses_inline[GP_BLOCK_INLINE_USES];
    gp_event events_inline[GP_BLOCK_INLINE_USES];
    struct gp_stream_state **uses;
    gp_event *events;
} gp_block;

typedef struct gp_segment {
    uintptr_t addr;
    size_t size;        /* a multiple of the 2 MiB device page */
    bool small;         /* in the small heap (requests <= small_size) */
    gp_phys *pages;     /* virtual range: the handle behind each page (see above); NULL otherwise */
    size_t mapped_bytes; /* virtual range: bytes with physical memory behind them; size otherwise */
    bool paused;         /* virtual range of a paused tenant: nothing mapped, blocks kept (pause.c) */
    uint64_t serial;    /* creation order, for oldest-first release */
    /* Aliasing (provider/alias.h). A stitched range maps pages of other ranges of its owner a second
     * time: homes[i] is the range and page index of page i's first mapping, or {NULL} for a page it owns
     * (after the first was unmapped). A range whose pages are mapped elsewhere too counts, per page, the
     * stitched ranges that do (alias_count, allocated on first use) and in all (aliased).
     * shadow_pages: its pages in SHADOW blocks (mapped, memory counted where it is in use). */
    bool stitched;
    struct gp_alias_home *homes;
    uint16_t *alias_count;
    size_t aliased, shadow_pages;
    uint64_t last_used; /* stitched range: the pool's stitch clock when its block was last handed out */
    /* Loans (provider/alias.h): loans[i] of an ordinary range (allocated on first use) names the other
     * stream of its tenant whose alias slot holds page i, if any; loans_held counts those pages. */
    struct gp_alias_loan *loans;
    size_t loans_held;
    gp_block *first;
    struct gp_stream_state *owner;
    struct gp_segment *prev, *next; /* the pool's list of all segments, oldest first */
} gp_segment;

/* The streams a block is used on besides its owner, and the events recorded on them at its free. */
static inline struct gp_stream_state **gp_block_uses(gp_block *b)
{
    return b->uses != NULL ? b->uses : b->uses_inline;
}

static inline gp_event *gp_block_events(gp_block *b)
{
    return b->events != NULL ? b->events : b->events_inline;
}

/*
 * The state of a block that may be lent to a thread cache (provider/thread_cache.h), read or written
 * atomically (relaxed). A lent block's state is written by the cache's thread without the stream's
 * lock (LENT on its free, LIVE on its hand-out: never FREE), while a holder of the stream's lock may
 * read it as an address neighbour of a block it frees (ds/heap.c: coalescing). Which of the two it
 * reads does not change the outcome (neither is FREE), but a plain read beside that write is a data
 * race: both sides go through these (a plain mov on the machines we build for).
 */
static inline gp_block_state gp_block_state_shared(const gp_block *b)
{
    return __atomic_load_n(&b->state, __ATOMIC_RELAXED);
}

static inline void gp_block_set_state_shared(gp_block *b, gp_block_state state)
{
    __atomic_store_n(&b->state, state, __ATOMIC_RELAXED);
}

/* True when the segment is a single FREE block (so never for a virtual range with a hole). The size is
 * tested first: a block lent to a thread cache (provider/thread_cache.h) has its state written by that
 * thread without the stream's lock, but never its size, and a lent block (under 8 KiB) never spans its
 * segment, so a reader holding the stream's lock never reads a lent block's state here. */
static inline bool gp_segment_wholly_free(const gp_segment *seg)
{
    return seg->first->size == seg->size && seg->first->state == GP_BLOCK_FREE;
}

/*
 * A segment struct and its first block struct, zeroed and joined (seg->first->segment == seg), for a
 * provider to fill in (gp_segment_place, provider/pool_state.h) once the device has given the memory;
 * NULL when host memory is out. gp_segment_discard frees both again (the device call failed).
 */
gp_segment *gp_segment_new(void);
void gp_segment_discard(gp_segment *seg);
/* Frees a segment's metadata: every block (with its use arrays), the page table and the segment. */
void gp_segment_free(gp_segment *seg);

/* What gp_segment_check counts over one segment's blocks. */
typedef struct gp_segment_tally {
    size_t allocated, free_bytes, pending, live_blocks;
} gp_segment_tally;

/* gp_check's check of one segment (its owner locked): its blocks tile it as stated above, no two FREE
 * blocks stand side by side, and each LIVE block is in its stream's map; adds its blocks to *tally.
 * false with the broken invariant described in why[len]. */
bool gp_segment_check(const gp_segment *seg, gp_segment_tally *tally, char *why, size_t len);

/* A page of a stitched range: where its physical memory was mapped first (provider/alias.h). */
typedef struct gp_alias_home {
    struct gp_segment *seg; /* NULL: the page is the stitched range's own */
    size_t index;
} gp_alias_home;

/* A page of an ordinary range held by an alias slot of another stream (provider/alias.h). */
typedef struct gp_alias_loan {
    struct gp_stream_state *holder; /* NULL: not lent (SHADOW only for its owner's own alias) */
    bool active;                    /* the holder's slot is in use; else the page is parked there */
    uint64_t parked_seq;            /* parked: the holder's free clock when it stopped using the page */
} gp_alias_loan;

/* True for a block with no memory of its own behind it: UNMAPPED, or SHADOW (its memory is counted at
 * the address where it is in use). */
static inline bool gp_block_unbacked(const gp_block *b)
{
    return b->state == GP_BLOCK_UNMAPPED || b->state == GP_BLOCK_SHADOW;
}

/* True when no block of the segment is in use: every block FREE or, in a virtual range, UNMAPPED (so
 * that the whole range, with its mapped pages, may change owner: provider/vmm_streams.c). */
static inline bool gp_segment_unused(const gp_segment *seg)
{
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        if (b->state != GP_BLOCK_FREE && b->state != GP_BLOCK_UNMAPPED)
            return false;
    return true;
}

#endif /* GP_BLOCK_H */
