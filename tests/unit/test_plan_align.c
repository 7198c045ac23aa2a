/*
 * test_plan_align.c — cli/plan_align.c: allocations of one model at two scales paired in order, an
 * allocation the other trace does not make left unmatched (and the rest still paired), sizes that grow
 * faster than the square of the scale not paired, and traces of different models refused.
 */
#include <criterion/criterion.h>

#include "plan.h"
#include "plan_traces.h"

/* A "model" of `count` layers at scale s: a weight (constant), an activation (proportional) and a
 * temporary (freed at once) per layer; `extra_at` >= 0 adds one workspace before that layer. */
static void model_trace(gp_trace *out, const char *name, unsigned s, int count, int extra_at)
{
    trace_text t = {0};
    unsigned long p = 0x1000;
    for (int i = 0; i < count; i++) {
        if (i == extra_at) {
            tt_alloc(&t, 0x900000, 777777);
            tt_free(&t, 0x900000, 777777);
        }
        tt_alloc(&t, p++, 1000 + 16 * (unsigned)i);
        tt_alloc(&t, p++, 4096ull * s * (unsigned)(i + 1));
        tt_alloc(&t, p, 512ull * s);
        tt_free(&t, p++, 512ull * s);
    }
    tt_parse(&t, name, out);
}

Test(plan_align, same_model_two_scales_pairs_everything)
{
    gp_trace a, b;
    model_trace(&a, "a", 8, 40, -1);
    model_trace(&b, "b", 16, 40, -1);
    gp_alignment al;
    char err[512];
    cr_assert_eq(gp_align(&a, 8, &b, 16, &al, err, sizeof err), 0, "%s", err);
    cr_assert_eq(al.matched, a.num_allocs);
    cr_assert_eq(al.unmatched_a + al.unmatched_b, 0);
    for (size_t i = 0; i < a.num_allocs; i++)
        cr_assert_eq(al.b_of_a[i], i);
    gp_alignment_free(&al);
    gp_trace_free(&a);
    gp_trace_free(&b);
}

Test(plan_align, an_extra_allocation_is_unmatched_and_the_rest_still_pair)
{
    gp_trace a, b;
    model_trace(&a, "a", 8, 40, -1);
    model_trace(&b, "b", 16, 40, 20); /* b makes one workspace more, before layer 20 */
    gp_alignment al;
    char err[512];
    cr_assert_eq(gp_align(&a, 8, &b, 16, &al, err, sizeof err), 0, "%s", err);
    cr_assert_eq(al.unmatched_a, 0);
    cr_assert_eq(al.unmatched_b, 1);
    /* allocations from layer 20 on are one further along in b */
    for (size_t i = 0; i < a.num_allocs; i++)
        cr_assert_eq(al.b_of_a[i], i < 60 ? i : i + 1, "allocation %zu paired with %u", i, al.b_of_a[i]);
    gp_alignment_free(&al);
    gp_trace_free(&a);
    gp_trace_free(&b);
}

Test(plan_align, growth_faster_than_the_square_does_not_pair)
{
    trace_text ta = {0}, tb = {0};
    tt_alloc(&ta, 1, 1000);
    tt_alloc(&tb, 1, 4000 + 512);      /* scale x2: up to 4x + 512 B pairs */
    tt_alloc(&ta, 2, 1000);
    tt_alloc(&tb, 2, 4000 + 513);      /* just over: does not */
    tt_alloc(&ta, 3, 20000);
    tt_alloc(&tb, 3, 19999);           /* shrinking while the scale grows: does not */
    for (int i = 0; i < 40; i++) {     /* enough common allocations to stay under the refusal limit */
        tt_alloc(&ta, 10 + (unsigned long)i, 64);
        tt_alloc(&tb, 10 + (unsigned long)i, 64);
    }
    gp_trace a, b;
    tt_parse(&ta, "a", &a);
    tt_parse(&tb, "b", &b);
    gp_alignment al;
    char err[512];
    cr_assert_eq(gp_align(&a, 4, &b, 8, &al, err, sizeof err), 0, "%s", err);
    cr_assert_eq(al.b_of_a[0], 0);
    cr_assert_eq(al.b_of_a[1], GP_ALIGN_NONE);
    cr_assert_eq(al.b_of_a[2], GP_ALIGN_NONE);
    cr_assert_eq(al.unmatched_a, 2);
    gp_alignment_free(&al);
    gp_trace_free(&a);
    gp_trace_free(&b);
}

Test(plan_align, different_models_are_refused)
{
    gp_trace a, b;
    model_trace(&a, "resnet.csv", 8, 40, -1);
    trace_text t = {0};
    for (int i = 0; i < 100; i++)
        tt_alloc(&t, 0x100 + (unsigned long)i, 3u * (unsigned)(i + 1) + 1);
    tt_parse(&t, "other.csv", &b);
    gp_alignment al;
    char err[512];
    cr_assert_eq(gp_align(&a, 8, &b, 16, &al, err, sizeof err), -1);
    cr_assert(strstr(err, "does not align with resnet.csv") != NULL, "%s", err);
    cr_assert_null(al.b_of_a);
    gp_trace_free(&a);
    gp_trace_free(&b);
}
