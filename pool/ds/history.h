/*
 * history.h — the pool's recent allocation events, kept for snapshots (pool/api/snapshot.c writes
 * them as the device trace of PyTorch's memory_viz format).
 *
 * A ring of the last `capacity` events, each what PyTorch's allocator records in its trace: an
 * allocation, a free requested by the program, a free completed (the block is back in the cache: at
 * once on the stream that allocated it, after the events of other streams otherwise), and the pool
 * taking or giving back device memory (a segment on cudaMalloc backends, a page mapped or unmapped on
 * virtual memory ones). Off until gp_history_record() turns it on; then the hooks in alloc.c, free.c,
 * reclaim.c and vmm.c add one entry each under the ring's own mutex (never taken while off, so an off
 * history costs the fast paths one relaxed load). The mutex is a leaf: taken under the pool or a
 * stream lock, never the other way round.
 *
 * Invariant: count <= capacity; the entries, oldest first, are ring[(next - count + i) % capacity].
 */
#ifndef GP_DS_HISTORY_H
#define GP_DS_HISTORY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum gp_history_action {
    GP_HIST_ALLOC,
    GP_HIST_FREE_REQUESTED,
    GP_HIST_FREE_COMPLETED,
    GP_HIST_SEGMENT_ALLOC,
    GP_HIST_SEGMENT_FREE,
    GP_HIST_SEGMENT_MAP,
    GP_HIST_SEGMENT_UNMAP,
    GP_HIST_OOM
};

typedef struct gp_history_entry {
    uint64_t time_ns;
    uint64_t addr;
    uint64_t size;
    uint64_t stream;
    uint8_t action; /* enum gp_history_action */
    uint8_t tenant; /* the tenant's index (names are looked up when written) */
} gp_history_entry;

typedef struct gp_history {
    pthread_mutex_t lock;
    gp_history_entry *ring;
    size_t capacity, count, next;
    uint64_t dropped; /* entries overwritten because the ring was full */
} gp_history;

/* NULL when host memory is out. */
gp_history *gp_history_create(size_t capacity);
void gp_history_destroy(gp_history *h);

/* Forgets every entry and, when capacity > 0 differs, changes the capacity: 0, or -1 when host memory
 * is out (then nothing changed). */
int gp_history_resize(gp_history *h, size_t capacity);

void gp_history_add(gp_history *h, const gp_history_entry *e);

/* Copies the entries, oldest first, into a new array (*out, free() it); returns the count, or
 * SIZE_MAX when host memory is out. */
size_t gp_history_copy(gp_history *h, gp_history_entry **out);

/* The name PyTorch's trace gives the action ("alloc", "free_requested", "segment_map", ...). */
const char *gp_history_action_name(unsigned action);

#endif /* GP_DS_HISTORY_H */
