/*
 * capture.c — CUDA graph capture: private memory pools per graph, and what the pool refuses.
 *
 * While a stream captures (torch.cuda.graph, torch.compile mode="reduce-overhead", vLLM and SGLang all
 * capture), the calls of the pool's ordinary paths are illegal in the default global capture mode
 * (cudaEventQuery, cudaMalloc, cudaFree, synchronisation: cuda_runtime_api.h,
 * cudaThreadExchangeStreamCaptureMode) and invalidate the capture; events recorded on the capturing
 * stream become graph nodes that may never be queried; and memory freed during the capture and handed
 * out again after it would be overwritten by every replay of the graph.
 *
 * The rules here, modelled on PyTorch's caching allocator and its CUDAPluggableAllocator hooks
 * (begin/end-allocate-to-pool, release-pool):
 *   - gp_graph_pool_begin(pool, id) opens a window: until gp_graph_pool_end, every allocation on a
 *     stream that captures (cudaStreamIsCapturing, one host call per gp_alloc/gp_free on the cuda and
 *     vmm backends; the sims never capture) comes from graph pool `id`, a gp_pool of its own over the
 *     same backend and device, created on the first begin of that id and reused by later captures into
 *     the same id (graphs that share a pool, as torch.cuda.graph(pool=...) does). One window at a time
 *     per pool.
 *   - A graph pool's memory is never handed out outside its graph: only allocations routed through a
 *     window reach it. Frees inside the window go straight back to its free lists, without events:
 *     inside one capture the graph orders its own work (the streams of a capture are joined into it),
 *     and record_stream is then a no-op. Blocks freed after the capture stay in the graph pool, for
 *     later captures into the same id.
 *   - A free on a capturing stream of a block of the pool itself (allocated before the capture) is
 *     deferred to the window's end: the graph may use that memory in every replay.
 *   - gp_graph_pool_release(pool, id): the graphs using pool `id` are gone; it is destroyed as soon as
 *     its last block is freed (at once when none is live).
 *   - While any window of the process is open, no pool queries events or fences, gives memory back
 *     (cudaFree / cuMemUnmap synchronise the device) or stitches pages; growth still works: the
 *     backends allocate in relaxed capture mode. A capturing stream outside any window is refused
 *     (GP_ERR_INVALID, a message saying why) before any device call, so the capture stays valid.
 *   - A graph pool's memory counts against the budget of the tenant that captures into it (Budgets, at
 *     charge_graph_pool); gp_stats reports graph pools apart (graph_*), gp_get_breakdown with
 *     the pool's own, as PyTorch's memory_stats count its graphs' pools.
 * What it does not do: concurrent captures into two graph pools of one pool (the second begin is
 * refused), and PyTorch's per-capture stream filter (a C++ std::function C cannot call): every
 * capturing stream of the device is routed to the open window. (A graph pool attaches to its
 * parent's ledger, where its memory is charged under its model's name: provider/pool_ledger.c; it
 * pauses and resumes with its model: api/pause.c.)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "provider/capture_window.h"

struct gp_graph_pool {
    uint64_t id;
    gp_pool *pool;
    bool released;
};

struct gp_capture_pools {
    pthread_mutex_t lock;
    struct gp_graph_pool *items;
    size_t count, capacity;
    gp_pool *window;         /* the graph pool of the open window, NULL when none */
    uint64_t window_id;
    struct deferred { void *ptr; gp_stream stream; } *deferred; /* frees deferred to the window's end */
    size_t deferred_count, deferred_capacity;
};

static int capturing(gp_pool_state *p, gp_stream stream, bool *out)
{
    *out = false;
    if (p->ops->stream_capturing == NULL)
        return GP_OK;
    int c = 0;
    int rc = p->ops->stream_capturing(p->ctx, stream, &c);
    *out = c != 0;
    return rc;
}

/*
 * Budgets. A graph pool's memory is its capturing model's: graph pool g charges what it holds to the
 * tenant of the first allocation routed to it (the calling thread's current tenant of the parent, else
 * the capturing stream's binding: gp_tenant_resolve), as that tenant's graph_held, which its max, high
 * and min count together with what it holds in the parent (ds/tenant.h); its growth is admitted as
 * that tenant's (provider.c). Graphs that share a pool share the first one's tenant. Called with the
 * capture lock held, before the graph pool serves the allocation, so that the charge is set before
 * anything reads it.
 */
static void charge_graph_pool(gp_pool_state *p, gp_pool *graph, gp_stream stream)
{
    gp_tenant *own = gp_graph_pool_tenant(graph);
    if (own->charge_to == NULL)
        own->charge_to = p->tenants.tenants[gp_tenant_resolve(p, stream)];
}

