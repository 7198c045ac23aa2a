/*
 * sim_clock.c — streams, events and virtual time of the simulated device, and its race checker.
 *
 * Streams. Any gp_stream value is a stream, created on first use. A stream is a FIFO of ops:
 *   KERNEL(addr, len, op, seed, duration)  reaches the head, runs `duration` ns, then applies its
 *                                          memory effect (write/check/read) as it completes;
 *   RECORD                                 completes as soon as it reaches the head;
 *   WAIT(S, s)                             completes once stream S has completed its op s.
 * An op reaches the head at max(its enqueue time, the finish time of the op before it).
 *
 * Virtual time. The run loop completes, one at a time and in nondecreasing finish time, the head op
 * with the earliest finish time, moving `now` to it; a WAIT whose target is already done finishes at
 * max(its head time, now). Every enqueue ends by settling (completing all ops due at `now`), so
 * between calls: an op is complete <=> its finish time <= now. Waits only name ops enqueued before
 * them, so the "enqueued before" order is acyclic and the loop always drains.
 *
 * Race checker. Each stream G has a vector clock VC_G: VC_G[S] is the highest seq of stream S known
 * to be ordered before work enqueued on G from now on, and VC_G[G] == G.enq_seq. A RECORD snapshots
 * the recording stream's clock into the event; stream_wait_event merges (elementwise max) the
 * snapshot into the waiting stream's clock. At the launch of kernel K on G over range R, every kernel
 * K' still queued (i.e. incomplete) on another stream S with seq(K') > VC_G[S], an overlapping range,
 * and at least one of K, K' writing, is a race. Kernels that completed are ordered by time.
 * With "sim-vmm" the ranges compared are physical: each kernel carries the memfd pieces its addresses
 * translated to at launch, so two kernels that reach one physical page through different addresses
 * (a handle mapped twice, or remapped elsewhere while a kernel still uses it) race as well.
 */
#include "sim/sim_internal.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

static uint64_t saturating_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static int host_oom(const char *what)
{
    return gp_error_set(GP_ERR_DEVICE, "sim: host out of memory for %s", what);
}

/* ---- handle table ----------------------------------------------------------------------------- */

static size_t table_slot(const gpsim_table *t, uintptr_t key)
{
    uint64_t h = (uint64_t)key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & (t->capacity - 1);
}

static void *table_find(const gpsim_table *t, uintptr_t key)
{
    if (t->capacity == 0)
        return NULL;
    for (size_t i = table_slot(t, key);; i = (i + 1) & (t->capacity - 1)) {
        if (!t->entries[i].used)
            return NULL;
        if (t->entries[i].key == key)
            return t->entries[i].value;
    }
}

/* Makes room for one more key; false on host out-of-memory (table unchanged). */
static bool table_reserve(gpsim_table *t)
{
    if ((t->count + 1) * 2 <= t->capacity)
        return true;
    size_t capacity = t->capacity ? t->capacity * 2 : 16;
    gpsim_table_entry *entries = calloc(capacity, sizeof *entries);
    if (entries == NULL)
        return false;
    gpsim_table grown = {.entries = entries, .capacity = capacity, .count = 0};
    for (size_t i = 0; i < t->capacity; i++) {
        if (!t->entries[i].used)
            continue;
        size_t j = table_slot(&grown, t->entries[i].key);
        while (grown.entries[j].used)
            j = (j + 1) & (capacity - 1);
        grown.entries[j] = t->entries[i];
        grown.count++;
    }
    assert(grown.count == t->count);
    free(t->entries);
    *t = grown;
    return true;
}

/* pre: table_reserve succeeded and key is absent. */
static void table_insert(gpsim_table *t, uintptr_t key, void *value)
{
    assert((t->count + 1) * 2 <= t->capacity && table_find(t, key) == NULL);
    size_t i = table_slot(t, key);
    while (t->entries[i].used)
        i = (i + 1) & (t->capacity - 1);
    t->entries[i] = (gpsim_table_entry){.key = key, .value = value, .used = true};
    t->count++;
}

/* Linear probing with backward-shift deletion (no tombstones). pre: key present. */
static void table_remove(gpsim_table *t, uintptr_t key)
{
    size_t mask = t->capacity - 1;
    size_t i = table_slot(t, key);
    while (t->entries[i].key != key || !t->entries[i].used)
        i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; t->entries[j].used; j = (j + 1) & mask) {
        size_t home = table_slot(t, t->entries[j].key);
        /* entry j may move into the hole at i when its home is not in (i, j] cyclically */
        bool home_in_between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!home_in_between) {
            t->entries[i] = t->entries[j];
            i = j;
        }
    }
    t->entries[i] = (gpsim_table_entry){0};
    t->count--;
}

