/*
 * gpupool.h — the public API of gpupool, a caching, stream-ordered GPU memory pool.
 *
 * One gp_pool serves one device through one backend ("cuda" on a real GPU, "sim" on the simulated
 * GPU used by tests and by `gpupool replay`). Every function returns an int error code (GP_OK == 0)
 * and, on failure, leaves a message that says what failed and why in a per-thread buffer readable
 * with gp_last_error(). A failing call changes nothing.
 *
 * Streams are passed as opaque handles (gp_stream); with the cuda backend a gp_stream is a
 * cudaStream_t, NULL being the default stream.
 */
#ifndef GPUPOOL_H
#define GPUPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GPUPOOL_STATIC_DEFINE)
#define GP_API
#elif defined(_WIN32)
#define GP_API __declspec(dllexport)
#else
#define GP_API __attribute__((visibility("default")))
#endif

#define GPUPOOL_VERSION_MAJOR 0
#define GPUPOOL_VERSION_MINOR 1
#define GPUPOOL_VERSION_PATCH 0

typedef struct gp_pool gp_pool;
typedef void *gp_stream; /* cudaStream_t with the cuda backend; NULL = default stream */

/* Error codes. GP_OK is 0; every error is negative so that callers can test `rc < 0`. */
enum gp_error {
    GP_OK = 0,
    GP_ERR_INVALID = -1,       /* a bad argument: NULL pool, NULL out-pointer, size too large */
    GP_ERR_OOM = -2,           /* the device has no memory for the request, even after release */
    GP_ERR_DEVICE = -3,        /* a device call failed for another reason */
    GP_ERR_CONFIG = -4,        /* an unknown configuration key or a bad value */
    GP_ERR_NOT_OWNED = -5,     /* a pointer this pool never returned */
    GP_ERR_INTERIOR = -6,      /* a pointer into the middle of a block */
    GP_ERR_DOUBLE_FREE = -7,   /* a block that is already free */
    GP_ERR_UNKNOWN_STREAM = -8,/* a stream this pool has never seen */
    GP_ERR_DESTROYED = -9,     /* the pool has been destroyed */
    GP_ERR_BACKEND = -10,      /* no backend of that name is built in, or it cannot run here */
    GP_ERR_NOT_READY = -11,    /* (internal/backends) an event has not completed yet */
    GP_ERR_QUOTA = -12,        /* a tenant over its max (gp_tenant_create, gp_tenant_set_limits) */
    GP_ERR_PAUSED = -13,       /* an allocation in a paused tenant (gp_tenant_pause) */
    GP_ERR_CORRUPT = -14       /* gp_check found broken metadata (a bug in gpupool) */
};

/* A short, static description of an error code ("out of device memory", ...). */
GP_API const char *gp_strerror(int error);

/* The calling thread's message for its last failed gpupool call ("" if none). It says what failed
 * and why, e.g. "out of device memory: requested 3.0 GiB on stream 0x7f.., 1.2 GiB cached but
 * fragmented, 0.4 GiB free on the device". Valid until the thread's next gpupool call. */
GP_API const char *gp_last_error(void);

/* ---- pool lifetime ---------------------------------------------------------------------------- */

/*
 * Creates a pool for `device` on the backend named `backend` ("cuda", "vmm", "sim" or "sim-vmm"; NULL
 * takes the `backend` configuration key, whose default is "cuda"). `config` is a "key:value,key:value" string;
 * the GPUPOOL_CONF environment variable is read first and `config` overrides it key by key. Sizes take
 * B, KiB, MiB, GiB (or K, M, G) suffixes. An unknown key or a bad value fails with GP_ERR_CONFIG.
 * The keys are listed by gp_config_help().
 */
GP_API int gp_pool_create(gp_pool **out, int device, const char *backend, const char *config);

