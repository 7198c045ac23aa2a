/*
 * test_faults.c — device faults injected into every device call of a fixed workload.
 *
 * The workload (run_workload) is deterministic: three streams, blocks of several sizes with WRITE
 * patterns, record_stream, frees on other streams (PENDING blocks), a steal of an idle segment, a
 * steal that waits on a busy one at device OOM, an allocation met only by releasing cached segments,
 * an allocation that must fail with GP_ERR_OOM, and trims. Run once without faults it tells how many
 * device calls it makes (gp_sim_calls). Then, for every N from 1 to that count + 1, it runs again on a
 * fresh pool with the Nth device call failing (gp_sim_fail_call, one-shot). Because everything before
 * call N is the same as in the clean run, call N happens and fails. The rules checked at every step:
 *   - a call succeeds, or fails with GP_ERR_DEVICE / GP_ERR_OOM, a non-empty gp_last_error(), and only
 *     when the fault fired inside it; a failed alloc or free changes no live accounting;
 *   - retried once, the call succeeds (an allocation meant to fail then fails with GP_ERR_OOM);
 *   - gp_check(pool) == GP_OK after every step;
 *   - a gp_trim whose mem_free failed keeps that segment cached (reserved drops by exactly what it
 *     reports released), and the retry releases it;
 * and at the end: every live block still holds its pattern (CHECK kernels), the sim saw no race, no
 * mismatch and no bad call, everything frees, destroy reports no live block, and the sim's ledger
 * shows no leaked byte or event.
 *
 * Faults inside gp_pool_destroy are tested apart: destroy must not leak host memory (the ASan build
 * checks), and whatever the device could not take back is reported (GP_ERR_DEVICE and a message),
 * never left silently in the ledger.
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
#define DEVICE_MIB 20
/* The segment policy is pinned so that the workload's sizes mean what the comments say: small
 * segments of 2 MiB for requests up to 1 MiB, large ones of 6 MiB, and a segment of its own for 4 MiB
 * and more. The device is small, so that the workload reaches device OOM with few, small blocks (the
 * sweep runs it over a hundred times; kernels cost host time in proportion to their bytes). */
#define CONFIG                                                                                                 \
    "device_memory:20MiB,small_size:1MiB,small_segment:2MiB,large_segment:6MiB,huge_size:4MiB,"            \
    "steal_wait:true,pending_scan:8"
/* Without the cache-slack policy (which gives cached segments back before growing), growth stops only
 * at device OOM, so the workload reaches the OOM -> release -> retry path. */
#define CONFIG_NO_SLACK CONFIG ",cache_slack:off"
/* The default policy with a tight cap (cache_slack 0, and 2 MiB large segments so that its floor of a
 * few large segments is low): above the cap a stream steals idle segments before it grows, and gives
 * cached segments back to stay under it. */
#define CONFIG_TIGHT                                                                                           \
    "device_memory:20MiB,small_size:1MiB,small_segment:2MiB,large_segment:2MiB,huge_size:4MiB,"            \
    "steal_wait:true,pending_scan:8,cache_slack:0"
/* The destroy and trim tests: 20 MiB large segments, 10 MiB and more on their own. */
#define CONFIG_BIG                                                                                             \
    "device_memory:64MiB,small_size:1MiB,small_segment:2MiB,large_segment:20MiB,huge_size:10MiB,"          \
    "cache_slack:off"
#define MAX_BLOCKS 96
#define FILLER0 32 /* slots from here on hold the fillers */
#define MAX_STEPS 128

typedef struct block {
    void *p;
    size_t size;
    int stream; /* index of the stream it was allocated on */
    uint64_t seed;
    bool live;
} block;

/* What the clean run saw, for comparisons in the faulted runs. */
typedef struct baseline {
    bool recorded;
    size_t steps;
    uint64_t reserved_after[MAX_STEPS];
    uint64_t cached_after[MAX_STEPS];
} baseline;

typedef struct run {
    gp_pool *pool;
    gp_sim *sim;
    gp_stream s[3];
    block b[MAX_BLOCKS];
    const char *config;
    uint64_t fault_n;  /* the device call that fails (0: none) */
    int injected;      /* 0: a clean run; else the error the armed fault returns */
    unsigned retried;  /* calls that failed and were retried */
    size_t step;
    baseline *base;    /* written by the clean run, read by the others */
    bool verbose;
    uint64_t verbose_n; /* GPUPOOL_TEST_VERBOSE=n: also trace the run whose fault is call #n */
} run;

static gp_stats stats_of(run *r)
{
    gp_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    s.version = GP_STATS_VERSION;
    cr_assert_eq(gp_get_stats(r->pool, &s), GP_OK, "gp_get_stats: %s", gp_last_error());
    return s;
}

