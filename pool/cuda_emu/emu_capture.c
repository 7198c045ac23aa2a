/*
 * emu_capture.c — stream capture and graphs in the CUDA emulation (a TEST DEVICE).
 *
 * A capturing stream records the kernels launched into it (and the events recorded on it) instead of
 * running them; cudaStreamEndCapture hands the recorded kernels over as a graph, cudaGraphLaunch
 * re-runs them in order on the launch stream (the same addresses, patterns and durations), so a replay
 * touches exactly the memory the capture saw: memory the pool handed to the capture must still be
 * reserved for that graph at every replay, which the sim checks (kernels on freed memory, patterns,
 * races with other streams).
 *
 * The interaction rules (cuda_runtime_api.h, cudaThreadExchangeStreamCaptureMode): a thread in mode
 * Global or ThreadLocal that began a non-relaxed capture may make no potentially unsafe call; a thread
 * in mode Global may make none while another thread has a Global capture underway; Relaxed threads
 * may. Potentially unsafe here: cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost, cudaMemcpy,
 * cudaEventQuery, cudaEventSynchronize and the driver's cuMem* calls (synchronous, not captured).
 * A prohibited call returns cudaErrorStreamCaptureUnsupported and invalidates the captures it
 * conflicts with: their cudaStreamEndCapture returns cudaErrorStreamCaptureInvalidated and no graph.
 */
#ifndef GPUPOOL_CUDA_EMULATION
#error "pool/cuda_emu/ is the CUDA emulation for tests: it must never be compiled into libgpupool"
#endif
#include "cuda_emu/emu_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static bool capturing(const struct CUstream_st *s)
{
    return !s->destroyed && s->capture != cudaStreamCaptureStatusNone;
}

struct CUstream_st *gpemu_blocking_capture(int device)
{
    for (size_t i = 0; i < g_emu.streams.count; i++) {
        struct CUstream_st *s = g_emu.streams.items[i];
        if (capturing(s) && s->device == device && (s->flags & cudaStreamNonBlocking) == 0)
            return s;
    }
    return NULL;
}

struct CUstream_st *gpemu_any_capture(int device)
{
    for (size_t i = 0; i < g_emu.streams.count; i++) {
        struct CUstream_st *s = g_emu.streams.items[i];
        if (capturing(s) && s->device == device)
            return s;
    }
    return NULL;
}

void gpemu_capture_invalidate(uint64_t capture_id)
{
    for (size_t i = 0; i < g_emu.streams.count; i++) {
        struct CUstream_st *s = g_emu.streams.items[i];
        if (s->capture != cudaStreamCaptureStatusNone && s->capture_id == capture_id)
            s->capture = cudaStreamCaptureStatusInvalidated;
    }
}

