/*
 * test_plan_predict.c — cli/plan_predict.c: the figures at a scale come from replaying the synthesised
 * trace (they equal a replay of the real trace when the laws are exact), and the largest scale that
 * fits a capacity is the one a scale-by-scale search finds.
 */
#include <criterion/criterion.h>

#include "plan.h"
#include "plan_traces.h"

/* One "model" at scale s: 12 weights of 3 MiB (constant); per layer an activation (256 KiB s) and
 * attention-like scores (1 KiB s^2), freed in reverse at the end of the step. */
static void model_trace(gp_trace *out, unsigned s)
{
    trace_text t = {0};
    for (unsigned long i = 0; i < 12; i++)
        tt_alloc(&t, 0x100 + i, 3 << 20);
    for (unsigned long i = 0; i < 12; i++) {
        tt_alloc(&t, 0x1000 + i, 4096ull * s * 64);
        tt_alloc(&t, 0x2000 + i, 1024ull * s * s);
    }
    for (unsigned long i = 12; i-- > 0;) {
        tt_free(&t, 0x2000 + i, 1024ull * s * s);
        tt_free(&t, 0x1000 + i, 4096ull * s * 64);
    }
    tt_parse(&t, "model.csv", out);
}

Test(plan_predict, the_synthesised_figures_equal_the_real_trace_s)
{
    gp_trace a, b, real;
    model_trace(&a, 16);
    model_trace(&b, 32);
    model_trace(&real, 96);
    const gp_trace *traces[] = {&a, &b};
    double scales[] = {16, 32};
    gp_synth s;
    char err[512];
    cr_assert_eq(gp_synth_build(&s, traces, scales, 2, 1, err, sizeof err), 0, "%s", err);
    gp_plan_prediction p, m;
    cr_assert_eq(gp_plan_predict(&s, 96, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(gp_plan_measure(&real, 96, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p.peak_live_bytes, m.peak_live_bytes);
    cr_assert_eq(p.reserved_cuda, m.reserved_cuda);
    cr_assert_eq(p.reserved_vmm, m.reserved_vmm);
    cr_assert_eq(p.reserved_pytorch, m.reserved_pytorch);
    cr_assert_eq(p.reserved_pytorch_expandable, m.reserved_pytorch_expandable);
    cr_assert_gt(p.reserved_cuda, p.peak_live_bytes / 2);
    cr_assert_eq(p.failed_allocations, 0);
    gp_synth_free(&s);
    gp_trace_free(&a);
    gp_trace_free(&b);
    gp_trace_free(&real);
}

Test(plan_predict, largest_fit_agrees_with_a_search_scale_by_scale)
{
    gp_trace a, b;
    model_trace(&a, 4);
    model_trace(&b, 8);
    const gp_trace *traces[] = {&a, &b};
    double scales[] = {4, 8};
    gp_synth s;
    char err[512];
    cr_assert_eq(gp_synth_build(&s, traces, scales, 2, 1, err, sizeof err), 0, "%s", err);
    const uint64_t capacity = 200ull << 20;
    for (int allocator = 0; allocator < GP_PLAN_ALLOCATORS; allocator++) {
        double expected = 0;
        for (double scale = 1; scale <= 128; scale++) {
            gp_plan_prediction p;
            cr_assert_eq(gp_plan_predict(&s, scale, &p, err, sizeof err), 0, "%s", err);
            if (gp_plan_reserved(&p, allocator) <= capacity)
                expected = scale;
            else
                break;
        }
        double largest = -1;
        cr_assert_eq(gp_plan_largest_fit(&s, allocator, capacity, 128, &largest, err, sizeof err), 0, "%s", err);
        cr_assert_eq(largest, expected, "%s: %g, expected %g", gp_plan_allocator_name(allocator), largest, expected);
        cr_assert_gt(largest, 1);
        cr_assert_lt(largest, 128);
    }
    /* nothing fits a capacity below the fixed part */
    double largest = -1;
    cr_assert_eq(gp_plan_largest_fit(&s, GP_PLAN_CUDA, 1 << 20, 128, &largest, err, sizeof err), 0, "%s", err);
    cr_assert_eq(largest, 0);
    gp_synth_free(&s);
    gp_trace_free(&a);
    gp_trace_free(&b);
}
