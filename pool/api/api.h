/*
 * api.h — what the API paths (the files of api/) share: the way in from a gp_pool handle, the calling thread's
 * stream state, and the helpers one API file needs from another. Only this layer (and the glue above
 * it, torch/) includes this header: nothing below the API enters a pool.
 */
#ifndef GP_API_H
#define GP_API_H

#include <assert.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"
#include "provider/pool_state.h"

/* ---- enter.c ---- */
/* Validates a handle; on success *out is its state. `fn` names the API call in messages. */
static inline int gp_pool_enter(gp_pool *pool, const char *fn, gp_pool_state **out);
/* The error of gp_pool_enter for a handle that is not a live pool. */
int gp_pool_enter_refused(gp_pool *pool, const char *fn);
/* A struct the caller hands in to be filled (gp_stats, gp_breakdown, gp_tenant_stats,
 * gp_peak_composition): its first two fields are the uint32_t size and version the caller set. GP_OK
 * when they are this library's; else GP_ERR_INVALID naming `fn`, `arg` and both versions and sizes
 * (also for a NULL `out`). */
int gp_versioned_out(const char *fn, const char *arg, const void *out, uint32_t version, size_t size);
/* The device's total memory as the pool read it at create (for the glue: torch/). */
int gp_pool_device_total(gp_pool *pool, const char *fn, size_t *out);

/* ---- current.c ---- */
/*
 * The calling thread's state for `stream`: its tenant resolved (gp_tenant_resolve), added when `add`
 * and the pool has not seen the pair (else *out may be NULL). A one-entry per-thread cache keyed by the
 * pool's serial, the stream and the pool's bind epoch (emptied by the thread's tenant push and pop)
 * answers repeated calls inline, without the two hash lookups of gp_pool_current_state_lookup.
 */
static inline int gp_pool_current_state(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out);
int gp_pool_current_state_lookup(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out);
typedef struct gp_state_cache {
    uint64_t pool_serial, bind_epoch;
    gp_stream stream;
    gp_stream_state *st; /* NULL: empty */
} gp_state_cache;
extern _Thread_local gp_state_cache gp_thread_state_cache;
/* The state of (stream, tenant index), adding it (under the pool lock) when the pool has not seen it. */
int gp_pool_stream(gp_pool_state *p, gp_stream handle, unsigned tenant, gp_stream_state **out);
/* The tenant of an allocation on `stream` by the calling thread: its current tenant of this pool, else
 * the stream's binding, else 0 ("default"). Lock-free. */
unsigned gp_tenant_resolve(gp_pool_state *p, gp_stream stream);
/* Makes tenant `index` the calling thread's current tenant of p (GP_ERR_INVALID when nested too deep),
 * and takes p's innermost one off again (false when the thread has none of p). */
int gp_current_tenant_push(gp_pool_state *p, unsigned index);
bool gp_current_tenant_pop(gp_pool_state *p);
/* Drops the calling thread's frames of the pool with this serial (gp_pool_destroy). */
void gp_current_tenant_forget_pool(uint64_t pool_serial);

/* ---- peak.c ---- */
/* After an allocation of `request` bytes (pool lock held, no stream lock): when peak_composition is on
 * and reserved_peak rose above `peak_before`, records what reserved memory is made of now. */
void gp_peak_note(gp_pool_state *p, size_t peak_before, size_t request);
/* The last composition recorded (all zero but the unit while none was); takes the pool lock. */
gp_peak_composition gp_peak_read(gp_pool_state *p);

/* ---- tenant.c ---- */
/* The tenant named `name`; GP_ERR_INVALID with a message starting with `fn` when there is none. */
int gp_tenant_find(gp_pool_state *p, const char *name, const char *fn, gp_tenant **out);
/* Fills out[0..capacity) for every tenant (pool lock and every stream lock held); returns the count. */
int gp_tenant_snapshot_all(gp_pool_state *p, gp_tenant_stats *out, unsigned capacity);

