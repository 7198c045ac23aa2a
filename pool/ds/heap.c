/*
 * heap.c — free lists indexed by size class (see size_class.h), best fit within a class, splitting
 * and coalescing. No device calls and no locks here: the caller holds its stream's lock.
 */
#include "ds/heap.h"

#include <assert.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/list.h"

gp_block *gp_block_new(gp_block_cache *cache)
{
    gp_block *b = cache->spare;
    if (b != NULL) {
        cache->spare = b->next;
        cache->count--;
    } else {
        b = malloc(sizeof *b);
        if (b == NULL)
            return NULL;
    }
    memset(b, 0, sizeof *b);
    return b;
}

void gp_block_drop_uses(gp_block *b)
{
    free(b->uses);
    free(b->events);
    b->uses = NULL;
    b->events = NULL;
    b->use_count = 0;
    b->use_capacity = 0;
}

void gp_block_recycle(gp_block_cache *cache, gp_block *b)
{
    gp_block_drop_uses(b);
    b->next = cache->spare;
    cache->spare = b;
    cache->count++;
}

void gp_block_cache_clear(gp_block_cache *cache)
{
    while (cache->spare != NULL) {
        gp_block *b = cache->spare;
        cache->spare = b->next;
        free(b);
    }
    cache->count = 0;
}

void gp_heap_insert(gp_heap *heap, gp_block *b)
{
    assert(b->state == GP_BLOCK_FREE);
    unsigned c = gp_size_class(b->size);
    b->size_class = c;
    GP_LIST_PUSH(heap->lists[c], b, list_prev, list_next);
    heap->nonempty[c / 64] |= (uint64_t)1 << (c % 64);
    heap->free_bytes += b->size;
    heap->free_blocks++;
}

void gp_heap_remove(gp_heap *heap, gp_block *b)
{
    assert(b->state == GP_BLOCK_FREE);
    unsigned c = b->size_class;
    assert(b->list_prev != NULL || heap->lists[c] == b); /* b is on this heap's list of its class */
    GP_LIST_REMOVE(heap->lists[c], b, list_prev, list_next);
    if (heap->lists[c] == NULL)
        heap->nonempty[c / 64] &= ~((uint64_t)1 << (c % 64));
    b->list_prev = b->list_next = NULL;
    assert(heap->free_bytes >= b->size && heap->free_blocks > 0);
    heap->free_bytes -= b->size;
    heap->free_blocks--;
}

/* The smallest block of at least `size` in list c (lowest address on ties); exact fits stop early. */
static gp_block *best_in_list(gp_block *b, size_t size)
{
    gp_block *best = NULL;
    for (; b != NULL; b = b->list_next) {
        if (b->size < size)
            continue;
        if (b->size == size)
            return b;
        if (best == NULL || b->size < best->size || (b->size == best->size && b->addr < best->addr))
            best = b;
    }
    return best;
}

/* The first non-empty class above c, or GP_CLASS_COUNT. */
static unsigned next_nonempty(const gp_heap *heap, unsigned c)
{
    unsigned start = c + 1;
    for (unsigned w = start / 64; w < GP_CLASS_WORDS; w++) {
        uint64_t bits = heap->nonempty[w];
        if (w == start / 64)
            bits &= ~(uint64_t)0 << (start % 64);
        if (bits != 0)
            return w * 64 + (unsigned)__builtin_ctzll(bits);
    }
    return GP_CLASS_COUNT;
}

gp_block *gp_heap_best(gp_heap *heap, size_t size)
{
    assert(size > 0 && size % GP_GRANULE == 0);
    unsigned c = gp_size_class(size);
    gp_block *b = best_in_list(heap->lists[c], size);
    if (b == NULL) {
        unsigned up = next_nonempty(heap, c);
        if (up == GP_CLASS_COUNT)
            return NULL;
        b = best_in_list(heap->lists[up], size);
    }
    return b;
}

