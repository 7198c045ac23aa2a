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
 * Aging the quick lists (as jemalloc's tcache garbage collection). A quick-listed block is free memory
 * that nothing can coalesce with: while it waits, the free space around it stays cut in pieces, and
 * best fit puts the next requests of other sizes into those pieces, wherever the block lies. That is
 * right while its size is asked for again soon (a loop that frees and allocates the same sizes takes
 * it back within a few calls), and wrong after a burst of frees (the end of a step, of a request, of a
 * model's work), which leaves up to GP_QUICK_MAX blocks of every small size scattered over pages that
 * would otherwise be wholly free, so that what is allocated next (often what lives long: the next
 * step's first tensors, a model loaded again) is spread over all those pages and keeps them in use.
 * So the lists age: every freed block is stamped with the heap's quick_epoch, the heap counts its
 * best-fit takes and its releases (quick_ticks: the calls the quick lists did not serve), and after
 * GP_QUICK_MAX of them gp_heap_quick_age releases (coalescing) the quick blocks stamped in an earlier
 * epoch, i.e. those that waited through at least GP_QUICK_MAX such calls without being asked for, and
 * begins the next epoch. The interval is the list's own capacity, not a figure of any workload: a
 * block that outlasts that many other calls is not reuse the list exists for. What is asked for again
 * within an epoch is untouched, so a steady loop keeps its O(1) path. Only calls that take the
 * stream's path count, and the caller returns a stream's thread-cached blocks (the tops of its quick
 * lists, provider/thread_cache.h) before aging, so the cache stays layout-neutral. Which pools age
 * their heaps is the pool's choice (provider/pool_state.h: quick_aging, the pools of pages).
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
    /* Aging (above): the stamp of blocks freed now, and the takes and releases since it began. */
    unsigned quick_epoch;
    unsigned quick_ticks;
    /* The free clock (gp_heap_free_stamp): whoever frees a block that was used stamps it (free_seq)
     * before gp_heap_release or gp_heap_quick_put. It points at the owning stream's counter (both
     * heaps of a stream share one, so that one fence covers both); NULL: own_clock. */
    uint64_t *clock;
    uint64_t own_clock;
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

/* The next stamp of the heap's free clock (heap.h: clock), for a block freed now. */
static inline uint64_t gp_heap_free_stamp(gp_heap *heap)
{
    return ++*(heap->clock != NULL ? heap->clock : &heap->own_clock);
}

/* Puts a FREE block on its list (its free_seq unchanged: a block inserted was free already, or is
 * memory no stream has used). */
void gp_heap_insert(gp_heap *heap, gp_block *b);
/* Takes a FREE block off its list. */
void gp_heap_remove(gp_heap *heap, gp_block *b);

/*
 * Finds the best-fitting free block for `size` (rounded), takes it off the lists, splits off the rest
 * (which goes back on the lists) and returns it, still marked FREE for the caller to mark. NULL when no
 * block fits or when a split needs a block struct and host memory is exhausted.
 */
gp_block *gp_heap_take(gp_heap *heap, gp_block_cache *cache, size_t size);
/* The free block gp_heap_take(heap, ..., size) would take (before splitting), left on its list; NULL
 * when none fits. Quick lists are not looked at. */
gp_block *gp_heap_best(gp_heap *heap, size_t size);
/* gp_heap_take's second half: takes b (FREE, on heap's lists, at least `size` bytes: gp_heap_best's
 * answer) off its list and splits off the rest, which goes back on the lists. NULL, with b left where
 * it was, when the split needs a block struct and host memory is exhausted. */
gp_block *gp_heap_take_block(gp_heap *heap, gp_block_cache *cache, gp_block *b, size_t size);

/* Frees b (not on any list, its free_seq stamped by the caller): coalesces it with FREE neighbours,
 * marks it FREE, puts it on the lists. Returns the resulting block, whose free_seq is the latest of its
 * parts'. */
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

/* Puts b (freed, on no list, its free_seq stamped by the caller) on its quick list; false when b is
 * too large or the list is full. */
bool gp_heap_quick_put(gp_heap *heap, gp_block *b);

/* Returns every QUICK block to the free lists, coalescing. */
void gp_heap_quick_flush(gp_heap *heap, gp_block_cache *cache);

/* The stamp gp_heap_quick_put gives a block it takes now (a thread-cached block gets it when it comes
 * back to its quick list: provider/thread_cache.c). */
static inline unsigned gp_heap_quick_stamp(const gp_heap *heap)
{
    return heap->quick_epoch;
}

/* Counts one call of the heap that its quick lists did not serve (a best-fit take, a release); true
 * when the quick lists are due for aging (the caller returns the stream's thread-cached blocks and
 * calls gp_heap_quick_age). */
static inline bool gp_heap_quick_tick(gp_heap *heap)
{
    return ++heap->quick_ticks >= GP_QUICK_MAX;
}

/* Releases (coalescing) every QUICK block stamped before the current epoch and begins the next one;
 * `released` (or NULL) sees each block a release made, as the caller of gp_heap_release would, and
 * must leave the quick lists alone. Returns the blocks released. */
size_t gp_heap_quick_age(gp_heap *heap, gp_block_cache *cache, void (*released)(gp_block *, void *), void *ctx);

/* gp_check's check of one heap (owner locked): the invariant above, every block on lists[c] FREE, of
 * class c and linked both ways, every block on a quick list QUICK and of its list's size. false with
 * the broken invariant described in why[len]. */
bool gp_heap_check(const gp_heap *heap, char *why, size_t len);

#endif /* GP_HEAP_H */