static void table_free(gpsim_table *t)
{
    free(t->entries);
    memset(t, 0, sizeof *t);
}

/* ---- streams ---------------------------------------------------------------------------------- */

static gpsim_op *queue_at(const gpsim_stream *s, size_t position)
{
    assert(position < s->queue_len);
    return &s->queue[(s->queue_head + position) % s->queue_capacity];
}

static bool queue_reserve(gpsim_stream *s)
{
    assert(s->queue_len <= s->queue_capacity); /* an empty queue may have no storage yet */
    if (s->queue_len < s->queue_capacity)
        return true;
    size_t capacity = s->queue_capacity ? s->queue_capacity * 2 : 16;
    gpsim_op *grown = malloc(capacity * sizeof *grown);
    if (grown == NULL)
        return false;
    for (size_t i = 0; i < s->queue_len; i++)
        grown[i] = *queue_at(s, i);
    free(s->queue);
    s->queue = grown;
    s->queue_capacity = capacity;
    s->queue_head = 0;
    return true;
}

static bool clock_reserve(gpsim_stream *s, size_t len)
{
    if (len <= s->clock_len)
        return true;
    uint64_t *grown = realloc(s->clock, len * sizeof *grown);
    if (grown == NULL)
        return false;
    memset(grown + s->clock_len, 0, (len - s->clock_len) * sizeof *grown);
    s->clock = grown;
    s->clock_len = len;
    return true;
}

static void assert_stream(const gpsim_stream *s)
{
    assert(s->done_seq <= s->enq_seq);
    assert(s->enq_seq - s->done_seq == s->queue_len);
    assert(s->clock_len > s->index && s->clock[s->index] == s->enq_seq);
    assert(s->queue_len == 0 || queue_at(s, 0)->seq == s->done_seq + 1);
    (void)s;
}

/* pre: handle not in the table. */
static gpsim_stream *stream_new(gp_sim *sim, gp_stream handle)
{
    if (sim->stream_count == sim->stream_capacity) {
        size_t capacity = sim->stream_capacity ? sim->stream_capacity * 2 : 8;
        gpsim_stream **grown = realloc(sim->streams, capacity * sizeof *grown);
        if (grown == NULL)
            return NULL;
        sim->streams = grown;
        sim->stream_capacity = capacity;
    }
    if (!table_reserve(&sim->stream_by_handle))
        return NULL;
    gpsim_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->handle = handle;
    s->index = sim->stream_count;
    if (!clock_reserve(s, s->index + 1)) {
        free(s);
        return NULL;
    }
    sim->streams[sim->stream_count++] = s;
    table_insert(&sim->stream_by_handle, (uintptr_t)handle, s);
    assert_stream(s);
    return s;
}

gpsim_stream *gpsim_stream_get(gp_sim *sim, gp_stream handle)
{
    gpsim_stream *s = table_find(&sim->stream_by_handle, (uintptr_t)handle);
    if (s != NULL)
        return s;
    s = stream_new(sim, handle);
    if (s == NULL)
        host_oom("a stream");
    return s;
}

gpsim_stream *gpsim_stream_create_fresh(gp_sim *sim)
{
    gp_stream handle;
    do {
        sim->streams_created++;
        handle = (gp_stream)(uintptr_t)(0x5151000u + 16u * sim->streams_created);
    } while (table_find(&sim->stream_by_handle, (uintptr_t)handle) != NULL);
    gpsim_stream *s = stream_new(sim, handle);
    if (s == NULL)
        host_oom("a stream");
    return s;
}

/* pre: queue_reserve(s) succeeded. Fills seq and enqueue time, ticks the stream's own clock. */
static void enqueue(gp_sim *sim, gpsim_stream *s, gpsim_op op)
{
    assert(s->queue_len < s->queue_capacity);
    s->enq_seq++;
    op.seq = s->enq_seq;
    op.enqueued_at = sim->now;
    s->queue[(s->queue_head + s->queue_len) % s->queue_capacity] = op;
    s->queue_len++;
    if (s->queue_len > sim->deepest_queue)
        sim->deepest_queue = s->queue_len;
    s->clock[s->index] = s->enq_seq;
    assert_stream(s);
}

