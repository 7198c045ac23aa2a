/*
 * tenant.c — the public gp_tenant_* calls except pause and resume (pause.c): creating tenants, their
 * limits, the calling thread's current tenant (kept in current.c), stream bindings, stats. Tenants as
 * data are ds/tenant.c; the admission of growth is policy/admission.c, carried out by the provider.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "base/format.h"
#include "provider/provider.h"

/* ---- public calls ---------------------------------------------------------------------------------- */

int gp_tenant_find(gp_pool_state *p, const char *name, const char *fn, gp_tenant **out)
{
    if (name == NULL)
        return gp_error_set(GP_ERR_INVALID, "%s: tenant name is NULL", fn);
    unsigned count = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < count; i++)
        if (strcmp(p->tenants.tenants[i]->name, name) == 0) {
            *out = p->tenants.tenants[i];
            return GP_OK;
        }
    return gp_error_set(GP_ERR_INVALID, "%s: no tenant named '%s' (create it with gp_tenant_create)", fn, name);
}

static int check_limits(const gp_tenant_limits *l, const char *fn, const char *name)
{
    if (l->max != 0 && l->min > l->max)
        return gp_error_set(GP_ERR_INVALID, "%s: tenant '%s': min %zu is above max %zu", fn, name, l->min, l->max);
    if (l->max != 0 && l->high > l->max)
        return gp_error_set(GP_ERR_INVALID, "%s: tenant '%s': high %zu is above max %zu", fn, name, l->high, l->max);
    return GP_OK;
}

/*
 * A min is a share of the device: it may not exceed the device, and the mins of all tenants (`self`'s
 * old one replaced by l->min) may not add up past it, or the guarantees could not all be kept (and the
 * admission's sums could wrap). Pool lock held.
 */
static int check_min(gp_pool_state *p, const gp_tenant *self, const gp_tenant_limits *l, const char *fn,
                     const char *name)
{
    char dev[GP_SIZE_TEXT_MAX], min[GP_SIZE_TEXT_MAX], others[GP_SIZE_TEXT_MAX];
    if (l->min == 0)
        return GP_OK;
    if (l->min > p->device_total)
        return gp_error_set(GP_ERR_INVALID, "%s: tenant '%s': min %s is more than the device's %s", fn, name,
                            gp_format_size(l->min, min), gp_format_size(p->device_total, dev));
    size_t sum = 0; /* each min <= device_total, at most GP_MAX_TENANTS of them: no overflow */
    unsigned count = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < count; i++)
        if (p->tenants.tenants[i] != self)
            sum += atomic_load(&p->tenants.tenants[i]->min);
    if (sum > p->device_total - l->min)
        return gp_error_set(GP_ERR_INVALID,
                            "%s: tenant '%s': min %s and the other tenants' mins (%s) add up to more than the "
                            "device's %s",
                            fn, name, gp_format_size(l->min, min), gp_format_size(sum, others),
                            gp_format_size(p->device_total, dev));
    return GP_OK;
}

static void store_limits(gp_tenant *t, const gp_tenant_limits *l)
{
    atomic_store(&t->max, l->max);
    atomic_store(&t->high, l->high);
    atomic_store(&t->min, l->min);
}

GP_API int gp_tenant_create(gp_pool *pool, const char *name, const gp_tenant_limits *limits)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_create", &p);
    if (rc != GP_OK)
        return rc;
    if (name == NULL || name[0] == '\0' || strlen(name) >= GP_TENANT_NAME_MAX)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_create: a tenant name is 1 to %d bytes long",
                            GP_TENANT_NAME_MAX - 1);
    gp_tenant_limits none = {0, 0, 0};
    const gp_tenant_limits *l = limits != NULL ? limits : &none;
    rc = check_limits(l, "gp_tenant_create", name);
    if (rc != GP_OK)
        return rc;
    gp_pool_lock(p);
    gp_tenant *existing;
    unsigned count = atomic_load(&p->tenants.count);
    if (gp_tenant_find(p, name, "gp_tenant_create", &existing) == GP_OK)
        rc = gp_error_set(GP_ERR_INVALID, "gp_tenant_create: a tenant named '%s' exists already", name);
    else if ((rc = check_min(p, NULL, l, "gp_tenant_create", name)) != GP_OK)
        ;
    else if (count >= GP_MAX_TENANTS)
        rc = gp_error_set(GP_ERR_INVALID, "gp_tenant_create: '%s' would be tenant %u; a pool has at most %d", name,
                          count + 1, GP_MAX_TENANTS);
    gp_tenant *t = rc == GP_OK ? calloc(1, sizeof *t) : NULL;
    if (rc == GP_OK && t == NULL)
        rc = gp_error_set(GP_ERR_INVALID, "gp_tenant_create: out of host memory");
    if (rc == GP_OK) {
        strcpy(t->name, name);
        t->index = count;
        store_limits(t, l);
        p->tenants.tenants[count] = t;
        atomic_store(&p->tenants.count, count + 1);
        gp_error_clear();
    }
    gp_pool_unlock(p);
    return rc;
}

