/*
 * conformance.c — one backend conformance suite for every backend the pool runs on, as a plain
 * program (no Criterion: it runs on a bare GPU machine too): `conformance BACKEND`.
 *
 *   sim, sim-vmm   built against libgpupool (the simulated GPU checks races, contents, leaks);
 *   cuda, vmm      built against the CUDA emulation (conformance_emu, CTest label cuda-emulation):
 *                  the real backend_cuda.c / backend_vmm.c over the emulated CUDA API, whose rules
 *                  must not be broken (gpemu_violations() == 0 after every case) and which leaves no
 *                  error the pool caused pending for the application (checked after every pool call);
 *   cuda, vmm      built against libgpupool with the real CUDA runtime, on a machine with a GPU
 *                  (bench/gpu/run.sh): the same cases, contents checked with cudaMemcpy; the fault
 *                  sweep and the capture cases need the emulation and say "skipped".
 *
 * Cases: allocate/free (sizes, alignment, stats), contents untouched, cross-stream frees and
 * waits (the race checker), steals under a small device, mappings (vmm: trim unmaps, regrowth,
 * pause/resume with contents), a fresh thread and a pool on another device than the thread's current
 * one, the fault sweep (every device call failing once: no leak, nothing lost, clear errors), a
 * randomized stress run, and graph capture (private pools per graph, replays, contents).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_test.h"
#include "gpupool.h"
#include "gpupool_sim.h"

#if defined(GPUPOOL_CUDA_EMULATION)
#include "cuda_emu/cuda_emu.h"
#define CONF_EMU 1
#define CONF_CUDA 1
#elif defined(GPUPOOL_WITH_CUDA)
#include <cuda_runtime_api.h>
#define CONF_EMU 0
#define CONF_CUDA 1
#else
#define CONF_EMU 0
#define CONF_CUDA 0
#endif

#define MIB ((size_t)1 << 20)
#define DEVICE_MEMORY (256 * MIB)

static const char *backend;
static bool cuda_api; /* backend cuda or vmm */
static bool vmm;      /* backend with virtual memory management */

typedef struct conf_dev {
    gp_pool *pool;
    gp_sim *sim; /* NULL on a real GPU */
} conf_dev;

/* After every pool call on the emulation: no error the pool caused may be left for the application. */
static void no_pending_error(const char *what)
{
#if CONF_CUDA
    if (cuda_api) {
        cudaError_t err = cudaPeekAtLastError();
        if (err != cudaSuccess) {
#if CONF_EMU
            char text[160];
            snprintf(text, sizeof text, "%s left %s pending", what, cudaGetErrorName(err));
            gpemu_report(GPEMU_RULE_ERROR_PENDING, text);
#endif
            CHECK(err == cudaSuccess, "%s left %s pending for the application", what, cudaGetErrorName(err));
            cudaGetLastError();
        }
    }
#else
    (void)what;
#endif
}

#define POOL(call) pool_call((call), #call)
static int pool_call(int rc, const char *what)
{
    no_pending_error(what);
    return rc;
}

static int open_dev(conf_dev *d, int device, const char *config)
{
    memset(d, 0, sizeof *d);
#if CONF_EMU
    if (cuda_api) {
        if (gpemu_init(2, DEVICE_MEMORY) != GP_OK)
            return -1;
    }
#endif
    char conf[256];
    snprintf(conf, sizeof conf, "device_memory:%zu%s%s", DEVICE_MEMORY, config[0] ? "," : "", config);
    int rc = POOL(gp_pool_create(&d->pool, device, backend, cuda_api ? (config[0] ? config : NULL) : conf));
    CHECK(rc == GP_OK, "gp_pool_create(%s): %s", backend, gp_last_error());
    if (rc != GP_OK)
        return rc;
#if CONF_EMU
    d->sim = cuda_api ? gpemu_sim(device) : gp_sim_of(d->pool);
#else
    d->sim = gp_sim_of(d->pool);
#endif
    if (d->sim != NULL)
        gp_sim_retain(d->sim);
    return GP_OK;
}

