/*
 * replay_compare.c — PyTorch's reserved bytes beside gpupool's for one replayed trace (see
 * replay_compare.h). The saving is what gpupool's peak reserved is below PyTorch's, as a share of
 * PyTorch's: what a user would get back by switching, on this trace, on the simulated device.
 */
#include "replay_compare.h"

#include <string.h>

#include "base/format.h"
#include "pytorch_policy.h"

int gp_compare_check(const char *name, char *err, size_t errlen)
{
    if (strcmp(name, "pytorch") == 0)
        return 0;
    snprintf(err, errlen, "--compare %s: unknown allocator (the one known is: pytorch)", name);
    return -1;
}

int gp_compare_pytorch_print(FILE *f, const gp_trace *trace, const gp_replay_result *r, int json, char *err,
                             size_t errlen)
{
    static const gp_pytorch_policy policies[] = {GP_PYTORCH_DEFAULT, GP_PYTORCH_EXPANDABLE};
    gp_pytorch_result pt[2];
    for (int i = 0; i < 2; i++)
        if (gp_pytorch_replay(trace, policies[i], &pt[i], err, errlen) != 0)
            return -1;
    if (json) {
        fputs(",\"pytorch\":{", f);
        for (int i = 0; i < 2; i++) {
            double saved = pt[i].peak_reserved_bytes
                               ? 1.0 - (double)r->peak_reserved_bytes / (double)pt[i].peak_reserved_bytes
                               : 0.0;
            fprintf(f, "%s\"%s\":{\"peak_live_bytes\":%llu,\"peak_reserved_bytes\":%llu,\"reserved_over_live\":%.6f,"
                       "\"device_allocations\":%llu,\"gpupool_saves\":%.6f}",
                    i ? "," : "", gp_pytorch_policy_name(policies[i]), (unsigned long long)pt[i].peak_live_bytes,
                    (unsigned long long)pt[i].peak_reserved_bytes, pt[i].reserved_over_live,
                    (unsigned long long)pt[i].device_allocations, saved);
        }
        fputc('}', f);
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        char a[GP_SIZE_TEXT_MAX];
        double saved = pt[i].peak_reserved_bytes
                           ? 100.0 * (1.0 - (double)r->peak_reserved_bytes / (double)pt[i].peak_reserved_bytes)
                           : 0.0;
        fprintf(f, "  PyTorch %-13s reserved %s, reserved / live %.3f; gpupool reserves %.1f%% %s\n",
                gp_pytorch_policy_name(policies[i]), gp_format_size(pt[i].peak_reserved_bytes, a),
                pt[i].reserved_over_live, saved >= 0 ? saved : -saved, saved >= 0 ? "less" : "more");
    }
    return 0;
}
