/*
 * thread_cache.c — the per-thread cache of small freed blocks (see thread_cache.h for what it holds,
 * its invariant, and why stream ordering and gp_check's exactness survive it).
 */
#include "provider/thread_cache.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/list.h"
#include "ds/heap.h"
#include "provider/pending.h"

_Thread_local gp_thread_cache *gp_tls_thread_cache;
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;
static bool exit_key_ok;
/* Orders thread exit (which returns its blocks to streams) with pool destroy (which frees them). */
static pthread_mutex_t lifetime_lock = PTHREAD_MUTEX_INITIALIZER;

/* Puts b (LENT, from e's list) back on the heap's quick list, keeping the free time of its free; when
 * that list is full (several threads' entries on one stream), on the free lists, coalesced. */
static void to_quick_list(gp_stream_state *st, gp_block *b)
{
    gp_heap *heap = gp_heap_of(st, b->segment->small);
    gp_block_map_unpromise(&st->live);
    b->free_seq = gp_heap_free_stamp(heap); /* no other stream saw it while lent: its free counts now */
    /* The quick list stamps it now, on its way back, with the epoch of its free: an epoch ends only
     * in gp_quick_age, which returns every lender of st first (ds/heap.h), so no cached free costs a
     * stamp. */
    if (gp_heap_quick_put(heap, b))
        return;
    uint64_t since = b->free_since;
    gp_heap_release(heap, &st->blocks, b)->free_since = since;
}

/* Gives everything e holds back to its stream (e->st locked, e->cache locked); see the invariant. */
static void fold(gp_tc_entry *e)
{
    gp_stream_state *st = e->st;
    if (e->live_count > 0) {
        for (unsigned i = 0; i < GP_TC_SLOTS; i++)
            if (e->live[i] != NULL)
                gp_block_map_insert_promised(&st->live, e->live[i]);
        memset(e->live, 0, sizeof e->live);
        e->live_count = 0;
    }
    for (unsigned g = 1; g < GP_TC_CLASSES; g++) {
        /* The list is the top of the quick list's stack, its first block the topmost: reversed, then
         * pushed, it keeps that order (the next allocation of that size gets the same block). */
        gp_block *reversed = NULL;
        while (e->free[g] != NULL) {
            gp_block *b = e->free[g];
            e->free[g] = b->list_next;
            b->list_next = reversed;
            reversed = b;
        }
        while (reversed != NULL) {
            gp_block *b = reversed;
            reversed = b->list_next;
            b->list_next = NULL;
            to_quick_list(st, b); /* its free was noted in the history when it was lent */
        }
    }
    memset(e->count, 0, sizeof e->count);
    memset(e->limit, 0, sizeof e->limit);
    e->lent = 0;
    st->num_allocs += e->kind_allocs[0] + e->kind_allocs[1];
    st->num_frees += e->kind_frees[0] + e->kind_frees[1];
    st->requested_bytes += (size_t)e->requested;
    st->allocated_bytes += e->kind_alloc_bytes[0] + e->kind_alloc_bytes[1] - e->kind_free_bytes[0] - e->kind_free_bytes[1];
    atomic_store_explicit(&st->unflushed,
                          atomic_load_explicit(&st->unflushed, memory_order_relaxed) +
                              atomic_load_explicit(&e->unflushed, memory_order_relaxed),
                          memory_order_relaxed);
    for (unsigned k = 0; k < GP_TC_BUCKETS; k++)
        st->size_class_allocs[k] += e->size_class_allocs[k];
    for (unsigned s = 0; s < 2; s++) {
        st->kind_allocs[s] += e->kind_allocs[s];
        st->kind_frees[s] += e->kind_frees[s];
        st->kind_alloc_bytes[s] += e->kind_alloc_bytes[s];
        st->kind_free_bytes[s] += e->kind_free_bytes[s];
    }
    memset(e->kind_allocs, 0, sizeof e->kind_allocs);
    memset(e->kind_frees, 0, sizeof e->kind_frees);
    memset(e->kind_alloc_bytes, 0, sizeof e->kind_alloc_bytes);
    memset(e->kind_free_bytes, 0, sizeof e->kind_free_bytes);
    e->requested = 0;
    atomic_store_explicit(&e->unflushed, 0, memory_order_relaxed);
    memset(e->size_class_allocs, 0, sizeof e->size_class_allocs);
}

int64_t gp_thread_cache_unflushed(const gp_stream_state *st)
{
    int64_t sum = 0;
    for (const gp_tc_entry *e = st->lenders; e != NULL; e = e->lender_next)
        sum += atomic_load_explicit(&e->unflushed, memory_order_relaxed);
    return sum;
}

gp_block *gp_thread_cache_take_locked(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize)
{
    /* The same take: holding st's lock changes nothing in it (the thread cache's lock comes after a
     * stream lock in the lock order), only what the caller has already done on st. */
    return gp_tc_take(p, st, size, rsize, true);
}

/* Takes e off its stream (e->st locked, e->cache locked, e folded). */
static void detach(gp_tc_entry *e)
{
    assert(e->lent == 0);
    GP_LIST_REMOVE(e->st->lenders, e, lender_prev, lender_next);
    e->lender_prev = e->lender_next = NULL;
    e->st = NULL;
    e->pool = NULL;
    e->pool_serial = 0;
}

