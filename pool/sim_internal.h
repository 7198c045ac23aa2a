/*
 * sim_internal.h — the state of the simulated GPU ("sim" backend), shared by its three files:
 *
 *   sim_memory.c   device memory: one PROT_NONE host mapping, a bitmap of 2 MiB pages, the ledger
 *                  of live allocations, and the memory effects of simulated kernels (patterns);
 *   sim_clock.c    streams, events and virtual time: FIFO op queues, the run loop, vector clocks
 *                  and the race checker;
 *   backend_sim.c  the gp_backend_ops table and the public gp_sim_* API: locking, call counting,
 *                  fault injection, reference counting, the report.
 *
 * Everything here is protected by gp_sim.lock; the gpsim_* functions expect the caller to hold it.
 * gpsim_* names are internal (the library is built with -fvisibility=hidden); gp_sim_* are public.
 */
#ifndef GP_SIM_INTERNAL_H
#define GP_SIM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "gpupool_sim.h"

#define GPSIM_PAGE_SIZE ((size_t)2 << 20) /* device allocation granule and alignment */
#define GPSIM_SPAN_FACTOR 4               /* address space mapped per byte of capacity */
#define GPSIM_VIOLATION_MAX 512
#define GPSIM_CALL_KINDS 9 /* bits of enum gp_sim_call */

/* ---- device memory (sim_memory.c) ----------------------------------------------------------- */

typedef struct gpsim_allocation {
    gp_devptr addr;
    size_t size;
} gpsim_allocation;

/*
 * Invariants (checked by gpsim_memory_assert_invariants):
 *   allocated_bytes == sum of ledger[i].size == (set bits of page_used) * GPSIM_PAGE_SIZE
 *   ledger is sorted by addr, its ranges do not overlap and lie inside [base, base + span)
 *   allocated_bytes <= allocated_peak <= capacity
 */
typedef struct gpsim_memory {
    unsigned char *base;   /* 2 MiB aligned, PROT_NONE except while a kernel's effect is applied */
    size_t capacity;       /* device memory: device_memory rounded up to 2 MiB */
    size_t span;           /* bytes of address space mapped: capacity * GPSIM_SPAN_FACTOR */
    size_t page_count;     /* span / GPSIM_PAGE_SIZE */
    size_t first_free_hint; /* no page below this one is free: first-fit scans start here */
    uint64_t *page_used;   /* bit p set: page p belongs to a live allocation */
    gpsim_allocation *ledger;
    size_t ledger_count, ledger_capacity;
    size_t allocated_bytes, allocated_peak;
    size_t host_page_size;
} gpsim_memory;

int gpsim_memory_map(gpsim_memory *mem, size_t requested_capacity);
void gpsim_memory_unmap(gpsim_memory *mem);
/* pre: size > 0, a multiple of GPSIM_PAGE_SIZE. GP_ERR_OOM (message set) when no run of pages fits. */
int gpsim_memory_alloc(gpsim_memory *mem, size_t size, gp_devptr *out);
/* Whether [addr, addr+size) is exactly one live allocation. */
bool gpsim_memory_is_allocation(const gpsim_memory *mem, gp_devptr addr, size_t size);
/* pre: gpsim_memory_is_allocation(mem, addr, size). Drops the contents (MADV_DONTNEED). */
void gpsim_memory_free(gpsim_memory *mem, gp_devptr addr, size_t size);
/* Whether [addr, addr+len) lies wholly inside one live allocation (len > 0). */
bool gpsim_memory_contains(const gpsim_memory *mem, gp_devptr addr, size_t len);
void gpsim_memory_assert_invariants(const gpsim_memory *mem);

/* Kernel effects. pre: gpsim_memory_contains(mem, addr, len). The range is opened (PROT_READ|WRITE)
 * only for the duration of the call. */
void gpsim_memory_write_pattern(gpsim_memory *mem, gp_devptr addr, size_t len, uint64_t seed);
/* Returns true when the range holds seed's pattern, else false with *first_bad = first differing
 * byte offset from addr. */
bool gpsim_memory_check_pattern(gpsim_memory *mem, gp_devptr addr, size_t len, uint64_t seed,
                                size_t *first_bad);
void gpsim_memory_read(gpsim_memory *mem, gp_devptr addr, size_t len);

/* ---- streams, events, virtual time (sim_clock.c) -------------------------------------------- */

enum gpsim_op_kind { GPSIM_OP_KERNEL, GPSIM_OP_RECORD, GPSIM_OP_WAIT };

typedef struct gpsim_op {
    enum gpsim_op_kind kind;
    uint64_t seq;          /* 1-based number of this op on its stream */
    uint64_t enqueued_at;  /* virtual time of the enqueue */
    /* GPSIM_OP_KERNEL */
    gp_devptr addr;
    size_t len;
    int kernel_op;         /* enum gp_sim_kernel_op */
    uint64_t seed;
    uint64_t duration_ns;
    /* GPSIM_OP_WAIT: blocks until stream wait_stream has completed its op wait_seq */
    size_t wait_stream;
    uint64_t wait_seq;
} gpsim_op;