/* gp_capture_route past its inline test (api.h): the backend can capture and this is no graph pool. */
int gp_capture_route_query(gp_pool_state *p, gp_stream stream, const char *fn, gp_pool **route)
{
    *route = NULL;
    bool cap = false;
    int rc = capturing(p, stream, &cap);
    if (rc != GP_OK || !cap)
        return rc;
    struct gp_capture_pools *c = p->capture;
    if (c != NULL) {
        pthread_mutex_lock(&c->lock);
        *route = c->window;
        if (*route != NULL)
            charge_graph_pool(p, *route, stream);
        pthread_mutex_unlock(&c->lock);
    }
    if (*route != NULL)
        return GP_OK;
    return gp_error_set(GP_ERR_INVALID,
                        "%s: stream %p is capturing a CUDA graph but no graph pool is open "
                        "(gp_graph_pool_begin; under PyTorch, gpupool.torch.install() sets the hooks that "
                        "do it): refused, and nothing was called on the device, so the capture stays valid",
                        fn, stream);
}

static struct gp_capture_pools *capture_state(gp_pool_state *p)
{
    gp_pool_lock(p);
    if (p->capture == NULL) {
        struct gp_capture_pools *c = calloc(1, sizeof *c);
        if (c != NULL) {
            pthread_mutex_init(&c->lock, NULL);
            p->capture = c;
        }
    }
    gp_pool_unlock(p);
    return p->capture;
}

static struct gp_graph_pool *find(struct gp_capture_pools *c, uint64_t id)
{
    for (size_t i = 0; i < c->count; i++)
        if (c->items[i].id == id)
            return &c->items[i];
    return NULL;
}

static int new_graph_pool(gp_pool_state *p, struct gp_capture_pools *c, uint64_t id, struct gp_graph_pool **out)
{
    if (c->count == c->capacity) {
        size_t cap = c->capacity ? c->capacity * 2 : 4;
        struct gp_graph_pool *items = realloc(c->items, cap * sizeof *items);
        if (items == NULL)
            return gp_error_set(GP_ERR_OOM, "gp_graph_pool_begin: out of host memory");
        c->items = items;
        c->capacity = cap;
    }
    gp_pool *child = NULL;
    /* the parent's ledger, whatever named it (GPUPOOL_CONF or the parent's configuration string): the
     * graph pool's memory is on the same GPU, charged to its model (provider/pool_ledger.c) */
    char ledger[sizeof p->cfg.ledger + sizeof "ledger:"];
    snprintf(ledger, sizeof ledger, "ledger:%s", p->cfg.ledger);
    int rc = gp_pool_create(&child, p->device, p->cfg.backend, ledger);
    if (rc != GP_OK) {
        gp_error_append(" (creating the private pool of graph %llu)", (unsigned long long)id);
        return rc;
    }
    gp_pool_state *cp = child->state;
    char log_path[sizeof cp->cfg.log_path];
    memcpy(log_path, cp->cfg.log_path, sizeof log_path);
    cp->cfg = p->cfg;                 /* the parent's sizes and policies ... */
    memcpy(cp->cfg.log_path, log_path, sizeof log_path);
    cp->cfg.defrag = false;           /* ... but no stitching or giving back inside a capture */
    cp->cfg.cache_slack = -1;
    cp->maintains = false;
    cp->graph_parent = p;
    cp->routes_captures = false;      /* a graph pool serves what its parent routed to it */
    c->items[c->count] = (struct gp_graph_pool){id, child, false};
    *out = &c->items[c->count++];
    return GP_OK;
}

