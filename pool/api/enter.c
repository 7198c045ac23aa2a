/*
 * enter.c — the way into a pool from a gp_pool handle: every public call validates its handle with
 * gp_pool_enter (inline in api.h); the refusals are here (a destroyed pool's shell says so; anything
 * else is not a pool), and nothing below the API layer ever sees a handle.
 */
#include "api/api.h"

#include <string.h>

#include "base/error.h"

int gp_pool_enter_refused(gp_pool *pool, const char *fn)
{
    if (pool == NULL)
        return gp_error_set(GP_ERR_INVALID, "%s: pool is NULL", fn);
    if (pool->magic == GP_POOL_MAGIC_DEAD)
        return gp_error_set(GP_ERR_DESTROYED, "%s: pool %p has been destroyed", fn, (void *)pool);
    return gp_error_set(GP_ERR_INVALID, "%s: %p is not a gpupool pool", fn, (void *)pool);
}

int gp_pool_device_total(gp_pool *pool, const char *fn, size_t *out)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, fn, &p);
    if (rc == GP_OK)
        *out = p->device_total;
    return rc;
}

int gp_versioned_out(const char *fn, const char *arg, const void *out, uint32_t version, size_t size)
{
    if (out == NULL)
        return gp_error_set(GP_ERR_INVALID, "%s: %s is NULL", fn, arg);
    uint32_t head[2]; /* every such struct starts with uint32_t size, then uint32_t version */
    memcpy(head, out, sizeof head);
    if (head[1] != version || head[0] != size)
        return gp_error_set(GP_ERR_INVALID,
                            "%s: %s has version %u and size %u; this library has version %u and size %zu (set both "
                            "fields before the call)",
                            fn, arg, head[1], head[0], version, size);
    return GP_OK;
}