gp_block *gp_heap_take(gp_heap *heap, gp_block_cache *cache, size_t size)
{
    gp_block *b = gp_heap_best(heap, size);
    return b != NULL ? gp_heap_take_block(heap, cache, b, size) : NULL;
}

gp_block *gp_heap_take_block(gp_heap *heap, gp_block_cache *cache, gp_block *b, size_t size)
{
    assert(b->state == GP_BLOCK_FREE && b->size >= size && size > 0 && size % GP_GRANULE == 0);
    if (b->size > size) {
        gp_block *rest = gp_block_new(cache);
        if (rest == NULL)
            return NULL;
        gp_heap_remove(heap, b);
        rest->addr = b->addr + size;
        rest->size = b->size - size;
        rest->segment = b->segment;
        rest->state = GP_BLOCK_FREE;
        rest->free_since = b->free_since;
        rest->free_seq = b->free_seq;
        rest->prev = b;
        rest->next = b->next;
        if (b->next != NULL)
            b->next->prev = rest;
        b->next = rest;
        b->size = size;
        gp_heap_insert(heap, rest);
    } else {
        gp_heap_remove(heap, b);
    }
    return b;
}

bool gp_heap_quick_put(gp_heap *heap, gp_block *b)
{
    size_t g = b->size / GP_GRANULE;
    if (g >= GP_QUICK_CLASSES || heap->quick_count[g] >= GP_QUICK_MAX)
        return false;
    b->state = GP_BLOCK_QUICK;
    b->quick_epoch = gp_heap_quick_stamp(heap); /* aging (heap.h) */
    b->requested = 0;
    gp_block_drop_uses(b);
    b->list_prev = NULL;
    b->list_next = heap->quick[g];
    heap->quick[g] = b;
    heap->quick_count[g]++;
    heap->quick_blocks++;
    heap->free_bytes += b->size;
    return true;
}

void gp_heap_quick_flush(gp_heap *heap, gp_block_cache *cache)
{
    if (heap->quick_blocks == 0)
        return;
    for (unsigned g = 1; g < GP_QUICK_CLASSES; g++) {
        while (heap->quick[g] != NULL) {
            gp_block *b = gp_heap_quick_take(heap, g * GP_GRANULE);
            gp_heap_release(heap, cache, b);
        }
    }
    assert(heap->quick_blocks == 0);
}

size_t gp_heap_quick_age(gp_heap *heap, gp_block_cache *cache, void (*released)(gp_block *, void *), void *ctx)
{
    unsigned epoch = gp_heap_quick_stamp(heap);
    size_t count = 0;
    for (unsigned g = 1; heap->quick_blocks > 0 && g < GP_QUICK_CLASSES; g++) {
        gp_block **link = &heap->quick[g];
        while (*link != NULL) {
            gp_block *b = *link;
            if (b->quick_epoch == epoch) { /* freed in this epoch: it may still be asked for */
                link = &b->list_next;
                continue;
            }
            *link = b->list_next;
            b->list_next = NULL;
            heap->quick_count[g]--;
            heap->quick_blocks--;
            heap->free_bytes -= b->size;
            gp_block *merged = gp_heap_release(heap, cache, b);
            count++;
            if (released != NULL) /* it touches no QUICK block, so *link stays valid */
                released(merged, ctx);
        }
    }
    heap->quick_epoch = epoch + 1;
    heap->quick_ticks = 0;
    return count;
}

/* Merges `right` (FREE, off the lists) into `left`, which it follows, and recycles it. */
static void absorb(gp_block_cache *cache, gp_block *left, gp_block *right)
{
    assert(left->addr + left->size == right->addr);
    left->size += right->size;
    left->next = right->next;
    if (right->next != NULL)
        right->next->prev = left;
    gp_block_recycle(cache, right);
}

