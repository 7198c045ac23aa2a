/*
 * emu_rules.c — the CUDA emulation's rules: what each says, where CUDA documents it, and the ledger
 * of violations (counts per rule, the first one's text).
 *
 * Sources are the CUDA 13.0 headers as installed in /usr/local/cuda/include (the doc comments there
 * are the CUDA Runtime / Driver API reference) and the CUDA C++ Programming Guide. Each rule is shown
 * broken on purpose by a test in tests/emu/ (named in the table's last column).
 */
#ifndef GPUPOOL_CUDA_EMULATION
#error "pool/cuda_emu/ is the CUDA emulation for tests: it must never be compiled into libgpupool"
#endif
#include "cuda_emu/emu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    const char *source;
} rules[GPEMU_RULE_COUNT] = {
    [GPEMU_RULE_DEVICE_ORDINAL] = {"device ordinal",
        "cuda_runtime_api.h cudaSetDevice, cudaGetDeviceProperties: return cudaErrorInvalidDevice for a device "
        "not in 0..count-1"},
    [GPEMU_RULE_STREAM_DEVICE] = {"stream and event on one device",
        "cuda_runtime_api.h cudaEventRecord: 'event and stream must be on the same CUDA context' "
        "(cudaErrorInvalidResourceHandle); a NULL stream is the CURRENT device's (Programming Guide, "
        "Multi-Device System: 'Stream and Event Behavior' - a kernel launch fails if the stream is not "
        "associated to the current device)"},
    [GPEMU_RULE_DRIVER_CONTEXT] = {"driver call needs a current context",
        "cuda.h CUDA_ERROR_INVALID_CONTEXT: 'no context bound to the current thread'; Programming Guide, "
        "Interoperability between Runtime and Driver APIs: the runtime makes a device's primary context "
        "current when it initialises that device for the thread (cudaSetDevice does, cudaGetDevice does not)"},
    [GPEMU_RULE_MAP_OFFSET] = {"cuMemMap offset 0",
        "cuda.h cuMemMap: 'offset - Offset into the memory represented by handle ... Note: currently must be zero'"},
    [GPEMU_RULE_MAP_GRANULE] = {"whole granules",
        "cuda.h cuMemMap: 'ptr, size, and offset must be a multiple of the value given via "
        "cuMemGetAllocationGranularity with CU_MEM_ALLOC_GRANULARITY_MINIMUM'; cuMemCreate: 'size ... must be a "
        "multiple of the value given via cuMemGetAllocationGranularity'"},
    [GPEMU_RULE_MAP_RESERVED] = {"map into reserved, unmapped space",
        "cuda.h cuMemMap: 'This range must be an address reservation previously reserved with "
        "cuMemAddressReserve' and 'cuMemMap can only create mappings on VA range reservations that are not "
        "currently mapped'"},
    [GPEMU_RULE_ACCESS_BEFORE_USE] = {"cuMemSetAccess before use",
        "cuda.h cuMemMap: 'calling cuMemMap does not make the address accessible, the caller needs to update "
        "accessibility ... by calling cuMemSetAccess'; cuMemUnmap: 'all mappings start with no accessibility "
        "setup'. A kernel access is an illegal address (cudaErrorIllegalAddress, sticky)"},
    [GPEMU_RULE_SET_ACCESS_MAPPED] = {"cuMemSetAccess on mapped memory",
        "cuda.h cuMemSetAccess: 'The range must be a fully mapped address range containing all allocations "
        "created by cuMemMap / cuMemCreate'"},
    [GPEMU_RULE_UNMAP_WHOLE] = {"cuMemUnmap whole mappings",
        "cuda.h cuMemUnmap: 'The range must be the entire contiguous address range that was mapped to. In other "
        "words, cuMemUnmap cannot unmap a sub-range of an address range mapped by cuMemCreate / cuMemMap'"},
    [GPEMU_RULE_UNMAP_IN_FLIGHT] = {"no unmap under kernels in flight",
        "cuda.h cuMemUnmap does not wait for queued work (unlike cudaFree, cuda_runtime_api.h: cudaFree "
        "'implicitly synchronizes'); a kernel that then touches the address faults with "
        "cudaErrorIllegalAddress, which is sticky (driver_types.h: 'the context cannot be used anymore')"},
    [GPEMU_RULE_ADDRESS_FREE] = {"cuMemAddressFree of an unmapped reservation",
        "cuda.h cuMemAddressFree: 'The size must match what was given to memAddressReserve and the ptr given "
        "must match what was returned from memAddressReserve'; Programming Guide, Virtual Memory Management: "
        "mappings are unmapped (cuMemUnmap) before the range is freed (cuMemAddressFree)"},
    [GPEMU_RULE_HANDLE] = {"live allocation handle",
        "cuda.h cuMemRelease / cuMemMap: CUDA_ERROR_INVALID_VALUE 'if handle is not a valid handle'"},
    [GPEMU_RULE_FREE_POINTER] = {"free what was allocated, once",
        "cuda_runtime_api.h cudaFree: 'devPtr ... must have been returned by a previous call to cudaMalloc "
        "... Otherwise, or if cudaFree(devPtr) has already been called before, an error is returned'; "
        "cudaFreeHost: 'ptr ... returned by cudaMallocHost or cudaHostAlloc'"},
    [GPEMU_RULE_KERNEL_MEMORY] = {"kernels on allocated memory",
        "driver_types.h cudaErrorIllegalAddress: 'The device encountered a load or store instruction on an "
        "invalid memory address. ... the context cannot be used anymore'"},
    [GPEMU_RULE_STICKY] = {"sticky errors end the context",
        "driver_types.h cudaErrorIllegalAddress / cudaErrorLaunchFailure: 'This leaves the process in an "
        "inconsistent state and any further CUDA work will return the same error'"},
    [GPEMU_RULE_ERROR_PENDING] = {"non-sticky errors are the thread's last error until cleared",
        "cuda_runtime_api.h cudaGetLastError: 'Returns the last error that has been produced by any of the "
        "runtime calls in the same instance of the CUDA Runtime library in the host thread and resets it to "
        "cudaSuccess'; driver_types.h cudaErrorNotReady: 'not actually an error'"},
    [GPEMU_RULE_CAPTURE_UNSAFE] = {"no unsafe call while capturing",
        "cuda_runtime_api.h cudaThreadExchangeStreamCaptureMode: in cudaStreamCaptureModeGlobal/ThreadLocal "
        "'this thread is prohibited from potentially unsafe API calls' (cudaMalloc is the example); "
        "driver_types.h cudaErrorStreamCaptureUnsupported 'The operation is not permitted when the stream is "
        "capturing'; the capture is invalidated (cudaErrorStreamCaptureInvalidated)"},
    [GPEMU_RULE_CAPTURE_SYNC] = {"no sync or query of what a capture owns",
        "cuda_runtime_api.h cudaThreadExchangeStreamCaptureMode: even relaxed, 'the thread is still prohibited "
        "from API calls which necessarily conflict with stream capture, for example, attempting cudaEventQuery "
        "on an event that was last recorded inside a capture sequence' (driver_types.h cudaErrorCapturedEvent); "
        "synchronising a capturing stream or device: cudaErrorStreamCaptureUnsupported"},
    [GPEMU_RULE_CAPTURE_ISOLATION] = {"capture isolation",
        "driver_types.h cudaErrorStreamCaptureIsolation: 'A dependency would have been created which crosses "
        "the capture sequence boundary. Only implicit in-stream ordering dependencies are allowed to cross the "
        "boundary'"},
    [GPEMU_RULE_CAPTURE_SEQUENCE] = {"capture sequence",
        "cuda_runtime_api.h cudaStreamBeginCapture: 'Capture may not be initiated if stream is "
        "cudaStreamLegacy ... it may only be initiated if the stream is not already in capture mode ... If mode "
        "is not cudaStreamCaptureModeRelaxed, cudaStreamEndCapture must be called on this stream from the same "
        "thread'; cudaStreamIsCapturing / GetCaptureInfo on the legacy stream while a blocking stream captures: "
        "cudaErrorStreamCaptureImplicit"},
    [GPEMU_RULE_USE_AFTER_DESTROY] = {"no use after destroy",
        "cuda_runtime_api.h cudaStreamDestroy / cudaEventDestroy: the handle is invalid afterwards "
        "(cudaErrorInvalidResourceHandle)"},
};

