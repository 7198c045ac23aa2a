/*
 * backend_sim.c — the "sim" and "sim-vmm" backends (gp_backend_sim, gp_backend_sim_vmm) and the public
 * gp_sim_* API of gpupool_sim.h.
 *
 * This file owns the sim's lifetime, its lock, call counting and fault injection; device memory lives
 * in sim_memory.c ("sim") or sim_vmm.c ("sim-vmm"), streams/events/virtual time and the race checker
 * in sim_clock.c, the first violation's text in sim_violation.c, the report in sim_report.c. "sim-vmm" is "sim" plus the virtual memory operations of backend.h;
 * its mem_alloc/mem_free/mem_info work too, on the same physical memory.
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
 * kernels on unallocated memory) are bad calls: counted, the first kept as the first violation. The
 * virtual memory operations check theirs the same way: a release of something not reserved/created,
 * a map outside a reservation or over a mapping, an unmap that is not exactly one mapping or that a
 * queued kernel still uses (cuMemUnmap does not wait: the pool must), a release of a handle still
 * mapped or of a reservation with mappings in it.
 *
 * One mutex guards the whole sim; every function here may be called from any thread.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "sim/sim_internal.h"
#include "sim/sim_backend.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <sys/mman.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/error.h"
#include "base/format.h"

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

static size_t capacity_of(const gp_sim *sim)
{
    return sim->vmm != NULL ? sim->vmm->capacity : sim->memory.capacity;
}

static void unmap_memory(gp_sim *sim)
{
    gpsim_memory_unmap(&sim->memory);
    if (sim->vmm != NULL) {
        gpsim_vmm_close(sim->vmm);
        free(sim->vmm);
        sim->vmm = NULL;
    }
}

static void destroy(gp_sim *sim)
{
    gpsim_clock_destroy(sim);
    unmap_memory(sim);
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
#ifdef __clang_analyzer__
/* The static analyzer does not follow variadic calls: show it that a bad call fails (see error.h). */
#define bad_call(sim, ...) (bad_call((sim), __VA_ARGS__), GP_ERR_INVALID)
#endif

static gpsim_event *find_event(gp_sim *sim, gp_event handle, const char *name)
{
    gpsim_event *ev = gpsim_event_find(sim, handle);
    if (ev == NULL)
        bad_call(sim, "%s(%p): not a live event of this device", name, handle);
    return ev;
}

/* ---- backend operations ----------------------------------------------------------------------- */

static int open_sim(const struct gp_config *cfg, int device, void **ctx, bool vmm)
{
    if (cfg == NULL || ctx == NULL || device < 0)
        return gp_error_set(GP_ERR_INVALID, "sim: open needs a configuration, a context and a device >= 0");
    gp_sim *sim = calloc(1, sizeof *sim);
    if (sim == NULL)
        return gp_error_set(GP_ERR_BACKEND, "sim: host out of memory for the simulated device");
    int rc = GP_OK;
    if (vmm) {
        sim->vmm = malloc(sizeof *sim->vmm);
        if (sim->vmm == NULL)
            rc = gp_error_set(GP_ERR_BACKEND, "sim: host out of memory for the simulated device");
        else if ((rc = gpsim_vmm_open(sim->vmm, cfg->device_memory)) != GP_OK) {
            free(sim->vmm);
            sim->vmm = NULL;
        }
    } else {
        rc = gpsim_memory_map(&sim->memory, cfg->device_memory);
    }
    if (rc != GP_OK) {
        free(sim);
        return rc;
    }
    if (pthread_mutex_init(&sim->lock, NULL) != 0) {
        unmap_memory(sim);
        free(sim);
        return gp_error_set(GP_ERR_BACKEND, "sim: cannot create the simulated device's mutex");
    }
    sim->host_page_size = vmm ? sim->vmm->host_page_size : sim->memory.host_page_size;
    sim->references = 1;
    sim->device = device;
    sim->fail_error = GP_ERR_DEVICE;
    *ctx = sim;
    return GP_OK;
}