/* What destroy found still allocated. */
typedef struct gp_leak_report {
    size_t live_blocks; /* blocks allocated and never freed */
    size_t live_bytes;  /* their rounded sizes */
} gp_leak_report;

/*
 * Destroys the pool: waits for the device work the pool still orders, gives every byte back to the
 * device (including blocks that were never freed, which are counted in *report when it is not NULL
 * and named in gp_last_error()), and frees all host metadata. Returns GP_OK even when blocks were
 * still live (the report says so); GP_ERR_DEVICE if a device call failed while giving memory back
 * (the message says how many bytes). After this call the handle is dead: any later call with it
 * returns GP_ERR_DESTROYED (the handle's small shell is kept for that purpose).
 */
GP_API int gp_pool_destroy(gp_pool *pool, gp_leak_report *report);

/* ---- allocation ------------------------------------------------------------------------------- */

/*
 * Allocates `size` bytes of device memory for use on `stream`; *out receives a 512-byte aligned
 * device pointer. size 0 succeeds and sets *out to NULL (like cudaMalloc's documented behaviour for
 * 0 bytes); gp_free(NULL) is then a no-op. A size larger than the device fails with GP_ERR_INVALID;
 * a size the device cannot hold now with GP_ERR_OOM. On failure *out is set to NULL.
 */
GP_API int gp_alloc(gp_pool *pool, void **out, size_t size, gp_stream stream);

/*
 * Frees a block. `stream` is the stream on which its last use is ordered (normally the stream it was
 * allocated on). The block is reusable at once by later allocations on that stream, and by other
 * streams only after the device has finished the work queued before the free. ptr NULL is a no-op.
 */
GP_API int gp_free(gp_pool *pool, void *ptr, gp_stream stream);

/*
 * Records that the block at `ptr` is used on `stream` as well (like torch's Tensor.record_stream):
 * when it is freed it returns to the cache only after the work queued on `stream` up to the free has
 * finished.
 */
GP_API int gp_record_stream(gp_pool *pool, void *ptr, gp_stream stream);

/* Call before destroying a stream the pool has seen (cudaStreamDestroy): waits for the work queued on
 * it so far and drops it from the pool's records, so that the pool never records on the dead handle
 * and a new stream that gets the same handle value inherits only finished work. Blocks still live on
 * the stream stay valid (free them on a live stream). A stream the pool never saw: GP_OK, nothing done. */
GP_API int gp_stream_forget(gp_pool *pool, gp_stream stream);

/*
 * Gives cached memory back to the device until at most `keep_bytes` stay cached (0 = all). Only
 * segments that are wholly free and whose last uses have completed are released, oldest first.
 * *released (optional) receives the bytes given back.
 */
GP_API int gp_trim(gp_pool *pool, size_t keep_bytes, size_t *released);

/*
 * Maintenance, off the allocation fast path: gives back cached memory above release_threshold and
 * memory idle longer than idle_release (configuration keys; both off by default). The pool runs it on
 * its slow paths too; call it from an idle loop or timer to let an idle pool shrink. *released
 * (optional) receives the bytes given back.
 */
GP_API int gp_maintain(gp_pool *pool, size_t *released);

/*
 * Gives back the cached memory that nothing in the pool used since the 8th-last call of this
 * function: memory freed in none of the last 8 intervals between calls. Meant to be called once per
 * step of a loop (it is what torch.cuda.empty_cache() does under empty_cache:working-set): a loop's
 * working set stays cached, so its next steps make no device calls, while memory it stopped using
 * goes back after 8 calls. The first 8 calls give nothing back. *released (optional): bytes given back.
 */
GP_API int gp_release_unused(gp_pool *pool, size_t *released);

