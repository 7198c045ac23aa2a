/*
 * clock.c — the device's clock as the pool reads it: the backend's `now` operation when it has one (the
 * simulated GPU's virtual time), else CLOCK_MONOTONIC.
 */
#include <time.h>

#include "backend/backend.h"

uint64_t gp_backend_now(const gp_backend_ops *ops, void *ctx)
{
    if (ops->now != NULL)
        return ops->now(ctx);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
