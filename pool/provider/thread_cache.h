/*
 * thread_cache.h — a per-thread cache of small freed blocks in front of the stream lock (as
 * jemalloc's tcache and mimalloc's thread-local pages): the cached allocate+free pair on one stream
 * takes no stream lock and touches no shared map.
 *
 * Each thread has up to GP_TC_ENTRIES entries, one per (pool serial, stream state) — the stream state
 * is the (stream, tenant) pair, so the key is pool + stream + tenant. An entry holds blocks LENT to it
 * by its stream, at most GP_TC_LENT_MAX of them, each of fewer than GP_TC_CLASSES granules:
 *   - free ones (state LENT) on a list per exact size, filled when a free on the stream's own path
 *     would have put the block on the stream's quick list, and
 *   - the ones it handed out (state LIVE) in its own address map, which its thread's next free of
 *     that address on that stream finds without the stream lock.
 *
 * Stream ordering. A block lent by stream S reaches only allocations on S by the thread that holds
 * it: it was freed on S with no use on another stream (a free with other uses goes PENDING and is
 * never lent), and later work on S is ordered after the free. Other streams get it only after it went
 * back to S's heap, through the events of the ordinary paths.
 *
 * Layout neutrality: with one thread per stream, the pool makes every decision (which block a request
 * gets, what coalesces when, which segment or page is free, grown, stitched, given back, when the
 * cache cap is reached) exactly as with thread_cache:off, so the cache changes host cost only
 * (tests/api/test_thread_cache_neutral.c makes the same calls both ways). Why: an entry's free
 * blocks are the TOP of S's quick lists, which hold them between returns, not a second store beside
 * them. Without the cache a quick list is a stack per exact size (ds/heap.h), at most GP_QUICK_MAX
 * deep; with it, the entry's list of that size is the upper part of that stack and the heap's quick
 * list the lower part, so
 *   - a free on S pushes on the entry (the top); one the entry cannot take (full, or the two parts
 *     together at GP_QUICK_MAX) takes the stream's path, which returns the lenders first (below);
 *   - an allocation pops the entry first, then the heap's quick list: the same block either way;
 *   - a return (fold) pushes the entry's blocks on the heap's quick list bottom first, so the stack
 *     keeps its order, and it is exact: the two parts never hold more than GP_QUICK_MAX together
 *     (the entry's `limit` of a size is what the heap's part left when the entry last lent, under
 *     S's lock; the heap's part only shrinks until the next return, so the bound holds);
 *   - nothing else pushes on a quick list while lenders hold blocks: gp_block_to_heap returns them
 *     first (a pending free that completes, a free from another thread), so the stack stays whole;
 *   - every reader of what quick-listed blocks are returns the lenders first: a flush before a heap
 *     grows (gp_provider_take), a borrower's look at another stream's free bytes
 *     (provider/vmm_streams.c), a steal fence (a free since its record: the entry's counted frees),
 *     every whole-pool walk and trim;
 *     elsewhere a LENT block is what a QUICK one is to the pool: not FREE (no coalescing with it, no
 *     wholly free segment or page around it);
 *   - a cached allocation is skipped while S has pending frees to query (the stream's path collects
 *     them first, as it would), and blocks keep the free time (free_since) of their free, not their
 *     return;
 *   - the entry's unflushed delta and S's are one accumulator (gp_account_flush, pool_state.h): the
 *     shared total, the peaks and so the cache cap move as with one stream counter.
 * With several threads on one stream each thread's entry is a top of its own, so the order is each
 * thread's; nothing is lost (a return that finds a full quick list coalesces the rest).
 *
 * Invariant (the entry's lock held; all of it holds again for S once its lenders are returned):
 *   lent == blocks on the free lists + blocks in the live map <= GP_TC_LENT_MAX;
 *   count[g] == blocks on free[g] <= limit[g] <= GP_QUICK_MAX - S's heap quick_count[g] (the second
 *   with one thread on S);
 *   S->live.promised >= lent (each lent block keeps a slot of S's map, so returning cannot fail);
 *   S's counters plus the entry's deltas (allocations and frees per heap kind with their bytes,
 *   requested bytes, the unflushed delta, size classes) are what they would be without the cache.
 * The entry's blocks are invisible to the structures of S only between returns: every whole-pool walk
 * (gp_lock_all_streams: stats, gp_check, tenant snapshots, pause, destroy), every collection before a
 * growth or trim (gp_collect_all_pending, gp_provider_take), and every lookup of an address that S's
 * map misses (a free or record_stream from another thread or stream) first returns the lenders of the
 * stream, so stats and gp_check stay exact and no block is out of reach of another thread.
 *
 * Locks: an entry's lock belongs to its whole thread cache (one per thread); its thread takes it on
 * each cached call, others only to return its blocks. It is a biased lock (base/biased_lock.h): its
 * own thread takes it with a plain store and load, no atomic exchange, while others come rarely (a
 * thread that returns another's blocks pays a process-wide memory barrier; while those barriers cost
 * more than the bias saves, as when one thread frees what another allocated every step, the lock is a
 * plain spin lock). Lock order: stream lock, then the thread cache's lock; the thread takes a
 * stream lock while holding its own only by trylock. Thread exit and pool destroy are ordered by one
 * process-wide lock taken before any pool lock.
 */