static void open_run(run *r, const char *config, int injected, baseline *base)
{
    memset(r, 0, sizeof *r);
    r->config = config;
    r->injected = injected;
    r->base = base;
    r->verbose = getenv("GPUPOOL_TEST_VERBOSE") != NULL;
    r->verbose_n = r->verbose ? strtoull(getenv("GPUPOOL_TEST_VERBOSE"), NULL, 10) : 0;
    int rc = gp_pool_create(&r->pool, 0, "sim", config);
    cr_assert_eq(rc, GP_OK, "gp_pool_create(%s): %s", config, gp_last_error());
    r->sim = gp_sim_of(r->pool);
    cr_assert_not_null(r->sim);
    gp_sim_retain(r->sim);
    for (int i = 0; i < 3; i++)
        r->s[i] = gp_sim_stream_create(r->sim);
}

/* After every step: the pool's invariants hold; in the clean run, remember the reserved bytes. */
static void end_step(run *r, const char *what)
{
    int rc = gp_check(r->pool);
    cr_assert_eq(rc, GP_OK, "step %zu (%s): gp_check: %s", r->step, what, gp_last_error());
    gp_stats s = stats_of(r);
    if (r->verbose && (r->injected == 0 || r->fault_n == r->verbose_n)) {
        gp_sim_report rep;
        gp_sim_get_report(r->sim, &rep);
        fprintf(stderr,
                "step %2zu %-34s reserved %3llu MiB allocated %6llu KiB pending %6llu KiB device %3llu MiB "
                "steals %llu waits %llu retries %llu ooms %llu dfrees %llu\n",
                r->step, what, (unsigned long long)(s.reserved_bytes / MIB),
                (unsigned long long)(s.allocated_bytes / KIB), (unsigned long long)(s.pending_bytes / KIB),
                (unsigned long long)(rep.allocated_bytes / MIB), (unsigned long long)s.num_stream_steals,
                (unsigned long long)s.num_stream_waits, (unsigned long long)s.num_alloc_retries,
                (unsigned long long)s.num_ooms, (unsigned long long)s.num_device_frees);
    }
    if (r->base != NULL && r->injected == 0) {
        cr_assert_lt(r->step, MAX_STEPS);
        r->base->reserved_after[r->step] = s.reserved_bytes;
        r->base->cached_after[r->step] = s.cached_bytes;
        r->base->steps = r->step + 1;
    }
    r->step++;
}

/* A call returned rc != GP_OK: it must be the armed fault, fired inside this very call. */
static void expect_fault(run *r, int rc, uint64_t faults_before, const char *what)
{
    cr_assert_neq(r->injected, 0, "step %zu: %s failed in a run without faults: %d (%s)", r->step, what, rc,
                  gp_last_error());
    cr_assert(rc == GP_ERR_DEVICE || rc == GP_ERR_OOM, "step %zu: %s failed with %d (%s): expected %d or %d",
              r->step, what, rc, gp_strerror(rc), GP_ERR_DEVICE, GP_ERR_OOM);
    if (r->injected == GP_ERR_DEVICE && rc == GP_ERR_OOM)
        cr_log_info("step %zu: %s reported GP_ERR_OOM for an injected GP_ERR_DEVICE (%s)", r->step, what,
                    gp_last_error());
    cr_assert_neq(gp_last_error()[0], '\0', "step %zu: %s failed (%d) without a message", r->step, what, rc);
    cr_assert_eq(gp_sim_faults_injected(r->sim), faults_before + 1,
                 "step %zu: %s failed (%d: %s) but no fault fired inside it (fault armed for device call #%llu, "
                 "%llu fired before this call)",
                 r->step, what, rc, gp_last_error(), (unsigned long long)r->fault_n,
                 (unsigned long long)faults_before);
    r->retried++;
}

static void launch(run *r, int stream, void *p, size_t len, int op, uint64_t seed, uint64_t ns)
{
    int rc = gp_sim_launch(r->sim, r->s[stream], p, len, op, seed, ns);
    cr_assert_eq(rc, GP_OK, "step %zu: gp_sim_launch: %s", r->step, gp_last_error());
}

/* gp_alloc of `size` on stream `si` into slot `slot`, then a WRITE of the slot's pattern. */
static void do_alloc(run *r, int slot, size_t size, int si, uint64_t write_ns)
{
    block *b = &r->b[slot];
    cr_assert(!b->live);
    gp_stats before = stats_of(r);
    uint64_t faults = gp_sim_faults_injected(r->sim);
    void *p = (void *)1;
    int rc = gp_alloc(r->pool, &p, size, r->s[si]);
    if (rc != GP_OK) {
        expect_fault(r, rc, faults, "gp_alloc");
        cr_assert_null(p, "a failed gp_alloc must set *out to NULL");
        gp_stats after = stats_of(r);
        cr_assert_eq(after.allocated_bytes, before.allocated_bytes, "a failed gp_alloc changed allocated_bytes");
        cr_assert_eq(after.active_blocks, before.active_blocks);
        cr_assert_eq(after.num_allocs, before.num_allocs);
        cr_assert_eq(gp_check(r->pool), GP_OK, "after the failed gp_alloc: %s", gp_last_error());
        rc = gp_alloc(r->pool, &p, size, r->s[si]);
        cr_assert_eq(rc, GP_OK, "step %zu: the retried gp_alloc(%zu) failed: %s", r->step, size, gp_last_error());
    }
    cr_assert_not_null(p);
    *b = (block){.p = p, .size = size, .stream = si, .seed = 0x5eed0000u + (uint64_t)slot * 7919u, .live = true};
    launch(r, si, p, size, GP_SIM_WRITE, b->seed, write_ns);
    end_step(r, "alloc");
}

