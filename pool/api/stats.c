/*
 * stats.c — consistent snapshots of the pool's counters, as a struct, as JSON, and as text; the JSON
 * keys and the printed lines come from GP_STATS_FIELDS (gpupool.h), the one list of the fields.
 * Key names follow PyTorch's torch.cuda.memory_stats where the meaning is the same.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "base/format.h"
#include "provider/provider.h"
#include "provider/staging.h"

/* Fills every field of *s from p under all locks (pool, then streams). */
static void snapshot(gp_pool_state *p, gp_stats *s)
{
    memset((char *)s + 2 * sizeof(uint32_t), 0, sizeof *s - 2 * sizeof(uint32_t));
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    unsigned count = atomic_load(&p->streams.count);
    uint64_t heap_free = 0;
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        heap_free += st->small.free_bytes + st->large.free_bytes;
        s->pending_bytes += st->pending_bytes;
        heap_free += st->parked_bytes;
        s->num_allocs += st->num_allocs;
        s->num_frees += st->num_frees;
        s->requested_bytes += st->requested_bytes;
        s->allocated_bytes += st->allocated_bytes;
        s->active_blocks += st->live.count;
        for (unsigned k = 0; k < GP_SIZE_CLASS_COUNT; k++)
            s->size_class_allocs[k] += st->size_class_allocs[k];
    }
    s->allocated_bytes_peak = atomic_load(&p->allocated_peak);
    if (s->allocated_bytes_peak < s->allocated_bytes)
        s->allocated_bytes_peak = s->allocated_bytes;
    s->reserved_bytes = atomic_load(&p->reserved);
    s->reserved_bytes_peak = atomic_load(&p->reserved_peak);
    s->cached_bytes = heap_free + s->pending_bytes + p->pooled_count * p->page;
    s->segments = p->segment_count;
    s->num_device_allocs = atomic_load(&p->num_device_allocs);
    s->num_device_frees = atomic_load(&p->num_device_frees);
    s->num_alloc_retries = atomic_load(&p->num_alloc_retries);
    s->num_ooms = atomic_load(&p->num_ooms);
    s->num_stream_steals = atomic_load(&p->num_stream_steals);
    s->num_stream_waits = atomic_load(&p->num_stream_waits);
    s->num_unmap_waits = atomic_load(&p->num_unmap_waits);
    s->num_device_syncs = atomic_load(&p->num_device_syncs);
    s->num_events_created = p->events.created;
    s->streams = count;
    if (p->provider->pages) {
        s->unmapped_cached_bytes = p->pooled_count * p->page;
        s->mapped_bytes = s->reserved_bytes - s->unmapped_cached_bytes;
    }
    s->num_maps = atomic_load(&p->num_maps);
    s->num_unmaps = atomic_load(&p->num_unmaps);
    s->num_stitches = atomic_load(&p->num_stitches);
    s->idle_released_bytes = atomic_load(&p->idle_released_bytes);
    /* live + cached == reserved (see pool_state.h) */
    s->paused_bytes = p->paused_bytes;
    assert(s->allocated_bytes + s->cached_bytes == s->reserved_bytes + s->paused_bytes);
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
}

static void add_graph_pool(gp_pool *graph, void *arg)
{
    gp_stats *s = arg, g;
    snapshot(graph->state, &g);
    s->graph_reserved_bytes += g.reserved_bytes;
    s->graph_allocated_bytes += g.allocated_bytes;
}

/* snapshot() of p, then its graph pools' totals (each a snapshot of its own, taken after p's: see
 * gp_capture_each for the lock order). */
static void snapshot_with_graphs(gp_pool_state *p, gp_stats *s)
{
    snapshot(p, s);
    s->graph_pools = gp_capture_each(p, add_graph_pool, s);
}

