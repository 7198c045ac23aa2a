/*
 * test_rules.c — every rule of the CUDA emulation (pool/cuda_emu/emu_rules.c) broken once on purpose:
 * the call returns the error CUDA documents and the violation is counted under its rule. Also the
 * legal neighbours of each rule, which must count nothing (so that a rule cannot fire everywhere).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "cuda_emu/cuda_emu.h"
#include "emu_test.h"

#define MIB ((size_t)1 << 20)

static struct {
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuMemUnmap_v10020 unmap;
} drv;

static void resolve(const char *name, void *slot)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st;
    cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &st);
    CHECK(err == cudaSuccess && st == cudaDriverEntryPointSuccess && fn != NULL, "resolving %s", name);
    memcpy(slot, &fn, sizeof fn);
}

/* A fresh two-device machine; the calling thread on device 0 with its context bound. */
static void up(void)
{
    CHECK(gpemu_init(2, 64 * MIB) == 0, "gpemu_init");
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    resolve("cuMemCreate", &drv.create);
    resolve("cuMemRelease", &drv.release);
    resolve("cuMemAddressReserve", &drv.reserve);
    resolve("cuMemAddressFree", &drv.address_free);
    resolve("cuMemMap", &drv.map);
    resolve("cuMemSetAccess", &drv.set_access);
    resolve("cuMemUnmap", &drv.unmap);
}

/* Shuts down after checking that exactly `rule` (and `also`, or GPEMU_RULE_COUNT for none) fired. */
static void down_expecting(enum gpemu_rule rule, enum gpemu_rule also)
{
    uint64_t total = gpemu_violations();
    uint64_t hits = gpemu_rule_count(rule) + (also != GPEMU_RULE_COUNT ? gpemu_rule_count(also) : 0);
    CHECK(gpemu_rule_count(rule) >= 1, "rule '%s' (%s) was not reported", gpemu_rule_name(rule), gpemu_rule_source(rule));
    CHECK(hits == total, "other rules fired too: %llu of %llu; first: %s", (unsigned long long)hits,
          (unsigned long long)total, gpemu_first_violation());
    gpemu_forget_violations();
    CHECK(gpemu_shutdown() == 0, "violations at shutdown: %s", gpemu_first_violation());
}

static CUmemAllocationProp prop0(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static void set_rw(CUdeviceptr va, size_t size)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(drv.set_access(va, size, &d, 1) == CUDA_SUCCESS, "cuMemSetAccess");
}

/* reserve `rsize`, create a handle of `hsize` */
static void reserve_and_create(size_t rsize, size_t hsize, CUdeviceptr *va, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp p = prop0();
    CHECK(drv.reserve(va, rsize, 2 * MIB, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(drv.create(h, hsize, &p, 0) == CUDA_SUCCESS, "create");
}

static void rule_device_ordinal(void)
{
    up();
    CHECK(cudaSetDevice(1) == cudaSuccess, "device 1 exists");
    CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice, "device 2 does not");
    int d = -1;
    CHECK(cudaGetDevice(&d) == cudaSuccess && d == 1, "a failed set changes nothing (%d)", d);
    cudaGetLastError();
    cudaSetDevice(0);
    down_expecting(GPEMU_RULE_DEVICE_ORDINAL, GPEMU_RULE_COUNT);
}

static void rule_stream_device(void)
{
    up();
    cudaEvent_t ev;
    CHECK(cudaSetDevice(1) == cudaSuccess, "set 1");
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess, "event on device 1");
    CHECK(cudaEventRecord(ev, NULL) == cudaSuccess, "NULL stream of the current device 1: legal");
    CHECK(cudaSetDevice(0) == cudaSuccess, "set 0");
    CHECK(cudaEventRecord(ev, NULL) == cudaErrorInvalidResourceHandle, "the NULL stream is now device 0's");
    cudaGetLastError();
    CHECK(cudaEventDestroy(ev) == cudaSuccess, "destroy");
    down_expecting(GPEMU_RULE_STREAM_DEVICE, GPEMU_RULE_COUNT);
}

