/*
 * test_stream_order.c — the stream-ordering semantics of gp_alloc / gp_free / gp_record_stream,
 * checked against the simulated GPU's own ledger (race checker, patterns, call counts), not against
 * the pool's idea of itself.
 *
 * Each test builds one small situation on two streams S and T:
 *   - a block freed on S is reused on S at once, with no device call;
 *   - it is not handed to T while S's kernel on it still runs (T's kernel would race);
 *   - once S's work has completed, T may steal S's wholly free segment;
 *   - record_stream keeps a block from S until T's kernel has completed;
 *   - a free on T of a block allocated on S waits for T's work;
 *   - destroy with pending blocks leaks nothing;
 *   - on device OOM, and past the cache cap within a tenant, T takes S's busy free segment by waiting on
 *     S's event (steal_wait), or, with steal_wait off, by releasing it (which synchronises the device);
 *   - on virtual memory, T borrows S's free block while S's kernel on it still runs by waiting on S's
 *     fence (reuse_wait), and with reuse_wait off gets other memory;
 *   - a stream that stays busy and keeps freeing still lends what an earlier fence covers (fence
 *     generations, provider/provider.h); a borrower takes back at once what it borrowed and freed on
 *     its own stream, while everyone else waits for its event; a borrowed block that its owner's
 *     stream also used (record_stream) waits for the owner's fence.
 * A test may fail by a race, a pattern mismatch, a bad device call, or a leak the sim reports.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define LONG_NS 1000000u /* a kernel that is "still running" */
#define SHORT_NS 100u

static gp_pool *pool;
static gp_sim *sim;
static gp_stream S, T;

static void open_pool_on(const char *backend, const char *config)
{
    int rc = gp_pool_create(&pool, 0, backend, config);
    cr_assert_eq(rc, GP_OK, "gp_pool_create(%s): %s", config, gp_last_error());
    sim = gp_sim_of(pool);
    cr_assert_not_null(sim);
    gp_sim_retain(sim); /* keep the ledger readable after gp_pool_destroy */
    S = gp_sim_stream_create(sim);
    T = gp_sim_stream_create(sim);
    cr_assert(S != NULL && T != NULL && S != T);
}

static void open_pool(const char *config)
{
    open_pool_on("sim", config);
}

static gp_stats stats(void)
{
    gp_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    s.version = GP_STATS_VERSION;
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK, "gp_get_stats: %s", gp_last_error());
    return s;
}

static gp_sim_report report(void)
{
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    return r;
}

/* No race, no mismatch, no bad call so far: the sim's first violation says what went wrong. */
static void assert_clean(const char *when)
{
    gp_sim_report r = report();
    cr_assert_eq(r.races, 0, "%s: %llu races: %s", when, (unsigned long long)r.races, gp_sim_first_violation(sim));
    cr_assert_eq(r.pattern_mismatches, 0, "%s: %llu pattern mismatches: %s", when,
                 (unsigned long long)r.pattern_mismatches, gp_sim_first_violation(sim));
    cr_assert_eq(r.bad_calls, 0, "%s: %llu bad device calls: %s", when, (unsigned long long)r.bad_calls,
                 gp_sim_first_violation(sim));
}

/* T got memory that S's running kernel still uses: the pool must have ordered T after S, either by a
 * stream wait, or by giving the segment back to the device (a device free waits for all device work,
 * as cudaFree does) and allocating it anew. (The race checker is the final judge; this names the
 * mechanism in the failure message.) */
static void assert_ordered_reuse(const gp_stats *before, const gp_stats *after, void *q)
{
    cr_assert(after->num_stream_waits > before->num_stream_waits ||
                  after->num_device_frees > before->num_device_frees,
              "T got %p, memory S's kernel still uses, without a stream wait or a device free", q);
}

static void *alloc_on(size_t size, gp_stream stream)
{
    void *p = NULL;
    int rc = gp_alloc(pool, &p, size, stream);
    cr_assert_eq(rc, GP_OK, "gp_alloc(%zu, %p): %s", size, stream, gp_last_error());
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % 512, 0, "gp_alloc returned %p, not 512-byte aligned", p);
    return p;
}

static void launch(gp_stream stream, void *p, size_t len, int op, uint64_t seed, uint64_t ns)
{
    int rc = gp_sim_launch(sim, stream, p, len, op, seed, ns);
    cr_assert_eq(rc, GP_OK, "gp_sim_launch(%p, %p, %zu): %s", stream, p, len, gp_last_error());
}

static void free_on(void *p, gp_stream stream)
{
    int rc = gp_free(pool, p, stream);
    cr_assert_eq(rc, GP_OK, "gp_free(%p, %p): %s", p, stream, gp_last_error());
}

/* Synchronises, checks the pool and the ledger, destroys, and checks that the device got everything
 * back. `live_blocks` blocks are expected in the leak report (normally 0). */
static void close_pool(size_t live_blocks)
{
    gp_sim_synchronize(sim);
    assert_clean("before destroy");
    cr_assert_eq(gp_check(pool), GP_OK, "gp_check: %s", gp_last_error());
    gp_leak_report leaks = {99, 99};
    int rc = gp_pool_destroy(pool, &leaks);
    cr_assert_eq(rc, GP_OK, "gp_pool_destroy: %s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, live_blocks, "leak report: %zu live blocks, expected %zu", leaks.live_blocks,
                 live_blocks);
    if (live_blocks == 0)
        cr_assert_eq(leaks.live_bytes, 0);
    gp_sim_report r = report();
    cr_assert(r.closed, "the pool did not close the sim backend");
    cr_assert_eq(r.leaked_bytes_at_close, 0, "leaked %llu bytes of device memory: %s",
                 (unsigned long long)r.leaked_bytes_at_close, gp_sim_first_violation(sim));
    cr_assert_eq(r.leaked_events_at_close, 0, "leaked %llu events: %s", (unsigned long long)r.leaked_events_at_close,
                 gp_sim_first_violation(sim));
    cr_assert_eq(r.races + r.pattern_mismatches + r.bad_calls, 0, "violation: %s", gp_sim_first_violation(sim));
    void *p = NULL;
    cr_assert_eq(gp_alloc(pool, &p, 64, S), GP_ERR_DESTROYED, "a destroyed pool must refuse gp_alloc");
    gp_sim_release(sim);
    pool = NULL;
    sim = NULL;
}

/* ---- same stream ------------------------------------------------------------------------------- */