/* An allocation that cannot fit: GP_ERR_OOM (after a fault and a retry too). */
static void do_alloc_oom(run *r, size_t size, int si)
{
    uint64_t faults = gp_sim_faults_injected(r->sim);
    void *p = (void *)1;
    int rc = gp_alloc(r->pool, &p, size, r->s[si]);
    if (rc != GP_ERR_OOM) {
        cr_assert_neq(rc, GP_OK, "step %zu: gp_alloc(%zu) should not fit", r->step, size);
        expect_fault(r, rc, faults, "gp_alloc (OOM expected)");
        rc = gp_alloc(r->pool, &p, size, r->s[si]);
    }
    cr_assert_eq(rc, GP_ERR_OOM, "step %zu: gp_alloc(%zu): %d (%s), expected GP_ERR_OOM", r->step, size, rc,
                 gp_last_error());
    cr_assert_null(p);
    cr_assert_neq(gp_last_error()[0], '\0', "an OOM without a message");
    end_step(r, "alloc (OOM)");
}

/* CHECK on the stream of the free, then gp_free there. */
static void do_free(run *r, int slot, int si, uint64_t check_ns)
{
    block *b = &r->b[slot];
    cr_assert(b->live);
    launch(r, si, b->p, b->size, GP_SIM_CHECK, b->seed, check_ns);
    gp_stats before = stats_of(r);
    uint64_t faults = gp_sim_faults_injected(r->sim);
    int rc = gp_free(r->pool, b->p, r->s[si]);
    if (rc != GP_OK) {
        expect_fault(r, rc, faults, "gp_free");
        gp_stats after = stats_of(r);
        cr_assert_eq(after.active_blocks, before.active_blocks, "a failed gp_free must leave the block live");
        cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
        cr_assert_eq(after.pending_bytes, before.pending_bytes);
        cr_assert_eq(gp_check(r->pool), GP_OK, "after the failed gp_free: %s", gp_last_error());
        rc = gp_free(r->pool, b->p, r->s[si]);
        cr_assert_eq(rc, GP_OK, "step %zu: the retried gp_free failed: %s", r->step, gp_last_error());
    }
    b->live = false;
    end_step(r, si == b->stream ? "free" : "free (other stream)");
}

/* The test orders `si` after the block's writer, records the use, and reads the block there. */
static void do_record(run *r, int slot, int si, uint64_t read_ns)
{
    block *b = &r->b[slot];
    gp_sim_stream_synchronize(r->sim, r->s[b->stream]);
    int rc = gp_record_stream(r->pool, b->p, r->s[si]);
    cr_assert_eq(rc, GP_OK, "step %zu: gp_record_stream: %s", r->step, gp_last_error());
    launch(r, si, b->p, b->size, GP_SIM_READ, 0, read_ns);
    end_step(r, "record_stream");
}

/* gp_trim; a failure keeps the segment cached, and the retry releases it. */
static void do_trim(run *r, size_t keep)
{
    gp_stats before = stats_of(r);
    uint64_t faults = gp_sim_faults_injected(r->sim);
    size_t released = 12345;
    int rc = gp_trim(r->pool, keep, &released);
    if (rc != GP_OK) {
        expect_fault(r, rc, faults, "gp_trim");
        gp_stats after = stats_of(r);
        cr_assert_eq(after.reserved_bytes, before.reserved_bytes - released,
                     "step %zu: gp_trim failed after releasing %zu bytes, but reserved went %llu -> %llu", r->step,
                     released, (unsigned long long)before.reserved_bytes, (unsigned long long)after.reserved_bytes);
        cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
        cr_assert_eq(gp_check(r->pool), GP_OK, "after the failed gp_trim: %s", gp_last_error());
        size_t again = 12345;
        rc = gp_trim(r->pool, keep, &again);
        cr_assert_eq(rc, GP_OK, "step %zu: the retried gp_trim failed: %s", r->step, gp_last_error());
        gp_stats retried = stats_of(r);
        cr_assert_eq(retried.reserved_bytes, after.reserved_bytes - again);
        /* The segment whose release failed is wholly free and still cached: when more than `keep` is
         * cached, the retry must release something. */
        if (after.cached_bytes > keep)
            cr_assert_gt(again, 0, "step %zu: %llu bytes cached (keep %zu), but the retried gp_trim released "
                                   "nothing: the segment whose release failed should still be releasable",
                         r->step, (unsigned long long)after.cached_bytes, keep);
        /* The fault fired in this step, so the state before it was the clean run's. After the retry the
         * pool must have trimmed as far as the clean run did (which segments went may differ when
         * keep > 0: a failed one is skipped and the next one goes). */
        if (r->base != NULL && r->base->recorded && r->step < r->base->steps) {
            uint64_t clean_cached = r->base->cached_after[r->step];
            if (keep == 0)
                cr_assert_eq(retried.reserved_bytes, r->base->reserved_after[r->step],
                             "step %zu: after a failed trim and its retry, reserved is %llu, the clean run had %llu",
                             r->step, (unsigned long long)retried.reserved_bytes,
                             (unsigned long long)r->base->reserved_after[r->step]);
            else if (clean_cached <= keep)
                cr_assert_leq(retried.cached_bytes, keep,
                              "step %zu: after a failed trim(%zu) and its retry, %llu bytes stay cached", r->step,
                              keep, (unsigned long long)retried.cached_bytes);
        }
    } else {
        cr_assert_eq(stats_of(r).reserved_bytes, before.reserved_bytes - released);
    }
    end_step(r, "trim");
}

