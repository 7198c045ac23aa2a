/*
 * test_vmm_faults.c — a fault sweep over every device call of the virtual memory paths (va_reserve,
 * va_release, phys_create, phys_release, map, set_access, unmap) and of pause and resume (their
 * unmaps, releases, creates, maps, copies and pinned staging memory), on sim-vmm.
 *
 * The workload (run_workload) is deterministic: two tenants and the default one on three streams,
 * growth in place, new ranges (vmm_reserve is small), stitching of free pages (no cache slack, small
 * segments), trims, a pause with contents, a free while paused, a resume, a pause without contents and
 * its resume, growth after resume. Run once without faults it tells how many device calls of a kind it
 * makes. Then for every N from 1 to that count + 1 it runs again on a fresh pool with the Nth call of
 * that kind failing (one-shot, GP_ERR_DEVICE or GP_ERR_OOM); everything before call N is as in the
 * clean run, so call N happens and fails. The rules, at every step:
 *   - a call succeeds, or fails with GP_ERR_DEVICE / GP_ERR_OOM and a message, and only when the fault
 *     fired inside it; a failed allocation changes no live accounting; retried once, it succeeds;
 *   - gp_check(pool) == GP_OK after every step;
 *   - a failed pause is rolled back (the tenant runs, its contents intact); a failed resume leaves the
 *     tenant paused, and the retry brings its contents back;
 * and at the end: every live block holds its pattern (CHECK kernels through the sim, on physical pages),
 * no race, no mismatch, no bad device call, the sim holds exactly what the pool reserves, everything
 * frees, and the sim's ledger shows no leaked byte, handle, mapping or reservation.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
/* 2 MiB large segments keep the cache cap's floor low, so that with no slack growth past the peak
 * stitches; 24 MiB ranges make the larger requests reserve new ones. */
#define CONFIG "device_memory:64MiB,cache_slack:0,large_segment:2MiB,vmm_reserve:24MiB"
#define VMM_CALLS                                                                                              \
    (GP_SIM_CALL_VA_RESERVE | GP_SIM_CALL_VA_RELEASE | GP_SIM_CALL_PHYS_CREATE | GP_SIM_CALL_PHYS_RELEASE |    \
     GP_SIM_CALL_MAP | GP_SIM_CALL_SET_ACCESS | GP_SIM_CALL_UNMAP)
#define PAUSE_CALLS (VMM_CALLS | GP_SIM_CALL_COPY | GP_SIM_CALL_HOST_ALLOC)
#define MAX_BLOCKS 16

typedef struct block {
    void *p;
    size_t size;
    int stream;
    uint64_t seed;
    bool live;
    bool written; /* its pattern is valid (false after a pause without contents, until rewritten) */
} block;

typedef struct run {
    gp_pool *pool;
    gp_sim *sim;
    gp_stream s[3]; /* s[0]: tenant a, s[1]: tenant b, s[2]: default */
    block b[MAX_BLOCKS];
    size_t step;
    unsigned retried;
} run;

static void open_run(run *r)
{
    memset(r, 0, sizeof *r);
    unsetenv("GPUPOOL_CONF");
    cr_assert_eq(gp_pool_create(&r->pool, 0, "sim-vmm", CONFIG), GP_OK, "%s", gp_last_error());
    r->sim = gp_sim_of(r->pool);
    gp_sim_retain(r->sim);
    for (int i = 0; i < 3; i++)
        r->s[i] = gp_sim_stream_create(r->sim);
    cr_assert_eq(gp_tenant_create(r->pool, "a", NULL), GP_OK);
    cr_assert_eq(gp_tenant_create(r->pool, "b", NULL), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(r->pool, "a", r->s[0]), GP_OK);
    cr_assert_eq(gp_tenant_bind_stream(r->pool, "b", r->s[1]), GP_OK);
}

static gp_stats stats_of(run *r)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(r->pool, &s), GP_OK, "%s", gp_last_error());
    return s;
}

