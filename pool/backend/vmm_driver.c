/*
 * vmm_driver.c — CUDA's virtual memory driver calls, resolved once per process through the runtime
 * (vmm_driver.h).
 */
#include "backend/vmm_driver.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

static gp_vmm_driver driver;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static const gp_vmm_driver *driver_ready; /* &driver once every entry point is set; written once */
static char driver_message[512];          /* why resolution failed; "" when it succeeded */

/* A function pointer is written from the void * the runtime returns with memcpy: ISO C has no
 * conversion between object and function pointers; POSIX guarantees they share a representation. */
_Static_assert(sizeof(void *) == sizeof(PFN_cuMemCreate_v10020), "function and object pointers differ in size");

/* Clears the runtime's last error when it is the one this file's call just set (a failed
 * cudaGetDriverEntryPointByVersion sets it), so that the application's next cudaGetLastError does not
 * report a failure of ours; an error the application left there stays. */
static void clear_own_error(cudaError_t err)
{
    if (err != cudaSuccess && cudaPeekAtLastError() == err)
        (void)cudaGetLastError();
}

static void resolve(void)
{
    const struct {
        const char *symbol;
        void *slot; /* the address of the function pointer in `driver` */
    } table[] = {
        {"cuGetErrorName", &driver.get_error_name},
        {"cuGetErrorString", &driver.get_error_string},
        {"cuMemGetAllocationGranularity", &driver.get_allocation_granularity},
        {"cuMemCreate", &driver.create},
        {"cuMemRelease", &driver.release},
        {"cuMemAddressReserve", &driver.address_reserve},
        {"cuMemAddressFree", &driver.address_free},
        {"cuMemMap", &driver.map},
        {"cuMemSetAccess", &driver.set_access},
        {"cuMemUnmap", &driver.unmap},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
        cudaError_t err = cudaGetDriverEntryPointByVersion(table[i].symbol, &fn, GP_VMM_DRIVER_VERSION,
                                                           cudaEnableDefault, &status);
        if (err != cudaSuccess) {
            /* no driver: cudaErrorInsufficientDriver; a driver older than the version: InvalidValue */
            clear_own_error(err);
            snprintf(driver_message, sizeof driver_message,
                     "cudaGetDriverEntryPointByVersion(\"%s\", version %d, cudaEnableDefault): %s: %s",
                     table[i].symbol, GP_VMM_DRIVER_VERSION, cudaGetErrorName(err), cudaGetErrorString(err));
            memset(&driver, 0, sizeof driver);
            return;
        }
        if (fn == NULL || status != cudaDriverEntryPointSuccess) {
            snprintf(driver_message, sizeof driver_message,
                     "cudaGetDriverEntryPointByVersion(\"%s\", version %d, cudaEnableDefault): %s",
                     table[i].symbol, GP_VMM_DRIVER_VERSION,
                     status == cudaDriverEntryPointVersionNotSufficent
                         ? "the CUDA driver's version is not sufficient for this symbol"
                         : "the CUDA driver has no such symbol");
            memset(&driver, 0, sizeof driver);
            return;
        }
        memcpy(table[i].slot, &fn, sizeof fn);
    }
    driver_ready = &driver;
}

const gp_vmm_driver *gp_vmm_driver_get(const char **why)
{
    pthread_once(&driver_once, resolve);
    if (why != NULL)
        *why = driver_message;
    return driver_ready;
}

void gp_vmm_driver_error(CUresult res, const char **name, const char **text)
{
    *name = NULL;
    *text = NULL;
    const gp_vmm_driver *d = gp_vmm_driver_get(NULL);
    if (d == NULL || d->get_error_name(res, name) != CUDA_SUCCESS || *name == NULL)
        *name = "CUDA_ERROR_UNKNOWN_CODE";
    if (d == NULL || d->get_error_string(res, text) != CUDA_SUCCESS || *text == NULL)
        *text = "unrecognized error code";
}

CUmemAllocationProp gp_vmm_device_memory(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

CUresult gp_vmm_set_device_access(CUdeviceptr va, size_t size, int device)
{
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return driver.set_access(va, size, &access, 1);
}