static int sim_open(const struct gp_config *cfg, int device, void **ctx)
{
    return open_sim(cfg, device, ctx, false);
}

static int sim_vmm_open(const struct gp_config *cfg, int device, void **ctx)
{
    return open_sim(cfg, device, ctx, true);
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
    sim->leaked_bytes_at_close = gpsim_allocated_bytes(sim);
    sim->leaked_events_at_close = gpsim_event_count(sim);
    char text[GP_SIZE_TEXT_MAX];
    if (sim->vmm == NULL) {
        if (sim->leaked_bytes_at_close > 0 || sim->leaked_events_at_close > 0)
            gpsim_violation(sim, "leak at close: %s of device memory in %zu allocations and %" PRIu64 " events",
                            gp_format_size(sim->leaked_bytes_at_close, text), sim->memory.ledger_count,
                            sim->leaked_events_at_close);
    } else {
        const gpsim_vmm *vmm = sim->vmm;
        sim->leaked_handles_at_close = vmm->handle_count;
        sim->leaked_mappings_at_close = vmm->mappings.count;
        sim->leaked_reservations_at_close = vmm->reservations.count;
        if (sim->leaked_bytes_at_close > 0 || sim->leaked_events_at_close > 0 || vmm->mappings.count > 0 ||
            vmm->reservations.count > 0)
            gpsim_violation(sim,
                            "leak at close: %s of device memory in %zu allocations and %zu physical handles, "
                            "%zu mappings, %zu reservations and %" PRIu64 " events",
                            gp_format_size(sim->leaked_bytes_at_close, text), vmm->allocations.count,
                            vmm->handle_count, vmm->mappings.count, vmm->reservations.count,
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
        rc = sim->vmm != NULL ? gpsim_vmm_alloc(sim->vmm, size, out) : gpsim_memory_alloc(&sim->memory, size, out);
    unlock(sim);
    return rc;
}

static int sim_mem_free(void *ctx, gp_devptr ptr, size_t size)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_MEM_FREE, "mem_free");
    bool known = sim->vmm != NULL ? gpsim_vmm_is_allocation(sim->vmm, ptr, size)
                                  : gpsim_memory_is_allocation(&sim->memory, ptr, size);
    if (rc == GP_OK && !known)
        rc = bad_call(sim, "bad free: mem_free(0x%" PRIxPTR ", %zu) is not an allocation of this device", ptr, size);
    if (rc == GP_OK) {
        gpsim_run_all(sim); /* as cudaFree: all device work that may use it finishes first */
        if (sim->vmm != NULL)
            gpsim_vmm_free(sim->vmm, ptr, size);
        else
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
        *free_bytes = capacity_of(sim) - gpsim_allocated_bytes(sim);
        *total_bytes = capacity_of(sim);
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

/* Counts an event call (and injects its fault) and finds the event; GP_ERR_INVALID for a handle this
 * sim never created. Sim locked. */
static int begin_event_call(gp_sim *sim, unsigned kind, const char *name, gp_event handle, gpsim_event **ev)
{
    int rc = begin_call(sim, kind, name);
    *ev = rc == GP_OK ? find_event(sim, handle, name) : NULL;
    if (rc == GP_OK && *ev == NULL)
        rc = GP_ERR_INVALID;
    return rc;
}

static int sim_event_destroy(void *ctx, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    gpsim_event *ev = NULL;
    int rc = begin_event_call(sim, GP_SIM_CALL_EVENT_DESTROY, "event_destroy", handle, &ev);
    if (rc == GP_OK)
        gpsim_event_delete(sim, ev);
    unlock(sim);
    return rc;
}

/* The sim's stream for a call naming `stream` (sim locked): GP_ERR_DEVICE when host memory is out, a
 * bad call when the application destroyed it (gp_sim_stream_destroy): CUDA may have given the handle
 * to another stream since, so the pool must not name it (gp_stream_forget says when). */
static int live_stream(gp_sim *sim, gp_stream stream, const char *what, gpsim_stream **out)
{
    gpsim_stream *s = gpsim_stream_get(sim, stream);
    if (s == NULL)
        return GP_ERR_DEVICE;
    if (s->destroyed)
        return bad_call(sim, "use after destroy: %s on stream 0x%" PRIxPTR " after gp_sim_stream_destroy", what,
                        (uintptr_t)stream);
    *out = s;
    return GP_OK;
}

static int sim_event_record(void *ctx, gp_event handle, gp_stream stream)
{
    gp_sim *sim = ctx;
    lock(sim);
    gpsim_event *ev = NULL;
    int rc = begin_event_call(sim, GP_SIM_CALL_EVENT_RECORD, "event_record", handle, &ev);
    gpsim_stream *s = NULL;
    if (rc == GP_OK)
        rc = live_stream(sim, stream, "event_record", &s);
    if (rc == GP_OK)
        rc = gpsim_event_record(sim, ev, s);
    unlock(sim);
    return rc;
}

static int sim_event_query(void *ctx, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    gpsim_event *ev = NULL;
    int rc = begin_event_call(sim, GP_SIM_CALL_EVENT_QUERY, "event_query", handle, &ev);
    if (rc == GP_OK && !gpsim_event_done(sim, ev))
        rc = gp_error_set(GP_ERR_NOT_READY, "sim: event %p not complete", handle);
    unlock(sim);
    return rc;
}

/* Runs the test's hook for a call of `kind` (gp_sim_set_call_hook), before the call takes the lock. */
static void call_hook(gp_sim *sim, unsigned kind)
{
    lock(sim);
    void (*hook)(void *, unsigned) = (sim->hook_mask & kind) ? sim->hook : NULL;
    void *arg = sim->hook_arg;
    unlock(sim);
    if (hook != NULL)
        hook(arg, kind);
}

static int sim_event_synchronize(void *ctx, gp_event handle)
{
    gp_sim *sim = ctx;
    call_hook(sim, GP_SIM_CALL_EVENT_SYNC);
    lock(sim);
    gpsim_event *ev = NULL;
    int rc = begin_event_call(sim, GP_SIM_CALL_EVENT_SYNC, "event_synchronize", handle, &ev);
    if (rc == GP_OK)
        gpsim_event_run(sim, ev);
    unlock(sim);
    return rc;
}

static int sim_stream_wait_event(void *ctx, gp_stream stream, gp_event handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    gpsim_event *ev = NULL;
    int rc = begin_event_call(sim, GP_SIM_CALL_STREAM_WAIT, "stream_wait_event", handle, &ev);
    gpsim_stream *s = NULL;
    if (rc == GP_OK)
        rc = live_stream(sim, stream, "stream_wait_event", &s);
    if (rc == GP_OK)
        rc = gpsim_stream_wait_event(sim, s, ev);
    unlock(sim);
    return rc;
}

/* ---- virtual memory management ("sim-vmm") ---------------------------------------------------- */

static bool page_multiple(size_t size)
{
    return size > 0 && size % GPSIM_PAGE_SIZE == 0;
}

/* Not a counted call (a constant, as cuMemGetAllocationGranularity's answer is for a device). */
static int sim_vm_granularity(void *ctx, size_t *out)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = GP_OK;
    if (sim->closed) {
        sim->bad_calls++;
        gpsim_violation(sim, "bad call: vm_granularity after the backend was closed");
        rc = gp_error_set(GP_ERR_DEVICE, "sim: vm_granularity after the backend was closed");
    } else if (out == NULL) {
        rc = bad_call(sim, "vm_granularity: NULL out-pointer");
    } else {
        *out = GPSIM_PAGE_SIZE;
    }
    unlock(sim);
    return rc;
}

static int sim_va_reserve(void *ctx, size_t size, gp_devptr *out)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = begin_call(sim, GP_SIM_CALL_VA_RESERVE, "va_reserve");
    if (rc == GP_OK && out == NULL)
        rc = bad_call(sim, "va_reserve(%zu): NULL out-pointer", size);
    if (rc == GP_OK && !page_multiple(size))
        rc = bad_call(sim, "va_reserve(%zu): size is not a positive multiple of 2 MiB", size);
    if (rc == GP_OK)
        rc = gpsim_vmm_va_reserve(sim->vmm, size, out);
    unlock(sim);
    return rc;
}