static size_t device_free_bytes(run *r)
{
    gp_sim_report rep;
    gp_sim_get_report(r->sim, &rep);
    return (size_t)DEVICE_MIB * MIB - rep.allocated_bytes;
}

enum { A = 0, B = 1, C = 2 };

/*
 * The workload. Comments give the clean run's path (2 MiB small segments, 6 MiB large ones, and a
 * segment of its own for 4 MiB and more); with a fault the path may differ, which is the point.
 */
static void run_workload(run *r)
{
    /* Blocks on three streams. */
    do_alloc(r, 0, 1000, A, 500);        /* A: small segment */
    do_alloc(r, 1, 300 * KIB, A, 500);   /* A: same small segment */
    do_alloc(r, 2, 1536 * KIB, B, 500);  /* B: large segment, 6 MiB */
    do_alloc(r, 3, 64 * KIB, B, 500);    /* B: small segment */
    do_alloc(r, 4, 4 * MIB, C, 500);     /* C: a 4 MiB segment */

    /* Cross-stream use: PENDING blocks with events. */
    do_record(r, 1, B, 3000);            /* block 1 is read on B */
    do_free(r, 1, A, 100);               /* freed on A: waits for B's event */
    gp_sim_stream_synchronize(r->sim, r->s[B]);
    do_free(r, 3, C, 3000);              /* B's block, last used on C: waits for C's event */
    do_free(r, 4, C, 3000);              /* C's 4 MiB segment is wholly free, but C is busy */
    do_alloc(r, 5, 4 * MIB, A, 500);     /* no steal of C's busy segment: a new one */

    /* Everything completes; A's next 4 MiB request steals C's idle segment. */
    gp_sim_advance(r->sim, 100000);
    do_alloc(r, 6, 4 * MIB, A, 500);
    do_alloc(r, 7, 100 * KIB, C, 500);   /* C's small request */
    do_alloc(r, 8, 200 * KIB, A, 500);   /* A's fast path collects block 1 (pending) first */

    /* Wholly free segments, then a trim that keeps some of them. */
    do_free(r, 0, A, 100);
    do_free(r, 2, B, 100);               /* B's 6 MiB segment is wholly free */
    do_free(r, 7, C, 100);
    gp_sim_advance(r->sim, 100000);
    do_trim(r, 1 * MIB);

    /* Fill the device with 1 MiB blocks (two to a small segment) until at most 2 MiB stay free. */
    int fillers = 0;
    while (device_free_bytes(r) > 2 * MIB) {
        cr_assert_lt(FILLER0 + fillers, MAX_BLOCKS, "too many fillers");
        do_alloc(r, FILLER0 + fillers, 1 * MIB, C, 100);
        fillers++;
    }

    /* A frees a 4 MiB block under a long kernel; B needs 4 MiB: the device is full, so B waits on
     * A's event and takes A's busy segment. */
    do_free(r, 6, A, 5000);
    do_alloc(r, 10, 4 * MIB, B, 500);

    /* The fillers' small segments become wholly free; a larger request then fits only once some of
     * them go back to the device. */
    for (int i = 0; i < fillers; i++)
        do_free(r, FILLER0 + i, C, 100);
    do_free(r, 10, B, 200);
    gp_sim_advance(r->sim, 100000);
    do_alloc(r, 12, 6 * MIB, A, 500);
    do_alloc(r, 11, 700 * KIB, B, 500);

    /* An allocation that can never fit while blocks are live. */
    do_alloc_oom(r, (size_t)DEVICE_MIB * MIB, C);

    /* More cross-stream frees, then a trim of everything. */
    gp_sim_stream_synchronize(r->sim, r->s[A]);
    do_record(r, 12, C, 2000);
    do_record(r, 12, B, 1000);
    do_free(r, 12, A, 100);              /* pending on B's and C's events */
    do_free(r, 8, B, 100);               /* A's block, last used on B */
    do_alloc(r, 13, 2 * MIB, C, 500);
    gp_sim_advance(r->sim, 100000);
    do_trim(r, 0);
    do_alloc(r, 14, 1536 * KIB, B, 500);
    do_alloc(r, 15, 512, C, 500);
}