/* ---- tenants: per-model budgets ------------------------------------------------------------------
 *
 * A tenant is one model sharing the GPU. Every block belongs to one tenant: the calling thread's
 * current tenant (gp_tenant_push), else the tenant bound to the stream (gp_tenant_bind_stream), else
 * the tenant named "default", which always exists and has no limits. A block remembers its tenant, so
 * a free from any thread credits the right one. A tenant holds the device memory of its live blocks
 * and of its own cache (on virtual memory backends: its mapped pages), and only that is counted:
 * the tenants' held bytes add up to the pool's reserved bytes (less the shared page pool).
 * Limits, in the style of the cgroup v2 memory controller (0 = none):
 *   max  — hard limit on held bytes; an allocation that would pass it first trims the tenant's own
 *          cache, then fails with GP_ERR_QUOTA (a message naming the tenant, its max, its use and the
 *          request); lowering max below what is held trims the cache and refuses allocations until it
 *          fits, and never frees a live block;
 *   high — above it the tenant's own cache is trimmed before it grows;
 *   min  — a guarantee: other tenants may not take memory that would leave this tenant unable to reach
 *          its min (their growth is refused as GP_ERR_OOM; its cache above min may serve them).
 */
typedef struct gp_tenant_limits {
    size_t max, high, min;
} gp_tenant_limits;

#define GP_TENANT_NAME_MAX 64 /* names are 1..63 bytes */

/* Creates a tenant; GP_ERR_INVALID for a bad or duplicate name, min > max, a min above the device's
 * memory, or mins of all tenants that would add up past it (guarantees that could not all be kept).
 * limits may be NULL. gp_tenant_set_limits checks the same. */
GP_API int gp_tenant_create(gp_pool *pool, const char *name, const gp_tenant_limits *limits);
/* Changes a tenant's limits at run time (see above for lowering max). */
GP_API int gp_tenant_set_limits(gp_pool *pool, const char *name, const gp_tenant_limits *limits);
/* Makes `name` the calling thread's current tenant of this pool until the matching pop (nestable). */
GP_API int gp_tenant_push(gp_pool *pool, const char *name);
GP_API int gp_tenant_pop(gp_pool *pool);
/* Binds a stream to a tenant (NULL name: unbinds): allocations on it go to that tenant unless the
 * thread has a current tenant. */
GP_API int gp_tenant_bind_stream(gp_pool *pool, const char *name, gp_stream stream);

#define GP_PAUSE_KEEP_CONTENTS 1u /* copy live blocks to pinned host memory and back on resume */
/*
 * Pausing releases the tenant's physical memory and keeps its virtual addresses (vmm backends only;
 * GP_ERR_INVALID otherwise). With GP_PAUSE_KEEP_CONTENTS live contents are first copied to pinned host
 * staging memory; resume maps fresh pages at the same addresses and copies them back into the blocks
 * still live (a block freed while paused is simply not restored). Without it, a resumed tenant's blocks
 * hold unspecified bytes. Allocating in a paused tenant fails with GP_ERR_PAUSED; freeing its blocks is
 * allowed. The caller makes sure no kernel uses the tenant's memory while it is paused.
 *
 * Before it unmaps, a pause waits for the work already queued on the tenant's streams (those it
 * allocated or freed on, or is bound to, but not one forgotten with gp_stream_forget and unused with
 * the pool since) and on streams its blocks were recorded for (gp_record_stream), and for nothing
 * else: other models' kernels keep running, and the contents are copied on a stream of the pool's own. Memory used on a stream the pool was never told of must be
 * ordered by the caller (the same contract as stream-ordered reuse, and as Tensor.record_stream).
 *
 * A pause that fails (a device call fails part-way) keeps the contents, with or without
 * GP_PAUSE_KEEP_CONTENTS: the pages already unmapped are mapped back with their own physical memory,
 * which is given back only once every unmap has succeeded, and the error says "rolled back" — the
 * tenant runs on as before. Only if mapping them back fails too (a second fault) does the tenant stay
 * paused; the error then says so, and whether resume restores staged contents or the contents of
 * those pages are lost. A resume that fails changes nothing: the pages it mapped are unmapped and given
 * back, the tenant stays paused with its paused bytes and staging as they were: call it again. Only if
 * unmapping them fails too (a second fault) do some stay mapped (the paused tenant's, accounted); the
 * error then says "undoing it failed too". Resume at device OOM first turns other tenants' cached free
 * pages (down to their min) into memory for the tenant.
 *
 * The private pools of CUDA graphs charged to the tenant (gp_graph_pool_begin) pause and resume with it,
 * at the same addresses, so that its graphs replay after the resume. If one of them cannot be paused,
 * the tenant and the others are resumed and the error says so; if one cannot be resumed, the tenant is
 * resumed and the error says how many stay paused: gp_tenant_resume again resumes them. A pause while a
 * graph pool window is open (a graph being captured) is refused: waiting for a stream would break it.
 */
