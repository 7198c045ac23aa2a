/*
 * snapshot.c — the pool as PyTorch's memory viewers see it: gp_history_record (the hooks are
 * gp_history_note, provider/pool_state.h) and gp_snapshot_write (the format is described in include/gpupool.h).
 *
 * The snapshot is built in host memory (base/pickle.h) while the pool lock and every stream lock are
 * held, so its segments and blocks are one consistent state; the trace entries are copied out of the
 * history ring before (they have their own lock). The file is written to PATH.tmp and renamed over
 * PATH, so a failure never leaves a half-written snapshot behind.
 *
 * Shapes, as PyTorch 2.x's torch.cuda.memory._snapshot() writes them (torch/cuda/memory.py):
 *   segment: device, address, total_size, allocated_size, active_size, requested_size, stream,
 *            segment_type ("small" | "large"), segment_pool_id (0, 0), is_expandable, frames, blocks
 *   block:   address, size, requested_size, state ("active_allocated" | "active_pending_free" |
 *            "inactive"), frames; live and pending blocks also carry PyTorch 1.x's "history"
 *            ([{addr, real_size, frames}]), which 1.x's _memory_viz reads
 *   trace:   action, addr, size, stream, time_us, frames
 * A virtual-memory range is written as one expandable segment per run of mapped blocks (its unmapped
 * parts hold nothing), so every segment's blocks add up to its total_size, as the readers check.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "base/pickle.h"
#include "ds/history.h"

GP_API int gp_history_record(gp_pool *pool, size_t max_entries)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_history_record", &p);
    if (rc != GP_OK)
        return rc;
    if (max_entries > ((size_t)1 << 32))
        return gp_error_set(GP_ERR_INVALID, "gp_history_record: max_entries %zu is over 2^32", max_entries);
    gp_pool_lock(p);
    gp_history *h = atomic_load(&p->history);
    if (max_entries == 0) {
        atomic_store(&p->history_on, false);
        if (h != NULL)
            rc = gp_history_resize(h, 0);
    } else if (h == NULL) {
        h = gp_history_create(max_entries);
        if (h == NULL)
            rc = gp_error_set(GP_ERR_OOM, "gp_history_record: out of host memory for %zu entries", max_entries);
        else
            atomic_store(&p->history, h);
    } else if (gp_history_resize(h, max_entries) != 0) {
        rc = gp_error_set(GP_ERR_OOM, "gp_history_record: out of host memory for %zu entries", max_entries);
    }
    if (rc == GP_OK && max_entries > 0)
        atomic_store(&p->history_on, true);
    gp_pool_unlock(p);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------------- */

static const char *tenant_name(gp_pool_state *p, unsigned index)
{
    unsigned count = atomic_load(&p->tenants.count);
    return index < count ? p->tenants.tenants[index]->name : "?";
}

/* frames: [{"filename": "gpupool tenant", "line": 0, "name": NAME}] */
static void frames(gp_pickle *pk, const char *tenant)
{
    gp_pickle_list(pk);
    gp_pickle_dict(pk);
    gp_pickle_key(pk, "filename");
    gp_pickle_str(pk, "gpupool tenant");
    gp_pickle_key(pk, "line");
    gp_pickle_int(pk, 0);
    gp_pickle_key(pk, "name");
    gp_pickle_str(pk, tenant);
    gp_pickle_close(pk);
    gp_pickle_close(pk);
}

static const char *block_state(const gp_block *b)
{
    switch (b->state) {
    case GP_BLOCK_LIVE: return "active_allocated";
    case GP_BLOCK_PENDING: return "active_pending_free";
    default: return "inactive";
    }
}

static void block(gp_pickle *pk, const gp_block *b, const char *tenant)
{
    bool active = b->state == GP_BLOCK_LIVE || b->state == GP_BLOCK_PENDING;
    gp_pickle_dict(pk);
    gp_pickle_key(pk, "address");
    gp_pickle_uint(pk, b->addr);
    gp_pickle_key(pk, "size");
    gp_pickle_uint(pk, b->size);
    gp_pickle_key(pk, "requested_size");
    gp_pickle_uint(pk, active ? b->requested : 0);
    gp_pickle_key(pk, "state");
    gp_pickle_str(pk, block_state(b));
    gp_pickle_key(pk, "frames");
    if (active) {
        frames(pk, tenant);
        gp_pickle_key(pk, "history");
        gp_pickle_list(pk);
        gp_pickle_dict(pk);
        gp_pickle_key(pk, "addr");
        gp_pickle_uint(pk, b->addr);
        gp_pickle_key(pk, "real_size");
        gp_pickle_uint(pk, b->requested);
        gp_pickle_key(pk, "frames");
        frames(pk, tenant);
        gp_pickle_close(pk);
        gp_pickle_close(pk);
    } else {
        gp_pickle_list(pk);
        gp_pickle_close(pk);
    }
    gp_pickle_close(pk);
}

