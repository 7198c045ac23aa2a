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
#include "error.h"
#include "pool_state.h"
#include "policy/working_set.h"

GP_API int gp_release_unused(gp_pool *pool, size_t *released)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_release_unused", &p);
    if (rc != GP_OK)
        return rc;
    pthread_mutex_lock(&p->lock);
    uint64_t now = gp_clock_now(p);
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
    atomic_store(&p->coarse_now, now);
    size_t bytes = 0;
    int failed = GP_OK;
    if (p->page != 0) {
        size_t keep = gp_working_set_keep(&p->working_set, p->cfg.cache_slack, allocated);
        if (keep != SIZE_MAX) {
            gp_collect_all_pending(p);
            bytes = gp_vmm_release(p, keep, UINT64_MAX, &failed);
        }
    } else if (oldest != 0) {
        gp_collect_all_pending(p);
        bytes = gp_release_idle(p, oldest - 1, &failed);
    }
    pthread_mutex_unlock(&p->lock);
    if (released != NULL)
        *released = bytes;
    if (failed != GP_OK) {
        gp_error_append(" (gp_release_unused: gave back %zu bytes; what could not be released stays cached)", bytes);
        return failed;
    }
    return GP_OK;
}