GP_API int gp_tenant_pause(gp_pool *pool, const char *name, unsigned flags);
GP_API int gp_tenant_resume(gp_pool *pool, const char *name);

#define GP_TENANT_STATS_VERSION 2
typedef struct gp_tenant_stats {
    uint32_t size;    /* set by the caller to sizeof(gp_tenant_stats) */
    uint32_t version; /* set by the caller to GP_TENANT_STATS_VERSION */
    char name[GP_TENANT_NAME_MAX];
    uint64_t held_bytes;      /* device memory attributed to the tenant: live + its own cache */
    uint64_t held_bytes_peak;
    uint64_t allocated_bytes; /* live blocks (rounded sizes) */
    uint64_t cached_bytes;    /* held - allocated */
    uint64_t max, high, min;  /* 0 = none */
    uint64_t refusals;        /* allocations refused with GP_ERR_QUOTA (or GP_ERR_OOM by another's min) */
    uint64_t pauses;
    int paused;
    /* device memory of the private pools of CUDA graphs captured in the tenant's name (gp_graph_pool_begin),
     * not in held_bytes; max, high and min count held_bytes + graph_held_bytes */
    uint64_t graph_held_bytes;
} gp_tenant_stats;

GP_API int gp_tenant_get_stats(gp_pool *pool, const char *name, gp_tenant_stats *stats);
/* The number of tenants and the name of the i-th (in order of creation; 0 is "default"). */
GP_API int gp_tenant_count(gp_pool *pool, size_t *count);
GP_API int gp_tenant_name(gp_pool *pool, size_t index, char *buf, size_t len);

/* ---- statistics ------------------------------------------------------------------------------- */

#define GP_STATS_VERSION 2
#define GP_SIZE_CLASS_COUNT 64 /* request-size buckets: bucket k counts [256 << k, 512 << k); 0 also < 256 */

/*
 * The scalar fields of gp_stats, in order: X(name, unit, what). This one list makes the struct below,
 * the keys of gp_stats_json and the lines of gp_stats_print (unit: BYTES are printed as sizes, COUNT as
 * numbers). Key names follow PyTorch's torch.cuda.memory_stats where the meaning is the same.
 */
