/*
 * backend_sim.c — the "sim" backend (gp_backend_sim) and the public gp_sim_* API of gpupool_sim.h.
 *
 * This file owns the sim's lifetime, its lock, call counting, fault injection and the report; device
 * memory lives in sim_memory.c, streams/events/virtual time and the race checker in sim_clock.c.
 *
 * Lifetime: open() creates the sim with one reference, the pool's; close() records leaks, marks the
 * sim closed, frees its events and drops that reference. gp_sim_retain/gp_sim_release let a test keep
 * the sim, so that the report and first violation can be read after gp_pool_destroy; the mapping and
 * all state go when the count reaches 0. On a closed sim every device call is a bad call
 * (GP_ERR_DEVICE), gp_sim_launch returns GP_ERR_DESTROYED and the other gp_sim_* calls do nothing.
 *
 * Every device call is counted under its kind (enum gp_sim_call) before anything else, then checked
 * against the armed fault: the nth call of a kind in fail_mask fails with fail_error and changes
 * nothing else. Preconditions the pool breaks (bad sizes, frees of unknown addresses, unknown events,
 * kernels on unallocated memory) are bad calls: counted, the first kept as the first violation.
 *
 * One mutex guards the whole sim; every function here may be called from any thread.
 */
#include "sim_internal.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "format.h"

const char *gpsim_kernel_op_name(int kernel_op)
{
    switch (kernel_op) {
    case GP_SIM_READ: return "READ";
    case GP_SIM_WRITE: return "WRITE";
    case GP_SIM_CHECK: return "CHECK";
    default: return "?";
    }
}

