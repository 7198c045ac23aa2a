/*
 * sim_internal.h — the state of the simulated GPU ("sim" and "sim-vmm" backends), shared by its files:
 *
 *   sim_memory.c   device memory of "sim": one PROT_NONE host mapping, a bitmap of 2 MiB pages, the
 *                  ledger of live allocations, and the memory effects of simulated kernels (patterns);
 *   sim_bitmap.c   the first-fit page bitmap both memories allocate pages from (sim_bitmap.h);
 *   sim_vmm.c      device memory of "sim-vmm": physical pages in a memfd, handles, reservations and
 *                  mappings, and the translation of a kernel's addresses to physical memory;
 *   sim_clock.c    streams, events and virtual time: FIFO op queues, the run loop, vector clocks
 *                  and the race checker;
 *   backend_sim.c  the gp_backend_ops tables and the public gp_sim_* API: locking, call counting,
 *                  fault injection, reference counting, the report.
 *
 * A sim has exactly one of the two memories: gp_sim.vmm is NULL for "sim" (gp_sim.memory is used) and
 * non-NULL for "sim-vmm" (gp_sim.memory stays empty).
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

#include "backend/backend.h"
#include "gpupool_sim.h"
#include "sim/sim_bitmap.h"

#define GPSIM_PAGE_SIZE ((size_t)2 << 20) /* device allocation granule and alignment */
#define GPSIM_SPAN_FACTOR 4               /* address space mapped per byte of capacity */
#define GPSIM_VIOLATION_MAX 512
#define GPSIM_CALL_KINDS 19 /* bits of enum gp_sim_call */
_Static_assert(GP_SIM_CALL_ALL == (1u << GPSIM_CALL_KINDS) - 1, "GPSIM_CALL_KINDS != the kinds of gp_sim_call");

/* ---- device memory (sim_memory.c) ----------------------------------------------------------- */

typedef struct gpsim_allocation {
    gp_devptr addr;
    size_t size;
} gpsim_allocation;

/*
 * Invariants (checked by gpsim_memory_assert_invariants):
 *   allocated_bytes == sum of ledger[i].size == pages.used * GPSIM_PAGE_SIZE
 *   ledger is sorted by addr, its ranges do not overlap and lie inside [base, base + span)
 *   allocated_bytes <= allocated_peak <= capacity
 */