/*
 * One stream: a FIFO ring of ops not yet completed.
 * Invariants: done_seq <= enq_seq; enq_seq - done_seq == queue_len; the op at queue position i has
 * seq done_seq + 1 + i; clock[index] == enq_seq (clock_len > index).
 * Vector clock: clock[s] is the highest op seq of stream s known to be ordered before work enqueued
 * on this stream from now on (missing entries, s >= clock_len, are 0).
 */
typedef struct gpsim_stream {
    gp_stream handle;
    size_t index;          /* position in gp_sim.streams */
    gpsim_op *queue;
    size_t queue_head, queue_len, queue_capacity;
    uint64_t enq_seq, done_seq;
    uint64_t last_finish;  /* virtual time at which its last completed op finished */
    uint64_t *clock;
    size_t clock_len;
} gpsim_stream;

/* An open-addressing map from a handle value to an object (streams by handle, live events). */
typedef struct gpsim_table_entry {
    uintptr_t key;
    void *value;
    bool used;
} gpsim_table_entry;

typedef struct gpsim_table {
    gpsim_table_entry *entries;
    size_t capacity; /* 0 or a power of two; count <= capacity / 2 */
    size_t count;
} gpsim_table;

typedef struct gpsim_event {
    bool recorded;         /* recorded at least once; then stream/seq name its last record */
    size_t stream;
    uint64_t seq;
    uint64_t *clock;       /* the recording stream's vector clock at the record */
    size_t clock_len;
} gpsim_event;

/* Streams (created on first use; NULL on host out-of-memory, message set). */
gpsim_stream *gpsim_stream_get(gp_sim *sim, gp_stream handle);
/* A handle no stream of this sim has used; registers it. NULL on host out-of-memory. */
gpsim_stream *gpsim_stream_create_fresh(gp_sim *sim);

/* Checks races against incomplete kernels of other streams, then queues the kernel.
 * pre: len == 0 or [addr, addr+len) inside one allocation. GP_ERR_DEVICE on host out-of-memory. */
int gpsim_launch(gp_sim *sim, gpsim_stream *stream, gp_devptr addr, size_t len, int kernel_op,
                 uint64_t seed, uint64_t duration_ns);

/* Virtual time. Invariant between calls ("settled"): every op whose finish time is <= now has
 * completed; every op still queued finishes after now or waits on one that does. */
void gpsim_run_until(gp_sim *sim, uint64_t time);
void gpsim_run_all(gp_sim *sim);
void gpsim_run_stream(gp_sim *sim, gpsim_stream *stream);

/* Events. gpsim_event_find returns NULL for a handle that is not a live event of this sim. */
int gpsim_event_new(gp_sim *sim, gpsim_event **out);
gpsim_event *gpsim_event_find(gp_sim *sim, gp_event handle);
void gpsim_event_delete(gp_sim *sim, gpsim_event *ev);
void gpsim_event_delete_all(gp_sim *sim);
size_t gpsim_event_count(const gp_sim *sim);
int gpsim_event_record(gp_sim *sim, gpsim_event *ev, gpsim_stream *stream);
bool gpsim_event_done(const gp_sim *sim, const gpsim_event *ev);
void gpsim_event_run(gp_sim *sim, const gpsim_event *ev);
int gpsim_stream_wait_event(gp_sim *sim, gpsim_stream *stream, const gpsim_event *ev);

/* Frees every stream and the tables (final release). */
void gpsim_clock_destroy(gp_sim *sim);

/* ---- the sim ------------------------------------------------------------------------------- */

struct gp_sim {
    pthread_mutex_t lock;
    unsigned references;   /* the pool's (from open until close) plus gp_sim_retain's */
    bool closed;           /* close() ran: only the report and first violation remain usable */
    int device;

    gpsim_memory memory;

    gpsim_stream **streams;
    size_t stream_count, stream_capacity;
    gpsim_table stream_by_handle;
    uint64_t streams_created; /* gp_sim_stream_create calls, for fresh handles */

    gpsim_table events;       /* live events, keyed by their address */

    uint64_t now;             /* virtual time, ns */

    uint64_t calls[GPSIM_CALL_KINDS];
    uint64_t fail_countdown;  /* 0: disarmed */
    unsigned fail_mask;
    int fail_error;
    uint64_t faults_injected;

    uint64_t races, pattern_mismatches, bad_calls;
    uint64_t leaked_bytes_at_close, leaked_events_at_close;
    char first_violation[GPSIM_VIOLATION_MAX]; /* written once, "" until the first violation */
};

/* Keeps the first violation's text (backend_sim.c). Counters are bumped by the caller. */
void gpsim_violation(gp_sim *sim, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *gpsim_kernel_op_name(int kernel_op);

#endif /* GP_SIM_INTERNAL_H */
