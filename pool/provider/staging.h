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
/*
 * Staging keyed by block (pool lock held, t's streams locked: gp_lock_tenant_streams): gp_staging_stage copies every LIVE block of t's ranges into
 * a new buffer and records, sorted by address, where each block's bytes sit (t->staged); restore copies
 * back into exactly the blocks still LIVE, each from its own offset, so that a block freed while paused
 * shifts nothing; drop gives buffer and table back.
 */
int gp_staging_stage(gp_pool_state *p, gp_tenant *t);
int gp_staging_restore(gp_pool_state *p, gp_tenant *t);
void gp_staging_drop(gp_pool_state *p, gp_tenant *t);

#endif /* GP_STAGING_H */
