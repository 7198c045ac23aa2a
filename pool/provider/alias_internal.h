/*
 * alias_internal.h — what the two halves of stitching by aliasing share: alias.c (stitched ranges of
 * large blocks: swapping the address in use, taking, making, repairing, reclaiming and undoing them,
 * the check) and alias_small.c (the small heap grown by aliasing free pages of the large ranges).
 * Nothing else includes it; alias.h is the interface, and says why and states the invariants.
 *
 * Locks: the functions declared below name the locks they need; the inline ones read a range's fields
 * and blocks under whichever lock the caller holds for that range (alias.h: Locks).
 */
#ifndef GP_ALIAS_INTERNAL_H
#define GP_ALIAS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/alias.h"
#include "provider/pages.h"

/* ---- finding pages ---------------------------------------------------------------------------- */

static inline uintptr_t home_va(const gp_pool_state *p, gp_alias_home h)
{
    return h.seg->addr + h.index * p->page;
}

/* True when the page at va lies wholly inside a FREE block of seg (the size first: see block_at). */
static inline bool page_is_free(const gp_pool_state *p, const gp_segment *seg, uintptr_t va)
{
    const gp_block *b = gp_pages_block_at(seg, va);
    return b->size >= p->page && b->state == GP_BLOCK_FREE && b->addr <= va && va + p->page <= b->addr + b->size;
}

/* An ordinary range of st's large heap whose free pages may serve as homes. */
static inline bool home_range(const gp_segment *seg, const gp_stream_state *st)
{
    return seg->owner == st && !seg->small && !seg->stitched && !seg->paused && seg->pages != NULL;
}

/* True when the home h of a page of stitched range r lies in another stream's range. */
static inline bool foreign_home(const gp_segment *r, gp_alias_home h)
{
    return h.seg->owner != r->owner;
}

/* The loan of home page h (its range's loans allocated). */
static inline gp_alias_loan *loan_of(gp_alias_home h)
{
    return &h.seg->loans[h.index];
}

static inline gp_stream_state *holder_of(gp_alias_home h)
{
    return h.seg->loans != NULL ? h.seg->loans[h.index].holder : NULL;
}

/* A free page that a stitched range may alias (gp_alias_stitch chooses among them; alias_small.c's
 * frontier page is one). */
typedef struct candidate {
    gp_segment *seg;
    size_t index;
    size_t block_size; /* of the FREE block it lies in */
    bool foreign;      /* of another stream than the one that stitches */
} candidate;

/* ---- shared by both halves (alias.c) ----------------------------------------------------------- */

/* Cuts the page at va out of its FREE block in home range seg (its owner locked) into a SHADOW block
 * of its own, using up to two structs from spare[] (*nspare counts down). */
void gp_alias_shadow_home(gp_pool_state *p, gp_segment *seg, uintptr_t va, gp_block **spare, size_t *nspare);

/* Page j of owner's (locked) stitched range r is no longer in use at r: its home is FREE again, or,
 * lent by another stream, parked with owner. */
void gp_alias_swap_home_back(gp_pool_state *p, gp_stream_state *owner, gp_segment *r, size_t j, uint64_t now);

/* Unmaps the n idle (SHADOW) alias slots of stitched range r from page index i, after one wait for
 * their latest stamp: GP_OK or the first failure. */
int gp_alias_drop_slots(gp_pool_state *p, gp_segment *r, size_t i, size_t n);

/* The page j of stitched range r, in use there, becomes r's own: its SHADOW home is unmapped.
 * `locked`: the stream whose lock the caller holds (NULL: none, or not the home's owner). */
int gp_alias_own_page(gp_pool_state *p, gp_segment *r, size_t j, gp_stream_state *locked);

#endif /* GP_ALIAS_INTERNAL_H */
