/*
 * test_heap.c — best fit, splitting to the rounded size, and coalescing, on one fake segment.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "ds/heap.h"

#define MIB ((size_t)1 << 20)

static gp_heap heap;
static gp_block_cache cache;
static gp_segment seg;

static void setup(void)
{
    memset(&heap, 0, sizeof heap);
    memset(&cache, 0, sizeof cache);
    memset(&seg, 0, sizeof seg);
    gp_block *b = gp_block_new(&cache);
    seg.addr = 0x10000000;
    seg.size = 20 * MIB;
    seg.first = b;
    b->addr = seg.addr;
    b->size = seg.size;
    b->segment = &seg;
    b->state = GP_BLOCK_FREE;
    gp_heap_insert(&heap, b);
}

static void teardown(void)
{
    for (gp_block *b = seg.first; b != NULL;) {
        gp_block *next = b->next;
        free(b);
        b = next;
    }
    gp_block_cache_clear(&cache);
}

static gp_block *take(size_t size)
{
    gp_block *b = gp_heap_take(&heap, &cache, size);
    if (b != NULL)
        b->state = GP_BLOCK_LIVE;
    return b;
}

TestSuite(heap, .init = setup, .fini = teardown);

Test(heap, split_consumes_only_the_request)
{
    gp_block *a = take(512);
    cr_assert_eq(a->addr, seg.addr);
    cr_assert_eq(a->size, 512);
    cr_assert_eq(heap.free_bytes, 20 * MIB - 512);
    gp_block *b = take(3 * MIB);
    cr_assert_eq(b->addr, seg.addr + 512);
    cr_assert_eq(heap.free_blocks, 1);
}

Test(heap, free_coalesces_both_neighbours)
{
    gp_block *a = take(MIB), *b = take(MIB), *c = take(MIB);
    gp_heap_release(&heap, &cache, a);
    gp_heap_release(&heap, &cache, c); /* merges with the tail */
    cr_assert_eq(heap.free_blocks, 2);
    gp_block *whole = gp_heap_release(&heap, &cache, b);
    cr_assert_eq(heap.free_blocks, 1);
    cr_assert_eq(whole->addr, seg.addr);
    cr_assert_eq(whole->size, 20 * MIB);
    cr_assert_eq(seg.first, whole);
    cr_assert_null(whole->next);
}

Test(heap, best_fit_prefers_the_smallest_hole)
{
    gp_block *a = take(4 * MIB), *sep1 = take(512), *b = take(2 * MIB), *sep2 = take(512);
    (void)sep1;
    (void)sep2;
    gp_heap_release(&heap, &cache, a); /* 4 MiB hole */
    gp_heap_release(&heap, &cache, b); /* 2 MiB hole */
    uintptr_t hole2 = b->addr;
    gp_block *c = take(2 * MIB - 512);
    cr_assert_eq(c->addr, hole2, "a 2 MiB - 512 request belongs in the 2 MiB hole");
}

Test(heap, exact_fit_reuses_the_same_block)
{
    gp_block *a = take(8192);
    uintptr_t addr = a->addr;
    take(512);
    gp_heap_release(&heap, &cache, a);
    for (int i = 0; i < 100; i++) {
        gp_block *b = take(8192);
        cr_assert_eq(b->addr, addr);
        gp_heap_release(&heap, &cache, b);
    }
}

Test(heap, no_fit_returns_null_and_changes_nothing)
{
    size_t before = heap.free_bytes;
    cr_assert_null(gp_heap_take(&heap, &cache, 21 * MIB));
    cr_assert_eq(heap.free_bytes, before);
}
