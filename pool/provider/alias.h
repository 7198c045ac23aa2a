/*
 * alias.h — stitching by aliasing (defrag:on, virtual memory backends): free pages of a stream's
 * ranges mapped a second time, at a contiguous "stitched range", for a request that no free block of
 * the stream fits (the stitched blocks of GMLake, ASPLOS 2024).
 *
 * Why. A step of a training or serving loop frees memory in one shape (activations, temporaries of
 * the forward pass) and asks for it in another (gradients, a larger batch's buffers). Best fit over
 * fixed addresses leaves the free memory in holes that the new shape does not fit, so the pool
 * grows, even though enough whole free pages sit in its ranges. Moving those pages (unmap, map
 * elsewhere: provider/stitch.c) serves the request, but the next step needs them back where they
 * were, so the pages move twice every step: map calls forever. Mapping them a second time instead
 * serves both shapes with the same physical pages and no call after the first: the stitched range
 * keeps its mapping, and the pages keep their first one (their home).
 *
 * How. A page has one home slot (in an ordinary range) and any number of alias slots (in stitched
 * ranges of the same owner stream); at most one slot is in use. While a stitched block is handed out,
 * its pages' homes are SHADOW blocks (ds/block.h): mapped, on no free list, so that nobody can
 * allocate them. When it is freed, the roles swap back without a device call: the stitched block
 * becomes SHADOW and the homes FREE again, coalescing with their neighbours (gp_alias_release). A
 * later request that misses the heap first looks for a stitched range whose pages' homes are all free
 * (gp_alias_take): in a loop that repeats its step, the step before left the heap as it found it, so
 * the same homes are free at the same point, and the request is served with no device or map call.
 * Only when none fits does it stitch a new one (gp_alias_stitch: map calls, no new memory), before
 * any growth. Memory is counted once, at home: aliasing never raises reserved bytes.
 *
 * The last page's tail. A stitched block is whole pages, and a request rarely is: the part of its
 * last page past the request (on average half a page a block) is handed out as a FREE block of the
 * stream's large heap, in the stitched range, instead of with the request. Where several stitched
 * blocks are live at once (several streams, whose pages move between them by stitching) those tails
 * add up to pages: handed out with the requests, they were memory allocated and unused. A page of a
 * stitched range is in use at its alias while any of it is LIVE or FREE there (its home SHADOW), and
 * goes home when one FREE block covers it again (gp_alias_settle on the free path, as for the small
 * ranges below), so that a FREE block of a stitched range never holds a whole page with a home but
 * where host memory for block metadata ran out.
 *
 * Stream order. A stream's own homes and their aliases belong to its heap, so a page used at either
 * address is used in that stream's order, as any reuse on the stream is (api/free.c).
 *
 * Loans: stitching across the streams of a tenant. Several models (or replicas) on one GPU take turns
 * at their peaks, so the memory of their combined peak has to serve each stream's peak in turn. Moving
 * pages to the stream at its peak (provider/stitch.c) costs map calls in every step, as the stream the
 * pages came from needs them back before the step ends; borrowing a block in place (provider/vmm_streams.c)
 * costs none, but finds no block where the free memory of idle streams lies in pieces. So where a
 * stream's own free pages do not suffice and growing would pass the cache cap, the stitched range may
 * also map free pages of other streams of its tenant whose work on them is done (their stream's fence
 * covers their free: gp_stream_done_upto, as for a borrowed block): a loan. A loaned page has exactly
 * one alias slot, and while that slot is in use its home is SHADOW, "held" for it. When the stitched
 * block is freed the home stays held (its owner's blocks are not touched on the holder's free path), so
 * the holder takes the same pages again in its next step with no call at all; the owner reclaims them
 * when it misses in its own heap (gp_alias_reclaim, from the pool lock), once the holder's work on it
 * is done (its fence covers the parking: the loan's parked_seq; past the cache cap, stitching short of
 * free pages waits for that fence rather than grow: gp_alias_reclaim_waiting), so that nothing queued on the holder
 * can still use a page that its owner hands out again. A held page is used by one stream at a time, on
 * that stream, and changes stream only after an event says the other's work on it is done: the order a
 * borrowed block keeps. Memory stays counted at home, to the same tenant.
 *
 * Bounds. The alias slots of a stream's own pages never exceed the pages of its ordinary ranges: aliases cost no
 * device memory, but each is a device page-table entry and host metadata, and so they stay in
 * proportion to what the pool holds; past the bound the stitched range used least recently is
 * unmapped (gp_alias_stitch).
 *
 * Giving memory back, pausing, destroying. A home page is unmapped only once it has no alias slot:
 * gp_alias_unshare unmaps the (idle) alias slots of free home pages first (provider/stitch.c). A
 * pause dissolves the tenant's aliases (gp_alias_dissolve): idle alias slots are unmapped, and a page
 * in use at an alias becomes the stitched range's own (its SHADOW home is unmapped), so that every
 * page has one address and pausing works as for any range.
 *
 * Small ranges. A stream's small heap may grow by an alias too: a small stitched range (small and
 * stitched) whose pages are free pages of the stream's large ranges, lent to the small heap while any
 * small block lives in them, going home when they are wholly free again (alias_small.c says why and which
 * pages). The invariants below hold for them as for any stitched range.
 *
 * Invariants (gp_alias_check, from gp_check):
 *   - seg->homes[i] of a stitched range names a page of an ordinary range of the same tenant that is
 *     not UNMAPPED, or NULL for a page the stitched range owns; a SHADOW page of a stitched range has
 *     a home; an aliased page is never UNMAPPED;
 *   - a home in another stream's range is a loan: its loans[] entry names the slot, its alias_count is
 *     1, it is SHADOW exactly while held, and it is held while its slot is in use; loans_held,
 *     foreign and foreign_held count them;
 *   - a page is in use at most at one address: an aliased page of a stitched range that is not SHADOW
 *     has a SHADOW home; a SHADOW block of an ordinary range is one page with alias_count > 0;
 *   - alias_count[i] of an ordinary range counts the stitched pages naming page i; its `aliased` is
 *     their sum; a stitched range's `aliased` counts its pages with a home;
 *   - mapped_bytes counts a page at its home only (a stitched range: the pages it owns).
 *
 * Locks: the pool lock for everything but gp_alias_release and gp_alias_settle (the free path:
 * the owner's lock only, which guards every block of the owner's ranges, its own homes and stitched
 * alike; a loan's fields are the pool lock's; neither changes an UNMAPPED block or an alias count).
 * Stream locks are taken one at a time, except that unmapping a loaned page's slot (gp_alias_unshare,
 * under the home owner's lock) takes the holder's lock in the lock order, or tries it.
 */