/* Destroys the pool and checks what the device saw: no leak, no race, no bad call, no rule broken. */
static void close_dev(conf_dev *d, bool expect_clean)
{
    gp_leak_report leaks = {0, 0};
    int rc = POOL(gp_pool_destroy(d->pool, &leaks));
    if (expect_clean) {
        CHECK(rc == GP_OK, "destroy: %s", gp_last_error());
        CHECK(leaks.live_blocks == 0, "%zu blocks live at destroy", leaks.live_blocks);
    }
    if (d->sim != NULL) {
        gp_sim_report r;
        gp_sim_get_report(d->sim, &r);
        CHECK(r.races == 0 && r.pattern_mismatches == 0 && r.bad_calls == 0, "sim: %llu races, %llu mismatches, "
              "%llu bad calls: %s", (unsigned long long)r.races, (unsigned long long)r.pattern_mismatches,
              (unsigned long long)r.bad_calls, gp_sim_first_violation(d->sim));
        if (!cuda_api)
            CHECK(r.leaked_bytes_at_close == 0 && r.leaked_events_at_close == 0 && r.leaked_handles_at_close == 0 &&
                  r.leaked_mappings_at_close == 0 && r.leaked_reservations_at_close == 0,
                  "device leak at close: %s", gp_sim_first_violation(d->sim));
        gp_sim_release(d->sim);
    }
#if CONF_EMU
    if (cuda_api) {
        uint64_t v = gpemu_shutdown();
        CHECK(v == 0, "%llu CUDA rule violation(s); first: %s", (unsigned long long)v, gpemu_first_violation());
    }
#endif
}

static gp_stream stream_new(conf_dev *d)
{
#if CONF_CUDA
    if (cuda_api) {
        cudaStream_t s = NULL;
        CHECK(cudaStreamCreateWithFlags(&s, 0x01 /* cudaStreamNonBlocking */) == cudaSuccess, "cudaStreamCreate");
        return s;
    }
#endif
    return gp_sim_stream_create(d->sim);
}

/* The application destroys a stream it had the pool forget (gp_stream_forget first, as gpupool.h says). */
static void stream_forget_and_destroy(conf_dev *d, gp_stream s)
{
    CHECK(POOL(gp_stream_forget(d->pool, s)) == GP_OK, "forget: %s", gp_last_error());
#if CONF_CUDA
    if (cuda_api)
        CHECK(cudaStreamDestroy((cudaStream_t)s) == cudaSuccess, "cudaStreamDestroy");
#endif
}

/* The application's ordering before it uses memory on another stream (here: a host wait). */
static void stream_sync(conf_dev *d, gp_stream s)
{
#if CONF_CUDA
    if (cuda_api) {
        CHECK(cudaStreamSynchronize((cudaStream_t)s) == cudaSuccess, "cudaStreamSynchronize");
        return;
    }
#endif
    gp_sim_stream_synchronize(d->sim, s);
}

static void sync_dev(conf_dev *d)
{
#if CONF_CUDA
    if (cuda_api) {
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
        return;
    }
#endif
    gp_sim_synchronize(d->sim);
}

#if CONF_CUDA && !CONF_EMU
static void host_pattern(unsigned char *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
}
#endif

/* A kernel on stream s: writes seed's pattern (op WRITE), checks it (CHECK) or reads (READ). On a real
 * GPU, a synchronous copy does it (a CHECK mismatch fails the case at once). */