static int sim_va_release(void *ctx, gp_devptr va, size_t size)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = begin_call(sim, GP_SIM_CALL_VA_RELEASE, "va_release");
    if (rc == GP_OK && !gpsim_vmm_is_reservation(sim->vmm, va, size))
        rc = bad_call(sim, "bad release: va_release(0x%" PRIxPTR ", %zu) is not a reservation of this device", va,
                      size);
    size_t mapped = rc == GP_OK ? gpsim_vmm_mappings_in(sim->vmm, va, size) : 0;
    if (mapped > 0)
        rc = bad_call(sim, "va_release(0x%" PRIxPTR ", %zu) while %zu mapping%s in it", va, size, mapped,
                      mapped == 1 ? " is still" : "s are still");
    if (rc == GP_OK)
        gpsim_vmm_va_release(sim->vmm, va, size);
    unlock(sim);
    return rc;
}

static int sim_phys_create(void *ctx, size_t size, gp_phys *out)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = begin_call(sim, GP_SIM_CALL_PHYS_CREATE, "phys_create");
    if (rc == GP_OK && out == NULL)
        rc = bad_call(sim, "phys_create(%zu): NULL out-pointer", size);
    if (rc == GP_OK && !page_multiple(size))
        rc = bad_call(sim, "phys_create(%zu): size is not a positive multiple of 2 MiB", size);
    if (rc == GP_OK)
        rc = gpsim_vmm_phys_create(sim->vmm, size, out);
    unlock(sim);
    return rc;
}

