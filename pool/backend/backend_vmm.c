/*
 * backend_vmm.c — the "vmm" backend: the "cuda" backend plus CUDA's virtual memory management
 * (cuMemCreate / cuMemAddressReserve / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemRelease /
 * cuMemAddressFree), so that the pool can reserve address space once and map and unmap physical
 * pages in it (expandable segments, stitching).
 *
 * The driver API is reached without linking libcuda, through the entry points vmm_driver.h resolves
 * once per process (the table bench/gpu/vmm_probe.c asks a GPU about). On a machine without a driver
 * (or with one older than GP_VMM_DRIVER_VERSION) open() fails with GP_ERR_BACKEND and says which
 * symbol could not be resolved and why; every later open() gives the same answer.
 *
 * Events, streams, mem_alloc/mem_free and mem_info are the "cuda" backend's (backend_cuda.h): the
 * context begins with a gp_cuda_ctx. Driver calls need a current context: every operation makes the
 * pool's device current with the runtime (gp_cuda_device_enter: cudaSetDevice makes the device's
 * primary context current; open() initialised it with cudaFree(NULL)) and restores the caller's after.
 *
 * Errors: every message names the driver call, its arguments and the driver's error name and string
 * (cuGetErrorName / cuGetErrorString). CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate and
 * cuMemAddressReserve is GP_ERR_OOM, every other failure GP_ERR_DEVICE. Driver calls do not touch the
 * runtime's per-thread last error, so there is nothing to clear after them.
 *
 * unmap(), unmap_run() and unmap_pages() do not synchronize: cuMemUnmap does not wait for work still
 * queued on the range (unlike cudaFree; PyTorch's expandable segments observe the same and synchronize
 * the segment's stream first), and a kernel that touches an address after it was unmapped faults with
 * a sticky error that ends the context. The pool waits first for what may still use the range
 * (provider/pages.c: the fence of the stream whose free memory it is, which is the work stream-ordered
 * reuse already relies on; else device_synchronize()), so that one model's unmap does not wait for
 * every other model's queued work.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/backend_cuda.h"
#include "backend/vmm_driver.h"
#include "base/error.h"
#include "base/format.h"

/* ---- the instance ------------------------------------------------------------------------------ */

typedef struct gp_vmm_ctx {
    gp_cuda_ctx cuda;   /* first: the gp_cuda_* operations take this context as theirs */
    const gp_vmm_driver *driver; /* the resolved entry points (vmm_driver.h) */
    size_t granularity; /* cuMemGetAllocationGranularity(MINIMUM) of the device's pinned memory */
} gp_vmm_ctx;

/* pre: device >= 0. post: *ctx serves `device` (primary context initialised, entry points resolved,
 * granularity known). GP_ERR_BACKEND when the driver, its VMM API or the device cannot be used. */
static int vmm_open(const struct gp_config *cfg, int device, void **out)
{
    (void)cfg;
    const char *why = "";
    const gp_vmm_driver *driver = gp_vmm_driver_get(&why);
    if (driver == NULL)
        return gp_error_set(GP_ERR_BACKEND,
                            "vmm backend unavailable: cannot resolve the CUDA driver's virtual memory API "
                            "through the runtime (is an NVIDIA driver installed?): %s",
                            why);

    gp_vmm_ctx probe;
    memset(&probe, 0, sizeof probe);
    probe.driver = driver;
    int rc = gp_cuda_open_device("vmm", device, &probe.cuda);
    if (rc != GP_OK)
        return rc;

    int prev = -1;
    rc = gp_cuda_device_enter(&probe.cuda, "open", &prev);
    if (rc != GP_OK) {
        gp_cuda_copies_close(&probe.cuda);
        gp_error_append(" (vmm backend unavailable for device %d)", device);
        return GP_ERR_BACKEND;
    }
    CUmemAllocationProp prop = gp_vmm_device_memory(device);
    size_t granularity = 0;
    CUresult res = driver->get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    gp_cuda_device_leave(&probe.cuda, prev);
    if (res != CUDA_SUCCESS || granularity == 0) {
        const char *name = "CUDA_SUCCESS", *text = "granularity 0";
        if (res != CUDA_SUCCESS)
            gp_vmm_driver_error(res, &name, &text);
        /* CUDA_ERROR_NOT_SUPPORTED: a device without virtual memory management */
        gp_cuda_copies_close(&probe.cuda);
        return gp_error_set(GP_ERR_BACKEND,
                            "vmm backend unavailable: cuMemGetAllocationGranularity(type=PINNED, "
                            "location=device %d, MINIMUM): %s: %s",
                            device, name, text);
    }
    probe.granularity = granularity;

    gp_vmm_ctx *ctx = malloc(sizeof *ctx);
    if (ctx == NULL) {
        gp_cuda_copies_close(&probe.cuda);
        return gp_error_set(GP_ERR_OOM, "vmm backend: out of host memory for its context (%zu bytes)",
                            sizeof *ctx);
    }
    *ctx = probe;
    *out = ctx;
    return GP_OK;
}

