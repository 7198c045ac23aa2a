/*
 * test_pytorch_policy.c — cli/pytorch_policy.c on small traces whose PyTorch figures follow by hand from
 * the policy (segment sizes, best fit, splitting, coalescing, per-stream pools, expandable growth).
 * The check against the reference model on real traces is tests/cli/check_pytorch_policy.py.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "pytorch_policy.h"
#include "trace.h"

#define MIB (1ull << 20)

static gp_pytorch_result run(const char *text, gp_pytorch_policy policy)
{
    gp_trace t;
    char err[256];
    char buf[4096];
    snprintf(buf, sizeof buf, "Thread,Time,Action,Pointer,Size,Stream\n%s", text);
    cr_assert_eq(gp_trace_parse(&t, "t", buf, strlen(buf), err, sizeof err), 0, "%s", err);
    gp_pytorch_result r;
    cr_assert_eq(gp_pytorch_replay(&t, policy, &r, err, sizeof err), 0, "%s", err);
    gp_trace_free(&t);
    return r;
}

Test(pytorch_policy, segment_sizes_by_request)
{
    /* 1000 B: small pool, 2 MiB; 3 MiB: a 20 MiB segment (its 17 MiB remainder is split off);
     * 20 MiB + 1 does not fit that remainder and gets a segment rounded up to 22 MiB */
    gp_pytorch_result r = run("0,1,allocate,0x1,1000,0x0\n"
                              "0,2,allocate,0x2,3145728,0x0\n"
                              "0,3,allocate,0x3,20971521,0x0\n", GP_PYTORCH_DEFAULT);
    cr_assert_eq(r.peak_reserved_bytes, 2 * MIB + 20 * MIB + 22 * MIB);
    cr_assert_eq(r.device_allocations, 3);
    cr_assert_eq(r.peak_live_bytes, 1000 + 3145728 + 20971521);
}

Test(pytorch_policy, split_and_reuse_within_a_segment)
{
    /* Two 8 MiB requests share one 20 MiB segment (the 12 MiB remainder is split off and reused);
     * a third needs a second segment; after frees, all three fit again without a new one. */
    gp_pytorch_result r = run("0,1,allocate,0x1,8388608,0x0\n"
                              "0,2,allocate,0x2,8388608,0x0\n"
                              "0,3,allocate,0x3,8388608,0x0\n"
                              "0,4,free,0x1,8388608,0x0\n"
                              "0,5,free,0x2,8388608,0x0\n"
                              "0,6,allocate,0x4,16777216,0x0\n", GP_PYTORCH_DEFAULT);
    /* 0x4 (16 MiB) fits the coalesced 20 MiB of the first segment */
    cr_assert_eq(r.peak_reserved_bytes, 40 * MIB);
    cr_assert_eq(r.device_allocations, 2);
}

Test(pytorch_policy, large_remainder_of_one_mib_is_not_split)
{
    /* 19 MiB in a 20 MiB segment leaves exactly 1 MiB: not split (large pool splits above 1 MiB), so a
     * second 1 MiB+ request cannot use it. */
    gp_pytorch_result r = run("0,1,allocate,0x1,19922944,0x0\n"
                              "0,2,allocate,0x2,1049088,0x0\n", GP_PYTORCH_DEFAULT);
    cr_assert_eq(r.peak_reserved_bytes, 40 * MIB);
}

Test(pytorch_policy, free_blocks_belong_to_their_stream)
{
    /* A block freed on stream 0x1 is not reused by stream 0x2: a second segment */
    gp_pytorch_result r = run("0,1,allocate,0x1,4096,0x1\n"
                              "0,2,free,0x1,4096,0x1\n"
                              "0,3,allocate,0x2,4096,0x2\n", GP_PYTORCH_DEFAULT);
    cr_assert_eq(r.peak_reserved_bytes, 4 * MIB);
    gp_pytorch_result same = run("0,1,allocate,0x1,4096,0x1\n"
                                 "0,2,free,0x1,4096,0x1\n"
                                 "0,3,allocate,0x2,4096,0x1\n", GP_PYTORCH_DEFAULT);
    cr_assert_eq(same.peak_reserved_bytes, 2 * MIB);
}

Test(pytorch_policy, expandable_maps_only_what_is_needed)
{
    /* 3 MiB maps one 20 MiB page; a 30 MiB request then maps only one more page after the 17 MiB
     * free tail (17 + 20 >= 30), where the default policy needs a 30 MiB segment of its own. */
    const char *t = "0,1,allocate,0x1,3145728,0x0\n"
                    "0,2,allocate,0x2,31457280,0x0\n";
    cr_assert_eq(run(t, GP_PYTORCH_EXPANDABLE).peak_reserved_bytes, 40 * MIB);
    cr_assert_eq(run(t, GP_PYTORCH_DEFAULT).peak_reserved_bytes, 50 * MIB);
}

Test(pytorch_policy, expandable_passes_over_the_growable_tail)
{
    /* Free: a 4 MiB hole at the start, and the tail. A 2 MiB request takes the hole (not the tail),
     * so a following 15 MiB request still fits the tail without mapping more. */
    gp_pytorch_result r = run("0,1,allocate,0x1,4194304,0x0\n"
                              "0,2,allocate,0x2,2097152,0x0\n"
                              "0,3,free,0x1,4194304,0x0\n"
                              "0,4,allocate,0x3,2097152,0x0\n"
                              "0,5,allocate,0x4,14680064,0x0\n", GP_PYTORCH_EXPANDABLE);
    cr_assert_eq(r.peak_reserved_bytes, 20 * MIB);
}

Test(pytorch_policy, zero_bytes_take_a_minimum_block_and_failures_are_skipped)
{
    gp_pytorch_result r = run("0,1,allocate,0x1,0,0x0\n"
                              "0,2,allocate failure,0x0,99999999999,0x0\n", GP_PYTORCH_DEFAULT);
    cr_assert_eq(r.peak_reserved_bytes, 2 * MIB);
    cr_assert_eq(r.peak_live_bytes, 0);
}