static int sim_phys_release(void *ctx, gp_phys handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = begin_call(sim, GP_SIM_CALL_PHYS_RELEASE, "phys_release");
    gpsim_phys_handle *h = rc == GP_OK ? gpsim_vmm_handle_find(sim->vmm, handle) : NULL;
    if (rc == GP_OK && h == NULL)
        rc = bad_call(sim, "bad release: phys_release(0x%" PRIx64 ") is not a live physical handle of this device",
                      handle);
    if (rc == GP_OK && h->map_count > 0)
        rc = bad_call(sim, "phys_release(0x%" PRIx64 ") while it is still mapped at %zu address%s", handle,
                      h->map_count, h->map_count == 1 ? "" : "es");
    if (rc == GP_OK)
        gpsim_vmm_phys_release(sim->vmm, h);
    unlock(sim);
    return rc;
}

/* Checks one map of `handle` (size bytes) at va, counting it (and its fault), then maps it. Sim locked. */
static int map_one(gp_sim *sim, gp_devptr va, size_t size, gp_phys handle)
{
    int rc = begin_call(sim, GP_SIM_CALL_MAP, "map");
    gpsim_phys_handle *h = rc == GP_OK ? gpsim_vmm_handle_find(sim->vmm, handle) : NULL;
    if (rc == GP_OK && h == NULL)
        rc = bad_call(sim, "map(0x%" PRIxPTR ", %zu, 0x%" PRIx64 "): not a live physical handle of this device", va,
                      size, handle);
    if (rc == GP_OK && size != h->size)
        rc = bad_call(sim, "map(0x%" PRIxPTR ", %zu, 0x%" PRIx64 "): the handle has %zu bytes "
                           "(a handle is mapped whole)",
                      va, size, handle, h->size);
    if (rc == GP_OK && (va % GPSIM_PAGE_SIZE != 0 || !gpsim_vmm_is_reserved(sim->vmm, va, size)))
        rc = bad_call(sim, "map(0x%" PRIxPTR ", %zu, 0x%" PRIx64 "): the range is not 2 MiB aligned inside "
                           "one reservation",
                      va, size, handle);
    size_t mapped = rc == GP_OK ? gpsim_vmm_mappings_in(sim->vmm, va, size) : 0;
    if (mapped > 0)
        rc = bad_call(sim, "map(0x%" PRIxPTR ", %zu, 0x%" PRIx64 "): the range overlaps %zu mapping%s", va, size,
                      handle, mapped, mapped == 1 ? "" : "s");
    if (rc == GP_OK)
        rc = gpsim_vmm_map(sim->vmm, va, h);
    return rc;
}