#define GP_STATS_FIELDS(X)                                                                                     \
    X(allocated_bytes, BYTES, "live: rounded sizes of blocks handed out and not freed")                       \
    X(allocated_bytes_peak, BYTES, "exact with one stream; with several, counted over all streams when "    \
                                   "it moves (over only where another thread held a stream's lock then), "   \
                                   "and short by up to 16 MiB per other active stream: what that stream "    \
                                   "allocated and has not added to the shared count yet (streams keep "      \
                                   "their counts apart so that their fast paths share no cache line)")       \
    X(requested_bytes, BYTES, "live: sizes as requested")                                                      \
    X(reserved_bytes, BYTES, "device memory held by the pool")                                                 \
    X(reserved_bytes_peak, BYTES, "peak of reserved_bytes")                                                    \
    X(cached_bytes, BYTES, "reserved - allocated: free or pending blocks")                                     \
    X(pending_bytes, BYTES, "freed blocks waiting for events on other streams")                                \
    X(active_blocks, COUNT, "live blocks")                                                                     \
    X(segments, COUNT, "device allocations held (virtual ranges on vmm backends)")                            \
    X(num_allocs, COUNT, "successful gp_alloc calls with size > 0")                                            \
    X(num_frees, COUNT, "successful gp_free calls of live blocks")                                             \
    X(num_device_allocs, COUNT, "device allocate calls that succeeded")                                        \
    X(num_device_frees, COUNT, "device free calls that succeeded")                                             \
    X(num_alloc_retries, COUNT, "allocations that released cached memory and retried")                         \
    X(num_ooms, COUNT, "allocations that failed with GP_ERR_OOM")                                              \
    X(num_stream_steals, COUNT, "free segments moved from one stream to another")                              \
    X(num_stream_waits, COUNT, "times a stream was made to wait on another stream's event")                    \
    X(num_events_created, COUNT, "device events created (they are pooled)")                                    \
    X(streams, COUNT, "streams seen")                                                                          \
    X(mapped_bytes, BYTES, "vmm backends: physical memory mapped into the pool's ranges (0 otherwise)")        \
    X(unmapped_cached_bytes, BYTES, "vmm backends: physical memory kept unmapped for reuse (reserved - mapped)") \
    X(num_maps, COUNT, "vmm backends: pages mapped")                                                           \
    X(num_unmaps, COUNT, "vmm backends: pages unmapped")                                                       \
    X(num_unmap_waits, COUNT, "vmm backends: host waits for one stream's queued work before unmapping "        \
                              "its free pages, or a paused tenant's (cuMemUnmap does not wait)")              \
    X(num_device_syncs, COUNT, "vmm backends: device synchronizes before unmapping where no one stream "     \
                               "can be named (destroy; every stream's queued work)")                          \
    X(num_stitches, COUNT, "vmm backends: requests served by moving cached free pages into a new range")       \
    X(idle_released_bytes, BYTES, "bytes given back by idle_release and release_threshold")                    \
    X(paused_bytes, BYTES, "blocks of paused tenants, which hold no device memory while paused: "             \
                           "allocated + cached == reserved + paused")                                        \
    X(graph_pools, COUNT, "private pools of CUDA graphs alive (gp_graph_pool_begin): pools of their own, "    \
                          "which no field above counts")                                                     \
    X(graph_reserved_bytes, BYTES, "device memory those pools hold")                                          \
    X(graph_allocated_bytes, BYTES, "their live blocks (rounded sizes)")

typedef struct gp_stats {
    uint32_t size;    /* set by the caller to sizeof(gp_stats) */
    uint32_t version; /* set by the caller to GP_STATS_VERSION */
#define GP_STATS_MEMBER_(name, unit, what) uint64_t name;
    GP_STATS_FIELDS(GP_STATS_MEMBER_)
#undef GP_STATS_MEMBER_
    uint64_t size_class_allocs[GP_SIZE_CLASS_COUNT]; /* allocations per power-of-two class */
} gp_stats;

/* Fills *stats (whose size and version fields the caller sets) with a consistent snapshot. */
GP_API int gp_get_stats(gp_pool *pool, gp_stats *stats);

/*
 * Writes the stats as one JSON object into buf (always NUL-terminated when len > 0). *needed
 * (optional) receives the length without the NUL; when it is >= len the output was cut short.
 */
GP_API int gp_stats_json(gp_pool *pool, char *buf, size_t len, size_t *needed);

/* Prints a human-readable summary through `write` (called with NUL-terminated pieces). */
typedef void (*gp_writer)(void *opaque, const char *text);
GP_API int gp_stats_print(gp_pool *pool, gp_writer write, void *opaque);

/* ---- PyTorch's view: memory_stats breakdown, peaks, snapshots for memory_viz --------------------- */

