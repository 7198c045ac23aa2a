/*
 * block_map.h — an open-addressing hash map from a live block's device address to its metadata.
 *
 * One map per stream holds the blocks allocated from that stream's heaps, so a free on the stream that
 * allocated takes only that stream's lock. Linear probing with backward-shift deletion (no tombstones);
 * the table doubles at 50% load. Invariant: count == number of occupied slots; count <= capacity / 2;
 * (count + promised) * 2 <= capacity once anything was promised.
 *
 * Promised slots are room kept for blocks that left the map but will come back without a chance to
 * fail (blocks lent to a thread cache, provider/thread_cache.h): reserve counts them as taken.
 */
#ifndef GP_BLOCK_MAP_H
#define GP_BLOCK_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/block.h"

typedef struct gp_block_map {
    gp_block **slots;
    size_t capacity; /* a power of two, or 0 before the first insert */
    size_t count;
    size_t promised; /* slots kept for blocks that will be inserted with gp_block_map_insert_promised */
} gp_block_map;

/* Inserts b (keyed by b->addr, which must not be present). Returns false when host memory is out. */
bool gp_block_map_insert(gp_block_map *map, gp_block *b);
/* The block at addr, or NULL. */
gp_block *gp_block_map_find(const gp_block_map *map, uintptr_t addr);
/* Removes and returns the block at addr, or NULL. */
gp_block *gp_block_map_remove(gp_block_map *map, uintptr_t addr);
/* Ensures room for one more insert without growing; false when host memory is out. */
bool gp_block_map_reserve(gp_block_map *map);
void gp_block_map_free(gp_block_map *map);
/* Keeps room for one more block that will come back later (grows if needed); false when host memory
 * is out (nothing changed). */
bool gp_block_map_promise(gp_block_map *map);
/* Inserts b into a slot promised before (cannot fail), or gives a promise back without inserting. */
void gp_block_map_insert_promised(gp_block_map *map, gp_block *b);
static inline void gp_block_map_unpromise(gp_block_map *map)
{
    map->promised--;
}

/* gp_check's check of the map (owner locked): the invariant above, every entry LIVE and found again
 * by its address. false with the broken invariant described in why[len]. */
bool gp_block_map_check(const gp_block_map *map, char *why, size_t len);

#endif /* GP_BLOCK_MAP_H */
