/*
 * current.c — the calling thread's view of a pool: its current tenant (a per-thread stack of
 * gp_tenant_push frames, else the stream's binding, else "default") and its state for a stream, found
 * through a one-entry per-thread cache or registered on first use.
 */
#include <string.h>

#include "api/api.h"
#include "base/error.h"

/* The calling thread's current tenants, innermost last (one stack for all pools). A frame names its
 * pool by the pool's serial, which is unique in the process and never reused: a frame left behind by a
 * pool destroyed without a pop can never match a later pool, even one whose state malloc placed at the
 * old address (its tenant index would name a tenant the new pool does not have). gp_pool_destroy drops
 * the destroying thread's frames of the pool; another thread's stay, inert, until it pops them. */
typedef struct tenant_frame {
    uint64_t pool_serial;
    unsigned tenant;
} tenant_frame;

static _Thread_local tenant_frame tenant_stack[GP_TENANT_STACK_MAX];
static _Thread_local unsigned tenant_depth;

_Thread_local gp_state_cache gp_thread_state_cache;

unsigned gp_tenant_resolve(gp_pool_state *p, gp_stream stream)
{
    for (unsigned i = tenant_depth; i-- > 0;)
        if (tenant_stack[i].pool_serial == p->serial)
            return tenant_stack[i].tenant;
    gp_binding *b = gp_tenant_binding_find(&p->tenants, stream);
    if (b != NULL) {
        unsigned t = atomic_load_explicit(&b->tenant, memory_order_relaxed);
        if (t < GP_MAX_TENANTS)
            return t;
    }
    return 0;
}


int gp_current_tenant_push(gp_pool_state *p, unsigned index)
{
    if (tenant_depth >= GP_TENANT_STACK_MAX)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_push: tenants nest at most %d deep in one thread",
                            GP_TENANT_STACK_MAX);
    tenant_stack[tenant_depth++] = (tenant_frame){p->serial, index};
    gp_thread_state_cache.st = NULL; /* the thread's tenant changed: its cached state is stale */
    return GP_OK;
}

bool gp_current_tenant_pop(gp_pool_state *p)
{
    for (unsigned i = tenant_depth; i-- > 0;) {
        if (tenant_stack[i].pool_serial != p->serial)
            continue;
        memmove(&tenant_stack[i], &tenant_stack[i + 1], (tenant_depth - i - 1) * sizeof tenant_stack[0]);
        tenant_depth--;
        gp_thread_state_cache.st = NULL;
        return true;
    }
    return false;
}

void gp_current_tenant_forget_pool(uint64_t pool_serial)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < tenant_depth; i++)
        if (tenant_stack[i].pool_serial != pool_serial)
            tenant_stack[kept++] = tenant_stack[i];
    if (kept != tenant_depth)
        gp_thread_state_cache.st = NULL;
    tenant_depth = kept;
}

int gp_pool_stream(gp_pool_state *p, gp_stream handle, unsigned tenant, gp_stream_state **out)
{
    gp_tenant *t = p->tenants.tenants[tenant];
    gp_stream_state *st = gp_stream_find(&p->streams, handle, t);
    if (st != NULL) {
        *out = st;
        return GP_OK;
    }
    gp_pool_lock(p);
    st = gp_stream_find(&p->streams, handle, t);
    int rc = st != NULL ? GP_OK : gp_stream_add(&p->streams, handle, t, &st);
    gp_pool_unlock(p);
    if (rc == GP_OK)
        *out = st;
    return rc;
}

int gp_pool_current_state_lookup(gp_pool_state *p, gp_stream stream, bool add, gp_stream_state **out)
{
    uint64_t epoch = atomic_load_explicit(&p->tenants.bind_epoch, memory_order_acquire);
    unsigned tenant = gp_tenant_resolve(p, stream);
    gp_stream_state *st = NULL;
    int rc = GP_OK;
    if (add)
        rc = gp_pool_stream(p, stream, tenant, &st);
    else
        st = gp_stream_find(&p->streams, stream, p->tenants.tenants[tenant]);
    if (rc == GP_OK && st != NULL)
        gp_thread_state_cache = (gp_state_cache){p->serial, epoch, stream, st};
    *out = st;
    return rc;
}
