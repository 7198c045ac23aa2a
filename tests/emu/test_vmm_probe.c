/*
 * test_vmm_probe.c — bench/gpu/vmm_probe.c (the questions about CUDA's virtual memory calls that
 * bench/gpu/run.sh asks a real GPU) run over the CUDA emulation: every question is asked and answered
 * as the emulation's rules say (an offset map refused under the header's "currently must be zero"; one
 * unmap over two whole adjacent mappings accepted; part of one mapping refused), every time line is
 * printed, and nothing is left behind (no handle, mapping or reservation at shutdown). What a GPU
 * answers is recorded in bench/RESULTS.md when one is lent; here only the program's own logic is
 * checked, so that the step that runs on the GPU cannot fail on its first real use.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define VMM_PROBE_NO_MAIN
#include "../../bench/gpu/vmm_probe.c"

#include "cuda_emu/cuda_emu.h"
#include "gpupool.h"
#include "gpupool_sim.h"
#include "emu_test.h"

#define MIB ((size_t)1 << 20)

static char output[16384];

/* Runs the probe with `reps` into output[]; returns its exit status. */
static int run_probe(unsigned reps)
{
    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile");
    if (f == NULL)
        return -1;
    int rc = vmm_probe_run(f, reps);
    rewind(f);
    size_t n = fread(output, 1, sizeof output - 1, f);
    output[n] = '\0';
    fclose(f);
    return rc;
}

static void every_question_is_answered_as_the_emulation_rules(void)
{
    CHECK(gpemu_init(1, 1024 * MIB) == 0, "gpemu_init");
    int rc = run_probe(4);
    fputs(output, stdout); /* what the GPU step prints, as the emulation answers */
    CHECK(rc == 0, "exit %d; output:\n%s", rc, output);
    CHECK(strstr(output, "page (minimum granularity) 2097152 bytes") != NULL, "the page:\n%s", output);
    CHECK(strstr(output, "(cuMemMap offset != 0): refused (CUDA_ERROR_INVALID_VALUE)") != NULL,
          "the offset map:\n%s", output);
    CHECK(gpemu_rule_count(GPEMU_RULE_MAP_OFFSET) == 1, "the offset rule fired %llu times",
          (unsigned long long)gpemu_rule_count(GPEMU_RULE_MAP_OFFSET));
    CHECK(strstr(output, "one unmap over two adjacent mappings: accepted") != NULL, "the spanning unmap:\n%s",
          output);
    CHECK(strstr(output, "two-page mapping (documented: refused): refused (CUDA_ERROR_INVALID_VALUE)") != NULL,
          "the partial unmap:\n%s", output);
    const char *times[] = {"time cuMemCreate of 1 page:", "time cuMemCreate of 64 pages:",
                           "time cuMemRelease of 8 pages:", "time cuMemMap of 1 page:",
                           "time cuMemSetAccess of 1 page:", "time cuMemSetAccess of a run of 4 one-page mappings:",
                           "time cuMemUnmap of 1 page:", "time cudaDeviceSynchronize of an idle device:",
                           "time cuMemMap of one 64-page mapping:", "time cuMemUnmap of one 64-page mapping:"};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++)
        CHECK(strstr(output, times[i]) != NULL, "no line '%s':\n%s", times[i], output);
    CHECK(strstr(output, "FAILED") == NULL, "a call that must work failed:\n%s", output);
    CHECK(strstr(output, "the replay's device-time model at these costs: gpupool replay --call-costs create=") != NULL,
          "no --call-costs line:\n%s", output);
    /* the offset map and the partial unmap are the only rules it breaks, both on purpose */
    CHECK(gpemu_violations() == gpemu_rule_count(GPEMU_RULE_MAP_OFFSET) + gpemu_rule_count(GPEMU_RULE_UNMAP_WHOLE),
          "other rules fired: %s", gpemu_first_violation());
    uint64_t before = gpemu_violations();
    CHECK(gpemu_shutdown() == before && gpemu_rule_count(GPEMU_RULE_FREE_POINTER) == 0,
          "%llu handles, mappings or reservations left behind",
          (unsigned long long)gpemu_rule_count(GPEMU_RULE_FREE_POINTER));
}

/* Each create, map, unmap and reservation of a run failing in turn: where the probe needed it, it says
 * which call failed and exits 1; where it was a question's own call, the answer says refused; either
 * way it undoes everything it made, except what the failed call itself left (an unmap that failed keeps
 * its mapping, so the reservation stays too: counted by the emulation as left behind, and excused here
 * only for a failed unmap). */
static void a_failing_call_is_named_and_leaves_nothing_behind(void)
{
    unsigned mask = GP_SIM_CALL_PHYS_CREATE | GP_SIM_CALL_MAP | GP_SIM_CALL_UNMAP | GP_SIM_CALL_VA_RESERVE;
    CHECK(gpemu_init(1, 1024 * MIB) == 0, "gpemu_init");
    CHECK(run_probe(3) == 0, "a clean run:\n%s", output);
    uint64_t calls = gp_sim_calls(gpemu_sim(0), mask);
    gpemu_shutdown();
    unsigned named = 0;
    for (uint64_t n = 1; n <= calls; n++) {
        CHECK(gpemu_init(1, 1024 * MIB) == 0, "gpemu_init");
        gp_sim_fail_call(gpemu_sim(0), n, mask, GP_ERR_OOM);
        int rc = run_probe(3);
        bool named_failure = strstr(output, "FAILED") != NULL;
        bool unmap_failed = strstr(output, "FAILED: cuMemUnmap") != NULL;
        uint64_t expected = gpemu_rule_count(GPEMU_RULE_MAP_OFFSET) + gpemu_rule_count(GPEMU_RULE_UNMAP_WHOLE);
        uint64_t total = gpemu_shutdown();
        CHECK(unmap_failed || (total == expected && gpemu_rule_count(GPEMU_RULE_FREE_POINTER) == 0),
              "call %llu failing: left behind or broke a rule (%s):\n%s", (unsigned long long)n,
              gpemu_first_violation(), output);
        CHECK(rc == (named_failure ? 1 : 0), "call %llu failing: exit %d:\n%s", (unsigned long long)n, rc, output);
        named += named_failure;
    }
    CHECK(calls >= 20 && named >= calls / 2, "%u of %llu runs named a failed call", named, (unsigned long long)calls);
}

static void bad_reps_are_refused_before_any_call(void)
{
    CHECK(gpemu_init(1, 64 * MIB) == 0, "gpemu_init");
    int rc = run_probe(0);
    CHECK(rc == 1 && strstr(output, "REPS must be 1-64, not 0") != NULL, "exit %d:\n%s", rc, output);
    rc = run_probe(65);
    CHECK(rc == 1 && strstr(output, "not 65") != NULL, "exit %d:\n%s", rc, output);
    CHECK(gpemu_violations() == 0, "a call was made: %s", gpemu_first_violation());
    CHECK(gpemu_shutdown() == 0, "left behind");
}

static void without_a_driver_nothing_is_asked(void)
{
    /* the emulation not started: the runtime answers as with no driver */
    int rc = run_probe(4);
    CHECK(rc == 77, "exit %d:\n%s", rc, output);
    CHECK(strstr(output, "nothing asked") != NULL, "%s", output);
}

int main(void)
{
    RUN(every_question_is_answered_as_the_emulation_rules);
    RUN(a_failing_call_is_named_and_leaves_nothing_behind);
    RUN(bad_reps_are_refused_before_any_call);
    RUN(without_a_driver_nothing_is_asked);
    return test_failures != 0;
}
