/*
 * vmm_streams.h — the vmm provider's memory moved between a tenant's streams without a device or map
 * call (vmm_streams.c says how and in which stream order); called by vmm.c's alloc_vmm only. Pool lock
 * held for all of them, st not locked.
 */
#ifndef GP_VMM_STREAMS_H
#define GP_VMM_STREAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "provider/pool_state.h"

/* Another stream's (of st's tenant) unused range of kind `small` mapping at least `size` bytes, now
 * st's, its FREE blocks on no list; NULL when none may be taken. */
gp_segment *gp_vmm_steal_range(gp_pool_state *p, gp_stream_state *st, size_t size, bool small);

/* The smallest idle free block of kind `small` (under `below` bytes; SIZE_MAX: any) of another stream
 * of st's tenant that holds rsize, handed out to st for a request of `size`; NULL when none. */
gp_block *gp_vmm_borrow(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool small,
                        size_t below);

/* The completed pending frees of st's tenant's other streams, returned to their heaps. */
void gp_vmm_collect_tenant_pending(gp_pool_state *p, gp_stream_state *st);

/* tenant_best_fit:on — where st's own heap fits a large request only loosely (own_fit: the size of its
 * best block; 0: not asked), a tighter idle block of another stream of its tenant; NULL otherwise. */
gp_block *gp_vmm_tenant_best_fit(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool small,
                                  size_t own_fit);

#endif /* GP_VMM_STREAMS_H */
