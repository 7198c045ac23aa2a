/*
 * pending.c — the stream-ordered return of freed blocks: a block freed while other streams still use
 * it is PENDING, with one event recorded on each of them (api/free.c); it goes back to its owner's heap
 * once every event has completed, which is asked here (event_query: never waited for, except at
 * destroy). Owner locked throughout.
 */
#include "provider/capture_window.h"
#include "provider/pending.h"

#include <assert.h>

#include "base/list.h"
#include "provider/pages.h"
#include "provider/thread_cache.h"

/*
 * The streams found busy in one scan of a pending list. Events recorded on one stream complete in the
 * order they were recorded (the stream is a queue), and the list is in the order of the frees that
 * recorded them, so once an event on stream S is not ready, no later block's event on S is: it is not
 * asked (an event query costs a driver call, and one that is not ready an error to clear). A scan
 * that finds more busy streams than it can remember asks the rest as before.
 */
#define GP_BUSY_REMEMBERED 8

typedef struct busy_streams {
    gp_stream handles[GP_BUSY_REMEMBERED];
    unsigned count;
} busy_streams;

static bool known_busy(const busy_streams *busy, gp_stream s)
{
    for (unsigned i = 0; i < busy->count; i++)
        if (busy->handles[i] == s)
            return true;
    return false;
}

/* True when every event of the PENDING block b has completed; completed events go back to the pool.
 * Streams whose event is not ready are added to *busy, and events on streams already there are not
 * asked (above). */
static bool events_done(gp_pool_state *p, gp_block *b, busy_streams *busy)
{
    gp_event *events = gp_block_events(b);
    gp_stream_state **uses = gp_block_uses(b);
    bool done = true;
    for (unsigned i = 0; i < b->use_count; i++) {
        if (events[i] == NULL)
            continue;
        assert(uses[i] != NULL); /* events[i] was recorded on uses[i] (block.h) */
        gp_stream s = uses[i]->handle;
        if (gp_capture_underway() || known_busy(busy, s)) { /* no cudaEventQuery while a graph is captured */
            done = false;
            continue;
        }
        if (p->ops->event_query(p->ctx, events[i]) != GP_OK) { /* not ready, or a failed query: retry later */
            if (busy->count < GP_BUSY_REMEMBERED)
                busy->handles[busy->count++] = s;
            done = false;
            continue;
        }
        gp_event_pool_put(&p->events, events[i]);
        events[i] = NULL;
    }
    return done;
}

void gp_pending_collect(gp_pool_state *p, gp_stream_state *st, unsigned limit)
{
    unsigned scanned = 0;
    busy_streams busy = {.count = 0};
    gp_block *b = st->pending;
    while (b != NULL && (limit == 0 || scanned < limit)) {
        gp_block *next = b->list_next;
        scanned++;
        if (events_done(p, b, &busy)) {
            GP_LIST_UNLINK(st->pending, st->pending_tail, b, list_prev, list_next);
            b->list_prev = b->list_next = NULL;
            st->pending_bytes -= b->size;
            atomic_fetch_sub_explicit(&st->pending_count, 1, memory_order_relaxed);
            gp_block_to_heap(p, st, b);
        }
        b = next;
    }
}

gp_block *gp_pending_take_back(gp_pool_state *p, gp_stream_state *lender, gp_stream_state *taker, size_t size,
                               bool small)
{
    gp_block *b = NULL; /* the smallest that fits */
    for (gp_block *c = lender->pending; c != NULL; c = c->list_next)
        if (c->borrowed && c->size >= size && c->segment->small == small && c->use_count == 1 &&
            gp_block_uses(c)[0]->handle == taker->handle && (b == NULL || c->size < b->size))
            b = c;
    if (b == NULL)
        return NULL;
    gp_event *events = gp_block_events(b);
    bool split = b->size > size;
    if (split) { /* the rest stays PENDING on the same event, in b's place on the list */
        gp_block *rest = gp_block_new(&lender->blocks);
        if (rest == NULL)
            return NULL;
        gp_pages_split(b, size, rest);
        rest->borrowed = true;
        rest->use_count = 1;
        gp_block_uses(rest)[0] = taker;
        gp_block_events(rest)[0] = events[0];
        events[0] = NULL;
        rest->list_prev = b;
        rest->list_next = b->list_next;
        if (b->list_next != NULL)
            b->list_next->list_prev = rest;
        else
            lender->pending_tail = rest;
        b->list_next = rest;
    }
    GP_LIST_UNLINK(lender->pending, lender->pending_tail, b, list_prev, list_next);
    b->list_prev = b->list_next = NULL;
    lender->pending_bytes -= b->size;
    if (!split)
        atomic_fetch_sub_explicit(&lender->pending_count, 1, memory_order_relaxed);
    if (events[0] != NULL) /* recorded on taker, which orders what comes next by itself */
        gp_event_pool_put(&p->events, events[0]);
    events[0] = NULL;
    b->use_count = 0;
    return b;
}

typedef struct aging {
    gp_pool_state *p;
    gp_stream_state *st;
} aging;

/* What gp_block_to_heap does after a release (pending.h). */
static void settle_aged(gp_block *merged, void *ctx)
{
    aging *a = ctx;
    gp_settle_released(a->p, a->st, merged);
}

void gp_quick_age(gp_pool_state *p, gp_stream_state *st, gp_heap *heap)
{
    if (st->lenders != NULL)
        gp_thread_cache_return(p, st);
    aging a = {p, st};
    gp_heap_quick_age(heap, &st->blocks, settle_aged, &a);
}

void gp_collect_all_pending(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        gp_stream_lock(st);
        gp_thread_cache_return(p, st);
        gp_pending_collect(p, st, 0);
        gp_heap_quick_flush(&st->small, &st->blocks);
        gp_heap_quick_flush(&st->large, &st->blocks);
        gp_alias_small_reclaim(p, st); /* pages of the small heap wholly free now go home (alias_small.c) */
        gp_stream_unlock(st);
    }
}

int gp_pending_drain(gp_pool_state *p, gp_stream_state *st)
{
    int failed = GP_OK;
    while (st->pending != NULL) {
        gp_block *b = st->pending;
        gp_event *events = gp_block_events(b);
        for (unsigned i = 0; i < b->use_count; i++) {
            if (events[i] == NULL)
                continue;
            int rc = p->ops->event_synchronize(p->ctx, events[i]);
            if (rc != GP_OK && failed == GP_OK)
                failed = rc;
            gp_event_pool_put(&p->events, events[i]);
            events[i] = NULL;
        }
        /* Back to the heap, as a completed free: what destroy does next (gp_alias_dissolve: homes
         * going FREE coalesce with their neighbours) expects every FREE block on its free list. */
        st->pending = b->list_next;
        b->list_prev = b->list_next = NULL;
        gp_block_to_heap(p, st, b);
    }
    st->pending_tail = NULL;
    st->pending_bytes = 0;
    atomic_store(&st->pending_count, 0);
    return failed;
}