/* pre: the pool has unmapped and released everything. The primary context stays; the copy stream,
 * if a copy made one, is destroyed. */
static void vmm_close(void *ctx)
{
    gp_cuda_copies_close(ctx);
    free(ctx);
}

/* ---- virtual memory management ----------------------------------------------------------------- */

static int vmm_granularity(void *opaque, size_t *out)
{
    const gp_vmm_ctx *ctx = opaque;
    *out = ctx->granularity;
    return GP_OK;
}

/* Sets the thread's message to "CALL on device D: NAME: TEXT" for a driver call that returned `res`
 * (CALL formatted from fmt: the call and its arguments) and returns `code`. */
static int driver_failed(const gp_vmm_ctx *ctx, CUresult res, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int driver_failed(const gp_vmm_ctx *ctx, CUresult res, int code, const char *fmt, ...)
{
    char call[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);
    const char *name, *why;
    gp_vmm_driver_error(res, &name, &why);
    return gp_error_set(code, "%s on device %d: %s: %s", call, ctx->cuda.device, name, why);
}

/* Appends "; undoing it, cuMemUnmap(ptr=...) failed too: NAME: TEXT" when the undo of a failed map
 * could not unmap what it had mapped. */
static void note_failed_undo(CUresult undo, gp_devptr va, size_t size)
{
    if (undo == CUDA_SUCCESS)
        return;
    const char *name, *why;
    gp_vmm_driver_error(undo, &name, &why);
    gp_error_append("; undoing it, cuMemUnmap(ptr=0x%llx, size=%zu) failed too: %s: %s", (unsigned long long)va,
                    size, name, why);
}

/* cudaDeviceSynchronize on the pool's device: every queued kernel of every stream completes. */
static int vmm_device_synchronize(void *opaque)
{
    const gp_vmm_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "device_synchronize", &prev);
    if (rc != GP_OK)
        return rc;
    cudaError_t err = cudaDeviceSynchronize();
    gp_cuda_device_leave(&ctx->cuda, prev);
    if (err == cudaSuccess)
        return GP_OK;
    gp_cuda_clear_own_error(err);
    return gp_error_set(GP_ERR_DEVICE, "cudaDeviceSynchronize on device %d (before unmapping): %s: %s",
                        ctx->cuda.device, cudaGetErrorName(err), cudaGetErrorString(err));
}

/* pre: size a multiple of the granularity. post: *out aligned to the granularity. */
static int vmm_va_reserve(void *opaque, size_t size, gp_devptr *out)
{
    const gp_vmm_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "va_reserve", &prev);
    if (rc != GP_OK)
        return rc;
    CUdeviceptr va = 0;
    enum cudaStreamCaptureMode mode = gp_cuda_relax(); /* growth may happen while a graph is captured */
    CUresult res = ctx->driver->address_reserve(&va, size, ctx->granularity, 0, 0);
    gp_cuda_unrelax(mode);
    gp_cuda_device_leave(&ctx->cuda, prev);
    if (res != CUDA_SUCCESS)
        return driver_failed(ctx, res, res == CUDA_ERROR_OUT_OF_MEMORY ? GP_ERR_OOM : GP_ERR_DEVICE,
                             "cuMemAddressReserve(size=%zu (%s), alignment=%zu, addr=0, flags=0)", size,
                             gp_format_size(size, text), ctx->granularity);
    *out = (gp_devptr)va;
    return GP_OK;
}

/* pre: nothing mapped in [va, va+size), which va_reserve returned whole. */
static int vmm_va_release(void *opaque, gp_devptr va, size_t size)
{
    const gp_vmm_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "va_release", &prev);
    if (rc != GP_OK)
        return rc;
    CUresult res = ctx->driver->address_free((CUdeviceptr)va, size);
    gp_cuda_device_leave(&ctx->cuda, prev);
    if (res != CUDA_SUCCESS)
        return driver_failed(ctx, res, GP_ERR_DEVICE, "cuMemAddressFree(ptr=0x%llx, size=%zu (%s))",
                             (unsigned long long)va, size, gp_format_size(size, text));
    return GP_OK;
}

