/*
 * heap.h — the free lists of one stream for one kind of segment (small or large): segregated fit
 * with best fit inside a class, splitting to the rounded request, and coalescing on free.
 *
 * Invariant: free_bytes == sum of the sizes of the blocks on the lists, and bit c of `nonempty` is set
 * exactly when lists[c] is not empty. Callers hold the owning stream's lock.
 */
#ifndef GP_HEAP_H
#define GP_HEAP_H

#include "block.h"
#include "size_class.h"

typedef struct gp_heap {
    gp_block *lists[GP_CLASS_COUNT];
    uint64_t nonempty[GP_CLASS_WORDS];
    size_t free_bytes;
    size_t free_blocks;
} gp_heap;

/* A cache of block structs, so that splitting needs no malloc in steady state. */
typedef struct gp_block_cache {
    gp_block *spare; /* singly linked through next */
    size_t count;
} gp_block_cache;

gp_block *gp_block_new(gp_block_cache *cache);            /* NULL when host memory is exhausted */
void gp_block_recycle(gp_block_cache *cache, gp_block *b); /* b must not be on any list */
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

/* Frees b (not on any list): coalesces it with FREE neighbours, marks it FREE, puts it on the lists.
 * Returns the resulting block. */
gp_block *gp_heap_release(gp_heap *heap, gp_block_cache *cache, gp_block *b);

#endif /* GP_HEAP_H */
