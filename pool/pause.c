/*
 * pause.c — pausing a tenant: its physical memory goes back to the device while its virtual addresses,
 * blocks and pointers stay; resuming maps fresh pages at the same addresses (the idea of
 * torch_memory_saver's pause/resume in vLLM and SGLang). With GP_PAUSE_KEEP_CONTENTS the live blocks
 * are copied to pinned host staging memory first (staging.c) and back on resume.
 *
 * Virtual memory backends only. While paused, a tenant's ranges are marked `paused`: nothing maps,
 * unmaps or stitches them; its blocks keep their states (a free while paused is allowed and touches no
 * device memory), and p->paused_bytes carries their size so that the accounting still adds up.
 *
 * Staging is keyed by block: t->staged lists, sorted by address, every block copied at pause time and
 * where its bytes sit in the buffer. Resume copies back exactly the blocks that are still live, each
 * from its own offset, so a block freed while paused shifts nothing.
 *
 * A pause is done in two phases, so that a failure at any page loses nothing:
 *   1. unmap every in-use page of the tenant's ranges, keeping each page's physical handle aside;
 *   2. only once every unmap has succeeded, give the handles back to the device.
 * A failure in phase 1 maps the very same handles back where they were: the physical memory never left,
 * so the contents are intact with or without GP_PAUSE_KEEP_CONTENTS, and the failed pause changes
 * nothing the user can see ("rolled back"). Only if mapping a handle back fails too (a second fault)
 * is the tenant left paused: its pages are then given back, the error says so, and resume maps fresh
 * pages (and restores the staged contents; without GP_PAUSE_KEEP_CONTENTS the message says that the
 * contents of those pages are lost).
 *
 * Resume maps pages from the page pool, then the device; when the device is full it first turns free
 * cached pages of other tenants (down to their min) into pooled pages, and tries again.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pool_state.h"

/* A page unmapped by phase 1, with its handle kept until the pause commits. */
typedef struct held_page {
    gp_segment *seg;
    size_t index;
    gp_phys handle;
} held_page;

/* True for a page of seg that lies in no UNMAPPED block (it had memory when the range was paused). */
static bool page_in_use(const gp_segment *seg, uintptr_t va)
{
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        if (va >= b->addr && va < b->addr + b->size)
            return b->state != GP_BLOCK_UNMAPPED;
    return false;
}

static bool tenant_range(const gp_segment *seg, const gp_tenant *t)
{
    return seg->owner->tenant == t && seg->pages != NULL;
}

static int staged_cmp(const void *a, const void *b)
{
    uintptr_t x = ((const gp_staged_block *)a)->addr, y = ((const gp_staged_block *)b)->addr;
    return x < y ? -1 : x > y;
}

void gp_pause_drop_staging(gp_pool_state *p, gp_tenant *t)
{
    gp_staging_free(p, t->staging, t->staging_size);
    free(t->staged);
    t->staging = NULL;
    t->staging_size = 0;
    t->staged = NULL;
    t->staged_count = 0;
}

/* Copies every LIVE block of t's ranges to a new staging buffer and fills t's table. Every lock held. */
static int stage_live(gp_pool_state *p, gp_tenant *t)
{
    size_t bytes = 0, count = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (tenant_range(seg, t))
            for (gp_block *b = seg->first; b != NULL; b = b->next)
                if (b->state == GP_BLOCK_LIVE) {
                    bytes += b->size;
                    count++;
                }
    if (count == 0)
        return GP_OK;
    gp_staged_block *table = malloc(count * sizeof *table);
    if (table == NULL)
        return gp_error_set(GP_ERR_OOM, "out of host memory for the table of %zu staged blocks", count);
    void *staging = NULL;
    int rc = gp_staging_alloc(p, bytes, &staging);
    size_t at = 0, n = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next) {
        if (!tenant_range(seg, t))
            continue;
        for (gp_block *b = seg->first; b != NULL && rc == GP_OK; b = b->next) {
            if (b->state != GP_BLOCK_LIVE)
                continue;
            rc = p->ops->copy_to_host(p->ctx, (unsigned char *)staging + at, b->addr, b->size);
            table[n++] = (gp_staged_block){b->addr, b->size, at};
            at += b->size;
        }
    }
    if (rc != GP_OK) {
        gp_staging_free(p, staging, bytes);
        free(table);
        return rc;
    }
    qsort(table, count, sizeof *table, staged_cmp);
    t->staging = staging;
    t->staging_size = bytes;
    t->staged = table;
    t->staged_count = count;
    return GP_OK;
}