GP_API int gp_graph_pool_begin(gp_pool *pool, uint64_t id)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_graph_pool_begin", &p);
    if (rc != GP_OK)
        return rc;
    if (p->graph_parent != NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_graph_pool_begin: the pool is itself a graph's private pool");
    struct gp_capture_pools *c = capture_state(p);
    if (c == NULL)
        return gp_error_set(GP_ERR_OOM, "gp_graph_pool_begin: out of host memory");
    pthread_mutex_lock(&c->lock);
    if (c->window != NULL) {
        rc = gp_error_set(GP_ERR_INVALID,
                          "gp_graph_pool_begin(%llu): graph pool %llu is open (gpupool serves one capture at a "
                          "time per pool): end it first",
                          (unsigned long long)id, (unsigned long long)c->window_id);
    } else {
        struct gp_graph_pool *g = find(c, id);
        if (g != NULL && g->released)
            rc = gp_error_set(GP_ERR_INVALID, "gp_graph_pool_begin(%llu): that graph pool was released",
                              (unsigned long long)id);
        else if (g == NULL)
            rc = new_graph_pool(p, c, id, &g);
        if (rc == GP_OK) {
            c->window = g->pool;
            c->window_id = id;
            atomic_store(&g->pool->state->graph_window, true);
            gp_capture_window_opened();
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

GP_API int gp_graph_pool_end(gp_pool *pool, uint64_t id)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_graph_pool_end", &p);
    if (rc != GP_OK)
        return rc;
    struct gp_capture_pools *c = p->capture;
    if (c == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_graph_pool_end(%llu): no graph pool is open", (unsigned long long)id);
    pthread_mutex_lock(&c->lock);
    if (c->window == NULL || c->window_id != id) {
        rc = gp_error_set(GP_ERR_INVALID, "gp_graph_pool_end(%llu): that graph pool is not the open one",
                          (unsigned long long)id);
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    atomic_store(&c->window->state->graph_window, false);
    c->window = NULL;
    gp_capture_window_closed();
    struct deferred *d = c->deferred;
    size_t n = c->deferred_count;
    c->deferred = NULL;
    c->deferred_count = c->deferred_capacity = 0;
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) { /* the pool's own blocks freed during the capture */
        int frc = gp_free(pool, d[i].ptr, d[i].stream);
        if (frc != GP_OK && rc == GP_OK)
            rc = frc;
    }
    free(d);
    return rc;
}

static void destroy_graph_pool(struct gp_capture_pools *c, size_t index, gp_leak_report *leaks)
{
    gp_leak_report r = {0, 0};
    gp_pool_destroy(c->items[index].pool, &r);
    if (leaks != NULL) {
        leaks->live_blocks += r.live_blocks;
        leaks->live_bytes += r.live_bytes;
    }
    c->items[index] = c->items[--c->count];
}

static bool graph_pool_empty(gp_pool *g)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    return gp_get_stats(g, &s) == GP_OK && s.active_blocks == 0;
}

GP_API int gp_graph_pool_release(gp_pool *pool, uint64_t id)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_graph_pool_release", &p);
    if (rc != GP_OK)
        return rc;
    struct gp_capture_pools *c = p->capture;
    if (c == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_graph_pool_release(%llu): no such graph pool", (unsigned long long)id);
    pthread_mutex_lock(&c->lock);
    struct gp_graph_pool *g = find(c, id);
    if (g == NULL || g->released) {
        rc = gp_error_set(GP_ERR_INVALID, "gp_graph_pool_release(%llu): no such graph pool%s", (unsigned long long)id,
                          g != NULL ? " (released already)" : "");
    } else if (c->window == g->pool) {
        rc = gp_error_set(GP_ERR_INVALID, "gp_graph_pool_release(%llu): its capture is still open", (unsigned long long)id);
    } else {
        g->released = true;
        if (graph_pool_empty(g->pool))
            destroy_graph_pool(c, (size_t)(g - c->items), NULL);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

gp_pool *gp_capture_owner(gp_pool_state *p, void *ptr)
{
    struct gp_capture_pools *c = p->capture;
    gp_pool *owner = NULL;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->count && owner == NULL; i++) {
        gp_pool_state *g = c->items[i].pool->state;
        gp_pool_lock(g);
        for (gp_segment *seg = g->segments_head; seg != NULL && owner == NULL; seg = seg->next)
            if ((uintptr_t)ptr >= seg->addr && (uintptr_t)ptr < seg->addr + seg->size)
                owner = c->items[i].pool;
        gp_pool_unlock(g);
    }
    pthread_mutex_unlock(&c->lock);
    return owner;
}

size_t gp_capture_each(gp_pool_state *p, void (*fn)(gp_pool *graph, void *arg), void *arg)
{
    struct gp_capture_pools *c = p->capture;
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->lock);
    size_t n = c->count;
    for (size_t i = 0; i < n; i++)
        fn(c->items[i].pool, arg);
    pthread_mutex_unlock(&c->lock);
    return n;
}

int gp_capture_defer_free(gp_pool_state *p, void *ptr, gp_stream stream)
{
    struct gp_capture_pools *c = p->capture;
    pthread_mutex_lock(&c->lock);
    int rc = GP_OK;
    if (c->deferred_count == c->deferred_capacity) {
        size_t cap = c->deferred_capacity ? c->deferred_capacity * 2 : 16;
        struct deferred *d = realloc(c->deferred, cap * sizeof *d);
        if (d == NULL)
            rc = gp_error_set(GP_ERR_INVALID, "gp_free(%p) during a capture: out of host memory to defer it", ptr);
        else {
            c->deferred = d;
            c->deferred_capacity = cap;
        }
    }
    if (rc == GP_OK)
        c->deferred[c->deferred_count++] = (struct deferred){ptr, stream};
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void gp_capture_after_free(gp_pool_state *p, gp_pool *child)
{
    struct gp_capture_pools *c = p->capture;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->count; i++)
        if (c->items[i].pool == child && c->items[i].released && graph_pool_empty(child)) {
            destroy_graph_pool(c, i, NULL);
            break;
        }
    pthread_mutex_unlock(&c->lock);
}

void gp_capture_destroy(gp_pool_state *p, gp_leak_report *leaks)
{
    struct gp_capture_pools *c = p->capture;
    if (c == NULL)
        return;
    if (c->window != NULL) {
        atomic_store(&c->window->state->graph_window, false);
        gp_capture_window_closed();
    }
    while (c->count > 0)
        destroy_graph_pool(c, c->count - 1, leaks);
    free(c->items);
    free(c->deferred);
    pthread_mutex_destroy(&c->lock);
    free(c);
    p->capture = NULL;
}
