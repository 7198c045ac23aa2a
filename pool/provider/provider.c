/*
 * provider.c — the dispatch point between the two providers of device memory (provider.h), and what
 * both share: the admission of a tenant's growth (carrying out the policy's verdict), taking a request
 * from a stream's heap, and the message of an allocation the device cannot hold.
 */
#include "provider/provider.h"

#include <assert.h>

#include "base/error.h"
#include "base/format.h"
#include "policy/admission.h"
#include "provider/pending.h"
#include "provider/thread_cache.h"

const gp_provider *gp_provider_for(const gp_backend_ops *ops)
{
    return gp_backend_has_vmm(ops) ? &gp_provider_vmm : &gp_provider_segments;
}

size_t gp_provider_trim_tenant(gp_pool_state *p, gp_tenant *t, size_t want)
{
    int failed = GP_OK;
    gp_collect_all_pending(p);
    return p->provider->release_tenant(p, t, want, &failed);
}

static int refuse(const gp_tenant *t, int code, const char *why, size_t request, size_t bytes, bool in_graph)
{
    char max[GP_SIZE_TEXT_MAX], held[GP_SIZE_TEXT_MAX], req[GP_SIZE_TEXT_MAX], grow[GP_SIZE_TEXT_MAX],
        graphs[GP_SIZE_TEXT_MAX];
    size_t m = atomic_load(&t->max), g = atomic_load(&t->graph_held);
    return gp_error_set(code, "tenant '%s' %s%s: max %s, holds %s%s%s%s, request %s (needs %s more device memory)",
                        t->name, why, in_graph ? " (an allocation of a CUDA graph it captures)" : "",
                        m ? gp_format_size(m, max) : "none", gp_format_size(gp_tenant_charged(t), held),
                        g ? " (" : "", g ? gp_format_size(g, graphs) : "", g ? " of it in its CUDA graphs' pools)" : "",
                        gp_format_size(request, req), gp_format_size(bytes, grow));
}

int gp_provider_admit(gp_pool_state *p, gp_tenant *t, size_t bytes, size_t request)
{
    /* A graph pool's growth is judged as its parent's tenant's (api/capture.c): against that tenant's
     * limits and the parent's other tenants' guarantees. What a verdict asks to trim is trimmed here,
     * from the graph pool's own cache. */
    const gp_tenant *judged = t->charge_to != NULL ? t->charge_to : t;
    const gp_pool_state *reg_pool = t->charge_to != NULL ? p->graph_parent : p;
    assert(t->charge_to == NULL || p->graph_parent != NULL);
    unsigned trimmed = 0;
    for (;;) {
        gp_admission a = gp_admission_judge(&reg_pool->tenants, judged, bytes, reg_pool->device_total, trimmed);
        switch (a.verdict) {
        case GP_ADMIT:
            return GP_OK;
        case GP_TRIM_FOR_HIGH:
            gp_provider_trim_tenant(p, t, a.trim);
            trimmed |= GP_TRIMMED_HIGH;
            break;
        case GP_TRIM_FOR_MAX:
            gp_provider_trim_tenant(p, t, a.trim);
            trimmed |= GP_TRIMMED_MAX;
            break;
        case GP_REFUSE_PAUSED:
            return gp_error_set(GP_ERR_PAUSED, "tenant '%s' is paused: resume it before allocating", judged->name);
        case GP_REFUSE_QUOTA:
            return refuse(judged, GP_ERR_QUOTA, "over budget", request, bytes, judged != t);
        case GP_REFUSE_GUARANTEE: {
            char text[GP_SIZE_TEXT_MAX];
            return gp_error_set(GP_ERR_MIN_GUARANTEE,
                                "out of device memory for tenant '%s': request %s would leave %s of other tenants' "
                                "guaranteed minimum unavailable (e.g. tenant '%s', min %s)",
                                judged->name, gp_format_size(request, text),
                                gp_format_size(a.owed, (char[GP_SIZE_TEXT_MAX]){0}), a.owed_to->name,
                                gp_format_size(atomic_load(&a.owed_to->min), (char[GP_SIZE_TEXT_MAX]){0}));
        }
        }
    }
}

gp_block *gp_provider_take(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, bool small, size_t rsize,
                           size_t size)
{
    gp_heap *heap = gp_heap_of(st, small);
    gp_stream_lock(st);
    if (seg != NULL) { /* a segment's single FREE block, or every FREE block of a range */
        assert(seg->owner == st && seg->small == small);
        for (gp_block *fb = seg->first; fb != NULL; fb = fb->next)
            if (fb->state == GP_BLOCK_FREE)
                gp_heap_insert(heap, fb);
    }
    /* The lenders' blocks are the top of the quick lists (provider/thread_cache.h): back first, so that
     * the flush coalesces what it would without thread caches. */
    if (st->lenders != NULL)
        gp_thread_cache_return(p, st);
    gp_pending_collect(p, st, 0);
    gp_heap_quick_flush(heap, &st->blocks); /* small freed blocks may coalesce into what fits */
    gp_block *b = NULL;
    if (gp_block_map_reserve(&st->live))
        b = gp_heap_take(heap, &st->blocks, rsize);
    if (b != NULL)
        gp_hand_out(p, st, b, size);
    gp_stream_unlock(st);
    return b;
}

int gp_provider_out_of_memory(gp_pool_state *p, size_t size, gp_stream stream)
{
    char req[GP_SIZE_TEXT_MAX], cached[GP_SIZE_TEXT_MAX], dev_free[GP_SIZE_TEXT_MAX], total[GP_SIZE_TEXT_MAX];
    size_t free_bytes = 0, total_bytes = 0;
    bool known = p->ops->mem_info(p->ctx, &free_bytes, &total_bytes) == GP_OK;
    gp_flush_all(p);
    atomic_fetch_add(&p->num_ooms, 1);
    gp_format_size(size, req);
    gp_format_size(gp_cached_estimate(p), cached);
    gp_format_size(p->device_total, total);
    if (known)
        gp_format_size(free_bytes, dev_free);
    return gp_error_set(GP_ERR_OOM,
                        "out of device memory: requested %s on stream %p, %s cached but fragmented or busy, "
                        "%s free on the device (%s total)",
                        req, stream, cached, known ? dev_free : "unknown", total);
}
