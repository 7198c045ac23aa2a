/*
 * block_map.c — address -> live block, linear probing with backward-shift deletion.
 */
#include "ds/block_map.h"


#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

static inline size_t slot_of(uintptr_t addr, size_t capacity)
{
    /* Addresses are 512-aligned: drop those bits, then multiply by 2^64/phi to spread them. */
    return (size_t)(((uint64_t)(addr >> 9) * 0x9E3779B97F4A7C15ull) >> 17) & (capacity - 1);
}

static bool grow(gp_block_map *map)
{
    size_t capacity = map->capacity ? map->capacity * 2 : 64;
    gp_block **slots = calloc(capacity, sizeof *slots);
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < map->capacity; i++) {
        gp_block *b = map->slots[i];
        if (b == NULL)
            continue;
        size_t s = slot_of(b->addr, capacity);
        while (slots[s] != NULL)
            s = (s + 1) & (capacity - 1);
        slots[s] = b;
    }
    free(map->slots);
    map->slots = slots;
    map->capacity = capacity;
    return true;
}

bool gp_block_map_reserve(gp_block_map *map)
{
    while ((map->count + map->promised + 1) * 2 > map->capacity)
        if (!grow(map))
            return false;
    return true;
}

bool gp_block_map_promise(gp_block_map *map)
{
    if (!gp_block_map_reserve(map))
        return false;
    map->promised++;
    return true;
}

void gp_block_map_insert_promised(gp_block_map *map, gp_block *b)
{
    assert(map->promised > 0);
    map->promised--;
    bool inserted = gp_block_map_insert(map, b); /* room was kept: no growth, no failure */
    assert(inserted);
    (void)inserted;
}

bool gp_block_map_insert(gp_block_map *map, gp_block *b)
{
    if (!gp_block_map_reserve(map))
        return false;
    size_t s = slot_of(b->addr, map->capacity);
    while (map->slots[s] != NULL) {
        assert(map->slots[s]->addr != b->addr);
        s = (s + 1) & (map->capacity - 1);
    }
    map->slots[s] = b;
    map->count++;
    return true;
}

gp_block *gp_block_map_find(const gp_block_map *map, uintptr_t addr)
{
    if (map->capacity == 0)
        return NULL;
    for (size_t s = slot_of(addr, map->capacity);; s = (s + 1) & (map->capacity - 1)) {
        gp_block *b = map->slots[s];
        if (b == NULL || b->addr == addr)
            return b;
    }
}

gp_block *gp_block_map_remove(gp_block_map *map, uintptr_t addr)
{
    if (map->capacity == 0)
        return NULL;
    size_t mask = map->capacity - 1;
    size_t s = slot_of(addr, map->capacity);
    while (map->slots[s] != NULL && map->slots[s]->addr != addr)
        s = (s + 1) & mask;
    gp_block *found = map->slots[s];
    if (found == NULL)
        return NULL;
    /* Backward shift: pull later entries of the probe run into the hole when that keeps them
     * reachable from their home slot. */
    size_t hole = s;
    for (size_t next = (hole + 1) & mask; map->slots[next] != NULL; next = (next + 1) & mask) {
        size_t home = slot_of(map->slots[next]->addr, map->capacity);
        bool movable = hole <= next ? (home <= hole || home > next) : (home <= hole && home > next);
        if (movable) {
            map->slots[hole] = map->slots[next];
            hole = next;
        }
    }
    map->slots[hole] = NULL;
    map->count--;
    return found;
}

void gp_block_map_free(gp_block_map *map)
{
    free(map->slots);
    map->slots = NULL;
    map->capacity = map->count = map->promised = 0;
}

bool gp_block_map_check(const gp_block_map *map, char *why, size_t len)
{
    size_t occupied = 0;
    for (size_t i = 0; i < map->capacity; i++) {
        const gp_block *b = map->slots[i];
        if (b == NULL)
            continue;
        occupied++;
        if (b->state != GP_BLOCK_LIVE || gp_block_map_find(map, b->addr) != b) {
            snprintf(why, len, "block map: slot %zu holds block %p (state %d), which a lookup does not find", i,
                     (void *)b->addr, (int)b->state);
            return false;
        }
    }
    if (occupied != map->count || (map->capacity != 0 && map->count > map->capacity / 2)) {
        snprintf(why, len, "block map: %zu occupied slots, count %zu, capacity %zu", occupied, map->count,
                 map->capacity);
        return false;
    }
    return true;
}
