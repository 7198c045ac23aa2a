/*
 * tenant.c — tenants as data: the registry (tenants and stream bindings), the attribution of device
 * memory to them (gp_tenant_charge) and their gates. No device calls and no decisions: admission is
 * policy/admission.c, the public gp_tenant_* calls are api/tenant.c.
 */
#include "ds/tenant.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/peak.h"

unsigned gp_tenant_binding_slot(gp_stream handle, unsigned capacity)
{
    uint64_t h = (uint64_t)(uintptr_t)handle * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 32) & (capacity - 1);
}

int gp_tenant_registry_init(gp_tenant_registry *reg, unsigned max_streams)
{
    memset(reg, 0, sizeof *reg);
    unsigned capacity = 16;
    while (capacity < 2 * max_streams)
        capacity *= 2;
    reg->bindings = calloc(capacity, sizeof *reg->bindings);
    gp_tenant *fallback = calloc(1, sizeof *fallback);
    if (reg->bindings == NULL || fallback == NULL) {
        free(reg->bindings);
        free(fallback);
        return gp_error_set(GP_ERR_INVALID, "out of host memory for the tenant registry");
    }
    for (unsigned i = 0; i < capacity; i++)
        atomic_init(&reg->bindings[i], NULL);
    reg->binding_capacity = capacity;
    strcpy(fallback->name, "default");
    reg->tenants[0] = fallback;
    atomic_init(&reg->count, 1);
    atomic_init(&reg->bind_epoch, 0);
    return GP_OK;
}

void gp_tenant_registry_free(gp_tenant_registry *reg)
{
    unsigned count = atomic_load(&reg->count);
    for (unsigned i = 0; i < count; i++)
        free(reg->tenants[i]); /* staging memory was given back by the pool (gp_staging_free) */
    for (unsigned i = 0; i < reg->binding_capacity; i++)
        free(atomic_load(&reg->bindings[i]));
    free(reg->bindings);
    memset(reg, 0, sizeof *reg);
}

gp_binding *gp_tenant_binding_find(const gp_tenant_registry *reg, gp_stream handle)
{
    for (unsigned s = gp_tenant_binding_slot(handle, reg->binding_capacity);; s = (s + 1) & (reg->binding_capacity - 1)) {
        gp_binding *b = atomic_load_explicit(&reg->bindings[s], memory_order_acquire);
        if (b == NULL || b->handle == handle)
            return b;
    }
}

void gp_tenant_charge(gp_tenant *t, int64_t bytes)
{
    size_t held = atomic_fetch_add(&t->held, (size_t)bytes) + (size_t)bytes;
    if (bytes > 0)
        gp_raise_peak(&t->held_peak, held);
    if (t->charge_to != NULL)
        atomic_fetch_add(&t->charge_to->graph_held, (size_t)bytes);
}

void gp_tenant_update_gate(gp_tenant *t)
{
    size_t max = atomic_load(&t->max);
    int gate = t->paused ? GP_ERR_PAUSED : (max != 0 && gp_tenant_charged(t) > max) ? GP_ERR_QUOTA : GP_OK;
    atomic_store(&t->gate, gate);
}

