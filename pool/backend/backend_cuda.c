/*
 * backend_cuda.c — the "cuda" backend: backend.h implemented with the CUDA runtime API only.
 *
 * The library links the runtime statically (cudart_static), which opens the driver (libcuda.so) at
 * run time. On a machine without a driver the library still loads; open() then fails with
 * GP_ERR_BACKEND ("... cudaErrorInsufficientDriver ..."). Driver API entry points are not used here.
 *
 * Threads: any thread may call any operation. The current device is per host thread in CUDA, so every
 * operation makes the pool's device current for its duration and restores the caller's device after
 * (device_enter / device_leave); the set is skipped when the device is already current, which is the
 * common case and costs one cudaGetDevice, except on a thread's first call (a thread that never called
 * cudaSetDevice has no current context, which driver calls need). The context is immutable after
 * open(), so no lock is needed, except around the copy stream it points to (gp_cuda_copies).
 *
 * Errors: each failure message names the runtime call, its arguments (size, pointer, stream, event)
 * and the runtime's cudaGetErrorName / cudaGetErrorString. A non-sticky error this file caused is
 * cleared from the runtime's per-thread last error (cudaGetLastError) so that it does not surface
 * later in the application's own error checks; an error the application already had pending is left
 * alone. cudaErrorMemoryAllocation from cudaMalloc is GP_ERR_OOM, every other failure GP_ERR_DEVICE.
 *
 * Streams: a gp_stream is a cudaStream_t; NULL is the default stream of the pool's device (the legacy
 * default stream, or the per-thread one when the application is built with
 * --default-stream per-thread and passes cudaStreamPerThread explicitly).
 *
 * The operations are shared with the "vmm" backend (backend_vmm.c) through backend_cuda.h: they take
 * any context that begins with a gp_cuda_ctx.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/backend_cuda.h"
#include "base/error.h"
#include "base/format.h"

/* The pool's copy stream (see gp_cuda_copies_close, below). */
struct gp_cuda_copies {
    pthread_mutex_t lock; /* over `stream`: made once, used by one copy at a time */
    cudaStream_t stream;  /* NULL until the first copy */
};

/* cudaMalloc guarantees at least 256 bytes; the pool promises its callers 512. */
#define GP_CUDA_ALIGNMENT 512u

/* Clears `err` from the calling thread's runtime error state when it is the pending one (i.e. this
 * file caused it and it is not sticky; sticky errors cannot be cleared and stay visible). */
void gp_cuda_clear_own_error(cudaError_t err)
{
    if (err != cudaSuccess && cudaPeekAtLastError() == err)
        (void)cudaGetLastError();
}

enum cudaStreamCaptureMode gp_cuda_relax(void)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaStreamCaptureModeRelaxed; /* nothing was changed: nothing to give back */
    }
    return mode;
}

void gp_cuda_unrelax(enum cudaStreamCaptureMode previous)
{
    if (previous != cudaStreamCaptureModeRelaxed && cudaThreadExchangeStreamCaptureMode(&previous) != cudaSuccess)
        (void)cudaGetLastError();
}

/* Makes ctx's device current for the calling thread. *prev receives the device that was current, for
 * device_leave. On failure sets the message (naming `op`, the operation being attempted) and returns
 * GP_ERR_DEVICE; nothing needs undoing. */
int gp_cuda_device_enter(const gp_cuda_ctx *ctx, const char *op, int *prev)
{
    int current = -1;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess) {
        gp_cuda_clear_own_error(err);
        return gp_error_set(GP_ERR_DEVICE, "%s %s: cudaGetDevice: %s: %s", ctx->name, op,
                            cudaGetErrorName(err), cudaGetErrorString(err));
    }
    /* CUDA binds a device's primary context to a thread only when the runtime initialises the device
     * for it (cudaSetDevice does; cudaGetDevice, which answers 0 on a fresh thread, does not), and the
     * vmm backend's driver calls need that context: the first call on each thread sets the device
     * even when it is already the current one. */
    static _Thread_local bool thread_has_context;
    if (current != ctx->device || !thread_has_context) {
        err = cudaSetDevice(ctx->device);
        if (err != cudaSuccess) {
            gp_cuda_clear_own_error(err);
            return gp_error_set(GP_ERR_DEVICE, "%s %s: cudaSetDevice(device=%d): %s: %s", ctx->name, op,
                                ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
        }
        thread_has_context = true;
    }
    *prev = current;
    return GP_OK;
}

