/*
 * torch_glue.c — the entry points PyTorch's CUDAPluggableAllocator loads from libgpupool by name, and
 * the few helpers the Python package (python/gpupool) needs around them.
 *
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "gp_torch_malloc", "gp_torch_free")
 *       void *alloc(ssize_t size, int device, cudaStream_t stream)
 *       void  free(void *ptr, size_t size, int device, cudaStream_t stream)
 *   and, through the allocator object's setters (each takes the function's address as an integer):
 *       set_record_stream_fn     void (void *ptr, cudaStream_t stream)   gp_torch_record_stream
 *       set_reset_fn             void (void)          (empty_cache)       gp_torch_empty_cache
 *                                (what it gives back: the pool's empty_cache key, see below)
 *       set_memory_fraction_fn   void (double fraction, int device)      gp_torch_set_memory_fraction
 *       set_init_fn              void (int device_count)                 gp_torch_init
 *       set_begin_allocate_to_pool   void (int, MempoolId_t, filter)    gp_torch_begin_allocate_to_pool
 *       set_end_allocate_to_pool_fn  void (int, MempoolId_t)            gp_torch_end_allocate_to_pool
 *       set_release_pool             void (int, MempoolId_t)            gp_torch_release_pool
 *
 * One pool per device, created on first use with gp_pool_create(device, NULL, NULL): the backend and
 * every other key come from GPUPOOL_CONF (backend default "cuda"). Pools live until the process ends
 * (PyTorch frees tensors during interpreter shutdown, after any atexit hook could have run), except
 * that gp_torch_release_all() destroys them for tests.
 *
 * Fast path: gp_torch_malloc and gp_torch_free read the device's pool with one acquire load and call
 * gp_alloc / gp_free; no lock beyond the pool's own. The glue's mutex is taken only to create a pool,
 * to record a failure's message, and by the slow hooks.
 *
 * Failures. The hooks return nothing (or NULL), so a failure leaves its message twice: in the calling
 * thread's buffer (gp_last_error) and in a process-wide copy readable from any thread with
 * gp_torch_last_failure() (PyTorch's backward pass allocates on its own threads, so the thread that
 * sees the error in Python is often not the one that allocated). Failed frees and hooks are also
 * printed to stderr, since PyTorch has no way to hear about them.
 *
 * cudaStream_t is taken as void * (a gp_stream): this file includes no CUDA header.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "api/api.h"
#include "base/error.h"
#include "gpupool.h"

/* Exported for dlsym/ctypes; declared here since no C caller includes them. */
GP_API void *gp_torch_malloc(ssize_t size, int device, void *stream);
GP_API void gp_torch_free(void *ptr, ssize_t size, int device, void *stream);
GP_API void gp_torch_record_stream(void *ptr, void *stream);
GP_API void gp_torch_empty_cache(void);
GP_API void gp_torch_set_memory_fraction(double fraction, int device);
GP_API void gp_torch_init(int device_count);
GP_API void gp_torch_begin_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second, const void *filter);
GP_API void gp_torch_end_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second);
GP_API void gp_torch_release_pool(int device, uint64_t id_first, uint64_t id_second);
GP_API gp_pool *gp_torch_pool(int device);
GP_API int gp_torch_get_pool(int device, gp_pool **out);
GP_API gp_pool *gp_torch_pool_peek(int device);
GP_API int gp_torch_device_limit(void);
GP_API uint64_t gp_torch_last_failure(char *buf, size_t len);
GP_API uint64_t gp_torch_free_failures(void);
GP_API int gp_torch_release_all(gp_leak_report *report);

#define GP_TORCH_MAX_DEVICES 64
#define GP_TORCH_MESSAGE_MAX 1024