/* Disarms the fault, checks every live block's pattern and the ledger, frees all, destroys. */
static void finish_run(run *r)
{
    gp_sim_fail_call(r->sim, 0, 0, 0);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (r->b[i].live)
            launch(r, r->b[i].stream, r->b[i].p, r->b[i].size, GP_SIM_CHECK, r->b[i].seed, 100);
    gp_sim_synchronize(r->sim);
    gp_sim_report rep;
    gp_sim_get_report(r->sim, &rep);
    cr_assert_eq(rep.races, 0, "%llu races: %s", (unsigned long long)rep.races, gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.pattern_mismatches, 0, "%llu mismatches: %s", (unsigned long long)rep.pattern_mismatches,
                 gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.bad_calls, 0, "%llu bad calls: %s", (unsigned long long)rep.bad_calls,
                 gp_sim_first_violation(r->sim));
    gp_stats s = stats_of(r);
    cr_assert_eq(rep.allocated_bytes, s.reserved_bytes, "the device holds %llu bytes, the pool reserves %llu",
                 (unsigned long long)rep.allocated_bytes, (unsigned long long)s.reserved_bytes);
    cr_assert_eq(rep.allocations, s.segments);
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (!r->b[i].live)
            continue;
        int rc = gp_free(r->pool, r->b[i].p, r->s[r->b[i].stream]);
        cr_assert_eq(rc, GP_OK, "final gp_free: %s", gp_last_error());
        r->b[i].live = false;
    }
    cr_assert_eq(gp_check(r->pool), GP_OK, "%s", gp_last_error());
    s = stats_of(r);
    cr_assert_eq(s.allocated_bytes, 0);
    cr_assert_eq(s.active_blocks, 0);
    gp_leak_report leaks = {99, 99};
    int rc = gp_pool_destroy(r->pool, &leaks);
    cr_assert_eq(rc, GP_OK, "gp_pool_destroy: %s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, 0);
    cr_assert_eq(leaks.live_bytes, 0);
    gp_sim_get_report(r->sim, &rep);
    cr_assert(rep.closed);
    cr_assert_eq(rep.leaked_bytes_at_close, 0, "%s", gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.leaked_events_at_close, 0, "%s", gp_sim_first_violation(r->sim));
    cr_assert_eq(rep.bad_calls, 0, "%s", gp_sim_first_violation(r->sim));
    gp_sim_release(r->sim);
}

/* The clean run: its call count, and proof that it reaches the paths it means to. */
static uint64_t clean_run(const char *config, baseline *base, unsigned mask)
{
    run r;
    open_run(&r, config, 0, base);
    uint64_t calls_before = gp_sim_calls(r.sim, mask);
    run_workload(&r);
    uint64_t calls = gp_sim_calls(r.sim, mask) - calls_before;
    gp_stats s = stats_of(&r);
    cr_assert_eq(r.retried, 0);
    cr_assert_geq(s.num_stream_steals, 2, "the workload should steal segments (%llu)",
                  (unsigned long long)s.num_stream_steals);
    cr_assert_geq(s.num_stream_waits, 1, "the workload should make a stream wait at OOM");
    if (strcmp(config, CONFIG_NO_SLACK) == 0)
        cr_assert_geq(s.num_alloc_retries, 2, "the workload should release cached segments at OOM (%llu)",
                      (unsigned long long)s.num_alloc_retries);
    cr_assert_geq(s.num_ooms, 1);
    cr_assert_geq(s.num_device_frees, 3, "trims and OOM releases should free segments");
    cr_assert_geq(s.num_events_created, 2);
    cr_assert_eq(gp_sim_faults_injected(r.sim), 0);
    if (base != NULL)
        base->recorded = true;
    cr_log_info("clean workload: %llu device calls in the mask, %zu steps, %llu steals, %llu waits, %llu retries, "
                "%llu device frees",
                (unsigned long long)calls, r.step, (unsigned long long)s.num_stream_steals,
                (unsigned long long)s.num_stream_waits, (unsigned long long)s.num_alloc_retries,
                (unsigned long long)s.num_device_frees);
    finish_run(&r);
    return calls;
}

