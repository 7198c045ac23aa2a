/*
 * provider.h — device memory behind one interface, and the one place that chooses between its two
 * providers (in the manner of jemalloc's pa.c):
 *   - segments (provider/segment.c): one cudaMalloc-style device allocation per segment, moved whole
 *     between streams and given back whole;
 *   - vmm (provider/vmm.c, provider/stitch.c): physical pages mapped behind reserved address ranges,
 *     grown in place, stitched, given back page by page.
 * gp_provider_for picks one per pool from the backend's capabilities (GP_BACKEND_VMM); every path that
 * differs between them goes through the table, so that nothing above this layer tests which one it is.
 *
 * Every operation: pool lock held, no stream lock (each takes the stream locks it needs, in the lock
 * order of pool_state.h).
 */
#ifndef GP_PROVIDER_H
#define GP_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/pool_state.h"

typedef struct gp_provider {
    const char *name; /* "segments" or "vmm" */
    bool pages;       /* memory comes in pages of p->page behind virtual ranges (seg->pages != NULL) */
    /* Free blocks are lent between the streams of a tenant (`borrow`), and so, with `tenant_best_fit`,
     * a large request is placed by best fit over the idle free blocks of all of them: where st's own
     * best fit is not exact, the fast path leaves the request to `alloc` with that fit's size (own_fit),
     * which first borrows a tighter block that another stream of the tenant is done with
     * (provider/vmm_streams.c: gp_vmm_tenant_best_fit). */
    bool borrows_blocks;

    /* The allocation slow path's growth: makes room for a request of `size` (rounded: rsize) in st's
     * heap of kind `small` and takes it (*out, LIVE). own_fit: 0, or the size of the free block st's
     * heap would give it (not exact; borrows_blocks). GP_OK, or the error of the allocation with its
     * message (GP_ERR_OOM, GP_ERR_QUOTA, GP_ERR_PAUSED, GP_ERR_DEVICE, ...). */
    int (*alloc)(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool small, size_t own_fit,
                 void **out);

    /* Gives cached memory back to the device until at most `keep` bytes are cached, taking only memory
     * free since before `idle_before` (UINT64_MAX = any). Returns bytes released; *failed gets the first
     * device failure (what failed stays cached). */
    size_t (*release)(gp_pool_state *p, size_t keep, uint64_t idle_before, int *failed);

    /* Gives back up to `want` bytes of tenant t's own cached memory. */
    size_t (*release_tenant)(gp_pool_state *p, gp_tenant *t, size_t want, int *failed);

    /* Gives all device memory back at destroy (metadata stays for gp_segments_free_all); returns the
     * bytes the device would not take back, *failed its first error. */
    size_t (*destroy)(gp_pool_state *p, int *failed);

    /* The provider's own invariants of seg (owner locked): NULL, or the broken one's description. */
    const char *(*check_segment)(gp_pool_state *p, gp_segment *seg);
} gp_provider;

extern const gp_provider gp_provider_segments;
extern const gp_provider gp_provider_vmm;

/* The dispatch point: the provider for a backend with these operations. */
const gp_provider *gp_provider_for(const gp_backend_ops *ops);

/*
 * May tenant t grow by `bytes` (for a request of `request` bytes)? Asks the admission policy
 * (policy/admission.h) and does what it says: gives back t's own cache past high or max, then asks
 * again. GP_OK, GP_ERR_PAUSED, GP_ERR_QUOTA (over max; message set; the caller counts the refusal,
 * once per failed allocation) or GP_ERR_MIN_GUARANTEE (would eat into another tenant's min; message
 * set; callers return it as GP_ERR_OOM).
 */
int gp_provider_admit(gp_pool_state *p, gp_tenant *t, size_t bytes, size_t request);

/* Gives back up to `want` bytes of t's own cached memory, completed pending frees first. */
size_t gp_provider_trim_tenant(gp_pool_state *p, gp_tenant *t, size_t want);

/*
 * Under st's lock: puts `seg` (NULL, or a segment in transit to st from growth or a steal) into st's
 * heap, returns completed pending frees to it, and takes the request from it (LIVE, accounted). NULL
 * when nothing fits (or host memory for metadata is out).
 */
