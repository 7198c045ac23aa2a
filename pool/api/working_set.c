/*
 * working_set.c — gp_release_unused: gives back the cached memory that no one in the pool used
 * during the last GP_WORKING_SET_CALLS intervals between calls (policy/working_set.h says why).
 * torch.cuda.empty_cache() lands here under empty_cache:working-set (pool/torch_glue.c).
 *
 * cudaMalloc backends release by age, virtual memory backends by size (policy/working_set.h says why).
 * Each call advances the pool's coarse clock strictly (so frees after it are stamped later than
 * the call, even on the simulated GPU, whose virtual time stands still when no kernel runs), returns
 * completed pending frees and quick-listed blocks to the free lists (so wholly free segments and
 * pages show), and releases what was free since before the oldest call of the window.
 */
#include "api/api.h"
#include "base/error.h"
#include "policy/working_set.h"
#include "provider/pending.h"
#include "provider/provider.h"

/*
 * What a limit needs: a tenant that holds more than its max (lowered below what it held, e.g. by
 * torch.cuda.set_per_process_memory_fraction) or its high gives back its own cache down to the limit
 * now, at once, rather than after the window; its allocations are refused until it fits. Pool lock
 * held, no stream lock.
 */
static size_t release_over_limits(gp_pool_state *p, int *failed)
{
    size_t released = 0;
    unsigned count = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < count; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        size_t held = gp_tenant_charged(t), max = atomic_load(&t->max), high = atomic_load(&t->high);
        size_t limit = max && high ? (max < high ? max : high) : (max ? max : high);
        if (limit == 0 || held <= limit)
            continue;
        (void)failed; /* gp_provider_trim_tenant keeps what the device refuses cached and reports nothing */
        released += gp_provider_trim_tenant(p, t, held - limit);
        gp_tenant_update_gate(t);
    }
    return released;
}

GP_API int gp_release_unused(gp_pool *pool, size_t *released)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_release_unused", &p);
    if (rc != GP_OK)
        return rc;
    gp_pool_lock(p);
    uint64_t now = gp_backend_now(p->ops, p->ctx);
    uint64_t coarse = atomic_load(&p->coarse_now);
    if (now <= coarse)
        now = coarse + 1;
    uint64_t prev = p->working_set.count ? p->working_set.calls[(p->working_set.next + GP_WORKING_SET_CALLS - 1) %
                                                                 GP_WORKING_SET_CALLS]
                                         : 0;
    if (now <= prev)
        now = prev + 1;
    gp_flush_all(p);
    size_t allocated = gp_allocated_estimate(p);
    size_t interval_peak = atomic_exchange(&p->window_peak, allocated);
    if (interval_peak < allocated)
        interval_peak = allocated;
    uint64_t oldest = gp_working_set_call(&p->working_set, now, interval_peak);
    uint64_t growth = atomic_load(&p->num_maps) + atomic_load(&p->num_device_allocs) + atomic_load(&p->num_stitches);
    gp_working_set_note_growth(&p->working_set, growth, atomic_load(&p->reserved), interval_peak);
    atomic_store(&p->coarse_now, now);
    size_t bytes = 0;
    int failed = GP_OK;
    if (p->provider->pages) { /* fungible pages: by size */
        size_t keep = gp_working_set_keep(&p->working_set, p->cfg.cache_slack, allocated);
        if (keep != SIZE_MAX) {
            gp_collect_all_pending(p);
            bytes = p->provider->release(p, keep, UINT64_MAX, &failed);
        }
    } else if (oldest != 0) { /* whole segments: by age */
        gp_collect_all_pending(p);
        bytes = p->provider->release(p, 0, oldest - 1, &failed);
    }
    bytes += release_over_limits(p, &failed);
    gp_pool_unlock(p);
    if (released != NULL)
        *released = bytes;
    if (failed != GP_OK) {
        gp_error_append(" (gp_release_unused: gave back %zu bytes; what could not be released stays cached)", bytes);
        return failed;
    }
    return GP_OK;
}