/* Restores the device device_enter found current. It was a valid device a moment ago, so this cannot
 * fail in practice; if it does, the operation's own result stands and the error is cleared. */
void gp_cuda_device_leave(const gp_cuda_ctx *ctx, int prev)
{
    if (prev != ctx->device) {
        cudaError_t err = cudaSetDevice(prev);
        gp_cuda_clear_own_error(err);
    }
}

/* pre: device >= 0. post: on GP_OK *out serves `device`, whose primary context is initialised (so
 * that a device that cannot be used fails here rather than in the first mem_alloc). */
int gp_cuda_open_device(const char *name, int device, gp_cuda_ctx *out)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        /* cudaErrorInsufficientDriver (no driver or an old one), cudaErrorNoDevice, ... */
        gp_cuda_clear_own_error(err);
        return gp_error_set(GP_ERR_BACKEND, "%s backend unavailable: cudaGetDeviceCount: %s: %s", name,
                            cudaGetErrorName(err), cudaGetErrorString(err));
    }
    if (device < 0 || device >= count) {
        return gp_error_set(GP_ERR_BACKEND,
                            "%s backend unavailable: device %d out of range: cudaGetDeviceCount "
                            "reports %d device%s (valid: 0..%d)",
                            name, device, count, count == 1 ? "" : "s", count - 1);
    }

    gp_cuda_ctx probe = {.device = device, .name = name};
    int prev = -1;
    int rc = gp_cuda_device_enter(&probe, "open", &prev);
    if (rc != GP_OK) {
        gp_error_append(" (%s backend unavailable for device %d)", name, device);
        return GP_ERR_BACKEND;
    }
    /* cudaFree(NULL) initialises the device's primary context if nothing has yet, surfacing
     * cudaErrorDevicesUnavailable (exclusive or prohibited compute mode) and the like here. */
    err = cudaFree(NULL);
    gp_cuda_device_leave(&probe, prev);
    if (err != cudaSuccess) {
        gp_cuda_clear_own_error(err);
        return gp_error_set(GP_ERR_BACKEND,
                            "%s backend unavailable: cudaFree(NULL) to initialise device %d: %s: %s",
                            name, device, cudaGetErrorName(err), cudaGetErrorString(err));
    }
    probe.copies = calloc(1, sizeof *probe.copies);
    if (probe.copies == NULL)
        return gp_error_set(GP_ERR_OOM, "%s backend: out of host memory for its copy stream's state", name);
    pthread_mutex_init(&probe.copies->lock, NULL);
    *out = probe;
    return GP_OK;
}

static int cuda_open(const struct gp_config *cfg, int device, void **out)
{
    (void)cfg;
    gp_cuda_ctx probe;
    int rc = gp_cuda_open_device("cuda", device, &probe);
    if (rc != GP_OK)
        return rc;
    gp_cuda_ctx *ctx = malloc(sizeof *ctx);
    if (ctx == NULL) {
        gp_cuda_copies_close(&probe);
        return gp_error_set(GP_ERR_OOM, "cuda backend: out of host memory for its context (%zu bytes)",
                            sizeof *ctx);
    }
    *ctx = probe;
    *out = ctx;
    return GP_OK;
}

/* pre: the pool has freed every allocation and destroyed every event. Nothing is called on the
 * device but the copy stream's destroy (when a copy made one): the primary context stays for the
 * application (and for other pools on the device). */
static void cuda_close(void *ctx)
{
    gp_cuda_copies_close(ctx);
    free(ctx);
}

/* pre: size > 0, a multiple of 2 MiB. post: *out 512-byte aligned.
 * GP_ERR_OOM for cudaErrorMemoryAllocation (the pool may then release cached memory and retry). */
