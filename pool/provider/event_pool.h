/*
 * event_pool.h — a cache of device events, so that a cross-stream free does not create one each time.
 *
 * Events are created on demand and never destroyed before the pool is; `created - idle` events are in
 * use (recorded for a pending block or held as a stream's fence). Thread-safe (own lock; it is the last
 * lock in the pool's lock order).
 */
#ifndef GP_EVENT_POOL_H
#define GP_EVENT_POOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct gp_event_pool {
    pthread_mutex_t lock;
    gp_event *idle;
    size_t idle_count, idle_capacity;
    uint64_t created;
    const gp_backend_ops *ops;
    void *ctx;
} gp_event_pool;

void gp_event_pool_init(gp_event_pool *ep, const gp_backend_ops *ops, void *ctx);
/* An idle event, creating one through the backend when none is idle. */
int gp_event_pool_get(gp_event_pool *ep, gp_event *out);
/* Returns an event that is no longer needed. */
void gp_event_pool_put(gp_event_pool *ep, gp_event ev);
/* Destroys every idle event; returns how many events were still in use (a leak in the pool). *failed
 * receives how many destroy calls the device refused (those events stay with the device). */
uint64_t gp_event_pool_destroy(gp_event_pool *ep, uint64_t *failed);

#endif /* GP_EVENT_POOL_H */