/* One heap kind's figures, with the meanings of PyTorch's torch.cuda.memory_stats keys (small_pool:
 * requests up to small_size, in small segments; large_pool: the rest). */
typedef struct gp_kind_stats {
    uint64_t segments;             /* segment.*: device allocations (vmm: mapped runs of a range) */
    uint64_t reserved_bytes;       /* reserved_bytes.*: their bytes (large_pool also counts the pages kept
                                    * unmapped for reuse on vmm backends, so small + large == reserved) */
    uint64_t allocations;          /* allocation.*: live blocks */
    uint64_t allocated_bytes;      /* allocated_bytes.*: their rounded sizes */
    uint64_t requested_bytes;      /* requested_bytes.*: their sizes as asked for */
    uint64_t active_blocks;        /* active.*: live blocks plus freed ones waiting for other streams */
    uint64_t active_bytes;         /* active_bytes.* */
    uint64_t inactive_split;       /* inactive_split.*: free blocks in segments that are not wholly free */
    uint64_t inactive_split_bytes; /* inactive_split_bytes.* */
    uint64_t num_allocs_total;     /* allocation.*.allocated: blocks ever handed out */
    uint64_t num_frees_total;      /* allocation.*.freed */
    uint64_t alloc_bytes_total;    /* allocated_bytes.*.allocated: their rounded bytes */
    uint64_t free_bytes_total;     /* allocated_bytes.*.freed */
} gp_kind_stats;

#define GP_BREAKDOWN_VERSION 1
typedef struct gp_breakdown {
    uint32_t size;    /* set by the caller to sizeof(gp_breakdown) */
    uint32_t version; /* set by the caller to GP_BREAKDOWN_VERSION */
    gp_kind_stats small, large;
} gp_breakdown;

/* Fills *out from one walk of every segment and block (takes every lock: not for a hot loop). The private
 * pools of the pool's CUDA graphs are counted too, as PyTorch's memory_stats count its graphs' pools
 * (gp_stats keeps them apart: graph_reserved_bytes). */
GP_API int gp_get_breakdown(gp_pool *pool, gp_breakdown *out);

/* Sets the peaks (allocated_bytes_peak, reserved_bytes_peak, each tenant's held_bytes_peak) to the
 * current values, as torch.cuda.reset_peak_memory_stats does; forgets the peak composition. */
GP_API int gp_reset_peaks(gp_pool *pool);

/* ---- what reserved memory was made of at its peak (configuration key peak_composition:on) --------- */

/*
 * Where the reserved bytes are, by heap kind, in four parts that add up: live blocks; freed blocks
 * waiting for other streams' events; free bytes in a unit that also holds live or pending bytes; and
 * free bytes in units that hold nothing else. The unit is what the pool can give back or move: a
 * device allocation (a segment) on the cuda backends, a device page on the vmm backends. So the third
 * part is the fragmentation nothing but later requests that fit beside the live blocks can use, and
 * the fourth is cache the pool could have given back or moved (cuda: wholly free segments; vmm: whole
 * free pages).
 */
typedef struct gp_peak_part {
    uint64_t allocated_bytes; /* live blocks, rounded sizes */
    uint64_t pending_bytes;   /* freed blocks waiting for events on other streams */
    uint64_t free_in_used_bytes; /* free bytes in units that also hold live or pending bytes */
    uint64_t free_whole_bytes;   /* free bytes in units that hold nothing else */
} gp_peak_part;