gp_block *gp_heap_release(gp_heap *heap, gp_block_cache *cache, gp_block *b)
{
    assert(b->state != GP_BLOCK_FREE);
    b->state = GP_BLOCK_FREE;
    b->requested = 0;
    gp_block_drop_uses(b);
    uint64_t seq = b->free_seq; /* the merged block's: the latest of its parts', which covers them all */
    /* a neighbour may be lent to a thread cache, its state written by that cache's thread (block.h) */
    if (b->next != NULL && gp_block_state_shared(b->next) == GP_BLOCK_FREE) {
        seq = b->next->free_seq > seq ? b->next->free_seq : seq;
        gp_heap_remove(heap, b->next);
        absorb(cache, b, b->next);
    }
    if (b->prev != NULL && gp_block_state_shared(b->prev) == GP_BLOCK_FREE) {
        gp_block *left = b->prev;
        seq = left->free_seq > seq ? left->free_seq : seq;
        gp_heap_remove(heap, left);
        absorb(cache, left, b);
        b = left;
    }
    if (b->prev == NULL)
        b->segment->first = b;
    b->free_seq = seq;
    gp_heap_insert(heap, b);
    return b;
}

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            snprintf(why, len, __VA_ARGS__);                                                                   \
            return false;                                                                                      \
        }                                                                                                      \
    } while (0)

bool gp_heap_check(const gp_heap *heap, char *why, size_t len)
{
    size_t bytes = 0, blocks = 0, quick = 0;
    for (unsigned c = 0; c < GP_CLASS_COUNT; c++) {
        bool bit = (heap->nonempty[c / 64] >> (c % 64)) & 1;
        CHECK(bit == (heap->lists[c] != NULL), "heap: the nonempty bit of class %u is %d for a list that is %s", c,
              (int)bit, heap->lists[c] != NULL ? "not empty" : "empty");
        for (const gp_block *b = heap->lists[c]; b != NULL; b = b->list_next) {
            CHECK(b->state == GP_BLOCK_FREE && b->size_class == c, "heap: block %p (state %d, class %u) on free list %u",
                  (void *)b->addr, (int)b->state, b->size_class, c);
            CHECK(b->list_next == NULL || b->list_next->list_prev == b, "heap: free list %u is not linked both ways at %p",
                  c, (void *)b->addr);
            bytes += b->size;
            blocks++;
        }
    }
    unsigned epoch = gp_heap_quick_stamp(heap);
    CHECK(heap->quick_ticks < GP_QUICK_MAX, "heap: %u calls since the quick lists last aged (at most %d)",
          heap->quick_ticks, GP_QUICK_MAX - 1);
    for (unsigned g = 0; g < GP_QUICK_CLASSES; g++) {
        unsigned n = 0;
        for (const gp_block *b = heap->quick[g]; b != NULL; b = b->list_next, n++) {
            CHECK(b->state == GP_BLOCK_QUICK && b->size == g * GP_GRANULE, "heap: block %p (state %d, %zu bytes) on "
                  "the quick list of %zu bytes", (void *)b->addr, (int)b->state, b->size, g * GP_GRANULE);
            /* aging released every block of an earlier epoch when it began this one */
            CHECK(b->quick_epoch == epoch || b->quick_epoch + 1 == epoch, "heap: quick block %p was stamped in "
                  "epoch %u, the heap is in epoch %u (aging missed it)", (void *)b->addr, b->quick_epoch, epoch);
            bytes += b->size;
        }
        CHECK(n == heap->quick_count[g], "heap: the quick list of %zu bytes holds %u blocks, counted %u",
              g * GP_GRANULE, n, heap->quick_count[g]);
        quick += n;
    }
    CHECK(blocks == heap->free_blocks && quick == heap->quick_blocks,
          "heap: %zu free and %zu quick blocks listed, counted %zu and %zu", blocks, quick, heap->free_blocks,
          heap->quick_blocks);
    CHECK(bytes == heap->free_bytes, "heap: its lists hold %zu bytes, free_bytes says %zu", bytes, heap->free_bytes);
    return true;
}