static void reuse_on_same_stream(size_t size)
{
    open_pool("device_memory:256MiB");
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);

    uint64_t calls = gp_sim_calls(sim, GP_SIM_CALL_ALL);
    void *q = alloc_on(size, S);
    cr_assert_eq(q, p, "a block freed on S must be reused at once on S: got %p, freed %p", q, p);
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_ALL), calls, "the fast path made %llu device calls",
                 (unsigned long long)(gp_sim_calls(sim, GP_SIM_CALL_ALL) - calls));

    /* S's queue orders the new WRITE after the old kernel: no race, and the new pattern holds. */
    launch(S, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    launch(S, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after reuse on S");
    free_on(q, S);
    close_pool(0);
}

Test(stream_order, small_block_reused_at_once_on_same_stream)
{
    reuse_on_same_stream(4 * KIB);
}

Test(stream_order, large_block_reused_at_once_on_same_stream)
{
    reuse_on_same_stream(6 * MIB);
}

Test(stream_order, huge_block_reused_at_once_on_same_stream)
{
    reuse_on_same_stream(24 * MIB);
}

/* ---- another stream while S is busy ------------------------------------------------------------ */

static void not_handed_to_busy_other_stream(size_t size)
{
    open_pool("device_memory:256MiB");
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);

    gp_stats before = stats();
    void *q = alloc_on(size, T);
    gp_stats after = stats();
    /* Either T got other memory, or the pool ordered T after S's work. */
    if (q == p)
        assert_ordered_reuse(&before, &after, q);
    launch(T, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("T writes what it got while S's kernel runs");

    gp_sim_advance(sim, 2 * LONG_NS);
    launch(T, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after T's check");
    free_on(q, T);
    close_pool(0);
}

Test(stream_order, small_block_not_handed_to_other_stream_while_busy)
{
    not_handed_to_busy_other_stream(4 * KIB);
}

Test(stream_order, large_block_not_handed_to_other_stream_while_busy)
{
    not_handed_to_busy_other_stream(6 * MIB);
}

Test(stream_order, huge_block_not_handed_to_other_stream_while_busy)
{
    not_handed_to_busy_other_stream(24 * MIB);
}

/* ---- reuse by waiting (reuse_wait) ------------------------------------------------------------- */

/*
 * On virtual memory, S holds a range with one live block k and one free block p that S's long kernel
 * still uses. T, with no memory of its own, asks for p's size: the range cannot change owner (k is
 * live), so T borrows p (a free block of another stream of its tenant). With reuse_wait:on it may do
 * so at once: T's stream is made to wait on S's fence, so T's kernels on the block run after
 * S's, and the sim sees no race and T's pattern holds; nothing new is reserved. With reuse_wait off (the
 * default) the block stays S's while S is busy: T gets memory of its own, without a wait.
 */
#define BUSY_BLOCK_SIZE (6 * MIB)

/* The pool (sim-vmm, `config`) with S's busy free block p beside its live block *k; returns p. */
static void *busy_block_beside_live_one(const char *config, void **k)
{
    open_pool_on("sim-vmm", config);
    void *p = alloc_on(BUSY_BLOCK_SIZE, S);
    *k = alloc_on(BUSY_BLOCK_SIZE, S);
    launch(S, p, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);
    return p;
}

/* T writes and checks q, which it got while S's kernel ran; the sim must see nothing wrong; then all
 * is freed and the pool closed. */
static void use_on_t_and_close(void *q, void *k, const char *when)
{
    launch(T, q, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 2, SHORT_NS);
    launch(T, q, BUSY_BLOCK_SIZE, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean(when);
    free_on(q, T);
    free_on(k, S);
    close_pool(0);
}

static bool inside(const void *q, const void *p)
{
    return (uintptr_t)q + BUSY_BLOCK_SIZE > (uintptr_t)p && (uintptr_t)q < (uintptr_t)p + BUSY_BLOCK_SIZE;
}

static void borrow_from_busy_stream(bool reuse_wait)
{
    void *k;
    const char *config = reuse_wait ? "device_memory:256MiB,reuse_wait:on" : "device_memory:256MiB";
    void *p = busy_block_beside_live_one(config, &k);
    gp_stats before = stats();
    void *q = alloc_on(BUSY_BLOCK_SIZE, T);
    gp_stats after = stats();
    if (reuse_wait) {
        cr_assert(inside(q, p), "T should borrow S's free block at %p, got %p", p, q);
        cr_assert_eq(after.num_stream_waits, before.num_stream_waits + 1, "T's stream must wait on S's fence");
        cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "a borrow reserves nothing new");
    } else {
        cr_assert(!inside(q, p), "S's block %p is busy: T got %p inside it without reuse_wait", p, q);
        cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "reuse_wait:off made a stream wait");
    }
    use_on_t_and_close(q, k, "T uses what it got while S's kernel ran");
}

Test(stream_order, vmm_borrow_from_busy_stream_waits_on_its_fence)
{
    borrow_from_busy_stream(true);
}

Test(stream_order, vmm_borrow_from_busy_stream_refused_without_reuse_wait)
{
    borrow_from_busy_stream(false);
}

/* The wait itself fails (cudaStreamWaitEvent): the borrow is not made, T gets memory of its own, and
 * nothing races, leaks or is lost. */
Test(stream_order, vmm_borrow_whose_wait_fails_takes_other_memory)
{
    void *k;
    void *p = busy_block_beside_live_one("device_memory:256MiB,reuse_wait:on", &k);
    gp_sim_fail_call(sim, 1, GP_SIM_CALL_STREAM_WAIT, GP_ERR_DEVICE);
    gp_stats before = stats();
    void *q = alloc_on(BUSY_BLOCK_SIZE, T);
    gp_stats after = stats();
    cr_assert_eq(gp_sim_faults_injected(sim), 1, "the wait was not attempted");
    cr_assert(!inside(q, p), "the wait failed, yet T got %p inside S's busy block %p", q, p);
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "a failed wait is not a wait");
    use_on_t_and_close(q, k, "T uses its own memory");
}

/* ---- fences of busy streams and borrowed blocks (sim-vmm) -------------------------------------- */

/* S's free block p (its short kernel queued before the free) beside its live block *k, and a fence
 * of S recorded then (T asked for memory and got its own, *own, live: the kernel had not run yet);
 * then S stays busy (a long kernel on k) and keeps freeing. Returns p. */