/* map: cuMemMap, then cuMemSetAccess on the same range (counted as a SET_ACCESS call; a fault there
 * unmaps again, as the vmm backend does). */
static int sim_map(void *ctx, gp_devptr va, size_t size, gp_phys handle)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = map_one(sim, va, size, handle);
    if (rc == GP_OK && (rc = begin_call(sim, GP_SIM_CALL_SET_ACCESS, "set_access")) != GP_OK)
        gpsim_vmm_unmap(sim->vmm, va, size);
    unlock(sim);
    return rc;
}

/* map_run: one MAP call per handle, one SET_ACCESS call for the run; all or nothing. */
static int sim_map_run(void *ctx, gp_devptr va, size_t page, const gp_phys *handles, size_t n)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = n == 0 ? bad_call(sim, "map_run(0x%" PRIxPTR ", %zu): no handles", va, page) : GP_OK;
    size_t done = 0;
    for (; rc == GP_OK && done < n; done++)
        if ((rc = map_one(sim, va + done * page, page, handles[done])) != GP_OK)
            break;
    if (rc == GP_OK)
        rc = begin_call(sim, GP_SIM_CALL_SET_ACCESS, "set_access");
    if (rc != GP_OK)
        for (size_t i = 0; i < done; i++)
            gpsim_vmm_unmap(sim->vmm, va + i * page, page);
    unlock(sim);
    return rc;
}

/* Counts an unmap (and its fault) and checks that [va, va+size) is exactly one mapping and that no
 * kernel still queued uses it: cuMemUnmap does not wait for such work (backend.h), and a kernel that
 * then touches the address faults, so an unmap under one is a bad call (the pool must have waited for
 * the streams that used the range, or synchronized the device). Nothing is unmapped then. Sim locked. */
static int unmap_check(gp_sim *sim, gp_devptr va, size_t size)
{
    int rc = begin_call(sim, GP_SIM_CALL_UNMAP, "unmap");
    if (rc == GP_OK && !gpsim_vmm_is_mapping(sim->vmm, va, size))
        rc = bad_call(sim, "bad unmap: unmap(0x%" PRIxPTR ", %zu) is not exactly one mapping of this device", va,
                      size);
    if (rc == GP_OK && gpsim_range_in_flight(sim, va, size))
        rc = bad_call(sim, "unmap under work in flight: unmap(0x%" PRIxPTR ", %zu) while a queued kernel still "
                           "uses the range (cuMemUnmap does not wait for it)",
                      va, size);
    return rc;
}

/* device_synchronize: one DEVICE_SYNC call; all queued work completes. */
static int sim_device_synchronize(void *ctx)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_DEVICE_SYNC, "device_synchronize");
    if (rc == GP_OK)
        gpsim_run_all(sim);
    unlock(sim);
    return rc;
}

/* unmap: cuMemUnmap of one mapping (no synchronize: backend.h). */
static int sim_unmap(void *ctx, gp_devptr va, size_t size)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = unmap_check(sim, va, size);
    if (rc == GP_OK)
        gpsim_vmm_unmap(sim->vmm, va, size);
    unlock(sim);
    return rc;
}

/* One UNMAP call per mapping, at vas[i] (or va + i * page when vas is NULL), stopping at a failure:
 * unmap_run and unmap_pages. Sim locked. */