/* After every step: the pool is consistent. */
static void step_done(run *r, const char *what)
{
    r->step++;
    cr_assert_eq(gp_check(r->pool), GP_OK, "step %zu (%s): %s", r->step, what, gp_last_error());
}

/* A call's result under the rules above: GP_OK, or a fault's error with a message (then retried). */
static bool failed_by_fault(run *r, int rc, uint64_t fired_before, const char *what)
{
    if (rc == GP_OK)
        return false;
    cr_assert(rc == GP_ERR_DEVICE || rc == GP_ERR_OOM, "step %zu (%s): %d %s", r->step, what, rc, gp_last_error());
    cr_assert_gt(gp_sim_faults_injected(r->sim), fired_before, "step %zu (%s) failed with no fault: %s", r->step,
                 what, gp_last_error());
    cr_assert_neq(strlen(gp_last_error()), 0, "step %zu (%s): no message", r->step, what);
    cr_assert_eq(gp_check(r->pool), GP_OK, "step %zu (%s) after its fault: %s", r->step, what, gp_last_error());
    r->retried++;
    return true;
}

/*
 * Patterns go on 4 KiB at the start of every 2 MiB page of a block and on its last 4 KiB: a page that
 * lost its contents or was mapped at the wrong place shows, and the sweep's hundreds of runs stay cheap
 * (kernels cost host time in proportion to their bytes).
 */
#define PAGE ((size_t)2 << 20)
#define PROBE ((size_t)4 << 10)

static void launch_probes(run *r, int i, int op)
{
    block *b = &r->b[i];
    for (size_t at = 0; at < b->size; at += PAGE) {
        size_t len = b->size - at < PROBE ? b->size - at : PROBE;
        cr_assert_eq(gp_sim_launch(r->sim, r->s[b->stream], (char *)b->p + at, len, op, b->seed + at, 100), GP_OK,
                     "%s", gp_sim_first_violation(r->sim));
    }
    if (b->size > PROBE)
        cr_assert_eq(gp_sim_launch(r->sim, r->s[b->stream], (char *)b->p + b->size - PROBE, PROBE, op, b->seed + 1,
                                   100),
                     GP_OK, "%s", gp_sim_first_violation(r->sim));
}

static void write_block(run *r, int i)
{
    launch_probes(r, i, GP_SIM_WRITE);
    r->b[i].written = true;
}

static void check_block(run *r, int i)
{
    if (r->b[i].live && r->b[i].written)
        launch_probes(r, i, GP_SIM_CHECK);
}

static void check_all(run *r, const char *what)
{
    for (int i = 0; i < MAX_BLOCKS; i++)
        check_block(r, i);
    gp_sim_synchronize(r->sim);
    gp_sim_report rep;
    gp_sim_get_report(r->sim, &rep);
    cr_assert_eq(rep.pattern_mismatches, 0, "after %s (step %zu): %s", what, r->step, gp_sim_first_violation(r->sim));
}

static void alloc_block(run *r, int i, size_t size, int stream)
{
    block *b = &r->b[i];
    uint64_t fired = gp_sim_faults_injected(r->sim);
    size_t allocated = stats_of(r).allocated_bytes;
    int rc = gp_alloc(r->pool, &b->p, size, r->s[stream]);
    if (failed_by_fault(r, rc, fired, "alloc")) {
        cr_assert_null(b->p);
        cr_assert_eq(stats_of(r).allocated_bytes, allocated, "a failed allocation changed the live bytes");
        rc = gp_alloc(r->pool, &b->p, size, r->s[stream]);
        cr_assert_eq(rc, GP_OK, "step %zu: retried alloc of %zu: %s", r->step, size, gp_last_error());
    }
    b->size = size;
    b->stream = stream;
    b->seed = 1000 + (uint64_t)i * 7 + r->step;
    b->live = true;
    write_block(r, i);
    step_done(r, "alloc");
}

