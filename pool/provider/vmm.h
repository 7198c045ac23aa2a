/*
 * vmm.h — what the vmm provider (vmm.c) shares with stitching (stitch.c) and with pausing
 * (api/pause.c). Pool lock held for all of them.
 */
#ifndef GP_VMM_H
#define GP_VMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/pool_state.h"

/*
 * Unmaps up to `want` whole pages of FREE blocks anywhere in the pool (oldest ranges first), except
 * inside the FREE block right before `spot` (NULL, or an UNMAPPED growth spot whose struct and need
 * must stay as they are: merging then never recycles it), with `spot_back` (growth at the spot's back)
 * the one right after it too, and in blocks free since after `idle_before`;
 * only in tenant `only` (NULL = any); for a `taker` (NULL = none), other tenants' pages only down to
 * their min; never in a paused range (nor one being resumed). The handles go to the page pool or, with
 * `release`, back to the device. Returns the pages done; *rc gets the first failure.
 */
size_t gp_vmm_unmap_free_pages(gp_pool_state *p, size_t want, const gp_block *spot, bool spot_back,
                               uint64_t idle_before, bool release, int *rc, const gp_tenant *only,
                               const gp_tenant *taker);

/* Before st maps `pages` pages at the UNMAPPED `spot` (at its back with `spot_back`, else its front)
 * for a request of `rsize`: moves free pages from elsewhere (leaving the FREE blocks around spot
 * alone, as gp_vmm_unmap_free_pages) when new ones would pass the cache cap, or, with `hold_peak`,
 * the pool's high-water mark (then only idle pages, with no wait; stitch.c says why). */
void gp_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t pages, const gp_block *spot,
               bool spot_back, bool hold_peak);

/* A page that a pause unmapped, with its physical handle kept until the pause commits (api/pause.c). */
typedef struct gp_held_page {
    gp_segment *seg;
    size_t index;
    gp_phys handle;
} gp_held_page;

/*
 * Pausing, phase 1: unmaps every in-use page of seg that has memory (marking each GP_PHYS_NONE, the
 * range `paused`) and appends its handle to held[] (room for seg->mapped_bytes / page more), stopping
 * at a failure. It waits for nothing: pre, the streams whose work may use seg are drained (api/pause.c).
 * The handles are given back by the caller once every range is done (gp_page_release),
 * or mapped back where they were (gp_vmm_map_back, which unpauses the range once it is whole again):
 * the physical memory never left, so the contents are intact. A range that gave up no page (nothing
 * in use in it, or its first unmap failed) is seen by no gp_vmm_map_back: the rollback unpauses it.
 */
int gp_vmm_pause_range(gp_pool_state *p, gp_segment *seg, gp_held_page *held, size_t *nheld);
int gp_vmm_map_back(gp_pool_state *p, const gp_held_page *h);
/*
 * Resuming, in two steps like pausing, so that a failed resume changes nothing:
 *   1. gp_vmm_resume_range maps fresh pages at every in-use page of seg that has none and appends each
 *      page it mapped to mapped[] (room entries in all: the paused pages of every paused range at the
 *      start), stopping at a failure. The range stays `paused`, so that nothing else (stitching,
 *      releasing, stealing) takes its pages while the resume is under way;
 *   2. once every range is mapped and its contents restored, gp_vmm_unpause_range commits each range;
 *      after a failure gp_vmm_unmap_resumed unmaps exactly the pages of mapped[0..n) again (in runs),
 *      accounting them as paused, and tells in *undone how many from the front it did; their handles
 *      are the caller's to give back. It stops at a failed unmap (returned): the rest stay mapped, the
 *      paused tenant's, accounted (a paused range may have pages with memory; resume skips them).
 * gp_vmm_paused_pages counts the in-use pages of seg without memory.
 */
int gp_vmm_resume_range(gp_pool_state *p, gp_segment *seg, gp_held_page *mapped, size_t *nmapped, size_t room);
void gp_vmm_unpause_range(gp_pool_state *p, gp_segment *seg);
int gp_vmm_unmap_resumed(gp_pool_state *p, gp_held_page *mapped, size_t n, size_t *undone);
size_t gp_vmm_paused_pages(gp_pool_state *p, const gp_segment *seg);

#endif /* GP_VMM_H */
