/*
 * plan_compose.c — what the memory at a trace's peak is made of, from the trace alone.
 *
 * Every allocation alive at the moment of peak live bytes goes into one of four parts:
 *   resident before the first step   alive until the last allocation of the trace (freed only in the
 *                                    teardown after it, or never) and allocated before the first step:
 *                                    parameters and buffers;
 *   resident from the first step on  alive until the end too, allocated from the first step on:
 *                                    optimizer state, gradients kept between steps, caches;
 *   per step                         freed before the end, alive longer than a temporary: activations
 *                                    kept for the backward pass, gradients;
 *   temporaries                      freed within a few allocations: workspaces, intermediate results.
 * The parts sum to the peak live bytes (asserted).
 *
 * Two boundaries come from the trace itself, not from constants fitted to any trace:
 *   - the first step starts at the first allocation at which the bytes of the allocations that do not
 *     live to the end (the transient ones) pass an eighth of their own peak: a step's activations are
 *     building up; a model's construction makes few and small transient allocations;
 *   - a temporary lives at most max(8, 1%) of the allocations made from the first step on: an operation
 *     makes a handful of allocations, an activation outlives a large part of a step.
 * Where it can be wrong (README: "What the memory is made of"): a model whose construction makes large
 * temporaries (over an eighth of a step's activations) moves the step's start early, so parameters made
 * after it count as resident from the first step on; gradients freed at every step (zero_grad with
 * set_to_none) are per step, gradients kept are resident from the first step on; a trace that ends
 * without a teardown counts whatever was alive at its last allocation as resident; the lifetime limit
 * for temporaries counts allocations, not time, so a long-lived buffer in a trace with very few
 * allocations may pass for a temporary.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define NOT_FREED SIZE_MAX

const char *gp_part_name(int part)
{
    static const char *const names[GP_PARTS] = {"resident before the first step", "resident from the first step on",
                                                "per step (activations, gradients)", "temporaries"};
    return part >= 0 && part < GP_PARTS ? names[part] : "?";
}

int gp_compose(const gp_trace *t, gp_composition *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    size_t n = t->num_allocs;
    size_t *freed_at = malloc((n ? n : 1) * sizeof *freed_at); /* allocations made before its free */
    uint8_t *live = calloc(n ? n : 1, 1);
    if (freed_at == NULL || live == NULL) {
        free(freed_at);
        free(live);
        snprintf(err, errlen, "%s: out of host memory", t->path);
        return -1;
    }
    for (size_t s = 0; s < n; s++)
        freed_at[s] = NOT_FREED;
    size_t allocs = 0;
    for (size_t e = 0; e < t->num_events; e++) {
        const gp_trace_event *ev = &t->events[e];
        if (ev->kind == GP_EV_ALLOC)
            allocs++;
        else if (ev->kind == GP_EV_FREE)
            freed_at[ev->slot] = allocs;
    }
    /* resident: alive when the last allocation is made */
#define RESIDENT(s) (freed_at[s] == NOT_FREED || freed_at[s] >= n)
    /* the transient bytes' own peak, then the first allocation passing an eighth of it */
    uint64_t transient = 0, transient_peak = 0;
    for (size_t e = 0; e < t->num_events; e++) {
        const gp_trace_event *ev = &t->events[e];
        if (ev->kind == GP_EV_ALLOC && !RESIDENT(ev->slot)) {
            transient += ev->size;
            if (transient > transient_peak)
                transient_peak = transient;
        } else if (ev->kind == GP_EV_FREE && !RESIDENT(ev->slot)) {
            transient -= ev->size;
        }
    }
    out->first_step_slot = 0;
    out->first_step_found = 0;
    transient = 0;
    for (size_t e = 0; e < t->num_events && !out->first_step_found; e++) {
        const gp_trace_event *ev = &t->events[e];
        if (ev->kind == GP_EV_ALLOC && !RESIDENT(ev->slot)) {
            transient += ev->size;
            if (transient_peak > 0 && transient * 8 > transient_peak) {
                out->first_step_slot = ev->slot;
                out->first_step_found = 1;
            }
        } else if (ev->kind == GP_EV_FREE && !RESIDENT(ev->slot)) {
            transient -= ev->size;
        }
    }
    if (!out->first_step_found) /* nothing transient at all: the first allocation starts the "step" */
        out->first_step_slot = 0;
    size_t from_step = n - out->first_step_slot;
    out->temporary_lifetime = from_step / 100 > 8 ? from_step / 100 : 8;
    /* the moment of the peak */
    uint64_t bytes = 0;
    for (size_t e = 0; e < t->num_events; e++) {
        const gp_trace_event *ev = &t->events[e];
        if (ev->kind == GP_EV_ALLOC) {
            bytes += ev->size;
            if (bytes > out->peak_live_bytes) {
                out->peak_live_bytes = bytes;
                out->peak_event = e;
            }
        } else if (ev->kind == GP_EV_FREE) {
            bytes -= ev->size;
        }
    }
    for (size_t e = 0; e < t->num_events && n > 0; e++) {
        const gp_trace_event *ev = &t->events[e];
        if (ev->kind == GP_EV_ALLOC)
            live[ev->slot] = 1;
        else if (ev->kind == GP_EV_FREE)
            live[ev->slot] = 0;
        if (e == out->peak_event)
            break;
    }
    uint64_t sum = 0;
    for (size_t s = 0; s < n; s++) {
        if (!live[s])
            continue;
        int part;
        if (RESIDENT(s))
            part = s < out->first_step_slot ? GP_PART_RESIDENT_BEFORE : GP_PART_RESIDENT_FROM_STEP;
        else
            part = freed_at[s] - s <= out->temporary_lifetime ? GP_PART_TEMPORARY : GP_PART_PER_STEP;
        out->part_bytes[part] += t->slot_size[s];
        sum += t->slot_size[s];
    }
#undef RESIDENT
    /* the same allocations are alive at the peak, so the parts add up to it */
    assert(n == 0 || sum == out->peak_live_bytes);
    free(freed_at);
    free(live);
    return 0;
}