#ifndef GP_THREAD_CACHE_H
#define GP_THREAD_CACHE_H

#include <assert.h>
#include <stdbool.h>

#include "base/biased_lock.h"
#include "provider/pool_state.h"

#include <stdatomic.h>
#include <stdint.h>

#define GP_TC_CLASSES 16  /* blocks of 1..15 granules (512 B to 7.5 KiB), as the quick lists */
#define GP_TC_LENT_MAX 64 /* blocks one entry holds, free and handed out together */
#define GP_TC_SLOTS (2 * GP_TC_LENT_MAX) /* the live map: a power of two, never more than half full */
#define GP_TC_ENTRIES 4   /* (pool, stream, tenant) keys one thread caches at once */
#define GP_TC_BUCKETS 6   /* requests below GP_TC_CLASSES granules fall in the first stats buckets */
_Static_assert(GP_TC_CLASSES == GP_QUICK_CLASSES, "an entry's lists are the tops of the quick lists");
_Static_assert(GP_QUICK_MAX <= 255, "count and limit are bytes");

typedef struct gp_tc_entry {
    struct gp_thread_cache *cache;
    gp_pool_state *pool; /* NULL with st: the entry is unused */
    gp_stream_state *st;
    uint64_t pool_serial;
    struct gp_tc_entry *lender_prev, *lender_next; /* st->lenders, under st's lock */
    gp_block *free[GP_TC_CLASSES]; /* LENT blocks of g granules, through list_next: a stack's top */
    unsigned char count[GP_TC_CLASSES]; /* blocks on free[g] */
    unsigned char limit[GP_TC_CLASSES]; /* the most free[g] may hold: the quick list's room at the last lend */
    unsigned lent;                 /* see the invariant above */
    gp_block *live[GP_TC_SLOTS];   /* the blocks it handed out, by address (linear probing) */
    unsigned live_count;
    /* What st's counters lack (added to them when the entry returns its blocks): allocations and
     * frees per heap kind ([segment->small]) and their rounded bytes, from which the counts and the
     * allocated delta follow; requested bytes; the allocated delta not yet in the pool's shared total. */
    uint64_t kind_allocs[2], kind_frees[2], kind_alloc_bytes[2], kind_free_bytes[2];
    int64_t requested;
    _Atomic(int64_t) unflushed; /* written under the cache's lock, read by S's lock holders (relaxed) */
    uint64_t size_class_allocs[GP_TC_BUCKETS];
} gp_tc_entry;

typedef struct gp_thread_cache {
    gp_biased_lock lock; /* its thread's on each call (the fast way), others' to return its blocks */
    unsigned next_victim;
    gp_tc_entry entries[GP_TC_ENTRIES];
} gp_thread_cache;

/* The calling thread's cache (NULL until its first lend). */
extern _Thread_local gp_thread_cache *gp_tls_thread_cache;

/* The calling thread's own cache (c == gp_tls_thread_cache, which every caller has just read),
 * locked: its thread's fast path (biased_lock.h). */
static inline gp_bl_hold gp_tc_lock_own(gp_thread_cache *c)
{
    gp_order_lock(GP_RANK_THREAD_CACHE, 0); /* the lock order (base/lock_order.h), in builds with asserts */
    return gp_biased_lock_take_owner(&c->lock);
}

/* Any thread's cache c, locked: its owner's way when the caller is its thread, else another's. */
static inline gp_bl_hold gp_tc_lock(gp_thread_cache *c)
{
    gp_order_lock(GP_RANK_THREAD_CACHE, 0);
    if (c == gp_tls_thread_cache)
        return gp_biased_lock_take_owner(&c->lock);
    gp_biased_lock_take_other(&c->lock);
    return GP_BL_OTHER;
}

static inline void gp_tc_unlock(gp_thread_cache *c, gp_bl_hold how)
{
    gp_biased_lock_drop(&c->lock, how);
    gp_order_unlock(GP_RANK_THREAD_CACHE, 0);
}

/* c's entry for st of p, or NULL (c locked). */
static inline gp_tc_entry *gp_tc_entry_of(gp_thread_cache *c, const gp_pool_state *p, const gp_stream_state *st)
{
    for (unsigned i = 0; i < GP_TC_ENTRIES; i++) {
        gp_tc_entry *e = &c->entries[i];
        if (e->st == st && e->pool_serial == p->serial)
            return e;
    }
    return NULL;
}