static void kernel(conf_dev *d, gp_stream s, void *ptr, size_t len, int op, uint64_t seed, uint64_t ns)
{
#if CONF_EMU
    if (cuda_api) {
        cudaError_t err = gpemu_launch((cudaStream_t)s, ptr, len, op, seed, ns);
        CHECK(err == cudaSuccess, "kernel on %p+%zu: %s", ptr, len, cudaGetErrorName(err));
        return;
    }
#elif CONF_CUDA
    if (cuda_api) {
        unsigned char *want = malloc(len), *got = malloc(len);
        host_pattern(want, len, seed);
        cudaStreamSynchronize((cudaStream_t)s);
        if (op == GP_SIM_WRITE) {
            CHECK(cudaMemcpy(ptr, want, len, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy H2D");
        } else if (op == GP_SIM_CHECK) {
            CHECK(cudaMemcpy(got, ptr, len, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy D2H");
            CHECK(memcmp(want, got, len) == 0, "contents of %p+%zu changed", ptr, len);
        }
        free(want);
        free(got);
        (void)ns;
        return;
    }
#endif
    int rc = gp_sim_launch(d->sim, s, ptr, len, op, seed, ns);
    CHECK(rc == GP_OK, "gp_sim_launch: %s", gp_last_error());
}

static uint64_t mismatches(conf_dev *d)
{
    if (d->sim == NULL)
        return 0;
    gp_sim_report r;
    gp_sim_get_report(d->sim, &r);
    return r.pattern_mismatches + r.races;
}

/* ---- cases ------------------------------------------------------------------------------------- */

static void case_alloc_free(void)
{
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream s = stream_new(&d);
    static const size_t sizes[] = {1, 511, 512, 4096, 65536, MIB, 3 * MIB, 20 * MIB, 100 * MIB};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        CHECK(POOL(gp_alloc(d.pool, &p[i], sizes[i], s)) == GP_OK, "alloc %zu: %s", sizes[i], gp_last_error());
        CHECK(((uintptr_t)p[i] % 512) == 0, "alignment of %p", p[i]);
        if (p[i] != NULL)
            kernel(&d, s, p[i], sizes[i], GP_SIM_WRITE, i + 1, 100);
    }
    void *huge = NULL;
    CHECK(POOL(gp_alloc(d.pool, &huge, 64 * DEVICE_MEMORY, s)) == GP_ERR_INVALID && huge == NULL, "more than the device");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (p[i] != NULL)
            kernel(&d, s, p[i], sizes[i], GP_SIM_CHECK, i + 1, 100);
        CHECK(POOL(gp_free(d.pool, p[i], s)) == GP_OK, "free: %s", gp_last_error());
    }
    CHECK(POOL(gp_free(d.pool, p[0], s)) == GP_ERR_DOUBLE_FREE, "double free refused");
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    CHECK(POOL(gp_get_stats(d.pool, &st)) == GP_OK && st.allocated_bytes == 0, "allocated %llu",
          (unsigned long long)st.allocated_bytes);
    CHECK(POOL(gp_check(d.pool)) == GP_OK, "gp_check: %s", gp_last_error());
    size_t released = 0;
    CHECK(POOL(gp_trim(d.pool, 0, &released)) == GP_OK && released > 0, "trim gives memory back: %s", gp_last_error());
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "contents or races");
    close_dev(&d, true);
}

static void case_cross_stream(void)
{
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream a = stream_new(&d), b = stream_new(&d);
    for (int round = 0; round < 8; round++) {
        void *p = NULL, *q = NULL;
        CHECK(POOL(gp_alloc(d.pool, &p, 8 * MIB, a)) == GP_OK, "alloc: %s", gp_last_error());
        kernel(&d, a, p, 8 * MIB, GP_SIM_WRITE, 10 + round, 5000);
        CHECK(POOL(gp_record_stream(d.pool, p, b)) == GP_OK, "record_stream: %s", gp_last_error());
        stream_sync(&d, a); /* the application orders its own use on b */
        kernel(&d, b, p, 8 * MIB, GP_SIM_READ, 0, 100000); /* would race a reuse on a */
        CHECK(POOL(gp_free(d.pool, p, a)) == GP_OK, "free: %s", gp_last_error());
        CHECK(POOL(gp_alloc(d.pool, &q, 8 * MIB, a)) == GP_OK, "realloc: %s", gp_last_error());
        kernel(&d, a, q, 8 * MIB, GP_SIM_WRITE, 50 + round, 100);
        CHECK(POOL(gp_free(d.pool, q, b)) == GP_OK, "free on the other stream: %s", gp_last_error());
    }
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "a reuse raced a use on another stream");
    CHECK(POOL(gp_check(d.pool)) == GP_OK, "gp_check: %s", gp_last_error());
    close_dev(&d, true);
}

/* Three streams fill a small device; frees on one stream must serve allocations on another (steal or
 * wait) without racing the kernels still using the memory. */
static void case_steal_under_pressure(void)
{
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream s[3] = {stream_new(&d), stream_new(&d), stream_new(&d)};
    void *p[24] = {0};
    int got = 0;
    for (int i = 0; i < 24; i++) {
        if (POOL(gp_alloc(d.pool, &p[i], 20 * MIB, s[i % 3])) == GP_OK) {
            kernel(&d, s[i % 3], p[i], 20 * MIB, GP_SIM_WRITE, (uint64_t)i, 20000);
            got++;
        }
    }
    CHECK(got >= 6, "only %d blocks of 20 MiB on a 256 MiB device", got);
    for (int i = 0; i < 24; i++)
        if (p[i] != NULL)
            CHECK(POOL(gp_free(d.pool, p[i], s[i % 3])) == GP_OK, "free: %s", gp_last_error());
    for (int i = 0; i < 24; i++) {
        void *q = NULL;
        int rc = POOL(gp_alloc(d.pool, &q, 20 * MIB, s[(i + 1) % 3]));
        CHECK(rc == GP_OK || rc == GP_ERR_OOM, "alloc: %s", gp_last_error());
        if (q != NULL) {
            kernel(&d, s[(i + 1) % 3], q, 20 * MIB, GP_SIM_WRITE, 100 + (uint64_t)i, 100);
            CHECK(POOL(gp_free(d.pool, q, s[(i + 1) % 3])) == GP_OK, "free: %s", gp_last_error());
        }
    }
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "races or contents");
    close_dev(&d, true);
}

