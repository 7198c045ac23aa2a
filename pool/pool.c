/*
 * pool.c — the life of a pool: create (configuration, backend), destroy (give everything back and
 * report what was never freed), handle validation, stream registration, and gp_check.
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "format.h"
#include "gpupool_sim.h"
#include "pool_state.h"

/* Destroyed handles: their shells stay here, reachable, so a stale handle reads GP_POOL_MAGIC_DEAD. */
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_pool *graveyard;

int gp_pool_enter(gp_pool *pool, const char *fn, gp_pool_state **out)
{
    if (pool == NULL)
        return gp_error_set(GP_ERR_INVALID, "%s: pool is NULL", fn);
    if (pool->magic == GP_POOL_MAGIC_DEAD)
        return gp_error_set(GP_ERR_DESTROYED, "%s: pool %p has been destroyed", fn, (void *)pool);
    if (pool->magic != GP_POOL_MAGIC_LIVE || pool->state == NULL)
        return gp_error_set(GP_ERR_INVALID, "%s: %p is not a gpupool pool", fn, (void *)pool);
    *out = pool->state;
    return GP_OK;
}

int gp_pool_stream(gp_pool_state *p, gp_stream handle, unsigned tenant, gp_stream_state **out)
{
    gp_tenant *t = p->tenants.tenants[tenant];
    gp_stream_state *st = gp_stream_find(&p->streams, handle, t);
    if (st != NULL) {
        *out = st;
        return GP_OK;
    }
    pthread_mutex_lock(&p->lock);
    st = gp_stream_find(&p->streams, handle, t);
    int rc = st != NULL ? GP_OK : gp_stream_add(&p->streams, handle, t, &st);
    pthread_mutex_unlock(&p->lock);
    if (rc == GP_OK)
        *out = st;
    return rc;
}

static atomic_uint_fast64_t next_pool_serial = 1;

static _Thread_local struct state_cache {
    uint64_t pool_serial, tenant_generation, bind_epoch;
    gp_stream stream;
    gp_stream_state *st;
} state_cache;

int gp_pool_current_state(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out)
{
    uint64_t epoch = atomic_load_explicit(&p->tenants.bind_epoch, memory_order_acquire);
    struct state_cache *c = &state_cache;
    if (c->st != NULL && c->pool_serial == p->serial && c->stream == stream &&
        c->tenant_generation == gp_tenant_thread_generation && c->bind_epoch == epoch) {
        *out = c->st;
        return GP_OK;
    }
    unsigned tenant = gp_tenant_resolve(p, stream);
    gp_stream_state *st = NULL;
    int rc = GP_OK;
    if (add)
        rc = gp_pool_stream(p, stream, tenant, &st);
    else
        st = gp_stream_find(&p->streams, stream, p->tenants.tenants[tenant]);
    if (rc == GP_OK && st != NULL)
        *c = (struct state_cache){p->serial, gp_tenant_thread_generation, epoch, stream, st};
    *out = st;
    return rc;
}

void gp_segment_link(gp_pool_state *p, gp_segment *seg)
{
    seg->prev = p->segments_tail;
    seg->next = NULL;
    if (p->segments_tail != NULL)
        p->segments_tail->next = seg;
    else
        p->segments_head = seg;
    p->segments_tail = seg;
    p->segment_count++;
}

void gp_segment_unlink(gp_pool_state *p, gp_segment *seg)
{
    if (seg->prev != NULL)
        seg->prev->next = seg->next;
    else
        p->segments_head = seg->next;
    if (seg->next != NULL)
        seg->next->prev = seg->prev;
    else
        p->segments_tail = seg->prev;
    p->segment_count--;
}

void gp_lock_all_streams(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++)
        pthread_mutex_lock(&p->streams.by_index[i]->lock);
}

void gp_unlock_all_streams(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = count; i-- > 0;)
        pthread_mutex_unlock(&p->streams.by_index[i]->lock);
}

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
    if (rc == GP_OK && gp_backend_has_vmm(ops)) {
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
    atomic_store(&p->coarse_now, gp_clock_now(p));
    shell->state = p;
    shell->magic = GP_POOL_MAGIC_LIVE;
    *out = shell;
    return GP_OK;
}

