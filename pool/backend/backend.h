/*
 * backend.h — the one narrow interface through which gpupool talks to a device.
 *
 * Nothing else in pool/ calls CUDA (or the simulator) directly. A backend is a table of operations
 * over an opaque context; there is one implementation per file: backend/backend_cuda.c ("cuda",
 * cudaMalloc through the CUDA runtime), backend/backend_vmm.c ("vmm", the driver's virtual memory API),
 * and sim/backend_sim.c ("sim" and "sim-vmm", the simulated GPU of tests and replay). The pool never
 * names a backend: what it needs to know about one (virtual memory or not, simulated or not) is in
 * `caps`, and its clock is the `now` operation. The pool serialises no calls on its own behalf: every
 * operation must be safe to call from any thread at any time.
 *
 * Conventions for every operation:
 *   - returns GP_OK (0) on success, a negative gp_error code otherwise; on failure it changes nothing
 *     and sets the thread's message with gp_error_set() saying which device call failed and why;
 *   - out-parameters are written only on success;
 *   - handles (gp_event, gp_stream) are opaque to the pool.
 */
#ifndef GP_BACKEND_H
#define GP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"

struct gp_config;

typedef uintptr_t gp_devptr; /* a device address; never dereferenced on the host */
typedef void *gp_event;      /* cudaEvent_t with the cuda backend */
typedef uint64_t gp_phys;    /* physical memory (CUmemGenericAllocationHandle with the vmm backend) */
#define GP_PHYS_NONE UINT64_MAX /* no handle (a page of a paused range) */

/* Capabilities (gp_backend_ops.caps). */
#define GP_BACKEND_VMM 1u       /* implements the virtual memory operations (va_reserve ... unmap) */
#define GP_BACKEND_SIMULATED 2u /* a simulated device: `instance` returns its gp_sim (gpupool_sim.h) */

