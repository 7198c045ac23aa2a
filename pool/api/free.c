/*
 * free.c — gp_free and gp_record_stream: stream-ordered return of blocks to the cache.
 *
 * A block freed on the stream that allocated it, and used on no other stream, goes straight back to
 * that stream's heap: later allocations on the stream are ordered after its earlier work, so reuse is
 * immediate and needs no event. A block used on other streams (gp_record_stream, or a free on another
 * stream) becomes PENDING: an event is recorded on each of those streams, and the block returns to its
 * owner's heap only when every one of them has completed (queried, never waited for, on the hot path).
 * A small block freed on its own stream goes to the freeing thread's cache for that stream first
 * (provider/thread_cache.h), and a free of a block that cache handed out takes no stream lock; a
 * lookup that the stream's map misses returns the stream's thread-cached blocks and looks again.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "base/format.h"
#include "base/list.h"
#include "provider/pending.h"
#include "provider/thread_cache.h"

/* Uses are streams: states of two tenants on one stream are the same use. */
static bool has_use(gp_block *b, gp_stream_state *st)
{
    gp_stream_state **uses = gp_block_uses(b);
    for (unsigned i = 0; i < b->use_count; i++)
        if (uses[i]->handle == st->handle)
            return true;
    return false;
}

/* Makes room for one more use; false when host memory is out (nothing changed). */
static bool reserve_use(gp_block *b)
{
    unsigned capacity = b->uses != NULL ? b->use_capacity : GP_BLOCK_INLINE_USES;
    if (b->use_count < capacity)
        return true;
    unsigned grown = capacity * 2;
    gp_stream_state **uses = malloc(grown * sizeof *uses);
    gp_event *events = malloc(grown * sizeof *events);
    if (uses == NULL || events == NULL) {
        free(uses);
        free(events);
        return false;
    }
    memcpy(uses, gp_block_uses(b), b->use_count * sizeof *uses);
    free(b->uses);
    free(b->events);
    b->uses = uses;
    b->events = events;
    b->use_capacity = grown;
    return true;
}

/* Accounts for a LIVE block that stops being live. */
static void retire(gp_pool_state *p, gp_stream_state *owner, gp_block *b)
{
    gp_account(p, owner, -(int64_t)b->size);
    owner->requested_bytes -= b->requested;
    owner->num_frees++;
    owner->kind_frees[b->segment->small]++;
    owner->kind_free_bytes[b->segment->small] += b->size;
    gp_history_note(p, GP_HIST_FREE_REQUESTED, b->addr, b->requested, owner->handle, owner->tenant->index);
}

/*
 * Frees b (LIVE, just removed from owner->live; owner locked) whose last uses are on its recorded
 * streams and on `also` (NULL or a stream other than the owner). Records one event per such stream and
 * queues b as PENDING. On failure nothing has changed: the caller puts b back in the map.
 */
static int free_pending(gp_pool_state *p, gp_stream_state *owner, gp_block *b, gp_stream_state *also)
{
    unsigned before = b->use_count;
    if (also != NULL && also->handle != owner->handle && !has_use(b, also)) {
        if (!reserve_use(b))
            return gp_error_set(GP_ERR_INVALID, "gp_free: out of host memory to record the use on stream %p",
                                also->handle);
        gp_block_uses(b)[b->use_count++] = also;
    }
    gp_stream_state **uses = gp_block_uses(b);
    gp_event *events = gp_block_events(b);
    unsigned recorded = 0;
    int rc = GP_OK;
    for (; recorded < b->use_count; recorded++) {
        rc = gp_event_pool_get(&p->events, &events[recorded]);
        if (rc != GP_OK)
            break;
        rc = p->ops->event_record(p->ctx, events[recorded], uses[recorded]->handle);
        if (rc != GP_OK) {
            gp_event_pool_put(&p->events, events[recorded]);
            break;
        }
    }
    if (rc != GP_OK) {
        for (unsigned i = 0; i < recorded; i++)
            gp_event_pool_put(&p->events, events[i]);
        b->use_count = before;
        gp_error_append(" (gp_free of %p: the block stays allocated; free it again later)", (void *)b->addr);
        return rc;
    }
    retire(p, owner, b);
    /* The owner's fence must cover its own uses, unless the block was borrowed and freed on another
     * stream: then the owner has not used it since the borrow, which waited for its earlier uses. */
    bool owner_used = !b->borrowed || also == NULL || also->handle == owner->handle;
    b->free_seq = owner_used ? gp_heap_free_stamp(gp_heap_of(owner, b->segment->small)) : 0;
    b->borrowed = !owner_used; /* while PENDING: its borrower may take it back (gp_pending_take_back) */
    b->state = GP_BLOCK_PENDING;
    GP_LIST_APPEND(owner->pending, owner->pending_tail, b, list_prev, list_next);
    owner->pending_bytes += b->size;
    atomic_fetch_add_explicit(&owner->pending_count, 1, memory_order_relaxed);
    return GP_OK;
}