static void *fenced_block_of_busy_stream(void **k, void **own)
{
    open_pool_on("sim-vmm", "device_memory:256MiB");
    void *p = alloc_on(BUSY_BLOCK_SIZE, S);
    *k = alloc_on(BUSY_BLOCK_SIZE, S);
    launch(S, p, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 1, SHORT_NS);
    free_on(p, S);
    *own = alloc_on(BUSY_BLOCK_SIZE, T); /* S's fence recorded now, not yet complete */
    cr_assert(!inside(*own, p), "T got S's block %p before S's kernel on it ran", p);
    launch(S, *k, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 2, LONG_NS);
    void *x = alloc_on(64 * KIB, S); /* S frees after the fence: the fence must not cover this */
    launch(S, x, 64 * KIB, GP_SIM_WRITE, 3, LONG_NS);
    free_on(x, S);
    gp_sim_advance(sim, 10 * SHORT_NS); /* the fence completes; S's long kernels still run */
    return p;
}

/* Under a fence recorded anew at every question, S (busy, freeing) would never lend p. */
Test(stream_order, a_busy_stream_that_keeps_freeing_lends_what_an_earlier_fence_covers)
{
    void *k, *own;
    void *p = fenced_block_of_busy_stream(&k, &own);
    gp_stats before = stats();
    void *q = alloc_on(BUSY_BLOCK_SIZE, T);
    gp_stats after = stats();
    cr_assert(inside(q, p), "T should borrow S's block %p, which S's completed fence covers; got %p", p, q);
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "no wait is needed");
    cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "a borrow reserves nothing new");
    free_on(own, T);
    use_on_t_and_close(q, k, "T uses S's block while S's later kernels run");
}

/* S's block *p, beside its live block *k, idle now (S's kernel on it done), borrowed by T: returned. */
static void *borrowed_by_t(void **k, void **p)
{
    *p = busy_block_beside_live_one("device_memory:256MiB", k);
    gp_sim_advance(sim, 2 * LONG_NS);
    void *q = alloc_on(BUSY_BLOCK_SIZE, T);
    cr_assert(inside(q, *p), "T should borrow S's idle block %p, got %p", *p, q);
    return q;
}

/* borrowed_by_t's block q, written by T under a long kernel and freed on T while it runs: returned. */
static void *freed_by_t_while_busy(void **k, void **p)
{
    void *q = borrowed_by_t(k, p);
    launch(T, q, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 2, LONG_NS);
    free_on(q, T);
    return q;
}

/* T borrows p, writes it under a long kernel and frees it on T: T takes it back at once (its own
 * stream orders it), while S, the owner, gets other memory until T's event completes. */
Test(stream_order, a_borrower_takes_back_at_once_what_it_freed_and_the_owner_waits)
{
    void *k, *p;
    void *q = freed_by_t_while_busy(&k, &p);
    gp_stats before = stats();
    void *again = alloc_on(BUSY_BLOCK_SIZE, T);
    gp_stats after = stats();
    cr_assert_eq(again, q, "T should take back its block %p at once, got %p", q, again);
    cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "taking back reserves nothing");
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "T's own stream orders it: no wait");
    launch(T, again, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 3, LONG_NS);
    free_on(again, T);
    void *s = alloc_on(BUSY_BLOCK_SIZE, S);
    cr_assert(!inside(s, p), "S got %p inside %p while T's kernel on it runs", s, p);
    launch(S, s, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 4, SHORT_NS);
    assert_clean("S writes while T's kernel on the block it gave back runs");
    gp_sim_synchronize(sim);
    free_on(s, S);
    free_on(k, S);
    close_pool(0);
}

/* The same with a smaller request: T takes back the front of the block; the rest stays PENDING on T's
 * event, so S gets other memory while T's kernel runs, and the rest once it has completed. */
Test(stream_order, a_borrower_takes_back_part_of_what_it_freed_and_the_rest_waits)
{
    void *k, *p;
    void *q = freed_by_t_while_busy(&k, &p);
    gp_stats before = stats();
    void *part = alloc_on(2 * MIB, T);
    gp_stats after = stats();
    cr_assert_eq(part, q, "T should take back the front of its block %p, got %p", q, part);
    cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "taking back reserves nothing");
    cr_assert_eq(after.pending_bytes, before.pending_bytes - 2 * MIB, "the rest stays pending (%llu -> %llu)",
                 (unsigned long long)before.pending_bytes, (unsigned long long)after.pending_bytes);
    launch(T, part, 2 * MIB, GP_SIM_WRITE, 3, SHORT_NS);
    void *s = alloc_on(4 * MIB, S);
    cr_assert(!inside(s, p), "S got %p inside %p while T's kernel on it runs", s, p);
    launch(S, s, 4 * MIB, GP_SIM_WRITE, 4, SHORT_NS);
    assert_clean("S writes while T's kernel on the rest runs");
    free_on(s, S);
    gp_sim_advance(sim, 2 * LONG_NS); /* T's event completes: the rest is S's again */
    void *rest = alloc_on(4 * MIB, S);
    cr_assert_eq((uintptr_t)rest, (uintptr_t)q + 2 * MIB, "S should get the rest at %p back, got %p",
                 (void *)((uintptr_t)q + 2 * MIB), rest);
    launch(S, rest, 4 * MIB, GP_SIM_WRITE, 5, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("S uses the rest after T's event");
    free_on(rest, S);
    free_on(part, T);
    free_on(k, S);
    close_pool(0);
}

/* T borrows p; S, its owner, also uses it (record_stream on S, a long read), then T frees it. Once T's
 * event completes the block is S's again, but a third stream must still wait for S's fence. */
Test(stream_order, a_borrowed_block_its_owner_used_waits_for_the_owner)
{
    void *k, *p;
    void *q = borrowed_by_t(&k, &p);
    gp_stream U = gp_sim_stream_create(sim);
    launch(T, q, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 2, SHORT_NS);
    gp_sim_stream_synchronize(sim, T); /* the test orders S's read after T's write */
    cr_assert_eq(gp_record_stream(pool, q, S), GP_OK, "gp_record_stream: %s", gp_last_error());
    launch(S, q, BUSY_BLOCK_SIZE, GP_SIM_READ, 0, LONG_NS);
    free_on(q, T);
    gp_sim_advance(sim, 10 * SHORT_NS); /* T's event completes; S's read still runs */
    void *u = alloc_on(BUSY_BLOCK_SIZE, U);
    cr_assert(!inside(u, p), "U got %p inside %p while S's kernel on it runs", u, p);
    launch(U, u, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 3, SHORT_NS);
    assert_clean("U writes while S still reads the block T borrowed");
    gp_sim_synchronize(sim);
    free_on(u, U);
    free_on(k, S);
    close_pool(0);
}

