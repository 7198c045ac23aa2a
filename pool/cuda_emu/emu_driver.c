/*
 * emu_driver.c — the CUDA emulation's driver API (a TEST DEVICE): the cuMem* virtual memory functions
 * backend_vmm.c calls, reachable ONLY through cudaGetDriverEntryPointByVersion (they are static: a
 * build that linked libcuda's names would not find them, as the project's rule wants).
 *
 * Every function checks the rules of its cuda.h documentation (emu_rules.c) before it touches the
 * sim: a driver call needs a context bound to the thread; sizes and addresses are whole granules
 * (2 MiB); cuMemMap maps offset 0 of a live handle into reserved, unmapped space; access is set on
 * fully mapped ranges; cuMemUnmap takes whole mappings and never ones a kernel in flight still uses;
 * cuMemAddressFree takes an exact reservation with nothing mapped in it. cuMemRelease of a mapped
 * handle is legal (CUDA frees the memory when the last mapping goes) and is emulated so.
 * Limitation: a mapping covers its whole handle (the sim maps handles whole); a smaller size is
 * refused with CUDA_ERROR_NOT_SUPPORTED, not as a rule violation.
 */
#ifndef GPUPOOL_CUDA_EMULATION
#error "pool/cuda_emu/ is the CUDA emulation for tests: it must never be compiled into libgpupool"
#endif
#include "cuda_emu/emu_internal.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const gp_backend_ops *sim_ops(void)
{
    return &gp_backend_sim_vmm;
}

static CUresult from_gp(int rc)
{
    return rc == GP_OK ? CUDA_SUCCESS : rc == GP_ERR_OOM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
}

/* The device of the thread's current context, or -1 with the violation counted. */
static int context_device(const char *call, CUresult *res)
{
    emu_thread *t = gpemu_thread();
    if (!g_emu.up) {
        *res = CUDA_ERROR_NOT_INITIALIZED;
        return -1;
    }
    if (t->bound < 0) {
        gpemu_violation_locked(GPEMU_RULE_DRIVER_CONTEXT,
                               "%s on a thread with no current context (no cudaSetDevice and no runtime call that "
                               "initialised a device on this thread)", call);
        *res = CUDA_ERROR_INVALID_CONTEXT;
        return -1;
    }
    if (g_emu.devices[t->bound].sticky != cudaSuccess) {
        gpemu_check_sticky(t->bound, call);
        *res = CUDA_ERROR_ILLEGAL_ADDRESS;
        return -1;
    }
    if (gpemu_capture_unsafe(call) != cudaSuccess) {
        *res = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        return -1;
    }
    return t->bound;
}

static bool granular(uint64_t v)
{
    return v % GPEMU_GRANULE == 0;
}

