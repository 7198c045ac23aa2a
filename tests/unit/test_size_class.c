/*
 * test_size_class.c — rounding and the size-class scheme of size_class.h.
 */
#include <criterion/criterion.h>
#include <stdint.h>

#include "ds/size_class.h"

Test(size_class, rounding_to_granule)
{
    cr_assert_eq(gp_round_granule(1), 512);
    cr_assert_eq(gp_round_granule(512), 512);
    cr_assert_eq(gp_round_granule(513), 1024);
    cr_assert_eq(gp_round_granule(SIZE_MAX), 0, "overflow must be reported as 0");
    cr_assert_eq(gp_round_granule(SIZE_MAX - 510), 0);
    cr_assert_eq(gp_round_granule(SIZE_MAX - 511), SIZE_MAX - 511, "already a multiple of 512");
    cr_assert_eq(gp_round_up(3 << 20, GP_DEVICE_PAGE), 4 << 20);
}

Test(size_class, classes_are_monotonic_and_bases_invert)
{
    unsigned last = 0;
    for (size_t g = 1; g < (1u << 20); g++) {
        size_t size = g * GP_GRANULE;
        unsigned c = gp_size_class(size);
        cr_assert(c >= last, "class of %zu went down", size);
        cr_assert(c < GP_CLASS_COUNT);
        cr_assert(gp_size_class_base(c) <= size, "base of class %u above %zu", c, size);
        cr_assert(gp_size_class_base(c + 1) > size, "size %zu belongs to class %u+1", size, c);
        last = c;
    }
}

Test(size_class, spread_within_a_class_is_at_most_an_eighth)
{
    for (unsigned c = GP_CLASS_LINEAR; c + 1 < GP_CLASS_COUNT; c++) {
        size_t lo = gp_size_class_base(c), hi = gp_size_class_base(c + 1);
        cr_assert(hi > lo);
        cr_assert((hi - lo) * 8 <= lo, "class %u spans [%zu, %zu)", c, lo, hi);
    }
}

Test(size_class, largest_sizes_have_a_class)
{
    cr_assert_eq(gp_size_class(SIZE_MAX & ~(GP_GRANULE - 1)), GP_CLASS_COUNT - 1);
}

Test(size_class, stats_buckets)
{
    cr_assert_eq(gp_stats_bucket(1), 0);
    cr_assert_eq(gp_stats_bucket(511), 0);
    cr_assert_eq(gp_stats_bucket(512), 1);
    cr_assert_eq(gp_stats_bucket(1023), 1);
    cr_assert_eq(gp_stats_bucket(1024), 2);
    cr_assert(gp_stats_bucket(SIZE_MAX) < 64);
}