int gp_diagnose_pointer(gp_pool_state *p, uintptr_t addr, const char *fn)
{
    gp_segment *seg = p->segments_head;
    while (seg != NULL && !(addr >= seg->addr && addr < seg->addr + seg->size))
        seg = seg->next;
    if (seg == NULL)
        return gp_error_set(GP_ERR_NOT_OWNED, "%s: %p was not allocated by this pool (it lies in none of its %zu segments)",
                            fn, (void *)addr, p->segment_count);
    gp_stream_state *owner = seg->owner;
    gp_stream_lock(owner);
    gp_block *b = seg->first;
    while (b != NULL && !(addr >= b->addr && addr < b->addr + b->size))
        b = b->next;
    assert(b != NULL); /* the blocks tile the segment */
    char size[GP_SIZE_TEXT_MAX];
    gp_format_size(b->size, size);
    int rc;
    if (b->state == GP_BLOCK_UNMAPPED)
        rc = gp_error_set(GP_ERR_NOT_OWNED, "%s: %p lies in an unmapped part of the pool's address range at %p (%s)",
                          fn, (void *)addr, (void *)b->addr, size);
    else if (b->state == GP_BLOCK_LIVE && b->addr != addr)
        rc = gp_error_set(GP_ERR_INTERIOR, "%s: %p points %zu bytes into the live block at %p (%s); pass the block's start",
                          fn, (void *)addr, (size_t)(addr - b->addr), (void *)b->addr, size);
    else if (b->state == GP_BLOCK_LIVE) /* live, but allocated after this call looked for it */
        rc = gp_error_set(GP_ERR_DOUBLE_FREE, "%s: %p was free when the call began (double free racing an allocation)",
                          fn, (void *)addr);
    else /* freed blocks coalesce, so a stale pointer may lie anywhere in a free one */
        rc = gp_error_set(GP_ERR_DOUBLE_FREE, "%s: %p lies in a %s block (at %p, %s): double free", fn, (void *)addr,
                          b->state == GP_BLOCK_PENDING ? "freed (pending)" : "free", (void *)b->addr, size);
    gp_stream_unlock(owner);
    return rc;
}

/* Removes the live block at addr from owner's (locked) map, after returning the blocks owner lent to
 * thread caches when the map misses (a block a thread cache handed out is in that cache's map). */
static gp_block *take_live(gp_pool_state *p, gp_stream_state *owner, uintptr_t addr)
{
    gp_block *b = gp_block_map_remove(&owner->live, addr);
    if (b == NULL && owner->lenders != NULL && gp_thread_cache_return(p, owner))
        b = gp_block_map_remove(&owner->live, addr);
    return b;
}

/* Frees addr if `owner` (not locked) holds it live; GP_ERR_NOT_OWNED if not. */
static int free_from(gp_pool_state *p, gp_stream_state *owner, uintptr_t addr, gp_stream stream,
                     gp_stream_state *user, size_t *requested)
{
    int rc = GP_ERR_NOT_OWNED;
    gp_stream_lock(owner);
    gp_block *b = take_live(p, owner, addr);
    if (b != NULL) {
        *requested = b->requested;
        if ((owner->handle == stream && b->use_count == 0) || atomic_load_explicit(&p->graph_window, memory_order_relaxed)) {
            retire(p, owner, b);
            gp_block_to_heap(p, owner, b);
            rc = GP_OK;
        } else {
            rc = free_pending(p, owner, b, user);
            if (rc != GP_OK)
                gp_block_map_insert(&owner->live, b); /* the slot it left is still there */
        }
    }
    gp_stream_unlock(owner);
    return rc;
}