GP_API int gp_tenant_set_limits(gp_pool *pool, const char *name, const gp_tenant_limits *limits)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_set_limits", &p);
    if (rc != GP_OK)
        return rc;
    if (limits == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_set_limits: limits is NULL");
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_set_limits", &t)) != GP_OK ||
        (rc = check_limits(limits, "gp_tenant_set_limits", name)) != GP_OK)
        return rc;
    gp_pool_lock(p);
    if ((rc = check_min(p, t, limits, "gp_tenant_set_limits", name)) != GP_OK) {
        gp_pool_unlock(p);
        return rc;
    }
    store_limits(t, limits);
    size_t held = gp_tenant_charged(t);
    if (limits->max != 0 && held > limits->max)
        gp_provider_trim_tenant(p, t, held - limits->max); /* never a live block: only its cache */
    gp_tenant_update_gate(t);
    gp_pool_unlock(p);
    return GP_OK;
}

GP_API int gp_tenant_push(gp_pool *pool, const char *name)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_push", &p);
    if (rc != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_push", &t)) != GP_OK)
        return rc;
    return gp_current_tenant_push(p, t->index);
}

GP_API int gp_tenant_pop(gp_pool *pool)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_pop", &p);
    if (rc != GP_OK)
        return rc;
    if (gp_current_tenant_pop(p))
        return GP_OK;
    return gp_error_set(GP_ERR_INVALID, "gp_tenant_pop: this thread has no current tenant of this pool");
}

GP_API int gp_tenant_bind_stream(gp_pool *pool, const char *name, gp_stream stream)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_bind_stream", &p);
    if (rc != GP_OK)
        return rc;
    unsigned index = GP_MAX_TENANTS;
    if (name != NULL) {
        gp_tenant *t = NULL;
        if ((rc = gp_tenant_find(p, name, "gp_tenant_bind_stream", &t)) != GP_OK)
            return rc;
        index = t->index;
    }
    gp_tenant_registry *reg = &p->tenants;
    gp_pool_lock(p);
    gp_binding *b = gp_tenant_binding_find(reg, stream);
    if (b == NULL && index != GP_MAX_TENANTS) {
        unsigned used = 0;
        for (unsigned i = 0; i < reg->binding_capacity; i++)
            used += atomic_load(&reg->bindings[i]) != NULL;
        b = used * 2 < reg->binding_capacity ? calloc(1, sizeof *b) : NULL;
        if (b == NULL) {
            gp_pool_unlock(p);
            return gp_error_set(GP_ERR_INVALID, "gp_tenant_bind_stream: no room to bind stream %p (max_streams)",
                                stream);
        }
        b->handle = stream;
        atomic_init(&b->tenant, index);
        unsigned s = gp_tenant_binding_slot(stream, reg->binding_capacity);
        while (atomic_load(&reg->bindings[s]) != NULL)
            s = (s + 1) & (reg->binding_capacity - 1);
        atomic_store_explicit(&reg->bindings[s], b, memory_order_release);
    } else if (b != NULL) {
        atomic_store(&b->tenant, index);
    }
    atomic_fetch_add(&reg->bind_epoch, 1);
    gp_pool_unlock(p);
    return GP_OK;
}

/* Fills s for tenant t. Pool lock and every stream lock held. */
static void tenant_snapshot(gp_pool_state *p, gp_tenant *t, gp_tenant_stats *s)
{
    memset((char *)s + 2 * sizeof(uint32_t), 0, sizeof *s - 2 * sizeof(uint32_t));
    strcpy(s->name, t->name);
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++)
        if (p->streams.by_index[i]->tenant == t)
            s->allocated_bytes += p->streams.by_index[i]->allocated_bytes;
    s->held_bytes = atomic_load(&t->held);
    s->held_bytes_peak = atomic_load(&t->held_peak);
    s->cached_bytes = s->held_bytes > s->allocated_bytes ? s->held_bytes - s->allocated_bytes : 0;
    s->max = atomic_load(&t->max);
    s->high = atomic_load(&t->high);
    s->min = atomic_load(&t->min);
    s->refusals = atomic_load(&t->refusals);
    s->pauses = atomic_load(&t->pauses);
    s->paused = t->paused;
    s->graph_held_bytes = atomic_load(&t->graph_held);
}

int gp_tenant_snapshot_all(gp_pool_state *p, gp_tenant_stats *out, unsigned capacity)
{
    unsigned count = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < count && i < capacity; i++) {
        out[i].size = sizeof out[i];
        out[i].version = GP_TENANT_STATS_VERSION;
        tenant_snapshot(p, p->tenants.tenants[i], &out[i]);
    }
    return (int)count;
}

GP_API int gp_tenant_get_stats(gp_pool *pool, const char *name, gp_tenant_stats *stats)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_get_stats", &p);
    if (rc != GP_OK)
        return rc;
    if ((rc = gp_versioned_out("gp_tenant_get_stats", "stats", stats, GP_TENANT_STATS_VERSION, sizeof *stats)) != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_get_stats", &t)) != GP_OK)
        return rc;
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    tenant_snapshot(p, t, stats);
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
    return GP_OK;
}

GP_API int gp_tenant_count(gp_pool *pool, size_t *count)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_count", &p);
    if (rc != GP_OK)
        return rc;
    if (count == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_count: count is NULL");
    *count = atomic_load(&p->tenants.count);
    return GP_OK;
}

GP_API int gp_tenant_name(gp_pool *pool, size_t index, char *buf, size_t len)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_name", &p);
    if (rc != GP_OK)
        return rc;
    if (index >= atomic_load(&p->tenants.count))
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_name: index %zu; the pool has %u tenants", index,
                            atomic_load(&p->tenants.count));
    const char *name = p->tenants.tenants[index]->name;
    if (buf == NULL || len <= strlen(name))
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_name: the buffer needs %zu bytes", strlen(name) + 1);
    strcpy(buf, name);
    return GP_OK;
}
