/*
 * pause.c — pausing a tenant: its physical memory goes back to the device while its virtual addresses,
 * blocks and pointers stay; resuming maps fresh pages at the same addresses (the idea of
 * torch_memory_saver's pause/resume in vLLM and SGLang). With GP_PAUSE_KEEP_CONTENTS the live blocks
 * are copied to pinned host staging memory first (provider/staging.c) and back on resume.
 *
 * Virtual memory backends only. While paused, a tenant's ranges are marked `paused`: nothing maps,
 * unmaps or stitches them; its blocks keep their states (a free while paused is allowed and touches no
 * device memory), and p->paused_bytes carries their size so that the accounting still adds up.
 * Failure at any page rolls the operation back: every page already unmapped is mapped again (fresh
 * pages) and refilled from staging, so a failed pause changes nothing that the user can see.
 */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "provider/pending.h"
#include "provider/provider.h"
#include "provider/staging.h"
#include "provider/vmm.h"

GP_API int gp_tenant_pause(gp_pool *pool, const char *name, unsigned flags)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_pause", &p);
    if (rc != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_pause", &t)) != GP_OK)
        return rc;
    if (!p->provider->pages)
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
    p->provider->release_tenant(p, t, SIZE_MAX, &trimmed);
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
            rc = gp_staging_copy_live(p, t, staging, true);
    }
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (seg->owner->tenant == t && seg->pages != NULL)
            rc = gp_vmm_pause_range(p, seg);
    if (rc != GP_OK) { /* roll back: fresh pages where pages went, contents from staging */
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (seg->owner->tenant == t && seg->pages != NULL && seg->paused)
                gp_vmm_resume_range(p, seg);
        if (staging != NULL)
            gp_staging_copy_live(p, t, staging, false);
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
            rc = gp_vmm_resume_range(p, seg);
    if (rc == GP_OK && t->staging != NULL)
        rc = gp_staging_copy_live(p, t, t->staging, false);
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
