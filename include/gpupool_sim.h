/*
 * gpupool_sim.h — the simulated GPU behind the "sim" backend, for tests and trace replay.
 *
 * The sim is a GPU in host memory with a fixed capacity (configuration key device_memory). Its memory
 * is mapped PROT_NONE: the host cannot touch it, and only simulated kernels open it while they run,
 * so a host access from the pool crashes at once. Streams are FIFO queues of simulated kernels that
 * run in virtual time (gp_sim_advance / gp_sim_synchronize); events and stream waits order them as
 * CUDA's do. Any gp_stream value is a stream: it is created on first use.
 *
 * The sim keeps its own ledger and checks the pool against it:
 *   - races: a kernel launched on a stream while a kernel on another stream, not ordered before it
 *     (by events and waits, or by having completed), still uses an overlapping range, with at least
 *     one of them writing;
 *   - patterns: GP_SIM_CHECK verifies what GP_SIM_WRITE wrote with the same seed;
 *   - bad device calls: freeing an address it never returned, kernels on memory that is not allocated;
 *   - leaks: device memory and events still outstanding when the pool closes the backend;
 *   - fault injection: the Nth device call (of the kinds in a mask) fails.
 *
 * The "sim-vmm" backend is the same GPU with CUDA's virtual memory management (va_reserve,
 * phys_create, map, ...). Its physical memory is a memfd of `device_memory` bytes (rounded up to
 * 2 MiB) whose 2 MiB pages are handed out to physical handles; map() maps a handle's pages at a
 * reserved address, so the same physical memory may appear at several addresses at once and a
 * GP_SIM_WRITE through one address is seen by a GP_SIM_CHECK through another. There, kernels must lie
 * wholly in mapped memory (or in one mem_alloc allocation), races are found on PHYSICAL memory (two
 * kernels using one physical page through different addresses race), allocated_bytes counts physical
 * memory, and handles, mappings and reservations outstanding at close are leaks.
 */
#ifndef GPUPOOL_SIM_H
#define GPUPOOL_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gp_sim gp_sim;

/* The sim behind a pool created with backend "sim" or "sim-vmm"; NULL for any other pool. The pool
 * holds one reference; gp_sim_retain lets a test keep the sim (and its ledger) after gp_pool_destroy. */
GP_API gp_sim *gp_sim_of(gp_pool *pool);
GP_API void gp_sim_retain(gp_sim *sim);
GP_API void gp_sim_release(gp_sim *sim);

/* A fresh stream handle, distinct from every other one this sim has handed out (never NULL). */
GP_API gp_stream gp_sim_stream_create(gp_sim *sim);
/* The application destroys `stream` (cudaStreamDestroy): its queued work still completes; from now on
 * a kernel, event record or stream wait naming it is a bad call (CUDA may give the handle to another
 * stream), so that tests see the pool keep gp_stream_forget's promise. */
GP_API void gp_sim_stream_destroy(gp_sim *sim, gp_stream stream);

enum gp_sim_kernel_op {
    GP_SIM_READ = 0,  /* reads the range */
    GP_SIM_WRITE = 1, /* writes a pattern derived from seed over the range */
    GP_SIM_CHECK = 2, /* reads the range and checks the pattern of seed; a mismatch is a violation */
    GP_SIM_USE = 3    /* reads and writes the range with its contents not simulated (no memory effect):
                         race-checked as a write; for replays of traces, whose data is not known */
};

/* Queues a kernel on `stream` that uses [addr, addr+len) for duration_ns of virtual time. Race checks
 * happen here, at launch. GP_ERR_INVALID for a range outside allocated device memory (also recorded as
 * a violation); with "sim-vmm", for a range not wholly inside mapped memory (consecutive mappings) or
 * one mem_alloc allocation. */
GP_API int gp_sim_launch(gp_sim *sim, gp_stream stream, const void *addr, size_t len, int op,
                         uint64_t seed, uint64_t duration_ns);

/* Advances virtual time by ns, completing every kernel, record and wait that is due. */
GP_API void gp_sim_advance(gp_sim *sim, uint64_t ns);
/* Runs until every stream is idle. */
GP_API void gp_sim_synchronize(gp_sim *sim);
/* Runs until `stream` is idle (and what it waits on). */
GP_API void gp_sim_stream_synchronize(gp_sim *sim, gp_stream stream);
GP_API uint64_t gp_sim_now(gp_sim *sim);