static CUresult get_error_name(CUresult error, const char **pStr)
{
    static const struct {
        CUresult res;
        const char *name, *text;
    } names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
        {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
        {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
        {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
        {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
         "operation not permitted when stream is capturing"},
        {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].res == error) {
            pStr[0] = names[i].name;
            pStr[1] = names[i].text; /* callers pass a two-slot buffer, see below */
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult cu_get_error_name(CUresult error, const char **pStr)
{
    const char *both[2] = {NULL, NULL};
    CUresult res = get_error_name(error, both);
    if (res == CUDA_SUCCESS)
        *pStr = both[0];
    return res;
}

static CUresult cu_get_error_string(CUresult error, const char **pStr)
{
    const char *both[2] = {NULL, NULL};
    CUresult res = get_error_name(error, both);
    if (res == CUDA_SUCCESS)
        *pStr = both[1];
    return res;
}

static bool prop_ok(const CUmemAllocationProp *prop)
{
    return prop != NULL && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < g_emu.device_count;
}

static CUresult cu_get_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                   CUmemAllocationGranularity_flags option)
{
    (void)option;
    gpemu_lock();
    CUresult res = g_emu.up ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (res == CUDA_SUCCESS && (granularity == NULL || !prop_ok(prop)))
        res = CUDA_ERROR_INVALID_VALUE;
    if (res == CUDA_SUCCESS)
        *granularity = GPEMU_GRANULE;
    gpemu_unlock();
    return res;
}

static emu_handle *handle_find(uint64_t id, size_t *index)
{
    for (size_t i = 0; i < g_emu.handles.count; i++) {
        emu_handle *h = g_emu.handles.items[i];
        if (h->id == id) {
            if (index != NULL)
                *index = i;
            return h;
        }
    }
    return NULL;
}

static CUresult cu_mem_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemCreate", &res);
    if (device >= 0 && (handle == NULL || !prop_ok(prop) || flags != 0))
        res = CUDA_ERROR_INVALID_VALUE;
    if (device >= 0 && res == CUDA_SUCCESS && (size == 0 || !granular(size))) {
        gpemu_violation_locked(GPEMU_RULE_MAP_GRANULE, "cuMemCreate(size=%zu): not a multiple of the granularity %zu", size,
                               GPEMU_GRANULE);
        res = CUDA_ERROR_INVALID_VALUE;
    }
    emu_handle *h = NULL;
    if (device >= 0 && res == CUDA_SUCCESS && (h = calloc(1, sizeof *h)) == NULL)
        res = CUDA_ERROR_OUT_OF_MEMORY;
    if (h != NULL) {
        h->device = prop->location.id;
        h->size = size;
        h->id = ++g_emu.next_handle_id;
        res = from_gp(sim_ops()->phys_create(g_emu.devices[h->device].ctx, size, &h->sim));
        if (res == CUDA_SUCCESS && !gpemu_vec_push(&g_emu.handles, h)) {
            sim_ops()->phys_release(g_emu.devices[h->device].ctx, h->sim);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (res == CUDA_SUCCESS)
            *handle = h->id;
        else
            free(h);
    }
    gpemu_unlock();
    return res;
}

static void handle_free(emu_handle *h, size_t index)
{
    sim_ops()->phys_release(g_emu.devices[h->device].ctx, h->sim);
    gpemu_vec_remove(&g_emu.handles, index);
    free(h);
}

static CUresult cu_mem_release(CUmemGenericAllocationHandle handle)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemRelease", &res);
    size_t index = 0;
    emu_handle *h = device >= 0 ? handle_find(handle, &index) : NULL;
    if (device >= 0 && (h == NULL || h->released)) {
        gpemu_violation_locked(GPEMU_RULE_HANDLE, "cuMemRelease(0x%llx): not a live handle", handle);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (h != NULL) {
        h->released = true;
        if (h->maps == 0)
            handle_free(h, index);
    }
    gpemu_unlock();
    return res;
}

static emu_range *reservation_containing(uintptr_t va, size_t size)
{
    for (size_t i = 0; i < g_emu.reservations.count; i++) {
        emu_range *r = g_emu.reservations.items[i];
        if (va >= r->va && va + size <= r->va + r->size && size <= r->size)
            return r;
    }
    return NULL;
}

emu_range *gpemu_mapping_at(uintptr_t va)
{
    for (size_t i = 0; i < g_emu.mappings.count; i++) {
        emu_range *m = g_emu.mappings.items[i];
        if (va >= m->va && va < m->va + m->size)
            return m;
    }
    return NULL;
}

static size_t mappings_overlapping(uintptr_t va, size_t size)
{
    size_t n = 0;
    for (size_t i = 0; i < g_emu.mappings.count; i++) {
        emu_range *m = g_emu.mappings.items[i];
        if (m->va < va + size && va < m->va + m->size)
            n++;
    }
    return n;
}

static CUresult cu_mem_address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemAddressReserve", &res);
    if (device >= 0 && (ptr == NULL || flags != 0 || (alignment & (alignment - 1)) != 0))
        res = CUDA_ERROR_INVALID_VALUE;
    if (device >= 0 && res == CUDA_SUCCESS && (size == 0 || !granular(size) || !granular(addr))) {
        gpemu_violation_locked(GPEMU_RULE_MAP_GRANULE, "cuMemAddressReserve(size=%zu, addr=0x%llx): not whole granules", size,
                               addr);
        res = CUDA_ERROR_INVALID_VALUE;
    }
    emu_range *r = NULL;
    if (device >= 0 && res == CUDA_SUCCESS && (r = calloc(1, sizeof *r)) == NULL)
        res = CUDA_ERROR_OUT_OF_MEMORY;
    if (r != NULL) {
        gp_devptr va = 0;
        r->device = device;
        r->size = size;
        res = from_gp(sim_ops()->va_reserve(g_emu.devices[device].ctx, size, &va));
        if (res == CUDA_SUCCESS && !gpemu_vec_push(&g_emu.reservations, r)) {
            sim_ops()->va_release(g_emu.devices[device].ctx, va, size);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (res == CUDA_SUCCESS) {
            r->va = va;
            *ptr = va;
        } else {
            free(r);
        }
    }
    gpemu_unlock();
    return res;
}

static CUresult cu_mem_address_free(CUdeviceptr ptr, size_t size)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemAddressFree", &res);
    size_t index = 0;
    emu_range *r = NULL;
    for (size_t i = 0; device >= 0 && i < g_emu.reservations.count && r == NULL; i++) {
        emu_range *c = g_emu.reservations.items[i];
        if (c->va == ptr && c->size == size) {
            r = c;
            index = i;
        }
    }
    if (device >= 0 && r == NULL) {
        gpemu_violation_locked(GPEMU_RULE_ADDRESS_FREE, "cuMemAddressFree(0x%llx, %zu): not exactly one reservation", ptr, size);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (r != NULL && mappings_overlapping(ptr, size) > 0) {
        gpemu_violation_locked(GPEMU_RULE_ADDRESS_FREE, "cuMemAddressFree(0x%llx, %zu) with %zu mappings still in it", ptr, size,
                               mappings_overlapping(ptr, size));
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (r != NULL) {
        res = from_gp(sim_ops()->va_release(g_emu.devices[r->device].ctx, r->va, r->size));
        if (res == CUDA_SUCCESS) {
            gpemu_vec_remove(&g_emu.reservations, index);
            free(r);
        }
    }
    gpemu_unlock();
    return res;
}

static CUresult cu_mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                           unsigned long long flags)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemMap", &res);
    emu_handle *h = device >= 0 ? handle_find(handle, NULL) : NULL;
    emu_range *r = device >= 0 ? reservation_containing(ptr, size) : NULL;
    if (device < 0) {
        /* res set */
    } else if (flags != 0) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (offset != 0) {
        gpemu_violation_locked(GPEMU_RULE_MAP_OFFSET, "cuMemMap(ptr=0x%llx, offset=%zu)", ptr, offset);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (size == 0 || !granular(size) || !granular(ptr)) {
        gpemu_violation_locked(GPEMU_RULE_MAP_GRANULE, "cuMemMap(ptr=0x%llx, size=%zu): not whole granules of %zu", ptr, size,
                               GPEMU_GRANULE);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (h == NULL || h->released) {
        gpemu_violation_locked(GPEMU_RULE_HANDLE, "cuMemMap(handle=0x%llx): not a live handle", handle);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (size > h->size) {
        gpemu_violation_locked(GPEMU_RULE_MAP_GRANULE, "cuMemMap(size=%zu) of a %zu-byte handle: offset + size past its end", size,
                               h->size);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (r == NULL) {
        gpemu_violation_locked(GPEMU_RULE_MAP_RESERVED, "cuMemMap(ptr=0x%llx, size=%zu): not inside one reservation", ptr, size);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (mappings_overlapping(ptr, size) > 0) {
        gpemu_violation_locked(GPEMU_RULE_MAP_RESERVED, "cuMemMap(ptr=0x%llx, size=%zu) over an existing mapping", ptr, size);
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (size != h->size) {
        res = CUDA_ERROR_NOT_SUPPORTED; /* the emulation's limitation, see the header */
    } else if (r->device != h->device) {
        res = CUDA_ERROR_NOT_SUPPORTED; /* the sim's address space is per device */
    } else {
        emu_range *m = calloc(1, sizeof *m);
        if (m == NULL || !gpemu_vec_push(&g_emu.mappings, m)) {
            free(m);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            res = from_gp(sim_ops()->map(g_emu.devices[h->device].ctx, ptr, size, h->sim));
            if (res != CUDA_SUCCESS) {
                gpemu_vec_remove(&g_emu.mappings, g_emu.mappings.count - 1);
                free(m);
            } else {
                m->device = h->device;
                m->va = ptr;
                m->size = size;
                m->handle = h;
                m->access = 0; /* cuda.h: a new mapping has no access until cuMemSetAccess */
                h->maps++;
            }
        }
    }
    gpemu_unlock();
    return res;
}

static CUresult cu_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemSetAccess", &res);
    if (device >= 0 && (desc == NULL || count == 0))
        res = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; device >= 0 && res == CUDA_SUCCESS && i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= g_emu.device_count)
            res = CUDA_ERROR_INVALID_DEVICE;
    uintptr_t at = ptr;
    while (device >= 0 && res == CUDA_SUCCESS && at < ptr + size) {
        emu_range *m = gpemu_mapping_at(at);
        if (m == NULL || m->va != at || m->va + m->size > ptr + size) {
            gpemu_violation_locked(GPEMU_RULE_SET_ACCESS_MAPPED, "cuMemSetAccess(0x%llx, %zu): 0x%" PRIxPTR " is not %s", ptr,
                                   size, at, m == NULL ? "mapped" : "the start of a mapping that ends inside the range");
            res = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        at = m->va + m->size;
    }
    for (at = ptr; device >= 0 && res == CUDA_SUCCESS && at < ptr + size;) {
        emu_range *m = gpemu_mapping_at(at);
        for (size_t i = 0; i < count; i++) {
            unsigned bit = 1u << desc[i].location.id;
            if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                m->access |= bit;
            else
                m->access &= ~bit; /* read-only is not distinguished: kernels here may write */
        }
        at = m->va + m->size;
    }
    gpemu_unlock();
    return res;
}

static CUresult cu_mem_unmap(CUdeviceptr ptr, size_t size)
{
    gpemu_lock();
    CUresult res = CUDA_SUCCESS;
    int device = context_device("cuMemUnmap", &res);
    uintptr_t at = ptr;
    while (device >= 0 && res == CUDA_SUCCESS && at < ptr + size) {
        emu_range *m = gpemu_mapping_at(at);
        if (m == NULL || m->va != at || m->va + m->size > ptr + size) {
            gpemu_violation_locked(GPEMU_RULE_UNMAP_WHOLE, "cuMemUnmap(0x%llx, %zu): 0x%" PRIxPTR " %s", ptr, size, at,
                                   m == NULL ? "is not mapped" : "starts or ends inside a mapping (a sub-range)");
            res = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        at = m->va + m->size;
    }
    if (device >= 0 && res == CUDA_SUCCESS && size == 0)
        res = CUDA_ERROR_INVALID_VALUE;
    if (device >= 0 && res == CUDA_SUCCESS && gpemu_in_flight(gpemu_mapping_at(ptr)->device, ptr, size)) {
        gpemu_violation_locked(GPEMU_RULE_UNMAP_IN_FLIGHT, "cuMemUnmap(0x%llx, %zu) while a kernel still uses the range", ptr,
                               size);
        /* CUDA unmaps anyway; the kernel then faults: the context ends. The simulated device (whose unmap
         * refuses a range in use) runs its queued work out first: after the fault nothing else counts. */
        int dev = gpemu_mapping_at(ptr)->device;
        gpemu_make_sticky(dev, cudaErrorIllegalAddress);
        (void)sim_ops()->device_synchronize(g_emu.devices[dev].ctx);
    }
    for (at = ptr; device >= 0 && res == CUDA_SUCCESS && at < ptr + size;) {
        size_t index = 0;
        while (((emu_range *)g_emu.mappings.items[index])->va != at)
            index++;
        emu_range *m = g_emu.mappings.items[index];
        at = m->va + m->size;
        res = from_gp(sim_ops()->unmap(g_emu.devices[m->device].ctx, m->va, m->size));
        if (res != CUDA_SUCCESS)
            break;
        emu_handle *h = m->handle;
        gpemu_vec_remove(&g_emu.mappings, index);
        free(m);
        if (--h->maps == 0 && h->released) {
            size_t hi = 0;
            handle_find(h->id, &hi);
            handle_free(h, hi);
        }
    }
    gpemu_unlock();
    return res;
}

void gpemu_driver_shutdown(void)
{
    if (g_emu.mappings.count > 0 || g_emu.reservations.count > 0 || g_emu.handles.count > 0)
        gpemu_violation_locked(GPEMU_RULE_FREE_POINTER, "leak at shutdown: %zu mappings, %zu reservations, %zu handles",
                               g_emu.mappings.count, g_emu.reservations.count, g_emu.handles.count);
    while (g_emu.mappings.count > 0) {
        emu_range *m = g_emu.mappings.items[0];
        sim_ops()->unmap(g_emu.devices[m->device].ctx, m->va, m->size);
        m->handle->maps--;
        gpemu_vec_remove(&g_emu.mappings, 0);
        free(m);
    }
    while (g_emu.handles.count > 0)
        handle_free(g_emu.handles.items[0], 0);
    while (g_emu.reservations.count > 0) {
        emu_range *r = g_emu.reservations.items[0];
        sim_ops()->va_release(g_emu.devices[r->device].ctx, r->va, r->size);
        gpemu_vec_remove(&g_emu.reservations, 0);
        free(r);
    }
    free(g_emu.mappings.items);
    free(g_emu.handles.items);
    free(g_emu.reservations.items);
    memset(&g_emu.mappings, 0, sizeof g_emu.mappings);
    memset(&g_emu.handles, 0, sizeof g_emu.handles);
    memset(&g_emu.reservations, 0, sizeof g_emu.reservations);
}

/* ---- entry points -------------------------------------------------------------------------------- */

/* Function pointers travel as void * (POSIX: same representation), copied with memcpy. */
#define ENTRY(sym, fn, since) {sym, since, (void (*)(void))(fn)}
static const struct {
    const char *symbol;
    unsigned since; /* the CUDA version that introduced this ABI */
    void (*fn)(void);
} entry_points[] = {
    ENTRY("cuGetErrorName", cu_get_error_name, 6000),
    ENTRY("cuGetErrorString", cu_get_error_string, 6000),
    ENTRY("cuMemGetAllocationGranularity", cu_get_granularity, 10020),
    ENTRY("cuMemCreate", cu_mem_create, 10020),
    ENTRY("cuMemRelease", cu_mem_release, 10020),
    ENTRY("cuMemAddressReserve", cu_mem_address_reserve, 10020),
    ENTRY("cuMemAddressFree", cu_mem_address_free, 10020),
    ENTRY("cuMemMap", cu_mem_map, 10020),
    ENTRY("cuMemSetAccess", cu_mem_set_access, 10020),
    ENTRY("cuMemUnmap", cu_mem_unmap, 10020),
};

/* The typedefs of cudaTypedefs.h must describe these functions. */
static PFN_cuMemMap_v10020 const check_map_type = cu_mem_map;
static PFN_cuMemUnmap_v10020 const check_unmap_type = cu_mem_unmap;

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
    (void)flags;
    (void)check_map_type;
    (void)check_unmap_type;
    if (symbol == NULL || funcPtr == NULL)
        return gpemu_error(cudaErrorInvalidValue);
    gpemu_lock();
    bool up = g_emu.up;
    gpemu_unlock();
    if (!up)
        return gpemu_error(cudaErrorInsufficientDriver);
    if (cudaVersion > GPEMU_DRIVER_VERSION)
        return gpemu_error(cudaErrorInvalidValue); /* a driver older than the version asked for */
    *funcPtr = NULL;
    enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++)
        if (strcmp(entry_points[i].symbol, symbol) == 0) {
            if (cudaVersion < entry_points[i].since) {
                status = cudaDriverEntryPointVersionNotSufficent;
            } else {
                memcpy(funcPtr, &entry_points[i].fn, sizeof *funcPtr);
                status = cudaDriverEntryPointSuccess;
            }
            break;
        }
    if (driverStatus != NULL)
        *driverStatus = status;
    return cudaSuccess;
}