/* The live map's home slot of addr (512-aligned: the low bits say nothing). */
static inline unsigned gp_tc_home(uintptr_t addr)
{
    return (unsigned)((addr >> 9) ^ (addr >> 16)) & (GP_TC_SLOTS - 1);
}

static inline void gp_tc_live_insert(gp_tc_entry *e, gp_block *b)
{
    unsigned s = gp_tc_home(b->addr);
    while (e->live[s] != NULL)
        s = (s + 1) & (GP_TC_SLOTS - 1);
    e->live[s] = b;
    e->live_count++;
}

/* Removes and returns the block at addr, or NULL; the backward shift keeps every probe run whole. */
static inline gp_block *gp_tc_live_remove(gp_tc_entry *e, uintptr_t addr)
{
    unsigned s = gp_tc_home(addr);
    while (e->live[s] != NULL && e->live[s]->addr != addr)
        s = (s + 1) & (GP_TC_SLOTS - 1);
    gp_block *found = e->live[s];
    if (found == NULL)
        return NULL;
    unsigned hole = s;
    for (unsigned next = (hole + 1) & (GP_TC_SLOTS - 1); e->live[next] != NULL; next = (next + 1) & (GP_TC_SLOTS - 1)) {
        unsigned home = gp_tc_home(e->live[next]->addr);
        bool movable = hole <= next ? (home <= hole || home > next) : (home <= hole && home > next);
        if (movable) {
            e->live[hole] = e->live[next];
            hole = next;
        }
    }
    e->live[hole] = NULL;
    e->live_count--;
    return found;
}

/* Adds `bytes` allocated (or freed) on st to its entry e as gp_account does to a stream (pool_state.h):
 * the entry's unflushed delta and st's are one accumulator (gp_account_flush), so the shared total and
 * the peaks move exactly as they would without the cache when one thread uses the stream. An
 * allocation can only reach the upper bound and a free the lower one (the sum was inside both).
 * `st_locked`: the caller holds st's lock (the stream's path), which a new peak's count then need not
 * try (gp_allocated_peak_candidate). */
static inline void gp_tc_account_alloc(gp_pool_state *p, gp_stream_state *st, gp_tc_entry *e, size_t bytes,
                                       bool st_locked)
{
    int64_t mine = atomic_load_explicit(&e->unflushed, memory_order_relaxed) + (int64_t)bytes;
    int64_t others = atomic_load_explicit(&st->unflushed, memory_order_relaxed);
    int64_t total = atomic_load_explicit(&p->allocated_flushed, memory_order_relaxed) + mine + others;
    if (mine + others >= GP_FLUSH_BYTES)
        total = gp_account_flush(p, &mine, others);
    atomic_store_explicit(&e->unflushed, mine, memory_order_relaxed);
    total = gp_allocated_peak_candidate(p, st_locked ? st : NULL, total);
    gp_raise_peak(&p->allocated_peak, (size_t)total);
    gp_raise_peak(&p->window_peak, (size_t)total);
}

static inline void gp_tc_account_free(gp_pool_state *p, gp_stream_state *st, gp_tc_entry *e, size_t bytes)
{
    int64_t mine = atomic_load_explicit(&e->unflushed, memory_order_relaxed) - (int64_t)bytes;
    int64_t others = atomic_load_explicit(&st->unflushed, memory_order_relaxed);
    if (mine + others <= -GP_FLUSH_BYTES)
        gp_account_flush(p, &mine, others);
    atomic_store_explicit(&e->unflushed, mine, memory_order_relaxed);
}

/* The entry's block of exactly rsize bytes for a request of `size` on st, handed out (LIVE), or NULL
 * (c locked; st too where st_locked). */
static inline gp_block *gp_tc_pop(gp_pool_state *p, gp_stream_state *st, gp_tc_entry *e, size_t g, size_t size,
                                  bool st_locked)
{
    gp_block *b = e->free[g];
    assert(b->state == GP_BLOCK_LENT && b->size == g * GP_GRANULE && b->use_count == 0);
    e->free[g] = b->list_next;
    e->count[g]--;
    b->list_next = NULL;
    gp_block_set_state_shared(b, GP_BLOCK_LIVE); /* without st's lock: block.h */
    b->requested = size;
    gp_tc_live_insert(e, b);
    bool kind = b->segment->small;
    e->kind_allocs[kind]++;
    e->kind_alloc_bytes[kind] += b->size;
    e->requested += (int64_t)size;
    e->size_class_allocs[gp_stats_bucket(size)]++; /* < GP_TC_BUCKETS: size < 8 KiB */
    gp_tc_account_alloc(p, st, e, b->size, st_locked);
    gp_history_note(p, GP_HIST_ALLOC, b->addr, size, st->handle, st->tenant->index);
    return b;
}