void gpsim_violation(gp_sim *sim, const char *fmt, ...)
{
    if (sim->first_violation[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sim->first_violation, sizeof sim->first_violation, fmt, ap);
    va_end(ap);
}

static void lock(gp_sim *sim)
{
    int rc = pthread_mutex_lock(&sim->lock);
    assert(rc == 0);
    (void)rc;
}

static void unlock(gp_sim *sim)
{
    int rc = pthread_mutex_unlock(&sim->lock);
    assert(rc == 0);
    (void)rc;
}

static void destroy(gp_sim *sim)
{
    gpsim_clock_destroy(sim);
    gpsim_memory_unmap(&sim->memory);
    pthread_mutex_destroy(&sim->lock);
    free(sim);
}

/* Counts a device call of `kind` and fires the armed fault. GP_OK: go on with the call. */
static int begin_call(gp_sim *sim, unsigned kind, const char *name)
{
    assert(kind != 0 && (kind & (kind - 1)) == 0 && kind <= GP_SIM_CALL_ALL);
    if (sim->closed) {
        sim->bad_calls++;
        gpsim_violation(sim, "bad call: %s after the backend was closed", name);
        return gp_error_set(GP_ERR_DEVICE, "sim: %s after the backend was closed", name);
    }
    uint64_t number = ++sim->calls[__builtin_ctz(kind)];
    if (sim->fail_countdown > 0 && (sim->fail_mask & kind) != 0 && --sim->fail_countdown == 0) {
        sim->faults_injected++;
        sim->fail_mask = 0;
        return gp_error_set(sim->fail_error, "sim: injected fault in %s (call #%" PRIu64 ")", name, number);
    }
    return GP_OK;
}

/* A call that breaks the backend's preconditions: counted, kept as a violation, GP_ERR_INVALID. */
static int bad_call(gp_sim *sim, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad_call(gp_sim *sim, const char *fmt, ...)
{
    char text[GPSIM_VIOLATION_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    sim->bad_calls++;
    gpsim_violation(sim, "bad call: %s", text);
    return gp_error_set(GP_ERR_INVALID, "sim: %s", text);
}

static gpsim_event *find_event(gp_sim *sim, gp_event handle, const char *name)
{
    gpsim_event *ev = gpsim_event_find(sim, handle);
    if (ev == NULL)
        bad_call(sim, "%s(%p): not a live event of this device", name, handle);
    return ev;
}

/* ---- backend operations ----------------------------------------------------------------------- */

static int sim_open(const struct gp_config *cfg, int device, void **ctx)
{
    if (cfg == NULL || ctx == NULL || device < 0)
        return gp_error_set(GP_ERR_INVALID, "sim: open needs a configuration, a context and a device >= 0");
    gp_sim *sim = calloc(1, sizeof *sim);
    if (sim == NULL)
        return gp_error_set(GP_ERR_BACKEND, "sim: host out of memory for the simulated device");
    int rc = gpsim_memory_map(&sim->memory, cfg->device_memory);
    if (rc != GP_OK) {
        free(sim);
        return rc;
    }
    if (pthread_mutex_init(&sim->lock, NULL) != 0) {
        gpsim_memory_unmap(&sim->memory);
        free(sim);
        return gp_error_set(GP_ERR_BACKEND, "sim: cannot create the simulated device's mutex");
    }
    sim->references = 1;
    sim->device = device;
    sim->fail_error = GP_ERR_DEVICE;
    *ctx = sim;
    return GP_OK;
}

static void sim_close(void *ctx)
{
    gp_sim *sim = ctx;
    lock(sim);
    if (sim->closed) {
        sim->bad_calls++;
        gpsim_violation(sim, "bad call: close of a backend already closed");
        unlock(sim);
        return;
    }
    sim->leaked_bytes_at_close = sim->memory.allocated_bytes;
    sim->leaked_events_at_close = gpsim_event_count(sim);
    if (sim->leaked_bytes_at_close > 0 || sim->leaked_events_at_close > 0) {
        char text[GP_SIZE_TEXT_MAX];
        gpsim_violation(sim, "leak at close: %s of device memory in %zu allocations and %" PRIu64 " events",
                        gp_format_size(sim->leaked_bytes_at_close, text), sim->memory.ledger_count,
                        sim->leaked_events_at_close);
    }
    gpsim_event_delete_all(sim);
    sim->closed = true;
    unlock(sim);
    gp_sim_release(sim); /* the pool's reference */
}

static int sim_mem_alloc(void *ctx, size_t size, gp_devptr *out)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_MEM_ALLOC, "mem_alloc");
    if (rc == GP_OK && out == NULL)
        rc = bad_call(sim, "mem_alloc(%zu): NULL out-pointer", size);
    if (rc == GP_OK && (size == 0 || size % GPSIM_PAGE_SIZE != 0))
        rc = bad_call(sim, "mem_alloc(%zu): size is not a positive multiple of 2 MiB", size);
    if (rc == GP_OK)
        rc = gpsim_memory_alloc(&sim->memory, size, out);
    unlock(sim);
    return rc;
}

static int sim_mem_free(void *ctx, gp_devptr ptr, size_t size)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_MEM_FREE, "mem_free");
    if (rc == GP_OK && !gpsim_memory_is_allocation(&sim->memory, ptr, size))
        rc = bad_call(sim, "bad free: mem_free(0x%" PRIxPTR ", %zu) is not an allocation of this device", ptr, size);
    if (rc == GP_OK) {
        gpsim_run_all(sim); /* as cudaFree: all device work that may use it finishes first */
        gpsim_memory_free(&sim->memory, ptr, size);
    }
    unlock(sim);
    return rc;
}

static int sim_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_MEM_INFO, "mem_info");
    if (rc == GP_OK && (free_bytes == NULL || total_bytes == NULL))
        rc = bad_call(sim, "mem_info: NULL out-pointer");
    if (rc == GP_OK) {
        *free_bytes = sim->memory.capacity - sim->memory.allocated_bytes;
        *total_bytes = sim->memory.capacity;
    }
    unlock(sim);
    return rc;
}

static int sim_event_create(void *ctx, gp_event *out)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_EVENT_CREATE, "event_create");
    if (rc == GP_OK && out == NULL)
        rc = bad_call(sim, "event_create: NULL out-pointer");
    gpsim_event *ev = NULL;
    if (rc == GP_OK)
        rc = gpsim_event_new(sim, &ev);
    if (rc == GP_OK)
        *out = ev;
    unlock(sim);
    return rc;
}

static int sim_event_destroy(void *ctx, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_EVENT_DESTROY, "event_destroy");
    gpsim_event *ev = rc == GP_OK ? find_event(sim, handle, "event_destroy") : NULL;
    if (rc == GP_OK && ev == NULL)
        rc = GP_ERR_INVALID;
    if (rc == GP_OK)
        gpsim_event_delete(sim, ev);
    unlock(sim);
    return rc;
}