static void *fresh_thread_create(void *arg)
{
    CUresult *res = arg;
    CUmemAllocationProp p = prop0();
    CUmemGenericAllocationHandle h = 0;
    int d = -1;
    cudaGetDevice(&d); /* does not bind a context */
    res[0] = drv.create(&h, 2 * MIB, &p, 0);
    cudaSetDevice(0);
    res[1] = drv.create(&h, 2 * MIB, &p, 0);
    if (res[1] == CUDA_SUCCESS)
        drv.release(h);
    return NULL;
}

static void rule_driver_context(void)
{
    up();
    CUresult res[2] = {CUDA_SUCCESS, CUDA_ERROR_UNKNOWN};
    pthread_t t;
    pthread_create(&t, NULL, fresh_thread_create, res);
    pthread_join(t, NULL);
    CHECK(res[0] == CUDA_ERROR_INVALID_CONTEXT, "no context on a fresh thread: %d", (int)res[0]);
    CHECK(res[1] == CUDA_SUCCESS, "after cudaSetDevice: %d", (int)res[1]);
    down_expecting(GPEMU_RULE_DRIVER_CONTEXT, GPEMU_RULE_COUNT);
}

static void rule_map_offset(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(8 * MIB, 4 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 2 * MIB, h, 0) == CUDA_ERROR_INVALID_VALUE, "offset 2 MiB");
    CHECK(drv.map(va, 4 * MIB, 0, h, 0) == CUDA_SUCCESS, "offset 0");
    CHECK(drv.unmap(va, 4 * MIB) == CUDA_SUCCESS, "unmap");
    CHECK(drv.release(h) == CUDA_SUCCESS && drv.address_free(va, 8 * MIB) == CUDA_SUCCESS, "cleanup");
    down_expecting(GPEMU_RULE_MAP_OFFSET, GPEMU_RULE_COUNT);
}

static void rule_map_granule(void)
{
    up();
    CUmemAllocationProp p = prop0();
    CUmemGenericAllocationHandle h;
    CHECK(drv.create(&h, 1 * MIB, &p, 0) == CUDA_ERROR_INVALID_VALUE, "1 MiB handle");
    CUdeviceptr va;
    reserve_and_create(8 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va + 4096, 2 * MIB, 0, h, 0) == CUDA_ERROR_INVALID_VALUE, "unaligned address");
    CHECK(drv.release(h) == CUDA_SUCCESS && drv.address_free(va, 8 * MIB) == CUDA_SUCCESS, "cleanup");
    down_expecting(GPEMU_RULE_MAP_GRANULE, GPEMU_RULE_COUNT);
}

static void rule_map_reserved(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h, h2;
    reserve_and_create(4 * MIB, 2 * MIB, &va, &h);
    CUmemAllocationProp p = prop0();
    CHECK(drv.create(&h2, 2 * MIB, &p, 0) == CUDA_SUCCESS, "second handle");
    CHECK(drv.map(va + 4 * MIB, 2 * MIB, 0, h, 0) == CUDA_ERROR_INVALID_VALUE, "past the reservation");
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "inside");
    CHECK(drv.map(va, 2 * MIB, 0, h2, 0) == CUDA_ERROR_INVALID_VALUE, "over a mapping");
    CHECK(drv.map(va + 2 * MIB, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "one handle at two addresses is legal");
    CHECK(drv.unmap(va, 4 * MIB) == CUDA_SUCCESS, "one unmap of two whole consecutive mappings");
    CHECK(drv.release(h) == CUDA_SUCCESS && drv.release(h2) == CUDA_SUCCESS, "release");
    CHECK(drv.address_free(va, 4 * MIB) == CUDA_SUCCESS, "free");
    down_expecting(GPEMU_RULE_MAP_RESERVED, GPEMU_RULE_COUNT);
}