static int unmap_each(gp_sim *sim, const gp_devptr *vas, gp_devptr va, size_t page, size_t n, size_t *done,
                      const char *what)
{
    *done = 0;
    int rc = n == 0 ? bad_call(sim, "%s(0x%" PRIxPTR ", %zu): no mappings", what, vas ? (gp_devptr)0 : va, page)
                    : GP_OK;
    for (; rc == GP_OK && *done < n; (*done)++) {
        gp_devptr at = vas != NULL ? vas[*done] : va + *done * page;
        if ((rc = unmap_check(sim, at, page)) != GP_OK)
            break;
        gpsim_vmm_unmap(sim->vmm, at, page);
    }
    return rc;
}

/* unmap_run: one UNMAP call per mapping, stopping at a failure. */
static int sim_unmap_run(void *ctx, gp_devptr va, size_t page, size_t n, size_t *done)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = unmap_each(sim, NULL, va, page, n, done, "unmap_run");
    unlock(sim);
    return rc;
}

/* unmap_pages: as unmap_run, for mappings anywhere. */
static int sim_unmap_pages(void *ctx, const gp_devptr *vas, size_t page, size_t n, size_t *done)
{
    gp_sim *sim = ctx;
    lock(sim);
    assert(sim->vmm != NULL);
    int rc = unmap_each(sim, vas, 0, page, n, done, "unmap_pages");
    unlock(sim);
    return rc;
}

/* A copy between the host and device memory, through the same range checks as a kernel; the pieces of
 * a virtual range are copied one mapping at a time. It waits for no queued work (backend.h: the cuda
 * backends copy on a stream of their own), so a copy of a range a queued kernel still uses is a bad
 * call: the pool must have waited for the streams that use it. Other streams' work stays queued. */
static int sim_copy(gp_sim *sim, gp_devptr dev, void *host, size_t size, bool to_device)
{
    call_hook(sim, GP_SIM_CALL_COPY);
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_COPY, to_device ? "copy_to_device" : "copy_to_host");
    if (rc == GP_OK && sim->vmm == NULL && !gpsim_memory_contains(&sim->memory, dev, size))
        rc = bad_call(sim, "copy of unallocated memory: [0x%" PRIxPTR ",+%zu)", dev, size);
    gpsim_piece *pieces = NULL;
    size_t piece_count = 0;
    if (rc == GP_OK && sim->vmm != NULL && gpsim_vmm_translate(sim->vmm, dev, size, &pieces, &piece_count) != GP_OK)
        rc = bad_call(sim, "copy of unmapped memory: [0x%" PRIxPTR ",+%zu)", dev, size);
    free(pieces);
    if (rc == GP_OK && gpsim_range_in_flight(sim, dev, size))
        rc = bad_call(sim, "copy under work in flight: %s of [0x%" PRIxPTR ",+%zu) while a queued kernel still "
                           "uses the range", to_device ? "copy_to_device" : "copy_to_host", dev, size);
    if (rc == GP_OK)
        gpsim_copy(sim->memory.host_page_size ? sim->memory.host_page_size : 4096, dev, host, size, to_device);
    unlock(sim);
    return rc;
}

static int sim_copy_to_host(void *ctx, void *host, gp_devptr src, size_t size)
{
    return sim_copy(ctx, src, host, size, false);
}

static int sim_copy_to_device(void *ctx, gp_devptr dst, const void *host, size_t size)
{
    return sim_copy(ctx, dst, (void *)host, size, true);
}

/* The sim's "pinned" host memory: plain anonymous pages. */
static int sim_host_alloc(void *ctx, size_t size, void **out)
{
    gp_sim *sim = ctx;
    lock(sim);
    int rc = begin_call(sim, GP_SIM_CALL_HOST_ALLOC, "host_alloc");
    unlock(sim);
    if (rc != GP_OK)
        return rc;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return gp_error_set(GP_ERR_OOM, "sim: host_alloc of %zu bytes: %s", size, strerror(errno));
    *out = p;
    return GP_OK;
}

