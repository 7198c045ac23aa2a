/*
 * staging.h — pinned host memory for pausing tenants with their contents (staging.c).
 */
#ifndef GP_STAGING_H
#define GP_STAGING_H

#include <stdbool.h>
#include <stddef.h>

#include "provider/pool_state.h"

int gp_staging_alloc(gp_pool_state *p, size_t size, void **out);
void gp_staging_free(gp_pool_state *p, void *mem, size_t size);
void gp_staging_destroy(gp_pool_state *p);
/* "jemalloc" (an arena over host_alloc) or "host_alloc" (jemalloc could not be opened: one per buffer). */
const char *gp_staging_kind(gp_pool_state *p);
/* Copies every LIVE block of t's ranges to (to_host) or from `staging`, in range and address order
 * (copy_to_host / copy_to_device). */
int gp_staging_copy_live(gp_pool_state *p, gp_tenant *t, unsigned char *staging, bool to_host);

#endif /* GP_STAGING_H */
