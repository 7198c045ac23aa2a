/*
 * test_working_set.c — the decision behind empty_cache:working-set (pool/policy/working_set.c): the
 * window of the last GP_WORKING_SET_CALLS calls, the age it gives back before, and the bytes kept on
 * virtual memory (window peak x the ratio the last growing interval showed).
 */
#include <criterion/criterion.h>
#include <stdint.h>

#include "policy/working_set.h"

Test(working_set, nothing_goes_back_until_the_window_is_full_then_the_oldest_call_bounds_it)
{
    gp_working_set ws = {0};
    for (unsigned i = 0; i < GP_WORKING_SET_CALLS; i++)
        cr_assert_eq(gp_working_set_call(&ws, 100 + i, 0), 0, "call %u: the window is not full yet", i);
    cr_assert_eq(gp_working_set_call(&ws, 200, 0), 100, "memory freed before the oldest call counted goes back");
    cr_assert_eq(gp_working_set_call(&ws, 201, 0), 101);
}

Test(working_set, keep_is_the_window_peak_times_the_larger_of_slack_and_need)
{
    gp_working_set ws = {0};
    for (unsigned i = 0; i < GP_WORKING_SET_CALLS - 1; i++)
        gp_working_set_call(&ws, 1 + i, i == 2 ? 1000 : 100);
    cr_assert_eq(gp_working_set_keep(&ws, 0.0, 0), SIZE_MAX, "keep everything before the window is full");
    gp_working_set_call(&ws, 50, 100);
    cr_assert_eq(gp_working_set_bytes(&ws), 1000, "the highest interval of the window");
    cr_assert_eq(gp_working_set_keep(&ws, 0.5, 400), 1100, "1.5 x 1000 - 400 allocated");
    cr_assert_eq(gp_working_set_keep(&ws, -1.0, 400), 600, "slack off counts as 0");
    gp_working_set_note_growth(&ws, 7, 3000, 1000); /* the pool grew: it needs 3 bytes per allocated */
    cr_assert_eq(gp_working_set_keep(&ws, 0.5, 400), 2600);
    gp_working_set_note_growth(&ws, 7, 100, 1000); /* no growth since: the ratio stays */
    cr_assert_eq(gp_working_set_keep(&ws, 0.5, 400), 2600);
    cr_assert_eq(gp_working_set_keep(&ws, 0.5, 5000), 0, "more allocated than the window needs: keep nothing cached");
    for (unsigned i = 0; i < GP_WORKING_SET_CALLS; i++)
        gp_working_set_call(&ws, 100 + i, 10);
    cr_assert_eq(gp_working_set_bytes(&ws), 10, "the old peak left the window");
}
