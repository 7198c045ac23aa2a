/*
 * backend_cuda.h — what backend_cuda.c shares with the other CUDA backend, backend_vmm.c.
 *
 * Only for files built with GPUPOOL_WITH_CUDA. The "vmm" backend is the "cuda" backend's operations
 * (events, streams, mem_alloc/mem_free, mem_info) plus the driver's virtual memory API: its context
 * begins with a gp_cuda_ctx, so the gp_cuda_* operations below accept it as their `ctx` (a pointer to
 * a structure also points to its first member).
 */
#ifndef GP_BACKEND_CUDA_H
#define GP_BACKEND_CUDA_H

#include <cuda_runtime_api.h>

#include "backend/backend.h"

/* The "cuda" backend's instance: which device it serves, and the backend's name for messages
 * ("cuda" or "vmm"). Immutable after open(). */
typedef struct gp_cuda_ctx {
    int device;
    const char *name;
    /* The stream of the pool's own copies (staging a paused tenant's contents), created at the first
     * copy and destroyed at close; the pointer is set at open, what it points to is locked. */
    struct gp_cuda_copies *copies;
} gp_cuda_ctx;

/* Clears `err` from the calling thread's runtime error state when it is the pending one (i.e. the
 * caller caused it and it is not sticky). */
void gp_cuda_clear_own_error(cudaError_t err);

/* Makes ctx's device current for the calling thread; *prev receives the device that was current, for
 * gp_cuda_device_leave. On failure sets the message (naming ctx->name and `op`) and returns
 * GP_ERR_DEVICE; nothing needs undoing. */
int gp_cuda_device_enter(const gp_cuda_ctx *ctx, const char *op, int *prev);
void gp_cuda_device_leave(const gp_cuda_ctx *ctx, int prev);

/* Relaxed stream-capture mode for the calling thread around a call that is "potentially unsafe"
 * while a graph is captured (cudaMalloc, the driver's cuMem* calls): legal then in relaxed mode
 * (cuda_runtime_api.h, cudaThreadExchangeStreamCaptureMode), as PyTorch does for cudaMalloc.
 * gp_cuda_relax returns the mode to give back to gp_cuda_unrelax. */
enum cudaStreamCaptureMode gp_cuda_relax(void);
void gp_cuda_unrelax(enum cudaStreamCaptureMode previous);

/* Checks that `device` exists and initialises its primary context (cudaFree(NULL)), then fills *out.
 * GP_ERR_BACKEND with "<name> backend unavailable: ..." when the runtime, the driver or the device
 * cannot be used. */
int gp_cuda_open_device(const char *name, int device, gp_cuda_ctx *out);

/* The "cuda" backend's operations (backend.h), for any context that begins with a gp_cuda_ctx. */
int gp_cuda_mem_alloc(void *ctx, size_t size, gp_devptr *out);
int gp_cuda_mem_free(void *ctx, gp_devptr ptr, size_t size);
int gp_cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes);
int gp_cuda_device_uuid(void *ctx, unsigned char uuid[16]);
int gp_cuda_event_create(void *ctx, gp_event *out);
int gp_cuda_event_destroy(void *ctx, gp_event ev);
int gp_cuda_event_record(void *ctx, gp_event ev, gp_stream stream);
int gp_cuda_event_query(void *ctx, gp_event ev);
int gp_cuda_event_synchronize(void *ctx, gp_event ev);
int gp_cuda_stream_wait_event(void *ctx, gp_stream stream, gp_event ev);
int gp_cuda_stream_capturing(void *ctx, gp_stream stream, int *capturing);

/* Copies on the pool's own non-blocking stream, so that they wait for no one's work (backend.h); the
 * stream is made at the first copy. gp_cuda_copies_close destroys it (close()). */
int gp_cuda_copy_to_host(void *ctx, void *host, gp_devptr src, size_t size);
int gp_cuda_copy_to_device(void *ctx, gp_devptr dst, const void *host, size_t size);
int gp_cuda_host_alloc(void *ctx, size_t size, void **out);
int gp_cuda_host_free(void *ctx, void *ptr, size_t size);
void gp_cuda_copies_close(gp_cuda_ctx *ctx);

#endif /* GP_BACKEND_CUDA_H */