/* One segment dict for the blocks [first, end) of seg (a whole device allocation, or one mapped run
 * of a virtual range). */
static void segment(gp_pickle *pk, gp_pool_state *p, const gp_segment *seg, const gp_block *first, const gp_block *end)
{
    assert(first != NULL); /* blocks tile their segment: a segment or a mapped run has at least one */
    const char *tenant = seg->owner->tenant->name;
    size_t total = 0, allocated = 0, active = 0, requested = 0;
    for (const gp_block *b = first; b != end; b = b->next) {
        total += b->size;
        if (b->state == GP_BLOCK_LIVE) {
            allocated += b->size;
            requested += b->requested;
        }
        if (b->state == GP_BLOCK_LIVE || b->state == GP_BLOCK_PENDING)
            active += b->size;
    }
    gp_pickle_dict(pk);
    gp_pickle_key(pk, "device");
    gp_pickle_int(pk, p->device);
    gp_pickle_key(pk, "address");
    gp_pickle_uint(pk, first->addr);
    gp_pickle_key(pk, "total_size");
    gp_pickle_uint(pk, total);
    gp_pickle_key(pk, "allocated_size");
    gp_pickle_uint(pk, allocated);
    gp_pickle_key(pk, "active_size");
    gp_pickle_uint(pk, active);
    gp_pickle_key(pk, "requested_size");
    gp_pickle_uint(pk, requested);
    gp_pickle_key(pk, "stream");
    gp_pickle_uint(pk, (uint64_t)(uintptr_t)seg->owner->handle);
    gp_pickle_key(pk, "segment_type");
    gp_pickle_str(pk, seg->small ? "small" : "large");
    gp_pickle_key(pk, "segment_pool_id");
    gp_pickle_tuple(pk);
    gp_pickle_int(pk, 0);
    gp_pickle_int(pk, 0);
    gp_pickle_close(pk);
    gp_pickle_key(pk, "is_expandable");
    gp_pickle_bool(pk, seg->pages != NULL);
    gp_pickle_key(pk, "tenant");
    gp_pickle_str(pk, tenant);
    gp_pickle_key(pk, "frames");
    frames(pk, tenant);
    gp_pickle_key(pk, "blocks");
    gp_pickle_list(pk);
    for (const gp_block *b = first; b != end; b = b->next)
        block(pk, b, tenant);
    gp_pickle_close(pk);
    gp_pickle_close(pk);
}

/* The pool's segments (pool lock and every stream lock held). */
static void segments_of(gp_pickle *pk, gp_pool_state *p)
{
    for (const gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->paused)
            continue;
        if (seg->pages == NULL) {
            segment(pk, p, seg, seg->first, NULL);
            continue;
        }
        const gp_block *b = seg->first;
        while (b != NULL) {
            while (b != NULL && gp_block_unbacked(b))
                b = b->next;
            if (b == NULL)
                break;
            const gp_block *end = b;
            while (end != NULL && !gp_block_unbacked(end))
                end = end->next;
            segment(pk, p, seg, b, end);
            b = end;
        }
    }
}

static void trace_of(gp_pickle *pk, gp_pool_state *p, const gp_history_entry *e, size_t n)
{
    gp_pickle_list(pk);
    for (size_t i = 0; i < n; i++) {
        gp_pickle_dict(pk);
        gp_pickle_key(pk, "action");
        gp_pickle_str(pk, gp_history_action_name(e[i].action));
        gp_pickle_key(pk, "addr");
        gp_pickle_uint(pk, e[i].addr);
        gp_pickle_key(pk, "size");
        gp_pickle_uint(pk, e[i].size);
        gp_pickle_key(pk, "stream");
        gp_pickle_uint(pk, e[i].stream);
        gp_pickle_key(pk, "time_us");
        gp_pickle_uint(pk, e[i].time_ns / 1000u);
        if (e[i].action == GP_HIST_OOM) {
            gp_pickle_key(pk, "device_free");
            gp_pickle_int(pk, 0);
        }
        gp_pickle_key(pk, "frames");
        frames(pk, tenant_name(p, e[i].tenant));
        gp_pickle_close(pk);
    }
    gp_pickle_close(pk);
}