bool gp_thread_cache_return(gp_pool_state *p, gp_stream_state *st)
{
    (void)p;
    bool any = false;
    for (gp_tc_entry *e = st->lenders; e != NULL; e = e->lender_next) {
        gp_bl_hold held = gp_tc_lock(e->cache);
        if (e->lent > 0) { /* an entry that lends nothing holds no block and no delta */
            any = true;
            fold(e);
        }
        gp_tc_unlock(e->cache, held);
    }
    return any;
}

static void on_thread_exit(void *arg)
{
    gp_thread_cache *c = arg;
    pthread_mutex_lock(&lifetime_lock); /* no pool is destroyed meanwhile: the streams stay */
    for (unsigned i = 0; i < GP_TC_ENTRIES; i++) {
        gp_tc_entry *e = &c->entries[i];
        gp_bl_hold held = gp_tc_lock(c);
        gp_stream_state *st = e->st;
        gp_tc_unlock(c, held);
        if (st == NULL)
            continue;
        gp_stream_lock(st); /* stream, then cache: the lock order */
        held = gp_tc_lock(c);
        if (e->st == st) {
            fold(e);
            detach(e);
        }
        gp_tc_unlock(c, held);
        gp_stream_unlock(st);
    }
    pthread_mutex_unlock(&lifetime_lock);
    gp_tls_thread_cache = NULL;
    free(c);
}

static void make_exit_key(void)
{
    exit_key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

/* The calling thread's cache, made on first use; NULL when host memory is out. */
static gp_thread_cache *my_cache(void)
{
    if (gp_tls_thread_cache != NULL)
        return gp_tls_thread_cache;
    pthread_once(&exit_key_once, make_exit_key);
    if (!exit_key_ok)
        return NULL;
    gp_thread_cache *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    gp_biased_lock_init(&c->lock);
    for (unsigned i = 0; i < GP_TC_ENTRIES; i++)
        c->entries[i].cache = c;
    if (pthread_setspecific(exit_key, c) != 0) {
        free(c);
        return NULL;
    }
    gp_tls_thread_cache = c;
    return c;
}

/* An entry of c for st (locked; c locked): an unused one, else one taken from another stream when
 * that stream's lock is free right now (trylock: the thread holds st's lock and its own). */
static gp_tc_entry *attach(gp_thread_cache *c, gp_pool_state *p, gp_stream_state *st)
{
    gp_tc_entry *e = NULL;
    for (unsigned i = 0; i < GP_TC_ENTRIES && e == NULL; i++)
        if (c->entries[i].st == NULL)
            e = &c->entries[i];
    if (e == NULL) {
        gp_tc_entry *victim = &c->entries[c->next_victim++ % GP_TC_ENTRIES];
        gp_stream_state *old = victim->st;
        if (!gp_stream_trylock(old))
            return NULL;
        fold(victim);
        detach(victim);
        gp_stream_unlock(old);
        e = victim;
    }
    e->pool = p;
    e->st = st;
    e->pool_serial = p->serial;
    GP_LIST_PUSH(st->lenders, e, lender_prev, lender_next);
    return e;
}

bool gp_thread_cache_lend(gp_pool_state *p, gp_stream_state *st, gp_block *b)
{
    size_t g = b->size / GP_GRANULE;
    /* Pools that maintain count frees on the stream's path (api/free.c): they do not lend. A block
     * whose size is requested from the other kind of heap (small_size under 7.5 KiB) sits on a quick
     * list no request of its size pops: it is not lent either, so the entry's lists are the tops of
     * the very stacks that the requests of their sizes pop. */
    if (g >= GP_TC_CLASSES || p->maintains || !p->cfg.thread_cache || b->use_count != 0 ||
        b->segment->small != (b->size <= p->cfg.small_size))
        return false;
    gp_thread_cache *c = my_cache();
    if (c == NULL)
        return false;
    gp_bl_hold held = gp_tc_lock_own(c);
    gp_tc_entry *e = gp_tc_entry_of(c, p, st);
    if (e == NULL)
        e = attach(c, p, st);
    unsigned quick = gp_heap_of(st, b->segment->small)->quick_count[g];
    bool lent = e != NULL && e->lent < GP_TC_LENT_MAX && e->count[g] < GP_QUICK_MAX - quick &&
                gp_block_map_promise(&st->live);
    if (lent) {
        assert(b->state == GP_BLOCK_LIVE);
        gp_history_note(p, GP_HIST_FREE_COMPLETED, b->addr, b->requested, st->handle, st->tenant->index);
        b->state = GP_BLOCK_LENT;
        b->requested = 0;
        b->free_since = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
        b->list_prev = NULL;
        b->list_next = e->free[g];
        e->free[g] = b;
        e->count[g]++;
        e->limit[g] = (unsigned char)(GP_QUICK_MAX - quick); /* exact now, with st locked */
        e->lent++; /* no stream but its own sees a lent block: its stamp waits for its return */
    }
    gp_tc_unlock(c, held);
    return lent;
}

void gp_thread_cache_destroy_begin(void)
{
    pthread_mutex_lock(&lifetime_lock);
}

void gp_thread_cache_forget(gp_pool_state *p)
{
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        while (st->lenders != NULL) {
            gp_tc_entry *e = st->lenders;
            gp_thread_cache *c = e->cache;
            gp_bl_hold held = gp_tc_lock(c);
            fold(e);
            detach(e);
            gp_tc_unlock(c, held);
        }
    }
}

void gp_thread_cache_destroy_end(void)
{
    pthread_mutex_unlock(&lifetime_lock);
}