static void case_mappings_and_pause(void)
{
    if (!vmm) {
        printf("     (mappings: not a virtual memory backend)\n");
        return;
    }
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream s = stream_new(&d);
    CHECK(POOL(gp_tenant_create(d.pool, "m", NULL)) == GP_OK, "tenant: %s", gp_last_error());
    CHECK(POOL(gp_tenant_push(d.pool, "m")) == GP_OK, "push");
    void *p[4];
    for (int i = 0; i < 4; i++) {
        CHECK(POOL(gp_alloc(d.pool, &p[i], 6 * MIB + (size_t)i * 4096, s)) == GP_OK, "alloc: %s", gp_last_error());
        kernel(&d, s, p[i], 6 * MIB, GP_SIM_WRITE, 200 + (uint64_t)i, 1000);
    }
    /* A stream m used once, then forgot and destroyed: the pause must not record on its dead handle. */
    gp_stream once = stream_new(&d);
    void *tmp = NULL;
    CHECK(POOL(gp_alloc(d.pool, &tmp, MIB, once)) == GP_OK, "alloc: %s", gp_last_error());
    kernel(&d, once, tmp, MIB, GP_SIM_WRITE, 5, 100);
    CHECK(POOL(gp_free(d.pool, tmp, once)) == GP_OK, "free: %s", gp_last_error());
    stream_forget_and_destroy(&d, once);
    CHECK(POOL(gp_tenant_pop(d.pool)) == GP_OK, "pop");
    sync_dev(&d);
    /* Another model's long kernel stays queued through the pause: the pause waits for m's streams only
     * (a device synchronize would wait for it; an unmap or copy of m's memory under it would not). */
    gp_stream busy = stream_new(&d);
    CHECK(POOL(gp_tenant_create(d.pool, "busy", NULL)) == GP_OK, "tenant: %s", gp_last_error());
    CHECK(POOL(gp_tenant_bind_stream(d.pool, "busy", busy)) == GP_OK, "bind: %s", gp_last_error());
    void *other = NULL;
    CHECK(POOL(gp_alloc(d.pool, &other, 8 * MIB, busy)) == GP_OK, "alloc: %s", gp_last_error());
    kernel(&d, busy, other, 8 * MIB, GP_SIM_WRITE, 300, 1000000000);
    kernel(&d, s, p[0], 6 * MIB, GP_SIM_CHECK, 200, 1000); /* m's own work, queued: waited for */
    CHECK(POOL(gp_tenant_pause(d.pool, "m", GP_PAUSE_KEEP_CONTENTS)) == GP_OK, "pause: %s", gp_last_error());
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    CHECK(POOL(gp_get_stats(d.pool, &st)) == GP_OK && st.paused_bytes > 0, "paused bytes %llu",
          (unsigned long long)st.paused_bytes);
    CHECK(POOL(gp_tenant_resume(d.pool, "m")) == GP_OK, "resume: %s", gp_last_error());
    for (int i = 0; i < 4; i++)
        kernel(&d, s, p[i], 6 * MIB, GP_SIM_CHECK, 200 + (uint64_t)i, 1000);
    kernel(&d, busy, other, 8 * MIB, GP_SIM_CHECK, 300, 1000);
    for (int i = 0; i < 4; i++)
        CHECK(POOL(gp_free(d.pool, p[i], s)) == GP_OK, "free: %s", gp_last_error());
    CHECK(POOL(gp_free(d.pool, other, busy)) == GP_OK, "free: %s", gp_last_error());
    sync_dev(&d);
    size_t released = 0;
    CHECK(POOL(gp_trim(d.pool, 0, &released)) == GP_OK, "trim: %s", gp_last_error());
    CHECK(POOL(gp_get_stats(d.pool, &st)) == GP_OK && st.num_unmaps > 0 && st.reserved_bytes == 0,
          "trim unmapped everything: %llu unmaps, %llu reserved", (unsigned long long)st.num_unmaps,
          (unsigned long long)st.reserved_bytes);
    void *q = NULL;
    CHECK(POOL(gp_alloc(d.pool, &q, 30 * MIB, s)) == GP_OK, "regrow: %s", gp_last_error());
    kernel(&d, s, q, 30 * MIB, GP_SIM_WRITE, 9, 100);
    CHECK(POOL(gp_free(d.pool, q, s)) == GP_OK, "free");
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "contents after pause/resume, or races");
    close_dev(&d, true);
}