static _Atomic(gp_pool *) g_pools[GP_TORCH_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* creation, the failure copy, release_all */
static char g_failure[GP_TORCH_MESSAGE_MAX];               /* g_lock */
static atomic_uint_fast64_t g_failures;                     /* failed mallocs, frees and hooks */
static atomic_uint_fast64_t g_free_failures;
static atomic_int g_device_count = -1; /* from init(); -1 = not told */

/* Copies the thread's current message into the process-wide one (slow paths only). */
static void remember_failure(int print)
{
    const char *msg = gp_last_error();
    pthread_mutex_lock(&g_lock);
    snprintf(g_failure, sizeof g_failure, "%s", msg);
    pthread_mutex_unlock(&g_lock);
    atomic_fetch_add_explicit(&g_failures, 1, memory_order_relaxed);
    if (print)
        fprintf(stderr, "gpupool: %s\n", msg);
}

static int check_device(int device, const char *fn)
{
    if (device < 0 || device >= GP_TORCH_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "%s: device %d out of range (0..%d)", fn, device,
                            GP_TORCH_MAX_DEVICES - 1);
    int count = atomic_load_explicit(&g_device_count, memory_order_relaxed);
    if (count >= 0 && device >= count)
        return gp_error_set(GP_ERR_INVALID, "%s: device %d, but PyTorch reported %d device(s)", fn, device,
                            count);
    return GP_OK;
}

/* The pool of `device`, created when absent: GP_OK, or the error with the thread's message set. */
static int pool_slow(int device, const char *fn, gp_pool **out)
{
    int rc = check_device(device, fn);
    if (rc != GP_OK)
        return rc;
    pthread_mutex_lock(&g_lock);
    gp_pool *pool = atomic_load_explicit(&g_pools[device], memory_order_acquire);
    if (pool == NULL) {
        rc = gp_pool_create(&pool, device, NULL, NULL);
        if (rc != GP_OK) {
            /* keep gp_pool_create's own message, naming the caller in front */
            char why[GP_TORCH_MESSAGE_MAX];
            snprintf(why, sizeof why, "%s", gp_last_error());
            gp_error_set(rc, "%s: cannot create the pool of device %d (GPUPOOL_CONF): %s", fn, device, why);
        } else {
            atomic_store_explicit(&g_pools[device], pool, memory_order_release);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == GP_OK)
        *out = pool;
    return rc;
}

static inline gp_pool *pool_of(int device, const char *fn)
{
    if ((unsigned)device < GP_TORCH_MAX_DEVICES) {
        gp_pool *pool = atomic_load_explicit(&g_pools[device], memory_order_acquire);
        if (pool != NULL)
            return pool;
    }
    gp_pool *pool = NULL;
    return pool_slow(device, fn, &pool) == GP_OK ? pool : NULL;
}

void *gp_torch_malloc(ssize_t size, int device, void *stream)
{
    if (size < 0) {
        gp_error_set(GP_ERR_INVALID, "gp_torch_malloc: negative size %zd", size);
        remember_failure(0);
        return NULL;
    }
    gp_pool *pool = pool_of(device, "gp_torch_malloc");
    void *ptr = NULL;
    if (pool == NULL || gp_alloc(pool, &ptr, (size_t)size, stream) != GP_OK) {
        remember_failure(0);
        return NULL;
    }
    return ptr; /* NULL for size 0 (gp_alloc's GP_OK): PyTorch accepts that for empty tensors */
}

void gp_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size;
    if (ptr == NULL)
        return;
    gp_pool *pool = pool_of(device, "gp_torch_free");
    if (pool == NULL || gp_free(pool, ptr, stream) != GP_OK) {
        atomic_fetch_add_explicit(&g_free_failures, 1, memory_order_relaxed);
        remember_failure(1);
    }
}

/* PyTorch passes no device: the pool that owns ptr is the one that does not answer NOT_OWNED. */
void gp_torch_record_stream(void *ptr, void *stream)
{
    if (ptr == NULL)
        return;
    int rc = GP_ERR_NOT_OWNED;
    for (int d = 0; d < GP_TORCH_MAX_DEVICES && rc == GP_ERR_NOT_OWNED; d++) {
        gp_pool *pool = atomic_load_explicit(&g_pools[d], memory_order_acquire);
        if (pool != NULL)
            rc = gp_record_stream(pool, ptr, stream);
    }
    if (rc == GP_ERR_NOT_OWNED)
        gp_error_set(rc, "gp_torch_record_stream: %p was not allocated by gpupool on any device", ptr);
    if (rc != GP_OK)
        remember_failure(1);
}

/*
 * torch.cuda.empty_cache(), per the pool's empty_cache key: "working-set" (the default) gives back
 * only what the pool did not use during the last calls' intervals (gp_release_unused: a loop that
 * calls it every step keeps its working set and makes no device calls), "trim" every cached byte
 * (PyTorch's own behaviour: the next step asks the device again), "off" nothing.
 */
void gp_torch_empty_cache(void)
{
    for (int d = 0; d < GP_TORCH_MAX_DEVICES; d++) {
        gp_pool *pool = atomic_load_explicit(&g_pools[d], memory_order_acquire);
        gp_pool_state *p;
        if (pool == NULL || gp_pool_enter(pool, "gp_torch_empty_cache", &p) != GP_OK)
            continue;
        int rc = GP_OK;
        if (strcmp(p->cfg.empty_cache, "trim") == 0)
            rc = gp_trim(pool, 0, NULL);
        else if (strcmp(p->cfg.empty_cache, "working-set") == 0)
            rc = gp_release_unused(pool, NULL);
        if (rc != GP_OK)
            remember_failure(1);
    }
}

/*
 * torch.cuda.set_per_process_memory_fraction(fraction, device): caps what the pool may hold at
 * fraction x the device's memory. Until the public API has a pool-wide cap, the cap is the max of the
 * tenant "default" (every allocation made outside gpupool.torch.model() and unbound streams), so
 * tenants created with their own max are not bound by it. fraction >= 1 removes the cap.
 */
void gp_torch_set_memory_fraction(double fraction, int device)
{
    gp_pool *pool = pool_of(device, "gp_torch_set_memory_fraction");
    if (pool == NULL) {
        remember_failure(1);
        return;
    }
    if (!(fraction >= 0.0 && fraction <= 1.0)) { /* also refuses NaN */
        gp_error_set(GP_ERR_INVALID, "gp_torch_set_memory_fraction: fraction %g is not in [0, 1]", fraction);
        remember_failure(1);
        return;
    }
    size_t device_total = 0;
    if (gp_pool_device_total(pool, "gp_torch_set_memory_fraction", &device_total) != GP_OK) {
        remember_failure(1);
        return;
    }
    gp_tenant_stats cur;
    memset(&cur, 0, sizeof cur);
    cur.size = sizeof cur;
    cur.version = GP_TENANT_STATS_VERSION;
    if (gp_tenant_get_stats(pool, "default", &cur) != GP_OK) {
        remember_failure(1);
        return;
    }
    size_t cap = 0;
    if (fraction < 1.0) {
        cap = (size_t)(fraction * (double)device_total);
        if (cap == 0)
            cap = 1; /* fraction 0: nothing may be held (0 would mean "no limit") */
    }
    gp_tenant_limits limits = {.max = cap, .high = (size_t)cur.high, .min = (size_t)cur.min};
    if (cap != 0 && limits.high > cap)
        limits.high = 0;
    if (cap != 0 && limits.min > cap)
        limits.min = cap;
    if (gp_tenant_set_limits(pool, "default", &limits) != GP_OK)
        remember_failure(1);
}

/* Called by PyTorch when it initialises CUDA, with the number of devices. Pools stay lazy: creating
 * them here would create a context on every device. */
void gp_torch_init(int device_count)
{
    atomic_store_explicit(&g_device_count, device_count, memory_order_relaxed);
}

/*
 * CUDA graph capture (torch.cuda.graph and everything built on it): PyTorch calls begin before a
 * capture, end after it and release when the graphs sharing a pool are gone; they map to
 * gp_graph_pool_begin / end / release (pool/api/capture.c). PyTorch's signatures are
 *     void(int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter), void(int, MempoolId_t)
 * with MempoolId_t a std::pair<unsigned long long, unsigned long long>: trivially copyable, so the
 * x86-64 and AArch64 C++ ABIs pass it as two integer registers, as the two uint64_t here; the
 * std::function (not trivially copyable) is passed as a pointer, which C cannot call: gpupool routes
 * every capturing stream of the device to the open graph pool instead of asking the filter.
 */
static uint64_t graph_pool_id(uint64_t first, uint64_t second)
{
    return first * 0x9E3779B97F4A7C15ull ^ second; /* distinct pairs give distinct ids in practice */
}

void gp_torch_begin_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second, const void *filter)
{
    (void)filter;
    gp_pool *pool = pool_of(device, "gp_torch_begin_allocate_to_pool");
    if (pool == NULL || gp_graph_pool_begin(pool, graph_pool_id(id_first, id_second)) != GP_OK)
        remember_failure(1);
}