/* ---- virtual time ----------------------------------------------------------------------------- */

/* When the head op of s finishes, or false when it cannot be known yet (empty, or a WAIT whose target
 * has not completed). */
static bool head_finish_time(const gp_sim *sim, const gpsim_stream *s, uint64_t *finish)
{
    if (s->queue_len == 0)
        return false;
    const gpsim_op *op = queue_at(s, 0);
    uint64_t reached = max_u64(op->enqueued_at, s->last_finish);
    switch (op->kind) {
    case GPSIM_OP_KERNEL:
        *finish = saturating_add(reached, op->duration_ns);
        break;
    case GPSIM_OP_RECORD:
        *finish = reached;
        break;
    case GPSIM_OP_WAIT:
        assert(op->wait_stream < sim->stream_count);
        if (sim->streams[op->wait_stream]->done_seq < op->wait_seq)
            return false;
        /* the target completed at a time <= now; the loop re-evaluates heads after every completion,
         * so a wait unblocked by that completion finishes at max(reached, now) */
        *finish = max_u64(reached, sim->now);
        break;
    }
    return true;
}

static void apply_kernel(gp_sim *sim, const gpsim_stream *s, const gpsim_op *op)
{
    if (op->len == 0)
        return;
    /* validated at launch; mem_free and unmap run all queued work before memory goes away */
    assert(sim->vmm != NULL || gpsim_memory_contains(&sim->memory, op->addr, op->len));
    switch (op->kernel_op) {
    case GP_SIM_WRITE:
        gpsim_write_pattern(sim->host_page_size, op->addr, op->len, op->seed);
        break;
    case GP_SIM_CHECK: {
        size_t first_bad = 0;
        if (!gpsim_check_pattern(sim->host_page_size, op->addr, op->len, op->seed, &first_bad)) {
            sim->pattern_mismatches++;
            gpsim_violation(sim,
                            "pattern mismatch: CHECK(seed %" PRIu64 ") on stream 0x%" PRIxPTR " [0x%" PRIxPTR ",+%zu) "
                            "(op #%" PRIu64 ") differs at byte offset %zu",
                            op->seed, (uintptr_t)s->handle, op->addr, op->len, op->seq, first_bad);
        }
        break;
    }
    case GP_SIM_USE: /* contents not simulated: ordering and races only */
        break;
    default:
        gpsim_read(sim->host_page_size, op->addr, op->len);
        break;
    }
}

/* Completes the head op of the stream whose head finishes first, if that is <= limit. */
static bool step(gp_sim *sim, uint64_t limit)
{
    gpsim_stream *next = NULL;
    uint64_t next_finish = 0;
    for (size_t i = 0; i < sim->stream_count; i++) {
        uint64_t finish = 0;
        if (head_finish_time(sim, sim->streams[i], &finish) && (next == NULL || finish < next_finish)) {
            next = sim->streams[i];
            next_finish = finish;
        }
    }
    if (next == NULL || next_finish > limit)
        return false;
    assert(next_finish >= sim->now); /* settled: nothing due in the past is left */
    sim->now = next_finish;

    gpsim_op op = *queue_at(next, 0);
    next->queue_head = (next->queue_head + 1) % next->queue_capacity;
    next->queue_len--;
    next->done_seq++;
    next->last_finish = next_finish;
    assert(op.seq == next->done_seq);
    assert_stream(next);
    if (op.kind == GPSIM_OP_KERNEL)
        apply_kernel(sim, next, &op);
    free(op.pieces);
    return true;
}

static void settle(gp_sim *sim)
{
    while (step(sim, sim->now)) {
    }
}

static void assert_idle(const gp_sim *sim)
{
#ifndef NDEBUG
    for (size_t i = 0; i < sim->stream_count; i++)
        assert(sim->streams[i]->queue_len == 0);
#else
    (void)sim;
#endif
}

void gpsim_run_until(gp_sim *sim, uint64_t time)
{
    while (step(sim, time)) {
    }
    sim->now = max_u64(sim->now, time);
}

void gpsim_run_all(gp_sim *sim)
{
    while (step(sim, UINT64_MAX)) {
    }
    assert_idle(sim); /* waits are acyclic, so everything drains */
}

