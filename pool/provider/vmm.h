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
 * inside `keep` (NULL or a FREE block to leave alone) and in blocks free since after `idle_before`;
 * only in tenant `only` (NULL = any); for a `taker` (NULL = none), other tenants' pages only down to
 * their min. The handles go to the page pool or, with `release`, back to the device. Returns the pages
 * done; *rc gets the first failure.
 */
size_t gp_vmm_unmap_free_pages(gp_pool_state *p, size_t want, const gp_block *keep, uint64_t idle_before,
                               bool release, int *rc, const gp_tenant *only, const gp_tenant *taker);

/* Before st maps `pages` pages for a request of `rsize`: moves free pages from elsewhere (leaving
 * `keep`, the FREE block the growth extends, alone) when new ones would pass the cache cap (stitch.c). */
void gp_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t pages, const gp_block *keep);

/* Pausing: unmaps and releases every in-use page of seg (marking each GP_PHYS_NONE, the range
 * `paused`), stopping at a failure; resuming maps fresh pages at every in-use page that has none and
 * unpauses the range once all have. */
int gp_vmm_pause_range(gp_pool_state *p, gp_segment *seg);
int gp_vmm_resume_range(gp_pool_state *p, gp_segment *seg);

#endif /* GP_VMM_H */