GP_API int gp_get_stats(gp_pool *pool, gp_stats *stats)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_get_stats", &p);
    if (rc != GP_OK)
        return rc;
    if ((rc = gp_versioned_out("gp_get_stats", "stats", stats, GP_STATS_VERSION, sizeof *stats)) != GP_OK)
        return rc;
    snapshot_with_graphs(p, stats);
    return GP_OK;
}

typedef struct text_buffer {
    char *buf;
    size_t len, used; /* used counts what would have been written without truncation */
} text_buffer;

static void put(text_buffer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_buffer *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->used < t->len ? t->len - t->used : 0;
    int n = vsnprintf(room ? t->buf + t->used : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->used += (size_t)n;
}

/* Every tenant's stats, under the locks; returns the count. */
static unsigned tenants_now(gp_pool_state *p, gp_tenant_stats *out)
{
    gp_pool_lock(p);
    gp_lock_all_streams(p);
    unsigned count = (unsigned)gp_tenant_snapshot_all(p, out, GP_MAX_TENANTS);
    gp_unlock_all_streams(p);
    gp_pool_unlock(p);
    return count;
}

GP_API int gp_stats_json(gp_pool *pool, char *buf, size_t len, size_t *needed)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_stats_json", &p);
    if (rc != GP_OK)
        return rc;
    if (buf == NULL && len > 0)
        return gp_error_set(GP_ERR_INVALID, "gp_stats_json: buf is NULL but len is %zu", len);
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    snapshot_with_graphs(p, &s);
    text_buffer t = {buf, len, 0};
    char quoted[GP_JSON_TEXT_MAX(sizeof p->cfg.backend)];
    gp_format_json_string(quoted, sizeof quoted, p->cfg.backend);
    put(&t, "{\"version\":%u,\"backend\":%s,\"device\":%d,\"staging\":\"%s\"", GP_STATS_VERSION, quoted,
        p->device, gp_staging_kind(p));
#define JSON_FIELD(name, unit, what) put(&t, ",\"" #name "\":%llu", (unsigned long long)s.name);
    GP_STATS_FIELDS(JSON_FIELD)
#undef JSON_FIELD
    put(&t, ",\"size_class_allocs\":[");
    for (unsigned k = 0; k < GP_SIZE_CLASS_COUNT; k++)
        put(&t, "%s%llu", k ? "," : "", (unsigned long long)s.size_class_allocs[k]);
    put(&t, "],\"tenants\":[");
    gp_tenant_stats ts[GP_MAX_TENANTS];
    unsigned tenants = tenants_now(p, ts);
    char name[GP_JSON_TEXT_MAX(GP_TENANT_NAME_MAX)];
    for (unsigned i = 0; i < tenants && gp_format_json_string(name, sizeof name, ts[i].name) > 0; i++)
        put(&t,
            "%s{\"name\":%s,\"held_bytes\":%llu,\"peak_bytes\":%llu,\"allocated_bytes\":%llu,"
            "\"cached_bytes\":%llu,\"max\":%llu,\"high\":%llu,\"min\":%llu,\"refusals\":%llu,\"pauses\":%llu,"
            "\"paused\":%s,\"graph_held_bytes\":%llu}",
            i ? "," : "", name, (unsigned long long)ts[i].held_bytes, (unsigned long long)ts[i].held_bytes_peak,
            (unsigned long long)ts[i].allocated_bytes, (unsigned long long)ts[i].cached_bytes,
            (unsigned long long)ts[i].max, (unsigned long long)ts[i].high, (unsigned long long)ts[i].min,
            (unsigned long long)ts[i].refusals, (unsigned long long)ts[i].pauses, ts[i].paused ? "true" : "false",
            (unsigned long long)ts[i].graph_held_bytes);
    put(&t, "]");
    if (p->cfg.peak_composition) {
        gp_peak_composition c = gp_peak_read(p);
        put(&t, ",\"peak_composition\":{\"recorded\":%s,\"unit\":\"%s\",\"unit_bytes\":%llu,\"reserved_bytes\":%llu,"
            "\"request_bytes\":%llu,\"num_allocs\":%llu,\"unmapped_cached_bytes\":%llu,\"parked_bytes\":%llu",
            c.recorded ? "true" : "false", c.unit_is_page ? "page" : "segment", (unsigned long long)c.unit_bytes,
            (unsigned long long)c.reserved_bytes, (unsigned long long)c.request_bytes,
            (unsigned long long)c.num_allocs, (unsigned long long)c.unmapped_cached_bytes,
            (unsigned long long)c.parked_bytes);
        const gp_peak_part *parts[2] = {&c.small, &c.large};
        for (int k = 0; k < 2; k++)
            put(&t, ",\"%s\":{\"allocated_bytes\":%llu,\"pending_bytes\":%llu,\"free_in_used_bytes\":%llu,"
                "\"free_whole_bytes\":%llu}", k ? "large" : "small", (unsigned long long)parts[k]->allocated_bytes,
                (unsigned long long)parts[k]->pending_bytes, (unsigned long long)parts[k]->free_in_used_bytes,
                (unsigned long long)parts[k]->free_whole_bytes);
        put(&t, "}");
    }
    put(&t, "}");
    if (len > 0 && t.used >= len)
        buf[len - 1] = '\0';
    if (needed != NULL)
        *needed = t.used;
    return GP_OK;
}

