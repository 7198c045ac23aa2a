/*
 * pytorch_policy.c — PyTorch's default and expandable-segments caching-allocator policies replayed on a
 * trace (see pytorch_policy.h for the policies themselves).
 *
 * Data: every block (a piece of a segment, or of a pool's expandable range) is a node of a doubly
 * linked list in address order; in the default policy one list per segment, in the expandable policy
 * one list per pool. Each pool (small or large, per stream) keeps its free blocks in an array sorted by
 * (size, address), so best fit is a binary search for the first block of at least the rounded size,
 * which is also the lowest address among the equally small ones. Invariants after every event:
 *     a block is in its pool's free array exactly when it is free;
 *     no two neighbours in one list are both free (frees coalesce at once);
 *     default:    sum of the block sizes of each segment == that segment's size;
 *     expandable: the blocks of a pool tile [base, end) and end - base == the pool's mapped bytes;
 *     reserved == sum of segment sizes (default) or of mapped bytes (expandable).
 * Addresses are synthetic (segments 1 GiB apart from 2^40 on, expandable pools 2^44 apart): only their
 * order matters, for the lowest-address tie break.
 */
#include "pytorch_policy.h"

#include <assert.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1ull << 20)
#define ROUND_BYTES 512ull           /* kMinBlockSize */
#define SMALL_MAX (1ull * MIB)       /* kSmallSize: requests up to this use the small pool */
#define SMALL_SEGMENT (2ull * MIB)   /* kSmallBuffer */
#define LARGE_SEGMENT (20ull * MIB)  /* kLargeBuffer */
#define MIN_LARGE_ALLOC (10ull * MIB) /* kMinLargeAlloc: below it a large request gets a 20 MiB segment */
#define ROUND_LARGE (2ull * MIB)     /* kRoundLarge */
#define SEGMENT_GAP (1ull << 30)     /* synthetic addresses: room between two segments */
#define FIRST_ADDRESS (1ull << 40)
#define POOL_SPACING (1ull << 44)    /* expandable: each pool's range starts this far from the previous */

typedef struct block {
    uint64_t addr, size;
    struct block *prev, *next; /* neighbours in address order within one segment (or pool range) */
    uint32_t pool;
    bool is_free;
} block;

typedef struct pool {
    block **free;  /* free blocks sorted by (size, addr) */
    size_t num_free, cap_free;
    bool large;
    bool used;     /* expandable: the range has been placed */
    uint64_t base, end; /* expandable: [base, end) is mapped */
    block *last;   /* expandable: the block at the highest address */
} pool;

/* Block nodes come from chunks and are recycled through a free chain (next). */
#define BLOCKS_PER_CHUNK 4096u
typedef struct chunk {
    struct chunk *older;
    block blocks[BLOCKS_PER_CHUNK];
} chunk;

typedef struct policy_state {
    pool *pools;         /* 2 per trace stream: [2 * stream] small, [2 * stream + 1] large */
    size_t num_pools;
    block **slot_block;  /* per trace allocation: its block while live, else NULL */
    chunk *chunks;
    size_t chunk_used;
    block *recycled;
    uint64_t next_addr;  /* default: where the next segment goes */
    uint64_t next_base;  /* expandable: where the next pool's range goes */
    uint64_t reserved, peak_reserved, live, peak_live, device_allocations;
    bool out_of_memory;
} policy_state;

const char *gp_pytorch_policy_name(gp_pytorch_policy policy)
{
    return policy == GP_PYTORCH_EXPANDABLE ? "expandable" : "default";
}

static uint64_t round_size(uint64_t size)
{
    return size < ROUND_BYTES ? ROUND_BYTES : (size + ROUND_BYTES - 1) / ROUND_BYTES * ROUND_BYTES;
}

static uint64_t round_up(uint64_t value, uint64_t unit)
{
    return (value + unit - 1) / unit * unit;
}

/* Default policy: the size of a new segment for a rounded request (get_allocation_size). */
static uint64_t segment_size(uint64_t size)
{
    if (size <= SMALL_MAX)
        return SMALL_SEGMENT;
    if (size < MIN_LARGE_ALLOC)
        return LARGE_SEGMENT;
    return round_up(size, ROUND_LARGE);
}

static block *block_new(policy_state *s, uint64_t addr, uint64_t size, uint32_t pool_index, bool is_free)
{
    block *b = s->recycled;
    if (b != NULL) {
        s->recycled = b->next;
    } else {
        if (s->chunks == NULL || s->chunk_used == BLOCKS_PER_CHUNK) {
            chunk *c = malloc(sizeof *c);
            if (c == NULL) {
                s->out_of_memory = true;
                return NULL;
            }
            c->older = s->chunks;
            s->chunks = c;
            s->chunk_used = 0;
        }
        b = &s->chunks->blocks[s->chunk_used++];
    }
    *b = (block){.addr = addr, .size = size, .pool = pool_index, .is_free = is_free};
    return b;
}

