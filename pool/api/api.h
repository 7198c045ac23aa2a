/*
 * api.h — what the API paths (the files of api/) share: the way in from a gp_pool handle, the calling thread's
 * stream state, and the helpers one API file needs from another. Only this layer (and the glue above
 * it, torch/) includes this header: nothing below the API enters a pool.
 */
#ifndef GP_API_H
#define GP_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"
#include "provider/pool_state.h"

/* ---- enter.c ---- */
/* Validates a handle; on success *out is its state. `fn` names the API call in messages. */
int gp_pool_enter(gp_pool *pool, const char *fn, gp_pool_state **out);
/* The device's total memory as the pool read it at create (for the glue: torch/). */
int gp_pool_device_total(gp_pool *pool, const char *fn, size_t *out);

/* ---- current.c ---- */
/*
 * The calling thread's state for `stream`: its tenant resolved (gp_tenant_resolve), added when `add`
 * and the pool has not seen the pair (else *out may be NULL). A one-entry per-thread cache keyed by the
 * pool's serial, the stream, the thread's tenant generation and the pool's bind epoch answers repeated
 * calls without the two hash lookups.
 */
int gp_pool_current_state(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out);
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

/* ---- tenant.c ---- */
/* The tenant named `name`; GP_ERR_INVALID with a message starting with `fn` when there is none. */
int gp_tenant_find(gp_pool_state *p, const char *name, const char *fn, gp_tenant **out);
/* Fills out[0..capacity) for every tenant (pool lock and every stream lock held); returns the count. */
int gp_tenant_snapshot_all(gp_pool_state *p, gp_tenant_stats *out, unsigned capacity);

/* ---- free.c ---- */
/* Says why `addr` is not a live block of this pool: GP_ERR_NOT_OWNED, GP_ERR_INTERIOR or
 * GP_ERR_DOUBLE_FREE, with a message starting with `fn`. Pool lock held, no stream lock. */
int gp_diagnose_pointer(gp_pool_state *p, uintptr_t addr, const char *fn);

/* ---- maintain.c ---- */
/* Runs release_threshold and idle_release. Pool lock held. */
size_t gp_maintain_locked(gp_pool_state *p, int *failed);

#endif /* GP_API_H */