static void rule_access_before_use_and_sticky(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(2 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    CHECK(gpemu_launch(NULL, (void *)va, 4096, GP_SIM_WRITE, 1, 10) == cudaErrorIllegalAddress, "kernel without access");
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "the error is the thread's");
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "sticky: cudaGetLastError cannot clear it");
    void *p = NULL;
    CHECK(cudaMalloc(&p, 2 * MIB) == cudaErrorIllegalAddress, "sticky: every later call fails");
    CHECK(gpemu_rule_count(GPEMU_RULE_STICKY) >= 1, "the later call counted as a use of a dead context");
    /* the context is gone: the machine is torn down with what it holds */
    gpemu_forget_violations();
    gpemu_shutdown();
    CHECK(gpemu_rule_count(GPEMU_RULE_FREE_POINTER) >= 1, "the leak of the dead context's mapping is reported");
    gpemu_forget_violations();

    up(); /* the legal order: access first */
    reserve_and_create(2 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    set_rw(va, 2 * MIB);
    CHECK(gpemu_launch(NULL, (void *)va, 4096, GP_SIM_WRITE, 1, 10) == cudaSuccess, "kernel after cuMemSetAccess");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS, "unmap");
    /* a new mapping at the same address starts with no access again (cuda.h, cuMemUnmap) */
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map again");
    CHECK(gpemu_launch(NULL, (void *)va, 4096, GP_SIM_READ, 1, 10) == cudaErrorIllegalAddress, "remapped: no access");
    CHECK(gpemu_rule_count(GPEMU_RULE_ACCESS_BEFORE_USE) == 1, "one violation");
    gpemu_forget_violations();
    gpemu_shutdown();
    gpemu_forget_violations();
}

static void rule_set_access_mapped(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(4 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(drv.set_access(va, 4 * MIB, &d, 1) == CUDA_ERROR_INVALID_VALUE, "half of it unmapped");
    CHECK(drv.set_access(va, 2 * MIB, &d, 1) == CUDA_SUCCESS, "the mapping");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS && drv.release(h) == CUDA_SUCCESS, "cleanup");
    CHECK(drv.address_free(va, 4 * MIB) == CUDA_SUCCESS, "free");
    down_expecting(GPEMU_RULE_SET_ACCESS_MAPPED, GPEMU_RULE_COUNT);
}