static int sim_host_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    return munmap(ptr, size) == 0 ? GP_OK : gp_error_set(GP_ERR_DEVICE, "sim: host_free: %s", strerror(errno));
}

static uint64_t sim_now(void *ctx)
{
    return gp_sim_now(ctx);
}

static void *sim_instance(void *ctx)
{
    return gp_backend_sim_instance(ctx);
}

const gp_backend_ops gp_backend_sim = {
    .name = "sim",
    .caps = GP_BACKEND_SIMULATED,
    .now = sim_now,
    .instance = sim_instance,
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
    .copy_to_host = sim_copy_to_host,
    .copy_to_device = sim_copy_to_device,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
};

const gp_backend_ops gp_backend_sim_vmm = {
    .name = "sim-vmm",
    .caps = GP_BACKEND_SIMULATED | GP_BACKEND_VMM,
    .now = sim_now,
    .instance = sim_instance,
    .open = sim_vmm_open,
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
    .vm_granularity = sim_vm_granularity,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .phys_create = sim_phys_create,
    .phys_release = sim_phys_release,
    .map = sim_map,
    .device_synchronize = sim_device_synchronize,
    .unmap = sim_unmap,
    .map_run = sim_map_run,
    .unmap_run = sim_unmap_run,
    .unmap_pages = sim_unmap_pages,
    .copy_to_host = sim_copy_to_host,
    .copy_to_device = sim_copy_to_device,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
};

gp_sim *gp_backend_sim_instance(void *ctx)
{
    return ctx; /* the context is the sim itself, with either table */
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

GP_API void gp_sim_stream_destroy(gp_sim *sim, gp_stream stream)
{
    if (sim == NULL)
        return;
    lock(sim);
    gpsim_stream *s = sim->closed ? NULL : gpsim_stream_get(sim, stream);
    if (s != NULL)
        s->destroyed = true;
    unlock(sim);
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
    else if (op != GP_SIM_READ && op != GP_SIM_WRITE && op != GP_SIM_CHECK && op != GP_SIM_USE)
        rc = gp_error_set(GP_ERR_INVALID, "sim: gp_sim_launch: unknown kernel op %d", op);
    else if (len > 0 && sim->vmm == NULL && !gpsim_memory_contains(&sim->memory, start, len))
        rc = bad_call(sim, "kernel on unallocated memory: %s on stream 0x%" PRIxPTR " [0x%" PRIxPTR
                           ",+%zu) is not inside one device allocation",
                      gpsim_kernel_op_name(op), (uintptr_t)stream, start, len);
    gpsim_piece *pieces = NULL;
    size_t piece_count = 0;
    if (rc == GP_OK && len > 0 && sim->vmm != NULL) {
        rc = gpsim_vmm_translate(sim->vmm, start, len, &pieces, &piece_count);
        if (rc == GP_ERR_INVALID)
            rc = bad_call(sim, "kernel on unmapped memory: %s on stream 0x%" PRIxPTR " [0x%" PRIxPTR
                               ",+%zu) is not wholly inside mapped memory (nor inside one mem_alloc allocation)",
                          gpsim_kernel_op_name(op), (uintptr_t)stream, start, len);
    }
    gpsim_stream *s = NULL;
    if (rc == GP_OK)
        rc = live_stream(sim, stream, "kernel launch", &s);
    if (rc == GP_OK)
        rc = gpsim_launch(sim, s, start, len, op, seed, duration_ns, pieces, piece_count); /* owns pieces */
    else
        free(pieces);
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

GP_API void gp_sim_set_call_hook(gp_sim *sim, unsigned mask, void (*hook)(void *arg, unsigned kind), void *arg)
{
    if (sim == NULL)
        return;
    lock(sim);
    sim->hook_mask = hook == NULL ? 0 : mask & (GP_SIM_CALL_COPY | GP_SIM_CALL_EVENT_SYNC);
    sim->hook = hook;
    sim->hook_arg = arg;
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