#ifndef GP_ALIAS_H
#define GP_ALIAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/pool_state.h"

/* A stitched range of st whose pages' homes are all free, handed out for a request of `size`
 * (rounded `rsize`, large kind); NULL when none fits. No device call. Pool lock held, st not locked. */
gp_block *gp_alias_take(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size);

/* A new stitched range of st's whole free pages, handed out for the request; with `lend`, other idle
 * streams' of its tenant too where st's do not suffice (loans). NULL when too few whole free pages
 * are found, or a map or host allocation fails (nothing lost: the pages mapped so far stay an idle
 * stitched range). Pool lock held, st not locked. */
gp_block *gp_alias_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool lend);

/* Makes the pages of st's ranges (NULL: every stream's) held for idle slots of other streams whose
 * work is done FREE in their owner's heap again; returns how many. Pool lock held, no stream lock. */
size_t gp_alias_reclaim(gp_pool_state *p, gp_stream_state *st);
/* As gp_alias_reclaim over every stream's ranges, `limit` pages at most, waiting where a holder's work
 * on a parked page is still queued (its fence: the host waits for that one stream). Pool lock held, no
 * stream lock. */
size_t gp_alias_reclaim_waiting(gp_pool_state *p, size_t limit);

/* How many whole free pages st's ordinary large ranges hold that a stitched range may alias (what
 * gp_alias_stitch chooses from). Pool lock held, st not locked. */
size_t gp_alias_free_pages(gp_pool_state *p, gp_stream_state *st);

