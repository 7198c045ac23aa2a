/*
 * tenant.h — tenants (one per model): names, limits, attribution of device memory and the registry
 * of tenants and stream bindings (tenant.c). Admission of growth against max/high/min is a policy
 * (policy/admission.h); the calling thread's current tenant is api/current.c.
 *
 * Attribution: every stream state belongs to one tenant (the pool keeps one state per (stream,
 * tenant) pair), so every segment, block and cached byte has exactly one tenant. held counts the device
 * memory of a tenant's segments: their size for device allocations, their mapped bytes on virtual
 * memory backends. Invariant (gp_check): sum over tenants of held == reserved - pooled pages. The
 * private pools of CUDA graphs captured in a tenant's name are pools of their own (api/capture.c); what
 * they hold is the tenant's graph_held, which its limits count too.
 * Limits and counters are atomics: the fast paths read `gate` only (0 = open, else the error an
 * allocation gets: GP_ERR_PAUSED, or GP_ERR_QUOTA while held > max after max was lowered).
 */
#ifndef GP_TENANT_H
#define GP_TENANT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"

#define GP_MAX_TENANTS 64
/* Internal: growth refused to keep another tenant's min; callers return it as GP_ERR_OOM with the
 * admission's message. */
#define GP_ERR_MIN_GUARANTEE (-100)
#define GP_TENANT_STACK_MAX 32 /* nesting depth of gp_tenant_push per thread */

/* One block whose contents a pause staged: where they sit in the tenant's staging buffer. Keyed by the
 * block's address, because blocks may be freed while the tenant is paused (pause.c). */
typedef struct gp_staged_block {
    uintptr_t addr;
    size_t size;
    size_t offset;
} gp_staged_block;

typedef struct gp_tenant {
    char name[GP_TENANT_NAME_MAX];
    unsigned index;
    atomic_size_t max, high, min; /* 0 = none */
    atomic_size_t held, held_peak;
    /* Device memory held by the private pools of CUDA graphs captured in this tenant's name (their own
     * pools' tenants charge it here: charge_to, api/capture.c). Not in held, which counts this pool's
     * own memory (the invariant below); the limits count both (gp_tenant_charged). Invariant: the sum of
     * held over the graph pools charged to it; 0 once they are destroyed (asserted at gp_pool_destroy). */
    atomic_size_t graph_held;
    /* A graph pool's tenant: the parent pool's tenant that pays for its memory; NULL otherwise. Set
     * before the graph pool serves anything and never changed; the parent's tenants outlive it. */
    struct gp_tenant *charge_to;
    atomic_int gate;
    atomic_uint_fast64_t refusals, pauses;
    bool paused;       /* pool lock */
    void *staging;     /* paused with contents: host copy of the live blocks (pause.c) */
    size_t staging_size;
    gp_staged_block *staged; /* sorted by addr: the blocks in staging */
    size_t staged_count;
} gp_tenant;

typedef struct gp_binding {
    gp_stream handle;
    atomic_uint tenant; /* GP_MAX_TENANTS = unbound */
} gp_binding;

typedef struct gp_tenant_registry {
    gp_tenant *tenants[GP_MAX_TENANTS];
    atomic_uint count;
    _Atomic(gp_binding *) *bindings; /* open addressing by stream handle; written under the pool lock */
    unsigned binding_capacity;
    atomic_uint_fast64_t bind_epoch; /* bumped by every bind or unbind (state caches compare it) */
} gp_tenant_registry;

int gp_tenant_registry_init(gp_tenant_registry *reg, unsigned max_streams);
void gp_tenant_registry_free(gp_tenant_registry *reg);

/* The slot where a binding of `handle` starts its search (open addressing, capacity a power of two),
 * and the binding of `handle` (NULL: unbound). Lock-free readers; bindings are written under the pool
 * lock. */
unsigned gp_tenant_binding_slot(gp_stream handle, unsigned capacity);
gp_binding *gp_tenant_binding_find(const gp_tenant_registry *reg, gp_stream handle);

/* Adds `bytes` (may be negative) to t's held bytes and raises its peak; for a graph pool's tenant also
 * to the graph_held of the tenant it is charged to. */
void gp_tenant_charge(gp_tenant *t, int64_t bytes);

/* What counts against t's limits and guarantees: its own held bytes and those of its graphs' pools. */
static inline size_t gp_tenant_charged(const gp_tenant *t)
{
    return atomic_load_explicit(&t->held, memory_order_relaxed) +
           atomic_load_explicit(&t->graph_held, memory_order_relaxed);
}

/* May `bytes` of t's cached memory be taken for another tenant (t stays at or above its min)? */
static inline bool gp_tenant_can_give(gp_tenant *t, size_t bytes)
{
    size_t held = atomic_load_explicit(&t->held, memory_order_relaxed);
    size_t min = atomic_load_explicit(&t->min, memory_order_relaxed);
    return held >= bytes && gp_tenant_charged(t) - bytes >= min;
}

/* Recomputes t's gate after its held bytes or limits changed. */
void gp_tenant_update_gate(gp_tenant *t);

#endif /* GP_TENANT_H */
