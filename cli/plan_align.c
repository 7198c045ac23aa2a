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
 * A trace converted from a PyTorch snapshot begins with the blocks that were already live when recording
 * started, all at its first Time, in the order the snapshot listed its segments (by address, which
 * differs from run to run), not in the order the program made them. So the allocations at a trace's first
 * Time, when there are several, are put in order of size (then position) on both sides first. Later runs
 * of equal Time are left as traced: there the order is the program's, and sorting by a size that changes
 * with the scale would scramble it.
 *
 * D, the fewest allocations left without a partner, decides whether the traces are of one model: when D
 * passes an eighth of all allocations (or GP_ALIGN_MAX_EDITS) the alignment is refused.
 *
 * Which pairs, though, is a second question. Many alignments leave D allocations unmatched, and a
 * shortest one may pair a 25 MiB buffer with a 100 MiB one two places on (compatible: 4 times at twice
 * the scale) where the true pairing is 25 with 25 and 100 with 100, one place on. So the pairs come from
 * a weighted longest common subsequence over the band of diagonals Myers' D allows (2D + 64 around the
 * corner-to-corner diagonals): a pair of equal sizes scores 6, one growing exactly as the scale ratio r
 * (within 512 B) 5, as r^2 4, any other compatible pair 2 (the simpler the law, the likelier the pair);
 * the alignment with the largest total is taken, so one equal pair outweighs two merely compatible ones. O(N W) time and N W bytes of
 * traceback for a band W wide; when that passes GP_ALIGN_MAX_CELLS the shortest alignment's own pairs
 * are used instead.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define GP_ALIGN_MAX_EDITS 4096
#define GP_ALIGN_MAX_CELLS (1u << 27) /* traceback bytes of the weighted alignment */
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

/* The weight of pairing a[x] with b[y]: 0 when incompatible (see the header). */
static int pair_score(const sequences *s, size_t x, size_t y)
{
    if (!compatible(s, x, y))
        return 0;
    uint64_t sa = s->a[x], sb = s->b[y];
    if (sa == sb)
        return 6;
    double small = (double)(s->b_is_larger_scale ? sa : sb), large = (double)(s->b_is_larger_scale ? sb : sa);
    double r = sqrt(s->growth);
    if (fabs(small * r - large) <= SIZE_SLACK)
        return 5;
    if (fabs(small * s->growth - large) <= SIZE_SLACK)
        return 4;
    return 2;
}

/* Weighted longest common subsequence over the diagonals lo..hi (j - i); writes the pairs into b_of_a
 * and returns their number, or -1 when the band is too large (nothing written). */
