/*
 * test_plan_compose.c — cli/plan_compose.c: the four parts of a peak on a trace built to have each of
 * them (parameters, optimizer state made in the first step, activations, a temporary), and the parts
 * always summing to the peak live bytes.
 */
#include <criterion/criterion.h>

#include "plan.h"
#include "plan_traces.h"

Test(plan_compose, a_training_trace_splits_into_its_four_parts)
{
    trace_text t = {0};
    /* construction: 10 parameters of 1 MiB, one small temporary */
    for (unsigned long i = 0; i < 10; i++)
        tt_alloc(&t, 0x100 + i, 1 << 20);
    tt_alloc(&t, 0x50, 4096);
    tt_free(&t, 0x50, 4096);
    for (int step = 0; step < 2; step++) {
        /* forward: 20 activations of 2 MiB, each with a workspace freed at once */
        for (unsigned long i = 0; i < 20; i++) {
            tt_alloc(&t, 0x1000 + i, 2 << 20);
            tt_alloc(&t, 0x2000 + i, 3 << 20);
            tt_free(&t, 0x2000 + i, 3 << 20);
        }
        /* the peak: one more large workspace while every activation is alive */
        tt_alloc(&t, 0x3000, 5 << 20);
        tt_free(&t, 0x3000, 5 << 20);
        /* backward: small gradients of the activations, before these are freed */
        for (unsigned long i = 0; i < 10; i++) {
            tt_alloc(&t, 0x5000 + i, 4096);
            tt_free(&t, 0x5000 + i, 4096);
        }
        for (unsigned long i = 0; i < 20; i++)
            tt_free(&t, 0x1000 + i, 2 << 20);
        if (step == 0) /* optimizer state, made at the first step, alive to the end */
            for (unsigned long i = 0; i < 10; i++)
                tt_alloc(&t, 0x400 + i, 1 << 20);
    }
    tt_alloc(&t, 0x60, 512); /* the last allocation; then the teardown */
    tt_free(&t, 0x60, 512);
    for (unsigned long i = 0; i < 10; i++) {
        tt_free(&t, 0x100 + i, 1 << 20);
        tt_free(&t, 0x400 + i, 1 << 20);
    }
    gp_trace tr;
    tt_parse(&t, "train.csv", &tr);
    gp_composition c;
    char err[256];
    cr_assert_eq(gp_compose(&tr, &c, err, sizeof err), 0, "%s", err);
    cr_assert(c.first_step_found);
    /* the peak is in the second step (the optimizer state is alive then) */
    cr_assert_eq(c.peak_live_bytes, (10ull + 10 + 40 + 5) << 20);
    cr_assert_eq(c.part_bytes[GP_PART_RESIDENT_BEFORE], 10ull << 20);
    cr_assert_eq(c.part_bytes[GP_PART_RESIDENT_FROM_STEP], 10ull << 20);
    cr_assert_eq(c.part_bytes[GP_PART_PER_STEP], 40ull << 20);
    cr_assert_eq(c.part_bytes[GP_PART_TEMPORARY], 5ull << 20);
    gp_trace_free(&tr);
}

Test(plan_compose, parts_sum_to_the_peak_without_any_step)
{
    trace_text t = {0};
    for (unsigned long i = 0; i < 5; i++)
        tt_alloc(&t, 0x10 + i, 1000 * (i + 1));
    gp_trace tr;
    tt_parse(&t, "flat.csv", &tr);
    gp_composition c;
    char err[256];
    cr_assert_eq(gp_compose(&tr, &c, err, sizeof err), 0, "%s", err);
    uint64_t sum = 0;
    for (int p = 0; p < GP_PARTS; p++)
        sum += c.part_bytes[p];
    cr_assert_eq(sum, c.peak_live_bytes);
    cr_assert_eq(c.peak_live_bytes, 15000);
    cr_assert_eq(c.part_bytes[GP_PART_RESIDENT_BEFORE] + c.part_bytes[GP_PART_RESIDENT_FROM_STEP], 15000);
    gp_trace_free(&tr);
}