/* ---- capture.c ---- */
/*
 * Before serving `stream`: GP_OK with *route NULL when the pool serves it itself, GP_OK with *route set
 * to the private pool of the graph being captured when the stream captures inside a
 * gp_graph_pool_begin/end window, GP_ERR_INVALID (message naming `fn`) when it captures outside one:
 * the pool then makes no device call for it.
 */
int gp_capture_route_query(gp_pool_state *p, gp_stream stream, const char *fn, gp_pool **route);
/* Inline: a pool whose backend never captures (the sims) or a graph pool itself answers without a
 * call; only a backend that can capture asks it (gp_capture_route_query, out of line). */
static inline int gp_capture_route(gp_pool_state *p, gp_stream stream, const char *fn, gp_pool **route)
{
    *route = NULL;
    if (!p->routes_captures)
        return GP_OK;
    return gp_capture_route_query(p, stream, fn, route);
}
/* After the pool found that it does not own ptr (gp_free, gp_record_stream): the graph pool that
 * does, or NULL. */
gp_pool *gp_capture_owner(gp_pool_state *p, void *ptr);
/* A free of the pool's own block on a capturing stream: deferred to the window's end (the graph may
 * still use it). GP_OK, or GP_ERR_INVALID with the message set. */
int gp_capture_defer_free(gp_pool_state *p, void *ptr, gp_stream stream);
/* Called after a free in graph pool `child`: destroys it when it was released and is now empty. */
void gp_capture_after_free(gp_pool_state *p, gp_pool *child);
/* Destroys the graph pools at gp_pool_destroy; adds their leaks to *leaks. */
void gp_capture_destroy(gp_pool_state *p, gp_leak_report *leaks);
/* A graph pool's only tenant (its memory is charged on to charge_to: capture.c). */
static inline gp_tenant *gp_graph_pool_tenant(const gp_pool *graph)
{
    return graph->state->tenants.tenants[0];
}
/* Calls fn on each of p's graph pools alive (released ones whose blocks are still live included), under
 * the capture lock, which comes before any graph pool's locks and is never taken under p's: the caller
 * holds none of p's locks. Returns how many. */
size_t gp_capture_each(gp_pool_state *p, void (*fn)(gp_pool *graph, void *arg), void *arg);

/* ---- free.c ---- */
/* Says why `addr` is not a live block of this pool: GP_ERR_NOT_OWNED, GP_ERR_INTERIOR or
 * GP_ERR_DOUBLE_FREE, with a message starting with `fn`. Pool lock held, no stream lock. */
int gp_diagnose_pointer(gp_pool_state *p, uintptr_t addr, const char *fn);

/* ---- maintain.c ---- */
/* Runs release_threshold and idle_release. Pool lock held. */
size_t gp_maintain_locked(gp_pool_state *p, int *failed);

/* ---- inline: the first steps of every call ---- */
static inline int gp_pool_enter(gp_pool *pool, const char *fn, gp_pool_state **out)
{
    if (pool == NULL || pool->magic != GP_POOL_MAGIC_LIVE || pool->state == NULL) {
        *out = NULL;
        int rc = gp_pool_enter_refused(pool, fn);
        assert(rc != GP_OK); /* a refusal is an error code: callers test rc, never *out */
        /* Without assert (NDEBUG) the compiler must still see that GP_OK comes with a state: else it
         * reads the callers' p->... on this path as a write through NULL (GCC 12's stringop-overflow). */
        return rc != GP_OK ? rc : GP_ERR_INVALID;
    }
    *out = pool->state;
    return GP_OK;
}

static inline int gp_pool_current_state(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out)
{
    const gp_state_cache *c = &gp_thread_state_cache;
    if (c->st != NULL && c->pool_serial == p->serial && c->stream == stream &&
        c->bind_epoch == atomic_load_explicit(&p->tenants.bind_epoch, memory_order_acquire)) {
        *out = c->st;
        return GP_OK;
    }
    return gp_pool_current_state_lookup(p, stream, add, out);
}

#endif /* GP_API_H */
