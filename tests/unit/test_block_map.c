/*
 * test_block_map.c — the address -> block map against a brute-force model, including deletions that
 * exercise backward shifting across wrap-around.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "ds/block_map.h"

#define N 5000

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

Test(block_map, matches_a_model_under_random_insert_and_remove)
{
    static gp_block blocks[N];
    static bool present[N];
    gp_block_map map = {0};
    uint64_t rng = 0x1234567;
    for (size_t i = 0; i < N; i++)
        blocks[i].addr = 0x7f0000000000ull + 512 * (i * 8 + i % 7); /* distinct, unevenly spaced */
    for (int step = 0; step < 200000; step++) {
        size_t i = next_random(&rng) % N;
        if (present[i]) {
            cr_assert_eq(gp_block_map_remove(&map, blocks[i].addr), &blocks[i]);
            present[i] = false;
        } else {
            cr_assert(gp_block_map_insert(&map, &blocks[i]));
            present[i] = true;
        }
        if (step % 997 == 0) {
            size_t count = 0;
            for (size_t j = 0; j < N; j++) {
                cr_assert_eq(gp_block_map_find(&map, blocks[j].addr), present[j] ? &blocks[j] : NULL,
                             "block %zu at step %d", j, step);
                count += present[j];
            }
            cr_assert_eq(map.count, count);
            cr_assert(map.count * 2 <= map.capacity);
        }
    }
    cr_assert_null(gp_block_map_remove(&map, 0x1000));
    gp_block_map_free(&map);
}

Test(block_map, empty_map_finds_nothing)
{
    gp_block_map map = {0};
    cr_assert_null(gp_block_map_find(&map, 0x200));
    cr_assert_null(gp_block_map_remove(&map, 0x200));
}
