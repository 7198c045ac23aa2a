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

/* Puts b (LIVE) on its quick list as a free on its stream's path does (the list stamps it). */
static void quick_free(gp_block *b)
{
    cr_assert(gp_heap_quick_put(&heap, b));
}

static void assert_heap_checks(void)
{
    char why[256] = "";
    cr_assert(gp_heap_check(&heap, why, sizeof why), "%s", why);
}

Test(heap, aging_releases_only_quick_blocks_of_an_earlier_epoch)
{
    /* live separators keep the quick blocks apart, so each release shows as its own free block */
    gp_block *old[3], *young[2], *sep[5];
    for (int i = 0; i < 3; i++) {
        old[i] = take(4096);
        sep[i] = take(512);
    }
    for (int i = 0; i < 2; i++) {
        young[i] = take(4096);
        sep[3 + i] = take(512);
    }
    for (int i = 0; i < 3; i++)
        quick_free(old[i]);
    unsigned first = gp_heap_quick_stamp(&heap);
    cr_assert_eq(gp_heap_quick_age(&heap, &cache, NULL, NULL), 0, "blocks of the current epoch wait");
    cr_assert_eq(gp_heap_quick_stamp(&heap), first + 1);
    for (int i = 0; i < 2; i++)
        quick_free(young[i]);
    size_t free_blocks = heap.free_blocks, free_bytes = heap.free_bytes;
    assert_heap_checks();

    cr_assert_eq(gp_heap_quick_age(&heap, &cache, NULL, NULL), 3, "the three of the epoch before go back");
    cr_assert_eq(heap.quick_blocks, 2);
    cr_assert_eq(heap.quick_count[4096 / GP_GRANULE], 2);
    cr_assert_eq(heap.free_blocks, free_blocks + 3, "each is a free block of its own between live ones");
    cr_assert_eq(heap.free_bytes, free_bytes, "free bytes move from the quick lists to the free lists");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(old[i]->state, GP_BLOCK_FREE);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(young[i]->state, GP_BLOCK_QUICK);
    assert_heap_checks();

    /* a released block coalesces: freeing its separator makes one hole of both */
    gp_block *merged = gp_heap_release(&heap, &cache, sep[0]);
    cr_assert_eq(merged->addr, old[0]->addr);
    cr_assert_geq(merged->size, 4096 + 512 + 4096);
    cr_assert_eq(gp_heap_quick_age(&heap, &cache, NULL, NULL), 2);
    cr_assert_eq(heap.quick_blocks, 0);
    assert_heap_checks();
}

Test(heap, a_quick_block_taken_back_within_its_epoch_never_ages)
{
    gp_block *a = take(2048);
    take(512);
    uintptr_t addr = a->addr;
    for (int round = 0; round < 10; round++) {
        quick_free(a);
        for (int i = 0; i < GP_QUICK_MAX - 1; i++)
            cr_assert_not(gp_heap_quick_tick(&heap), "due only after GP_QUICK_MAX calls");
        a = gp_heap_quick_take(&heap, 2048);
        cr_assert_not_null(a);
        cr_assert_eq(a->addr, addr, "the same block comes back from its quick list");
        a->state = GP_BLOCK_LIVE;
        cr_assert(gp_heap_quick_tick(&heap));
        cr_assert_eq(gp_heap_quick_age(&heap, &cache, NULL, NULL), 0);
    }
    assert_heap_checks();
}

Test(heap, check_names_a_quick_block_that_aging_missed)
{
    gp_block *a = take(1024);
    take(512);
    quick_free(a);
    a->quick_epoch = gp_heap_quick_stamp(&heap) - 2; /* older than any aging leaves */
    char why[256] = "";
    cr_assert_not(gp_heap_check(&heap, why, sizeof why));
    cr_assert(strstr(why, "aging missed it") != NULL, "%s", why);
}
