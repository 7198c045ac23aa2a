/*
 * plan_predict.c — the figures at a scale: the synthesised trace (plan_synth.c) replayed through gpupool
 * on the simulated device (backend sim: cudaMalloc segments; sim-vmm: virtual memory) and through
 * PyTorch's caching-allocator policies (pytorch_policy.c). Replayed, not scaled by a ratio: rounding,
 * splitting and fragmentation at the new sizes are what the allocators really do with them.
 *
 * The simulated device is made large enough that nothing fails (80 GiB, or four times the peak live
 * bytes when that is more): the question is how much memory the run needs, not whether a given device
 * holds it; the capacity question is answered by comparing the figures with --gpu-memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "pytorch_policy.h"
#include "replay.h"

#define GIB (1ull << 30)

const char *gp_plan_allocator_name(int allocator)
{
    static const char *const names[GP_PLAN_ALLOCATORS] = {"cuda", "vmm", "pytorch"};
    return allocator >= 0 && allocator < GP_PLAN_ALLOCATORS ? names[allocator] : "?";
}

uint64_t gp_plan_reserved(const gp_plan_prediction *p, int allocator)
{
    return allocator == GP_PLAN_CUDA ? p->reserved_cuda : allocator == GP_PLAN_VMM ? p->reserved_vmm : p->reserved_pytorch;
}

/* Peak reserved of `t` under one allocator (GP_PLAN_*), or PyTorch's expandable policy (allocator -1). */
static int replay_one(const gp_trace *t, int allocator, uint64_t *reserved, uint64_t *failed, char *err,
                      size_t errlen)
{
    if (allocator == GP_PLAN_PYTORCH || allocator < 0) {
        gp_pytorch_result pr;
        if (gp_pytorch_replay(t, allocator < 0 ? GP_PYTORCH_EXPANDABLE : GP_PYTORCH_DEFAULT, &pr, err, errlen) != 0)
            return -1;
        *reserved = pr.peak_reserved_bytes;
        return 0;
    }
    uint64_t gib = (t->peak_live_bytes * 4 + GIB - 1) / GIB;
    char dm[32];
    snprintf(dm, sizeof dm, "%lluGiB", (unsigned long long)(gib > 80 ? gib : 80));
    gp_replay_options opt = {.device_memory = dm, .conf = allocator == GP_PLAN_VMM ? "backend:sim-vmm" : "",
                             .repeat = 1};
    gp_replay_result *r = malloc(sizeof *r);
    if (r == NULL) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    int rc = gp_replay_run(t, &opt, r, err, errlen);
    if (rc == 0) {
        *reserved = r->peak_reserved_bytes;
        if (failed != NULL)
            *failed += r->failed_allocations;
    }
    free(r);
    return rc;
}

int gp_plan_measure(const gp_trace *trace, double scale, gp_plan_prediction *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->scale = scale;
    out->peak_live_bytes = trace->peak_live_bytes;
    if (replay_one(trace, GP_PLAN_CUDA, &out->reserved_cuda, &out->failed_allocations, err, errlen) != 0 ||
        replay_one(trace, GP_PLAN_VMM, &out->reserved_vmm, &out->failed_allocations, err, errlen) != 0 ||
        replay_one(trace, GP_PLAN_PYTORCH, &out->reserved_pytorch, NULL, err, errlen) != 0 ||
        replay_one(trace, -1, &out->reserved_pytorch_expandable, NULL, err, errlen) != 0)
        return -1;
    return 0;
}

int gp_plan_predict(const gp_synth *synth, double scale, gp_plan_prediction *out, char *err, size_t errlen)
{
    gp_trace t;
    size_t negative = 0;
    if (gp_synth_trace(synth, scale, &t, &negative, err, errlen) != 0)
        return -1;
    int rc = gp_plan_measure(&t, scale, out, err, errlen);
    out->negative_sizes = negative;
    gp_trace_free(&t);
    return rc;
}

/* Whether the synthesised run at `scale` fits `capacity` under `allocator`. */
static int fits(const gp_synth *synth, int allocator, uint64_t capacity, double scale, int *yes, char *err,
                size_t errlen)
{
    gp_trace t;
    if (gp_synth_trace(synth, scale, &t, NULL, err, errlen) != 0)
        return -1;
    uint64_t reserved = 0, failed = 0;
    int rc = replay_one(&t, allocator, &reserved, &failed, err, errlen);
    gp_trace_free(&t);
    *yes = rc == 0 && reserved <= capacity;
    return rc;
}

int gp_plan_largest_fit(const gp_synth *synth, int allocator, uint64_t capacity, double max_scale,
                        double *largest, char *err, size_t errlen)
{
    int yes = 0;
    *largest = 0;
    if (fits(synth, allocator, capacity, 1.0, &yes, err, errlen) != 0)
        return -1;
    if (!yes)
        return 0;
    double lo = 1.0, hi = 2.0; /* lo fits; hi is untested */
    for (;;) {
        if (hi >= max_scale) {
            hi = max_scale;
            if (fits(synth, allocator, capacity, hi, &yes, err, errlen) != 0)
                return -1;
            if (yes) {
                *largest = hi;
                return 0;
            }
            break;
        }
        if (fits(synth, allocator, capacity, hi, &yes, err, errlen) != 0)
            return -1;
        if (!yes)
            break;
        lo = hi;
        hi *= 2.0;
    }
    while (hi - lo > 1.0) { /* lo fits, hi does not */
        double mid = lo + (double)(long long)((hi - lo) / 2.0);
        if (fits(synth, allocator, capacity, mid, &yes, err, errlen) != 0)
            return -1;
        if (yes)
            lo = mid;
        else
            hi = mid;
    }
    *largest = lo;
    return 0;
}
