/*
 * capture.c — what the pool does for a stream that is capturing a CUDA graph: it refuses, with a
 * message that says why, before any device call.
 *
 * While a stream captures (torch.cuda.graph, torch.compile mode="reduce-overhead", vLLM and SGLang
 * all capture), the calls the pool's paths make are illegal in the default global capture mode
 * (cudaEventQuery, cudaMalloc, cudaFree, synchronisation: cuda_runtime_api.h,
 * cudaThreadExchangeStreamCaptureMode) and invalidate the capture; events recorded on the capturing
 * stream become graph nodes that may never be queried; and memory freed during the capture would be
 * handed out again after it, so that replays of the graph overwrite live tensors. Serving a capture
 * safely needs a private pool per graph (PyTorch's CUDAPluggableAllocator begin/end-allocate-to-pool
 * and release-pool hooks), which gpupool does not have yet: until then a capture gets a clear refusal
 * (GP_ERR_INVALID; under PyTorch an allocation error) rather than silent corruption, and the
 * capture itself stays valid because nothing illegal was called. The query is cudaStreamIsCapturing,
 * one host call per gp_alloc / gp_free on the cuda and vmm backends; the sims never capture.
 */
#include "error.h"
#include "pool_state.h"

int gp_refuse_capturing(gp_pool_state *p, gp_stream stream, const char *fn)
{
    if (p->ops->stream_capturing == NULL)
        return GP_OK;
    int capturing = 0;
    int rc = p->ops->stream_capturing(p->ctx, stream, &capturing);
    if (rc != GP_OK)
        return rc;
    if (!capturing)
        return GP_OK;
    return gp_error_set(GP_ERR_INVALID,
                        "%s: stream %p is capturing a CUDA graph: gpupool has no private memory pool per graph "
                        "yet, so it refuses allocations and frees on a capturing stream (allocate before the "
                        "capture, or capture with PyTorch's own allocator); nothing was called on the device",
                        fn, stream);
}