/* pre: size a multiple of the granularity. GP_ERR_OOM when the device lacks the memory. */
static int vmm_phys_create(void *opaque, size_t size, gp_phys *out)
{
    const gp_vmm_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "phys_create", &prev);
    if (rc != GP_OK)
        return rc;
    CUmemAllocationProp prop = gp_vmm_device_memory(ctx->cuda.device);
    CUmemGenericAllocationHandle handle = 0;
    enum cudaStreamCaptureMode mode = gp_cuda_relax();
    CUresult res = ctx->driver->create(&handle, size, &prop, 0);
    gp_cuda_unrelax(mode);
    gp_cuda_device_leave(&ctx->cuda, prev);
    if (res != CUDA_SUCCESS)
        return driver_failed(ctx, res, res == CUDA_ERROR_OUT_OF_MEMORY ? GP_ERR_OOM : GP_ERR_DEVICE,
                             "cuMemCreate(size=%zu (%s), type=PINNED, location=device %d, flags=0)", size,
                             gp_format_size(size, text), ctx->cuda.device);
    *out = (gp_phys)handle;
    return GP_OK;
}

/* pre: the handle is mapped nowhere (then cuMemRelease frees the memory at once). */
static int vmm_phys_release(void *opaque, gp_phys handle)
{
    const gp_vmm_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "phys_release", &prev);
    if (rc != GP_OK)
        return rc;
    CUresult res = ctx->driver->release((CUmemGenericAllocationHandle)handle);
    gp_cuda_device_leave(&ctx->cuda, prev);
    if (res != CUDA_SUCCESS)
        return driver_failed(ctx, res, GP_ERR_DEVICE, "cuMemRelease(handle=0x%llx)", (unsigned long long)handle);
    return GP_OK;
}

/* pre: [va, va+size) reserved and unmapped; size the handle's. post: readable and writable by the
 * pool's device. On failure nothing stays mapped. */
static int vmm_map(void *opaque, gp_devptr va, size_t size, gp_phys handle)
{
    const gp_vmm_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "map", &prev);
    if (rc != GP_OK)
        return rc;
    enum cudaStreamCaptureMode mode = gp_cuda_relax(); /* growth may happen while a graph is captured */
    CUresult res = ctx->driver->map((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)handle, 0);
    if (res == CUDA_SUCCESS) {
        CUresult access = gp_vmm_set_device_access((CUdeviceptr)va, size, ctx->cuda.device);
        if (access != CUDA_SUCCESS) {
            /* undo: a mapping nobody may access must not stay behind */
            CUresult undo = ctx->driver->unmap((CUdeviceptr)va, size);
            rc = driver_failed(ctx, access, GP_ERR_DEVICE,
                               "cuMemSetAccess(ptr=0x%llx, size=%zu (%s), PROT_READWRITE) after "
                               "cuMemMap(handle=0x%llx)",
                               (unsigned long long)va, size, gp_format_size(size, text), (unsigned long long)handle);
            note_failed_undo(undo, va, size);
        }
    } else {
        rc = driver_failed(ctx, res, GP_ERR_DEVICE,
                           "cuMemMap(ptr=0x%llx, size=%zu (%s), offset=0, handle=0x%llx, flags=0)",
                           (unsigned long long)va, size, gp_format_size(size, text), (unsigned long long)handle);
    }
    gp_cuda_unrelax(mode);
    gp_cuda_device_leave(&ctx->cuda, prev);
    return rc;
}

/* pre: [va, va+size) is exactly one mapping made by vmm_map, and no queued work uses it any more (see
 * the file's header: cuMemUnmap does not wait for it). */
static int vmm_unmap(void *opaque, gp_devptr va, size_t size)
{
    const gp_vmm_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "unmap", &prev);
    if (rc != GP_OK)
        return rc;
    CUresult res = ctx->driver->unmap((CUdeviceptr)va, size);
    gp_cuda_device_leave(&ctx->cuda, prev);
    if (res != CUDA_SUCCESS)
        return driver_failed(ctx, res, GP_ERR_DEVICE, "cuMemUnmap(ptr=0x%llx, size=%zu (%s))", (unsigned long long)va,
                             size, gp_format_size(size, text));
    return GP_OK;
}

/* pre: as vmm_map for each of the n handles at va + i * page. Maps them one by one, then sets access once
 * over the whole run (cuMemSetAccess takes any range of whole mappings). All or nothing. */
