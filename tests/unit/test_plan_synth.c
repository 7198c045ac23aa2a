/*
 * test_plan_synth.c — cli/plan_synth.c: each allocation's size law from aligned traces (constant,
 * proportional, square, linear, quadratic), the trace synthesised at a new scale with exactly those
 * sizes and the template's event order, and laws that would go below zero.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "plan.h"
#include "plan_traces.h"

/* Sizes of allocation i at scale s, one law each. */
static unsigned long long size_of(int law, double s)
{
    switch (law) {
    case 0: return 4096;                                     /* constant */
    case 1: return (unsigned long long)(6144 * s);           /* proportional */
    case 2: return (unsigned long long)(1024 * s * s);       /* square */
    case 3: return (unsigned long long)(100000 + 3000 * s);  /* linear */
    default: return (unsigned long long)(70000 + 900 * s + 40 * s * s); /* quadratic */
    }
}

static void law_trace(gp_trace *out, double s, int laws)
{
    trace_text t = {0};
    for (int i = 0; i < 20; i++)
        tt_alloc(&t, 0x100 + (unsigned long)i, size_of(i % laws, s));
    for (int i = 0; i < 20; i += 2) /* every other one is freed: the peak is all 20 */
        tt_free(&t, 0x100 + (unsigned long)i, size_of(i % laws, s));
    tt_alloc(&t, 0x999, size_of(1, s));
    tt_parse(&t, "laws.csv", out);
}

Test(plan_synth, laws_from_two_scales_and_the_trace_at_a_third)
{
    gp_trace a, b;
    law_trace(&a, 8, 4);
    law_trace(&b, 16, 4);
    const gp_trace *traces[] = {&a, &b};
    double scales[] = {8, 16};
    gp_synth s;
    char err[512];
    cr_assert_eq(gp_synth_build(&s, traces, scales, 2, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s.laws[GP_LAW_CONSTANT], 5);
    cr_assert_eq(s.laws[GP_LAW_POWER], 11); /* 5 proportional + 1 more at the end, 5 square */
    cr_assert_eq(s.laws[GP_LAW_LINEAR], 5);
    cr_assert_eq(s.unmatched_events, 0);
    gp_trace t;
    size_t negative = 1;
    cr_assert_eq(gp_synth_trace(&s, 64, &t, &negative, err, sizeof err), 0, "%s", err);
    cr_assert_eq(negative, 0);
    cr_assert_eq(t.num_events, b.num_events);
    uint64_t peak = 0;
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(t.slot_size[i], size_of(i % 4, 64), "allocation %d: %llu", i, (unsigned long long)t.slot_size[i]);
        peak += size_of(i % 4, 64);
    }
    cr_assert_eq(t.peak_live_bytes, peak);
    /* frees carry their allocation's new size */
    for (size_t e = 0; e < t.num_events; e++)
        if (t.events[e].kind == GP_EV_FREE)
            cr_assert_eq(t.events[e].size, t.slot_size[t.events[e].slot]);
    gp_trace_free(&t);
    gp_synth_free(&s);
    gp_trace_free(&a);
    gp_trace_free(&b);
}

Test(plan_synth, quadratic_needs_three_scales)
{
    gp_trace tr[3];
    double scales[] = {8, 16, 32};
    for (int i = 0; i < 3; i++)
        law_trace(&tr[i], scales[i], 5);
    const gp_trace *traces[] = {&tr[0], &tr[1], &tr[2]};
    gp_synth s;
    char err[512];
    cr_assert_eq(gp_synth_build(&s, traces, scales, 3, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s.laws[GP_LAW_QUADRATIC], 4);
    gp_trace t;
    cr_assert_eq(gp_synth_trace(&s, 128, &t, NULL, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(t.slot_size[i], size_of(i % 5, 128), "allocation %d", i);
    gp_trace_free(&t);
    gp_synth_free(&s);
    for (int i = 0; i < 3; i++)
        gp_trace_free(&tr[i]);
}

Test(plan_synth, a_law_below_zero_keeps_the_template_size)
{
    trace_text ta = {0}, tb = {0};
    for (int i = 0; i < 16; i++) {
        tt_alloc(&ta, 0x10 + (unsigned long)i, 64);
        tt_alloc(&tb, 0x10 + (unsigned long)i, 64);
    }
    /* a workspace growing faster than the scale but not as its square: linear, 180000 B per unit,
     * which crosses zero at scale 4.5 */
    tt_alloc(&ta, 1, 810000);
    tt_alloc(&tb, 1, 990000);
    gp_trace a, b;
    tt_parse(&ta, "a", &a);
    tt_parse(&tb, "b", &b);
    const gp_trace *traces[] = {&a, &b};
    double scales[] = {9, 10};
    gp_synth s;
    char err[512];
    cr_assert_eq(gp_synth_build(&s, traces, scales, 2, 0, err, sizeof err), 0, "%s", err);
    gp_trace t;
    size_t negative = 0;
    cr_assert_eq(gp_synth_trace(&s, 1, &t, &negative, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s.models[16].law, GP_LAW_LINEAR);
    cr_assert_eq(negative, 1);
    cr_assert_eq(t.slot_size[16], 810000); /* the template's size */
    cr_assert_eq(t.slot_size[0], 64);
    gp_trace_free(&t);
    gp_synth_free(&s);
    gp_trace_free(&a);
    gp_trace_free(&b);
}

Test(plan_synth, a_size_growing_ever_slower_is_held_outside_the_traced_scales)
{
    /* a workspace 200832 B at scale 8, 332032 at 16 and at 32 (its cap): no tensor law; between 8 and 32
     * the curve through the three, outside them the size at the nearest traced scale */
    unsigned long long ws[] = {200832, 332032, 332032};
    double scales[] = {8, 16, 32};
    gp_trace tr[3];
    for (int i = 0; i < 3; i++) {
        trace_text t = {0};
        for (int k = 0; k < 16; k++)
            tt_alloc(&t, 0x10 + (unsigned long)k, 64);
        tt_alloc(&t, 1, ws[i]);
        tt_parse(&t, "ws.csv", &tr[i]);
    }
    const gp_trace *traces[] = {&tr[0], &tr[1], &tr[2]};
    gp_synth s;
    char err[512];
    cr_assert_eq(gp_synth_build(&s, traces, scales, 3, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s.models[16].law, GP_LAW_SATURATING);
    cr_assert_eq(gp_size_model_eval(&s.models[16], 64), 332032);
    cr_assert_eq(gp_size_model_eval(&s.models[16], 4), 200832);
    cr_assert_eq(gp_size_model_eval(&s.models[16], 16), 332032);
    gp_synth_free(&s);
    for (int i = 0; i < 3; i++)
        gp_trace_free(&tr[i]);
}
