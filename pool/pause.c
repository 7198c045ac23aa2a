/*
 * pause.c — pausing a tenant: its physical memory goes back to the device while its virtual addresses,
 * blocks and pointers stay; resuming maps fresh pages at the same addresses (the idea of
 * torch_memory_saver's pause/resume in vLLM and SGLang). With GP_PAUSE_KEEP_CONTENTS the live blocks
 * are copied to pinned host staging memory first (staging.c) and back on resume.
 *
 * Virtual memory backends only. While paused, a tenant's ranges are marked `paused`: nothing maps,
 * unmaps or stitches them; its blocks keep their states (a free while paused is allowed and touches no
 * device memory), and p->paused_bytes carries their size so that the accounting still adds up.
 * Failure at any page rolls the operation back: every page already unmapped is mapped again (fresh
 * pages) and refilled from staging, so a failed pause changes nothing that the user can see.
 */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "pool_state.h"

/* True for a page of seg that lies in no UNMAPPED block (it had memory when the range was paused). */
static bool page_in_use(const gp_segment *seg, uintptr_t va)
{
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        if (va >= b->addr && va < b->addr + b->size)
            return b->state != GP_BLOCK_UNMAPPED;
    return false;
}

/* Copies every LIVE block of t's ranges to (to_host) or from staging, in range and address order. */
static int copy_live(gp_pool_state *p, gp_tenant *t, unsigned char *staging, bool to_host)
{
    size_t at = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->owner->tenant != t || seg->pages == NULL)
            continue;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_LIVE)
                continue;
            int rc = to_host ? p->ops->copy_to_host(p->ctx, staging + at, b->addr, b->size)
                             : p->ops->copy_to_device(p->ctx, b->addr, staging + at, b->size);
            if (rc != GP_OK)
                return rc;
            at += b->size;
        }
    }
    return GP_OK;
}

/* Maps fresh pages at every in-use page of seg that has none; the range is unpaused once all have. */
static int remap_pages(gp_pool_state *p, gp_segment *seg)
{
    size_t pages = seg->size / p->page;
    for (size_t i = 0; i < pages; i++) {
        uintptr_t va = seg->addr + i * p->page;
        if (seg->pages[i] != GP_PHYS_NONE || !page_in_use(seg, va))
            continue;
        gp_phys handle;
        int rc = gp_vmm_page_get(p, &handle);
        if (rc != GP_OK)
            return rc;
        rc = p->ops->map(p->ctx, va, p->page, handle);
        if (rc != GP_OK) {
            gp_vmm_page_release(p, handle);
            return rc;
        }
        seg->pages[i] = handle;
        atomic_fetch_add(&p->num_maps, 1);
        seg->mapped_bytes += p->page;
        p->paused_bytes -= p->page;
        gp_tenant_charge(seg->owner->tenant, (int64_t)p->page);
    }
    seg->paused = false;
    return GP_OK;
}

/* Unmaps and releases every in-use page of seg (marking each GP_PHYS_NONE), stopping at a failure; each
 * run of consecutive mapped pages is unmapped after one device synchronize. */
static int unmap_all(gp_pool_state *p, gp_segment *seg)
{
    size_t pages = seg->size / p->page;
    seg->paused = true;
    for (size_t i = 0; i < pages;) {
        uintptr_t va = seg->addr + i * p->page;
        /* a page of no block in use, or of a paused range that failed to resume part-way: skip */
        if (!page_in_use(seg, va) || seg->pages[i] == GP_PHYS_NONE) {
            i++;
            continue;
        }
        size_t n = 1;
        while (i + n < pages && seg->pages[i + n] != GP_PHYS_NONE && page_in_use(seg, va + n * p->page))
            n++;
        size_t done = 0;
        int rc = gp_vmm_unmap_run(p, va, n, &done);
        atomic_fetch_add(&p->num_unmaps, done);
        for (size_t k = 0; k < done; k++, i++) {
            seg->mapped_bytes -= p->page;
            p->paused_bytes += p->page;
            gp_tenant_charge(seg->owner->tenant, -(int64_t)p->page);
            gp_vmm_page_release(p, seg->pages[i]);
            seg->pages[i] = GP_PHYS_NONE;
        }
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
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
    size_t live = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (seg->owner->tenant == t && seg->pages != NULL)
            for (gp_block *b = seg->first; b != NULL; b = b->next)
                live += b->state == GP_BLOCK_LIVE ? b->size : 0;
    void *staging = NULL;
    if ((flags & GP_PAUSE_KEEP_CONTENTS) && live > 0) {
        rc = gp_staging_alloc(p, live, &staging);
        if (rc == GP_OK)
            rc = copy_live(p, t, staging, true);
    }
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (seg->owner->tenant == t && seg->pages != NULL)
            rc = unmap_all(p, seg);
    if (rc != GP_OK) { /* roll back: fresh pages where pages went, contents from staging */
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (seg->owner->tenant == t && seg->pages != NULL && seg->paused)
                remap_pages(p, seg);
        if (staging != NULL)
            copy_live(p, t, staging, false);
        gp_staging_free(p, staging, live);
        t->paused = false;
        gp_tenant_update_gate(t);
        gp_error_append(" (gp_tenant_pause of '%s' rolled back)", name);
    } else {
        t->staging = staging;
        t->staging_size = (flags & GP_PAUSE_KEEP_CONTENTS) ? live : 0;
        atomic_fetch_add(&t->pauses, 1);
    }
    gp_unlock_all_streams(p);
    pthread_mutex_unlock(&p->lock);
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
    gp_lock_all_streams(p);
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (seg->owner->tenant == t && seg->pages != NULL && seg->paused)
            rc = remap_pages(p, seg);
    if (rc == GP_OK && t->staging != NULL)
        rc = copy_live(p, t, t->staging, false);
    if (rc == GP_OK) {
        /* Blocks freed while paused may sit in pages no live block shares: they are cache again. */
        gp_staging_free(p, t->staging, t->staging_size);
        t->staging = NULL;
        t->staging_size = 0;
        t->paused = false;
        gp_tenant_update_gate(t);
    } else {
        gp_error_append(" (gp_tenant_resume of '%s': it stays paused; resume again once memory is free)", name);
    }
    gp_unlock_all_streams(p);
    pthread_mutex_unlock(&p->lock);
    return rc;
}