typedef struct gp_backend_ops {
    const char *name;
    unsigned caps; /* GP_BACKEND_* */

    /* The device's clock in ns, for ageing cached memory (idle_release); NULL: CLOCK_MONOTONIC. The
     * simulated GPU returns its virtual time, so that tests and replays age memory without sleeping. */
    uint64_t (*now)(void *ctx);

    /* With GP_BACKEND_SIMULATED: the object behind the context that gpupool_sim.h's calls take
     * (gp_sim_of returns it). NULL otherwise. */
    void *(*instance)(void *ctx);

    /* Opens the backend for `device`.
     * pre: cfg parsed and valid; device >= 0.
     * post: *ctx is an instance that close() releases; GP_ERR_BACKEND when the backend cannot run
     * here (no driver, no such device). */
    int (*open)(const struct gp_config *cfg, int device, void **ctx);

    /* Releases the instance. pre: every allocation freed and every event destroyed by the pool
     * (the sim records anything still outstanding as a leak). */
    void (*close)(void *ctx);

    /* Allocates `size` bytes of device memory.
     * pre: size > 0 and a multiple of 2 MiB (the pool only asks for whole device pages).
     * post: *out is 512-byte aligned (the sim aligns to 2 MiB); GP_ERR_OOM when the device lacks the
     * memory, GP_ERR_DEVICE on any other failure. */
    int (*mem_alloc)(void *ctx, size_t size, gp_devptr *out);

    /* Frees memory returned by mem_alloc. Implicitly waits for all device work that may still use it
     * (as cudaFree does). pre: ptr/size exactly as allocated. */
    int (*mem_free)(void *ctx, gp_devptr ptr, size_t size);

    /* Free and total device memory, as cudaMemGetInfo reports them. */
    int (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);

    /* The device's UUID (cudaDeviceProp.uuid): one per physical GPU or MIG instance, the same in every
     * process whatever index CUDA_VISIBLE_DEVICES gives the device there. NULL in a backend whose
     * device has none (the sims: each process's simulated GPU is its own). */
    int (*device_uuid)(void *ctx, unsigned char uuid[16]);

    /* Creates an event used only for ordering (no timing). post: *out valid until event_destroy. */
    int (*event_create)(void *ctx, gp_event *out);
    int (*event_destroy)(void *ctx, gp_event ev);

    /* Records `ev` on `stream`: it completes once all work queued on stream so far has finished. */
    int (*event_record)(void *ctx, gp_event ev, gp_stream stream);

    /* GP_OK when the event's last record has completed (or it was never recorded),
     * GP_ERR_NOT_READY while it has not, another error on failure. Never blocks. */
    int (*event_query)(void *ctx, gp_event ev);

    /* Blocks the host until the event's last record completes. Not used on the allocation fast path. */
    int (*event_synchronize)(void *ctx, gp_event ev);

    /* Makes all work queued on `stream` after this call wait for the event's last record. Never blocks
     * the host. */
    int (*stream_wait_event)(void *ctx, gp_stream stream, gp_event ev);

    /* Whether `stream` is capturing a CUDA graph now (cudaStreamIsCapturing): *capturing = 1 when it
     * is (or when the legacy stream is unusable because a blocking stream captures), else 0. NULL in
     * a backend whose streams never capture (the sims). While a stream captures, most device calls
     * are illegal or would be recorded into the graph, so the pool refuses to serve it. */
    int (*stream_capturing)(void *ctx, gp_stream stream, int *capturing);

    /* ---- virtual memory management (CUDA's cuMem* API); all NULL in a backend without it ----------
     * Physical memory comes in handles of whole pages of the device's granularity; a handle is mapped
     * whole (CUDA requires offset 0) at a virtual address inside a reserved range; one handle may be
     * mapped at several addresses at once (stitching relies on this). */

    /* The page size of physical memory and mappings (cuMemGetAllocationGranularity, minimum; 2 MiB on
     * current GPUs). */
    int (*vm_granularity)(void *ctx, size_t *out);

    /* Reserves `size` bytes of virtual address space (a multiple of the granularity), aligned to the
     * granularity; nothing is mapped. GP_ERR_OOM when the address space is exhausted. */
    int (*va_reserve)(void *ctx, size_t size, gp_devptr *out);
    /* Frees a reservation. pre: nothing mapped in it. */
    int (*va_release)(void *ctx, gp_devptr va, size_t size);

    /* Creates `size` bytes of physical memory (a multiple of the granularity) on the pool's device.
     * GP_ERR_OOM when the device lacks the memory. */
    int (*phys_create)(void *ctx, size_t size, gp_phys *out);
    /* Releases a handle. pre: mapped nowhere. */
    int (*phys_release)(void *ctx, gp_phys handle);

    /* Maps the whole handle (of `size` bytes) at va and makes it readable and writable by the pool's
     * device (cuMemMap + cuMemSetAccess). pre: [va, va+size) reserved and unmapped. On failure nothing
     * stays mapped. */
    int (*map)(void *ctx, gp_devptr va, size_t size, gp_phys handle);
    /* Blocks the host until all work queued on the device, every stream's, has completed
     * (cudaDeviceSynchronize). Before unmapping what the pool cannot tie to a stream's fence. */
    int (*device_synchronize)(void *ctx);
    /* Unmaps [va, va+size), which must be exactly one mapping made by map(). Does not wait for device
     * work (cuMemUnmap does not): pre, no queued or running work uses the range any more. The pool
     * waits first for the stream whose free memory it unmaps (its fence, provider/pages.c) or
     * synchronizes the device; a kernel that touched the range afterwards would fault. */
    int (*unmap)(void *ctx, gp_devptr va, size_t size);
    /* Optional (NULL: the pool maps page by page). Maps n handles of `page` bytes each at va, va + page,
     * ... and makes the whole run readable and writable with one access call (cuMemMap per handle, then
     * one cuMemSetAccess over the run). pre: as map() for every page. All or nothing: on failure nothing
     * of the run stays mapped. */
    int (*map_run)(void *ctx, gp_devptr va, size_t page, const gp_phys *handles, size_t n);
    /* Optional (NULL: page by page). Unmaps the n consecutive mappings of `page` bytes from va (pre as
     * unmap for each). Stops at the first failure; *done receives the mappings unmapped (the first
     * *done), the rest stay mapped. */
    int (*unmap_run)(void *ctx, gp_devptr va, size_t page, size_t n, size_t *done);
    /* Optional (NULL: one unmap_run per run of consecutive addresses). As unmap_run for n mappings of
     * `page` bytes at vas[0..n), anywhere and in any order (pages of several ranges, slots of a stitched
     * range that are not next to each other). Stops at the first failure; *done receives the mappings
     * unmapped (the first *done), the rest stay mapped. */
    int (*unmap_pages)(void *ctx, const gp_devptr *vas, size_t page, size_t n, size_t *done);

    /* ---- copies and pinned host memory (pausing tenants with their contents) --------------------- */

    /* Copies device memory to the host or back, synchronously (done on return), waiting for no other
     * device work: the cuda backends copy on a non-blocking stream of their own. pre: the device range
     * is mapped / allocated, and no queued work uses it any more (the pool drains the streams that
     * use it first, api/pause.c); a kernel still using it would race the copy. */
    int (*copy_to_host)(void *ctx, void *host, gp_devptr src, size_t size);
    int (*copy_to_device)(void *ctx, gp_devptr dst, const void *host, size_t size);
    /* Page-locked host memory (cudaHostAlloc; plain pages on the sim): for the staging arena's extents. */
    int (*host_alloc)(void *ctx, size_t size, void **out);
    int (*host_free)(void *ctx, void *ptr, size_t size);
} gp_backend_ops;

/* True when the backend implements the virtual memory operations. */
static inline int gp_backend_has_vmm(const gp_backend_ops *ops)
{
    return (ops->caps & GP_BACKEND_VMM) != 0;
}

/* The backend's clock in ns (its `now`, else CLOCK_MONOTONIC). */
uint64_t gp_backend_now(const gp_backend_ops *ops, void *ctx);

/* The backends built into this library, for the registry (backend_registry.c) and the backend tests
 * only: "sim" and "sim-vmm" (the simulated GPU without and with virtual memory management, sim/),
 * "cuda" (cudaMalloc) and "vmm" (the CUDA driver's virtual memory API). */
extern const gp_backend_ops gp_backend_sim;
extern const gp_backend_ops gp_backend_sim_vmm;
#ifdef GPUPOOL_WITH_CUDA
extern const gp_backend_ops gp_backend_cuda;
extern const gp_backend_ops gp_backend_vmm;
#endif

/* Finds a built-in backend by name; NULL (with the thread's message set) when there is none. */
const gp_backend_ops *gp_backend_find(const char *name);

#endif /* GP_BACKEND_H */