static void sweep(const char *config, unsigned mask, int error)
{
    baseline base;
    memset(&base, 0, sizeof base);
    uint64_t calls = clean_run(config, &base, mask);
    cr_assert_gt(calls, 10);
    unsigned failed_calls = 0;
    for (uint64_t n = 1; n <= calls + 1; n++) {
        run r;
        open_run(&r, config, error, &base);
        r.fault_n = n;
        gp_sim_fail_call(r.sim, n, mask, error);
        run_workload(&r);
        uint64_t fired = gp_sim_faults_injected(r.sim);
        cr_assert_eq(fired, n <= calls ? 1 : 0, "fault #%llu of %llu: %llu faults fired", (unsigned long long)n,
                     (unsigned long long)calls, (unsigned long long)fired);
        failed_calls += r.retried;
        finish_run(&r);
    }
    cr_log_info("%llu faults injected, %u of them made an API call fail (each retried successfully)",
                (unsigned long long)calls, failed_calls);
    cr_assert_gt(failed_calls, 0, "no injected fault ever surfaced as an error");
}

Test(faults, clean_workload_is_deterministic)
{
    baseline first, second;
    memset(&first, 0, sizeof first);
    memset(&second, 0, sizeof second);
    uint64_t a = clean_run(CONFIG_NO_SLACK, &first, GP_SIM_CALL_ALL);
    uint64_t b = clean_run(CONFIG_NO_SLACK, &second, GP_SIM_CALL_ALL);
    cr_assert_eq(a, b, "the workload made %llu then %llu device calls", (unsigned long long)a, (unsigned long long)b);
    cr_assert_eq(first.steps, second.steps);
    cr_assert_arr_eq(first.reserved_after, second.reserved_after, sizeof first.reserved_after);
}

Test(faults, every_device_call_fails_once_with_device_error, .timeout = 120)
{
    sweep(CONFIG_NO_SLACK, GP_SIM_CALL_ALL, GP_ERR_DEVICE);
}

Test(faults, every_device_allocation_fails_once_with_oom, .timeout = 120)
{
    sweep(CONFIG_NO_SLACK, GP_SIM_CALL_MEM_ALLOC, GP_ERR_OOM);
}

/* The default policy (cache_slack) steals and gives cached segments back before growing, once the pool
 * is above its cap: those device calls fail too. */
Test(faults, every_device_call_fails_once_with_tight_cache_cap, .timeout = 120)
{
    sweep(CONFIG_TIGHT, GP_SIM_CALL_ALL, GP_ERR_DEVICE);
}

/* ---- gp_trim ----------------------------------------------------------------------------------- */

/* Three wholly free segments; the second mem_free of a trim fails: the first is gone, the second
 * stays cached (and whole), the third may go; a later trim releases what is left. */