/* Stitching with loans, then a repair, then a trim (vmm): a's three holes stitched into one block for
 * its peak, one hole taken by a block of a's, the peak again (the stitched range's slots of that hole
 * unmapped and b's idle free pages mapped there: a repair, its unmaps after one device synchronize),
 * then everything freed and trimmed (the alias slots of the free pages unmapped before their homes).
 * Contents are checked throughout; close_dev checks leaks, races and the CUDA rules. */
static void case_stitch_repair_trim(void)
{
    if (!vmm) {
        printf("     (stitching: not a virtual memory backend)\n");
        return;
    }
    conf_dev d;
    if (open_dev(&d, 0, "cache_slack:0,borrow:off") != GP_OK)
        return;
    const size_t h = 8 * MIB;
    gp_stream a = stream_new(&d), b = stream_new(&d);
    void *hole[4], *pin[4], *x = NULL, *z = NULL;
    for (int i = 0; i < 4; i++) {
        gp_stream s = i < 3 ? a : b;
        CHECK(POOL(gp_alloc(d.pool, &hole[i], h, s)) == GP_OK, "hole %d: %s", i, gp_last_error());
        CHECK(POOL(gp_alloc(d.pool, &pin[i], h, s)) == GP_OK, "pin %d: %s", i, gp_last_error());
        kernel(&d, s, pin[i], h, GP_SIM_WRITE, 700 + (uint64_t)i, 100);
    }
    for (int i = 0; i < 4; i++)
        CHECK(POOL(gp_free(d.pool, hole[i], i < 3 ? a : b)) == GP_OK, "free hole %d", i);
    sync_dev(&d);
    CHECK(POOL(gp_alloc(d.pool, &x, 3 * h, a)) == GP_OK, "peak: %s", gp_last_error());
    kernel(&d, a, x, 3 * h, GP_SIM_WRITE, 710, 100);
    kernel(&d, a, x, 3 * h, GP_SIM_CHECK, 710, 100);
    CHECK(POOL(gp_free(d.pool, x, a)) == GP_OK, "free peak");
    sync_dev(&d);
    CHECK(POOL(gp_alloc(d.pool, &z, h, a)) == GP_OK, "z: %s", gp_last_error());
    kernel(&d, a, z, h, GP_SIM_WRITE, 711, 100);
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    CHECK(POOL(gp_get_stats(d.pool, &st)) == GP_OK, "stats");
    uint64_t unmaps = st.num_unmaps;
    CHECK(POOL(gp_alloc(d.pool, &x, 3 * h, a)) == GP_OK, "peak again: %s", gp_last_error());
    kernel(&d, a, x, 3 * h, GP_SIM_WRITE, 712, 100);
    kernel(&d, a, x, 3 * h, GP_SIM_CHECK, 712, 100);
    kernel(&d, a, z, h, GP_SIM_CHECK, 711, 100);
    CHECK(POOL(gp_get_stats(d.pool, &st)) == GP_OK, "stats");
    printf("     (the peak again: %llu pages unmapped)\n", (unsigned long long)(st.num_unmaps - unmaps));
    CHECK(POOL(gp_free(d.pool, x, a)) == GP_OK && POOL(gp_free(d.pool, z, a)) == GP_OK, "free");
    sync_dev(&d);
    size_t released = 0;
    CHECK(POOL(gp_trim(d.pool, 0, &released)) == GP_OK, "trim: %s", gp_last_error());
    for (int i = 0; i < 4; i++)
        kernel(&d, i < 3 ? a : b, pin[i], h, GP_SIM_CHECK, 700 + (uint64_t)i, 100);
    sync_dev(&d);
    for (int i = 0; i < 4; i++)
        CHECK(POOL(gp_free(d.pool, pin[i], i < 3 ? a : b)) == GP_OK, "free pin %d", i);
    sync_dev(&d);
    CHECK(POOL(gp_trim(d.pool, 0, &released)) == GP_OK, "trim: %s", gp_last_error());
    CHECK(POOL(gp_get_stats(d.pool, &st)) == GP_OK && st.reserved_bytes == 0, "trim gave everything back: %llu "
          "reserved", (unsigned long long)st.reserved_bytes);
    CHECK(mismatches(&d) == 0, "races or contents");
    close_dev(&d, true);
}

struct thread_arg {
    conf_dev *d;
    int device;
    gp_stream s;
    int rc;
};

