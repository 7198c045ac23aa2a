/*
 * cudaTypedefs.h — the TEST DEVICE's copy of the driver entry point typedefs backend_vmm.c uses
 * (CUDA 13.0's cudaTypedefs.h: PFN_<symbol>_v<version of the ABI>).
 */
#ifndef GP_CUDA_EMU_TYPEDEFS_H
#define GP_CUDA_EMU_TYPEDEFS_H

#include "cuda.h"

typedef CUresult(CUDAAPI *PFN_cuGetErrorName_v6000)(CUresult error, const char **pStr);
typedef CUresult(CUDAAPI *PFN_cuGetErrorString_v6000)(CUresult error, const char **pStr);
typedef CUresult(CUDAAPI *PFN_cuMemGetAllocationGranularity_v10020)(size_t *granularity,
                                                                   const CUmemAllocationProp *prop,
                                                                   CUmemAllocationGranularity_flags option);
typedef CUresult(CUDAAPI *PFN_cuMemCreate_v10020)(CUmemGenericAllocationHandle *handle, size_t size,
                                                 const CUmemAllocationProp *prop, unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemRelease_v10020)(CUmemGenericAllocationHandle handle);
typedef CUresult(CUDAAPI *PFN_cuMemAddressReserve_v10020)(CUdeviceptr *ptr, size_t size, size_t alignment,
                                                         CUdeviceptr addr, unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemAddressFree_v10020)(CUdeviceptr ptr, size_t size);
typedef CUresult(CUDAAPI *PFN_cuMemMap_v10020)(CUdeviceptr ptr, size_t size, size_t offset,
                                              CUmemGenericAllocationHandle handle, unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemSetAccess_v10020)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                                    size_t count);
typedef CUresult(CUDAAPI *PFN_cuMemUnmap_v10020)(CUdeviceptr ptr, size_t size);

#endif /* GP_CUDA_EMU_TYPEDEFS_H */
