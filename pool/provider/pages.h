/*
 * pages.h — physical pages of the vmm provider and the block surgery around them (pages.c). Pool lock
 * held throughout; the owner's stream lock where a range's blocks change.
 */
#ifndef GP_PAGES_H
#define GP_PAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/pool_state.h"

static inline size_t gp_div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* The index in seg->pages of the page at addr. */
static inline size_t gp_page_index(const gp_pool_state *p, const gp_segment *seg, uintptr_t addr)
{
    return (addr - seg->addr) / p->page;
}

/* A page for tenant t from the page pool, else new from the device (reserved bytes and peak counted,
 * charged to the ledger first). */
int gp_page_get(gp_pool_state *p, gp_tenant *t, gp_phys *out);
/* Puts a page (mapped nowhere) into the page pool; room was kept for it, so this cannot fail. */
void gp_page_put(gp_pool_state *p, gp_phys handle);
/* Gives a page back to the device; one the device refuses stays in the page pool (nothing lost). */
int gp_page_release(gp_pool_state *p, gp_phys handle);
/* Maps handles[0..n) at va, va + page, ...: with the backend's map_run (one access call for the run,
 * all or nothing) or, without it, page by page (stopping at the first failure). *mapped receives the
 * pages mapped, which are always the first ones. Counts nothing: the caller accounts for the pages. */
int gp_pages_map_run(gp_pool_state *p, uintptr_t va, const gp_phys *handles, size_t n, size_t *mapped);
/* Waits until no device work may use memory that `user` freed up to its free stamp `seq` (its fence:
 * gp_stream_wait_upto; often there is nothing left to wait for), or with user NULL (or a stamp the
 * stream has not reached) until the device is idle (device_synchronize). user locked. GP_OK, or the
 * backend's error (then nothing may be unmapped). */
int gp_pages_quiesce(gp_pool_state *p, gp_stream_state *user, uint64_t seq);
/* Unmaps the n mappings of one page each from va, after gp_pages_quiesce(user, seq): with the
 * backend's unmap_run or page by page. *done receives the pages unmapped, always the first ones; a
 * failure stops there (the rest stay mapped). Counts nothing: the caller accounts for the pages. */
int gp_pages_unmap_run(gp_pool_state *p, gp_stream_state *user, uint64_t seq, uintptr_t va, size_t n, size_t *done);
/* As gp_pages_unmap_run with no wait, where the caller has already waited for every stream whose work
 * may use the pages (a pause: its tenant's streams, gp_stream_drain) or no work has seen them (an
 * undone resume: the pool's own synchronous copies only). */
int gp_pages_unmap_quiesced(gp_pool_state *p, uintptr_t va, size_t n, size_t *done);
/* Unmaps the n mappings of one page each at vas[0..n), anywhere, after one gp_pages_quiesce(user,
 * seq): with the backend's unmap_pages or else one run per run of consecutive addresses. As
 * gp_pages_unmap_run: *done receives the pages unmapped, always the first ones. */
int gp_pages_unmap_list(gp_pool_state *p, gp_stream_state *user, uint64_t seq, const uintptr_t *vas, size_t n,
                        size_t *done);

/* The block of seg that holds va (its owner locked). Sizes only are read on the way: a block lent to
 * a thread cache has its state written without the stream's lock, never its size. */
gp_block *gp_pages_block_at(const gp_segment *seg, uintptr_t va);
/* Splits b at `offset` into b and a new block `right` (given, so that this cannot fail) of the same
 * state, linked after it; returns right. Neither is put on a list. */
gp_block *gp_pages_split(gp_block *b, size_t offset, gp_block *right);
/* Merges the UNMAPPED (or SHADOW) block b with neighbours of the same state, recycling their structs,
 * and returns the result (its segment's first block when it has no prev), whose free_seq is the latest
 * of its parts' (a SHADOW block's stamp covers the last uses of its addresses: alias.c). */
gp_block *gp_pages_merge(gp_block_cache *cache, gp_block *b);
/* Splits b (on no list) so that one block covers exactly [from, from + bytes) and returns it; the
 * pieces before and after keep b's state and go on `heap` unless it is NULL. Takes up to two structs
 * from spare[], counting *nspare down. */
gp_block *gp_pages_carve(gp_heap *heap, gp_block *b, uintptr_t from, size_t bytes, gp_block **spare, size_t *nspare);

/*
 * Maps up to n pages at the front of the UNMAPPED block u of seg (owner st locked) and turns them into
 * FREE memory of st's heap, coalesced with a FREE block before them. Returns the pages mapped; stops at
 * the first failure, with *rc set.
 */
size_t gp_pages_map_front(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, gp_block *u, size_t n, int *rc);

/*
 * As gp_pages_map_front, at the back of u: the n pages right before the block after u, coalesced with
 * it where it is FREE (all of u: gp_pages_map_front). Where the mapping stops short, the pages mapped
 * are a FREE block between UNMAPPED ones, and where none is, u is as it was.
 */
size_t gp_pages_map_back(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, gp_block *u, size_t n, int *rc);

/*
 * Unmaps the n whole pages starting at `first` inside the FREE block b of seg (owner locked): the
 * handles go to the page pool or, with `release`, back to the device. Returns the pages done; stops at
 * the first failure (*rc), leaving the rest of b FREE.
 */
size_t gp_pages_unmap(gp_pool_state *p, gp_stream_state *owner, gp_segment *seg, gp_block *b, uintptr_t first,
                      size_t n, bool release, int *rc);

#endif /* GP_PAGES_H */