int gp_cuda_mem_alloc(void *opaque, size_t size, gp_devptr *out)
{
    const gp_cuda_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "mem_alloc", &prev);
    if (rc != GP_OK)
        return rc;

    void *ptr = NULL;
    enum cudaStreamCaptureMode mode = gp_cuda_relax(); /* the pool may grow while a graph is captured */
    cudaError_t err = cudaMalloc(&ptr, size);
    gp_cuda_unrelax(mode);
    if (err != cudaSuccess) {
        gp_cuda_clear_own_error(err);
        gp_cuda_device_leave(ctx, prev);
        return gp_error_set(err == cudaErrorMemoryAllocation ? GP_ERR_OOM : GP_ERR_DEVICE,
                            "cudaMalloc(size=%zu (%s)) on device %d: %s: %s", size,
                            gp_format_size(size, text), ctx->device, cudaGetErrorName(err),
                            cudaGetErrorString(err));
    }
    if ((uintptr_t)ptr % GP_CUDA_ALIGNMENT != 0) {
        /* Never seen in practice (large cudaMalloc allocations are page aligned); give it back
         * rather than break the pool's alignment promise. */
        err = cudaFree(ptr);
        gp_cuda_clear_own_error(err);
        gp_cuda_device_leave(ctx, prev);
        return gp_error_set(GP_ERR_DEVICE,
                            "cudaMalloc(size=%zu (%s)) on device %d returned %p, not %u-byte aligned",
                            size, gp_format_size(size, text), ctx->device, ptr, GP_CUDA_ALIGNMENT);
    }
    gp_cuda_device_leave(ctx, prev);
    *out = (gp_devptr)ptr;
    return GP_OK;
}

/* pre: ptr and size exactly as mem_alloc returned them. cudaFree synchronises with the device
 * before releasing, so work still using the memory completes first. */
int gp_cuda_mem_free(void *opaque, gp_devptr ptr, size_t size)
{
    const gp_cuda_ctx *ctx = opaque;
    char text[GP_SIZE_TEXT_MAX];
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "mem_free", &prev);
    if (rc != GP_OK)
        return rc;

    cudaError_t err = cudaFree((void *)ptr);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaFree(ptr=%p, size=%zu (%s)) on device %d: %s: %s",
                            (void *)ptr, size, gp_format_size(size, text), ctx->device,
                            cudaGetErrorName(err), cudaGetErrorString(err));
    return GP_OK;
}

int gp_cuda_mem_info(void *opaque, size_t *free_bytes, size_t *total_bytes)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "mem_info", &prev);
    if (rc != GP_OK)
        return rc;

    size_t free_now = 0, total = 0;
    cudaError_t err = cudaMemGetInfo(&free_now, &total);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaMemGetInfo on device %d: %s: %s", ctx->device,
                            cudaGetErrorName(err), cudaGetErrorString(err));
    *free_bytes = free_now;
    *total_bytes = total;
    return GP_OK;
}

/* post: *out is an event of the pool's device, without timing (cheaper to record and query). */
int gp_cuda_event_create(void *opaque, gp_event *out)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "event_create", &prev);
    if (rc != GP_OK)
        return rc;

    cudaEvent_t ev = NULL;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE,
                            "cudaEventCreateWithFlags(cudaEventDisableTiming) on device %d: %s: %s",
                            ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
    *out = (gp_event)ev;
    return GP_OK;
}

/* pre: ev from event_create. A recorded event that has not completed may be destroyed: CUDA releases
 * it once it completes. */
int gp_cuda_event_destroy(void *opaque, gp_event ev)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "event_destroy", &prev);
    if (rc != GP_OK)
        return rc;

    cudaError_t err = cudaEventDestroy((cudaEvent_t)ev);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaEventDestroy(event=%p) on device %d: %s: %s", ev,
                            ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
    return GP_OK;
}

/* pre: stream belongs to the pool's device (NULL: that device's default stream, which is why the
 * device must be current here). */
int gp_cuda_event_record(void *opaque, gp_event ev, gp_stream stream)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "event_record", &prev);
    if (rc != GP_OK)
        return rc;

    cudaError_t err = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE,
                            "cudaEventRecord(event=%p, stream=%p) on device %d: %s: %s", ev, stream,
                            ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
    return GP_OK;
}

