/*
 * maintain.c — giving cached memory back: gp_trim (down to a number of cached bytes), and, off the
 * allocation fast path, release_threshold (keep at most N bytes cached) and idle_release (give back
 * what has been free for T seconds), run by gp_maintain, by every allocation slow path, and every
 * GP_MAINTAIN_FREES frees. The provider (provider.h) decides what "free" means: whole segments, or
 * pages.
 *
 * Time is the backend's clock (gp_backend_now: CLOCK_MONOTONIC on a GPU, the simulated GPU's virtual
 * time on the sim, so that tests and replays can age memory without sleeping). The clock is read here
 * (and at create) only and kept in coarse_now, which frees stamp into blocks (free_since) with one
 * relaxed load.
 */
#include "base/error.h"
#include "api/api.h"
#include "provider/pending.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"

size_t gp_maintain_locked(gp_pool_state *p, int *failed)
{
    *failed = GP_OK;
    uint64_t now = gp_backend_now(p->ops, p->ctx);
    /* never backwards: gp_release_unused may have advanced it past the clock (api/working_set.c) */
    if (now > atomic_load(&p->coarse_now))
        atomic_store(&p->coarse_now, now);
    atomic_store(&p->frees_since_maintain, 0);
    gp_pool_ledger_service(p, false); /* other processes' requests to trim; figures for gpupool top */
    bool idle = p->cfg.idle_release >= 0;
    bool threshold = p->cfg.release_threshold != SIZE_MAX;
    if (!idle && !threshold)
        return 0;
    gp_collect_all_pending(p);
    gp_flush_all(p);
    size_t released = 0;
    int rc = GP_OK;
    if (idle) {
        /* the parser keeps idle_release within what a uint64_t of ns holds; saturate all the same */
        double ns = p->cfg.idle_release * 1e9;
        uint64_t age = ns >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)ns;
        uint64_t idle_before = now > age ? now - age : 0;
        if (now > age || age == 0)
            released += p->provider->release(p, 0, idle_before, &rc);
        if (rc != GP_OK)
            *failed = rc;
    }
    if (threshold) {
        released += p->provider->release(p, p->cfg.release_threshold, UINT64_MAX, &rc);
        if (rc != GP_OK && *failed == GP_OK)
            *failed = rc;
    }
    atomic_fetch_add(&p->idle_released_bytes, released);
    return released;
}

GP_API int gp_maintain(gp_pool *pool, size_t *released)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_maintain", &p);
    if (rc != GP_OK)
        return rc;
    gp_pool_lock(p);
    int failed = GP_OK;
    size_t bytes = gp_maintain_locked(p, &failed);
    gp_pool_unlock(p);
    if (released != NULL)
        *released = bytes;
    if (failed != GP_OK) {
        gp_error_append(" (gp_maintain: gave back %zu bytes; what could not be released stays cached)", bytes);
        return failed;
    }
    return GP_OK;
}

GP_API int gp_trim(gp_pool *pool, size_t keep_bytes, size_t *released)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_trim", &p);
    if (rc != GP_OK)
        return rc;
    gp_pool_lock(p);
    gp_collect_all_pending(p);
    gp_flush_all(p); /* keep_bytes is compared with exact figures */
    int failed = GP_OK;
    size_t bytes = p->provider->release(p, keep_bytes, UINT64_MAX, &failed);
    gp_pool_unlock(p);
    if (released != NULL)
        *released = bytes;
    if (failed != GP_OK) {
        gp_error_append(" (gp_trim: released %zu bytes; the segment whose release failed stays cached)", bytes);
        return failed;
    }
    return GP_OK;
}
