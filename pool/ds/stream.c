/*
 * stream.c — the lock-free stream table and the construction of per-stream state.
 */
#include "ds/stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static inline unsigned slot_of(gp_stream handle, const struct gp_tenant *tenant, unsigned capacity)
{
    uint64_t h = ((uint64_t)(uintptr_t)handle ^ ((uint64_t)(uintptr_t)tenant >> 4)) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 32) & (capacity - 1);
}

int gp_stream_table_init(gp_stream_table *table, unsigned max_streams)
{
    unsigned capacity = 16;
    while (capacity < 4 * max_streams)
        capacity *= 2;
    table->slots = calloc(capacity, sizeof *table->slots);
    table->by_index = calloc(2 * (size_t)max_streams, sizeof *table->by_index);
    if (table->slots == NULL || table->by_index == NULL) {
        free(table->slots);
        free(table->by_index);
        return gp_error_set(GP_ERR_INVALID, "out of host memory for a table of %u streams", max_streams);
    }
    for (unsigned i = 0; i < capacity; i++)
        atomic_init(&table->slots[i], NULL);
    table->capacity = capacity;
    table->max_streams = max_streams;
    table->claimed = 0;
    atomic_init(&table->count, 0);
    return GP_OK;
}

void gp_stream_table_free(gp_stream_table *table)
{
    unsigned count = atomic_load(&table->count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = table->by_index[i];
        gp_block_map_free(&st->live);
        gp_block_cache_clear(&st->blocks);
        pthread_mutex_destroy(&st->lock);
        free(st);
    }
    free(table->slots);
    free(table->by_index);
    memset(table, 0, sizeof *table);
}

gp_stream_state *gp_stream_find(const gp_stream_table *table, gp_stream handle, const struct gp_tenant *tenant)
{
    for (unsigned s = slot_of(handle, tenant, table->capacity);; s = (s + 1) & (table->capacity - 1)) {
        gp_stream_state *st = atomic_load_explicit(&table->slots[s], memory_order_acquire);
        if (st == NULL || (st->handle == handle && st->tenant == tenant))
            return st;
    }
}

bool gp_stream_seen(const gp_stream_table *table, gp_stream handle)
{
    unsigned count = atomic_load(&table->count);
    for (unsigned i = 0; i < count; i++)
        if (table->by_index[i]->handle == handle)
            return true;
    return false;
}

static int too_many(const gp_stream_table *table, gp_stream handle)
{
    return gp_error_set(GP_ERR_INVALID,
                        "stream %p is one stream too many: this pool tracks at most %u stream and tenant pairs "
                        "(config key max_streams)",
                        handle, table->max_streams);
}

int gp_stream_claim(gp_stream_table *table, gp_stream_state *st)
{
    if (st->claimed)
        return GP_OK;
    if (table->claimed >= table->max_streams)
        return too_many(table, st->handle);
    st->claimed = true;
    table->claimed++;
    return GP_OK;
}

int gp_stream_add(gp_stream_table *table, gp_stream handle, struct gp_tenant *tenant, gp_stream_state **out)
{
    unsigned count = atomic_load(&table->count);
    if (table->claimed >= table->max_streams)
        return too_many(table, handle);
    if (count >= 2 * table->max_streams)
        return gp_error_set(GP_ERR_INVALID,
                            "stream %p: this pool tracks at most %u stream and tenant pairs (config key max_streams) "
                            "and as many that only failed calls used; all are taken",
                            handle, table->max_streams);
    gp_stream_state *st = calloc(1, sizeof *st);
    if (st == NULL)
        return gp_error_set(GP_ERR_INVALID, "out of host memory for stream %p", handle);
    st->handle = handle;
    st->tenant = tenant;
    st->index = count;
    st->small.clock = st->large.clock = &st->free_seq; /* one fence covers both heaps */
    atomic_init(&st->pending_count, 0);
    pthread_mutex_init(&st->lock, NULL);
    table->by_index[count] = st;
    unsigned s = slot_of(handle, tenant, table->capacity);
    while (atomic_load_explicit(&table->slots[s], memory_order_relaxed) != NULL)
        s = (s + 1) & (table->capacity - 1);
    atomic_store_explicit(&table->slots[s], st, memory_order_release);
    atomic_store(&table->count, count + 1);
    *out = st;
    return GP_OK;
}