/* GP_OK: completed (or never recorded); GP_ERR_NOT_READY: still pending, not an error, no message.
 * Never blocks. */
int gp_cuda_event_query(void *opaque, gp_event ev)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "event_query", &prev);
    if (rc != GP_OK)
        return rc;

    cudaError_t err = cudaEventQuery((cudaEvent_t)ev);
    gp_cuda_clear_own_error(err); /* cudaErrorNotReady would otherwise linger as the thread's last error */
    gp_cuda_device_leave(ctx, prev);
    if (err == cudaSuccess)
        return GP_OK;
    if (err == cudaErrorNotReady)
        return GP_ERR_NOT_READY;
    return gp_error_set(GP_ERR_DEVICE, "cudaEventQuery(event=%p) on device %d: %s: %s", ev,
                        ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
}

/* Blocks the calling host thread until the event's last record has completed. */
int gp_cuda_event_synchronize(void *opaque, gp_event ev)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "event_synchronize", &prev);
    if (rc != GP_OK)
        return rc;

    cudaError_t err = cudaEventSynchronize((cudaEvent_t)ev);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaEventSynchronize(event=%p) on device %d: %s: %s", ev,
                            ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
    return GP_OK;
}

/* Work queued on `stream` after this call waits for the event's last record; the host does not wait.
 * pre: as for event_record (NULL is the pool device's default stream). */
int gp_cuda_stream_wait_event(void *opaque, gp_stream stream, gp_event ev)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "stream_wait_event", &prev);
    if (rc != GP_OK)
        return rc;

    cudaError_t err = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE,
                            "cudaStreamWaitEvent(stream=%p, event=%p, flags=0) on device %d: %s: %s",
                            stream, ev, ctx->device, cudaGetErrorName(err),
                            cudaGetErrorString(err));
    return GP_OK;
}

/* cudaStreamIsCapturing (its signature is the same in CUDA 11 to 13, unlike cudaStreamGetCaptureInfo's).
 * cudaErrorStreamCaptureImplicit: the legacy stream while a blocking stream captures, which may not be
 * used either; it counts as capturing (the error is cleared, the capture is not invalidated). */
int gp_cuda_stream_capturing(void *opaque, gp_stream stream, int *capturing)
{
    const gp_cuda_ctx *ctx = opaque;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, "stream_capturing", &prev);
    if (rc != GP_OK)
        return rc;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing((cudaStream_t)stream, &status);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err == cudaErrorStreamCaptureImplicit) {
        *capturing = 1;
        return GP_OK;
    }
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaStreamIsCapturing(stream=%p) on device %d: %s: %s", stream,
                            ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
    *capturing = status != cudaStreamCaptureStatusNone;
    return GP_OK;
}

/*
 * The pool's copies (staging a paused tenant's contents, api/pause.c) run on a stream of their own,
 * created non-blocking: a cudaMemcpy on the legacy default stream would wait for the work of every
 * blocking stream, that is every model's that runs on the default stream, and the pool waits instead
 * for the tenant's own streams before it copies (backend.h). Each copy is synchronous on the host
 * (cudaMemcpyAsync, then cudaStreamSynchronize of that stream only), so that its bytes are in place
 * when it returns and the staging buffer may be reused or freed. (struct gp_cuda_copies: above.)
 */
void gp_cuda_copies_close(gp_cuda_ctx *ctx)
{
    if (ctx->copies == NULL)
        return;
    if (ctx->copies->stream != NULL) {
        int prev = -1;
        if (gp_cuda_device_enter(ctx, "close", &prev) == GP_OK) {
            gp_cuda_clear_own_error(cudaStreamDestroy(ctx->copies->stream));
            gp_cuda_device_leave(ctx, prev);
        }
    }
    pthread_mutex_destroy(&ctx->copies->lock);
    free(ctx->copies);
    ctx->copies = NULL;
}

/* One copy of `size` bytes on the copy stream (ctx's device current, copies locked): its call failed
 * or the copy completed. *call names the call that failed. */
