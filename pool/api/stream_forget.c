/*
 * stream_forget.c — gp_stream_forget: the application is about to destroy a stream.
 *
 * The pool keeps per-stream state for every stream it has seen, and it records events on a stream's
 * handle: the steal fence of the stream's own heap, and, at a free, one event per stream the block was
 * used on (gp_record_stream). After cudaStreamDestroy that handle is dead (recording on it is an
 * error), and CUDA may hand the same value to a new, unrelated stream. The rule (documented in
 * gpupool.h): call gp_stream_forget(pool, stream) BEFORE destroying a stream the pool has seen. It
 *   1. waits for the work queued on the stream so far (one event recorded and synchronised), so that
 *      everything the stream did with the pool's memory is finished;
 *   2. drops the stream from every live block's uses (those uses are finished: no event will ever be
 *      recorded on the handle for them) and releases the stream's fence;
 * after which no pool call records on or waits for the handle unless the application uses it again.
 * The stream's cached free memory stays in its heap: its last uses are complete, so if the handle value
 * comes back as a new stream, handing that memory to it needs no ordering; other streams take it the
 * usual way (steal, release). Blocks still LIVE on the stream stay valid; free them on a live stream.
 */
#include <stdlib.h>

#include "api/api.h"
#include "base/error.h"
#include "provider/event_pool.h"

static gp_stream_state **uses_of(gp_block *b)
{
    return b->uses != NULL ? b->uses : b->uses_inline;
}

GP_API int gp_stream_forget(gp_pool *pool, gp_stream stream)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_stream_forget", &p);
    if (rc != GP_OK)
        return rc;
    if (!gp_stream_seen(&p->streams, stream))
        return GP_OK; /* nothing to forget */
    /* 1. everything queued on the stream so far completes */
    gp_event ev = NULL;
    rc = gp_event_pool_get(&p->events, &ev);
    if (rc == GP_OK) {
        rc = p->ops->event_record(p->ctx, ev, stream);
        if (rc == GP_OK)
            rc = p->ops->event_synchronize(p->ctx, ev);
        gp_event_pool_put(&p->events, ev);
    }
    if (rc != GP_OK) {
        gp_error_append(" (gp_stream_forget(%p): nothing was forgotten)", stream);
        return rc;
    }
    /* 2. no event will be recorded on the handle for what it did */
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        if (st->handle != stream)
            continue;
        st->done_seq = st->fence_seq = st->free_seq; /* every use of what it freed is over (step 1) */
        st->forgotten = true; /* the thread caches' counts came back with the locks */
        st->forgotten_ops = st->num_allocs + st->num_frees;
        if (st->fence == NULL)
            continue;
        if (st->fence_recorded)
            p->ops->event_synchronize(p->ctx, st->fence); /* complete already (step 1) */
        gp_event_pool_put(&p->events, st->fence);
        st->fence = NULL;
        st->fence_recorded = false;
    }
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_LIVE)
                continue;
            gp_stream_state **uses = uses_of(b);
            unsigned kept = 0;
            for (unsigned u = 0; u < b->use_count; u++)
                if (uses[u]->handle != stream)
                    uses[kept++] = uses[u];
            b->use_count = kept;
        }
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
    return GP_OK;
}