/* Device call kinds, for fault injection and call counts. */
enum gp_sim_call {
    GP_SIM_CALL_MEM_ALLOC = 1u << 0,
    GP_SIM_CALL_MEM_FREE = 1u << 1,
    GP_SIM_CALL_MEM_INFO = 1u << 2,
    GP_SIM_CALL_EVENT_CREATE = 1u << 3,
    GP_SIM_CALL_EVENT_DESTROY = 1u << 4,
    GP_SIM_CALL_EVENT_RECORD = 1u << 5,
    GP_SIM_CALL_EVENT_QUERY = 1u << 6,
    GP_SIM_CALL_EVENT_SYNC = 1u << 7,
    GP_SIM_CALL_STREAM_WAIT = 1u << 8,
    /* virtual memory management ("sim-vmm" only; vm_granularity is not a counted call) */
    GP_SIM_CALL_VA_RESERVE = 1u << 9,
    GP_SIM_CALL_VA_RELEASE = 1u << 10,
    GP_SIM_CALL_PHYS_CREATE = 1u << 11,
    GP_SIM_CALL_PHYS_RELEASE = 1u << 12,
    GP_SIM_CALL_MAP = 1u << 13,
    GP_SIM_CALL_UNMAP = 1u << 14,
    /* the access rights a map sets once it has mapped (cuMemSetAccess; once per map, or once per run of
     * map_run); when it fails, map undoes the mapping and fails (nothing stays mapped), as the vmm
     * backend does */
    GP_SIM_CALL_SET_ACCESS = 1u << 15,
    /* copy_to_host / copy_to_device (pausing with contents) and pinned host memory for staging */
    GP_SIM_CALL_COPY = 1u << 16,
    GP_SIM_CALL_HOST_ALLOC = 1u << 17,
    /* the device synchronize before unmapping (once per unmap, per run of unmap_run, or per list of
     * unmap_pages) */
    GP_SIM_CALL_DEVICE_SYNC = 1u << 18,
    GP_SIM_CALL_ALL = (1u << 19) - 1
};

/* Makes the nth device call (1 = the next one) whose kind is in `mask` fail with `error`
 * (GP_ERR_DEVICE or GP_ERR_OOM). n == 0 disables injection. One fault per arming. */
GP_API void gp_sim_fail_call(gp_sim *sim, uint64_t n, unsigned mask, int error);
/* Calls hook(arg, kind) on the calling thread at the start of every device call whose kind is in mask,
 * before the call and outside the sim's lock: what another thread can do while the pool, with its own
 * locks held, makes that call (tests). Kinds GP_SIM_CALL_COPY and GP_SIM_CALL_EVENT_SYNC only; the
 * others are ignored. hook NULL removes it. */
GP_API void gp_sim_set_call_hook(gp_sim *sim, unsigned mask, void (*hook)(void *arg, unsigned kind), void *arg);
/* Device calls made so far whose kind is in mask (failed ones included). */
GP_API uint64_t gp_sim_calls(gp_sim *sim, unsigned mask);
/* Faults injected so far. */
GP_API uint64_t gp_sim_faults_injected(gp_sim *sim);

typedef struct gp_sim_report {
    uint64_t races;               /* unordered overlapping uses across streams */
    uint64_t pattern_mismatches;  /* GP_SIM_CHECK failures */
    uint64_t bad_calls;           /* frees of unknown addresses, kernels on unallocated memory, ... */
    uint64_t allocated_bytes;     /* device memory allocated now (2 MiB granular); with "sim-vmm" the
                                     PHYSICAL memory: phys_create handles plus mem_alloc allocations */
    uint64_t allocated_peak;      /* most device memory allocated at once (physical with "sim-vmm") */
    uint64_t allocations;         /* device allocations outstanding now (mem_alloc's only) */
    uint64_t events;              /* events outstanding now */
    uint64_t leaked_bytes_at_close;  /* device memory still allocated when the backend was closed
                                        (physical with "sim-vmm": handles and mem_alloc allocations) */
    uint64_t leaked_events_at_close; /* events not destroyed when the backend was closed */
    int closed;                   /* the pool has closed the backend */
    /* Virtual memory management: always 0 with "sim". Fields are only ever added at the end. */
    uint64_t handles;             /* physical handles outstanding now (phys_create not yet released) */
    uint64_t mappings;            /* mappings now (map not yet unmapped) */
    uint64_t reservations;        /* virtual address reservations now (va_reserve not yet released) */
    uint64_t mapped_bytes;        /* virtual address space mapped now */
    uint64_t reserved_bytes;      /* virtual address space reserved now */
    uint64_t leaked_handles_at_close;      /* handles not released when the backend was closed */
    uint64_t leaked_mappings_at_close;     /* mappings not unmapped when the backend was closed */
    uint64_t leaked_reservations_at_close; /* reservations not released when the backend was closed */
    /* The most ops (kernels, event records, waits) queued on one stream at once, not yet completed:
     * how far a stream fell behind the host that queued its work. */
    uint64_t deepest_queue;
} gp_sim_report;

GP_API void gp_sim_get_report(gp_sim *sim, gp_sim_report *out);
/* The first violation's description ("" if none), e.g. "race: kernel on stream 0x2 at [..) ...". */
GP_API const char *gp_sim_first_violation(gp_sim *sim);

#ifdef __cplusplus
}
#endif
#endif /* GPUPOOL_SIM_H */
