/*
 * staging.c — pinned host memory for pausing tenants with their contents.
 *
 * Staging buffers come from a jemalloc arena of their own whose extent hooks obtain memory from the
 * backend's host_alloc (cudaHostAlloc on a GPU, plain pages on the sim), so page-locked memory is
 * allocated in large extents and reused, not with one cudaHostAlloc per buffer. jemalloc is opened at
 * run time with dlopen(RTLD_LOCAL): linking Debian's libjemalloc would make it the malloc of every
 * process that loads libgpupool. dlopen can fail where the process has no static TLS left for it
 * (glibc's "cannot allocate memory in static TLS block", e.g. inside Python; setting
 * GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096 before the process starts avoids it); then each
 * staging buffer is one host_alloc of its own, and gp_staging_kind says so.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "provider/staging.h"

/* jemalloc's extent hooks (jemalloc/jemalloc.h, extent_hooks_t), declared here so that the library does
 * not depend on the header at build time. */
typedef struct extent_hooks_s extent_hooks_t;
typedef void *(extent_alloc_t)(extent_hooks_t *, void *, size_t, size_t, bool *, bool *, unsigned);
typedef bool(extent_dalloc_t)(extent_hooks_t *, void *, size_t, bool, unsigned);
struct extent_hooks_s {
    extent_alloc_t *alloc;
    extent_dalloc_t *dalloc;
    void *destroy, *commit, *decommit, *purge_lazy, *purge_forced, *split, *merge;
};

#define MALLOCX_ARENA(a) ((int)(((unsigned)(a) + 1) << 20))
#define MALLOCX_TCACHE_NONE ((int)((0xffffffffu - 1) << 8))

static struct {
    pthread_once_t once;
    bool ok;
    int (*mallctl)(const char *, void *, size_t *, void *, size_t);
    void *(*mallocx)(size_t, int);
    void (*dallocx)(void *, int);
} je = {PTHREAD_ONCE_INIT, false, NULL, NULL, NULL};

static void open_jemalloc(void)
{
    void *lib = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return;
    /* dlsym returns an object pointer; copy it into the function pointers (ISO C forbids the cast) */
    void *sym = dlsym(lib, "mallctl");
    memcpy(&je.mallctl, &sym, sizeof sym);
    sym = dlsym(lib, "mallocx");
    memcpy(&je.mallocx, &sym, sizeof sym);
    sym = dlsym(lib, "dallocx");
    memcpy(&je.dallocx, &sym, sizeof sym);
    je.ok = je.mallctl != NULL && je.mallocx != NULL && je.dallocx != NULL;
}

/* The hooks of one pool's arena: the extent hooks first, so that the hook pointer is the struct. */
typedef struct staging_hooks {
    extent_hooks_t hooks;
    gp_pool_state *pool;
} staging_hooks;

static void *extent_alloc(extent_hooks_t *hooks, void *new_addr, size_t size, size_t alignment, bool *zero,
                          bool *commit, unsigned arena)
{
    (void)arena;
    if (new_addr != NULL || alignment > 4096)
        return NULL; /* host_alloc gives page-aligned memory at an address of its choosing */
    gp_pool_state *p = ((staging_hooks *)hooks)->pool;
    void *mem = NULL;
    if (p->ops->host_alloc(p->ctx, size, &mem) != GP_OK)
        return NULL;
    *zero = false;
    *commit = true;
    return mem;
}

static bool extent_dalloc(extent_hooks_t *hooks, void *addr, size_t size, bool committed, unsigned arena)
{
    (void)committed;
    (void)arena;
    gp_pool_state *p = ((staging_hooks *)hooks)->pool;
    return p->ops->host_free(p->ctx, addr, size) != GP_OK; /* true: jemalloc keeps it */
}

/* Creates the pool's arena on first use (pool lock held). */
static bool arena_ready(gp_pool_state *p)
{
    pthread_once(&je.once, open_jemalloc);
    if (!je.ok)
        return false;
    if (p->staging_hooks != NULL)
        return true;
    staging_hooks *h = calloc(1, sizeof *h);
    if (h == NULL)
        return false;
    h->hooks.alloc = extent_alloc;
    h->hooks.dalloc = extent_dalloc;
    h->pool = p;
    extent_hooks_t *hp = &h->hooks;
    unsigned arena = 0;
    size_t len = sizeof arena;
    if (je.mallctl("arenas.create", &arena, &len, &hp, sizeof hp) != 0) {
        free(h);
        return false;
    }
    p->staging_hooks = h;
    p->staging_arena = arena;
    return true;
}

int gp_staging_alloc(gp_pool_state *p, size_t size, void **out)
{
    if (size == 0) {
        *out = NULL;
        return GP_OK;
    }
    if (arena_ready(p)) {
        void *mem = je.mallocx(size, MALLOCX_ARENA(p->staging_arena) | MALLOCX_TCACHE_NONE);
        if (mem == NULL)
            return gp_error_set(GP_ERR_OOM, "out of pinned host memory for %zu bytes of staging", size);
        *out = mem;
        return GP_OK;
    }
    return p->ops->host_alloc(p->ctx, size, out);
}

void gp_staging_free(gp_pool_state *p, void *mem, size_t size)
{
    if (mem == NULL)
        return;
    if (p->staging_hooks != NULL)
        je.dallocx(mem, MALLOCX_ARENA(p->staging_arena) | MALLOCX_TCACHE_NONE);
    else
        p->ops->host_free(p->ctx, mem, size);
}