void gp_torch_end_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second)
{
    gp_pool *pool = pool_of(device, "gp_torch_end_allocate_to_pool");
    if (pool == NULL || gp_graph_pool_end(pool, graph_pool_id(id_first, id_second)) != GP_OK)
        remember_failure(1);
}

void gp_torch_release_pool(int device, uint64_t id_first, uint64_t id_second)
{
    gp_pool *pool = pool_of(device, "gp_torch_release_pool");
    if (pool == NULL || gp_graph_pool_release(pool, graph_pool_id(id_first, id_second)) != GP_OK)
        remember_failure(1);
}

gp_pool *gp_torch_pool(int device)
{
    return pool_of(device, "gp_torch_pool");
}

/* As gp_torch_pool, returning the error code (for callers that map codes to exceptions). */
int gp_torch_get_pool(int device, gp_pool **out)
{
    if (out == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_torch_get_pool: out is NULL");
    *out = NULL;
    return pool_slow(device, "gp_torch_get_pool", out);
}

gp_pool *gp_torch_pool_peek(int device)
{
    if ((unsigned)device >= GP_TORCH_MAX_DEVICES)
        return NULL;
    return atomic_load_explicit(&g_pools[device], memory_order_acquire);
}

int gp_torch_device_limit(void)
{
    return GP_TORCH_MAX_DEVICES;
}

/* Copies the message of the last failed call into buf (NUL-terminated when len > 0) and returns how
 * many calls have failed so far in this process (0: buf gets ""). */
uint64_t gp_torch_last_failure(char *buf, size_t len)
{
    pthread_mutex_lock(&g_lock);
    uint64_t n = atomic_load_explicit(&g_failures, memory_order_relaxed);
    if (buf != NULL && len > 0)
        snprintf(buf, len, "%s", g_failure);
    pthread_mutex_unlock(&g_lock);
    return n;
}

uint64_t gp_torch_free_failures(void)
{
    return atomic_load_explicit(&g_free_failures, memory_order_relaxed);
}

/*
 * Destroys every pool (for tests, and programs that drive these entry points without PyTorch): the
 * next call creates fresh pools, reading GPUPOOL_CONF again. *report (optional) sums the leaks. The
 * caller makes sure that no other thread uses the pools meanwhile and that nothing frees their
 * pointers later. Also clears the failure counters and message.
 */
int gp_torch_release_all(gp_leak_report *report)
{
    gp_leak_report total = {0, 0};
    int rc = GP_OK;
    pthread_mutex_lock(&g_lock);
    for (int d = 0; d < GP_TORCH_MAX_DEVICES; d++) {
        gp_pool *pool = atomic_exchange_explicit(&g_pools[d], NULL, memory_order_acq_rel);
        if (pool == NULL)
            continue;
        gp_leak_report leaks = {0, 0};
        int drc = gp_pool_destroy(pool, &leaks);
        if (drc != GP_OK && rc == GP_OK)
            rc = drc;
        total.live_blocks += leaks.live_blocks;
        total.live_bytes += leaks.live_bytes;
    }
    g_failure[0] = '\0';
    atomic_store_explicit(&g_failures, 0, memory_order_relaxed);
    atomic_store_explicit(&g_free_failures, 0, memory_order_relaxed);
    atomic_store_explicit(&g_device_count, -1, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
    if (report != NULL)
        *report = total;
    return rc;
}
