/*
 * emu_runtime.c — the CUDA emulation's runtime API (a TEST DEVICE): the machine's devices (one
 * "sim-vmm" instance each), the per-thread state CUDA keeps (current device, bound context, last
 * error), errors (sticky and not), device and pinned host memory, copies, streams, events and the
 * test's kernels (gpemu_launch).
 *
 * What the emulation does NOT model, and why that is stricter or neutral for the pool's tests:
 *   - the legacy default stream's implicit ordering with blocking streams: every stream is ordered
 *     only by events and waits (the pool must never rely on implicit ordering);
 *   - peer access: a kernel uses memory of its own device only;
 *   - cudaMalloc rounds every size up to 2 MiB (the sim's page), as large CUDA allocations are.
 */
#ifndef GPUPOOL_CUDA_EMULATION
#error "pool/cuda_emu/ is the CUDA emulation for tests: it must never be compiled into libgpupool"
#endif
#define _DEFAULT_SOURCE
#include "cuda_emu/emu_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "sim/sim_internal.h"

emu_state g_emu = {.lock = PTHREAD_MUTEX_INITIALIZER};
static _Thread_local emu_thread tls;

static const gp_backend_ops *sim_ops(void)
{
    return &gp_backend_sim_vmm;
}

void gpemu_lock(void)
{
    pthread_mutex_lock(&g_emu.lock);
}

void gpemu_unlock(void)
{
    pthread_mutex_unlock(&g_emu.lock);
}

emu_thread *gpemu_thread(void)
{
    if (tls.generation != g_emu.generation) {
        memset(&tls, 0, sizeof tls);
        tls.generation = g_emu.generation;
        tls.bound = -1;
        tls.mode = cudaStreamCaptureModeGlobal;
    }
    return &tls;
}

bool gpemu_vec_push(emu_vec *v, void *item)
{
    if (v->count == v->capacity) {
        size_t cap = v->capacity ? v->capacity * 2 : 16;
        void **items = realloc(v->items, cap * sizeof *items);
        if (items == NULL)
            return false;
        v->items = items;
        v->capacity = cap;
    }
    v->items[v->count++] = item;
    return true;
}

void gpemu_vec_remove(emu_vec *v, size_t index)
{
    v->items[index] = v->items[--v->count];
}

static void vec_free_all(emu_vec *v)
{
    for (size_t i = 0; i < v->count; i++)
        free(v->items[i]);
    free(v->items);
    memset(v, 0, sizeof *v);
}

cudaError_t gpemu_error(cudaError_t err)
{
    if (err != cudaSuccess)
        gpemu_thread()->last = err;
    return err;
}

cudaError_t gpemu_from_gp(int rc)
{
    return rc == GP_OK ? cudaSuccess : rc == GP_ERR_OOM ? cudaErrorMemoryAllocation : cudaErrorUnknown;
}

void gpemu_bind(emu_thread *t, int device)
{
    t->bound = device;
}

cudaError_t gpemu_check_sticky(int device, const char *call)
{
    cudaError_t sticky = g_emu.devices[device].sticky;
    if (sticky == cudaSuccess)
        return cudaSuccess;
    gpemu_violation_locked(GPEMU_RULE_STICKY, "%s on device %d after its context ended with error %d", call, device,
                           (int)sticky);
    return sticky;
}

void gpemu_make_sticky(int device, cudaError_t err)
{
    if (g_emu.devices[device].sticky == cudaSuccess)
        g_emu.devices[device].sticky = err;
}

/* Common entry of a runtime call that works on the current device: the machine is up, the device's
 * context is alive, and the runtime binds the device's primary context to the thread. */
static cudaError_t enter_device(const char *call, int *device)
{
    if (!g_emu.up)
        return cudaErrorNoDevice;
    emu_thread *t = gpemu_thread();
    cudaError_t err = gpemu_check_sticky(t->device, call);
    if (err != cudaSuccess)
        return err;
    gpemu_bind(t, t->device);
    *device = t->device;
    return cudaSuccess;
}

/* ---- the machine -------------------------------------------------------------------------------- */

static struct CUstream_st *stream_new(int device, unsigned flags, bool legacy)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->magic = GPEMU_STREAM_MAGIC;
    s->device = device;
    s->flags = flags;
    s->legacy = legacy;
    s->sim = gp_sim_stream_create(g_emu.devices[device].sim);
    if (!gpemu_vec_push(&g_emu.streams, s)) {
        free(s);
        return NULL;
    }
    return s;
}