GP_API int gp_stats_print(gp_pool *pool, gp_writer write, void *opaque)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_stats_print", &p);
    if (rc != GP_OK)
        return rc;
    if (write == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_stats_print: write is NULL");
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    snapshot_with_graphs(p, &s);
    char line[256], a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX], c[GP_SIZE_TEXT_MAX];
    snprintf(line, sizeof line, "gpupool: device %d, backend %s, %llu streams\n", p->device, p->cfg.backend,
             (unsigned long long)s.streams);
    write(opaque, line);
    /* One line per field of GP_STATS_FIELDS: sizes for bytes, numbers for counts. */
#define PRINT_BYTES(v) gp_format_size((size_t)(v), a)
#define PRINT_COUNT(v) (snprintf(a, sizeof a, "%llu", (unsigned long long)(v)), a)
#define PRINT_FIELD(name, unit, what)                                                                          \
    snprintf(line, sizeof line, "  %-22s %12s\n", #name, PRINT_##unit(s.name));                                \
    write(opaque, line);
    GP_STATS_FIELDS(PRINT_FIELD)
#undef PRINT_FIELD
#undef PRINT_COUNT
#undef PRINT_BYTES
    gp_tenant_stats ts[GP_MAX_TENANTS];
    unsigned tenants = tenants_now(p, ts);
    for (unsigned i = 0; i < tenants; i++) {
        char d[GP_SIZE_TEXT_MAX], e[GP_SIZE_TEXT_MAX];
        snprintf(line, sizeof line,
                 "  tenant %-16s holds %s (peak %s), live %s; max %s high %s min %s; %llu refusals, %llu pauses%s\n",
                 ts[i].name, gp_format_size(ts[i].held_bytes, a), gp_format_size(ts[i].held_bytes_peak, b),
                 gp_format_size(ts[i].allocated_bytes, c), ts[i].max ? gp_format_size(ts[i].max, d) : "none",
                 ts[i].high ? gp_format_size(ts[i].high, e) : "none",
                 ts[i].min ? gp_format_size(ts[i].min, (char[GP_SIZE_TEXT_MAX]){0}) : "none",
                 (unsigned long long)ts[i].refusals, (unsigned long long)ts[i].pauses, ts[i].paused ? ", paused" : "");
        write(opaque, line);
        if (ts[i].graph_held_bytes > 0) {
            snprintf(line, sizeof line, "    and its CUDA graphs' private pools hold %s (counted against its limits)\n",
                     gp_format_size(ts[i].graph_held_bytes, a));
            write(opaque, line);
        }
    }
    return GP_OK;
}