static int sim_event_record(void *ctx, gp_event handle, gp_stream stream)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_EVENT_RECORD, "event_record");
    gpsim_event *ev = rc == GP_OK ? find_event(sim, handle, "event_record") : NULL;
    if (rc == GP_OK && ev == NULL)
        rc = GP_ERR_INVALID;
    gpsim_stream *s = NULL;
    if (rc == GP_OK && (s = gpsim_stream_get(sim, stream)) == NULL)
        rc = GP_ERR_DEVICE;
    if (rc == GP_OK)
        rc = gpsim_event_record(sim, ev, s);
    unlock(sim);
    return rc;
}

static int sim_event_query(void *ctx, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_EVENT_QUERY, "event_query");
    gpsim_event *ev = rc == GP_OK ? find_event(sim, handle, "event_query") : NULL;
    if (rc == GP_OK && ev == NULL)
        rc = GP_ERR_INVALID;
    if (rc == GP_OK && !gpsim_event_done(sim, ev))
        rc = gp_error_set(GP_ERR_NOT_READY, "sim: event %p not complete", handle);
    unlock(sim);
    return rc;
}

static int sim_event_synchronize(void *ctx, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_EVENT_SYNC, "event_synchronize");
    gpsim_event *ev = rc == GP_OK ? find_event(sim, handle, "event_synchronize") : NULL;
    if (rc == GP_OK && ev == NULL)
        rc = GP_ERR_INVALID;
    if (rc == GP_OK)
        gpsim_event_run(sim, ev);
    unlock(sim);
    return rc;
}

static int sim_stream_wait_event(void *ctx, gp_stream stream, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_STREAM_WAIT, "stream_wait_event");
    gpsim_event *ev = rc == GP_OK ? find_event(sim, handle, "stream_wait_event") : NULL;
    if (rc == GP_OK && ev == NULL)
        rc = GP_ERR_INVALID;
    gpsim_stream *s = NULL;
    if (rc == GP_OK && (s = gpsim_stream_get(sim, stream)) == NULL)
        rc = GP_ERR_DEVICE;
    if (rc == GP_OK)
        rc = gpsim_stream_wait_event(sim, s, ev);
    unlock(sim);
    return rc;
}

const gp_backend_ops gp_backend_sim = {
    .name = "sim",
    .open = sim_open,
    .close = sim_close,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .mem_info = sim_mem_info,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .stream_wait_event = sim_stream_wait_event,
};

struct gp_sim *gp_backend_sim_instance(void *ctx)
{
    return ctx; /* the context is the sim itself */
}

/* ---- public API (gpupool_sim.h) --------------------------------------------------------------- */

GP_API void gp_sim_retain(gp_sim *sim)
{
    if (sim == NULL)
        return;
    lock(sim);
    assert(sim->references > 0);
    sim->references++;
    unlock(sim);
}

GP_API void gp_sim_release(gp_sim *sim)
{
    if (sim == NULL)
        return;
    lock(sim);
    assert(sim->references > 0);
    bool last = --sim->references == 0;
    unlock(sim);
    if (last)
        destroy(sim); /* nobody else holds a reference, so nobody can be waiting on the lock */
}

GP_API gp_stream gp_sim_stream_create(gp_sim *sim)
{
    if (sim == NULL)
        return NULL;
    lock(sim);
    gp_stream handle;
    if (sim->closed) {
        sim->streams_created++; /* still a fresh value, but nothing to register */
        handle = (gp_stream)(uintptr_t)(0x5151000u + 16u * sim->streams_created);
    } else {
        gpsim_stream *s = gpsim_stream_create_fresh(sim);
        handle = s != NULL ? s->handle : NULL;
    }
    unlock(sim);
    return handle;
}

