/*
 * emu_internal.h — the state of the CUDA emulation (a TEST DEVICE), shared by its files:
 *   emu_rules.c    the rules, their sources, the violation ledger;
 *   emu_runtime.c  devices, per-thread state, errors, memory, copies, streams, events, kernels;
 *   emu_capture.c  stream capture, graphs and replay;
 *   emu_driver.c   the driver's cuMem* functions and cudaGetDriverEntryPointByVersion.
 * Everything below is guarded by g_emu.lock (gpemu_lock) unless it says thread-local.
 */
#ifndef GP_EMU_INTERNAL_H
#define GP_EMU_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/config.h"
#include "cuda_emu/cuda_emu.h"

#define GPEMU_MAX_DEVICES 8
#define GPEMU_TEXT_MAX 768
#define GPEMU_GRANULE ((size_t)2 << 20) /* cuMemGetAllocationGranularity(MINIMUM) of the emulated devices */
#define GPEMU_STREAM_MAGIC 0x73747265616d4555ull
#define GPEMU_EVENT_MAGIC 0x6576656e74454d55ull

typedef struct emu_vec {
    void **items;
    size_t count, capacity;
} emu_vec;

typedef struct emu_graph_node {
    uintptr_t ptr;
    size_t len;
    int op;
    uint64_t seed;
    uint64_t duration_ns;
} emu_graph_node;

struct CUgraph_st {
    emu_graph_node *nodes;
    size_t count, capacity;
    int device;
};

struct CUgraphExec_st {
    emu_graph_node *nodes;
    size_t count;
    int device;
};

struct CUstream_st {
    uint64_t magic;
    int device;
    unsigned flags;      /* cudaStreamNonBlocking or 0 (blocking: the legacy stream implicitly orders it) */
    gp_stream sim;       /* the sim's stream */
    bool destroyed;
    bool legacy;         /* the device's legacy default stream (NULL / cudaStreamLegacy) */
    /* capture */
    enum cudaStreamCaptureStatus capture;
    uint64_t capture_id;
    enum cudaStreamCaptureMode capture_mode;
    pthread_t capture_thread;
    bool capture_origin; /* began the capture (others joined it through an event) */
    struct CUgraph_st *graph;
};

struct CUevent_st {
    uint64_t magic;
    int device;
    unsigned flags;
    gp_event sim;
    uint64_t capture_id; /* != 0: last recorded inside that capture sequence */
    bool destroyed;
};

typedef struct emu_alloc {   /* cudaMalloc */
    int device;
    uintptr_t ptr;
    size_t size, rounded;
} emu_alloc;

typedef struct emu_host {    /* cudaHostAlloc */
    void *ptr;
    size_t size;
    int device;
} emu_host;

typedef struct emu_handle {  /* cuMemCreate */
    uint64_t id;
    int device;
    gp_phys sim;
    size_t size;
    unsigned maps;
    bool released;           /* cuMemRelease called; freed when the last mapping goes */
} emu_handle;

typedef struct emu_range {   /* a reservation (handle NULL) or a mapping */
    int device;
    uintptr_t va;
    size_t size;
    emu_handle *handle;
    unsigned access;         /* mappings: bit d set = device d may read and write */
} emu_range;

typedef struct emu_device {
    gp_config cfg;
    void *ctx;               /* the sim-vmm backend instance */
    gp_sim *sim;
    struct CUstream_st *legacy;
    cudaError_t sticky;      /* cudaSuccess, or the sticky error that ended the context */
} emu_device;

typedef struct emu_state {
    pthread_mutex_t lock;
    bool up;
    uint64_t generation;     /* bumped by gpemu_init: thread-local state of older machines is stale */
    int device_count;
    emu_device devices[GPEMU_MAX_DEVICES];
    emu_vec allocs, hosts, handles, reservations, mappings, streams, events, graphs, execs;
    uint64_t next_handle_id, next_capture_id;
    uint64_t violations, rule_counts[GPEMU_RULE_COUNT];
    char first_violation[GPEMU_TEXT_MAX];
    bool print_violations;
} emu_state;

extern emu_state g_emu;

/* Per-thread state, as CUDA keeps it per host thread. */
typedef struct emu_thread {
    uint64_t generation;
    int device;              /* current device (0 until cudaSetDevice) */
    int bound;               /* device whose primary context is current for driver calls; -1 none */
    cudaError_t last;        /* the last error (cudaGetLastError) */
    enum cudaStreamCaptureMode mode; /* cudaThreadExchangeStreamCaptureMode */
    struct CUstream_st *per_thread[GPEMU_MAX_DEVICES];
} emu_thread;

emu_thread *gpemu_thread(void);

void gpemu_lock(void);
void gpemu_unlock(void);
void gpemu_violation_locked(enum gpemu_rule rule, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

bool gpemu_vec_push(emu_vec *v, void *item);
void gpemu_vec_remove(emu_vec *v, size_t index);

/* Sets the thread's last error (not cudaSuccess) and returns err. */
cudaError_t gpemu_error(cudaError_t err);
/* cudaErrorMemoryAllocation for GP_ERR_OOM, cudaErrorUnknown for other failures of the sim. */
cudaError_t gpemu_from_gp(int rc);

/* The runtime initialising `device` for this thread: binds its primary context (driver calls). */
void gpemu_bind(emu_thread *t, int device);
/* cudaSuccess, or the device's sticky error (counted as GPEMU_RULE_STICKY). */
cudaError_t gpemu_check_sticky(int device, const char *call);
/* Ends the device's context with a sticky error. */
void gpemu_make_sticky(int device, cudaError_t err);

/* Resolves a stream handle (NULL, cudaStreamLegacy, cudaStreamPerThread, or created) to its object;
 * NULL (with the violation counted and *err set) for a destroyed or foreign one. */
struct CUstream_st *gpemu_stream(cudaStream_t s, const char *call, cudaError_t *err);

/* Capture (emu_capture.c). gpemu_capture_unsafe: cudaSuccess, or cudaErrorStreamCaptureUnsupported
 * (violation counted, conflicting captures invalidated) when the calling thread may not make a
 * potentially unsafe call now. */
cudaError_t gpemu_capture_unsafe(const char *call);
/* A blocking stream of `device` capturing (the legacy stream then may not be used). */
struct CUstream_st *gpemu_blocking_capture(int device);
/* Some stream of `device` capturing. */
struct CUstream_st *gpemu_any_capture(int device);
void gpemu_capture_invalidate(uint64_t capture_id);
/* Appends a kernel to the graph stream s (capturing) builds. */
cudaError_t gpemu_capture_kernel(struct CUstream_st *s, uintptr_t ptr, size_t len, int op, uint64_t seed,
                                 uint64_t duration_ns);
void gpemu_capture_shutdown(void);

/* Runs a kernel on s now (not capturing): checks its memory (access, allocation), then the sim. */
cudaError_t gpemu_run_kernel(struct CUstream_st *s, uintptr_t ptr, size_t len, int op, uint64_t seed,
                             uint64_t duration_ns);
/* Whether a kernel not yet completed on `device` uses [va, va+size). */
bool gpemu_in_flight(int device, uintptr_t va, size_t size);

/* Driver state (emu_driver.c). */
emu_range *gpemu_mapping_at(uintptr_t va);
void gpemu_driver_shutdown(void);

#endif /* GP_EMU_INTERNAL_H */