int gpemu_init(int devices, size_t device_memory)
{
    if (devices < 1 || devices > GPEMU_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "gpemu_init: %d devices (1..%d)", devices, GPEMU_MAX_DEVICES);
    gpemu_lock();
    if (g_emu.up) {
        gpemu_unlock();
        return gp_error_set(GP_ERR_INVALID, "gpemu_init: the emulated machine is up: gpemu_shutdown first");
    }
    g_emu.generation++;
    g_emu.violations = 0;
    memset(g_emu.rule_counts, 0, sizeof g_emu.rule_counts);
    g_emu.first_violation[0] = '\0';
    g_emu.print_violations = getenv("GPEMU_QUIET") == NULL;
    for (int d = 0; d < devices; d++) {
        emu_device *dev = &g_emu.devices[d];
        memset(dev, 0, sizeof *dev);
        gp_config_defaults(&dev->cfg);
        dev->cfg.device_memory = device_memory;
        int rc = sim_ops()->open(&dev->cfg, d, &dev->ctx);
        if (rc != GP_OK) {
            for (int e = 0; e < d; e++) {
                sim_ops()->close(g_emu.devices[e].ctx);
            }
            gpemu_unlock();
            return rc;
        }
        dev->sim = sim_ops()->instance(dev->ctx);
        gp_sim_retain(dev->sim); /* kept past close, for the report */
    }
    g_emu.device_count = devices;
    g_emu.up = true;
    for (int d = 0; d < devices; d++)
        g_emu.devices[d].legacy = stream_new(d, cudaStreamDefault, true);
    gpemu_unlock();
    return GP_OK;
}

uint64_t gpemu_shutdown(void)
{
    gpemu_lock();
    if (!g_emu.up) {
        gpemu_unlock();
        return g_emu.violations;
    }
    gpemu_capture_shutdown();
    for (size_t i = 0; i < g_emu.allocs.count; i++) {
        emu_alloc *a = g_emu.allocs.items[i];
        gpemu_violation_locked(GPEMU_RULE_FREE_POINTER, "leak at shutdown: cudaMalloc'd %p (%zu bytes) on device %d never freed",
                               (void *)a->ptr, a->size, a->device);
        sim_ops()->mem_free(g_emu.devices[a->device].ctx, a->ptr, a->rounded);
    }
    for (size_t i = 0; i < g_emu.hosts.count; i++) {
        emu_host *h = g_emu.hosts.items[i];
        gpemu_violation_locked(GPEMU_RULE_FREE_POINTER, "leak at shutdown: cudaHostAlloc'd %p (%zu bytes) never freed", h->ptr,
                               h->size);
        sim_ops()->host_free(g_emu.devices[h->device].ctx, h->ptr, h->size);
    }
    size_t live_events = 0;
    for (size_t i = 0; i < g_emu.events.count; i++) {
        struct CUevent_st *e = g_emu.events.items[i];
        if (!e->destroyed) {
            live_events++;
            sim_ops()->event_destroy(g_emu.devices[e->device].ctx, e->sim);
        }
    }
    if (live_events > 0)
        gpemu_violation_locked(GPEMU_RULE_FREE_POINTER, "leak at shutdown: %zu events never destroyed", live_events);
    gpemu_driver_shutdown();
    for (int d = 0; d < g_emu.device_count; d++) {
        emu_device *dev = &g_emu.devices[d];
        sim_ops()->close(dev->ctx);
        gp_sim_report r;
        gp_sim_get_report(dev->sim, &r);
        if (r.races > 0 || r.pattern_mismatches > 0 || r.bad_calls > 0)
            gpemu_violation_locked(GPEMU_RULE_KERNEL_MEMORY, "device %d's sim saw %" PRIu64 " races, %" PRIu64
                                   " pattern mismatches, %" PRIu64 " bad calls: %s",
                                   d, r.races, r.pattern_mismatches, r.bad_calls, gp_sim_first_violation(dev->sim));
        gp_sim_release(dev->sim);
        dev->sim = NULL;
        dev->ctx = NULL;
    }
    vec_free_all(&g_emu.allocs);
    vec_free_all(&g_emu.hosts);
    vec_free_all(&g_emu.streams);
    vec_free_all(&g_emu.events);
    g_emu.up = false;
    g_emu.device_count = 0;
    uint64_t n = g_emu.violations;
    gpemu_unlock();
    return n;
}

