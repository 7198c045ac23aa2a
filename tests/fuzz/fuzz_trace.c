/*
 * fuzz_trace.c — libFuzzer target: the trace reader (cli/trace.c, RMM allocation-log CSV) on any
 * bytes, and a replay of every trace it accepts on a small simulated GPU.
 *
 * Rules checked (abort() when one breaks, so libFuzzer keeps the input):
 *   - gp_trace_parse either fails with a message or returns a trace whose tables agree: counts add up
 *     (events = allocs + frees + failures), every allocation has its own slot in order, every free
 *     names a slot allocated before it and not freed since, stream indexes are in range, and the
 *     per-slot tables match the events;
 *   - a trace that parses (up to 4096 events, none too) replays on the sim (128 MiB device, 2 passes)
 *     without a setup error, and leaves nothing allocated after its last pass. A free is refused only
 *     when it names a stream other than its allocation's (a stream no allocation may have used: the
 *     pool answers GP_ERR_UNKNOWN_STREAM), and then it is counted, not forgotten (issue 9, finding 8):
 *     a trace whose frees are all on their allocation's stream has no failed free. The sanitizer
 *     builds catch what goes wrong inside (leaks, overflows, NULL + 0 on a header-only trace).
 * Also the input's first line as `replay --call-costs`'s value (gp_call_costs_parse): refused with a
 * message and nothing changed, or every cost accepted is a number from 0 to 1e9.
 * FUZZ_TRACE_VERBOSE=1 in the environment prints what the reader said of each input.
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

/* True when a free is on a stream other than its allocation's (the pool may refuse it). */
static bool frees_on_other_streams(const gp_trace *t)
{
    for (size_t i = 0; i < t->num_events; i++)
        if (t->events[i].kind == GP_EV_FREE && t->events[i].stream != t->slot_stream[t->events[i].slot])
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input's first line as replay's --call-costs value: either refused with a message and the costs
 * as they were, or accepted with every cost a number from 0 to 1e9 (microseconds). */
static void check_call_costs(const uint8_t *data, size_t size)
{
    char text[256], err[256];
    size_t n = 0;
    while (n < size && n < sizeof text - 1 && data[n] != '\n')
        n++;
    memcpy(text, data, n);
    text[n] = '\0';
    gp_call_costs before = gp_call_costs_published(), c = before;
    err[0] = '\0';
    if (gp_call_costs_parse(text, &c, err, sizeof err) != 0) {
        CHECK(err[0] != '\0', "gp_call_costs_parse failed without a message");
        CHECK(gp_call_costs_equal(&c, &before), "a refused --call-costs changed the costs");
        return;
    }
    const double v[] = {c.create_us, c.map_us, c.unmap_us, c.set_access_us, c.sync_us};
    for (int i = 0; i < 5; i++)
        CHECK(v[i] >= 0 && v[i] <= 1e9, "an accepted --call-costs has a cost outside 0..1e9");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gp_trace trace;
    char err[512];
    err[0] = '\0';
    check_call_costs(data, size);
    int rc = gp_trace_parse(&trace, "fuzz.csv", (const char *)data, size, err, sizeof err);
    if (getenv("FUZZ_TRACE_VERBOSE") != NULL)
        fprintf(stderr, "  %s\n", rc != 0 ? err : "parsed");
    if (rc != 0) {
        CHECK(err[0] != '\0', "gp_trace_parse failed without a message");
        CHECK(strncmp(err, "fuzz.csv", 8) == 0, err);
        return 0;
    }
    check_tables(&trace);
    if (trace.num_events <= 4096) {
        unsetenv("GPUPOOL_CONF");
        gp_replay_options opt = {.device_memory = "128MiB", .conf = NULL, .repeat = 2};
        gp_replay_result *res = calloc(1, sizeof *res);
        CHECK(res != NULL, "out of memory");
        CHECK(gp_replay_run(&trace, &opt, res, err, sizeof err) == 0, err);
        CHECK(res->failed_frees == 0 || frees_on_other_streams(&trace), res->first_failure);
        CHECK(res->allocated_bytes_end == 0, "the replay left blocks allocated after its last pass");
        if (getenv("FUZZ_TRACE_VERBOSE") != NULL)
            fprintf(stderr, "  replayed %zu events twice, %llu allocations failed\n", trace.num_events,
                    (unsigned long long)res->failed_allocations);
        free(res);
    }
    gp_trace_free(&trace);
    return 0;
}
