/*
 * check.c — gp_check: every invariant of the pool, under every lock (the pool lock, then each stream
 * in index order), each broken one reported by name with GP_ERR_CORRUPT. The checks themselves belong
 * to the structures they check: gp_segment_check (ds/segment.c: blocks tile their segment),
 * gp_heap_check (ds/heap.c: free and quick lists), gp_block_map_check (ds/block_map.c), the
 * provider's check_segment (a virtual range's pages, provider/vmm.c), gp_accounting_check
 * (provider/pool_state.c: allocated + cached == reserved, the streams' counters, tenants' held bytes).
 */
#include <pthread.h>

#include "api/api.h"
#include "base/error.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"

GP_API int gp_check(gp_pool *pool)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_check", &p);
    if (rc != GP_OK)
        return rc;
    char why[512];
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    gp_segment_tally tally = {0, 0, 0, 0};
    size_t reserved = 0, segments = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        segments++;
        if ((seg->pages != NULL) != p->provider->pages) {
            rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: segment %p is of the wrong kind for the backend",
                              (void *)seg->addr);
            goto out;
        }
        const char *broken = p->provider->check_segment(p, seg);
        if (broken != NULL) {
            rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: range %p: %s", (void *)seg->addr, broken);
            goto out;
        }
        if (!gp_segment_check(seg, &tally, why, sizeof why)) {
            rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: %s", why);
            goto out;
        }
        reserved += seg->mapped_bytes;
    }
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        if (!gp_heap_check(&st->small, why, sizeof why) || !gp_heap_check(&st->large, why, sizeof why) ||
            !gp_block_map_check(&st->live, why, sizeof why)) {
            rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: stream %p: %s", st->handle, why);
            goto out;
        }
    }
    if (!gp_accounting_check(p, &tally, segments, reserved, why, sizeof why)) {
        rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: %s", why);
        goto out;
    }
    const char *ledger_broken = gp_pool_ledger_check(p);
    if (ledger_broken != NULL)
        rc = gp_error_set(GP_ERR_CORRUPT, "gp_check: %s", ledger_broken);
out:
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
    return rc;
}