/* Copies the staged contents back into every block of t that is still LIVE. Every lock held. */
static int restore_staged(gp_pool_state *p, gp_tenant *t)
{
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (!tenant_range(seg, t))
            continue;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_LIVE)
                continue;
            gp_staged_block key = {.addr = b->addr};
            const gp_staged_block *e = bsearch(&key, t->staged, t->staged_count, sizeof key, staged_cmp);
            assert(e != NULL && e->size == b->size); /* nothing is allocated while paused */
            if (e == NULL)
                continue;
            int rc = p->ops->copy_to_device(p->ctx, b->addr, (unsigned char *)t->staging + e->offset, b->size);
            if (rc != GP_OK)
                return rc;
        }
    }
    return GP_OK;
}

/* The in-use pages of t's ranges that have memory now. Every lock held. */
static size_t mapped_pages(gp_pool_state *p, gp_tenant *t)
{
    size_t n = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (tenant_range(seg, t))
            n += seg->mapped_bytes / p->page;
    return n;
}

/* Maps `handle` at page i of seg and accounts it as memory of the range again. */
static int map_page(gp_pool_state *p, gp_segment *seg, size_t i, gp_phys handle)
{
    int rc = p->ops->map(p->ctx, seg->addr + i * p->page, p->page, handle);
    if (rc != GP_OK)
        return rc;
    seg->pages[i] = handle;
    atomic_fetch_add(&p->num_maps, 1);
    seg->mapped_bytes += p->page;
    p->paused_bytes -= p->page;
    gp_tenant_charge(seg->owner->tenant, (int64_t)p->page);
    return GP_OK;
}

/* Maps fresh pages at every in-use page of seg that has none; the range is unpaused once all have. */
static int remap_pages(gp_pool_state *p, gp_segment *seg)
{
    size_t pages = seg->size / p->page;
    for (size_t i = 0; i < pages; i++) {
        if (seg->pages[i] != GP_PHYS_NONE || !page_in_use(seg, seg->addr + i * p->page))
            continue;
        gp_phys handle;
        int rc = gp_vmm_page_get(p, &handle);
        if (rc != GP_OK)
            return rc;
        if ((rc = map_page(p, seg, i, handle)) != GP_OK) {
            gp_vmm_page_release(p, handle); /* one the device refuses stays pooled */
            return rc;
        }
    }
    seg->paused = false;
    return GP_OK;
}

/* Phase 1 for seg: unmaps every in-use page, appending its handle to held[]; stops at a failure. */
static int unmap_keeping(gp_pool_state *p, gp_segment *seg, held_page *held, size_t *nheld)
{
    size_t pages = seg->size / p->page;
    seg->paused = true;
    for (size_t i = 0; i < pages; i++) {
        uintptr_t va = seg->addr + i * p->page;
        if (seg->pages[i] == GP_PHYS_NONE || !page_in_use(seg, va))
            continue;
        int rc = p->ops->unmap(p->ctx, va, p->page);
        if (rc != GP_OK)
            return rc;
        atomic_fetch_add(&p->num_unmaps, 1);
        seg->mapped_bytes -= p->page;
        p->paused_bytes += p->page;
        gp_tenant_charge(seg->owner->tenant, -(int64_t)p->page);
        held[(*nheld)++] = (held_page){seg, i, seg->pages[i]};
        seg->pages[i] = GP_PHYS_NONE;
    }
    return GP_OK;
}

/*
 * Undoes phase 1: maps every held handle back where it was. Returns the pages that could not be mapped
 * back (their handles are given back to the device, their ranges stay paused). Every lock held.
 */
static size_t roll_back(gp_pool_state *p, gp_tenant *t, held_page *held, size_t nheld)
{
    size_t lost = 0;
    for (size_t k = nheld; k-- > 0;) {
        if (map_page(p, held[k].seg, held[k].index, held[k].handle) != GP_OK) {
            gp_vmm_page_release(p, held[k].handle);
            lost++;
        }
    }
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (!tenant_range(seg, t) || !seg->paused)
            continue;
        bool whole = true;
        for (size_t i = 0; i < seg->size / p->page && whole; i++)
            whole = seg->pages[i] != GP_PHYS_NONE || !page_in_use(seg, seg->addr + i * p->page);
        if (whole)
            seg->paused = false;
    }
    return lost;
}