/* The free of b, a block of a stitched range (owner locked): when b is whole pages that all have a
 * home, b becomes SHADOW and the homes FREE; returns false (nothing done) otherwise, and the caller
 * puts b in the heap as any block. */
bool gp_alias_release(gp_pool_state *p, gp_stream_state *owner, gp_block *b);

/* Unmaps the alias slots of the pages [first, first + n * page) of the ordinary range seg, which lie
 * in FREE blocks (so every alias slot is SHADOW), after one device synchronize per stitched range that
 * has any; owner locked, pool lock held. Returns how many pages from `first` have no alias slot left (n,
 * unless an unmap failed, *rc, or another stream's lock was not to be had). */
size_t gp_alias_unshare(gp_pool_state *p, gp_segment *seg, uintptr_t first, size_t n, int *rc);

/* The first run of pages without alias slots among the n pages of the ordinary range seg from
 * *first: moves *first to its start and returns its length (0: every page has an alias slot). */
size_t gp_alias_unshared_run(const gp_pool_state *p, const gp_segment *seg, uintptr_t *first, size_t n);

/* True when one of the pages [first, first + n * page) of the stitched range seg has a home. */
bool gp_alias_has_homes(const gp_pool_state *p, const gp_segment *seg, uintptr_t first, size_t n);

/* Gives every page of tenant `only`'s ranges (every tenant's: NULL) one address: idle alias slots are
 * unmapped, and pages in use at an alias become the stitched range's own (their homes unmapped).
 * Pool lock held, and the streams of `only` (its stitched ranges' homes and loans are its own; every
 * stream when only is NULL). GP_OK, or the first failure (the rest is left as it was). */
int gp_alias_dissolve(gp_pool_state *p, const gp_tenant *only);

/* Small ranges grown by aliasing (alias_small.c says why): an idle alias slot of st's small stitched ranges
 * whose home is free, or else a new alias of the first whole page of the smallest free block of st's
 * ordinary large ranges, lent to st's small heap, and the request taken from that heap (rsize, size);
 * NULL when neither is there, or a map or host allocation fails (nothing lost). No new memory. Pool
 * lock held, st not locked. */
gp_block *gp_alias_small_grow(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size);

/* The FREE block m (on its heap) of a stitched range of owner (locked), small or large: every whole page
 * in it that has a home swaps back, without a device call (it becomes an idle SHADOW slot, its home
 * FREE in the large heap, or parked with owner when it is another stream's). True when one did. */
bool gp_alias_settle(gp_pool_state *p, gp_stream_state *owner, gp_block *m);

/* gp_alias_settle over every FREE block of st's small stitched ranges (st locked; its quick lists
 * and thread caches flushed first by the caller, so that wholly free pages show). */
void gp_alias_small_reclaim(gp_pool_state *p, gp_stream_state *st);

/* The pages st's small heap has on loan that are in use (not wholly free) become its own: their homes
 * are unmapped (after the homes' other, idle alias slots), so that the large heap, which must grow,
 * grows where they were instead of around them. Pool lock held, st not locked. */
void gp_alias_small_keep(gp_pool_state *p, gp_stream_state *st);

/* True when every alias slot of the ordinary range seg is a small stitched range's and seg holds
 * nothing in use but pages lent to its owner's small heap (FREE, UNMAPPED and SHADOW blocks only), so
 * that it could change owner once gp_alias_small_recall has given them back. Owner locked. */
bool gp_alias_small_only_loans(const gp_pool_state *p, const gp_segment *seg);

/* The small-heap loans of the ordinary range seg end: idle alias slots are unmapped, and pages the
 * small heap still uses become its own (their homes unmapped). True when seg has no alias slot left
 * (false at a failed unmap: what was done stays, consistent). Owner locked, pool lock held. */
bool gp_alias_small_recall(gp_pool_state *p, gp_segment *seg);

/* True when st's small heap uses an alias of a page of its large ranges now. st locked. */
bool gp_alias_small_lent(const gp_pool_state *p, const gp_stream_state *st);

/* The aliasing invariants above for seg; NULL, or what is broken. Every lock held. */
const char *gp_alias_check(const gp_pool_state *p, const gp_segment *seg);

#endif /* GP_ALIAS_H */