cudaError_t gpemu_capture_unsafe(const char *call)
{
    emu_thread *t = gpemu_thread();
    if (t->mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    pthread_t self = pthread_self();
    struct CUstream_st *conflict = NULL;
    for (size_t i = 0; i < g_emu.streams.count; i++) {
        struct CUstream_st *s = g_emu.streams.items[i];
        if (!capturing(s) || !s->capture_origin || s->capture_mode == cudaStreamCaptureModeRelaxed)
            continue;
        bool local = pthread_equal(s->capture_thread, self);
        if (local || (t->mode == cudaStreamCaptureModeGlobal && s->capture_mode == cudaStreamCaptureModeGlobal)) {
            conflict = s;
            gpemu_capture_invalidate(s->capture_id);
        }
    }
    if (conflict == NULL)
        return cudaSuccess;
    gpemu_violation_locked(GPEMU_RULE_CAPTURE_UNSAFE,
                           "%s while capture %" PRIu64 " (stream %p, %s mode, %s thread) is underway and this thread's "
                           "mode is %s",
                           call, conflict->capture_id, (void *)conflict,
                           conflict->capture_mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local",
                           pthread_equal(conflict->capture_thread, self) ? "this" : "another",
                           t->mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local");
    return cudaErrorStreamCaptureUnsupported;
}

cudaError_t gpemu_capture_kernel(struct CUstream_st *s, uintptr_t ptr, size_t len, int op, uint64_t seed,
                                 uint64_t duration_ns)
{
    struct CUgraph_st *g = s->graph;
    if (g->count == g->capacity) {
        size_t cap = g->capacity ? g->capacity * 2 : 16;
        emu_graph_node *nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (nodes == NULL)
            return cudaErrorMemoryAllocation;
        g->nodes = nodes;
        g->capacity = cap;
    }
    g->nodes[g->count++] = (emu_graph_node){ptr, len, op, seed, duration_ns};
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (mode == NULL || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
        return gpemu_error(cudaErrorInvalidValue);
    emu_thread *t = gpemu_thread();
    enum cudaStreamCaptureMode old = t->mode;
    t->mode = *mode;
    *mode = old;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, "cudaStreamBeginCapture", &err) : NULL;
    if (s != NULL && (s->legacy || (unsigned)mode > cudaStreamCaptureModeRelaxed)) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "cudaStreamBeginCapture on the legacy stream (or a bad mode %d)",
                               (int)mode);
        err = s->legacy ? cudaErrorStreamCaptureUnsupported : cudaErrorInvalidValue;
    } else if (s != NULL && s->capture != cudaStreamCaptureStatusNone) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "cudaStreamBeginCapture(%p): the stream already captures",
                               (void *)stream);
        err = cudaErrorIllegalState;
    } else if (s != NULL) {
        struct CUgraph_st *g = calloc(1, sizeof *g);
        if (g == NULL || !gpemu_vec_push(&g_emu.graphs, g)) {
            free(g);
            err = cudaErrorMemoryAllocation;
        } else {
            g->device = s->device;
            s->graph = g;
            s->capture = cudaStreamCaptureStatusActive;
            s->capture_id = ++g_emu.next_capture_id;
            s->capture_mode = mode;
            s->capture_thread = pthread_self();
            s->capture_origin = true;
        }
    }
    gpemu_unlock();
    return gpemu_error(err);
}

static void end_sequence(uint64_t capture_id)
{
    for (size_t i = 0; i < g_emu.streams.count; i++) {
        struct CUstream_st *s = g_emu.streams.items[i];
        if (s->capture != cudaStreamCaptureStatusNone && s->capture_id == capture_id) {
            s->capture = cudaStreamCaptureStatusNone;
            s->capture_id = 0;
            s->capture_origin = false;
            s->graph = NULL;
        }
    }
}

static void graph_forget(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g_emu.graphs.count; i++)
        if (g_emu.graphs.items[i] == g) {
            gpemu_vec_remove(&g_emu.graphs, i);
            break;
        }
    free(g->nodes);
    free(g);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    if (pGraph == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, "cudaStreamEndCapture", &err) : NULL;
    if (s != NULL && (s->capture == cudaStreamCaptureStatusNone || !s->capture_origin)) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "cudaStreamEndCapture(%p): no capture began on this stream",
                               (void *)stream);
        err = s->capture == cudaStreamCaptureStatusNone ? cudaErrorIllegalState : cudaErrorStreamCaptureUnmatched;
    } else if (s != NULL && s->capture_mode != cudaStreamCaptureModeRelaxed &&
               !pthread_equal(s->capture_thread, pthread_self())) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "cudaStreamEndCapture(%p) from another thread than the one that began it",
                               (void *)stream);
        err = cudaErrorStreamCaptureWrongThread;
    } else if (s != NULL) {
        struct CUgraph_st *g = s->graph;
        bool invalid = s->capture == cudaStreamCaptureStatusInvalidated;
        end_sequence(s->capture_id);
        if (invalid) {
            graph_forget(g);
            *pGraph = NULL;
            err = cudaErrorStreamCaptureInvalidated;
        } else {
            *pGraph = g;
        }
    }
    gpemu_unlock();
    return gpemu_error(err);
}

