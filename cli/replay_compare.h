/*
 * replay_compare.h — `gpupool replay --compare pytorch`: PyTorch's figure beside gpupool's for a trace
 * (PyTorch's default and expandable-segments policies, pytorch_policy.h, replayed on the same trace).
 */
#ifndef GP_CLI_REPLAY_COMPARE_H
#define GP_CLI_REPLAY_COMPARE_H

#include <stdio.h>

#include "replay.h"
#include "trace.h"

/* The allocators `--compare` accepts; 0 if `name` is one of them, else -1 with a message in err. */
int gp_compare_check(const char *name, char *err, size_t errlen);

/* Replays `trace` under both PyTorch policies and prints them beside gpupool's result `r`: text lines
 * for the text report, or (json) the members `,"pytorch":{...}` to put inside the trace's object.
 * Returns 0, or -1 with a message in err. */
int gp_compare_pytorch_print(FILE *f, const gp_trace *trace, const gp_replay_result *r, int json, char *err,
                             size_t errlen);

#endif /* GP_CLI_REPLAY_COMPARE_H */