static void *alloc_on_fresh_thread(void *arg)
{
    struct thread_arg *t = arg;
    void *p = NULL;
    t->rc = POOL(gp_alloc(t->d->pool, &p, 40 * MIB, t->s)); /* a slow path: device calls on this thread */
    if (t->rc == GP_OK) {
#if CONF_CUDA
        int current = 0;
        if (cuda_api) { /* the application runs its kernel on the pool's device */
            cudaGetDevice(&current);
            cudaSetDevice(t->device);
        }
#endif
        kernel(t->d, t->s, p, 40 * MIB, GP_SIM_WRITE, 77, 100);
#if CONF_CUDA
        if (cuda_api)
            cudaSetDevice(current);
#endif
        t->rc = POOL(gp_free(t->d->pool, p, t->s));
    }
    return NULL;
}

/* A thread that never called cudaSetDevice: CUDA binds no context to it, so the pool must make its
 * device current (cudaSetDevice) on the thread's first call even when cudaGetDevice already names it;
 * on the emulation the driver calls of the vmm backend fail otherwise (rule 'driver call needs a
 * current context'). */
static void case_fresh_thread(void)
{
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    struct thread_arg t = {&d, 0, stream_new(&d), -1};
    pthread_t th;
    pthread_create(&th, NULL, alloc_on_fresh_thread, &t);
    pthread_join(th, NULL);
    CHECK(t.rc == GP_OK, "alloc/free on a fresh thread: %s", gp_last_error());
    sync_dev(&d);
    close_dev(&d, true);
}

/* A pool on device 1 used from threads whose current device is 0: the device calls land on device 1
 * and the threads' current device is left as it was. */
static void case_other_device(void)
{
    if (!(CONF_EMU && cuda_api)) {
        printf("     (other device: needs two devices; the emulation has them)\n");
        return;
    }
#if CONF_EMU
    conf_dev d;
    if (open_dev(&d, 1, "") != GP_OK)
        return;
    cudaSetDevice(1);
    struct thread_arg t = {&d, 1, stream_new(&d), -1};
    cudaSetDevice(0);
    pthread_t th;
    pthread_create(&th, NULL, alloc_on_fresh_thread, &t);
    pthread_join(th, NULL);
    CHECK(t.rc == GP_OK, "alloc/free on a fresh thread: %s", gp_last_error());
    void *p = NULL;
    CHECK(POOL(gp_alloc(d.pool, &p, 3 * MIB, t.s)) == GP_OK, "alloc from device 0's thread: %s", gp_last_error());
    CHECK(POOL(gp_free(d.pool, p, t.s)) == GP_OK, "free");
    int current = -1;
    cudaGetDevice(&current);
    CHECK(current == 0, "the thread's current device changed to %d", current);
    gp_sim_report r0, r1;
    gp_sim_get_report(gpemu_sim(0), &r0);
    gp_sim_get_report(gpemu_sim(1), &r1);
    CHECK(r0.allocated_peak == 0 && r1.allocated_peak > 0, "device 0 got %llu bytes, device 1 %llu",
          (unsigned long long)r0.allocated_peak, (unsigned long long)r1.allocated_peak);
    cudaSetDevice(1);
    sync_dev(&d);
    cudaSetDevice(0);
    close_dev(&d, true);
#endif
}

/* A scenario that reaches every kind of device call the backend has. Returns allocations that stayed
 * live (their contents are checked by the caller). */
static void fault_scenario(conf_dev *d, gp_stream a, gp_stream b)
{
    void *p[6] = {0};
    static const size_t sizes[6] = {4096, 3 * MIB, 14 * MIB, 700 * 1024, 22 * MIB, 2 * MIB};
    for (int i = 0; i < 6; i++) {
        int rc = POOL(gp_alloc(d->pool, &p[i], sizes[i], i % 2 ? b : a));
        CHECK(rc == GP_OK || rc == GP_ERR_DEVICE || rc == GP_ERR_OOM, "alloc: unexpected %d: %s", rc, gp_last_error());
        CHECK(rc == GP_OK || gp_last_error()[0] != '\0', "a failure without a message");
        CHECK((rc == GP_OK) == (p[i] != NULL), "out pointer on failure");
        if (p[i] != NULL) /* the first MiB of each block: the sweep runs the scenario ~150 times */
            kernel(d, i % 2 ? b : a, p[i], sizes[i] < MIB ? sizes[i] : MIB, GP_SIM_WRITE, 300 + (uint64_t)i, 1000);
    }
    for (int i = 0; i < 6; i++)
        if (p[i] != NULL && POOL(gp_record_stream(d->pool, p[i], i % 2 ? a : b)) != GP_OK)
            CHECK(0, "record_stream: %s", gp_last_error());
    for (int i = 0; i < 6; i++) {
        if (p[i] == NULL)
            continue;
        kernel(d, i % 2 ? b : a, p[i], sizes[i] < MIB ? sizes[i] : MIB, GP_SIM_CHECK, 300 + (uint64_t)i, 100);
        int rc = GP_ERR_DEVICE;
        for (int tries = 0; tries < 3 && rc != GP_OK; tries++) /* a free that failed keeps the block live */
            rc = POOL(gp_free(d->pool, p[i], i % 2 ? b : a));
        CHECK(rc == GP_OK, "free after retries: %s", gp_last_error());
    }
    void *q = NULL;
    if (POOL(gp_alloc(d->pool, &q, 8 * MIB, b)) == GP_OK)
        CHECK(POOL(gp_free(d->pool, q, b)) == GP_OK, "free");
    size_t released = 0;
    POOL(gp_trim(d->pool, 0, &released));
    CHECK(POOL(gp_check(d->pool)) == GP_OK, "gp_check after faults: %s", gp_last_error());
}