typedef struct gpsim_memory {
    unsigned char *base;   /* 2 MiB aligned, PROT_NONE except while a kernel's effect is applied */
    size_t capacity;       /* device memory: device_memory rounded up to 2 MiB */
    size_t span;           /* bytes of address space mapped: capacity * GPSIM_SPAN_FACTOR */
    gpsim_bitmap pages;    /* span / GPSIM_PAGE_SIZE bits; bit p set: page p is in a live allocation */
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

/* Kernel effects, for both memories. pre: [addr, addr+len) is device memory a kernel may use (inside
 * one "sim" allocation, or wholly mapped with "sim-vmm"; the launch checked it and nothing can free or
 * unmap it before the kernel completes). The range, rounded out to host pages of host_page_size, is
 * opened (PROT_READ|WRITE) only for the duration of the call. */
/* The host side of a device copy: opens [dev, dev+len) for the copy only (the backend's memcpy). */
void gpsim_copy(size_t host_page_size, gp_devptr dev, void *host, size_t len, bool to_device);
void gpsim_write_pattern(size_t host_page_size, gp_devptr addr, size_t len, uint64_t seed);
/* Returns true when the range holds seed's pattern, else false with *first_bad = first differing
 * byte offset from addr. */
bool gpsim_check_pattern(size_t host_page_size, gp_devptr addr, size_t len, uint64_t seed,
                         size_t *first_bad);
void gpsim_read(size_t host_page_size, gp_devptr addr, size_t len);

/* ---- virtual memory management, "sim-vmm" (sim_vmm.c) ---------------------------------------- */

/* A piece of physical memory: bytes [offset, offset+len) of the memfd. */
typedef struct gpsim_piece {
    uint64_t offset;
    size_t len;
} gpsim_piece;

/* Physical memory: `size` bytes in size / GPSIM_PAGE_SIZE memfd pages, not necessarily contiguous
 * (as GPU physical memory, which the MMU stitches). pages[i] backs bytes [i, i+1) * 2 MiB of it. */
typedef struct gpsim_phys_handle {
    gp_phys id;        /* never reused by this sim; 0 for the handle behind a mem_alloc allocation */
    size_t size;
    size_t *pages;     /* memfd page numbers */
    size_t map_count;  /* mappings of it now */
} gpsim_phys_handle;

/* A reservation (handle NULL), a mapping, or a mem_alloc allocation (both with their handle). */
typedef struct gpsim_vmm_range {
    gp_devptr va;
    size_t size;
    gpsim_phys_handle *handle;
} gpsim_vmm_range;

typedef struct gpsim_range_list {
    gpsim_vmm_range *items; /* sorted by va, not overlapping */
    size_t count, capacity;
} gpsim_range_list;

/*
 * Invariants (checked by gpsim_vmm_assert_invariants):
 *   allocated_bytes == phys.used * 2 MiB == sum of the sizes of handles[] and of allocations[].handle
 *   allocated_bytes <= allocated_peak <= capacity
 *   va.used * 2 MiB == sum of reservations[].size + sum of allocations[].size
 *   every mapping lies inside one reservation, its size == its handle's size, mappings do not overlap
 *   sum of handles[i]->map_count == mappings.count
 *   a memfd page is set in phys <=> it belongs to exactly one handle (and holds data only then)
 */
typedef struct gpsim_vmm {
    int memfd;                    /* capacity bytes: the device's physical memory */
    size_t capacity;              /* device_memory rounded up to 2 MiB */
    gpsim_bitmap phys;            /* memfd pages in use */
    size_t allocated_bytes, allocated_peak;
    unsigned char *va_base;       /* 2 MiB aligned; PROT_NONE anonymous memory where nothing is mapped */
    size_t va_span;               /* 4 * capacity + 64 GiB */
    gpsim_bitmap va;              /* pages of the span that are reserved or hold a mem_alloc allocation */
    gpsim_range_list reservations;
    gpsim_range_list mappings;
    gpsim_range_list allocations; /* mem_alloc's: reserved, created and mapped in one go */
    size_t reserved_bytes, mapped_bytes;
    gpsim_phys_handle **handles;  /* phys_create's, sorted by id (ids only grow) */
    size_t handle_count, handle_capacity;
    uint64_t handles_created;
    size_t host_page_size;
    size_t unchecked_ops;         /* operations since the last full invariant check (sim_vmm.c) */
} gpsim_vmm;

int gpsim_vmm_open(gpsim_vmm *vmm, size_t requested_capacity);
/* Releases everything (the final release of the sim). */
void gpsim_vmm_close(gpsim_vmm *vmm);

/* Queries for the checks of the backend's preconditions. */
bool gpsim_vmm_is_reservation(const gpsim_vmm *vmm, gp_devptr va, size_t size);
/* Mappings that overlap [va, va+size). */
size_t gpsim_vmm_mappings_in(const gpsim_vmm *vmm, gp_devptr va, size_t size);
/* Whether [va, va+size) lies inside one reservation. */
bool gpsim_vmm_is_reserved(const gpsim_vmm *vmm, gp_devptr va, size_t size);
bool gpsim_vmm_is_mapping(const gpsim_vmm *vmm, gp_devptr va, size_t size);
bool gpsim_vmm_is_allocation(const gpsim_vmm *vmm, gp_devptr va, size_t size);
/* The live phys_create handle `id`, or NULL. */
gpsim_phys_handle *gpsim_vmm_handle_find(const gpsim_vmm *vmm, gp_phys id);

/* The operations; each assumes its preconditions were checked. Those returning int change nothing
 * on failure and set the message: GP_ERR_OOM (out of address space or physical memory) or
 * GP_ERR_DEVICE (host out of memory, a host mapping that failed). The others cannot fail. */
int gpsim_vmm_va_reserve(gpsim_vmm *vmm, size_t size, gp_devptr *out);
void gpsim_vmm_va_release(gpsim_vmm *vmm, gp_devptr va, size_t size);
int gpsim_vmm_phys_create(gpsim_vmm *vmm, size_t size, gp_phys *out);
/* pre: h->map_count == 0. The pages lose their contents. */
void gpsim_vmm_phys_release(gpsim_vmm *vmm, gpsim_phys_handle *h);
/* pre: [va, va+h->size) reserved, 2 MiB aligned, overlapping no mapping. Mapped PROT_NONE. */
int gpsim_vmm_map(gpsim_vmm *vmm, gp_devptr va, gpsim_phys_handle *h);
/* pre: gpsim_vmm_is_mapping(va, size) and no queued kernel uses it. */
void gpsim_vmm_unmap(gpsim_vmm *vmm, gp_devptr va, size_t size);
/* mem_alloc / mem_free on "sim-vmm": address space, physical memory and a mapping in one go.
 * gpsim_vmm_free: pre gpsim_vmm_is_allocation(va, size) and no queued kernel uses it. */
int gpsim_vmm_alloc(gpsim_vmm *vmm, size_t size, gp_devptr *out);
void gpsim_vmm_free(gpsim_vmm *vmm, gp_devptr va, size_t size);

/* The physical memory behind [va, va+len) (len > 0): sorted by offset, disjoint, not adjacent.
 * GP_ERR_INVALID (no message) when the range is not wholly inside consecutive mappings or inside one
 * mem_alloc allocation; GP_ERR_DEVICE (message set) on host out-of-memory. *pieces: free() it. */
int gpsim_vmm_translate(const gpsim_vmm *vmm, gp_devptr va, size_t len, gpsim_piece **pieces,
                        size_t *count);
/* Whether two translations share a byte; *offset receives the first shared one. */
bool gpsim_pieces_overlap(const gpsim_piece *a, size_t a_count, const gpsim_piece *b, size_t b_count,
                          uint64_t *offset);
void gpsim_vmm_assert_invariants(const gpsim_vmm *vmm);

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
    gpsim_piece *pieces;   /* "sim-vmm": the physical memory behind [addr, addr+len), owned */
    size_t piece_count;
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
    bool destroyed;        /* gp_sim_stream_destroy: its queued work completes; a later call on it is bad */
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
 * pre: len == 0 or [addr, addr+len) inside one allocation ("sim") or translated to `pieces`
 * ("sim-vmm": races are then found on the pieces, i.e. on physical memory). Takes ownership of
 * pieces (NULL with "sim"), also on failure. GP_ERR_DEVICE on host out-of-memory. */
int gpsim_launch(gp_sim *sim, gpsim_stream *stream, gp_devptr addr, size_t len, int kernel_op,
                 uint64_t seed, uint64_t duration_ns, gpsim_piece *pieces, size_t piece_count);

/* Virtual time. Invariant between calls ("settled"): every op whose finish time is <= now has
 * completed; every op still queued finishes after now or waits on one that does. */
void gpsim_run_until(gp_sim *sim, uint64_t time);
void gpsim_run_all(gp_sim *sim);
void gpsim_run_stream(gp_sim *sim, gpsim_stream *stream);
/* Whether a kernel not yet completed, on any stream, uses an address of [va, va+size) (as the kernel
 * was launched: its virtual addresses). Sim locked. */
bool gpsim_range_in_flight(const gp_sim *sim, gp_devptr va, size_t size);

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
    size_t host_page_size;

    gpsim_memory memory;      /* "sim" */
    gpsim_vmm *vmm;           /* "sim-vmm"; NULL for "sim" */

    gpsim_stream **streams;
    size_t stream_count, stream_capacity;
    gpsim_table stream_by_handle;
    uint64_t streams_created; /* gp_sim_stream_create calls, for fresh handles */

    gpsim_table events;       /* live events, keyed by their address */

    uint64_t now;             /* virtual time, ns */
    size_t deepest_queue;     /* the most ops queued on one stream at once (gp_sim_report) */

    uint64_t calls[GPSIM_CALL_KINDS];
    uint64_t fail_countdown;  /* 0: disarmed */
    unsigned fail_mask;
    /* gp_sim_set_call_hook: called before a call of a kind in hook_mask, outside the lock */
    unsigned hook_mask;
    void (*hook)(void *arg, unsigned kind);
    void *hook_arg;
    int fail_error;
    uint64_t faults_injected;

    uint64_t races, pattern_mismatches, bad_calls;
    uint64_t leaked_bytes_at_close, leaked_events_at_close;
    uint64_t leaked_handles_at_close, leaked_mappings_at_close, leaked_reservations_at_close;
    char first_violation[GPSIM_VIOLATION_MAX]; /* written once, "" until the first violation */
};

/* Keeps the first violation's text (sim_violation.c). Counters are bumped by the caller. */
void gpsim_violation(gp_sim *sim, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *gpsim_kernel_op_name(int kernel_op);
/* The bytes of device memory allocated now: physical memory with "sim-vmm" (sim_report.c). */
size_t gpsim_allocated_bytes(const gp_sim *sim);

#endif /* GP_SIM_INTERNAL_H */