static void block_recycle(policy_state *s, block *b)
{
    b->next = s->recycled;
    s->recycled = b;
}

/* ---- the sorted free array of one pool ---------------------------------------------------------- */

/* Index of the first free block not below (size, addr). */
static size_t free_lower_bound(const pool *p, uint64_t size, uint64_t addr)
{
    size_t lo = 0, hi = p->num_free;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const block *b = p->free[mid];
        if (b->size < size || (b->size == size && b->addr < addr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool free_insert(policy_state *s, pool *p, block *b)
{
    if (p->num_free == p->cap_free) {
        size_t cap = p->cap_free ? p->cap_free * 2 : 64;
        block **grown = realloc(p->free, cap * sizeof *grown);
        if (grown == NULL) {
            s->out_of_memory = true;
            return false;
        }
        p->free = grown;
        p->cap_free = cap;
    }
    size_t i = free_lower_bound(p, b->size, b->addr);
    memmove(&p->free[i + 1], &p->free[i], (p->num_free - i) * sizeof *p->free);
    p->free[i] = b;
    p->num_free++;
    return true;
}

/* Removes b, whose size must still be the one it was inserted with. */
static void free_remove(pool *p, const block *b)
{
    size_t i = free_lower_bound(p, b->size, b->addr);
    assert(i < p->num_free && p->free[i] == b);
    memmove(&p->free[i], &p->free[i + 1], (p->num_free - i - 1) * sizeof *p->free);
    p->num_free--;
}

static void note_reserved(policy_state *s, uint64_t grow)
{
    s->reserved += grow;
    if (s->reserved > s->peak_reserved)
        s->peak_reserved = s->reserved;
}

/* Puts a free block `size` bytes long right after b (which keeps the first `size` bytes). */
static block *split_after(policy_state *s, block *b, uint64_t size)
{
    block *nb = block_new(s, b->addr + size, b->size - size, b->pool, true);
    if (nb == NULL)
        return NULL;
    nb->prev = b;
    nb->next = b->next;
    if (b->next != NULL)
        b->next->prev = nb;
    b->next = nb;
    b->size = size;
    return nb;
}

/* Unlinks b from its list (its neighbours are joined) and recycles it. */
static void unlink_block(policy_state *s, block *b)
{
    if (b->prev != NULL)
        b->prev->next = b->next;
    if (b->next != NULL)
        b->next->prev = b->prev;
    block_recycle(s, b);
}

/* ---- default policy ----------------------------------------------------------------------------- */

static block *default_alloc(policy_state *s, uint32_t pool_index, uint64_t size)
{
    pool *p = &s->pools[pool_index];
    block *b;
    size_t i = free_lower_bound(p, size, 0);
    if (i < p->num_free) {
        b = p->free[i];
        free_remove(p, b);
    } else {
        uint64_t seg = segment_size(size);
        b = block_new(s, s->next_addr, seg, pool_index, false);
        if (b == NULL)
            return NULL;
        s->next_addr += seg + SEGMENT_GAP;
        s->device_allocations++;
        note_reserved(s, seg);
    }
    uint64_t rem = b->size - size;
    bool split = p->large ? rem > SMALL_MAX : rem >= ROUND_BYTES; /* should_split */
    if (split) {
        block *nb = split_after(s, b, size);
        if (nb == NULL || !free_insert(s, p, nb))
            return NULL;
    }
    b->is_free = false;
    return b;
}

static bool default_free(policy_state *s, block *b)
{
    pool *p = &s->pools[b->pool];
    b->is_free = true;
    block *n = b->next;
    if (n != NULL && n->is_free) {
        free_remove(p, n);
        b->size += n->size;
        unlink_block(s, n);
    }
    block *pv = b->prev;
    if (pv != NULL && pv->is_free) {
        free_remove(p, pv);
        pv->size += b->size;
        unlink_block(s, b);
        b = pv;
    }
    return free_insert(s, p, b);
}

/* ---- expandable segments ------------------------------------------------------------------------ */

static block *expandable_alloc(policy_state *s, uint32_t pool_index, uint64_t size)
{
    pool *p = &s->pools[pool_index];
    uint64_t page = p->large ? LARGE_SEGMENT : SMALL_SEGMENT;
    if (!p->used) {
        p->used = true;
        p->base = p->end = s->next_base;
        s->next_base += POOL_SPACING;
    }
    block *b = NULL;
    size_t i = free_lower_bound(p, size, 0);
    if (i < p->num_free) {
        b = p->free[i];
        /* the free block at the mapped end counts as large as it could grow: take another that fits */
        if (b->addr + b->size == p->end && i + 1 < p->num_free)
            b = p->free[i + 1];
    } else {
        /* map just enough pages after the free block at the end (or after the last block) */
        block *tail = p->last != NULL && p->last->is_free ? p->last : NULL;
        uint64_t have = tail != NULL ? tail->size : 0;
        assert(have < size);
        uint64_t grow = round_up(size - have, page);
        note_reserved(s, grow);
        s->device_allocations++;
        if (tail != NULL) {
            free_remove(p, tail);
            tail->size += grow;
            if (!free_insert(s, p, tail))
                return NULL;
            b = tail;
        } else {
            b = block_new(s, p->end, grow, pool_index, true);
            if (b == NULL || !free_insert(s, p, b))
                return NULL;
            b->prev = p->last;
            if (p->last != NULL)
                p->last->next = b;
            p->last = b;
        }
        p->end += grow;
    }
    free_remove(p, b);
    if (b->size - size >= ROUND_BYTES) {
        block *nb = split_after(s, b, size);
        if (nb == NULL || !free_insert(s, p, nb))
            return NULL;
        if (p->last == b)
            p->last = nb;
    }
    b->is_free = false;
    return b;
}

static bool expandable_free(policy_state *s, block *b)
{
    pool *p = &s->pools[b->pool];
    b->is_free = true;
    block *n = b->next;
    if (n != NULL && n->is_free) {
        free_remove(p, n);
        b->size += n->size;
        if (p->last == n)
            p->last = b;
        unlink_block(s, n);
    }
    block *pv = b->prev;
    if (pv != NULL && pv->is_free) {
        free_remove(p, pv);
        pv->size += b->size;
        if (p->last == b)
            p->last = pv;
        unlink_block(s, b);
        b = pv;
    }
    return free_insert(s, p, b);
}

/* ---- the replay --------------------------------------------------------------------------------- */

static void state_free(policy_state *s)
{
    for (size_t i = 0; s->pools != NULL && i < s->num_pools; i++)
        free(s->pools[i].free);
    free(s->pools);
    free(s->slot_block);
    while (s->chunks != NULL) {
        chunk *older = s->chunks->older;
        free(s->chunks);
        s->chunks = older;
    }
}

int gp_pytorch_replay(const gp_trace *trace, gp_pytorch_policy policy, gp_pytorch_result *result, char *err,
                      size_t errlen)
{
    memset(result, 0, sizeof *result);
    policy_state s = {.next_addr = FIRST_ADDRESS, .next_base = 0};
    s.num_pools = 2 * (trace->num_streams ? trace->num_streams : 1);
    s.pools = calloc(s.num_pools, sizeof *s.pools);
    s.slot_block = calloc(trace->num_allocs ? trace->num_allocs : 1, sizeof *s.slot_block);
    if (s.pools == NULL || s.slot_block == NULL) {
        state_free(&s);
        snprintf(err, errlen, "%s: out of host memory", trace->path ? trace->path : "trace");
        return -1;
    }
    for (size_t i = 0; i < s.num_pools; i++)
        s.pools[i].large = (i & 1u) != 0;
    bool expandable = policy == GP_PYTORCH_EXPANDABLE;
    for (size_t e = 0; e < trace->num_events && !s.out_of_memory; e++) {
        const gp_trace_event *ev = &trace->events[e];
        if (ev->kind == GP_EV_ALLOC) {
            uint64_t size = round_size(ev->size);
            uint32_t pool_index = 2u * ev->stream + (size > SMALL_MAX ? 1u : 0u);
            block *b = expandable ? expandable_alloc(&s, pool_index, size) : default_alloc(&s, pool_index, size);
            if (b == NULL)
                break;
            s.slot_block[ev->slot] = b;
            s.live += ev->size;
            if (s.live > s.peak_live)
                s.peak_live = s.live;
        } else if (ev->kind == GP_EV_FREE && s.slot_block[ev->slot] != NULL) {
            block *b = s.slot_block[ev->slot];
            s.slot_block[ev->slot] = NULL;
            s.live -= ev->size;
            if (!(expandable ? expandable_free(&s, b) : default_free(&s, b)))
                break;
        }
    }
    if (s.out_of_memory) {
        state_free(&s);
        snprintf(err, errlen, "%s: out of host memory", trace->path ? trace->path : "trace");
        return -1;
    }
    result->peak_live_bytes = s.peak_live;
    result->peak_reserved_bytes = s.peak_reserved;
    result->end_reserved_bytes = s.reserved;
    result->device_allocations = s.device_allocations;
    result->reserved_over_live = s.peak_live ? (double)s.peak_reserved / (double)s.peak_live : 0.0;
    state_free(&s);
    return 0;
}