static void free_block(run *r, int i)
{
    block *b = &r->b[i];
    cr_assert_eq(gp_free(r->pool, b->p, r->s[b->stream]), GP_OK, "step %zu: %s", r->step, gp_last_error());
    b->live = false;
    step_done(r, "free");
}

static void trim(run *r)
{
    uint64_t fired = gp_sim_faults_injected(r->sim);
    if (failed_by_fault(r, gp_trim(r->pool, 0, NULL), fired, "trim"))
        cr_assert_eq(gp_trim(r->pool, 0, NULL), GP_OK, "retried trim: %s", gp_last_error());
    step_done(r, "trim");
    check_all(r, "trim");
}

static gp_tenant_stats tenant_of(run *r, const char *name)
{
    gp_tenant_stats t = {.size = sizeof t, .version = GP_TENANT_STATS_VERSION};
    cr_assert_eq(gp_tenant_get_stats(r->pool, name, &t), GP_OK);
    return t;
}

static void pause_tenant(run *r, const char *name, int stream, unsigned flags)
{
    gp_sim_synchronize(r->sim);
    uint64_t fired = gp_sim_faults_injected(r->sim);
    int rc = gp_tenant_pause(r->pool, name, flags);
    if (failed_by_fault(r, rc, fired, "pause")) {
        cr_assert(strstr(gp_last_error(), "rolled back") != NULL, "%s", gp_last_error());
        cr_assert(!tenant_of(r, name).paused, "a failed pause is rolled back");
        check_all(r, "a failed pause"); /* the tenant's contents survived, with or without staging */
        rc = gp_tenant_pause(r->pool, name, flags);
        cr_assert_eq(rc, GP_OK, "retried pause: %s", gp_last_error());
    }
    cr_assert(tenant_of(r, name).paused);
    if (!(flags & GP_PAUSE_KEEP_CONTENTS))
        for (int i = 0; i < MAX_BLOCKS; i++)
            if (r->b[i].stream == stream)
                r->b[i].written = false; /* resume maps fresh pages: the contents are not kept */
    step_done(r, "pause");
}

static void resume_tenant(run *r, const char *name)
{
    uint64_t fired = gp_sim_faults_injected(r->sim);
    int rc = gp_tenant_resume(r->pool, name);
    if (failed_by_fault(r, rc, fired, "resume")) {
        cr_assert(tenant_of(r, name).paused, "a failed resume leaves the tenant paused");
        rc = gp_tenant_resume(r->pool, name);
        cr_assert_eq(rc, GP_OK, "retried resume: %s", gp_last_error());
    }
    cr_assert(!tenant_of(r, name).paused);
    step_done(r, "resume");
    check_all(r, "resume");
}

static void run_workload(run *r)
{
    /* growth in place and new ranges; small and large blocks */
    alloc_block(r, 0, 4 * MIB, 0);
    alloc_block(r, 1, 64 * KIB, 0);
    alloc_block(r, 2, 6 * MIB, 0);
    alloc_block(r, 3, 10 * MIB, 1);
    alloc_block(r, 4, 2 * MIB, 1);
    alloc_block(r, 5, 3 * MIB, 1);
    free_block(r, 3); /* 10 MiB of b's cache, between live blocks */
    alloc_block(r, 6, 12 * MIB, 2); /* past the cap: stitches b's free pages */
    alloc_block(r, 7, 20 * MIB, 0); /* a new range for a (vmm_reserve 24 MiB) */
    free_block(r, 7);
    trim(r);
    /* pause with contents, a free while paused, resume */
    pause_tenant(r, "a", 0, GP_PAUSE_KEEP_CONTENTS);
    free_block(r, 0);
    resume_tenant(r, "a");
    /* pause without contents and resume; b's blocks are written again afterwards */
    pause_tenant(r, "b", 1, 0);
    resume_tenant(r, "b");
    write_block(r, 4);
    write_block(r, 5);
    /* growth after resume, then everything cached goes back */
    alloc_block(r, 8, 8 * MIB, 0);
    alloc_block(r, 9, 5 * MIB, 1);
    free_block(r, 2);
    trim(r);
}