GP_API int gp_tenant_pause(gp_pool *pool, const char *name, unsigned flags)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_pause", &p);
    if (rc != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_pause", &t)) != GP_OK)
        return rc;
    if (p->page == 0)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: '%s': pausing needs a virtual memory backend (vmm or "
                            "sim-vmm), not '%s'", name, p->ops->name);
    if (flags & ~GP_PAUSE_KEEP_CONTENTS)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: unknown flags 0x%x", flags);
    pthread_mutex_lock(&p->lock);
    if (t->paused) {
        pthread_mutex_unlock(&p->lock);
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: tenant '%s' is paused already", name);
    }
    gp_collect_all_pending(p);
    t->paused = true; /* closes the gate first: no allocation may start in it from here */
    gp_tenant_update_gate(t);
    int trimmed; /* its cache goes back first, so that resume maps only what live blocks need */
    gp_vmm_release_tenant(p, t, SIZE_MAX, &trimmed);
    gp_lock_all_streams(p);
    size_t capacity = mapped_pages(p, t);
    held_page *held = capacity > 0 ? malloc(capacity * sizeof *held) : NULL;
    size_t nheld = 0;
    if (capacity > 0 && held == NULL)
        rc = gp_error_set(GP_ERR_OOM, "gp_tenant_pause: out of host memory for %zu page handles", capacity);
    if (rc == GP_OK && (flags & GP_PAUSE_KEEP_CONTENTS))
        rc = stage_live(p, t);
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (tenant_range(seg, t))
            rc = unmap_keeping(p, seg, held, &nheld);
    if (rc == GP_OK) { /* phase 2: commit (a handle the device refuses stays in the page pool) */
        for (size_t k = 0; k < nheld; k++)
            gp_vmm_page_release(p, held[k].handle);
        atomic_fetch_add(&t->pauses, 1);
    } else {
        size_t lost = roll_back(p, t, held, nheld);
        if (lost == 0) {
            gp_pause_drop_staging(p, t);
            t->paused = false;
            gp_tenant_update_gate(t);
            gp_error_append(" (gp_tenant_pause of '%s' rolled back: its memory and contents are as they were)", name);
        } else {
            atomic_fetch_add(&t->pauses, 1);
            gp_error_append(" (gp_tenant_pause of '%s' could not be rolled back: %zu pages could not be mapped again; "
                            "it stays paused, %s)", name, lost,
                            t->staged != NULL ? "resume restores its staged contents"
                                              : "the contents of those pages are lost");
        }
    }
    free(held);
    gp_unlock_all_streams(p);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* Maps fresh pages into every paused range of t. Pool lock held, no stream lock. */
static int remap_tenant(gp_pool_state *p, gp_tenant *t)
{
    int rc = GP_OK;
    gp_lock_all_streams(p);
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (tenant_range(seg, t) && seg->paused)
            rc = remap_pages(p, seg);
    gp_unlock_all_streams(p);
    return rc;
}

GP_API int gp_tenant_resume(gp_pool *pool, const char *name)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_resume", &p);
    if (rc != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_resume", &t)) != GP_OK)
        return rc;
    pthread_mutex_lock(&p->lock);
    if (!t->paused) {
        pthread_mutex_unlock(&p->lock);
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_resume: tenant '%s' is not paused", name);
    }
    rc = remap_tenant(p, t);
    if (rc == GP_ERR_OOM) { /* the device is full: cached free pages elsewhere serve first */
        int failed = GP_OK;
        size_t need = 0;
        gp_lock_all_streams(p);
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (tenant_range(seg, t) && seg->paused)
                for (size_t i = 0; i < seg->size / p->page; i++)
                    need += seg->pages[i] == GP_PHYS_NONE && page_in_use(seg, seg->addr + i * p->page);
        gp_unlock_all_streams(p);
        if (gp_vmm_reclaim_pages(p, need, t, &failed) > 0)
            rc = remap_tenant(p, t);
    }
    gp_lock_all_streams(p);
    if (rc == GP_OK && t->staged != NULL)
        rc = restore_staged(p, t);
    if (rc == GP_OK) {
        /* Blocks freed while paused may sit in pages no live block shares: they are cache again. */
        gp_pause_drop_staging(p, t);
        t->paused = false;
        gp_tenant_update_gate(t);
    } else {
        gp_error_append(" (gp_tenant_resume of '%s': it stays paused; resume again once memory is free)", name);
    }
    gp_unlock_all_streams(p);
    pthread_mutex_unlock(&p->lock);
    return rc;
}
