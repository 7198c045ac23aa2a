/*
 * test_plan_fit.c — cli/plan_fit.c: fixed + linear (+ quadratic) least squares over scales, its errors
 * on the points and leaving one out, and the inputs it refuses.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "plan.h"

Test(plan_fit, recovers_a_line_from_two_points)
{
    double x[] = {8, 16}, y[] = {100 + 7 * 8, 100 + 7 * 16};
    gp_scale_fit f;
    char err[128];
    cr_assert_eq(gp_fit_scale(x, y, 2, 2, &f, err, sizeof err), 0, "%s", err);
    cr_assert_float_eq(f.fixed, 100.0, 1e-6);
    cr_assert_float_eq(f.linear, 7.0, 1e-9);
    cr_assert_float_eq(gp_fit_eval(&f, 64), 100 + 7 * 64, 1e-6);
    cr_assert_float_eq(f.max_rel_error, 0.0, 1e-12);
    cr_assert_lt(f.loo_max_rel_error, 0.0, "two points: no leave-one-out");
}

Test(plan_fit, recovers_a_quadratic_from_three_points_and_loo_sees_the_curve)
{
    double x[] = {64, 128, 256}, y[3];
    for (int i = 0; i < 3; i++)
        y[i] = 5e8 + 3e6 * x[i] + 4608.0 * x[i] * x[i];
    gp_scale_fit f;
    char err[128];
    cr_assert_eq(gp_fit_scale(x, y, 3, 3, &f, err, sizeof err), 0, "%s", err);
    cr_assert_float_eq(f.quadratic, 4608.0, 1e-4);
    cr_assert_float_eq(gp_fit_eval(&f, 512), 5e8 + 3e6 * 512 + 4608.0 * 512 * 512, 1.0);
    /* a straight line through two of them misses the third: leave-one-out shows it */
    cr_assert_gt(f.loo_max_rel_error, 0.02);
}

Test(plan_fit, least_squares_line_through_noisy_points)
{
    double x[] = {1, 2, 3, 4}, y[] = {10, 21, 29, 40};
    gp_scale_fit f;
    char err[128];
    cr_assert_eq(gp_fit_scale(x, y, 4, 2, &f, err, sizeof err), 0, "%s", err);
    /* ordinary least squares: slope 9.8, intercept 0.5 */
    cr_assert_float_eq(f.linear, 9.8, 1e-9);
    cr_assert_float_eq(f.fixed, 0.5, 1e-9);
    cr_assert_gt(f.max_rel_error, 0.0);
}

Test(plan_fit, refuses_bad_points)
{
    gp_scale_fit f;
    char err[128];
    double x[] = {8, 8}, y[] = {1, 2};
    cr_assert_eq(gp_fit_scale(x, y, 2, 2, &f, err, sizeof err), -1);
    cr_assert(strstr(err, "given twice") != NULL, "%s", err);
    double x2[] = {0, 8};
    cr_assert_eq(gp_fit_scale(x2, y, 2, 2, &f, err, sizeof err), -1);
    cr_assert(strstr(err, "above 0") != NULL, "%s", err);
    double x3[] = {4, 8};
    cr_assert_eq(gp_fit_scale(x3, y, 2, 3, &f, err, sizeof err), -1);
    cr_assert(strstr(err, "at least 3 points") != NULL, "%s", err);
}