static cudaError_t copy_locked(struct gp_cuda_copies *c, void *dst, const void *src, size_t size,
                               enum cudaMemcpyKind kind, const char **call)
{
    cudaError_t err = cudaSuccess;
    *call = "cudaStreamCreateWithFlags(cudaStreamNonBlocking)";
    if (c->stream == NULL) {
        cudaStream_t made = NULL;
        err = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
        if (err == cudaSuccess)
            c->stream = made;
    }
    if (err == cudaSuccess) {
        *call = "cudaMemcpyAsync";
        err = cudaMemcpyAsync(dst, src, size, kind, c->stream);
    }
    if (err == cudaSuccess) {
        *call = "cudaStreamSynchronize";
        err = cudaStreamSynchronize(c->stream);
    }
    return err;
}

static int copy(gp_cuda_ctx *ctx, void *dst, const void *src, size_t size, enum cudaMemcpyKind kind)
{
    bool to_device = kind == cudaMemcpyHostToDevice;
    int prev = -1;
    int rc = gp_cuda_device_enter(ctx, to_device ? "copy_to_device" : "copy_to_host", &prev);
    if (rc != GP_OK)
        return rc;
    const char *call = "";
    pthread_mutex_lock(&ctx->copies->lock);
    cudaError_t err = copy_locked(ctx->copies, dst, src, size, kind, &call);
    pthread_mutex_unlock(&ctx->copies->lock);
    gp_cuda_clear_own_error(err);
    gp_cuda_device_leave(ctx, prev);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "%s in a copy (%s %p, %zu bytes) on device %d: %s: %s", call,
                            to_device ? "host -> device" : "device -> host", to_device ? dst : (void *)src, size,
                            ctx->device, cudaGetErrorName(err), cudaGetErrorString(err));
    return GP_OK;
}

int gp_cuda_copy_to_host(void *opaque, void *host, gp_devptr src, size_t size)
{
    return copy(opaque, host, (const void *)src, size, cudaMemcpyDeviceToHost);
}

int gp_cuda_copy_to_device(void *opaque, gp_devptr dst, const void *host, size_t size)
{
    return copy(opaque, (void *)dst, host, size, cudaMemcpyHostToDevice);
}

int gp_cuda_host_alloc(void *opaque, size_t size, void **out)
{
    const gp_cuda_ctx *ctx = opaque;
    void *ptr = NULL;
    cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    gp_cuda_clear_own_error(err);
    if (err != cudaSuccess)
        return gp_error_set(err == cudaErrorMemoryAllocation ? GP_ERR_OOM : GP_ERR_DEVICE,
                            "cudaHostAlloc(%zu bytes) for device %d: %s: %s", size, ctx->device, cudaGetErrorName(err),
                            cudaGetErrorString(err));
    *out = ptr;
    return GP_OK;
}

int gp_cuda_host_free(void *opaque, void *ptr, size_t size)
{
    (void)opaque;
    cudaError_t err = cudaFreeHost(ptr);
    gp_cuda_clear_own_error(err);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaFreeHost(%p, %zu bytes): %s: %s", ptr, size, cudaGetErrorName(err),
                            cudaGetErrorString(err));
    return GP_OK;
}

int gp_cuda_device_uuid(void *opaque, unsigned char uuid[16])
{
    const gp_cuda_ctx *ctx = opaque;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    cudaError_t err = cudaGetDeviceProperties(&prop, ctx->device); /* no context needed: any thread */
    gp_cuda_clear_own_error(err);
    if (err != cudaSuccess)
        return gp_error_set(GP_ERR_DEVICE, "cudaGetDeviceProperties(device=%d): %s: %s", ctx->device,
                            cudaGetErrorName(err), cudaGetErrorString(err));
    memcpy(uuid, prop.uuid.bytes, 16);
    return GP_OK;
}

const gp_backend_ops gp_backend_cuda = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
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
    .copy_to_host = gp_cuda_copy_to_host,
    .copy_to_device = gp_cuda_copy_to_device,
    .host_alloc = gp_cuda_host_alloc,
    .host_free = gp_cuda_host_free,
};