/* gp_thread_cache_take, where the caller holds st's lock or not (st_locked). */
static inline gp_block *gp_tc_take(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize, bool st_locked)
{
    gp_thread_cache *c = gp_tls_thread_cache;
    size_t g = rsize / GP_GRANULE;
    if (c == NULL || g >= GP_TC_CLASSES)
        return NULL;
    gp_bl_hold held = gp_tc_lock_own(c);
    gp_tc_entry *e = gp_tc_entry_of(c, p, st);
    gp_block *b = e != NULL && e->free[g] != NULL ? gp_tc_pop(p, st, e, g, size, st_locked) : NULL;
    gp_tc_unlock(c, held);
    return b;
}

/* A LIVE block handed out by the calling thread's entry for st (rsize bytes), accounted as an
 * allocation of `size` bytes on st; NULL when the entry has none of that size. Not called while st has
 * pending frees that its allocations query first (api/alloc.c): the stream's path collects them, then
 * calls gp_thread_cache_take_locked, so the blocks come in the order they would without the cache. */
static inline gp_block *gp_thread_cache_take(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize)
{
    return gp_tc_take(p, st, size, rsize, false);
}

/* gp_thread_cache_take on the stream's path (st locked, its pending frees collected): the top of the
 * quick list of rsize, when the calling thread's entry holds it. */
gp_block *gp_thread_cache_take_locked(gp_pool_state *p, gp_stream_state *st, size_t size, size_t rsize);

/* Frees the block at addr if the calling thread's entry for st handed it out and the stack of its
 * size has room: true, with its requested size in *requested; false (nothing changed) otherwise (the
 * stream's path frees it, after returning the entry). */
static inline bool gp_thread_cache_give(gp_pool_state *p, gp_stream_state *st, uintptr_t addr, size_t *requested)
{
    gp_thread_cache *c = gp_tls_thread_cache;
    if (c == NULL)
        return false;
    gp_bl_hold held = gp_tc_lock_own(c);
    gp_tc_entry *e = gp_tc_entry_of(c, p, st);
    gp_block *b = e != NULL && e->live_count > 0 ? gp_tc_live_remove(e, addr) : NULL;
    size_t g = b != NULL ? b->size / GP_GRANULE : 0;
    if (b != NULL && e->count[g] >= e->limit[g]) { /* the stack of its size is full: the stream's path coalesces it */
        gp_tc_live_insert(e, b);
        b = NULL;
    }
    if (b != NULL) {
        /* No use on another stream: record_stream finds the block only after the entry returned it. */
        assert(b->use_count == 0);
        *requested = b->requested;
        bool kind = b->segment->small;
        e->kind_frees[kind]++;
        e->kind_free_bytes[kind] += b->size;
        e->requested -= (int64_t)b->requested;
        gp_tc_account_free(p, st, e, b->size);
        if (atomic_load_explicit(&p->history_on, memory_order_relaxed)) {
            /* requested and completed at once: the next allocation on st may reuse it */
            gp_history_note(p, GP_HIST_FREE_REQUESTED, b->addr, b->requested, st->handle, st->tenant->index);
            gp_history_note(p, GP_HIST_FREE_COMPLETED, b->addr, b->requested, st->handle, st->tenant->index);
        }
        b->requested = 0;
        gp_block_set_state_shared(b, GP_BLOCK_LENT); /* without st's lock: block.h */
        b->free_since = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
        b->list_next = e->free[g];
        e->free[g] = b;
        e->count[g]++;
    }
    gp_tc_unlock(c, held);
    return b != NULL;
}

/* Offers b (just freed on st's own stream with no other use, retired, on no list; st locked) to the
 * calling thread's entry for st, as the top of the quick list of its size. false: not taken (too
 * large, not of the heap its size's requests use, the entry or that quick list full, no entry, host
 * memory out): the caller puts it in st's heap (gp_block_to_heap, which returns the lenders first). */
bool gp_thread_cache_lend(gp_pool_state *p, gp_stream_state *st, gp_block *b);

/* Returns every block lent by st (locked) to any thread: live ones to st's map, free ones to its heap,
 * the entries' deltas to st's counters. True when anything came back. */
bool gp_thread_cache_return(gp_pool_state *p, gp_stream_state *st);

/* Pool destroy: gp_thread_cache_destroy_begin before the pool lock (it orders destroy with thread
 * exit); gp_thread_cache_forget with every stream locked (after the returns of gp_lock_all_streams)
 * detaches every entry of the pool; gp_thread_cache_destroy_end when the pool is gone. */
void gp_thread_cache_destroy_begin(void);
void gp_thread_cache_forget(gp_pool_state *p);
void gp_thread_cache_destroy_end(void);

#endif /* GP_THREAD_CACHE_H */