gp_sim *gpemu_sim(int device)
{
    return device >= 0 && device < g_emu.device_count ? g_emu.devices[device].sim : NULL;
}

/* ---- devices and errors ------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count)
{
    if (count == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    if (err == cudaSuccess)
        *count = g_emu.device_count;
    gpemu_unlock();
    return gpemu_error(err);
}

/* A device's name, UUID (fixed per index, so that every process sees emulated device i as the same GPU,
 * as CUDA_VISIBLE_DEVICES=<uuid> would) and memory; needs no context. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (prop == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    if (err == cudaSuccess && (device < 0 || device >= g_emu.device_count)) {
        gpemu_violation_locked(GPEMU_RULE_DEVICE_ORDINAL, "cudaGetDeviceProperties(%d) with %d devices", device,
                               g_emu.device_count);
        err = cudaErrorInvalidDevice;
    }
    if (err == cudaSuccess) {
        memset(prop, 0, sizeof *prop);
        snprintf(prop->name, sizeof prop->name, "gpupool CUDA emulation, device %d", device);
        static const char stem[12] = {'g', 'p', 'u', 'p', 'o', 'o', 'l', '-', 'e', 'm', 'u', '-'};
        memcpy(prop->uuid.bytes, stem, sizeof stem);
        for (int i = 0; i < 4; i++)
            prop->uuid.bytes[12 + i] = (char)((unsigned)device >> (8 * (3 - i)));
        size_t free_bytes = 0;
        err = gpemu_from_gp(sim_ops()->mem_info(g_emu.devices[device].ctx, &free_bytes, &prop->totalGlobalMem));
    }
    gpemu_unlock();
    return gpemu_error(err);
}

/* Returns the current device; binds nothing (CUDA: cudaGetDevice does not initialise a context). */
cudaError_t cudaGetDevice(int *device)
{
    if (device == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    *device = gpemu_thread()->device;
    return cudaSuccess;
}

/* Makes `device` current for the calling thread only and its primary context current for driver
 * calls (CUDA 12+: cudaSetDevice initialises the device's primary context). */
cudaError_t cudaSetDevice(int device)
{
    gpemu_lock();
    cudaError_t err = cudaSuccess;
    if (!g_emu.up) {
        err = cudaErrorNoDevice;
    } else if (device < 0 || device >= g_emu.device_count) {
        gpemu_violation_locked(GPEMU_RULE_DEVICE_ORDINAL, "cudaSetDevice(%d) with %d devices", device, g_emu.device_count);
        err = cudaErrorInvalidDevice;
    } else {
        emu_thread *t = gpemu_thread();
        t->device = device;
        gpemu_bind(t, device);
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaGetLastError(void)
{
    emu_thread *t = gpemu_thread();
    cudaError_t err = t->last;
    t->last = cudaSuccess;
    if (g_emu.up && g_emu.devices[t->device].sticky != cudaSuccess)
        err = t->last = g_emu.devices[t->device].sticky; /* sticky: cannot be cleared */
    return err;
}

cudaError_t cudaPeekAtLastError(void)
{
    emu_thread *t = gpemu_thread();
    if (g_emu.up && g_emu.devices[t->device].sticky != cudaSuccess)
        return g_emu.devices[t->device].sticky;
    return t->last;
}

static const struct {
    cudaError_t err;
    const char *name, *text;
} error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t error)
{
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++)
        if (error_texts[i].err == error)
            return error_texts[i].name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++)
        if (error_texts[i].err == error)
            return error_texts[i].text;
    return "unrecognized error code";
}

/* ---- kernels in flight ---------------------------------------------------------------------------- */

bool gpemu_in_flight(int device, uintptr_t va, size_t size)
{
    gp_sim *sim = g_emu.devices[device].sim;
    pthread_mutex_lock(&sim->lock);
    bool busy = gpsim_range_in_flight(sim, va, size);
    pthread_mutex_unlock(&sim->lock);
    return busy;
}

/* ---- device memory -------------------------------------------------------------------------------- */