static void rule_unmap_whole(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(4 * MIB, 4 * MIB, &va, &h);
    CHECK(drv.map(va, 4 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_ERROR_INVALID_VALUE, "a sub-range");
    CHECK(drv.unmap(va + 2 * MIB, 2 * MIB) == CUDA_ERROR_INVALID_VALUE, "the other half");
    CHECK(drv.unmap(va, 4 * MIB) == CUDA_SUCCESS, "the whole mapping");
    CHECK(drv.release(h) == CUDA_SUCCESS && drv.address_free(va, 4 * MIB) == CUDA_SUCCESS, "cleanup");
    down_expecting(GPEMU_RULE_UNMAP_WHOLE, GPEMU_RULE_COUNT);
}

static void rule_unmap_in_flight(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(2 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    set_rw(va, 2 * MIB);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(gpemu_launch(s, (void *)va, 2 * MIB, GP_SIM_WRITE, 3, 1000000) == cudaSuccess, "a long kernel");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS, "CUDA unmaps (it does not wait)");
    CHECK(gpemu_rule_count(GPEMU_RULE_UNMAP_IN_FLIGHT) == 1, "under a kernel in flight");
    CHECK(cudaPeekAtLastError() == cudaErrorIllegalAddress, "the kernel faults: the context ends");
    gpemu_forget_violations();
    gpemu_shutdown();
    gpemu_forget_violations();

    up(); /* legal: synchronise the device first (what the pool does when it cannot name the stream) */
    reserve_and_create(2 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    set_rw(va, 2 * MIB);
    CHECK(gpemu_launch(NULL, (void *)va, 2 * MIB, GP_SIM_WRITE, 3, 1000000) == cudaSuccess, "a long kernel");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS, "unmap after the kernel");
    CHECK(drv.release(h) == CUDA_SUCCESS && drv.address_free(va, 2 * MIB) == CUDA_SUCCESS, "cleanup");
    CHECK(gpemu_shutdown() == 0, "no violation: %s", gpemu_first_violation());

    up(); /* legal too: wait for the stream that used it (an event recorded after its work, as the pool's
           * fence: provider/pages.c), while another stream's kernel on other memory still runs */
    CUdeviceptr other;
    CUmemGenericAllocationHandle oh;
    reserve_and_create(2 * MIB, 2 * MIB, &va, &h);
    reserve_and_create(2 * MIB, 2 * MIB, &other, &oh);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS && drv.map(other, 2 * MIB, 0, oh, 0) == CUDA_SUCCESS, "map");
    set_rw(va, 2 * MIB);
    set_rw(other, 2 * MIB);
    cudaStream_t g;
    cudaEvent_t done;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaStreamCreateWithFlags(&g, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess, "event");
    CHECK(gpemu_launch(s, (void *)va, 2 * MIB, GP_SIM_WRITE, 3, 1000) == cudaSuccess, "a kernel on s");
    CHECK(gpemu_launch(g, (void *)other, 2 * MIB, GP_SIM_WRITE, 3, 1000000) == cudaSuccess, "a long one on g");
    CHECK(cudaEventRecord(done, s) == cudaSuccess && cudaEventSynchronize(done) == cudaSuccess, "wait for s");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS, "unmap after s's kernel, g's still running");
    CHECK(gpemu_rule_count(GPEMU_RULE_UNMAP_IN_FLIGHT) == 0, "s's work is done: %s", gpemu_first_violation());
    CHECK(cudaStreamSynchronize(g) == cudaSuccess, "wait for g");
    CHECK(drv.unmap(other, 2 * MIB) == CUDA_SUCCESS, "unmap after g's kernel");
    CHECK(drv.release(h) == CUDA_SUCCESS && drv.address_free(va, 2 * MIB) == CUDA_SUCCESS, "cleanup");
    CHECK(drv.release(oh) == CUDA_SUCCESS && drv.address_free(other, 2 * MIB) == CUDA_SUCCESS, "cleanup");
    CHECK(cudaEventDestroy(done) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess &&
              cudaStreamDestroy(g) == cudaSuccess,
          "cleanup");
    CHECK(gpemu_shutdown() == 0, "no violation: %s", gpemu_first_violation());
}

static void rule_address_free(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(4 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    CHECK(drv.address_free(va, 4 * MIB) == CUDA_ERROR_INVALID_VALUE, "with a mapping in it");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS, "unmap");
    CHECK(drv.address_free(va, 2 * MIB) == CUDA_ERROR_INVALID_VALUE, "not the reserved size");
    CHECK(drv.address_free(va, 4 * MIB) == CUDA_SUCCESS, "exact and empty");
    CHECK(drv.release(h) == CUDA_SUCCESS, "release");
    down_expecting(GPEMU_RULE_ADDRESS_FREE, GPEMU_RULE_COUNT);
}

static void rule_handle(void)
{
    up();
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    reserve_and_create(2 * MIB, 2 * MIB, &va, &h);
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS, "map");
    CHECK(drv.release(h) == CUDA_SUCCESS, "release while mapped is legal (freed at the last unmap)");
    CHECK(drv.release(h) == CUDA_ERROR_INVALID_VALUE, "twice is not");
    CHECK(drv.unmap(va, 2 * MIB) == CUDA_SUCCESS, "unmap frees it");
    CHECK(drv.map(va, 2 * MIB, 0, h, 0) == CUDA_ERROR_INVALID_VALUE, "a freed handle cannot be mapped");
    CHECK(drv.address_free(va, 2 * MIB) == CUDA_SUCCESS, "free");
    down_expecting(GPEMU_RULE_HANDLE, GPEMU_RULE_COUNT);
}