/*
 * The free of a block that state `st` (NULL: the stream has no state for this thread's tenant) did not
 * allocate: find its owner among all states, those of the same stream (other tenants: a free from a
 * thread without the block's tenant, such as PyTorch's autograd thread) first. On the same stream it is
 * an ordinary free; on another stream its last use is ordered on `stream`. A live block's owner never
 * changes, so each state is searched under its own lock alone; the pool lock is taken only to say why
 * a pointer is not live.
 */
static int free_slow(gp_pool_state *p, uintptr_t addr, gp_stream stream, gp_stream_state *st, size_t *requested)
{
    unsigned count = atomic_load(&p->streams.count);
    gp_stream_state *user = st;
    for (unsigned i = 0; i < count && user == NULL; i++)
        if (p->streams.by_index[i]->handle == stream)
            user = p->streams.by_index[i];
    int rc = GP_ERR_NOT_OWNED;
    for (int same_stream = 1; same_stream >= 0 && rc == GP_ERR_NOT_OWNED; same_stream--)
        for (unsigned i = 0; i < count && rc == GP_ERR_NOT_OWNED; i++) {
            gp_stream_state *owner = p->streams.by_index[i];
            if (owner != st && (owner->handle == stream) == same_stream)
                rc = free_from(p, owner, addr, stream, user, requested);
        }
    if (rc == GP_ERR_NOT_OWNED) {
        gp_pool_lock(p);
        rc = gp_diagnose_pointer(p, addr, "gp_free");
        gp_pool_unlock(p);
    }
    return rc;
}

GP_API int gp_free(gp_pool *pool, void *ptr, gp_stream stream)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_free", &p);
    if (rc != GP_OK || ptr == NULL)
        return rc;
    gp_pool *graph = NULL;
    rc = gp_capture_route(p, stream, "gp_free", &graph);
    if (rc != GP_OK)
        return rc;
    if (graph != NULL) { /* freed during the capture: the graph's block, or one of ours the graph may use */
        rc = gp_free(graph, ptr, stream);
        return rc == GP_ERR_NOT_OWNED ? gp_capture_defer_free(p, ptr, stream) : rc;
    }
    gp_stream_state *st = NULL;
    gp_pool_current_state(p, stream, false, &st);
    if (st == NULL && !gp_stream_seen(&p->streams, stream))
        return gp_error_set(GP_ERR_UNKNOWN_STREAM,
                            "gp_free(%p): stream %p was never used with this pool (allocate or record_stream on it first)",
                            ptr, stream);
    uintptr_t addr = (uintptr_t)ptr;
    size_t requested = 0;
    bool maintain = false;
    gp_block *b = NULL;
    if (st == NULL)
        goto slow;
    if (gp_thread_cache_give(p, st, addr, &requested)) { /* handed out by this thread's cache of st */
        if (p->log != NULL)
            gp_trace_log_event(p->log, GP_TRACE_FREE, addr, requested, stream);
        return GP_OK;
    }
    gp_stream_lock(st);
    b = take_live(p, st, addr);
    if (b != NULL) {
        requested = b->requested;
        if (p->maintains && ++st->frees_since_maintain >= GP_MAINTAIN_FREES) {
            st->frees_since_maintain = 0;
            maintain = true;
        }
        if (b->use_count == 0 || atomic_load_explicit(&p->graph_window, memory_order_relaxed)) {
            retire(p, st, b);
            if (!gp_thread_cache_lend(p, st, b))
                gp_block_to_heap(p, st, b);
        } else {
            rc = free_pending(p, st, b, NULL);
            if (rc != GP_OK)
                gp_block_map_insert(&st->live, b);
        }
    }
    gp_stream_unlock(st);
    if (maintain && gp_pool_trylock(p)) { /* never wait for it on a free */
        int failed;
        gp_maintain_locked(p, &failed);
        gp_pool_unlock(p);
    }