static emu_alloc *alloc_containing(uintptr_t ptr, size_t len, size_t *index)
{
    for (size_t i = 0; i < g_emu.allocs.count; i++) {
        emu_alloc *a = g_emu.allocs.items[i];
        if (ptr >= a->ptr && ptr + len <= a->ptr + a->size && len <= a->size) {
            if (index != NULL)
                *index = i;
            return a;
        }
    }
    return NULL;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (devPtr == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaMalloc", &device);
    if (err == cudaSuccess)
        err = gpemu_capture_unsafe("cudaMalloc");
    emu_alloc *a = NULL;
    if (err == cudaSuccess && size == 0) {
        *devPtr = NULL;
        gpemu_unlock();
        return cudaSuccess;
    }
    if (err == cudaSuccess && (a = calloc(1, sizeof *a)) == NULL)
        err = cudaErrorMemoryAllocation;
    if (err == cudaSuccess) {
        a->device = device;
        a->size = size;
        a->rounded = (size + GPEMU_GRANULE - 1) / GPEMU_GRANULE * GPEMU_GRANULE;
        gp_devptr out = 0;
        err = gpemu_from_gp(sim_ops()->mem_alloc(g_emu.devices[device].ctx, a->rounded, &out));
        if (err == cudaSuccess && !gpemu_vec_push(&g_emu.allocs, a)) {
            sim_ops()->mem_free(g_emu.devices[device].ctx, out, a->rounded);
            err = cudaErrorMemoryAllocation;
        }
        if (err == cudaSuccess) {
            a->ptr = out;
            *devPtr = (void *)out;
        } else {
            free(a);
        }
    }
    gpemu_unlock();
    return gpemu_error(err);
}

/* cudaFree(NULL) initialises the context. Otherwise the pointer must be a live cudaMalloc allocation
 * (of any device: CUDA finds it through unified addressing); the device is synchronised first. */
cudaError_t cudaFree(void *devPtr)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaFree", &device);
    if (err == cudaSuccess && devPtr == NULL) {
        gpemu_unlock();
        return cudaSuccess;
    }
    if (err == cudaSuccess)
        err = gpemu_capture_unsafe("cudaFree");
    size_t index = 0;
    emu_alloc *a = NULL;
    if (err == cudaSuccess) {
        a = alloc_containing((uintptr_t)devPtr, 1, &index);
        if (a == NULL || a->ptr != (uintptr_t)devPtr) {
            gpemu_violation_locked(GPEMU_RULE_FREE_POINTER, "cudaFree(%p): not a live cudaMalloc allocation", devPtr);
            err = cudaErrorInvalidValue;
        }
    }
    if (err == cudaSuccess) {
        err = gpemu_from_gp(sim_ops()->mem_free(g_emu.devices[a->device].ctx, a->ptr, a->rounded));
        if (err == cudaSuccess) {
            gpemu_vec_remove(&g_emu.allocs, index);
            free(a);
        }
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (free_bytes == NULL || total == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaMemGetInfo", &device);
    if (err == cudaSuccess)
        err = gpemu_from_gp(sim_ops()->mem_info(g_emu.devices[device].ctx, free_bytes, total));
    gpemu_unlock();
    return gpemu_error(err);
}

/* The device range of a copy: inside one allocation or wholly in mappings this device may access. */
static bool copyable(int device, uintptr_t ptr, size_t len)
{
    emu_alloc *a = alloc_containing(ptr, len, NULL);
    if (a != NULL)
        return a->device == device;
    uintptr_t at = ptr;
    while (at < ptr + len) {
        emu_range *m = gpemu_mapping_at(at);
        if (m == NULL || m->device != device || (m->access & (1u << device)) == 0)
            return false;
        at = m->va + m->size;
    }
    return true;
}

/* A copy between host and device on stream s (NULL: the legacy stream), done on return: the stream's
 * queued work runs first (stream order). A kernel of another stream still using the range races the
 * copy (the emulation's streams do not sync with the legacy stream): a violation, after which the
 * device runs its work out so that the simulated device (whose copy refuses a range in use) copies. */
static cudaError_t copy_on(const char *call, void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                           cudaStream_t stream)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device(call, &device);
    if (err == cudaSuccess)
        err = gpemu_capture_unsafe(call);
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, call, &err) : NULL;
    if (err == cudaSuccess && kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost)
        err = cudaErrorNotSupported; /* the pool copies only between host and device */
    uintptr_t dev = kind == cudaMemcpyHostToDevice ? (uintptr_t)dst : (uintptr_t)src;
    if (err == cudaSuccess && count > 0 && !copyable(device, dev, count)) {
        gpemu_violation_locked(GPEMU_RULE_KERNEL_MEMORY, "%s of %zu bytes at device address %p: not allocated, "
                               "not mapped, or without access on device %d", call, count, (void *)dev, device);
        gpemu_make_sticky(device, cudaErrorIllegalAddress);
        err = cudaErrorIllegalAddress;
    }
    void *ctx = err == cudaSuccess ? g_emu.devices[device].ctx : NULL;
    if (err == cudaSuccess)
        gp_sim_stream_synchronize(g_emu.devices[device].sim, s->sim);
    if (err == cudaSuccess && count > 0 && gpemu_in_flight(device, dev, count)) {
        gpemu_violation_locked(GPEMU_RULE_UNMAP_IN_FLIGHT, "%s of [%p, +%zu) while a kernel of another stream "
                               "still uses it", call, (void *)dev, count);
        (void)sim_ops()->device_synchronize(ctx);
    }
    if (err == cudaSuccess && count > 0) {
        int rc = kind == cudaMemcpyHostToDevice ? sim_ops()->copy_to_device(ctx, dev, src, count)
                                                : sim_ops()->copy_to_host(ctx, dst, dev, count);
        err = gpemu_from_gp(rc);
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return copy_on("cudaMemcpy", dst, src, count, kind, NULL);
}

/* The emulation completes the copy at once, in stream order (see copy_on); the pool's copies then
 * synchronize the stream, which finds it idle. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy_on("cudaMemcpyAsync", dst, src, count, kind, stream);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    if (pHost == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaHostAlloc", &device);
    if (err == cudaSuccess)
        err = gpemu_capture_unsafe("cudaHostAlloc");
    emu_host *h = NULL;
    if (err == cudaSuccess && (h = calloc(1, sizeof *h)) == NULL)
        err = cudaErrorMemoryAllocation;
    if (err == cudaSuccess) {
        h->size = size;
        h->device = device;
        err = gpemu_from_gp(sim_ops()->host_alloc(g_emu.devices[device].ctx, size, &h->ptr));
        if (err == cudaSuccess && !gpemu_vec_push(&g_emu.hosts, h)) {
            sim_ops()->host_free(g_emu.devices[device].ctx, h->ptr, size);
            err = cudaErrorMemoryAllocation;
        }
        if (err == cudaSuccess)
            *pHost = h->ptr;
        else
            free(h);
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaFreeHost(void *ptr)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaFreeHost", &device);
    if (err == cudaSuccess)
        err = gpemu_capture_unsafe("cudaFreeHost");
    if (err == cudaSuccess) {
        size_t i = 0;
        while (i < g_emu.hosts.count && ((emu_host *)g_emu.hosts.items[i])->ptr != ptr)
            i++;
        if (i == g_emu.hosts.count) {
            gpemu_violation_locked(GPEMU_RULE_FREE_POINTER, "cudaFreeHost(%p): not a live cudaHostAlloc allocation", ptr);
            err = cudaErrorInvalidValue;
        } else {
            emu_host *h = g_emu.hosts.items[i];
            err = gpemu_from_gp(sim_ops()->host_free(g_emu.devices[h->device].ctx, h->ptr, h->size));
            if (err == cudaSuccess) {
                gpemu_vec_remove(&g_emu.hosts, i);
                free(h);
            }
        }
    }
    gpemu_unlock();
    return gpemu_error(err);
}

/* ---- streams ------------------------------------------------------------------------------------ */

struct CUstream_st *gpemu_stream(cudaStream_t s, const char *call, cudaError_t *err)
{
    emu_thread *t = gpemu_thread();
    if (s == NULL || s == cudaStreamLegacy)
        return g_emu.devices[t->device].legacy;
    if (s == cudaStreamPerThread) {
        if (t->per_thread[t->device] == NULL)
            t->per_thread[t->device] = stream_new(t->device, cudaStreamDefault, false);
        if (t->per_thread[t->device] == NULL)
            *err = cudaErrorMemoryAllocation;
        return t->per_thread[t->device];
    }
    for (size_t i = 0; i < g_emu.streams.count; i++)
        if (g_emu.streams.items[i] == s) {
            if (s->destroyed) {
                gpemu_violation_locked(GPEMU_RULE_USE_AFTER_DESTROY, "%s on stream %p after cudaStreamDestroy", call,
                                       (void *)s);
                *err = cudaErrorInvalidResourceHandle;
                return NULL;
            }
            return s;
        }
    gpemu_violation_locked(GPEMU_RULE_USE_AFTER_DESTROY, "%s on %p, which is no stream of this machine", call, (void *)s);
    *err = cudaErrorInvalidResourceHandle;
    return NULL;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (pStream == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaStreamCreate", &device);
    struct CUstream_st *s = NULL;
    if (err == cudaSuccess && (s = stream_new(device, flags, false)) == NULL)
        err = cudaErrorMemoryAllocation;
    if (err == cudaSuccess)
        *pStream = s;
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

/* The stream's work still completes (CUDA releases its resources once it is done); the handle is
 * dead at once. The object is kept until shutdown so that later uses are recognised. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    struct CUstream_st *s = NULL;
    if (err == cudaSuccess && (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread))
        err = cudaErrorInvalidResourceHandle;
    if (err == cudaSuccess)
        s = gpemu_stream(stream, "cudaStreamDestroy", &err);
    if (s != NULL) {
        if (s->capture != cudaStreamCaptureStatusNone)
            gpemu_capture_invalidate(s->capture_id);
        s->destroyed = true;
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaStreamSynchronize", &device);
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, "cudaStreamSynchronize", &err) : NULL;
    if (s != NULL && s->capture != cudaStreamCaptureStatusNone) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SYNC, "cudaStreamSynchronize(%p) of a capturing stream", (void *)stream);
        gpemu_capture_invalidate(s->capture_id);
        err = cudaErrorStreamCaptureUnsupported;
    }
    if (s != NULL && err == cudaSuccess)
        gp_sim_stream_synchronize(g_emu.devices[s->device].sim, s->sim);
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaDeviceSynchronize(void)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaDeviceSynchronize", &device);
    struct CUstream_st *c = err == cudaSuccess ? gpemu_any_capture(device) : NULL;
    if (c != NULL) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SYNC, "cudaDeviceSynchronize on device %d while stream %p captures",
                               device, (void *)c);
        gpemu_capture_invalidate(c->capture_id);
        err = cudaErrorStreamCaptureUnsupported;
    }
    if (err == cudaSuccess)
        gp_sim_synchronize(g_emu.devices[device].sim);
    gpemu_unlock();
    return gpemu_error(err);
}

/* ---- events ------------------------------------------------------------------------------------- */

static struct CUevent_st *event_of(cudaEvent_t e, const char *call, cudaError_t *err)
{
    for (size_t i = 0; i < g_emu.events.count; i++)
        if (g_emu.events.items[i] == e) {
            if (e->destroyed) {
                gpemu_violation_locked(GPEMU_RULE_USE_AFTER_DESTROY, "%s(%p) after cudaEventDestroy", call, (void *)e);
                *err = cudaErrorInvalidResourceHandle;
                return NULL;
            }
            return e;
        }
    gpemu_violation_locked(GPEMU_RULE_USE_AFTER_DESTROY, "%s(%p): no event of this machine", call, (void *)e);
    *err = cudaErrorInvalidResourceHandle;
    return NULL;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (event == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaEventCreate", &device);
    struct CUevent_st *e = NULL;
    if (err == cudaSuccess && (e = calloc(1, sizeof *e)) == NULL)
        err = cudaErrorMemoryAllocation;
    if (err == cudaSuccess) {
        e->magic = GPEMU_EVENT_MAGIC;
        e->device = device;
        e->flags = flags;
        err = gpemu_from_gp(sim_ops()->event_create(g_emu.devices[device].ctx, &e->sim));
        if (err == cudaSuccess && !gpemu_vec_push(&g_emu.events, e)) {
            sim_ops()->event_destroy(g_emu.devices[device].ctx, e->sim);
            err = cudaErrorMemoryAllocation;
        }
        if (err == cudaSuccess)
            *event = e;
        else
            free(e);
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    gpemu_lock();
    cudaError_t err = g_emu.up ? cudaSuccess : cudaErrorNoDevice;
    struct CUevent_st *e = err == cudaSuccess ? event_of(event, "cudaEventDestroy", &err) : NULL;
    if (e != NULL) {
        err = gpemu_from_gp(sim_ops()->event_destroy(g_emu.devices[e->device].ctx, e->sim));
        if (err == cudaSuccess)
            e->destroyed = true;
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaEventRecord", &device);
    struct CUevent_st *e = err == cudaSuccess ? event_of(event, "cudaEventRecord", &err) : NULL;
    struct CUstream_st *s = e != NULL ? gpemu_stream(stream, "cudaEventRecord", &err) : NULL;
    if (s != NULL && s->device != e->device) {
        gpemu_violation_locked(GPEMU_RULE_STREAM_DEVICE,
                               "cudaEventRecord(event of device %d, stream %p of device %d%s) (current device %d)",
                               e->device, (void *)stream, s->device, stream == NULL ? ": the NULL stream is the current device's" : "",
                               device);
        err = cudaErrorInvalidResourceHandle;
    } else if (s != NULL && s->legacy && gpemu_blocking_capture(s->device) != NULL) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "cudaEventRecord on the legacy stream while a blocking stream captures");
        gpemu_capture_invalidate(gpemu_blocking_capture(s->device)->capture_id);
        err = cudaErrorStreamCaptureImplicit;
    } else if (s != NULL && s->capture == cudaStreamCaptureStatusInvalidated) {
        err = cudaErrorStreamCaptureInvalidated;
    } else if (s != NULL && s->capture == cudaStreamCaptureStatusActive) {
        e->capture_id = s->capture_id; /* a node of the graph: nothing runs now */
    } else if (s != NULL) {
        e->capture_id = 0;
        err = gpemu_from_gp(sim_ops()->event_record(g_emu.devices[s->device].ctx, e->sim, s->sim));
    }
    gpemu_unlock();
    return gpemu_error(err);
}

/* Potentially unsafe during capture; always illegal on an event last recorded in a capture. */
static cudaError_t event_wait_or_query(cudaEvent_t event, bool wait)
{
    const char *call = wait ? "cudaEventSynchronize" : "cudaEventQuery";
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device(call, &device);
    struct CUevent_st *e = err == cudaSuccess ? event_of(event, call, &err) : NULL;
    if (e != NULL && e->capture_id != 0) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SYNC, "%s(%p) of an event last recorded inside capture %" PRIu64, call,
                               (void *)event, e->capture_id);
        gpemu_capture_invalidate(e->capture_id);
        err = cudaErrorCapturedEvent;
    }
    if (e != NULL && err == cudaSuccess)
        err = gpemu_capture_unsafe(call);
    if (e != NULL && err == cudaSuccess) {
        void *ctx = g_emu.devices[e->device].ctx;
        int rc = wait ? sim_ops()->event_synchronize(ctx, e->sim) : sim_ops()->event_query(ctx, e->sim);
        err = rc == GP_ERR_NOT_READY ? cudaErrorNotReady : gpemu_from_gp(rc);
    }
    gpemu_unlock();
    return gpemu_error(err);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    return event_wait_or_query(event, false);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    return event_wait_or_query(event, true);
}

/* An event of another device: the emulated devices share no clock, so the wait is resolved on the
 * host (the event's device runs until it completes), which orders no less than CUDA does. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("cudaStreamWaitEvent", &device);
    struct CUevent_st *e = err == cudaSuccess ? event_of(event, "cudaStreamWaitEvent", &err) : NULL;
    struct CUstream_st *s = e != NULL ? gpemu_stream(stream, "cudaStreamWaitEvent", &err) : NULL;
    if (s != NULL && s->legacy && gpemu_blocking_capture(s->device) != NULL) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "cudaStreamWaitEvent on the legacy stream while a blocking stream captures");
        gpemu_capture_invalidate(gpemu_blocking_capture(s->device)->capture_id);
        err = cudaErrorStreamCaptureImplicit;
    } else if (s != NULL && s->capture == cudaStreamCaptureStatusInvalidated) {
        err = cudaErrorStreamCaptureInvalidated;
    } else if (s != NULL && s->capture == cudaStreamCaptureStatusActive) {
        if (e->capture_id != s->capture_id) {
            gpemu_violation_locked(GPEMU_RULE_CAPTURE_ISOLATION,
                                   "cudaStreamWaitEvent(capturing stream %p, event %p recorded %s)", (void *)stream,
                                   (void *)event, e->capture_id == 0 ? "outside any capture" : "in another capture");
            gpemu_capture_invalidate(s->capture_id);
            err = cudaErrorStreamCaptureIsolation;
        } /* else: a join inside the capture; the graph is replayed in order */
    } else if (s != NULL && e->capture_id != 0) {
        /* waiting on a captured event makes the stream join that capture */
        struct CUstream_st *origin = NULL;
        for (size_t i = 0; i < g_emu.streams.count && origin == NULL; i++) {
            struct CUstream_st *o = g_emu.streams.items[i];
            if (o->capture != cudaStreamCaptureStatusNone && o->capture_id == e->capture_id && o->capture_origin)
                origin = o;
        }
        if (origin == NULL) {
            gpemu_violation_locked(GPEMU_RULE_CAPTURE_SYNC, "cudaStreamWaitEvent on an event of a capture that has ended");
            err = cudaErrorCapturedEvent;
        } else {
            s->capture = origin->capture;
            s->capture_id = origin->capture_id;
            s->capture_mode = origin->capture_mode;
            s->capture_thread = origin->capture_thread;
            s->capture_origin = false;
            s->graph = origin->graph;
        }
    } else if (s != NULL) {
        if (e->device == s->device) {
            err = gpemu_from_gp(sim_ops()->stream_wait_event(g_emu.devices[s->device].ctx, s->sim, e->sim));
        } else {
            err = gpemu_from_gp(sim_ops()->event_synchronize(g_emu.devices[e->device].ctx, e->sim));
        }
    }
    gpemu_unlock();
    return gpemu_error(err);
}

