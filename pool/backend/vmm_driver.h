/*
 * vmm_driver.h — CUDA's virtual memory management calls (cuMemCreate, cuMemMap, ...) reached without
 * linking libcuda: the CUDA runtime hands out the driver's entry points
 * (cudaGetDriverEntryPointByVersion), resolved once per process on first use. <cuda.h> and
 * <cudaTypedefs.h> give the types only.
 *
 * One table for the two programs that make these calls: the vmm backend (backend_vmm.c) and
 * bench/gpu/vmm_probe.c, which asks a real GPU the questions about them that the pool's design turns
 * on. So the probe measures the very entry points, ABI version and memory properties the pool uses.
 * This file depends on the CUDA runtime alone (no pool header), so that the probe links it by itself.
 */
#ifndef GP_VMM_DRIVER_H
#define GP_VMM_DRIVER_H

#include <stddef.h>

#include <cuda.h>
#include <cudaTypedefs.h>

/* The CUDA version whose ABI of each entry point is asked for (12.0: every symbol below exists in it
 * with the signature of the typedefs used; the runtime this library links needs a newer driver
 * anyway). */
#define GP_VMM_DRIVER_VERSION 12000

/* The driver's entry points; every one is set once the table is handed out. */
typedef struct gp_vmm_driver {
    PFN_cuGetErrorName_v6000 get_error_name;
    PFN_cuGetErrorString_v6000 get_error_string;
    PFN_cuMemGetAllocationGranularity_v10020 get_allocation_granularity;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemAddressReserve_v10020 address_reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuMemUnmap_v10020 unmap;
} gp_vmm_driver;

/*
 * The table, resolved on the first call of the process (thread-safe; later calls give the same
 * answer). NULL when an entry point cannot be resolved (no driver: the runtime's
 * cudaErrorInsufficientDriver; a driver older than GP_VMM_DRIVER_VERSION; a missing symbol), with
 * *why saying which symbol and why ("cudaGetDriverEntryPointByVersion("cuMemCreate", version 12000,
 * cudaEnableDefault): ..."); *why is "" on success. The runtime's last error is left as it was.
 */
const gp_vmm_driver *gp_vmm_driver_get(const char **why);

/* The driver's name and text for `res` ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"); stand-ins when
 * the table is not resolved or the driver does not know the code. Never NULL. */
void gp_vmm_driver_error(CUresult res, const char **name, const char **text);

/* Physical memory of `device` as the pool creates it: pinned, on the device, no shareable handle. */
CUmemAllocationProp gp_vmm_device_memory(int device);

/* cuMemSetAccess: read and write access for `device` over [va, va + size), whole mappings only.
 * pre: the table is resolved (gp_vmm_driver_get returned it). */
CUresult gp_vmm_set_device_access(CUdeviceptr va, size_t size, int device);

#endif /* GP_VMM_DRIVER_H */