Test(faults, trim_keeps_a_segment_whose_release_failed)
{
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", CONFIG_BIG), GP_OK, "%s", gp_last_error());
    gp_sim *sim = gp_sim_of(pool);
    gp_stream s = gp_sim_stream_create(sim);
    void *p[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(gp_alloc(pool, &p[i], 12 * MIB, s), GP_OK, "%s", gp_last_error());
        cr_assert_eq(gp_sim_launch(sim, s, p[i], 12 * MIB, GP_SIM_WRITE, 1, 100), GP_OK);
    }
    for (int i = 0; i < 3; i++)
        cr_assert_eq(gp_free(pool, p[i], s), GP_OK, "%s", gp_last_error());
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(st.reserved_bytes, 36 * MIB);

    gp_sim_fail_call(sim, 2, GP_SIM_CALL_MEM_FREE, GP_ERR_DEVICE);
    size_t released = 0;
    int rc = gp_trim(pool, 0, &released);
    cr_assert_eq(rc, GP_ERR_DEVICE, "gp_trim with a failing mem_free: %d (%s)", rc, gp_last_error());
    cr_assert_neq(gp_last_error()[0], '\0');
    cr_assert_eq(gp_sim_faults_injected(sim), 1);
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(st.reserved_bytes, 36 * MIB - released, "reserved %llu after releasing %zu",
                 (unsigned long long)st.reserved_bytes, released);
    cr_assert_geq(st.reserved_bytes, 12 * MIB, "the segment whose release failed must stay cached");
    cr_assert_eq(st.cached_bytes, st.reserved_bytes);
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_eq(rep.allocated_bytes, st.reserved_bytes, "the device and the pool disagree");
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());

    /* The cached segment is still usable as a whole. */
    void *q;
    cr_assert_eq(gp_alloc(pool, &q, 12 * MIB, s), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, s, q, 12 * MIB, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_assert_eq(gp_free(pool, q, s), GP_OK);

    rc = gp_trim(pool, 0, &released);
    cr_assert_eq(rc, GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(st.reserved_bytes, 0);
    gp_sim_get_report(sim, &rep);
    cr_assert_eq(rep.allocated_bytes, 0);
    cr_assert_eq(rep.races + rep.pattern_mismatches + rep.bad_calls, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK, "%s", gp_last_error());
}

/* ---- gp_pool_destroy --------------------------------------------------------------------------- */

/* A pool holding four segments (2, 20, 12 and 12 MiB), pending blocks with events, and a recorded
 * steal fence. Returns the bytes it reserves. */
static size_t destroy_setup(gp_pool **pool_out, gp_sim **sim_out)
{
    gp_pool *pool;
    cr_assert_eq(gp_pool_create(&pool, 0, "sim", CONFIG_BIG), GP_OK, "%s", gp_last_error());
    gp_sim *sim = gp_sim_of(pool);
    gp_sim_retain(sim);
    gp_stream a = gp_sim_stream_create(sim), b = gp_sim_stream_create(sim), c = gp_sim_stream_create(sim);
    void *pa, *pb, *pc, *pd;
    cr_assert_eq(gp_alloc(pool, &pa, 1000, a), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &pb, 3 * MIB, b), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &pc, 12 * MIB, c), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, a, pa, 1000, GP_SIM_WRITE, 1, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, b, pb, 3 * MIB, GP_SIM_WRITE, 2, 100), GP_OK);
    cr_assert_eq(gp_sim_launch(sim, c, pc, 12 * MIB, GP_SIM_WRITE, 3, 100), GP_OK);
    gp_sim_synchronize(sim);
    cr_assert_eq(gp_record_stream(pool, pa, b), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_launch(sim, b, pa, 1000, GP_SIM_READ, 0, 50000), GP_OK);
    cr_assert_eq(gp_free(pool, pa, a), GP_OK, "%s", gp_last_error()); /* pending on b */
    cr_assert_eq(gp_sim_launch(sim, c, pb, 3 * MIB, GP_SIM_CHECK, 2, 50000), GP_OK);
    cr_assert_eq(gp_free(pool, pb, c), GP_OK, "%s", gp_last_error()); /* pending on c */
    cr_assert_eq(gp_sim_launch(sim, c, pc, 12 * MIB, GP_SIM_CHECK, 3, 50000), GP_OK);
    cr_assert_eq(gp_free(pool, pc, c), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_alloc(pool, &pd, 12 * MIB, a), GP_OK, "%s", gp_last_error()); /* probes c's fence */
    cr_assert_eq(gp_free(pool, pd, a), GP_OK, "%s", gp_last_error());
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &st), GP_OK);
    cr_assert_eq(st.reserved_bytes, 46 * MIB, "setup reserves %llu", (unsigned long long)st.reserved_bytes);
    cr_assert_eq(st.segments, 4);
    cr_assert_gt(st.pending_bytes, 0);
    *pool_out = pool;
    *sim_out = sim;
    return st.reserved_bytes;
}

/* Device calls of each kind that a clean destroy makes. */
static void destroy_call_counts(uint64_t counts[9])
{
    gp_pool *pool;
    gp_sim *sim;
    destroy_setup(&pool, &sim);
    uint64_t before[9];
    for (int k = 0; k < 9; k++)
        before[k] = gp_sim_calls(sim, 1u << k);
    gp_leak_report leaks;
    cr_assert_eq(gp_pool_destroy(pool, &leaks), GP_OK, "%s", gp_last_error());
    for (int k = 0; k < 9; k++)
        counts[k] = gp_sim_calls(sim, 1u << k) - before[k];
    gp_sim_report rep;
    gp_sim_get_report(sim, &rep);
    cr_assert_eq(rep.leaked_bytes_at_close + rep.leaked_events_at_close, 0, "%s", gp_sim_first_violation(sim));
    gp_sim_release(sim);
}

typedef struct destroy_outcome {
    int rc;
    char message[512];
    gp_sim_report rep;
    uint64_t faults;
} destroy_outcome;

static destroy_outcome destroy_with_fault(uint64_t n, unsigned kind)
{
    gp_pool *pool;
    gp_sim *sim;
    destroy_setup(&pool, &sim);
    gp_sim_fail_call(sim, n, kind, GP_ERR_DEVICE);
    destroy_outcome out;
    memset(&out, 0, sizeof out);
    gp_leak_report leaks = {99, 99};
    out.rc = gp_pool_destroy(pool, &leaks);
    snprintf(out.message, sizeof out.message, "%s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, 0);
    gp_sim_get_report(sim, &out.rep);
    out.faults = gp_sim_faults_injected(sim);
    cr_assert(out.rep.closed, "destroy must close the backend even after a fault");
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_ERR_DESTROYED, "the handle must be dead after a failed destroy");
    gp_sim_release(sim);
    return out;
}