gp_block *gp_provider_take(gp_pool_state *p, gp_stream_state *st, gp_segment *seg, bool small, size_t rsize,
                           size_t size);

/*
 * Fences: when another stream may take st's free memory. Every block freed into st's heaps is stamped
 * with st's free clock (ds/heap.h: free_seq); st's fence event, recorded when the clock read
 * fence_seq, covers every use of the blocks stamped up to then. gp_stream_done_upto answers whether
 * the uses of a block stamped `seq` are over: at once when an earlier fence said so (done_seq), else
 * by querying the fence in flight, and, once that one has completed and st has freed since, by
 * recording the fence anew and querying it.
 *
 * Why generations. A fence recorded anew at every question while st keeps freeing never completes
 * while st is busy (the newest record waits for st's newest work), so a stream that is never idle
 * (a training loop, a server under load) could never give memory to another, however long ago it
 * freed it. A fence left in flight until it completes answers for everything freed before it was
 * recorded, one fence round later: st's free memory reaches other streams with the lag of st's own
 * queue, and never before its uses are over. On an idle stream the first record completes at once,
 * as before. st locked. (provider/segment.c)
 */
bool gp_stream_done_upto(gp_pool_state *p, gp_stream_state *st, uint64_t seq);

/*
 * Blocks the host until the uses of st's blocks stamped up to `seq` are over (pre: seq <=
 * st->free_seq): at once when gp_stream_done_upto says so, else by synchronizing st's fence in flight
 * when it covers seq, or one recorded now (the wait then lasts st's queued work, no other stream's).
 * Without an event to be had, or while a graph is captured, a device synchronize instead. Counts
 * num_unmap_waits. GP_OK or the backend's error. st locked. (provider/segment.c)
 */
int gp_stream_wait_upto(gp_pool_state *p, gp_stream_state *st, uint64_t seq);

/*
 * Blocks the host until all work queued on st's stream so far has completed, not only the uses of
 * what st freed: its fence is recorded now and synchronized (so done_seq reaches free_seq). For a
 * pause, whose unmaps take live blocks' pages too: their uses are the work queued on their tenant's
 * streams (and on streams recorded for them), and no other. Without an event to be had, or while a
 * graph is captured, a device synchronize instead. Counts num_unmap_waits. GP_OK or the backend's
 * error. st locked. (provider/segment.c)
 */
int gp_stream_drain(gp_pool_state *p, gp_stream_state *st);

/* done_seq after polling st's fence: the blocks st freed stamped up to it are idle on the device. */
uint64_t gp_stream_done(gp_pool_state *p, gp_stream_state *st);

/*
 * Whether `taker` may use owner's free memory stamped `seq` from now on: its uses are over
 * (gp_stream_done_upto), or, with reuse_wait:on (off by default: measured worse with busy streams,
 * bench/RESULTS.md) and both of one tenant, taker's stream can be made to wait on an owner fence
 * recorded after it (stream-ordered reuse by an event, as cudaMallocAsync's internal dependencies).
 * With `commit` that wait is made (cudaStreamWaitEvent, on the fence in flight when it covers seq,
 * else on one recorded now): call it so once the memory is taken, without it to choose; a failed
 * wait answers false. owner locked. Across tenants only completion counts: one model's stream never
 * waits on another model's work (their latencies stay apart). (provider/segment.c)
 */
bool gp_stream_reusable(gp_pool_state *p, gp_stream_state *owner, gp_stream_state *taker, uint64_t seq,
                        bool commit);

/* The FREE blocks of seg, which came to st from another stream (a steal; seg in transit, pool lock
 * held, st not locked), stamped for st's fence: 0 when the other stream's uses of them were over
 * (none of st's is pending), else (`waited`: st's stream waits on the other's fence) with st's free
 * clock, so that a third stream that takes them waits for st's work, which now includes that wait. */
void gp_segment_restamp(gp_stream_state *st, gp_segment *seg, bool waited);

/* Counts an OOM and fills the thread's message for a request the device cannot hold. */
int gp_provider_out_of_memory(gp_pool_state *p, size_t size, gp_stream stream);

#endif /* GP_PROVIDER_H */