slow:
    if (b == NULL)
        rc = free_slow(p, addr, stream, st, &requested);
    if (rc == GP_ERR_NOT_OWNED && p->capture != NULL) { /* a block of one of this pool's graphs */
        gp_pool *owner = gp_capture_owner(p, ptr);
        if (owner != NULL) {
            rc = gp_free(owner, ptr, stream);
            if (rc == GP_OK)
                gp_capture_after_free(p, owner);
            return rc;
        }
    }
    if (rc == GP_OK && p->log != NULL)
        gp_trace_log_event(p->log, GP_TRACE_FREE, addr, requested, stream);
    return rc;
}

/* The owner of the live block at addr (searched under each stream's own lock: a live block's owner never
 * changes), or NULL. */
static gp_stream_state *owner_of_live(gp_pool_state *p, uintptr_t addr)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *owner = p->streams.by_index[i];
        gp_stream_lock(owner);
        bool found = gp_block_map_find(&owner->live, addr) != NULL;
        if (!found && owner->lenders != NULL && gp_thread_cache_return(p, owner))
            found = gp_block_map_find(&owner->live, addr) != NULL;
        gp_stream_unlock(owner);
        if (found)
            return owner;
    }
    return NULL;
}

/*
 * The pointer is checked before the stream is registered, so that a call that fails leaves no trace
 * (a bad pointer must not use up max_streams); the user's state is then found or added and counted
 * (stream.h), and the block looked up again under its owner's lock, since it may have been freed
 * meanwhile.
 */
GP_API int gp_record_stream(gp_pool *pool, void *ptr, gp_stream stream)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_record_stream", &p);
    if (rc != GP_OK)
        return rc;
    if (ptr == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_record_stream: ptr is NULL");
    gp_pool *graph = NULL;
    rc = gp_capture_route(p, stream, "gp_record_stream", &graph);
    if (rc != GP_OK)
        return rc;
    if (graph != NULL || atomic_load(&p->graph_window))
        return GP_OK; /* a use inside the capture: the graph orders it (see api/capture.c) */
    uintptr_t addr = (uintptr_t)ptr;
    gp_stream_state *owner = owner_of_live(p, addr);
    if (owner != NULL && owner->handle == stream) { /* its own stream: nothing to record, but a */
        gp_stream_lock(owner); /* borrowed block's owner fence must cover it now */
        gp_block *b = gp_block_map_find(&owner->live, addr);
        if (b != NULL)
            b->borrowed = false;
        gp_stream_unlock(owner);
        return GP_OK;
    }
    gp_stream_state *user = NULL;
    if (owner != NULL && (rc = gp_pool_current_state(p, stream, true, &user)) != GP_OK)
        return rc;
    if (owner != NULL) {
        gp_pool_lock(p);
        rc = gp_stream_claim(&p->streams, user);
        gp_pool_unlock(p);
        if (rc != GP_OK)
            return rc;
        gp_stream_lock(owner);
        gp_block *b = gp_block_map_find(&owner->live, addr);
        if (b == NULL && owner->lenders != NULL && gp_thread_cache_return(p, owner))
            b = gp_block_map_find(&owner->live, addr);
        if (b != NULL && !has_use(b, user)) {
            if (reserve_use(b))
                gp_block_uses(b)[b->use_count++] = user;
            else
                rc = gp_error_set(GP_ERR_INVALID, "gp_record_stream: out of host memory for %p", ptr);
        }
        gp_stream_unlock(owner);
        if (b != NULL)
            return rc;
    }
    gp_pool *graph_owner = p->capture != NULL ? gp_capture_owner(p, ptr) : NULL;
    if (graph_owner != NULL)
        return gp_record_stream(graph_owner, ptr, stream);
    gp_pool_lock(p);
    rc = gp_diagnose_pointer(p, addr, "gp_record_stream");
    gp_pool_unlock(p);
    return rc;
}