/* Waits for the events of st's pending blocks and returns them to the event pool (destroy only). */
static int drain_pending(gp_pool_state *p, gp_stream_state *st)
{
    int failed = GP_OK;
    while (st->pending != NULL) {
        gp_block *b = st->pending;
        gp_event *events = b->events != NULL ? b->events : b->events_inline;
        for (unsigned i = 0; i < b->use_count; i++) {
            if (events[i] == NULL)
                continue;
            int rc = p->ops->event_synchronize(p->ctx, events[i]);
            if (rc != GP_OK && failed == GP_OK)
                failed = rc;
            gp_event_pool_put(&p->events, events[i]);
            events[i] = NULL;
        }
        st->pending = b->list_next;
        b->state = GP_BLOCK_FREE; /* about to be freed with its segment */
    }
    st->pending_tail = NULL;
    st->pending_bytes = 0;
    atomic_store(&st->pending_count, 0);
    return failed;
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

    pthread_mutex_lock(&p->lock);
    gp_lock_all_streams(p);
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        int drc = drain_pending(p, st);
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
    if (p->page != 0)
        not_returned += gp_vmm_destroy(p, &failed);
    gp_segment *seg = p->segments_head;
    while (seg != NULL) {
        gp_segment *next = seg->next;
        int frc = seg->pages != NULL ? GP_OK : p->ops->mem_free(p->ctx, seg->addr, seg->size);
        if (frc != GP_OK) {
            not_returned += seg->size;
            if (failed == GP_OK)
                failed = frc;
        }
        free(seg->pages);
        for (gp_block *b = seg->first; b != NULL;) {
            gp_block *bn = b->next;
            free(b->uses);
            free(b->events);
            free(b);
            b = bn;
        }
        free(seg);
        seg = next;
    }
    uint64_t events_failed = 0;
    uint64_t events_in_use = gp_event_pool_destroy(&p->events, &events_failed);
    assert(events_in_use == 0); /* every event was returned above */
    (void)events_in_use;
    if (events_failed > 0 && failed == GP_OK)
        failed = GP_ERR_DEVICE;
    gp_unlock_all_streams(p);
    pthread_mutex_unlock(&p->lock);

    unsigned tenants = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < tenants; i++) {
        gp_staging_free(p, p->tenants.tenants[i]->staging, p->tenants.tenants[i]->staging_size);
        p->tenants.tenants[i]->staging = NULL;
    }
    gp_staging_destroy(p);
    free(p->pooled);
    free(p->pooled_since);
    gp_trace_log_close(p->log);
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
    if (gp_pool_enter(pool, "gp_sim_of", &p) != GP_OK || (p->ops != &gp_backend_sim && p->ops != &gp_backend_sim_vmm))
        return NULL;
    return gp_backend_sim_instance(p->ctx);
}

/* gp_check: each broken invariant is reported by name. */
#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: " __VA_ARGS__);                                       \
            goto out;                                                                                          \
        }                                                                                                      \
    } while (0)