/* ---- kernels ------------------------------------------------------------------------------------ */

cudaError_t gpemu_run_kernel(struct CUstream_st *s, uintptr_t ptr, size_t len, int op, uint64_t seed,
                             uint64_t duration_ns)
{
    int device = s->device;
    if (len > 0) {
        emu_alloc *a = alloc_containing(ptr, len, NULL);
        if (a == NULL) {
            uintptr_t at = ptr;
            while (at < ptr + len) {
                emu_range *m = gpemu_mapping_at(at);
                if (m == NULL) {
                    gpemu_violation_locked(GPEMU_RULE_KERNEL_MEMORY, "kernel on [%p, +%zu): %p is neither allocated nor mapped",
                                           (void *)ptr, len, (void *)at);
                    gpemu_make_sticky(device, cudaErrorIllegalAddress);
                    return cudaErrorIllegalAddress;
                }
                if (m->device != device || (m->access & (1u << device)) == 0) {
                    gpemu_violation_locked(GPEMU_RULE_ACCESS_BEFORE_USE,
                                           "kernel on device %d touches the mapping [%p, +%zu) whose access was never "
                                           "set for it (cuMemSetAccess)", device, (void *)m->va, m->size);
                    gpemu_make_sticky(device, cudaErrorIllegalAddress);
                    return cudaErrorIllegalAddress;
                }
                at = m->va + m->size;
            }
        } else if (a->device != device) {
            gpemu_violation_locked(GPEMU_RULE_KERNEL_MEMORY, "kernel on device %d uses %p of device %d (no peer access)",
                                   device, (void *)ptr, a->device);
            gpemu_make_sticky(device, cudaErrorIllegalAddress);
            return cudaErrorIllegalAddress;
        }
    }
    int rc = gp_sim_launch(g_emu.devices[device].sim, s->sim, (const void *)ptr, len, op, seed, duration_ns);
    return gpemu_from_gp(rc);
}