static void finish_run(run *r)
{
    gp_sim_fail_call(r->sim, 0, 0, 0);
    check_all(r, "the workload");
    gp_sim_report rep;
    gp_sim_get_report(r->sim, &rep);
    cr_assert_eq(rep.races, 0, "%s", gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.bad_calls, 0, "%s", gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.allocated_bytes, stats_of(r).reserved_bytes, "the sim holds %llu bytes, the pool reserves %llu",
                 (unsigned long long)rep.allocated_bytes, (unsigned long long)stats_of(r).reserved_bytes);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (r->b[i].live)
            free_block(r, i);
    cr_assert_eq(stats_of(r).allocated_bytes, 0);
    cr_assert_eq(gp_trim(r->pool, 0, NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(stats_of(r).reserved_bytes, 0, "every page went back");
    gp_leak_report leaks = {99, 99};
    cr_assert_eq(gp_pool_destroy(r->pool, &leaks), GP_OK, "%s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, 0);
    gp_sim_get_report(r->sim, &rep);
    cr_assert_eq(rep.leaked_bytes_at_close, 0, "%s", gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.leaked_handles_at_close, 0);
    cr_assert_eq(rep.leaked_mappings_at_close, 0);
    cr_assert_eq(rep.leaked_reservations_at_close, 0);
    cr_assert_eq(rep.bad_calls, 0, "%s", gp_sim_first_violation(r->sim));
    gp_sim_release(r->sim);
}

/* The clean run: how many calls of `mask` it makes, and that it reaches the paths it means to. */
static uint64_t clean_run(unsigned mask)
{
    run r;
    open_run(&r);
    uint64_t before = gp_sim_calls(r.sim, mask);
    run_workload(&r);
    uint64_t calls = gp_sim_calls(r.sim, mask) - before;
    gp_stats s = stats_of(&r);
    cr_assert_eq(r.retried, 0);
    cr_assert_geq(s.num_stitches, 1, "the workload should stitch");
    static const unsigned kinds[] = {GP_SIM_CALL_VA_RESERVE, GP_SIM_CALL_VA_RELEASE, GP_SIM_CALL_PHYS_CREATE,
                                     GP_SIM_CALL_PHYS_RELEASE, GP_SIM_CALL_MAP, GP_SIM_CALL_SET_ACCESS,
                                     GP_SIM_CALL_UNMAP, GP_SIM_CALL_COPY, GP_SIM_CALL_HOST_ALLOC};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (mask & kinds[k])
            cr_assert_gt(gp_sim_calls(r.sim, kinds[k]), 0, "the workload makes no call of kind 0x%x", kinds[k]);
    finish_run(&r);
    return calls;
}

static void sweep(unsigned mask, int error)
{
    uint64_t calls = clean_run(mask);
    cr_assert_gt(calls, 10);
    unsigned surfaced = 0;
    for (uint64_t n = 1; n <= calls + 1; n++) {
        run r;
        open_run(&r);
        gp_sim_fail_call(r.sim, n, mask, error);
        run_workload(&r);
        cr_assert_eq(gp_sim_faults_injected(r.sim), n <= calls ? 1 : 0, "fault #%llu of %llu",
                     (unsigned long long)n, (unsigned long long)calls);
        surfaced += r.retried;
        finish_run(&r);
    }
    cr_log_info("mask 0x%x, error %d: %llu faults injected, %u made an API call fail (each retried successfully)",
                mask, error, (unsigned long long)calls, surfaced);
    cr_assert_gt(surfaced, 0, "no injected fault ever surfaced as an error");
}

TestSuite(vmm_faults);

Test(vmm_faults, every_vmm_and_pause_call_fails_once_with_device_error, .timeout = 240)
{
    sweep(PAUSE_CALLS, GP_ERR_DEVICE);
}

Test(vmm_faults, every_vmm_and_pause_call_fails_once_with_oom, .timeout = 240)
{
    sweep(PAUSE_CALLS, GP_ERR_OOM);
}