GP_API int gp_check(gp_pool *pool)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_check", &p);
    if (rc != GP_OK)
        return rc;
    pthread_mutex_lock(&p->lock);
    gp_lock_all_streams(p);
    unsigned count = atomic_load(&p->streams.count);
    size_t reserved = 0, allocated = 0, free_bytes = 0, pending = 0, segments = 0, live_blocks = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        segments++;
        CHECK((seg->pages != NULL) == (p->page != 0), "segment %p is of the wrong kind for the backend",
              (void *)seg->addr);
        if (seg->pages != NULL) {
            const char *broken = gp_vmm_check_segment(p, seg);
            CHECK(broken == NULL, "range %p: %s", (void *)seg->addr, broken);
        }
        CHECK(seg->size % GP_DEVICE_PAGE == 0, "segment %p size %zu is not whole device pages", (void *)seg->addr, seg->size);
        CHECK(seg->first != NULL && seg->first->prev == NULL && seg->first->addr == seg->addr,
              "segment %p does not start with its first block", (void *)seg->addr);
        size_t covered = 0;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            CHECK(b->segment == seg, "block %p points to another segment", (void *)b->addr);
            CHECK(b->addr == seg->addr + covered, "block %p leaves a gap or overlap in segment %p", (void *)b->addr,
                  (void *)seg->addr);
            CHECK(b->size > 0 && b->size % GP_GRANULE == 0, "block %p size %zu is not whole granules", (void *)b->addr,
                  b->size);
            CHECK(b->next == NULL || b->next->prev == b, "block %p: next->prev is not itself", (void *)b->addr);
            CHECK(!(b->state == GP_BLOCK_FREE && b->next != NULL && b->next->state == GP_BLOCK_FREE),
                  "free blocks %p and %p were not coalesced", (void *)b->addr, (void *)b->next->addr);
            covered += b->size;
            if (b->state == GP_BLOCK_LIVE) {
                allocated += b->size;
                live_blocks++;
                CHECK(gp_block_map_find(&seg->owner->live, b->addr) == b, "live block %p is missing from its stream's map",
                      (void *)b->addr);
            } else if (b->state == GP_BLOCK_FREE || b->state == GP_BLOCK_QUICK) {
                free_bytes += b->size;
            } else if (b->state == GP_BLOCK_PENDING) {
                pending += b->size;
            }
        }
        CHECK(covered == seg->size, "blocks of segment %p cover %zu of its %zu bytes", (void *)seg->addr, covered,
              seg->size);
        reserved += seg->mapped_bytes;
    }
    size_t heap_free = 0, stream_pending = 0, mapped = 0;
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        heap_free += st->small.free_bytes + st->large.free_bytes;
        stream_pending += st->pending_bytes;
        mapped += st->live.count;
    }
    CHECK(segments == p->segment_count, "%zu segments listed, %zu counted", segments, p->segment_count);
    size_t pooled = p->pooled_count * p->page;
    reserved += pooled;
    CHECK(reserved == atomic_load(&p->reserved), "reserved %zu != mapped + pooled bytes %zu", atomic_load(&p->reserved),
          reserved);
    size_t stream_allocated = 0;
    int64_t unflushed = 0;
    for (unsigned i = 0; i < count; i++) {
        stream_allocated += p->streams.by_index[i]->allocated_bytes;
        unflushed += p->streams.by_index[i]->unflushed;
    }
    CHECK(allocated == stream_allocated, "streams count %zu allocated bytes, live blocks hold %zu", stream_allocated,
          allocated);
    CHECK((int64_t)atomic_load(&p->allocated_flushed) + unflushed == (int64_t)allocated,
          "shared allocated total %lld + unflushed %lld != %zu", (long long)atomic_load(&p->allocated_flushed),
          (long long)unflushed, allocated);
    CHECK(free_bytes == heap_free, "free blocks hold %zu bytes but the heaps count %zu", free_bytes, heap_free);
    CHECK(pending == stream_pending, "pending blocks hold %zu bytes but the streams count %zu", pending, stream_pending);
    CHECK(live_blocks == mapped, "%zu live blocks, %zu in the streams' maps", live_blocks, mapped);
    CHECK(allocated + free_bytes + pending + pooled == reserved + p->paused_bytes,
          "allocated %zu + cached %zu != reserved %zu + paused %zu", allocated, free_bytes + pending + pooled, reserved,
          p->paused_bytes);
    /* per tenant: held == device memory of the segments of its stream states; sums == pool totals */
    size_t held_total = 0;
    unsigned tenants = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < tenants; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        size_t held = 0;
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (seg->owner->tenant == t)
                held += seg->mapped_bytes;
        CHECK(held == atomic_load(&t->held), "tenant '%s' is charged %zu bytes, its segments hold %zu", t->name,
              atomic_load(&t->held), held);
        held_total += held;
    }
    CHECK(held_total + pooled == reserved, "tenants hold %zu + pooled %zu != reserved %zu", held_total, pooled,
          reserved);
out:
    gp_unlock_all_streams(p);
    pthread_mutex_unlock(&p->lock);
    return rc;
}