cudaError_t gpemu_launch(cudaStream_t stream, const void *ptr, size_t len, int op, uint64_t seed,
                         uint64_t duration_ns)
{
    gpemu_lock();
    int device = 0;
    cudaError_t err = enter_device("kernel launch", &device);
    struct CUstream_st *s = err == cudaSuccess ? gpemu_stream(stream, "kernel launch", &err) : NULL;
    if (s != NULL && s->device != device) {
        gpemu_violation_locked(GPEMU_RULE_STREAM_DEVICE, "kernel launched on device %d into stream %p of device %d", device,
                               (void *)stream, s->device);
        err = cudaErrorInvalidResourceHandle;
    } else if (s != NULL && s->legacy && gpemu_blocking_capture(device) != NULL) {
        gpemu_violation_locked(GPEMU_RULE_CAPTURE_SEQUENCE, "kernel on the legacy stream while a blocking stream captures");
        gpemu_capture_invalidate(gpemu_blocking_capture(device)->capture_id);
        err = cudaErrorStreamCaptureImplicit;
    } else if (s != NULL && s->capture == cudaStreamCaptureStatusInvalidated) {
        err = cudaErrorStreamCaptureInvalidated;
    } else if (s != NULL && s->capture == cudaStreamCaptureStatusActive) {
        err = gpemu_capture_kernel(s, (uintptr_t)ptr, len, op, seed, duration_ns);
    } else if (s != NULL) {
        err = gpemu_run_kernel(s, (uintptr_t)ptr, len, op, seed, duration_ns);
    }
    gpemu_unlock();
    return gpemu_error(err);
}
