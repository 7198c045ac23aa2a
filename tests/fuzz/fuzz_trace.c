/*
 * fuzz_trace.c — libFuzzer target: the trace reader (cli/trace.c, RMM allocation-log CSV) on any
 * bytes, and a replay of every trace it accepts on a small simulated GPU.
 *
 * Rules checked (abort() when one breaks, so libFuzzer keeps the input):
 *   - gp_trace_parse either fails with a message or returns a trace whose tables agree: counts add up
 *     (events = allocs + frees + failures), every allocation has its own slot in order, every free
 *     names a slot allocated before it and not freed since, stream indexes are in range, and the
 *     per-slot tables match the events;
 *   - a trace that parses replays on the sim (128 MiB device, 2 passes) without a failed free and
 *     without a setup error (the sanitizer builds catch what goes wrong inside: leaks, overflows).
 * FUZZ_TRACE_VERBOSE=1 in the environment prints what the reader said of each input.
 * Avoided for now (known findings of issue 9, being fixed on branch issue-9):
 *   KNOWN(7): replay.c computes NULL + 0 on a trace with no replayable event: no replay without one.
 *   KNOWN(8): a free whose stream no allocation used is refused and the block forgotten: such
 *             traces are parsed but not replayed (the free's stream is its allocation's).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "trace.h"

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_trace: %s%s%s\n", what, detail != NULL ? ": " : "", detail != NULL ? detail : "");
    abort();
}

#define CHECK(cond, detail)                                                                                    \
    do {                                                                                                       \
        if (!(cond))                                                                                           \
            fail("check failed: " #cond, (detail));                                                           \
    } while (0)

static void check_tables(const gp_trace *t)
{
    CHECK(t->num_events == t->num_allocs + t->num_frees + t->num_alloc_failures, "event counts do not add up");
    CHECK(t->num_streams <= GP_TRACE_MAX_STREAMS, "more streams than the reader allows");
    CHECK(t->num_lines >= 1, "a parsed trace has no header line");
    bool *freed = calloc(t->num_allocs + 1, 1);
    CHECK(freed != NULL, "out of memory");
    size_t allocs = 0, frees = 0, failures = 0;
    for (size_t i = 0; i < t->num_events; i++) {
        const gp_trace_event *e = &t->events[i];
        CHECK(e->stream < t->num_streams, "an event's stream index is out of range");
        switch (e->kind) {
        case GP_EV_ALLOC:
            CHECK(e->slot == allocs, "allocations do not take slots in order");
            CHECK(t->slot_size[e->slot] == e->size && t->slot_stream[e->slot] == e->stream,
                  "the slot tables do not match the allocation");
            allocs++;
            break;
        case GP_EV_FREE:
            CHECK(e->slot < allocs, "a free names a slot not yet allocated");
            CHECK(!freed[e->slot], "a slot is freed twice");
            freed[e->slot] = true;
            frees++;
            break;
        case GP_EV_ALLOC_FAILURE:
            CHECK(e->slot == GP_TRACE_NO_SLOT, "an allocation failure has a slot");
            failures++;
            break;
        default:
            fail("an event of unknown kind", NULL);
        }
    }
    free(freed);
    CHECK(allocs == t->num_allocs && frees == t->num_frees && failures == t->num_alloc_failures,
          "the counts do not match the events");
}

/* KNOWN(8): true when a free is on a stream other than its allocation's. */
static bool frees_on_other_streams(const gp_trace *t)
{
    for (size_t i = 0; i < t->num_events; i++)
        if (t->events[i].kind == GP_EV_FREE && t->events[i].stream != t->slot_stream[t->events[i].slot])
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gp_trace trace;
    char err[512];
    err[0] = '\0';
    int rc = gp_trace_parse(&trace, "fuzz.csv", (const char *)data, size, err, sizeof err);
    if (getenv("FUZZ_TRACE_VERBOSE") != NULL)
        fprintf(stderr, "  %s\n", rc != 0 ? err : "parsed");
    if (rc != 0) {
        CHECK(err[0] != '\0', "gp_trace_parse failed without a message");
        CHECK(strncmp(err, "fuzz.csv", 8) == 0, err);
        return 0;
    }
    check_tables(&trace);
    if (trace.num_events > 0 && trace.num_events <= 4096 && !frees_on_other_streams(&trace)) {
        unsetenv("GPUPOOL_CONF");
        gp_replay_options opt = {.device_memory = "128MiB", .conf = NULL, .repeat = 2};
        gp_replay_result *res = calloc(1, sizeof *res);
        CHECK(res != NULL, "out of memory");
        CHECK(gp_replay_run(&trace, &opt, res, err, sizeof err) == 0, err);
        CHECK(res->failed_frees == 0, res->first_failure);
        if (getenv("FUZZ_TRACE_VERBOSE") != NULL)
            fprintf(stderr, "  replayed %zu events twice, %llu allocations failed\n", trace.num_events,
                    (unsigned long long)res->failed_allocations);
        free(res);
    }
    gp_trace_free(&trace);
    return 0;
}
