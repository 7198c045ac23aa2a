/*
 * memory_stats.c — the figures behind PyTorch's torch.cuda.memory_stats keys that gp_stats does not
 * hold: the small/large heap breakdown (one walk of every segment and block, the private pools of CUDA
 * graphs included, as PyTorch counts them) and resetting the peaks.
 * python/gpupool/torch_stats.py turns them, with gp_stats, into PyTorch's dict.
 */
#include <string.h>

#include "api/api.h"
#include "base/error.h"

static void walk_segment(gp_pool_state *p, const gp_segment *seg, gp_kind_stats *k)
{
    (void)p;
    bool wholly_free = true, in_run = false;
    size_t free_blocks = 0, free_bytes = 0;
    for (const gp_block *b = seg->first; b != NULL; b = b->next) {
        switch (b->state) {
        case GP_BLOCK_LIVE:
            k->allocations++;
            k->allocated_bytes += b->size;
            k->requested_bytes += b->requested;
            k->active_blocks++;
            k->active_bytes += b->size;
            wholly_free = false;
            break;
        case GP_BLOCK_PENDING:
            k->active_blocks++;
            k->active_bytes += b->size;
            wholly_free = false;
            break;
        case GP_BLOCK_FREE:
        case GP_BLOCK_QUICK:
        case GP_BLOCK_LENT: /* not seen here: gp_lock_all_streams returned the thread caches' blocks */
            free_blocks++;
            free_bytes += b->size;
            break;
        case GP_BLOCK_UNMAPPED:
        case GP_BLOCK_SHADOW: /* its memory is counted where it is in use (provider/alias.h) */
            break;
        }
        /* segments as the snapshot writes them: a device allocation, or a run of mapped blocks */
        bool mapped = !gp_block_unbacked(b);
        if (mapped && !in_run)
            k->segments++;
        in_run = mapped;
    }
    k->reserved_bytes += seg->mapped_bytes;
    if (!wholly_free) {
        k->inactive_split += free_blocks;
        k->inactive_split_bytes += free_bytes;
    }
}

/* p's own breakdown added into *r (every lock of p taken and given back). */
static void add_breakdown(gp_pool_state *p, gp_breakdown *r)
{
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    for (const gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (!seg->paused)
            walk_segment(p, seg, seg->small ? &r->small : &r->large);
    r->large.reserved_bytes += p->pooled_count * p->page; /* pages kept unmapped for reuse */
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        const gp_stream_state *st = p->streams.by_index[i];
        gp_kind_stats *kinds[2] = {&r->large, &r->small};
        for (int s = 0; s < 2; s++) {
            kinds[s]->num_allocs_total += st->kind_allocs[s];
            kinds[s]->num_frees_total += st->kind_frees[s];
            kinds[s]->alloc_bytes_total += st->kind_alloc_bytes[s];
            kinds[s]->free_bytes_total += st->kind_free_bytes[s];
        }
    }
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
}

static void add_graph_breakdown(gp_pool *graph, void *r)
{
    add_breakdown(graph->state, r);
}

GP_API int gp_get_breakdown(gp_pool *pool, gp_breakdown *out)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_get_breakdown", &p);
    if (rc != GP_OK)
        return rc;
    if ((rc = gp_versioned_out("gp_get_breakdown", "out", out, GP_BREAKDOWN_VERSION, sizeof *out)) != GP_OK)
        return rc;
    gp_breakdown r;
    memset(&r, 0, sizeof r);
    r.size = out->size;
    r.version = out->version;
    add_breakdown(p, &r);
    /* the private pools of CUDA graphs too, as PyTorch's memory_stats count its graphs' pools */
    (void)gp_capture_each(p, add_graph_breakdown, &r);
    *out = r;
    return GP_OK;
}

GP_API int gp_reset_peaks(gp_pool *pool)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_reset_peaks", &p);
    if (rc != GP_OK)
        return rc;
    gp_pool_lock(p);
    gp_flush_all(p);
    atomic_store(&p->allocated_peak, gp_allocated_estimate(p));
    atomic_store(&p->reserved_peak, atomic_load(&p->reserved));
    p->peak_composition.recorded = 0;
    unsigned tenants = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < tenants; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        atomic_store(&t->held_peak, atomic_load(&t->held));
    }
    gp_pool_unlock(p);
    return GP_OK;
}