#define GP_PEAK_COMPOSITION_VERSION 1
typedef struct gp_peak_composition {
    uint32_t size;    /* set by the caller to sizeof(gp_peak_composition) */
    uint32_t version; /* set by the caller to GP_PEAK_COMPOSITION_VERSION */
    uint32_t recorded;     /* 1 once an allocation raised reserved_bytes_peak with peak_composition:on */
    uint32_t unit_is_page; /* the unit above: 1 a device page (vmm backends), 0 a segment */
    uint64_t unit_bytes;   /* the page's size on vmm backends; 0 for segments (of any size) */
    uint64_t reserved_bytes;  /* reserved right after the allocation that last raised the peak (== the peak) */
    uint64_t request_bytes;   /* that allocation's size as asked for */
    uint64_t num_allocs;      /* successful allocations since the pool was created, that one included */
    gp_peak_part small, large; /* requests up to small_size, and the rest */
    uint64_t unmapped_cached_bytes; /* vmm backends: pages kept unmapped for reuse */
    uint64_t parked_bytes;          /* vmm backends, loans: pages held for other streams' stitched blocks */
    /* small + large (each part) + unmapped_cached_bytes + parked_bytes == reserved_bytes */
} gp_peak_composition;

/* The composition at the last raise of reserved_bytes_peak (recorded 0 while none was recorded, or with
 * peak_composition off). Recording walks every block under every lock after each allocation that raises
 * the peak (growth is rare in steady state), so it is off by default; gpupool replay turns it on. */
GP_API int gp_get_peak_composition(gp_pool *pool, gp_peak_composition *out);

/*
 * Starts recording the pool's allocation events (alloc, free_requested, free_completed,
 * segment_alloc/segment_free on cudaMalloc backends, segment_map/segment_unmap per page on vmm ones,
 * oom), keeping the last `max_entries` (as torch.cuda.memory._record_memory_history(max_entries=...)).
 * 0 stops recording and forgets the events. Calling it again clears what was recorded.
 */
GP_API int gp_history_record(gp_pool *pool, size_t max_entries);

#define GP_SNAPSHOT_LIST 1u /* write the list of segments alone (torch.cuda.memory_snapshot()'s shape) */

/*
 * Writes a snapshot of `count` pools (one per device) to `path` as a pickle that PyTorch's memory
 * viewers read: by default the dict torch.cuda.memory._snapshot() returns in PyTorch 2.x ("segments"
 * with their blocks, "device_traces" from gp_history_record, one list per device), with
 * GP_SNAPSHOT_LIST the segment list alone (what PyTorch 1.x's torch.cuda._memory_viz reads). Every
 * segment, block and trace entry names its tenant in its frames ({"filename": "gpupool tenant",
 * "name": NAME}), so a viewer tells models apart. A paused tenant's ranges hold no memory and are left
 * out. On failure (a bad path, host memory out) the file is not left half-written.
 */
GP_API int gp_snapshot_write(gp_pool *const *pools, size_t count, const char *path, unsigned flags);

/*
 * Walks all of the pool's metadata and checks its invariants (blocks tile their segments, no two free
 * neighbours, allocated + cached == reserved, every live block findable, ...). GP_ERR_CORRUPT with a
 * message naming the first broken one. For tests and debugging: it takes every lock.
 */
GP_API int gp_check(gp_pool *pool);

/* The configuration keys, their defaults and meanings, one per line. */
GP_API const char *gp_config_help(void);

/* ---- CUDA graph capture (cuda and vmm backends) ----------------------------------------------- */
/*
 * Private memory pools per graph (the rules: pool/api/capture.c). Between gp_graph_pool_begin and
 * gp_graph_pool_end, allocations on a stream that captures a CUDA graph come from graph pool `id`
 * (created on its first begin; later captures into the same id share it), whose memory is never handed
 * out outside its graph. gp_graph_pool_release says the graphs using `id` are gone: the pool is
 * destroyed once its last block is freed. A capturing stream outside a window is refused with
 * GP_ERR_INVALID before any device call. One window at a time per pool.
 */
GP_API int gp_graph_pool_begin(gp_pool *pool, uint64_t id);
GP_API int gp_graph_pool_end(gp_pool *pool, uint64_t id);
GP_API int gp_graph_pool_release(gp_pool *pool, uint64_t id);

#ifdef __cplusplus
}
#endif
#endif /* GPUPOOL_H */