static long weighted_pairs(const sequences *s, long n, long m, long lo, long hi, uint32_t *b_of_a)
{
    long width = hi - lo + 1;
    if ((double)(n + 1) * (double)width > (double)GP_ALIGN_MAX_CELLS)
        return -1;
    uint8_t *dir = malloc((size_t)(n + 1) * (size_t)width);      /* 0 pair, 1 up (skip a), 2 left (skip b) */
    int32_t *prev = malloc((size_t)width * sizeof *prev), *cur = malloc((size_t)width * sizeof *cur);
    if (dir == NULL || prev == NULL || cur == NULL) {
        free(dir);
        free(prev);
        free(cur);
        return -1;
    }
    const int32_t none = INT32_MIN / 2;
    for (long i = 0; i <= n; i++) {
        for (long c = 0; c < width; c++) {
            long j = i + lo + c;
            int32_t best = none;
            uint8_t d = 3;
            if (j < 0 || j > m) {
                cur[c] = none;
                dir[(size_t)i * (size_t)width + (size_t)c] = 3;
                continue;
            }
            if (i == 0 || j == 0) {
                best = 0;
                d = i == 0 ? 2 : 1;
            } else {
                int sc = pair_score(s, (size_t)(i - 1), (size_t)(j - 1));
                if (sc > 0 && prev[c] != none) {                       /* (i-1, j-1) is column c of row i-1 */
                    best = prev[c] + sc;
                    d = 0;
                }
                if (c + 1 < width && prev[c + 1] != none && prev[c + 1] > best) { /* (i-1, j) */
                    best = prev[c + 1];
                    d = 1;
                }
                if (c > 0 && cur[c - 1] != none && cur[c - 1] > best) {           /* (i, j-1) */
                    best = cur[c - 1];
                    d = 2;
                }
            }
            cur[c] = best;
            dir[(size_t)i * (size_t)width + (size_t)c] = d;
        }
        int32_t *t = prev;
        prev = cur;
        cur = t;
    }
    long i = n, j = m, pairs = 0;
    while (i > 0 && j > 0) {
        uint8_t d = dir[(size_t)i * (size_t)width + (size_t)(j - i - lo)];
        assert(d != 3);
        if (d == 0) {
            b_of_a[i - 1] = (uint32_t)(j - 1);
            pairs++;
            i--;
            j--;
        } else if (d == 1) {
            i--;
        } else {
            j--;
        }
    }
    free(dir);
    free(prev);
    free(cur);
    return pairs;
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

/* The trace's allocations in the order they are aligned in: as traced, except that those at the first
 * Time are sorted by size (then slot). */
static const gp_trace *sort_trace;
static int compare_by_size(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    uint64_t sa = sort_trace->slot_size[a], sb = sort_trace->slot_size[b];
    if (sa != sb)
        return sa < sb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static uint32_t *canonical_order(const gp_trace *t)
{
    size_t n = t->num_allocs;
    uint32_t *order = malloc((n ? n : 1) * sizeof *order);
    uint64_t *time = calloc(n ? n : 1, sizeof *time); /* every slot, allocated or not, has a time */
    if (order == NULL || time == NULL) {
        free(order);
        free(time);
        return NULL;
    }
    for (size_t e = 0; e < t->num_events; e++)
        if (t->events[e].kind == GP_EV_ALLOC)
            time[t->events[e].slot] = t->events[e].time_us;
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    sort_trace = t; /* the command is single-threaded */
    size_t first = 1;
    while (first < n && time[first] == time[0])
        first++;
    if (n > 1 && first > 1)
        qsort(order, first, sizeof *order, compare_by_size);
    free(time);
    return order;
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
    uint32_t *order_a = canonical_order(a), *order_b = canonical_order(b);
    uint64_t *size_a = malloc((n ? (size_t)n : 1) * sizeof *size_a), *size_b = malloc((m ? (size_t)m : 1) * sizeof *size_b);
    uint16_t *stream_a = malloc((n ? (size_t)n : 1) * sizeof *stream_a), *stream_b = malloc((m ? (size_t)m : 1) * sizeof *stream_b);
    out->b_of_a = malloc((n ? (size_t)n : 1) * sizeof *out->b_of_a);
    size_t cap = 1024;
    int32_t *v = malloc(cap * sizeof *v); /* step d's diagonals -d..d at v[d*d .. d*d + 2d] */
    if (out->b_of_a == NULL || v == NULL || order_a == NULL || order_b == NULL || size_a == NULL || size_b == NULL ||
        stream_a == NULL || stream_b == NULL) {
        free(v);
        free(order_a);
        free(order_b);
        free(size_a);
        free(size_b);
        free(stream_a);
        free(stream_b);
        gp_alignment_free(out);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    for (long i = 0; i < n; i++) {
        size_a[i] = a->slot_size[order_a[i]];
        stream_a[i] = a->slot_stream[order_a[i]];
    }
    for (long j = 0; j < m; j++) {
        size_b[j] = b->slot_size[order_b[j]];
        stream_b[j] = b->slot_stream[order_b[j]];
    }
    sequences s = {.a = size_a, .b = size_b, .stream_a = stream_a, .stream_b = stream_b,
                   .growth = ratio * ratio, .b_is_larger_scale = scale_b > scale_a};
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
                found = -2;
                break;
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
        free(order_a);
        free(order_b);
        free(size_a);
        free(size_b);
        free(stream_a);
        free(stream_b);
        gp_alignment_free(out);
        if (found == -2)
            snprintf(err, errlen, "out of host memory");
        else
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
    /* the pairs: weighted over the band the shortest alignment allows, when it is small enough */
    long band_lo = (m - n < 0 ? m - n : 0) - 2 * found - 64, band_hi = (m - n > 0 ? m - n : 0) + 2 * found + 64;
    uint32_t *weighted = malloc((n ? (size_t)n : 1) * sizeof *weighted);
    if (weighted != NULL) {
        for (long i = 0; i < n; i++)
            weighted[i] = GP_ALIGN_NONE;
        long pairs = weighted_pairs(&s, n, m, band_lo, band_hi, weighted);
        if (pairs >= 0) {
            free(out->b_of_a);
            out->b_of_a = weighted;
            out->matched = (size_t)pairs;
        } else {
            free(weighted);
        }
    }
    /* back from the aligned order to the traces' slots */
    uint32_t *by_slot = malloc((n ? (size_t)n : 1) * sizeof *by_slot);
    if (by_slot != NULL) {
        for (long i = 0; i < n; i++)
            by_slot[order_a[i]] = out->b_of_a[i] == GP_ALIGN_NONE ? GP_ALIGN_NONE : order_b[out->b_of_a[i]];
        free(out->b_of_a);
        out->b_of_a = by_slot;
    }
    free(order_a);
    free(order_b);
    free(size_a);
    free(size_b);
    free(stream_a);
    free(stream_b);
    if (by_slot == NULL) {
        gp_alignment_free(out);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    out->num_a = (size_t)n;
    out->num_b = (size_t)m;
    out->unmatched_a = (size_t)n - out->matched;
    out->unmatched_b = (size_t)m - out->matched;
    return 0;
}