/* ---- best fit over the tenant's idle blocks (sim-vmm, tenant_best_fit:on) ---------------------- */

/* S's free block *p (6 MiB, a kernel on it of `ns`) beside its live block *k, and T's free block *t
 * (12 MiB) beside its live block *tk: T's heap fits a 6 MiB request only loosely. */
static void loose_fit_on_t(uint64_t ns, void **p, void **k, void **t, void **tk)
{
    open_pool_on("sim-vmm", "device_memory:256MiB,tenant_best_fit:on");
    *p = alloc_on(BUSY_BLOCK_SIZE, S);
    *k = alloc_on(BUSY_BLOCK_SIZE, S);
    *t = alloc_on(2 * BUSY_BLOCK_SIZE, T);
    *tk = alloc_on(2 * MIB, T);
    launch(S, *p, BUSY_BLOCK_SIZE, GP_SIM_WRITE, 1, ns);
    free_on(*p, S);
    free_on(*t, T);
}

/* S is done with p: T's 6 MiB request takes it (best fit over the tenant's idle blocks), and T's own
 * 12 MiB block stays whole for the 12 MiB request that follows: nothing new is reserved. */
Test(stream_order, a_loose_fit_takes_the_tighter_idle_block_of_another_stream)
{
    void *p, *k, *t, *tk;
    loose_fit_on_t(SHORT_NS, &p, &k, &t, &tk);
    gp_sim_advance(sim, 10 * SHORT_NS);
    gp_stats before = stats();
    void *q = alloc_on(BUSY_BLOCK_SIZE, T);
    cr_assert_eq(q, p, "T should take S's idle 6 MiB block %p rather than split its own %p; got %p", p, t, q);
    void *whole = alloc_on(2 * BUSY_BLOCK_SIZE, T);
    gp_stats after = stats();
    cr_assert_eq(whole, t, "T's 12 MiB block %p should have stayed whole, got %p", t, whole);
    cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "nothing new is reserved");
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "S's work is done: no wait");
    launch(T, whole, 2 * BUSY_BLOCK_SIZE, GP_SIM_WRITE, 3, SHORT_NS);
    free_on(whole, T);
    free_on(tk, T);
    use_on_t_and_close(q, k, "T uses S's idle block");
}

/* S's kernel on p still runs: T's request takes the front of its own block, with no wait. */
Test(stream_order, a_loose_fit_keeps_to_its_own_block_while_the_tighter_one_is_busy)
{
    void *p, *k, *t, *tk;
    loose_fit_on_t(LONG_NS, &p, &k, &t, &tk);
    gp_stats before = stats();
    void *q = alloc_on(BUSY_BLOCK_SIZE, T);
    gp_stats after = stats();
    cr_assert_eq(q, t, "S's block %p is busy: T should take the front of its own %p, got %p", p, t, q);
    cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "nothing new is reserved");
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "reuse_wait:off made a stream wait");
    free_on(tk, T);
    use_on_t_and_close(q, k, "T uses its own block while S's kernel runs");
}

/*
 * On the cudaMalloc path, past the cache cap: S holds four 24 MiB segments and frees one while its
 * kernel still uses it; T (same tenant) asks for 24 MiB, which would take the pool past the cap. With
 * steal_wait (the default) T takes S's busy segment by waiting on S's fence: no device call, no race.
 * With steal_wait off it gives the segment back instead (cudaFree, which waits for the whole device)
 * and allocates anew.
 */
static void segment_past_cap(bool steal_wait)
{
    open_pool(steal_wait ? "device_memory:1GiB" : "device_memory:1GiB,steal_wait:false");
    const size_t size = 24 * MIB;
    void *keep[3];
    void *p = alloc_on(size, S);
    for (int i = 0; i < 3; i++)
        keep[i] = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);
    gp_stats before = stats();
    uint64_t allocs = gp_sim_calls(sim, GP_SIM_CALL_MEM_ALLOC), frees = gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE);
    void *q = alloc_on(size, T);
    gp_stats after = stats();
    if (steal_wait) {
        cr_assert_eq(q, p, "T should take S's free segment past the cap");
        cr_assert_eq(after.num_stream_steals, before.num_stream_steals + 1);
        cr_assert_eq(after.num_stream_waits, before.num_stream_waits + 1, "by waiting on S's fence");
        cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_ALLOC), allocs, "a steal allocates nothing");
        cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE), frees, "a steal frees nothing");
    } else {
        cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "steal_wait:false made a stream wait");
        cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE), frees + 1, "the busy segment goes back instead");
    }
    launch(T, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    launch(T, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("T uses what it got past the cap");
    free_on(q, T);
    for (int i = 0; i < 3; i++)
        free_on(keep[i], S);
    close_pool(0);
}

Test(stream_order, segment_past_cap_taken_by_waiting_within_a_tenant)
{
    segment_past_cap(true);
}

Test(stream_order, segment_past_cap_given_back_without_steal_wait)
{
    segment_past_cap(false);
}

/* ---- steal after completion -------------------------------------------------------------------- */

/* S's segment is wholly free and S's kernel on it has completed. The device holds nothing else and has
 * no room for another segment, so T's request can only be met with S's segment: T takes it (a steal,
 * guarded by S's completed fence) without a device free, which would synchronise the whole device.
 * (When the device has room, the pool may grow instead: that is policy, see the busy tests below.) */
static void steal_after_completion(size_t size, const char *config)
{
    open_pool(config);
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, 1000);
    free_on(p, S);
    gp_sim_advance(sim, 2000); /* S's kernel has completed */

    gp_stats before = stats();
    gp_sim_report dev_before = report();
    uint64_t device_frees = gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE);
    void *q = alloc_on(size, T); /* T's heap is empty: its fast path misses */
    gp_stats after = stats();
    gp_sim_report dev_after = report();
    cr_assert_eq(after.num_stream_steals, before.num_stream_steals + 1,
                 "T should take S's wholly free segment (steals %llu -> %llu)",
                 (unsigned long long)before.num_stream_steals, (unsigned long long)after.num_stream_steals);
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "S's fence has completed: no wait is needed");
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE), device_frees, "a steal needs no device free");
    cr_assert_eq(dev_after.allocations, dev_before.allocations, "a steal needs no new device allocation");
    cr_assert_eq(q, p, "the stolen segment's block: got %p, S freed %p", q, p);
    cr_assert_eq(after.reserved_bytes, before.reserved_bytes);

    launch(T, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    launch(T, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after T uses the stolen segment");

    /* The segment is T's now: a free on T and a new allocation on T reuse it at once. */
    free_on(q, T);
    uint64_t calls = gp_sim_calls(sim, GP_SIM_CALL_ALL);
    void *r = alloc_on(size, T);
    cr_assert_eq(r, q);
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_ALL), calls, "T's fast path made device calls");
    free_on(r, T);
    close_pool(0);
}

