/*
 * cuda_emu.h — the CUDA emulation: a TEST DEVICE, never part of libgpupool.
 *
 * It implements the CUDA runtime entry points gpupool's cuda and vmm backends call (and those the
 * tests need: streams, capture, graphs) and the driver's cuMem* functions that backend_vmm.c reaches
 * through cudaGetDriverEntryPointByVersion, over the simulated GPU (pool/sim_*.c): each emulated
 * device is one "sim-vmm" instance, so its streams, virtual time, race checker, pattern checks and
 * fault injection (gp_sim_fail_call on gpemu_sim(device)) are the sim's.
 *
 * On top of the sim it enforces the rules the CUDA documentation states (enum gpemu_rule; each rule's
 * text and source are in emu_rules.c). A call that breaks one returns the error CUDA documents, is
 * counted under its rule and kept as the first violation; a test fails when gpemu_violations() != 0
 * at its end (tests/emu/emu_test.h does this for every emulation test).
 *
 * Threads: one mutex guards the emulation; per-thread state (current device, the context bound for
 * driver calls, last error, capture interaction mode) is thread-local, as CUDA's is.
 */
#ifndef GP_CUDA_EMU_H
#define GP_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "gpupool_sim.h"

enum gpemu_rule {
    GPEMU_RULE_DEVICE_ORDINAL,       /* cudaSetDevice to a device that does not exist */
    GPEMU_RULE_STREAM_DEVICE,        /* event and stream of different devices; kernel on another device's stream */
    GPEMU_RULE_DRIVER_CONTEXT,       /* a driver call on a thread with no current context */
    GPEMU_RULE_MAP_OFFSET,           /* cuMemMap offset != 0 */
    GPEMU_RULE_MAP_GRANULE,          /* cuMemMap / cuMemCreate / reserve sizes or addresses not whole granules */
    GPEMU_RULE_MAP_RESERVED,         /* cuMemMap outside one reservation, or over a mapping */
    GPEMU_RULE_ACCESS_BEFORE_USE,    /* a kernel touches a mapping whose access was never set */
    GPEMU_RULE_SET_ACCESS_MAPPED,    /* cuMemSetAccess on a range that is not fully mapped */
    GPEMU_RULE_UNMAP_WHOLE,          /* cuMemUnmap of a range that is not whole mappings */
    GPEMU_RULE_UNMAP_IN_FLIGHT,      /* cuMemUnmap (or cudaFree) under a kernel still in flight */
    GPEMU_RULE_ADDRESS_FREE,         /* cuMemAddressFree of a range not exactly reserved, or with mappings */
    GPEMU_RULE_HANDLE,               /* a release or map of a handle that is not live */
    GPEMU_RULE_FREE_POINTER,         /* cudaFree / cudaFreeHost of a pointer not allocated (or freed twice) */
    GPEMU_RULE_KERNEL_MEMORY,        /* a kernel on memory that is neither allocated nor mapped */
    GPEMU_RULE_STICKY,               /* a call on a device whose context an earlier error destroyed */
    GPEMU_RULE_ERROR_PENDING,        /* (checked by tests) a non-sticky error the pool caused left pending */
    GPEMU_RULE_CAPTURE_UNSAFE,       /* a potentially unsafe call while a capture prohibits it */
    GPEMU_RULE_CAPTURE_SYNC,         /* synchronising / querying what a capture owns */
    GPEMU_RULE_CAPTURE_ISOLATION,    /* a capturing stream waits on an event recorded outside the capture */
    GPEMU_RULE_CAPTURE_SEQUENCE,     /* begin on a capturing stream, end elsewhere, wrong thread, legacy stream */
    GPEMU_RULE_USE_AFTER_DESTROY,    /* a stream or event used after it was destroyed */
    GPEMU_RULE_COUNT
};

/* (Re)creates the emulated machine: `devices` devices of device_memory bytes each (rounded up to
 * 2 MiB). Everything of a previous machine must have been shut down. Returns 0 or a gp_error. */
int gpemu_init(int devices, size_t device_memory);
/* Tears the machine down; returns the number of rule violations seen (they stay readable until the
 * next gpemu_init). Leaked device memory/events/handles count as GPEMU_RULE_FREE_POINTER. */
uint64_t gpemu_shutdown(void);

/* The sim behind emulated device `device` (for gp_sim_fail_call, gp_sim_advance, the report). */
gp_sim *gpemu_sim(int device);

/* A kernel on `stream` of the calling thread's current device that uses [ptr, ptr+len) as the sim's
 * gp_sim_launch does (op: GP_SIM_READ / WRITE / CHECK with seed) for duration_ns of virtual time.
 * Captured (not run) while the stream captures. */
cudaError_t gpemu_launch(cudaStream_t stream, const void *ptr, size_t len, int op, uint64_t seed,
                         uint64_t duration_ns);

uint64_t gpemu_violations(void);
uint64_t gpemu_rule_count(enum gpemu_rule rule);
const char *gpemu_first_violation(void);
const char *gpemu_rule_name(enum gpemu_rule rule);
const char *gpemu_rule_source(enum gpemu_rule rule);
/* Records a violation found by a test (e.g. GPEMU_RULE_ERROR_PENDING). */
void gpemu_report(enum gpemu_rule rule, const char *what);
/* Forgets the violations seen so far (a test that breaks a rule on purpose, after checking it). */
void gpemu_forget_violations(void);

/* The emulated driver's CUDA version (cudaGetDriverEntryPointByVersion compares against it). */
#define GPEMU_DRIVER_VERSION 13000

#endif /* GP_CUDA_EMU_H */