static void rule_free_pointer(void)
{
    up();
    void *p = NULL, *host = NULL;
    CHECK(cudaMalloc(&p, 3 * MIB) == cudaSuccess, "malloc");
    CHECK(cudaFree((char *)p + 512) == cudaErrorInvalidValue, "an interior pointer");
    CHECK(cudaFree(p) == cudaSuccess, "free");
    CHECK(cudaFree(p) == cudaErrorInvalidValue, "twice");
    CHECK(cudaHostAlloc(&host, 4096, cudaHostAllocPortable) == cudaSuccess, "host alloc");
    CHECK(cudaFreeHost(host) == cudaSuccess && cudaFreeHost(host) == cudaErrorInvalidValue, "host free twice");
    cudaGetLastError();
    down_expecting(GPEMU_RULE_FREE_POINTER, GPEMU_RULE_COUNT);
}

static void rule_kernel_memory(void)
{
    up();
    void *p = NULL;
    CHECK(cudaMalloc(&p, 2 * MIB) == cudaSuccess, "malloc");
    CHECK(gpemu_launch(NULL, p, 2 * MIB, GP_SIM_WRITE, 1, 10) == cudaSuccess, "on allocated memory");
    CHECK(cudaFree(p) == cudaSuccess, "free (waits for the kernel)");
    CHECK(gpemu_launch(NULL, p, 4096, GP_SIM_READ, 1, 10) == cudaErrorIllegalAddress, "after the free");
    gpemu_forget_violations();
    gpemu_shutdown();
    gpemu_forget_violations();
}

static void rule_error_pending(void)
{
    up();
    void *p = NULL;
    CHECK(cudaMalloc(&p, 1024 * MIB) == cudaErrorMemoryAllocation, "more than the device");
    CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation, "the thread's last error");
    void *q = NULL;
    CHECK(cudaMalloc(&q, 2 * MIB) == cudaSuccess, "non-sticky: the next call works");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation && cudaGetLastError() == cudaSuccess, "cleared once read");
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess, "event");
    CHECK(gpemu_launch(NULL, q, 2 * MIB, GP_SIM_WRITE, 1, 1000000) == cudaSuccess, "long kernel");
    CHECK(cudaEventRecord(ev, NULL) == cudaSuccess, "record");
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady, "not ready");
    /* what tests check after every pool call: no error the pool caused is left for the application */
    if (cudaPeekAtLastError() != cudaSuccess)
        gpemu_report(GPEMU_RULE_ERROR_PENDING, "cudaErrorNotReady left pending after cudaEventQuery");
    CHECK(cudaGetLastError() == cudaErrorNotReady, "cudaGetLastError clears it");
    CHECK(cudaEventSynchronize(ev) == cudaSuccess && cudaEventQuery(ev) == cudaSuccess, "then ready");
    CHECK(cudaEventDestroy(ev) == cudaSuccess && cudaFree(q) == cudaSuccess, "cleanup");
    down_expecting(GPEMU_RULE_ERROR_PENDING, GPEMU_RULE_COUNT);
}

struct other_thread {
    cudaError_t malloc_err;
};

static void *malloc_on_other_thread(void *arg)
{
    struct other_thread *o = arg;
    void *p = NULL;
    cudaSetDevice(0);
    o->malloc_err = cudaMalloc(&p, 2 * MIB);
    if (o->malloc_err == cudaSuccess)
        cudaFree(p);
    cudaGetLastError();
    return NULL;
}