static void case_fault_sweep(void)
{
    if (CONF_CUDA && cuda_api && !CONF_EMU) {
        printf("     (fault sweep: needs a simulated device; skipped on a real GPU)\n");
        return;
    }
    int injected_runs = 0, failures_before = test_failures;
    for (uint64_t n = 1; n < 400; n++) {
        conf_dev d;
        if (open_dev(&d, 0, "") != GP_OK)
            return;
        gp_stream a = stream_new(&d), b = stream_new(&d);
        gp_sim_fail_call(d.sim, n, GP_SIM_CALL_ALL, n % 3 == 0 ? GP_ERR_OOM : GP_ERR_DEVICE);
        fault_scenario(&d, a, b);
        uint64_t injected = gp_sim_faults_injected(d.sim);
        gp_sim_fail_call(d.sim, 0, 0, 0);
        sync_dev(&d);
        close_dev(&d, true);
        if (injected == 0)
            break;
        injected_runs++;
        if (test_failures > failures_before) {
            fprintf(stderr, "     fault sweep: first failure with fault #%llu\n", (unsigned long long)n);
            break;
        }
    }
    printf("     (fault sweep: %d runs, one injected fault each)\n", injected_runs);
    CHECK(injected_runs > 10, "the scenario reached only %d device calls", injected_runs);
}

static void case_random_stress(void)
{
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    enum { LIVE = 64, OPS = 2000 };
    gp_stream s[3] = {stream_new(&d), stream_new(&d), stream_new(&d)};
    struct {
        void *p;
        size_t size;
        int stream;
        uint64_t seed;
    } live[LIVE] = {{0}};
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int op = 0; op < OPS; op++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int slot = (int)(x % LIVE);
        int st = (int)((x >> 8) % 3);
        if (live[slot].p == NULL) {
            size_t size = (x >> 16) % 4 == 0 ? ((x >> 20) % 10 + 1) * MIB : ((x >> 20) % 65536) + 1;
            int rc = POOL(gp_alloc(d.pool, &live[slot].p, size, s[st]));
            CHECK(rc == GP_OK || rc == GP_ERR_OOM, "alloc: %s", gp_last_error());
            if (rc == GP_OK) {
                live[slot].size = size;
                live[slot].stream = st;
                live[slot].seed = (uint64_t)op + 1;
                kernel(&d, s[st], live[slot].p, size, GP_SIM_WRITE, live[slot].seed, (x >> 32) % 5000);
            }
        } else {
            int owner = live[slot].stream;
            kernel(&d, s[owner], live[slot].p, live[slot].size, GP_SIM_CHECK, live[slot].seed, 50);
            if (st != owner) { /* used on another stream, freed there */
                CHECK(POOL(gp_record_stream(d.pool, live[slot].p, s[st])) == GP_OK, "record_stream");
                stream_sync(&d, s[owner]);
                kernel(&d, s[st], live[slot].p, live[slot].size, GP_SIM_READ, 0, (x >> 40) % 3000);
            }
            CHECK(POOL(gp_free(d.pool, live[slot].p, s[owner])) == GP_OK, "free: %s", gp_last_error());
            live[slot].p = NULL;
        }
        if (op % 500 == 499) {
            size_t released = 0;
            CHECK(POOL(gp_trim(d.pool, 64 * MIB, &released)) == GP_OK, "trim: %s", gp_last_error());
            CHECK(POOL(gp_check(d.pool)) == GP_OK, "gp_check: %s", gp_last_error());
        }
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].p != NULL)
            CHECK(POOL(gp_free(d.pool, live[i].p, s[live[i].stream])) == GP_OK, "free");
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "races or contents in the stress run");
    close_dev(&d, true);
}

static void stream_destroy(gp_stream s)
{
#if CONF_CUDA
    if (cuda_api)
        CHECK(cudaStreamDestroy((cudaStream_t)s) == cudaSuccess, "cudaStreamDestroy");
#else
    (void)s;
#endif
}

