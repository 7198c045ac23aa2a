/*
 * heap.h — the free lists of one stream for one kind of segment (small or large): segregated fit
 * with best fit inside a class, splitting to the rounded request, and coalescing on free.
 *
 * Quick lists (deferred coalescing, as dlmalloc's fastbins): a freed block of fewer than
 * GP_QUICK_CLASSES granules goes, whole and without coalescing, on the quick list of its exact size,
 * from which the next request of that size takes it in O(1) with no split; at most GP_QUICK_MAX a list.
 * gp_heap_quick_flush returns them to the free lists (coalescing) before the heap misses, and before
 * anything looks for wholly free segments or pages.
 *
 * Invariant: free_bytes == sum of the sizes of the blocks on the free lists and the quick lists, and
 * bit c of `nonempty` is set exactly when lists[c] is not empty. Callers hold the owning stream's lock.
 */
#ifndef GP_HEAP_H
#define GP_HEAP_H

#include "ds/block.h"
#include "ds/size_class.h"

#define GP_QUICK_CLASSES 16 /* sizes of 1..15 granules (512 B to 7.5 KiB) have quick lists */
#define GP_QUICK_MAX 64     /* blocks one quick list keeps */

typedef struct gp_heap {
    gp_block *lists[GP_CLASS_COUNT];
    uint64_t nonempty[GP_CLASS_WORDS];
    size_t free_bytes;
    size_t free_blocks;
    gp_block *quick[GP_QUICK_CLASSES]; /* singly linked through list_next */
    unsigned quick_count[GP_QUICK_CLASSES];
    size_t quick_blocks;
} gp_heap;

/* A cache of block structs, so that splitting needs no malloc in steady state. */
typedef struct gp_block_cache {
    gp_block *spare; /* singly linked through next */
    size_t count;
} gp_block_cache;

gp_block *gp_block_new(gp_block_cache *cache);            /* NULL when host memory is exhausted */
void gp_block_recycle(gp_block_cache *cache, gp_block *b); /* b must not be on any list */
/* Gives back b's use arrays (more than GP_BLOCK_INLINE_USES streams) and forgets its uses. Called
 * whenever a block stops being LIVE or PENDING, so that only those own heap arrays (gp_check) and
 * a block struct freed anywhere (a released range's last block, say) can leak nothing. */
void gp_block_drop_uses(gp_block *b);
void gp_block_cache_clear(gp_block_cache *cache);

/* Puts a FREE block on its list. */
void gp_heap_insert(gp_heap *heap, gp_block *b);
/* Takes a FREE block off its list. */
void gp_heap_remove(gp_heap *heap, gp_block *b);

/*
 * Finds the best-fitting free block for `size` (rounded), takes it off the lists, splits off the rest
 * (which goes back on the lists) and returns it, still marked FREE for the caller to mark. NULL when no
 * block fits or when a split needs a block struct and host memory is exhausted.
 */
gp_block *gp_heap_take(gp_heap *heap, gp_block_cache *cache, size_t size);
/* The size of the free block gp_heap_take(heap, ..., size) would take (before splitting); 0 when none
 * fits. Quick lists are not looked at. */
size_t gp_heap_fit(gp_heap *heap, size_t size);

/* Frees b (not on any list): coalesces it with FREE neighbours, marks it FREE, puts it on the lists.
 * Returns the resulting block. */
gp_block *gp_heap_release(gp_heap *heap, gp_block_cache *cache, gp_block *b);

/* A QUICK block of exactly `size` bytes, taken off its quick list (still marked QUICK), or NULL. */
static inline gp_block *gp_heap_quick_take(gp_heap *heap, size_t size)
{
    size_t g = size / GP_GRANULE;
    if (g >= GP_QUICK_CLASSES || heap->quick[g] == NULL)
        return NULL;
    gp_block *b = heap->quick[g];
    heap->quick[g] = b->list_next;
    heap->quick_count[g]--;
    heap->quick_blocks--;
    heap->free_bytes -= b->size;
    b->list_next = NULL;
    return b;
}

/* Puts b (freed, on no list) on its quick list; false when b is too large or the list is full. */
bool gp_heap_quick_put(gp_heap *heap, gp_block *b);

/* Returns every QUICK block to the free lists, coalescing. */
void gp_heap_quick_flush(gp_heap *heap, gp_block_cache *cache);

/* gp_check's check of one heap (owner locked): the invariant above, every block on lists[c] FREE, of
 * class c and linked both ways, every block on a quick list QUICK and of its list's size. false with
 * the broken invariant described in why[len]. */
bool gp_heap_check(const gp_heap *heap, char *why, size_t len);

#endif /* GP_HEAP_H */
