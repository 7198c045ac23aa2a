/*
 * peak.c — what reserved memory is made of at its peak (peak_composition:on; gp_peak_composition in
 * gpupool.h): after each allocation that raises reserved_peak, one walk of every block sorts the
 * reserved bytes into live, pending, free beside live or pending bytes, and free in units that hold
 * nothing else, per heap kind. The unit is what the pool can give back or move: a segment on the
 * cuda path (cudaFree returns a device allocation whole), a page on the vmm path (a free page can be
 * unmapped and mapped elsewhere). The walk only reads: it changes no decision of the pool (the thread
 * caches' blocks, which gp_lock_all_streams returns, are the tops of the quick lists either way:
 * provider/thread_cache.h), and tests/api/test_peak.c checks both against each other.
 */
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "provider/provider.h"

static bool holds_bytes(const gp_block *b)
{
    return b->state == GP_BLOCK_LIVE || b->state == GP_BLOCK_PENDING;
}

static bool is_free(const gp_block *b)
{
    return b->state == GP_BLOCK_FREE || b->state == GP_BLOCK_QUICK || b->state == GP_BLOCK_LENT;
}

/* Whether page `index` of seg holds bytes of a live or pending block, looking from free block b (which
 * overlaps it) to its neighbours as far as they reach into the page. */
static bool page_in_use(const gp_segment *seg, const gp_block *b, uintptr_t index, size_t page)
{
    uintptr_t start = seg->addr + index * page, end = start + page;
    for (const gp_block *x = b->prev; x != NULL && x->addr + x->size > start; x = x->prev)
        if (holds_bytes(x))
            return true;
    for (const gp_block *x = b->next; x != NULL && x->addr < end; x = x->next)
        if (holds_bytes(x))
            return true;
    return false;
}

/* A free block's bytes, split by whether their page holds live or pending bytes. Pages wholly inside
 * the block hold nothing else (blocks tile their range); only its first and last pages may. */
static void free_by_page(const gp_segment *seg, const gp_block *b, size_t page, gp_peak_part *part)
{
    uintptr_t first = (b->addr - seg->addr) / page, last = (b->addr + b->size - 1 - seg->addr) / page;
    size_t head = first == last ? b->size : seg->addr + (first + 1) * page - b->addr;
    size_t tail = first == last ? 0 : b->addr + b->size - (seg->addr + last * page);
    size_t middle = b->size - head - tail;
    bool head_used = page_in_use(seg, b, first, page);
    bool tail_used = first != last && page_in_use(seg, b, last, page);
    part->free_in_used_bytes += (head_used ? head : 0) + (tail_used ? tail : 0);
    part->free_whole_bytes += (head_used ? 0 : head) + (tail_used ? 0 : tail) + middle;
}

static void walk_segment(const gp_pool_state *p, const gp_segment *seg, gp_peak_part *part)
{
    bool used = false;
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        used = used || holds_bytes(b);
    for (const gp_block *b = seg->first; b != NULL; b = b->next) {
        if (b->state == GP_BLOCK_LIVE)
            part->allocated_bytes += b->size;
        else if (b->state == GP_BLOCK_PENDING)
            part->pending_bytes += b->size;
        else if (!is_free(b)) /* UNMAPPED, SHADOW: no memory here (SHADOW's is counted where it is used) */
            continue;
        else if (seg->pages != NULL)
            free_by_page(seg, b, p->page, part);
        else if (used)
            part->free_in_used_bytes += b->size;
        else
            part->free_whole_bytes += b->size;
    }
}

void gp_peak_note(gp_pool_state *p, size_t peak_before, size_t request)
{
    if (!p->cfg.peak_composition || atomic_load(&p->reserved_peak) <= peak_before)
        return;
    gp_lock_all_streams(p);
    gp_peak_composition c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    c.version = GP_PEAK_COMPOSITION_VERSION;
    c.recorded = 1;
    c.unit_is_page = p->provider->pages;
    c.unit_bytes = p->provider->pages ? p->page : 0;
    c.reserved_bytes = atomic_load(&p->reserved);
    c.request_bytes = request;
    for (const gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (!seg->paused) /* a paused range holds no memory; its blocks are paused_bytes */
            walk_segment(p, seg, seg->small ? &c.small : &c.large);
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        c.num_allocs += p->streams.by_index[i]->num_allocs;
        c.parked_bytes += p->streams.by_index[i]->parked_bytes;
    }
    c.unmapped_cached_bytes = p->pooled_count * p->page;
    gp_unlock_all_streams(p);
    /* the parts add up to what is reserved (the accounting invariant, pool_state.h, by part) */
    assert(c.small.allocated_bytes + c.small.pending_bytes + c.small.free_in_used_bytes + c.small.free_whole_bytes +
               c.large.allocated_bytes + c.large.pending_bytes + c.large.free_in_used_bytes +
               c.large.free_whole_bytes + c.unmapped_cached_bytes + c.parked_bytes ==
           c.reserved_bytes);
    p->peak_composition = c;
}

gp_peak_composition gp_peak_read(gp_pool_state *p)
{
    gp_pool_lock(p);
    gp_peak_composition c = p->peak_composition;
    gp_pool_unlock(p);
    if (!c.recorded) {
        memset(&c, 0, sizeof c);
        c.unit_is_page = p->provider->pages;
        c.unit_bytes = p->provider->pages ? p->page : 0;
    }
    return c;
}

GP_API int gp_get_peak_composition(gp_pool *pool, gp_peak_composition *out)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_get_peak_composition", &p);
    if (rc != GP_OK)
        return rc;
    if ((rc = gp_versioned_out("gp_get_peak_composition", "out", out, GP_PEAK_COMPOSITION_VERSION, sizeof *out)) != GP_OK)
        return rc;
    gp_peak_composition c = gp_peak_read(p);
    c.size = out->size;
    c.version = out->version;
    *out = c;
    return GP_OK;
}
