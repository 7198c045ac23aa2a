/*
 * maintain.c — giving cached memory back off the allocation fast path: release_threshold (keep at
 * most N bytes cached) and idle_release (give back what has been free for T seconds), run by
 * gp_maintain, by every allocation slow path, and every GP_MAINTAIN_FREES frees.
 *
 * Time is the pool's clock: CLOCK_MONOTONIC on a GPU, the simulated GPU's virtual time on the sim, so
 * that tests and replays can age memory without sleeping. The clock is read here only and kept in
 * coarse_now, which frees stamp into blocks (free_since) with one relaxed load.
 */
#include <time.h>

#include "error.h"
#include "gpupool_sim.h"
#include "pool_state.h"

uint64_t gp_clock_now(gp_pool_state *p)
{
    if (p->ops == &gp_backend_sim || p->ops == &gp_backend_sim_vmm)
        return gp_sim_now(gp_backend_sim_instance(p->ctx));
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Gives back wholly free segments (device allocations) free since before idle_before. */
static size_t release_idle_segments(gp_pool_state *p, uint64_t idle_before, int *failed)
{
    size_t released = 0;
    for (gp_segment *seg = p->segments_head, *next; seg != NULL; seg = next) {
        next = seg->next;
        if (seg->pages != NULL)
            continue;
        gp_stream_state *owner = seg->owner;
        pthread_mutex_lock(&owner->lock);
        bool idle = gp_segment_wholly_free(seg) && seg->first->free_since <= idle_before;
        pthread_mutex_unlock(&owner->lock);
        if (!idle)
            continue;
        size_t size = seg->size;
        int rc = gp_release_segment(p, seg);
        if (rc == GP_OK)
            released += size;
        else if (*failed == GP_OK)
            *failed = rc;
    }
    return released;
}

size_t gp_maintain_locked(gp_pool_state *p, int *failed)
{
    *failed = GP_OK;
    uint64_t now = gp_clock_now(p);
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
        uint64_t age = (uint64_t)(p->cfg.idle_release * 1e9);
        uint64_t idle_before = now > age ? now - age : 0;
        if (now > age || age == 0)
            released += p->page != 0 ? gp_vmm_release(p, 0, idle_before, &rc) : release_idle_segments(p, idle_before, &rc);
        if (rc != GP_OK)
            *failed = rc;
    }
    if (threshold) {
        released += p->page != 0 ? gp_vmm_release(p, p->cfg.release_threshold, UINT64_MAX, &rc)
                                 : gp_release_free_segments(p, SIZE_MAX, p->cfg.release_threshold, &rc, NULL, NULL);
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
    pthread_mutex_lock(&p->lock);
    int failed = GP_OK;
    size_t bytes = gp_maintain_locked(p, &failed);
    pthread_mutex_unlock(&p->lock);
    if (released != NULL)
        *released = bytes;
    if (failed != GP_OK) {
        gp_error_append(" (gp_maintain: gave back %zu bytes; what could not be released stays cached)", bytes);
        return failed;
    }
    return GP_OK;
}