Test(stream_order, small_segment_stolen_after_completion)
{
    steal_after_completion(4 * KIB, "device_memory:2MiB"); /* one small segment fills the device */
}

Test(stream_order, huge_segment_stolen_after_completion)
{
    steal_after_completion(24 * MIB, "device_memory:24MiB");
}

/* When the device has room, T may grow or steal; either way its kernels never race S's. */
Test(stream_order, idle_segment_of_other_stream_with_room_on_device)
{
    open_pool("device_memory:256MiB");
    void *p = alloc_on(24 * MIB, S);
    launch(S, p, 24 * MIB, GP_SIM_WRITE, 1, 1000);
    free_on(p, S);
    gp_sim_advance(sim, 2000);
    void *q = alloc_on(24 * MIB, T);
    launch(T, q, 24 * MIB, GP_SIM_WRITE, 2, SHORT_NS);
    launch(T, q, 24 * MIB, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after T's allocation");
    free_on(q, T);
    close_pool(0);
}

/* S's fence, once recorded and completed, must not cover a free that came later. S owns two wholly
 * free segments, a 20 MiB one and a 12 MiB one, and the device is full; T takes the 12 MiB one
 * (probing S's fence, which has completed). S then reuses its 20 MiB segment under a long kernel and
 * frees the block again. When T next needs 15 MiB, only S's 20 MiB segment fits, but S's work on it
 * has not completed: T may take it only by waiting for S. */
Test(stream_order, steal_refused_after_new_free_on_owner)
{
    open_pool("device_memory:32MiB");
    void *h = alloc_on(12 * MIB, S); /* a segment of its own, 12 MiB */
    void *a = alloc_on(5 * MIB, S);  /* a large segment of 20 MiB (h's segment is full) */
    cr_assert((uintptr_t)a < (uintptr_t)h || (uintptr_t)a >= (uintptr_t)h + 12 * MIB);
    launch(S, a, 5 * MIB, GP_SIM_WRITE, 1, 1000);
    launch(S, h, 12 * MIB, GP_SIM_WRITE, 2, 1000);
    free_on(a, S);
    free_on(h, S);
    gp_sim_advance(sim, 5000);

    gp_stats before = stats();
    void *t = alloc_on(5 * MIB, T);
    gp_stats after = stats();
    cr_assert_eq(after.num_stream_steals, before.num_stream_steals + 1, "T should steal one of S's segments");
    cr_assert_eq(t, h, "T should steal the smallest segment that fits (S's 12 MiB one at %p; got %p, 20 MiB one at %p)",
                 h, t, a);

    void *b = alloc_on(5 * MIB, S);
    cr_assert_eq(b, a, "S reuses its 20 MiB segment");
    launch(S, b, 5 * MIB, GP_SIM_WRITE, 3, LONG_NS);
    free_on(b, S);

    before = stats();
    void *c = alloc_on(15 * MIB, T);
    after = stats();
    if ((uintptr_t)c >= (uintptr_t)a && (uintptr_t)c < (uintptr_t)a + 20 * MIB)
        assert_ordered_reuse(&before, &after, c);
    launch(T, c, 15 * MIB, GP_SIM_WRITE, 4, SHORT_NS);
    assert_clean("T writes while S's kernel on its freed segment still runs");
    launch(T, c, 15 * MIB, GP_SIM_CHECK, 4, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("T's pattern");
    free_on(c, T);
    free_on(t, T);
    close_pool(0);
}

/* Ping-pong on a device of one small segment: T steals S's idle segment, S steals it back, S frees
 * into it under a long kernel; T's next request must not get it without being ordered after S. */
Test(stream_order, steal_back_and_forth_respects_running_kernels)
{
    open_pool("device_memory:2MiB");
    void *a = alloc_on(4 * KIB, S);
    launch(S, a, 4 * KIB, GP_SIM_WRITE, 1, 1000);
    free_on(a, S);
    gp_sim_advance(sim, 2000);
    void *t = alloc_on(4 * KIB, T);
    cr_assert_eq(t, a, "T steals S's idle small segment");
    free_on(t, T);
    void *b = alloc_on(4 * KIB, S);
    cr_assert_eq(b, a, "S steals it back (T has no work queued)");
    launch(S, b, 4 * KIB, GP_SIM_WRITE, 2, LONG_NS);
    free_on(b, S);
    gp_stats before = stats();
    void *c = alloc_on(4 * KIB, T);
    gp_stats after = stats();
    cr_assert_eq(c, a, "the device holds one segment");
    assert_ordered_reuse(&before, &after, c);
    launch(T, c, 4 * KIB, GP_SIM_WRITE, 3, SHORT_NS);
    assert_clean("T writes while S's kernel still runs");
    launch(T, c, 4 * KIB, GP_SIM_CHECK, 3, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("T's pattern");
    free_on(c, T);
    close_pool(0);
}

/* ---- record_stream ----------------------------------------------------------------------------- */

Test(stream_order, record_stream_delays_reuse_until_other_stream_completes)
{
    open_pool("device_memory:256MiB");
    const size_t size = 64 * KIB;
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, SHORT_NS);
    gp_sim_stream_synchronize(sim, S); /* the test orders T's use after S's write */
    cr_assert_eq(gp_record_stream(pool, p, T), GP_OK, "gp_record_stream: %s", gp_last_error());
    launch(T, p, size, GP_SIM_READ, 0, LONG_NS);
    free_on(p, S);
    gp_stats s = stats();
    cr_assert_eq(s.pending_bytes, size, "the block should wait for T's event (pending %llu)",
                 (unsigned long long)s.pending_bytes);
    cr_assert_eq(s.allocated_bytes, 0);

    /* S allocates the same size right away: it must not get p while T reads it. */
    void *q = alloc_on(size, S);
    cr_assert_neq(q, p, "S got %p back while T's kernel still reads it", p);
    launch(S, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("S writes right after the free");

    /* After T's kernel completed, the next allocation on S finds p back in the cache. */
    gp_sim_advance(sim, 2 * LONG_NS);
    void *r = alloc_on(size, S);
    cr_assert_eq(r, p, "after T completed, p should be reused (got %p, p %p)", r, p);
    s = stats();
    cr_assert_eq(s.pending_bytes, 0);
    launch(S, r, size, GP_SIM_WRITE, 3, SHORT_NS);
    launch(S, r, size, GP_SIM_CHECK, 3, SHORT_NS);
    launch(S, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after reuse");
    free_on(q, S);
    free_on(r, S);
    close_pool(0);
}

/* The same, with the free on T (the recorded stream) instead of S. */
Test(stream_order, record_stream_then_free_on_recorded_stream)
{
    open_pool("device_memory:256MiB");
    const size_t size = 3 * MIB;
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, SHORT_NS);
    gp_sim_stream_synchronize(sim, S);
    cr_assert_eq(gp_record_stream(pool, p, T), GP_OK, "gp_record_stream: %s", gp_last_error());
    launch(T, p, size, GP_SIM_CHECK, 1, LONG_NS);
    free_on(p, T);
    void *q = alloc_on(size, S);
    cr_assert_neq(q, p, "S got %p back while T's kernel still reads it", p);
    launch(S, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("S writes right after the free on T");
    gp_sim_advance(sim, 2 * LONG_NS);
    void *r = alloc_on(size, S);
    cr_assert_eq(r, p);
    free_on(r, S);
    free_on(q, S);
    close_pool(0);
}

/* A block used on three streams returns only after the last of them completes. */
Test(stream_order, record_stream_on_two_streams_waits_for_both)
{
    open_pool("device_memory:256MiB");
    gp_stream U = gp_sim_stream_create(sim);
    gp_stream V = gp_sim_stream_create(sim);
    const size_t size = 8 * KIB;
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, SHORT_NS);
    gp_sim_stream_synchronize(sim, S);
    cr_assert_eq(gp_record_stream(pool, p, T), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_record_stream(pool, p, U), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_record_stream(pool, p, V), GP_OK, "%s", gp_last_error()); /* more than the inline uses */
    cr_assert_eq(gp_record_stream(pool, p, T), GP_OK, "%s", gp_last_error()); /* twice is once */
    launch(T, p, size, GP_SIM_READ, 0, 1000);
    launch(U, p, size, GP_SIM_READ, 0, 3000);
    launch(V, p, size, GP_SIM_CHECK, 1, 5000);
    free_on(p, S);

    gp_sim_advance(sim, 4000); /* T and U done, V still reading */
    void *q = alloc_on(size, S);
    cr_assert_neq(q, p, "p came back before V's kernel completed");
    launch(S, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("S writes while V still reads p");
    gp_sim_advance(sim, 10000);
    void *r = alloc_on(size, S);
    cr_assert_eq(r, p);
    launch(S, r, size, GP_SIM_WRITE, 3, SHORT_NS);
    assert_clean("S writes p after all three completed");
    free_on(q, S);
    free_on(r, S);
    close_pool(0);
}

/* ---- free on another stream -------------------------------------------------------------------- */

/* Events on one stream complete in the order they were recorded, so a scan of the pending list that
 * finds T's event not ready asks no later block's event on T (pending.c): three blocks freed on T
 * under T's long kernel cost one event query per scan, not three, and all three come back once T's
 * work is done. */
Test(stream_order, a_pending_scan_asks_a_busy_stream_once)
{
    open_pool("device_memory:256MiB");
    const size_t size = 200 * KIB;
    void *t0 = alloc_on(512, T);
    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = alloc_on(size, S);
    gp_sim_stream_synchronize(sim, S);
    for (int i = 0; i < 3; i++)
        launch(T, p[i], size, GP_SIM_READ, 0, LONG_NS);
    for (int i = 0; i < 3; i++)
        free_on(p[i], T);
    cr_assert_eq(stats().pending_bytes, 3 * size);
    uint64_t queries = gp_sim_calls(sim, GP_SIM_CALL_EVENT_QUERY);
    void *q = alloc_on(size, S); /* its fast path scans the pending list first (pending_scan 8) */
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_EVENT_QUERY) - queries, 1,
                 "%llu event queries for three blocks pending on one busy stream",
                 (unsigned long long)(gp_sim_calls(sim, GP_SIM_CALL_EVENT_QUERY) - queries));
    for (int i = 0; i < 3; i++)
        cr_assert_neq(q, p[i], "S got %p back while T's kernel still reads it", q);
    gp_sim_advance(sim, 4 * LONG_NS);
    void *r = alloc_on(size, S);
    cr_assert_eq(stats().pending_bytes, 0, "T's work is done: every pending block is back");
    free_on(r, S);
    free_on(q, S);
    free_on(t0, T);
    close_pool(0);
}

Test(stream_order, free_on_other_stream_waits_for_that_stream)
{
    open_pool("device_memory:256MiB");
    const size_t size = 200 * KIB;
    void *t0 = alloc_on(512, T); /* the pool must have seen T before a free on it */
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, SHORT_NS);
    gp_sim_stream_synchronize(sim, S); /* the test orders T after S's write */
    launch(T, p, size, GP_SIM_CHECK, 1, LONG_NS);
    free_on(p, T); /* its last use is on T */
    gp_stats s = stats();
    cr_assert_eq(s.allocated_bytes, 512, "allocated %llu", (unsigned long long)s.allocated_bytes);
    cr_assert_eq(s.pending_bytes, size, "pending %llu", (unsigned long long)s.pending_bytes);

    void *q = alloc_on(size, S);
    cr_assert_neq(q, p, "S got %p back while T's kernel still checks it", p);
    launch(S, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("S writes after the free on T");
    void *u = alloc_on(size, T); /* T must not get it either: it belongs to S's heap */
    launch(T, u, size, GP_SIM_WRITE, 4, SHORT_NS);
    assert_clean("T writes after its own free");

    gp_sim_advance(sim, 2 * LONG_NS);
    void *r = alloc_on(size, S);
    cr_assert_eq(r, p, "after T completed, p returns to S's cache");
    launch(S, r, size, GP_SIM_WRITE, 3, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after reuse on S");
    free_on(r, S);
    free_on(q, S);
    free_on(u, T);
    free_on(t0, T);
    close_pool(0);
}

Test(stream_order, free_on_unseen_stream_is_refused_and_changes_nothing)
{
    open_pool("device_memory:256MiB");
    void *p = alloc_on(4 * KIB, S);
    int rc = gp_free(pool, p, T);
    cr_assert_eq(rc, GP_ERR_UNKNOWN_STREAM, "gp_free on a stream the pool never saw: %d (%s)", rc, gp_last_error());
    cr_assert_neq(gp_last_error()[0], '\0');
    gp_stats s = stats();
    cr_assert_eq(s.active_blocks, 1);
    free_on(p, S);
    cr_assert_eq(gp_free(pool, p, S), GP_ERR_DOUBLE_FREE, "%s", gp_last_error());
    close_pool(0);
}

/* ---- destroy ----------------------------------------------------------------------------------- */

Test(stream_order, destroy_with_pending_blocks_leaks_nothing)
{
    open_pool("device_memory:256MiB");
    void *t0 = alloc_on(512, T);
    free_on(t0, T);
    void *p = alloc_on(64 * KIB, S);
    void *q = alloc_on(12 * MIB, S);
    launch(S, p, 64 * KIB, GP_SIM_WRITE, 1, SHORT_NS);
    launch(S, q, 12 * MIB, GP_SIM_WRITE, 2, SHORT_NS);
    gp_sim_stream_synchronize(sim, S);
    cr_assert_eq(gp_record_stream(pool, p, T), GP_OK, "%s", gp_last_error());
    launch(T, p, 64 * KIB, GP_SIM_READ, 0, LONG_NS);
    launch(T, q, 12 * MIB, GP_SIM_CHECK, 2, LONG_NS);
    free_on(p, S);
    free_on(q, T);
    gp_stats s = stats();
    cr_assert_eq(s.pending_bytes, 64 * KIB + 12 * MIB, "pending %llu", (unsigned long long)s.pending_bytes);
    cr_assert_eq(s.allocated_bytes, 0);
    /* no synchronisation: destroy waits for the events itself */
    gp_leak_report leaks = {99, 99};
    int rc = gp_pool_destroy(pool, &leaks);
    cr_assert_eq(rc, GP_OK, "gp_pool_destroy: %s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, 0);
    cr_assert_eq(leaks.live_bytes, 0);
    gp_sim_report r = report();
    cr_assert(r.closed);
    cr_assert_eq(r.leaked_bytes_at_close, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(r.leaked_events_at_close, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(r.races + r.pattern_mismatches + r.bad_calls, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(gp_pool_destroy(pool, NULL), GP_ERR_DESTROYED);
    gp_sim_release(sim);
}

Test(stream_order, destroy_reports_live_blocks_and_gives_their_memory_back)
{
    open_pool("device_memory:256MiB");
    void *p = alloc_on(1000, S);
    void *q = alloc_on(5 * MIB, T);
    launch(S, p, 1000, GP_SIM_WRITE, 1, LONG_NS);
    launch(T, q, 5 * MIB, GP_SIM_WRITE, 2, LONG_NS);
    gp_leak_report leaks = {0, 0};
    int rc = gp_pool_destroy(pool, &leaks);
    cr_assert_eq(rc, GP_OK, "gp_pool_destroy: %s", gp_last_error());
    cr_assert_eq(leaks.live_blocks, 2);
    cr_assert_geq(leaks.live_bytes, 1000 + 5 * MIB);
    cr_assert_neq(gp_last_error()[0], '\0', "destroy should name the blocks never freed");
    gp_sim_report r = report();
    cr_assert_eq(r.leaked_bytes_at_close, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(r.leaked_events_at_close, 0, "%s", gp_sim_first_violation(sim));
    cr_assert_eq(r.races + r.bad_calls, 0, "%s", gp_sim_first_violation(sim));
    gp_sim_release(sim);
}

/* ---- device out of memory ---------------------------------------------------------------------- */

/* The device holds one 64 MiB segment, S's, free but still written by S's kernel. T's request can
 * only be met with that segment: with steal_wait (the default) T waits on S's event and takes it; the
 * sim then orders T's kernels after S's, so the race checker stays silent and T's pattern survives. */
Test(stream_order, oom_steal_waits_on_busy_segment)
{
    open_pool("device_memory:64MiB,cache_slack:off");
    const size_t size = 64 * MIB;
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);

    gp_stats before = stats();
    uint64_t device_frees = gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE);
    void *q = alloc_on(size, T);
    gp_stats after = stats();
    cr_assert_eq(q, p, "the only segment is S's");
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits + 1, "stream waits %llu -> %llu",
                 (unsigned long long)before.num_stream_waits, (unsigned long long)after.num_stream_waits);
    cr_assert_eq(after.num_stream_steals, before.num_stream_steals + 1);
    cr_assert_eq(gp_sim_calls(sim, GP_SIM_CALL_MEM_FREE), device_frees, "a waited steal frees nothing");
    cr_assert_eq(gp_sim_now(sim), 0, "no host synchronisation: virtual time has not moved");

    launch(T, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("T writes the segment S still writes");
    launch(T, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("T's pattern after both kernels ran");
    free_on(q, T);
    close_pool(0);
}

/* Several busy free segments of S fill the device, and T asks for less than one of them: it waits for
 * S's event and takes one. (Requests above small_size use large segments; 2 MiB ones get a segment of
 * their own when the device cannot hold a 20 MiB one.) */
Test(stream_order, oom_steal_waits_for_one_of_several_segments)
{
    open_pool("device_memory:8MiB,cache_slack:off");
    void *b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = alloc_on(2 * MIB, S); /* four segments of 2 MiB fill the device */
        launch(S, b[i], 2 * MIB, GP_SIM_WRITE, 10 + (uint64_t)i, LONG_NS);
    }
    for (int i = 0; i < 4; i++)
        free_on(b[i], S);
    gp_stats before = stats();
    void *q = alloc_on(1536 * KIB, T);
    gp_stats after = stats();
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits + 1);
    cr_assert_eq(after.num_stream_steals, before.num_stream_steals + 1);
    cr_assert_eq(after.reserved_bytes, 8 * MIB);
    launch(T, q, 1536 * KIB, GP_SIM_WRITE, 2, SHORT_NS);
    launch(T, q, 1536 * KIB, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after T used a waited-for segment");
    free_on(q, T);
    close_pool(0);
}

/* The same with the default policy (which may give S's segment back before growing): however T gets
 * the memory, its kernels are ordered after S's. */
Test(stream_order, oom_busy_segment_with_default_policy)
{
    open_pool("device_memory:64MiB");
    const size_t size = 64 * MIB;
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);
    void *q = alloc_on(size, T);
    launch(T, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("T writes the segment S wrote");
    launch(T, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("T's pattern after both kernels ran");
    free_on(q, T);
    close_pool(0);
}

/* With steal_wait off, the same request is met by giving S's segment back to the device (which waits
 * for all device work, as cudaFree does) and allocating anew. */
Test(stream_order, oom_without_steal_wait_releases_and_retries)
{
    /* reuse_wait off too: within a tenant it would wait as well (the vmm tests above) */
    open_pool("device_memory:64MiB,steal_wait:false,reuse_wait:off,cache_slack:off");
    const size_t size = 64 * MIB;
    void *p = alloc_on(size, S);
    launch(S, p, size, GP_SIM_WRITE, 1, LONG_NS);
    free_on(p, S);

    gp_stats before = stats();
    void *q = alloc_on(size, T);
    gp_stats after = stats();
    cr_assert_eq(after.num_stream_waits, before.num_stream_waits, "steal_wait:false must not wait");
    cr_assert_eq(after.num_alloc_retries, before.num_alloc_retries + 1);
    cr_assert_eq(after.num_device_frees, before.num_device_frees + 1);
    cr_assert_eq(after.reserved_bytes, size);
    launch(T, q, size, GP_SIM_WRITE, 2, SHORT_NS);
    launch(T, q, size, GP_SIM_CHECK, 2, SHORT_NS);
    gp_sim_synchronize(sim);
    assert_clean("after the release and retry");
    free_on(q, T);
    close_pool(0);
}

/* A request the device cannot hold while S's block is live: GP_ERR_OOM with a message, nothing
 * changed, and the pool still works. */
Test(stream_order, oom_is_reported_and_changes_nothing)
{
    open_pool("device_memory:64MiB");
    void *p = alloc_on(40 * MIB, S);
    launch(S, p, 40 * MIB, GP_SIM_WRITE, 1, LONG_NS);
    gp_stats before = stats();
    void *q = (void *)1;
    int rc = gp_alloc(pool, &q, 40 * MIB, T);
    cr_assert_eq(rc, GP_ERR_OOM, "expected GP_ERR_OOM, got %d (%s)", rc, gp_last_error());
    cr_assert_null(q);
    cr_assert_neq(gp_last_error()[0], '\0');
    gp_stats after = stats();
    cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
    cr_assert_eq(after.active_blocks, before.active_blocks);
    cr_assert_eq(after.num_ooms, before.num_ooms + 1);
    cr_assert_eq(gp_check(pool), GP_OK, "%s", gp_last_error());
    rc = gp_alloc(pool, &q, 65 * MIB, T);
    cr_assert_eq(rc, GP_ERR_INVALID, "more than the device has: %d (%s)", rc, gp_last_error());
    launch(S, p, 40 * MIB, GP_SIM_CHECK, 1, SHORT_NS);
    free_on(p, S);
    q = alloc_on(40 * MIB, T);
    launch(T, q, 40 * MIB, GP_SIM_WRITE, 2, SHORT_NS);
    assert_clean("T writes after S's block was freed");
    free_on(q, T);
    close_pool(0);
}

/* A block freed on A while B still used it is PENDING in A's list until B's event completes. Once it
 * has completed, that memory is free: an allocation on a third stream C that finds the device full must
 * be able to get it (by collecting A's completed pending block, whose segment is then wholly free, and
 * stealing or releasing it), instead of failing with GP_ERR_OOM ("even after release"). gp_trim does
 * collect every stream's pending blocks; the allocation's OOM path collects only its own stream's. */
Test(stream_order, oom_reclaims_completed_pending_blocks_of_other_streams)
{
    open_pool("device_memory:8MiB");
    gp_stream C = gp_sim_stream_create(sim);
    void *p = alloc_on(6 * MIB, S); /* a 6 MiB segment (a 20 MiB one does not fit) */
    launch(S, p, 6 * MIB, GP_SIM_WRITE, 1, SHORT_NS);
    gp_sim_stream_synchronize(sim, S);
    cr_assert_eq(gp_record_stream(pool, p, T), GP_OK, "%s", gp_last_error());
    launch(T, p, 6 * MIB, GP_SIM_READ, 0, 1000);
    free_on(p, S); /* PENDING on T's event */
    void *q = alloc_on(2 * MIB, C); /* the device is full now */
    launch(C, q, 2 * MIB, GP_SIM_WRITE, 2, SHORT_NS);
    gp_sim_synchronize(sim); /* T's event has completed: p's memory is free */
    gp_stats s = stats();
    cr_assert_eq(s.allocated_bytes, 2 * MIB);
    cr_assert_eq(s.reserved_bytes, 8 * MIB);

    void *r = NULL;
    int rc = gp_alloc(pool, &r, 512, C);
    cr_assert_eq(rc, GP_OK,
                 "gp_alloc(512 B) on C failed (%d: %s) although 6 MiB of the pool's cache is free: S's pending "
                 "block's event completed long ago",
                 rc, gp_last_error());
    launch(C, r, 512, GP_SIM_WRITE, 3, SHORT_NS);
    assert_clean("C writes the reclaimed memory");
    free_on(r, C);
    free_on(q, C);
    close_pool(0);
}

/* Issue 9 finding 13: pending_scan:0 means what its help says, no pending frees queried before the
 * fast path (it meant "query every one"). */
Test(stream_order, pending_scan_zero_queries_nothing_on_the_fast_path)
{
    unsetenv("GPUPOOL_CONF");
    gp_pool *pl;
    cr_assert_eq(gp_pool_create(&pl, 0, "sim", "device_memory:256MiB,pending_scan:0"), GP_OK, "%s", gp_last_error());
    gp_sim *sm = gp_sim_of(pl);
    gp_stream s1 = gp_sim_stream_create(sm), s2 = gp_sim_stream_create(sm);
    void *keep, *p[4];
    cr_assert_eq(gp_alloc(pl, &keep, 4096, s1), GP_OK);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(gp_alloc(pl, &p[i], 8192, s1), GP_OK);
        cr_assert_eq(gp_record_stream(pl, p[i], s2), GP_OK);
        cr_assert_eq(gp_free(pl, p[i], s1), GP_OK);
    }
    gp_sim_synchronize(sm);
    uint64_t queries = gp_sim_calls(sm, GP_SIM_CALL_EVENT_QUERY);
    void *q;
    cr_assert_eq(gp_alloc(pl, &q, 4096, s1), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_sim_calls(sm, GP_SIM_CALL_EVENT_QUERY), queries, "the fast path queried %llu events",
                 (unsigned long long)(gp_sim_calls(sm, GP_SIM_CALL_EVENT_QUERY) - queries));
    cr_assert_eq(gp_free(pl, q, s1), GP_OK);
    cr_assert_eq(gp_free(pl, keep, s1), GP_OK);
    cr_assert_eq(gp_check(pl), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_pool_destroy(pl, NULL), GP_OK);
}