static int vmm_map_run(void *opaque, gp_devptr va, size_t page, const gp_phys *handles, size_t n)
{
    const gp_vmm_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, "map_run", &prev);
    if (rc != GP_OK)
        return rc;
    enum cudaStreamCaptureMode mode = gp_cuda_relax(); /* growth may happen while a graph is captured */
    size_t done = 0;
    CUresult res = CUDA_SUCCESS;
    for (; done < n; done++) {
        res = ctx->driver->map((CUdeviceptr)va + (CUdeviceptr)done * page, page, 0,
                         (CUmemGenericAllocationHandle)handles[done], 0);
        if (res != CUDA_SUCCESS)
            break;
    }
    const char *what = "cuMemMap";
    if (res == CUDA_SUCCESS) {
        res = gp_vmm_set_device_access((CUdeviceptr)va, n * page, ctx->cuda.device);
        what = "cuMemSetAccess";
    }
    if (res != CUDA_SUCCESS) {
        rc = driver_failed(ctx, res, GP_ERR_DEVICE, "%s in a run of %zu pages at 0x%llx (%s each), page %zu", what, n,
                           (unsigned long long)va, gp_format_size(page, text), done);
        for (size_t i = 0; i < done; i++) { /* undo: no mapping nobody may access stays behind */
            gp_devptr at = va + i * page;
            note_failed_undo(ctx->driver->unmap((CUdeviceptr)at, page), at, page);
        }
    }
    gp_cuda_unrelax(mode);
    gp_cuda_device_leave(&ctx->cuda, prev);
    return rc;
}

/* One cuMemUnmap per mapping of `page` bytes, at vas[i] (or va + i * page when vas is NULL), stopping
 * at a failure: vmm_unmap_run and vmm_unmap_pages. pre: each is one mapping made by vmm_map or
 * vmm_map_run, and no queued work uses it any more (the file's header). */
static int unmap_each(const gp_vmm_ctx *ctx, const gp_devptr *vas, gp_devptr va, size_t page, size_t n, size_t *done,
                      const char *what)
{
    char text[GP_SIZE_TEXT_MAX];
    *done = 0;
    int prev = -1;
    int rc = gp_cuda_device_enter(&ctx->cuda, what, &prev);
    if (rc != GP_OK)
        return rc;
    for (; *done < n; (*done)++) {
        gp_devptr at = vas != NULL ? vas[*done] : va + *done * page;
        CUresult res = ctx->driver->unmap((CUdeviceptr)at, page);
        if (res != CUDA_SUCCESS) {
            gp_cuda_device_leave(&ctx->cuda, prev);
            return driver_failed(ctx, res, GP_ERR_DEVICE, "cuMemUnmap(ptr=0x%llx, size=%zu (%s))",
                                 (unsigned long long)at, page, gp_format_size(page, text));
        }
    }
    gp_cuda_device_leave(&ctx->cuda, prev);
    return GP_OK;
}

/* pre: [va, va + n * page) is n mappings made by vmm_map or vmm_map_run that no queued work uses. One
 * cuMemUnmap per mapping, stopping at a failure. */
static int vmm_unmap_run(void *opaque, gp_devptr va, size_t page, size_t n, size_t *done)
{
    return unmap_each(opaque, NULL, va, page, n, done, "unmap_run");
}

/* pre: n >= 1 mappings made by vmm_map or vmm_map_run at vas[0..n), anywhere. As vmm_unmap_run. */
static int vmm_unmap_pages(void *opaque, const gp_devptr *vas, size_t page, size_t n, size_t *done)
{
    return unmap_each(opaque, vas, 0, page, n, done, "unmap_pages");
}

const gp_backend_ops gp_backend_vmm = {
    .name = "vmm",
    .caps = GP_BACKEND_VMM,
    .open = vmm_open,
    .close = vmm_close,
    .mem_alloc = gp_cuda_mem_alloc,
    .mem_free = gp_cuda_mem_free,
    .mem_info = gp_cuda_mem_info,
    .device_uuid = gp_cuda_device_uuid,
    .event_create = gp_cuda_event_create,
    .event_destroy = gp_cuda_event_destroy,
    .event_record = gp_cuda_event_record,
    .event_query = gp_cuda_event_query,
    .event_synchronize = gp_cuda_event_synchronize,
    .stream_wait_event = gp_cuda_stream_wait_event,
    .stream_capturing = gp_cuda_stream_capturing,
    .vm_granularity = vmm_granularity,
    .va_reserve = vmm_va_reserve,
    .va_release = vmm_va_release,
    .phys_create = vmm_phys_create,
    .phys_release = vmm_phys_release,
    .map = vmm_map,
    .device_synchronize = vmm_device_synchronize,
    .unmap = vmm_unmap,
    .map_run = vmm_map_run,
    .unmap_run = vmm_unmap_run,
    .unmap_pages = vmm_unmap_pages,
    .copy_to_host = gp_cuda_copy_to_host,
    .copy_to_device = gp_cuda_copy_to_device,
    .host_alloc = gp_cuda_host_alloc,
    .host_free = gp_cuda_host_free,
};
