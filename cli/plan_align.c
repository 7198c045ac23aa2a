/*
 * plan_align.c — which allocation of one trace is which allocation of another trace of the same model
 * at another scale.
 *
 * Traces of one model at two scales make the same allocations in the same order, except where a kernel
 * takes another path at another size (a workspace more or less, resnet18_train has 17120 allocations at
 * batch 8 and 17130 at 16). So this is a diff: Myers' O((N + M) D) algorithm ("An O(ND) difference
 * algorithm and its variations", 1986) over the two allocation sequences, where two allocations match
 * when one allocation could have both sizes:
 *   - the same size (it does not depend on the scale), or
 *   - growing with the scale, but no faster than its square: for scales s < t, sizes a < b with
 *     b <= a (t/s)^2 + 512 (a size is a product of dimensions, one or two of them the scale; 512 B is the
 *     rounding unit of the allocators replayed, below which no allocator sees a difference);
 *   - and the same stream (streams numbered in order of first use).
 * D, the number of allocations left without a partner, is what the command reports as unmatched. When D
 * passes an eighth of all allocations (or GP_ALIGN_MAX_EDITS) the traces are not of one model and the
 * alignment is refused. Memory: the furthest-reaching x of every diagonal at every d is kept for the
 * backtrack, (D + 1)^2 int32 values (64 MiB at the cap).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define GP_ALIGN_MAX_EDITS 4096
#define SIZE_SLACK 512.0
#define INVALID (-1)

typedef struct sequences {
    const uint64_t *a, *b;
    const uint16_t *stream_a, *stream_b;
    double growth; /* largest size ratio allowed: (larger scale / smaller scale)^2 */
    int b_is_larger_scale;
} sequences;

static int compatible(const sequences *s, size_t x, size_t y)
{
    uint64_t sa = s->a[x], sb = s->b[y];
    if (s->stream_a[x] != s->stream_b[y])
        return 0;
    if (sa == sb)
        return 1;
    if (sa == 0 || sb == 0)
        return 0;
    uint64_t small = s->b_is_larger_scale ? sa : sb, large = s->b_is_larger_scale ? sb : sa;
    return large > small && (double)large <= (double)small * s->growth + SIZE_SLACK;
}

/* The x reached on diagonal k at step d from step d - 1 (vprev indexed by k + d - 1), and whether it
 * came down (from k + 1: one allocation of b unmatched) rather than right (from k - 1: one of a). */
static long step_from(const int32_t *vprev, long d, long k, int *down)
{
    long x1 = INVALID, x2 = INVALID;
    if (k + 1 <= d - 1 && vprev[k + 1 + d - 1] >= 0)
        x1 = vprev[k + 1 + d - 1];
    if (k - 1 >= -(d - 1) && vprev[k - 1 + d - 1] >= 0)
        x2 = vprev[k - 1 + d - 1] + 1;
    if (x1 == INVALID && x2 == INVALID)
        return INVALID;
    *down = x1 >= x2;
    return *down ? x1 : x2;
}

void gp_alignment_free(gp_alignment *alignment)
{
    free(alignment->b_of_a);
    memset(alignment, 0, sizeof *alignment);
}

int gp_align(const gp_trace *a, double scale_a, const gp_trace *b, double scale_b, gp_alignment *out,
             char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    long n = (long)a->num_allocs, m = (long)b->num_allocs;
    long limit = (n + m) / 8;
    if (limit > GP_ALIGN_MAX_EDITS)
        limit = GP_ALIGN_MAX_EDITS;
    if (labs(n - m) > limit) {
        snprintf(err, errlen, "does not align with %s: %ld against %ld allocations, more than %ld would stay "
                 "unmatched (not the same model?)", a->path, m, n, limit);
        return -1;
    }
    double ratio = scale_b > scale_a ? scale_b / scale_a : scale_a / scale_b;
    sequences s = {.a = a->slot_size, .b = b->slot_size, .stream_a = a->slot_stream, .stream_b = b->slot_stream,
                   .growth = ratio * ratio, .b_is_larger_scale = scale_b > scale_a};
    out->b_of_a = malloc((n ? (size_t)n : 1) * sizeof *out->b_of_a);
    size_t cap = 1024;
    int32_t *v = malloc(cap * sizeof *v); /* step d's diagonals -d..d at v[d*d .. d*d + 2d] */
    if (out->b_of_a == NULL || v == NULL) {
        free(v);
        gp_alignment_free(out);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    for (long i = 0; i < n; i++)
        out->b_of_a[i] = GP_ALIGN_NONE;
    long found = -1;
    for (long d = 0; d <= limit && found < 0; d++) {
        size_t need = (size_t)(d + 1) * (size_t)(d + 1);
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            int32_t *grown = realloc(v, cap * sizeof *v);
            if (grown == NULL) {
                free(v);
                gp_alignment_free(out);
                snprintf(err, errlen, "out of host memory");
                return -1;
            }
            v = grown;
        }
        int32_t *vd = v + (size_t)d * (size_t)d;
        const int32_t *vprev = d > 0 ? v + (size_t)(d - 1) * (size_t)(d - 1) : NULL;
        for (long k = -d; k <= d; k += 2) {
            int down = 0;
            long x = d == 0 ? 0 : step_from(vprev, d, k, &down);
            long y = x - k;
            if (x == INVALID || x > n || y < 0 || y > m) {
                vd[k + d] = INVALID;
                continue;
            }
            while (x < n && y < m && compatible(&s, (size_t)x, (size_t)y)) {
                x++;
                y++;
            }
            vd[k + d] = (int32_t)x;
            if (x >= n && y >= m) {
                found = d;
                break;
            }
        }
    }
    if (found < 0) {
        free(v);
        gp_alignment_free(out);
        snprintf(err, errlen, "does not align with %s: more than %ld of their %ld allocations would stay "
                 "unmatched (not the same model?)", a->path, limit, n + m);
        return -1;
    }
    /* backtrack from (n, m): each step d ends in a snake of matches */
    long x = n, y = m;
    for (long d = found; d >= 0; d--) {
        long k = x - y, px = 0, py = 0;
        if (d > 0) {
            int down = 0;
            const int32_t *vprev = v + (size_t)(d - 1) * (size_t)(d - 1);
            step_from(vprev, d, k, &down);
            long pk = down ? k + 1 : k - 1;
            px = vprev[pk + d - 1];
            py = px - pk;
            long sx = down ? px : px + 1, sy = down ? py + 1 : py; /* where the snake starts */
            while (x > sx && y > sy) {
                x--;
                y--;
                out->b_of_a[x] = (uint32_t)y;
                out->matched++;
            }
        } else {
            while (x > 0 && y > 0) {
                x--;
                y--;
                out->b_of_a[x] = (uint32_t)y;
                out->matched++;
            }
        }
        x = px;
        y = py;
    }
    free(v);
    out->num_a = (size_t)n;
    out->num_b = (size_t)m;
    out->unmatched_a = (size_t)n - out->matched;
    out->unmatched_b = (size_t)m - out->matched;
    return 0;
}
