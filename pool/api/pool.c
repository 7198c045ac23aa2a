/*
 * pool.c — the life of a pool: create (configuration, backend, provider), destroy (give everything
 * back and report what was never freed), and gp_sim_of. Handles are validated in enter.c, streams
 * registered in current.c, and gp_check is check.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "base/format.h"
#include "gpupool_sim.h"
#include "provider/pending.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"
#include "provider/staging.h"
#include "provider/thread_cache.h"

static atomic_uint_fast64_t next_pool_serial = 1;

/* Destroyed handles: their shells stay here, reachable, so a stale handle reads GP_POOL_MAGIC_DEAD. */
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_pool *graveyard;

GP_API int gp_pool_create(gp_pool **out, int device, const char *backend, const char *config)
{
    if (out == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_pool_create: out is NULL");
    *out = NULL;
    if (device < 0)
        return gp_error_set(GP_ERR_INVALID, "gp_pool_create: device %d is negative", device);
    gp_config cfg;
    gp_config_defaults(&cfg);
    int rc = gp_config_apply(&cfg, getenv("GPUPOOL_CONF"), "GPUPOOL_CONF");
    if (rc == GP_OK)
        rc = gp_config_apply(&cfg, config, "config");
    if (rc == GP_OK && backend != NULL) {
        if (strlen(backend) >= sizeof cfg.backend)
            rc = gp_error_set(GP_ERR_BACKEND, "gp_pool_create: backend name '%s' is too long", backend);
        else
            strcpy(cfg.backend, backend);
    }
    if (rc == GP_OK)
        rc = gp_config_validate(&cfg);
    if (rc != GP_OK)
        return rc;
    const gp_backend_ops *ops = gp_backend_find(cfg.backend);
    if (ops == NULL)
        return GP_ERR_BACKEND;

    gp_pool *shell = calloc(1, sizeof *shell);
    gp_pool_state *p = calloc(1, sizeof *p);
    if (shell == NULL || p == NULL) {
        free(shell);
        free(p);
        return gp_error_set(GP_ERR_INVALID, "gp_pool_create: out of host memory");
    }
    p->serial = atomic_fetch_add(&next_pool_serial, 1);
    p->device = device;
    p->cfg = cfg;
    p->ops = ops;
    p->routes_captures = ops->stream_capturing != NULL;
    p->provider = gp_provider_for(ops);
    p->quick_aging = p->provider->pages;
    rc = gp_stream_table_init(&p->streams, cfg.max_streams);
    if (rc != GP_OK) {
        free(shell);
        free(p);
        return rc;
    }
    rc = gp_tenant_registry_init(&p->tenants, cfg.max_streams);
    if (rc != GP_OK) {
        gp_stream_table_free(&p->streams);
        free(shell);
        free(p);
        return rc;
    }
    rc = ops->open(&p->cfg, device, &p->ctx);
    size_t free_bytes = 0;
    if (rc == GP_OK) {
        rc = ops->mem_info(p->ctx, &free_bytes, &p->device_total);
        if (rc != GP_OK)
            ops->close(p->ctx);
    }
    if (rc == GP_OK && p->provider->pages) {
        rc = ops->vm_granularity(p->ctx, &p->page);
        if (rc == GP_OK && (p->page == 0 || p->page % GP_GRANULE != 0 || GP_DEVICE_PAGE % p->page != 0))
            rc = gp_error_set(GP_ERR_BACKEND, "gp_pool_create: the device's page of %zu bytes is not supported", p->page);
        if (rc != GP_OK)
            ops->close(p->ctx);
    }
    if (rc == GP_OK && cfg.log_path[0] != '\0') {
        rc = gp_trace_log_open(&p->log, cfg.log_path);
        if (rc != GP_OK)
            ops->close(p->ctx);
    }
    if (rc == GP_OK) {
        rc = gp_pool_ledger_attach(p); /* ledger:off attaches nothing */
        if (rc != GP_OK) {
            gp_trace_log_close(p->log);
            ops->close(p->ctx);
        }
    }
    if (rc != GP_OK) {
        gp_tenant_registry_free(&p->tenants);
        gp_stream_table_free(&p->streams);
        free(shell);
        free(p);
        return rc;
    }
    pthread_mutex_init(&p->lock, NULL);
    gp_event_pool_init(&p->events, ops, p->ctx);
    p->maintains = cfg.idle_release >= 0 || cfg.release_threshold != SIZE_MAX;
    atomic_store(&p->coarse_now, gp_backend_now(ops, p->ctx));
    shell->state = p;
    shell->magic = GP_POOL_MAGIC_LIVE;
    *out = shell;
    return GP_OK;
}

GP_API int gp_pool_destroy(gp_pool *pool, gp_leak_report *report)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_pool_destroy", &p);
    if (rc != GP_OK)
        return rc;
    gp_leak_report leaks = {0, 0};
    int failed = GP_OK;
    size_t not_returned = 0;
    gp_capture_destroy(p, &leaks);
    /* its graph pools are gone, and each took back what it had charged to a tenant here (below) */
    for (unsigned i = 0; i < atomic_load(&p->tenants.count); i++)
        assert(atomic_load(&p->tenants.tenants[i]->graph_held) == 0);
    gp_current_tenant_forget_pool(p->serial); /* this thread's frames of the pool (current.c) */

    gp_thread_cache_destroy_begin(); /* no thread exits into this pool while it goes */
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    gp_thread_cache_forget(p);
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        int drc = gp_pending_drain(p, st);
        if (drc != GP_OK && failed == GP_OK)
            failed = drc;
        leaks.live_blocks += st->live.count;
        if (st->fence != NULL) {
            if (st->fence_recorded)
                p->ops->event_synchronize(p->ctx, st->fence);
            gp_event_pool_put(&p->events, st->fence);
            st->fence = NULL;
        }
    }
    for (unsigned i = 0; i < count; i++)
        leaks.live_bytes += p->streams.by_index[i]->allocated_bytes;
    p->destroying = true; /* no fence is left to wait on: unmaps synchronize the device */
    not_returned += p->provider->destroy(p, &failed);
    gp_segments_free_all(p);
    uint64_t events_failed = 0;
    uint64_t events_in_use = gp_event_pool_destroy(&p->events, &events_failed);
    assert(events_in_use == 0); /* every event was returned above */
    (void)events_in_use;
    if (events_failed > 0 && failed == GP_OK)
        failed = GP_ERR_DEVICE;
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
    gp_thread_cache_destroy_end();

    unsigned tenants = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < tenants; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        gp_staging_drop(p, t);
        if (t->charge_to != NULL) /* a graph pool: what it still had charged leaves its parent's tenant */
            atomic_fetch_sub(&t->charge_to->graph_held, atomic_load(&t->held));
    }
    gp_staging_destroy(p);
    free(p->pooled);
    free(p->pooled_since);
    gp_trace_log_close(p->log);
    gp_pool_ledger_detach(p); /* credits what this pool still had charged */
    gp_history_destroy(atomic_load(&p->history));
    p->ops->close(p->ctx);
    gp_stream_table_free(&p->streams);
    gp_tenant_registry_free(&p->tenants);
    pthread_mutex_destroy(&p->lock);
    free(p);

    pool->state = NULL;
    pool->magic = GP_POOL_MAGIC_DEAD;
    pthread_mutex_lock(&graveyard_lock);
    pool->grave_next = graveyard;
    graveyard = pool;
    pthread_mutex_unlock(&graveyard_lock);

    if (report != NULL)
        *report = leaks;
    char text[GP_SIZE_TEXT_MAX];
    if (failed != GP_OK)
        return gp_error_set(failed,
                            "gp_pool_destroy: %s of device memory and %llu events could not be given back (%s); "
                            "the pool is destroyed all the same",
                            gp_format_size(not_returned, text), (unsigned long long)events_failed,
                            gp_strerror(failed));
    if (leaks.live_blocks > 0)
        gp_error_set(GP_OK, "gp_pool_destroy: %zu blocks (%s) were never freed; their memory was given back",
                     leaks.live_blocks, gp_format_size(leaks.live_bytes, text));
    else
        gp_error_clear();
    return GP_OK;
}

GP_API gp_sim *gp_sim_of(gp_pool *pool)
{
    gp_pool_state *p = NULL;
    if (gp_pool_enter(pool, "gp_sim_of", &p) != GP_OK || (p->ops->caps & GP_BACKEND_SIMULATED) == 0)
        return NULL;
    return p->ops->instance(p->ctx);
}