static const char *kind_name(unsigned kind)
{
    switch (kind) {
    case GP_SIM_CALL_MEM_ALLOC: return "mem_alloc";
    case GP_SIM_CALL_MEM_FREE: return "mem_free";
    case GP_SIM_CALL_MEM_INFO: return "mem_info";
    case GP_SIM_CALL_EVENT_CREATE: return "event_create";
    case GP_SIM_CALL_EVENT_DESTROY: return "event_destroy";
    case GP_SIM_CALL_EVENT_RECORD: return "event_record";
    case GP_SIM_CALL_EVENT_QUERY: return "event_query";
    case GP_SIM_CALL_EVENT_SYNC: return "event_synchronize";
    case GP_SIM_CALL_STREAM_WAIT: return "stream_wait_event";
    default: return "?";
    }
}

/* A mem_free that fails inside destroy: GP_ERR_DEVICE with a message, and the ledger keeps exactly
 * that one segment. Over the sweep, each segment is the one left once. */
Test(faults, destroy_with_failing_mem_free_reports_the_segment)
{
    uint64_t counts[9];
    destroy_call_counts(counts);
    uint64_t frees = counts[1];
    cr_assert_eq(frees, 4, "destroy should free the 4 segments (made %llu mem_free calls)", (unsigned long long)frees);
    gp_pool *pool;
    gp_sim *sim;
    size_t reserved = destroy_setup(&pool, &sim);
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_OK);
    gp_sim_release(sim);

    size_t leaked_total = 0;
    for (uint64_t n = 1; n <= frees; n++) {
        destroy_outcome o = destroy_with_fault(n, GP_SIM_CALL_MEM_FREE);
        cr_assert_eq(o.faults, 1);
        cr_assert_eq(o.rc, GP_ERR_DEVICE, "mem_free #%llu failed inside destroy, which returned %d (%s)",
                     (unsigned long long)n, o.rc, o.message);
        cr_assert_neq(o.message[0], '\0', "destroy failed without a message");
        cr_assert_eq(o.rep.allocations, 1, "the ledger should keep exactly one segment, it keeps %llu",
                     (unsigned long long)o.rep.allocations);
        size_t leaked = (size_t)o.rep.leaked_bytes_at_close;
        cr_assert(leaked == 2 * MIB || leaked == 20 * MIB || leaked == 12 * MIB,
                  "leaked %zu bytes: not one of the segments", leaked);
        cr_assert_eq(o.rep.leaked_events_at_close, 0, "a failed mem_free leaked events too");
        cr_assert_eq(o.rep.bad_calls, 0, "%llu bad calls", (unsigned long long)o.rep.bad_calls);
        leaked_total += leaked;
        cr_log_info("mem_free #%llu failing in destroy: %s", (unsigned long long)n, o.message);
    }
    cr_assert_eq(leaked_total, reserved, "each segment should be the leaked one exactly once (%zu of %zu)",
                 leaked_total, reserved);
}

/* Any other device call failing inside destroy: destroy gives back all memory; if the device is left
 * holding anything (an event it could not destroy), destroy must say so rather than return GP_OK. */
static void destroy_fault_sweep(unsigned kind)
{
    uint64_t counts[9];
    destroy_call_counts(counts);
    uint64_t calls = counts[__builtin_ctz(kind)];
    cr_log_info("a clean destroy makes %llu %s calls", (unsigned long long)calls, kind_name(kind));
    cr_assert_gt(calls, 0, "destroy makes no %s call", kind_name(kind));
    for (uint64_t n = 1; n <= calls; n++) {
        destroy_outcome o = destroy_with_fault(n, kind);
        cr_assert_eq(o.faults, 1);
        cr_assert(o.rc == GP_OK || o.rc == GP_ERR_DEVICE, "%s #%llu failing in destroy: rc %d (%s)", kind_name(kind),
                  (unsigned long long)n, o.rc, o.message);
        if (o.rc != GP_OK)
            cr_assert_neq(o.message[0], '\0');
        cr_assert_eq(o.rep.leaked_bytes_at_close, 0, "%s #%llu failing in destroy leaked %llu bytes",
                     kind_name(kind), (unsigned long long)n, (unsigned long long)o.rep.leaked_bytes_at_close);
        cr_assert_eq(o.rep.bad_calls, 0);
        if (o.rep.leaked_events_at_close > 0)
            cr_assert_eq(o.rc, GP_ERR_DEVICE,
                         "%s #%llu failed inside gp_pool_destroy, the device still holds %llu event(s), but "
                         "destroy returned %d (%s)",
                         kind_name(kind), (unsigned long long)n, (unsigned long long)o.rep.leaked_events_at_close,
                         o.rc, o.message);
        cr_log_info("%s #%llu failing in destroy: rc %d, %llu events left (%s)", kind_name(kind),
                    (unsigned long long)n, o.rc, (unsigned long long)o.rep.leaked_events_at_close, o.message);
    }
}

Test(faults, destroy_with_failing_event_synchronize)
{
    destroy_fault_sweep(GP_SIM_CALL_EVENT_SYNC);
}

Test(faults, destroy_with_failing_event_destroy_is_reported)
{
    destroy_fault_sweep(GP_SIM_CALL_EVENT_DESTROY);
}
