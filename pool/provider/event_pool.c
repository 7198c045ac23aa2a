/*
 * event_pool.c — pooled device events (see event_pool.h).
 */
#include "provider/event_pool.h"

#include <stdlib.h>

#include "base/error.h"
#include "base/lock_order.h"

/* The event pool's lock, ranked last in the lock order (base/lock_order.h). */
static void lock_pool(gp_event_pool *ep)
{
    gp_order_lock(GP_RANK_EVENT_POOL, 0);
    pthread_mutex_lock(&ep->lock);
}

static void unlock_pool(gp_event_pool *ep)
{
    pthread_mutex_unlock(&ep->lock);
    gp_order_unlock(GP_RANK_EVENT_POOL, 0);
}

void gp_event_pool_init(gp_event_pool *ep, const gp_backend_ops *ops, void *ctx)
{
    pthread_mutex_init(&ep->lock, NULL);
    ep->idle = NULL;
    ep->idle_count = ep->idle_capacity = 0;
    ep->created = 0;
    ep->ops = ops;
    ep->ctx = ctx;
}

int gp_event_pool_get(gp_event_pool *ep, gp_event *out)
{
    lock_pool(ep);
    if (ep->idle_count > 0) {
        *out = ep->idle[--ep->idle_count];
        unlock_pool(ep);
        return GP_OK;
    }
    /* Make room now so that gp_event_pool_put can never fail. */
    if (ep->idle_capacity < ep->created + 1) {
        size_t capacity = ep->idle_capacity ? ep->idle_capacity * 2 : 16;
        gp_event *idle = realloc(ep->idle, capacity * sizeof *idle);
        if (idle == NULL) {
            unlock_pool(ep);
            return gp_error_set(GP_ERR_INVALID, "out of host memory for the event pool");
        }
        ep->idle = idle;
        ep->idle_capacity = capacity;
    }
    gp_event ev;
    int rc = ep->ops->event_create(ep->ctx, &ev);
    if (rc == GP_OK) {
        ep->created++;
        *out = ev;
    }
    unlock_pool(ep);
    return rc;
}

void gp_event_pool_put(gp_event_pool *ep, gp_event ev)
{
    lock_pool(ep);
    /* idle_capacity >= created > idle_count: room was made when the event was created */
    ep->idle[ep->idle_count++] = ev;
    unlock_pool(ep);
}

uint64_t gp_event_pool_destroy(gp_event_pool *ep, uint64_t *failed)
{
    uint64_t in_use = ep->created - ep->idle_count;
    *failed = 0;
    for (size_t i = 0; i < ep->idle_count; i++)
        if (ep->ops->event_destroy(ep->ctx, ep->idle[i]) != GP_OK)
            (*failed)++;
    free(ep->idle);
    ep->idle = NULL;
    ep->idle_count = ep->idle_capacity = 0;
    pthread_mutex_destroy(&ep->lock);
    return in_use;
}