const char *gpemu_rule_name(enum gpemu_rule rule)
{
    return (unsigned)rule < GPEMU_RULE_COUNT ? rules[rule].name : "?";
}

const char *gpemu_rule_source(enum gpemu_rule rule)
{
    return (unsigned)rule < GPEMU_RULE_COUNT ? rules[rule].source : "?";
}

void gpemu_violation_locked(enum gpemu_rule rule, const char *fmt, ...)
{
    g_emu.rule_counts[rule]++;
    g_emu.violations++;
    if (g_emu.first_violation[0] != '\0')
        return;
    char text[GPEMU_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int n = snprintf(g_emu.first_violation, sizeof g_emu.first_violation, "rule '%s' broken: ", rules[rule].name);
    size_t used = n > 0 && (size_t)n < sizeof g_emu.first_violation ? (size_t)n : 0;
    size_t room = sizeof g_emu.first_violation - used;
    size_t len = strlen(text);
    if (len >= room)
        len = room - 1;
    memcpy(g_emu.first_violation + used, text, len);
    g_emu.first_violation[used + len] = '\0';
    if (g_emu.print_violations)
        fprintf(stderr, "cuda-emulation: %s [source: %s]\n", g_emu.first_violation, rules[rule].source);
}

void gpemu_report(enum gpemu_rule rule, const char *what)
{
    gpemu_lock();
    gpemu_violation_locked(rule, "%s", what);
    gpemu_unlock();
}

uint64_t gpemu_violations(void)
{
    gpemu_lock();
    uint64_t n = g_emu.violations;
    gpemu_unlock();
    return n;
}

uint64_t gpemu_rule_count(enum gpemu_rule rule)
{
    gpemu_lock();
    uint64_t n = (unsigned)rule < GPEMU_RULE_COUNT ? g_emu.rule_counts[rule] : 0;
    gpemu_unlock();
    return n;
}

const char *gpemu_first_violation(void)
{
    return g_emu.first_violation;
}

void gpemu_forget_violations(void)
{
    gpemu_lock();
    memset(g_emu.rule_counts, 0, sizeof g_emu.rule_counts);
    g_emu.violations = 0;
    g_emu.first_violation[0] = '\0';
    gpemu_unlock();
}