void gpsim_run_stream(gp_sim *sim, gpsim_stream *stream)
{
    while (stream->queue_len > 0) {
        bool progressed = step(sim, UINT64_MAX);
        assert(progressed);
        if (!progressed)
            break;
    }
    settle(sim);
}

bool gpsim_range_in_flight(const gp_sim *sim, gp_devptr va, size_t size)
{
    for (size_t i = 0; i < sim->stream_count; i++) {
        const gpsim_stream *s = sim->streams[i];
        for (size_t k = 0; k < s->queue_len; k++) {
            const gpsim_op *op = &s->queue[(s->queue_head + k) % s->queue_capacity];
            if (op->kind == GPSIM_OP_KERNEL && op->len > 0 && op->addr < va + size && va < op->addr + op->len)
                return true;
        }
    }
    return false;
}

/* ---- kernels and the race checker ------------------------------------------------------------- */

static bool is_write(int kernel_op)
{
    return kernel_op == GP_SIM_WRITE || kernel_op == GP_SIM_USE;
}

static bool ranges_overlap(gp_devptr a, size_t a_len, gp_devptr b, size_t b_len)
{
    return a < b + b_len && b < a + a_len;
}

/* Whether two kernels use a common byte: of physical memory when both were translated ("sim-vmm"),
 * else of their address ranges. *physical receives the first common physical offset (or stays). */
static bool kernels_overlap(gp_devptr addr, size_t len, const gpsim_piece *pieces, size_t piece_count,
                            const gpsim_op *other, uint64_t *physical)
{
    if (pieces != NULL && other->pieces != NULL)
        return gpsim_pieces_overlap(pieces, piece_count, other->pieces, other->piece_count, physical);
    return ranges_overlap(addr, len, other->addr, other->len);
}

static void check_races(gp_sim *sim, const gpsim_stream *g, gp_devptr addr, size_t len, int kernel_op,
                        const gpsim_piece *pieces, size_t piece_count)
{
    for (size_t i = 0; i < sim->stream_count; i++) {
        const gpsim_stream *s = sim->streams[i];
        if (s == g)
            continue;
        uint64_t ordered = s->index < g->clock_len ? g->clock[s->index] : 0;
        /* queued ops are incomplete; only those after `ordered` are unordered with the launch */
        for (size_t pos = s->queue_len; pos-- > 0;) {
            const gpsim_op *other = queue_at(s, pos);
            if (other->seq <= ordered)
                break;
            if (other->kind != GPSIM_OP_KERNEL || other->len == 0)
                continue;
            if (!is_write(kernel_op) && !is_write(other->kernel_op))
                continue;
            uint64_t physical = 0;
            if (!kernels_overlap(addr, len, pieces, piece_count, other, &physical))
                continue;
            sim->races++;
            if (pieces == NULL) {
                gpsim_violation(sim,
                                "race: %s on stream 0x%" PRIxPTR " [0x%" PRIxPTR ",+%zu) while %s on stream 0x%" PRIxPTR
                                " [0x%" PRIxPTR ",+%zu) (op #%" PRIu64 ") is not ordered before it",
                                gpsim_kernel_op_name(kernel_op), (uintptr_t)g->handle, addr, len,
                                gpsim_kernel_op_name(other->kernel_op), (uintptr_t)s->handle, other->addr,
                                other->len,
                                other->seq);
            } else {
                gpsim_violation(sim,
                                "race: %s on stream 0x%" PRIxPTR " [0x%" PRIxPTR ",+%zu) while %s on stream 0x%" PRIxPTR
                                " [0x%" PRIxPTR ",+%zu) (op #%" PRIu64 ") is not ordered before it; both use "
                                "physical memory at offset 0x%" PRIx64,
                                gpsim_kernel_op_name(kernel_op), (uintptr_t)g->handle, addr, len,
                                gpsim_kernel_op_name(other->kernel_op), (uintptr_t)s->handle, other->addr,
                                other->len, other->seq, physical);
            }
        }
    }
}

int gpsim_launch(gp_sim *sim, gpsim_stream *stream, gp_devptr addr, size_t len, int kernel_op,
                 uint64_t seed, uint64_t duration_ns, gpsim_piece *pieces, size_t piece_count)
{
    if (!queue_reserve(stream)) {
        free(pieces);
        return host_oom("a kernel");
    }
    if (len > 0)
        check_races(sim, stream, addr, len, kernel_op, pieces, piece_count);
    enqueue(sim, stream,
            (gpsim_op){.kind = GPSIM_OP_KERNEL, .addr = addr, .len = len, .kernel_op = kernel_op,
                       .seed = seed, .duration_ns = duration_ns, .pieces = pieces,
                       .piece_count = piece_count});
    settle(sim);
    return GP_OK;
}