void gp_staging_destroy(gp_pool_state *p)
{
    if (p->staging_hooks == NULL)
        return;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", p->staging_arena);
    je.mallctl(name, NULL, NULL, NULL, 0); /* gives its extents back through extent_dalloc */
    free(p->staging_hooks);
    p->staging_hooks = NULL;
}

const char *gp_staging_kind(gp_pool_state *p)
{
    (void)p;
    pthread_once(&je.once, open_jemalloc);
    return je.ok ? "jemalloc" : "host_alloc";
}

/* ---- staging keyed by block (api/pause.c) -------------------------------------------------------- */

static bool tenant_range(const gp_segment *seg, const gp_tenant *t)
{
    return seg->owner->tenant == t && seg->pages != NULL;
}

static int staged_cmp(const void *a, const void *b)
{
    uintptr_t x = ((const gp_staged_block *)a)->addr, y = ((const gp_staged_block *)b)->addr;
    return x < y ? -1 : x > y;
}

void gp_staging_drop(gp_pool_state *p, gp_tenant *t)
{
    gp_staging_free(p, t->staging, t->staging_size);
    free(t->staged);
    t->staging = NULL;
    t->staging_size = 0;
    t->staged = NULL;
    t->staged_count = 0;
}

/*
 * Copies are made per run: LIVE blocks next to each other in one range whose staged bytes are next to
 * each other too go in one copy, so that a tenant of many small tensors (a model's parameters,
 * allocated one after another) costs a few copies, not one per tensor. A run never spans two ranges
 * (two reservations) and never copies a byte that is not a LIVE block's.
 */
typedef struct copy_run {
    uintptr_t dev;
    size_t host; /* offset in the staging buffer */
    size_t size;
} copy_run;

/* Copies the run (if any) and empties it. */
static int flush(gp_pool_state *p, unsigned char *staging, copy_run *run, bool to_device)
{
    if (run->size == 0)
        return GP_OK;
    int rc = to_device ? p->ops->copy_to_device(p->ctx, run->dev, staging + run->host, run->size)
                       : p->ops->copy_to_host(p->ctx, staging + run->host, run->dev, run->size);
    run->size = 0;
    return rc;
}

/* Adds the block at dev (size bytes, staged at host) to the run, copying the run first when the block
 * does not continue it. */
static int add(gp_pool_state *p, unsigned char *staging, copy_run *run, uintptr_t dev, size_t host, size_t size,
               bool to_device)
{
    if (run->size > 0 && (run->dev + run->size != dev || run->host + run->size != host)) {
        int rc = flush(p, staging, run, to_device);
        if (rc != GP_OK)
            return rc;
    }
    if (run->size == 0)
        *run = (copy_run){dev, host, 0};
    run->size += size;
    return GP_OK;
}

int gp_staging_stage(gp_pool_state *p, gp_tenant *t)
{
    size_t bytes = 0, count = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (tenant_range(seg, t))
            for (gp_block *b = seg->first; b != NULL; b = b->next)
                if (b->state == GP_BLOCK_LIVE) {
                    bytes += b->size;
                    count++;
                }
    if (count == 0)
        return GP_OK;
    gp_staged_block *table = malloc(count * sizeof *table);
    if (table == NULL)
        return gp_error_set(GP_ERR_OOM, "out of host memory for the table of %zu staged blocks", count);
    void *staging = NULL;
    int rc = gp_staging_alloc(p, bytes, &staging);
    size_t at = 0, n = 0;
    copy_run run = {0, 0, 0};
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next) {
        if (!tenant_range(seg, t))
            continue;
        for (gp_block *b = seg->first; b != NULL && rc == GP_OK; b = b->next) {
            if (b->state != GP_BLOCK_LIVE)
                continue;
            rc = add(p, staging, &run, b->addr, at, b->size, false);
            table[n++] = (gp_staged_block){b->addr, b->size, at};
            at += b->size;
        }
        if (rc == GP_OK)
            rc = flush(p, staging, &run, false); /* a run ends with its range */
    }
    if (rc != GP_OK) {
        gp_staging_free(p, staging, bytes);
        free(table);
        return rc;
    }
    assert(n == count && at == bytes);
    qsort(table, count, sizeof *table, staged_cmp);
    t->staging = staging;
    t->staging_size = bytes;
    t->staged = table;
    t->staged_count = count;
    return GP_OK;
}

int gp_staging_restore(gp_pool_state *p, gp_tenant *t)
{
    copy_run run = {0, 0, 0};
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (!tenant_range(seg, t))
            continue;
        for (gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_LIVE)
                continue;
            gp_staged_block key = {.addr = b->addr};
            const gp_staged_block *e = bsearch(&key, t->staged, t->staged_count, sizeof key, staged_cmp);
            assert(e != NULL && e->size == b->size); /* nothing is allocated while paused */
            if (e == NULL)
                continue;
            int rc = add(p, t->staging, &run, b->addr, e->offset, b->size, true);
            if (rc != GP_OK)
                return rc;
        }
        int rc = flush(p, t->staging, &run, true);
        if (rc != GP_OK)
            return rc;
    }
    return GP_OK;
}