static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                cudaGraph_t *graph)
{
    if (status == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, "cudaStreamGetCaptureInfo", &err) : NULL;
    if (s != NULL && s->legacy && gpemu_blocking_capture(s->device) != NULL) {
        err = cudaErrorStreamCaptureImplicit; /* documented; the blocking capture is not invalidated */
    } else if (s != NULL) {
        *status = s->capture;
        if (id != NULL)
            *id = s->capture_id;
        if (graph != NULL)
            *graph = s->graph;
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    return capture_info(stream, pCaptureStatus, NULL, NULL);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                     unsigned long long *id_out, cudaGraph_t *graph_out,
                                     const cudaGraphNode_t **dependencies_out,
                                     const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    if (dependencies_out != NULL)
        *dependencies_out = NULL; /* the emulation's graphs are linear: no dependency nodes are exposed */
    if (edgeData_out != NULL)
        *edgeData_out = NULL;
    if (numDependencies_out != NULL)
        *numDependencies_out = 0;
    return capture_info(stream, captureStatus_out, id_out, graph_out);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    if (pGraphExec == NULL || graph == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    cudaError_t err = cudaSuccess;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    if (x != NULL && graph->count > 0 && (x->nodes = malloc(graph->count * sizeof *x->nodes)) == NULL) {
        free(x);
        x = NULL;
    }
    if (x == NULL || !gpemu_vec_push(&g_emu.execs, x)) {
        if (x != NULL)
            free(x->nodes);
        free(x);
        err = cudaErrorMemoryAllocation;
    } else {
        if (graph->count > 0)
            memcpy(x->nodes, graph->nodes, graph->count * sizeof *x->nodes);
        x->count = graph->count;
        x->device = graph->device;
        *pGraphExec = x;
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    if (graphExec == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, "cudaGraphLaunch", &err) : NULL;
    if (s != NULL && s->device != graphExec->device) {
        gpemu_violation_locked(GPEMU_RULE_STREAM_DEVICE, "cudaGraphLaunch of a graph of device %d on a stream of device %d",
                               graphExec->device, s->device);
        err = cudaErrorInvalidResourceHandle;
    }
    if (s != NULL && err == cudaSuccess)
        err = gpemu_check_sticky(s->device, "cudaGraphLaunch");
    for (size_t i = 0; s != NULL && err == cudaSuccess && i < graphExec->count; i++) {
        const emu_graph_node *n = &graphExec->nodes[i];
        err = s->capture == cudaStreamCaptureStatusActive
                  ? gpemu_capture_kernel(s, n->ptr, n->len, n->op, n->seed, n->duration_ns)
                  : gpemu_run_kernel(s, n->ptr, n->len, n->op, n->seed, n->duration_ns);
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    gpemu_lock();
    cudaError_t err = cudaErrorInvalidValue;
    for (size_t i = 0; i < g_emu.execs.count; i++)
        if (g_emu.execs.items[i] == graphExec) {
            gpemu_vec_remove(&g_emu.execs, i);
            free(graphExec->nodes);
            free(graphExec);
            err = cudaSuccess;
            break;
        }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    gpemu_lock();
    cudaError_t err = cudaErrorInvalidValue;
    for (size_t i = 0; i < g_emu.graphs.count; i++)
        if (g_emu.graphs.items[i] == graph) {
            graph_forget(graph);
            err = cudaSuccess;
            break;
        }
    gpemu_unlock();
    return gpemu_error(err);
}

void gpemu_capture_shutdown(void)
{
    while (g_emu.graphs.count > 0)
        graph_forget(g_emu.graphs.items[0]);
    free(g_emu.graphs.items);
    memset(&g_emu.graphs, 0, sizeof g_emu.graphs);
    for (size_t i = 0; i < g_emu.execs.count; i++) {
        struct CUgraphExec_st *x = g_emu.execs.items[i];
        free(x->nodes);
        free(x);
    }
    free(g_emu.execs.items);
    memset(&g_emu.execs, 0, sizeof g_emu.execs);
}