GP_API int gp_sim_launch(gp_sim *sim, gp_stream stream, const void *addr, size_t len, int op,
                         uint64_t seed, uint64_t duration_ns)
{
    if (sim == NULL)
        return gp_error_set(GP_ERR_INVALID, "sim: gp_sim_launch on a NULL sim");
    gp_devptr start = (gp_devptr)addr;
    lock(sim);
    int rc = GP_OK;
    if (sim->closed)
        rc = gp_error_set(GP_ERR_DESTROYED, "sim: gp_sim_launch after the backend was closed");
    else if (op != GP_SIM_READ && op != GP_SIM_WRITE && op != GP_SIM_CHECK)
        rc = gp_error_set(GP_ERR_INVALID, "sim: gp_sim_launch: unknown kernel op %d", op);
    else if (len > 0 && !gpsim_memory_contains(&sim->memory, start, len))
        rc = bad_call(sim, "kernel on unallocated memory: %s on stream 0x%" PRIxPTR " [0x%" PRIxPTR
                           ",+%zu) is not inside one device allocation",
                      gpsim_kernel_op_name(op), (uintptr_t)stream, start, len);
    gpsim_stream *s = NULL;
    if (rc == GP_OK && (s = gpsim_stream_get(sim, stream)) == NULL)
        rc = GP_ERR_DEVICE;
    if (rc == GP_OK)
        rc = gpsim_launch(sim, s, start, len, op, seed, duration_ns);
    unlock(sim);
    return rc;
}

GP_API void gp_sim_advance(gp_sim *sim, uint64_t ns)
{
    if (sim == NULL)
        return;
    lock(sim);
    if (!sim->closed)
        gpsim_run_until(sim, sim->now > UINT64_MAX - ns ? UINT64_MAX : sim->now + ns);
    unlock(sim);
}

GP_API void gp_sim_synchronize(gp_sim *sim)
{
    if (sim == NULL)
        return;
    lock(sim);
    if (!sim->closed)
        gpsim_run_all(sim);
    unlock(sim);
}

GP_API void gp_sim_stream_synchronize(gp_sim *sim, gp_stream stream)
{
    if (sim == NULL)
        return;
    lock(sim);
    if (!sim->closed) {
        gpsim_stream *s = gpsim_stream_get(sim, stream);
        if (s != NULL)
            gpsim_run_stream(sim, s);
    }
    unlock(sim);
}

GP_API uint64_t gp_sim_now(gp_sim *sim)
{
    if (sim == NULL)
        return 0;
    lock(sim);
    uint64_t now = sim->now;
    unlock(sim);
    return now;
}

GP_API void gp_sim_fail_call(gp_sim *sim, uint64_t n, unsigned mask, int error)
{
    if (sim == NULL)
        return;
    lock(sim);
    if (!sim->closed) {
        sim->fail_countdown = n;
        sim->fail_mask = n == 0 ? 0 : mask & GP_SIM_CALL_ALL;
        sim->fail_error = error < 0 ? error : GP_ERR_DEVICE;
    }
    unlock(sim);
}

GP_API uint64_t gp_sim_calls(gp_sim *sim, unsigned mask)
{
    if (sim == NULL)
        return 0;
    lock(sim);
    uint64_t total = 0;
    for (unsigned i = 0; i < GPSIM_CALL_KINDS; i++)
        if (mask & (1u << i))
            total += sim->calls[i];
    unlock(sim);
    return total;
}

GP_API uint64_t gp_sim_faults_injected(gp_sim *sim)
{
    if (sim == NULL)
        return 0;
    lock(sim);
    uint64_t faults = sim->faults_injected;
    unlock(sim);
    return faults;
}

GP_API void gp_sim_get_report(gp_sim *sim, gp_sim_report *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof *out);
    if (sim == NULL)
        return;
    lock(sim);
    out->races = sim->races;
    out->pattern_mismatches = sim->pattern_mismatches;
    out->bad_calls = sim->bad_calls;
    out->allocated_bytes = sim->memory.allocated_bytes;
    out->allocated_peak = sim->memory.allocated_peak;
    out->allocations = sim->memory.ledger_count;
    out->events = gpsim_event_count(sim);
    out->leaked_bytes_at_close = sim->leaked_bytes_at_close;
    out->leaked_events_at_close = sim->leaked_events_at_close;
    out->closed = sim->closed;
    unlock(sim);
}

GP_API const char *gp_sim_first_violation(gp_sim *sim)
{
    if (sim == NULL)
        return "";
    lock(sim);
    const char *text = sim->first_violation; /* written once, then stable until the last release */
    unlock(sim);
    return text;
}
