/*
 * stitch.c — stitching (defrag:on): before the vmm provider asks the device for new pages past the
 * cache cap, it moves whole free pages cut out of FREE blocks anywhere in the pool into the range that
 * grows, so that they make one contiguous block there (the idea of GMLake, ASPLOS 2024). Only pages
 * inside FREE blocks move, and unmap waits for all device work first, so no stream can still be using
 * them; contents that matter never move.
 */
#include <stdint.h>

#include "policy/cache_cap.h"
#include "provider/pending.h"
#include "provider/vmm.h"

static size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/*
 * Pages beyond the pool's come from the device while the pool stays under its cache cap; past it,
 * from free pages elsewhere (stitching), as many as keep it under the cap. Every stitch raises the
 * cap by the pages it moved (stitch_allowance): a working set that needs more memory than the cap
 * stitches once and then grows, instead of moving the same pages back and forth every step.
 */
void gp_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t pages, const gp_block *keep)
{
    size_t cap = gp_cache_cap(&p->cfg, gp_allocated_estimate(p), atomic_load(&p->allocated_peak), rsize);
    if (cap != SIZE_MAX)
        cap += p->stitch_allowance;
    size_t after = atomic_load(&p->reserved) + (pages - p->pooled_count) * p->page;
    if (cap != SIZE_MAX && after > cap) {
        int urc = GP_OK;
        gp_collect_all_pending(p); /* quick-listed blocks hide whole free pages */
        size_t want = div_up(after - cap, p->page);
        if (want > pages - p->pooled_count)
            want = pages - p->pooled_count;
        size_t moved = gp_vmm_unmap_free_pages(p, want, keep, UINT64_MAX, false, &urc, NULL, st->tenant);
        if (moved > 0) {
            atomic_fetch_add(&p->num_stitches, 1);
            p->stitch_allowance += moved * p->page;
        }
    }
}
