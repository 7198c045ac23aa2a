/*
 * pool_state.c — the pool state's own bookkeeping, which makes no device call: the list of segments,
 * placing a new segment in it, locking every stream (or a tenant's: gp_lock_tenant_streams), flushing
 * and counting the streams' allocated deltas, freeing all metadata at destroy, and the accounting
 * check of gp_check (the invariants of pool_state.h).
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/list.h"
#include "provider/pool_state.h"
#include "provider/thread_cache.h"

void gp_segment_link(gp_pool_state *p, gp_segment *seg)
{
    GP_LIST_APPEND(p->segments_head, p->segments_tail, seg, prev, next);
    p->segment_count++;
}

void gp_segment_unlink(gp_pool_state *p, gp_segment *seg)
{
    GP_LIST_UNLINK(p->segments_head, p->segments_tail, seg, prev, next);
    p->segment_count--;
}

/* Locks the streams of `set` (member NULL: every stream) in index order, then returns their thread
 * caches' blocks, so that a walk over their segments sees them all. */
static void lock_set(gp_pool_state *p, const gp_stream_set *set)
{
    for (unsigned i = 0; i < set->count; i++)
        if (set->member == NULL || set->member[i])
            gp_stream_lock(p->streams.by_index[i]);
    for (unsigned i = 0; i < set->count; i++)
        if (set->member == NULL || set->member[i])
            gp_thread_cache_return(p, p->streams.by_index[i]);
}

static void unlock_set(gp_pool_state *p, const gp_stream_set *set)
{
    for (unsigned i = set->count; i-- > 0;)
        if (set->member == NULL || set->member[i])
            gp_stream_unlock(p->streams.by_index[i]);
}

void gp_lock_all_streams(gp_pool_state *p)
{
    lock_set(p, &(gp_stream_set){NULL, NULL, atomic_load(&p->streams.count)});
}

void gp_unlock_all_streams(gp_pool_state *p)
{
    unlock_set(p, &(gp_stream_set){NULL, NULL, atomic_load(&p->streams.count)});
}

/* Marks in recorded[] the streams t's blocks are recorded for (t's streams locked). */
static void mark_recorded(gp_pool_state *p, const gp_tenant *t, bool *recorded, unsigned count)
{
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (seg->owner->tenant != t)
            continue;
        for (gp_block *b = seg->first; b != NULL; b = b->next)
            for (unsigned u = 0; u < b->use_count; u++) {
                const gp_stream_state *use = gp_block_uses(b)[u];
                assert(use->index < count); /* streams are added under the pool lock */
                (void)count;
                recorded[use->index] = true;
            }
    }
}

void gp_lock_tenant_streams(gp_pool_state *p, const gp_tenant *t, gp_stream_set *set)
{
    set->count = atomic_load(&p->streams.count);
    set->member = calloc(set->count + 1, sizeof *set->member);
    bool *recorded = calloc(set->count + 1, sizeof *recorded);
    set->recorded = NULL;
    if (set->member == NULL || recorded == NULL) { /* out of host memory: every stream, as before */
        free(set->member);
        free(recorded);
        set->member = NULL;
        lock_set(p, set);
        return;
    }
    for (unsigned i = 0; i < set->count; i++)
        set->member[i] = p->streams.by_index[i]->tenant == t;
    for (;;) { /* at most once per stream: the set only grows */
        lock_set(p, set);
        memset(recorded, 0, set->count * sizeof *recorded);
        mark_recorded(p, t, recorded, set->count);
        bool grew = false;
        for (unsigned i = 0; i < set->count; i++)
            grew |= recorded[i] && !set->member[i];
        if (!grew)
            break;
        unlock_set(p, set);
        for (unsigned i = 0; i < set->count; i++)
            set->member[i] |= recorded[i];
    }
    set->recorded = recorded;
}

void gp_unlock_stream_set(gp_pool_state *p, gp_stream_set *set)
{
    unlock_set(p, set);
    free(set->member);
    free(set->recorded);
    set->member = NULL;
    set->recorded = NULL;
}

void gp_segment_place(gp_pool_state *p, gp_segment *seg, gp_stream_state *st, uintptr_t addr, size_t size, bool small,
                      size_t mapped, gp_block_state state)
{
    gp_block *b = seg->first;
    seg->addr = addr;
    seg->size = size;
    seg->mapped_bytes = mapped;
    seg->small = small;
    seg->serial = p->next_serial++;
    seg->owner = st;
    b->addr = addr;
    b->size = size;
    b->state = state;
    gp_segment_link(p, seg);
}

