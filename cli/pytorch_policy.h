/*
 * pytorch_policy.h — PyTorch's CUDA caching allocator policy, replayed on a parsed trace, so that a user
 * without a GPU sees the device memory PyTorch would have reserved for the same allocations
 * (`gpupool replay --compare pytorch`, and the "pytorch" figure of `gpupool plan`).
 *
 * Two policies, as ../shared/tools/pytorch_policy_model.py describes them (and CUDACachingAllocator.cpp
 * implements them, with default settings, on a device large enough that it never runs out):
 *
 *   default     sizes rounded up to 512 B; <= 1 MiB from the small pool, larger from the large pool;
 *               a new segment is 2 MiB (small), 20 MiB (large request < 10 MiB) or the size rounded up
 *               to 2 MiB; best fit (smallest free block that fits, lowest address on ties); split when
 *               the remainder is >= 512 B (small) or > 1 MiB (large); free neighbours in one segment
 *               coalesce; segments are never released.
 *   expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: each pool is one address range whose
 *               end is mapped on demand in pages of 2 MiB (small) or 20 MiB (large); when no free block
 *               fits, just enough pages are mapped after the free block at the end (or after the last
 *               block) and merged with it; best fit otherwise, except that the free block touching the
 *               mapped end is passed over when another fits; any remainder >= 512 B is split off;
 *               nothing is unmapped. Reserved = mapped bytes.
 *
 * In both, free blocks and segments belong to the stream of the allocation that made them: a block is
 * reused only by later allocations on its own stream. An allocation of 0 bytes takes a 512 B block, as
 * in PyTorch's model; `allocate failure` lines are not replayed.
 */
#ifndef GP_CLI_PYTORCH_POLICY_H
#define GP_CLI_PYTORCH_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "trace.h"

typedef enum gp_pytorch_policy {
    GP_PYTORCH_DEFAULT = 0,
    GP_PYTORCH_EXPANDABLE = 1,
} gp_pytorch_policy;

typedef struct gp_pytorch_result {
    uint64_t peak_live_bytes;     /* largest sum of requested sizes live at once */
    uint64_t peak_reserved_bytes; /* default: sum of segment sizes; expandable: mapped bytes */
    uint64_t end_reserved_bytes;  /* the same at the end (equal to the peak: nothing is released) */
    uint64_t device_allocations;  /* default: cudaMalloc calls (segments); expandable: map operations */
    double reserved_over_live;    /* peak_reserved_bytes / peak_live_bytes (0 when nothing was live) */
} gp_pytorch_result;

/* "default" or "expandable". */
const char *gp_pytorch_policy_name(gp_pytorch_policy policy);

/* Replays `trace` under `policy`. Returns 0, or -1 with a message in err (out of host memory). */
int gp_pytorch_replay(const gp_trace *trace, gp_pytorch_policy policy, gp_pytorch_result *result, char *err,
                      size_t errlen);

#endif /* GP_CLI_PYTORCH_POLICY_H */