static int write_file(const char *path, const unsigned char *bytes, size_t len)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + 5);
    if (tmp == NULL)
        return gp_error_set(GP_ERR_OOM, "gp_snapshot_write: out of host memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        int rc = gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    size_t wrote = fwrite(bytes, 1, len, f);
    int e = errno;
    bool ok = wrote == len;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    int rc = GP_OK;
    if (!ok) {
        remove(tmp);
        rc = gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: cannot write %s: %s", path, strerror(e));
    }
    free(tmp);
    return rc;
}

GP_API int gp_snapshot_write(gp_pool *const *pools, size_t count, const char *path, unsigned flags)
{
    if (pools == NULL || count == 0)
        return gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: no pools given");
    if (path == NULL || path[0] == '\0')
        return gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: path is NULL or empty");
    if ((flags & ~GP_SNAPSHOT_LIST) != 0)
        return gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: unknown flags 0x%x", flags & ~GP_SNAPSHOT_LIST);
    gp_pool_state *states[64];
    if (count > sizeof states / sizeof states[0])
        return gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: %zu pools (at most 64)", count);
    int max_device = -1;
    for (size_t i = 0; i < count; i++) {
        int rc = gp_pool_enter(pools[i], "gp_snapshot_write", &states[i]);
        if (rc != GP_OK)
            return rc;
        for (size_t j = 0; j < i; j++)
            if (states[j]->device == states[i]->device)
                return gp_error_set(GP_ERR_INVALID, "gp_snapshot_write: two pools of device %d", states[i]->device);
        if (states[i]->device > max_device)
            max_device = states[i]->device;
    }
    bool list_only = (flags & GP_SNAPSHOT_LIST) != 0;

    /* the trace entries first, under the rings' own locks */
    gp_history_entry *traces[64] = {0};
    size_t trace_len[64] = {0};
    int rc = GP_OK;
    for (size_t i = 0; i < count && !list_only && rc == GP_OK; i++) {
        gp_history *h = atomic_load(&states[i]->history);
        if (h == NULL)
            continue;
        trace_len[i] = gp_history_copy(h, &traces[i]);
        if (trace_len[i] == SIZE_MAX) {
            trace_len[i] = 0;
            rc = gp_error_set(GP_ERR_OOM, "gp_snapshot_write: out of host memory for the trace");
        }
    }

    gp_pickle pk;
    gp_pickle_init(&pk);
    if (!list_only) {
        gp_pickle_dict(&pk);
        gp_pickle_key(&pk, "segments");
    }
    gp_pickle_list(&pk);
    for (size_t i = 0; i < count && rc == GP_OK; i++) {
        gp_pool_state *p = states[i];
        gp_pool_lock(p);
        gp_lock_all_streams(p);
        segments_of(&pk, p);
        gp_unlock_all_streams(p);
        gp_pool_unlock(p);
    }
    gp_pickle_close(&pk);
    if (!list_only) {
        gp_pickle_key(&pk, "device_traces");
        gp_pickle_list(&pk);
        for (int d = 0; d <= max_device; d++) {
            size_t i = 0;
            while (i < count && states[i]->device != d)
                i++;
            if (i == count) {
                gp_pickle_list(&pk);
                gp_pickle_close(&pk);
            } else {
                trace_of(&pk, states[i], traces[i], trace_len[i]);
            }
        }
        gp_pickle_close(&pk);
        gp_pickle_key(&pk, "allocator_settings");
        gp_pickle_dict(&pk);
        gp_pickle_key(&pk, "allocator");
        gp_pickle_str(&pk, "gpupool");
        gp_pickle_close(&pk);
        gp_pickle_close(&pk);
    }
    for (size_t i = 0; i < count; i++)
        free(traces[i]);
    const char *why = NULL;
    if (gp_pickle_finish(&pk, &why) != 0 && rc == GP_OK)
        rc = gp_error_set(GP_ERR_OOM, "gp_snapshot_write: %s", why);
    if (rc == GP_OK)
        rc = write_file(path, pk.buf, pk.len);
    gp_pickle_free(&pk);
    return rc;
}