static void rule_capture_unsafe(void)
{
    up();
    cudaStream_t s;
    cudaGraph_t g = (cudaGraph_t)1;
    void *p = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
    CHECK(cudaMalloc(&p, 2 * MIB) == cudaErrorStreamCaptureUnsupported, "cudaMalloc while capturing (global)");
    enum cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusInvalidated, "invalidated");
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL, "no graph");
    cudaGetLastError();

    /* another thread in global mode while this one captures globally: prohibited too */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
    struct other_thread o;
    pthread_t t;
    pthread_create(&t, NULL, malloc_on_other_thread, &o);
    pthread_join(t, NULL);
    CHECK(o.malloc_err == cudaErrorStreamCaptureUnsupported, "other thread: %d", (int)o.malloc_err);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated, "invalidated by the other thread");
    cudaGetLastError();
    uint64_t broken = gpemu_rule_count(GPEMU_RULE_CAPTURE_UNSAFE);
    CHECK(broken == 2, "two unsafe calls (%llu)", (unsigned long long)broken);

    /* legal: a thread-local capture ignores other threads; a relaxed thread may call cudaMalloc */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin thread-local");
    pthread_create(&t, NULL, malloc_on_other_thread, &o);
    pthread_join(t, NULL);
    CHECK(o.malloc_err == cudaSuccess, "other thread may allocate: %d", (int)o.malloc_err);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess && mode == cudaStreamCaptureModeGlobal, "relax");
    CHECK(cudaMalloc(&p, 2 * MIB) == cudaSuccess, "relaxed cudaMalloc during capture");
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess, "restore");
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g != NULL, "a valid (empty) graph");
    CHECK(cudaGraphDestroy(g) == cudaSuccess && cudaFree(p) == cudaSuccess, "cleanup");
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
    CHECK(gpemu_rule_count(GPEMU_RULE_CAPTURE_UNSAFE) == broken, "the legal calls counted nothing");
    down_expecting(GPEMU_RULE_CAPTURE_UNSAFE, GPEMU_RULE_COUNT);
}

static void rule_capture_sync(void)
{
    up();
    cudaStream_t s;
    cudaEvent_t ev;
    cudaGraph_t g;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess, "event");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess, "begin relaxed");
    CHECK(cudaEventRecord(ev, s) == cudaSuccess, "record inside the capture");
    CHECK(cudaEventQuery(ev) == cudaErrorCapturedEvent, "query of a captured event, even relaxed");
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated, "invalidated");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess, "begin");
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported, "sync of the capturing stream");
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated, "invalidated");
    cudaGetLastError();
    CHECK(cudaEventRecord(ev, s) == cudaSuccess && cudaEventSynchronize(ev) == cudaSuccess, "outside: legal");
    CHECK(cudaEventDestroy(ev) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "cleanup");
    down_expecting(GPEMU_RULE_CAPTURE_SYNC, GPEMU_RULE_COUNT);
}

static void rule_capture_isolation(void)
{
    up();
    cudaStream_t s, t;
    cudaEvent_t outside, inside;
    cudaGraph_t g;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming) == cudaSuccess, "event");
    CHECK(cudaEventCreateWithFlags(&inside, cudaEventDisableTiming) == cudaSuccess, "event");
    CHECK(cudaEventRecord(outside, t) == cudaSuccess, "record outside");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
    CHECK(cudaEventRecord(inside, s) == cudaSuccess, "record inside");
    CHECK(cudaStreamWaitEvent(t, inside, 0) == cudaSuccess, "t forks into the capture (legal)");
    CHECK(cudaStreamWaitEvent(s, outside, 0) == cudaErrorStreamCaptureIsolation, "wait on an outside event");
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated, "invalidated");
    cudaGetLastError();
    CHECK(cudaEventDestroy(outside) == cudaSuccess && cudaEventDestroy(inside) == cudaSuccess, "cleanup");
    CHECK(cudaStreamDestroy(s) == cudaSuccess && cudaStreamDestroy(t) == cudaSuccess, "cleanup");
    down_expecting(GPEMU_RULE_CAPTURE_ISOLATION, GPEMU_RULE_COUNT);
}

static void *end_capture_elsewhere(void *arg)
{
    cudaGraph_t g;
    *(cudaError_t *)((void **)arg)[1] = cudaStreamEndCapture(*(cudaStream_t *)((void **)arg)[0], &g);
    return NULL;
}