/* gp_stream_forget before the application destroys a stream: afterwards the pool never records on
 * the dead handle (on the emulation an event record there breaks rule 'no use after destroy'), and
 * memory the stream used is reusable at once without racing its finished work. */
static void case_stream_forget(void)
{
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream a = stream_new(&d), b = stream_new(&d);
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK(POOL(gp_alloc(d.pool, &p, 8 * MIB, a)) == GP_OK, "alloc: %s", gp_last_error());
    kernel(&d, a, p, 8 * MIB, GP_SIM_WRITE, 61, 100);
    stream_sync(&d, a);
    CHECK(POOL(gp_record_stream(d.pool, p, b)) == GP_OK, "record_stream");
    kernel(&d, b, p, 8 * MIB, GP_SIM_READ, 0, 50000);
    CHECK(POOL(gp_alloc(d.pool, &q, 3 * MIB, b)) == GP_OK, "alloc on b: %s", gp_last_error());
    kernel(&d, b, q, 3 * MIB, GP_SIM_WRITE, 62, 50000);
    CHECK(POOL(gp_free(d.pool, q, b)) == GP_OK, "free on b");
    CHECK(POOL(gp_stream_forget(d.pool, b)) == GP_OK, "forget: %s", gp_last_error());
    stream_destroy(b);
    CHECK(POOL(gp_free(d.pool, p, a)) == GP_OK, "free of a block used on the forgotten stream: %s", gp_last_error());
    CHECK(POOL(gp_alloc(d.pool, &r, 8 * MIB, a)) == GP_OK, "realloc: %s", gp_last_error());
    kernel(&d, a, r, 8 * MIB, GP_SIM_WRITE, 63, 100); /* races b's read unless forget waited for it */
    CHECK(POOL(gp_free(d.pool, r, a)) == GP_OK, "free");
    CHECK(POOL(gp_stream_forget(d.pool, (gp_stream)0x7777)) == GP_OK, "a stream never seen: nothing to do");
    size_t released = 0;
    CHECK(POOL(gp_trim(d.pool, 0, &released)) == GP_OK, "trim: %s", gp_last_error());
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "races or contents");
    close_dev(&d, true);
}

#include "conformance_capture.h"

/* ledger:on names the GPU's ledger by the UUID the runtime reports for it (cudaGetDeviceProperties,
 * nvidia-smi's spelling), so that processes that see one GPU under different indices share it and
 * processes on different GPUs do not. On the real backends and the emulation; the ledger is removed
 * afterwards only when this test made it. */
static void case_ledger_by_uuid(void)
{
#if CONF_CUDA
    if (!cuda_api) {
        printf("     (ledger by UUID: a simulated GPU has no UUID)\n");
        return;
    }
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK) /* the device (or its emulation) up, and no ledger yet */
        return;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess, "cudaGetDeviceProperties");
    close_dev(&d, true);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    char name[96], path[128];
    snprintf(name, sizeof name, "/gpupool.GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    bool existed = access(path, F_OK) == 0;
    if (open_dev(&d, 0, "ledger:on") != GP_OK)
        return;
    CHECK(access(path, F_OK) == 0, "ledger:on made no %s", path);
    close_dev(&d, true);
    if (!existed)
        CHECK(shm_unlink(name) == 0, "removing %s", name);
#endif
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s sim|sim-vmm|cuda|vmm\n", argv[0]);
        return 2;
    }
    backend = argv[1];
    cuda_api = strcmp(backend, "cuda") == 0 || strcmp(backend, "vmm") == 0;
    vmm = strcmp(backend, "vmm") == 0 || strcmp(backend, "sim-vmm") == 0;
    if (cuda_api && !CONF_CUDA) {
        printf("conformance %s: this build has no CUDA (configure with the CUDA Toolkit, or run conformance_emu)\n", backend);
        return 77;
    }
    printf("conformance on backend %s%s\n", backend, CONF_EMU && cuda_api ? " (CUDA emulation)" : "");
    RUN(case_alloc_free);
    RUN(case_cross_stream);
    RUN(case_steal_under_pressure);
    RUN(case_mappings_and_pause);
    RUN(case_stitch_repair_trim);
    RUN(case_fresh_thread);
    RUN(case_other_device);
    RUN(case_stream_forget);
    RUN(case_fault_sweep);
    RUN(case_random_stress);
    RUN(case_capture);
    RUN(case_ledger_by_uuid);
    printf("%s: %d failure(s)\n", test_failures ? "FAILED" : "passed", test_failures);
    return test_failures != 0;
}