/* ---- events ----------------------------------------------------------------------------------- */

int gpsim_event_new(gp_sim *sim, gpsim_event **out)
{
    if (!table_reserve(&sim->events))
        return host_oom("an event");
    gpsim_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return host_oom("an event");
    table_insert(&sim->events, (uintptr_t)ev, ev);
    *out = ev;
    return GP_OK;
}

gpsim_event *gpsim_event_find(gp_sim *sim, gp_event handle)
{
    return handle == NULL ? NULL : table_find(&sim->events, (uintptr_t)handle);
}

void gpsim_event_delete(gp_sim *sim, gpsim_event *ev)
{
    table_remove(&sim->events, (uintptr_t)ev);
    free(ev->clock);
    free(ev);
}

void gpsim_event_delete_all(gp_sim *sim)
{
    for (size_t i = 0; i < sim->events.capacity; i++) {
        if (!sim->events.entries[i].used)
            continue;
        gpsim_event *ev = sim->events.entries[i].value;
        free(ev->clock);
        free(ev);
    }
    table_free(&sim->events);
}

size_t gpsim_event_count(const gp_sim *sim)
{
    return sim->events.count;
}

int gpsim_event_record(gp_sim *sim, gpsim_event *ev, gpsim_stream *stream)
{
    if (!queue_reserve(stream))
        return host_oom("an event record");
    if (ev->clock_len < stream->clock_len) {
        uint64_t *grown = realloc(ev->clock, stream->clock_len * sizeof *grown);
        if (grown == NULL)
            return host_oom("an event record");
        ev->clock = grown;
    }
    enqueue(sim, stream, (gpsim_op){.kind = GPSIM_OP_RECORD});
    ev->recorded = true;
    ev->stream = stream->index;
    ev->seq = stream->enq_seq;
    ev->clock_len = stream->clock_len;
    memcpy(ev->clock, stream->clock, stream->clock_len * sizeof *ev->clock);
    assert(ev->clock[stream->index] == ev->seq);
    settle(sim);
    return GP_OK;
}

bool gpsim_event_done(const gp_sim *sim, const gpsim_event *ev)
{
    if (!ev->recorded)
        return true;
    assert(ev->stream < sim->stream_count);
    return sim->streams[ev->stream]->done_seq >= ev->seq;
}

void gpsim_event_run(gp_sim *sim, const gpsim_event *ev)
{
    while (!gpsim_event_done(sim, ev)) {
        bool progressed = step(sim, UINT64_MAX);
        assert(progressed);
        if (!progressed)
            break;
    }
    settle(sim);
}

int gpsim_stream_wait_event(gp_sim *sim, gpsim_stream *stream, const gpsim_event *ev)
{
    if (!ev->recorded)
        return GP_OK; /* like CUDA: waiting on a never-recorded event is a no-op */
    bool must_wait = !gpsim_event_done(sim, ev);
    if (!clock_reserve(stream, ev->clock_len) || (must_wait && !queue_reserve(stream)))
        return host_oom("a stream wait");
    for (size_t i = 0; i < ev->clock_len; i++)
        stream->clock[i] = max_u64(stream->clock[i], ev->clock[i]);
    if (must_wait) {
        enqueue(sim, stream, (gpsim_op){.kind = GPSIM_OP_WAIT, .wait_stream = ev->stream, .wait_seq = ev->seq});
        settle(sim);
    }
    assert_stream(stream);
    return GP_OK;
}

/* ---- teardown --------------------------------------------------------------------------------- */

void gpsim_clock_destroy(gp_sim *sim)
{
    for (size_t i = 0; i < sim->stream_count; i++) {
        gpsim_stream *s = sim->streams[i];
        for (size_t pos = 0; pos < s->queue_len; pos++) /* work still queued at the final release */
            free(queue_at(s, pos)->pieces);
        free(sim->streams[i]->queue);
        free(sim->streams[i]->clock);
        free(sim->streams[i]);
    }
    free(sim->streams);
    sim->streams = NULL;
    sim->stream_count = sim->stream_capacity = 0;
    table_free(&sim->stream_by_handle);
    gpsim_event_delete_all(sim);
}