static void rule_capture_sequence(void)
{
    up();
    cudaStream_t s;
    cudaGraph_t g;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported, "legacy stream");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState, "twice");
    cudaError_t other = cudaSuccess;
    void *args[2] = {&s, &other};
    pthread_t t;
    pthread_create(&t, NULL, end_capture_elsewhere, args);
    pthread_join(t, NULL);
    CHECK(other == cudaErrorStreamCaptureWrongThread, "ended from another thread: %d", (int)other);
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g != NULL, "ended here");
    CHECK(cudaGraphDestroy(g) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "cleanup");
    cudaGetLastError();
    down_expecting(GPEMU_RULE_CAPTURE_SEQUENCE, GPEMU_RULE_COUNT);
}

static void rule_use_after_destroy(void)
{
    up();
    cudaStream_t s;
    cudaEvent_t ev;
    CHECK(cudaStreamCreate(&s) == cudaSuccess && cudaEventCreate(&ev) == cudaSuccess, "create");
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
    CHECK(cudaEventRecord(ev, s) == cudaErrorInvalidResourceHandle, "record on a destroyed stream");
    CHECK(cudaEventDestroy(ev) == cudaSuccess, "destroy");
    CHECK(cudaEventQuery(ev) == cudaErrorInvalidResourceHandle, "query of a destroyed event");
    cudaGetLastError();
    down_expecting(GPEMU_RULE_USE_AFTER_DESTROY, GPEMU_RULE_COUNT);
}

static void graph_replay_reruns_the_kernels(void)
{
    up();
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t x;
    void *p = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(cudaMalloc(&p, 2 * MIB) == cudaSuccess, "malloc");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
    CHECK(gpemu_launch(s, p, 2 * MIB, GP_SIM_WRITE, 42, 100) == cudaSuccess, "captured write");
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&x, g, 0) == cudaSuccess, "graph");
    gp_sim_report r0;
    gp_sim_get_report(gpemu_sim(0), &r0);
    CHECK(gpemu_launch(s, p, 2 * MIB, GP_SIM_WRITE, 7, 10) == cudaSuccess, "overwrite outside");
    CHECK(cudaGraphLaunch(x, s) == cudaSuccess, "replay");
    CHECK(gpemu_launch(s, p, 2 * MIB, GP_SIM_CHECK, 42, 10) == cudaSuccess, "check the replay's pattern");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    gp_sim_report r;
    gp_sim_get_report(gpemu_sim(0), &r);
    CHECK(r.pattern_mismatches == 0, "the replay wrote pattern 42: %s", gp_sim_first_violation(gpemu_sim(0)));
    CHECK(cudaGraphExecDestroy(x) == cudaSuccess && cudaGraphDestroy(g) == cudaSuccess, "cleanup");
    CHECK(cudaFree(p) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "cleanup");
    CHECK(gpemu_shutdown() == 0, "no violation: %s", gpemu_first_violation());
}

int main(void)
{
    RUN(rule_device_ordinal);
    RUN(rule_stream_device);
    RUN(rule_driver_context);
    RUN(rule_map_offset);
    RUN(rule_map_granule);
    RUN(rule_map_reserved);
    RUN(rule_access_before_use_and_sticky);
    RUN(rule_set_access_mapped);
    RUN(rule_unmap_whole);
    RUN(rule_unmap_in_flight);
    RUN(rule_address_free);
    RUN(rule_handle);
    RUN(rule_free_pointer);
    RUN(rule_kernel_memory);
    RUN(rule_error_pending);
    RUN(rule_capture_unsafe);
    RUN(rule_capture_sync);
    RUN(rule_capture_isolation);
    RUN(rule_capture_sequence);
    RUN(rule_use_after_destroy);
    RUN(graph_replay_reruns_the_kernels);
    printf("%s: %d failure(s)\n", test_failures ? "FAILED" : "passed", test_failures);
    return test_failures != 0;
}