void gp_segments_free_all(gp_pool_state *p)
{
    gp_segment *seg = p->segments_head;
    while (seg != NULL) {
        gp_segment *next = seg->next;
        gp_segment_free(seg);
        seg = next;
    }
    p->segments_head = p->segments_tail = NULL;
    p->segment_count = 0;
}

void gp_flush_all(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        gp_stream_lock(st);
        gp_thread_cache_return(p, st); /* the entries' unflushed deltas too */
        gp_flush(p, st);
        gp_stream_unlock(st);
    }
}

int64_t gp_allocated_now(gp_pool_state *p, gp_stream_state *held, int64_t estimate)
{
    int64_t sum = atomic_load_explicit(&p->allocated_flushed, memory_order_relaxed);
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *x = p->streams.by_index[i];
        if (x != held && !gp_stream_trylock(x))
            return estimate;
        sum += atomic_load_explicit(&x->unflushed, memory_order_relaxed);
        if (x->lenders != NULL)
            sum += gp_thread_cache_unflushed(x);
        if (x != held)
            gp_stream_unlock(x);
    }
    return sum;
}

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            snprintf(why, len, __VA_ARGS__);                                                                   \
            return false;                                                                                      \
        }                                                                                                      \
    } while (0)

bool gp_accounting_check(gp_pool_state *p, const gp_segment_tally *tally, size_t segments, size_t reserved,
                         char *why, size_t len)
{
    unsigned count = atomic_load(&p->streams.count);
    size_t allocated = tally->allocated, free_bytes = tally->free_bytes, pending = tally->pending;
    size_t heap_free = 0, stream_pending = 0, mapped = 0, parked = 0;
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        heap_free += st->small.free_bytes + st->large.free_bytes;
        parked += st->parked_bytes;
        stream_pending += st->pending_bytes;
        mapped += st->live.count;
    }
    CHECK(segments == p->segment_count, "%zu segments listed, %zu counted", segments, p->segment_count);
    size_t pooled = p->pooled_count * p->page;
    reserved += pooled;
    CHECK(reserved == atomic_load(&p->reserved), "reserved %zu != mapped + pooled bytes %zu", atomic_load(&p->reserved),
          reserved);
    size_t stream_allocated = 0;
    int64_t unflushed = 0;
    for (unsigned i = 0; i < count; i++) {
        stream_allocated += p->streams.by_index[i]->allocated_bytes;
        unflushed += atomic_load(&p->streams.by_index[i]->unflushed);
    }
    CHECK(allocated == stream_allocated, "streams count %zu allocated bytes, live blocks hold %zu", stream_allocated,
          allocated);
    CHECK((int64_t)atomic_load(&p->allocated_flushed) + unflushed == (int64_t)allocated,
          "shared allocated total %lld + unflushed %lld != %zu", (long long)atomic_load(&p->allocated_flushed),
          (long long)unflushed, allocated);
    CHECK(free_bytes == heap_free, "free blocks hold %zu bytes but the heaps count %zu", free_bytes, heap_free);
    CHECK(pending == stream_pending, "pending blocks hold %zu bytes but the streams count %zu", pending, stream_pending);
    CHECK(tally->live_blocks == mapped, "%zu live blocks, %zu in the streams' maps", tally->live_blocks, mapped);
    CHECK(allocated + free_bytes + pending + pooled + parked == reserved + p->paused_bytes,
          "allocated %zu + cached %zu != reserved %zu + paused %zu", allocated, free_bytes + pending + pooled + parked,
          reserved, p->paused_bytes);
    /* per tenant: held == device memory of the segments of its stream states; sums == pool totals */
    size_t held_total = 0;
    unsigned tenants = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < tenants; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        size_t held = 0;
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (seg->owner->tenant == t)
                held += seg->mapped_bytes;
        CHECK(held == atomic_load(&t->held), "tenant '%s' is charged %zu bytes, its segments hold %zu", t->name,
              atomic_load(&t->held), held);
        held_total += held;
    }
    CHECK(held_total + pooled == reserved, "tenants hold %zu + pooled %zu != reserved %zu", held_total, pooled,
          reserved);
    return true;
}
