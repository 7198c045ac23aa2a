/*
 * fuzz_api.c — libFuzzer target: a sequence of public-API calls on one pool of the simulated GPU
 * ("sim" or "sim-vmm"), with the sim's fault injection armed by the input itself.
 *
 * The input is decoded, byte by byte, into a pool configuration and then a list of operations: alloc,
 * free (also of bad pointers, on other streams and on a stream the pool never saw), record_stream,
 * trim, maintain, tenant create / set_limits / push / pop / bind_stream / pause / resume, stats
 * (struct, JSON with any buffer size, print, per tenant), kernels on live blocks, virtual time, and
 * "make the Nth device call of these kinds fail". The rules checked after every call (abort() when one
 * breaks, so libFuzzer keeps the input):
 *   - gp_check(pool) == GP_OK;
 *   - a failed call returns a negative code, leaves a non-empty gp_last_error(), and changed nothing
 *     the user can see: live bytes, live blocks, alloc/free counts, paused bytes and, per tenant, its
 *     live bytes, limits and paused flag (snapshot before, compare after). Cached and reserved bytes
 *     may move: a refused allocation first gives cache back, by contract. Only a call whose message
 *     says "undoing it failed too" (a resume whose undo met a second fault) may leave paused bytes
 *     lower: pages it mapped for the still-paused tenant stay mapped;
 *   - a successful alloc returns a 512-byte aligned pointer whose bytes overlap no other live block;
 *   - the sim sees no race, no pattern mismatch and no bad device call: every live block is written
 *     with a pattern (head and tail) when allocated and checked when freed and at the end;
 *   - at the end (faults disarmed, everything freed) destroy leaves nothing in the sim's ledger.
 *
 * FUZZ_API_VERBOSE=1 in the environment prints every call and its result (to read a crash input).
 *
 * The harness is a correct caller: kernels only touch live blocks, a block freed on another stream has
 * its own stream synchronized first, kernels on other streams only read (on streams recorded with
 * gp_record_stream), and nothing touches a paused tenant's blocks. It pauses with the tenant's kernels
 * still queued: waiting for them is the pause's own job.
 *
 * No path is avoided: the known findings of issue 9 that once were (frees in a tenant paused with
 * GP_PAUSE_KEEP_CONTENTS, tenant max/high on sim-vmm, frames left on the thread at destroy, blocks on
 * three or more streams on sim-vmm, mins near SIZE_MAX) are fixed, and their crash inputs (known*-*)
 * stay in tests/fuzz/api as regressions.
 *
 * stats.streams is not compared across a failed call: it counts the (stream, tenant) states the pool
 * has seen, and a refused call on a new pair makes one (left unclaimed, ds/stream.h). The rule of
 * finding 11 is that such a pair does not count against max_streams until a call on it succeeds or
 * leaves memory in it; stats do not show that count (tests/api/test_tenants.c tests the rule).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define MAX_BLOCKS 48
#define NUM_STREAMS 4      /* index 0 is the default stream (NULL) */
#define NUM_NAMES 6
#define MAX_TENANTS 8
#define MAX_PUSH 40 /* more than the pool's nesting limit, so that its refusal is tried */
#define PATTERN_SPAN (4 * KIB) /* the head and the tail of a block get a pattern */
#define MAX_OPS 256

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_api: %s%s%s\n", what, detail != NULL ? ": " : "", detail != NULL ? detail : "");
    abort();
}

#define CHECK(cond, detail)                                                                                    \
    do {                                                                                                       \
        if (!(cond))                                                                                           \
            fail("check failed: " #cond, (detail));                                                           \
    } while (0)

/* ---- the input ------------------------------------------------------------------------------------ */

typedef struct reader {
    const uint8_t *data;
    size_t size, at;
} reader;

static bool more(const reader *r) { return r->at < r->size; }
static uint8_t u8(reader *r) { return r->at < r->size ? r->data[r->at++] : 0; }
static uint32_t u24(reader *r)
{
    uint32_t v = u8(r);
    v |= (uint32_t)u8(r) << 8;
    return v | (uint32_t)u8(r) << 16;
}

/* ---- the model the harness keeps of the pool ------------------------------------------------------ */

/* Names: the first three are valid, then the built-in one, then two bad ones (empty, too long). */
static const char *const names[NUM_NAMES] = {
    "alpha", "beta", "ga\"m\\ma", "default", "", /* the third needs escaping in JSON (finding 9) */
    "a-name-of-sixty-four-bytes-which-is-one-more-than-any-tenant-may", /* 64 bytes */
};

typedef struct tenant {
    bool exists, paused, keep; /* keep: paused with GP_PAUSE_KEEP_CONTENTS */
} tenant;

typedef struct block {
    bool live;
    bool contents_known; /* its head and tail hold the pattern of seed */
    void *p;
    size_t size;
    int stream;         /* where it was allocated */
    unsigned uses;      /* bit i: used (recorded) on stream i */
    int tenant;         /* index in names[] */
    uint64_t seed;
} block;

typedef struct state {
    gp_pool *pool;
    gp_sim *sim;
    bool vmm;
    size_t device;
    gp_stream streams[NUM_STREAMS + 1]; /* the last one is never used: frees on it must be refused */
    int bound[NUM_STREAMS];             /* tenant bound to stream i, -1 = none */
    tenant tenants[NUM_NAMES];
    int push[MAX_PUSH];
    int pushes;
    block blocks[MAX_BLOCKS];
    block freed[MAX_BLOCKS]; /* recently freed blocks: their pointers for double frees */
    uint64_t next_seed;
} state;

/* What a failed call must leave as it was. */
typedef struct snapshot {
    uint64_t allocated, requested, active, num_allocs, num_frees, paused;
    size_t tenant_count;
    struct {
        bool present;
        uint64_t allocated, max, high, min;
        int paused;
    } t[NUM_NAMES];
} snapshot;

static snapshot take(const state *s)
{
    snapshot out;
    memset(&out, 0, sizeof out);
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    CHECK(gp_get_stats(s->pool, &st) == GP_OK, gp_last_error());
    out.allocated = st.allocated_bytes;
    out.requested = st.requested_bytes;
    out.active = st.active_blocks;
    out.num_allocs = st.num_allocs;
    out.num_frees = st.num_frees;
    out.paused = st.paused_bytes;
    CHECK(gp_tenant_count(s->pool, &out.tenant_count) == GP_OK, gp_last_error());
    for (int i = 0; i < NUM_NAMES; i++) {
        gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
        if (gp_tenant_get_stats(s->pool, names[i], &ts) != GP_OK)
            continue;
        out.t[i].present = true;
        out.t[i].allocated = ts.allocated_bytes;
        out.t[i].max = ts.max;
        out.t[i].high = ts.high;
        out.t[i].min = ts.min;
        out.t[i].paused = ts.paused;
    }
    return out;
}

/* undo_failed: the call said that undoing it met a second fault, leaving pages it had mapped for a
 * paused tenant mapped: paused bytes may then be lower (never higher); everything else is as before. */
static void same(const snapshot *a, const snapshot *b, const char *call, bool undo_failed)
{
    char detail[512];
    snprintf(detail, sizeof detail, "a failed %s changed the pool (allocated %llu -> %llu, active %llu -> %llu, "
             "allocs %llu -> %llu, frees %llu -> %llu, paused %llu -> %llu, tenants %zu -> %zu)", call,
             (unsigned long long)a->allocated, (unsigned long long)b->allocated, (unsigned long long)a->active,
             (unsigned long long)b->active, (unsigned long long)a->num_allocs, (unsigned long long)b->num_allocs,
             (unsigned long long)a->num_frees, (unsigned long long)b->num_frees, (unsigned long long)a->paused,
             (unsigned long long)b->paused, a->tenant_count, b->tenant_count);
    CHECK(a->allocated == b->allocated && a->requested == b->requested && a->active == b->active &&
              a->num_allocs == b->num_allocs && a->num_frees == b->num_frees &&
              (a->paused == b->paused || (undo_failed && b->paused < a->paused)) &&
              a->tenant_count == b->tenant_count,
          detail);
    for (int i = 0; i < NUM_NAMES; i++) {
        snprintf(detail, sizeof detail, "a failed %s changed tenant '%s'", call, names[i]);
        CHECK(a->t[i].present == b->t[i].present && a->t[i].allocated == b->t[i].allocated &&
                  a->t[i].max == b->t[i].max && a->t[i].high == b->t[i].high && a->t[i].min == b->t[i].min &&
                  a->t[i].paused == b->t[i].paused,
              detail);
    }
}

static void sim_clean(const state *s)
{
    gp_sim_report r;
    gp_sim_get_report(s->sim, &r);
    CHECK(r.races == 0 && r.pattern_mismatches == 0 && r.bad_calls == 0, gp_sim_first_violation(s->sim));
}

/* After every call: gp_check, and for a failure the contract of failures. */
static int verbose = -1;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    if (verbose < 0)
        verbose = getenv("FUZZ_API_VERBOSE") != NULL;
    if (!verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* Every pool records its peak composition (peak_composition:on, which changes no decision: test_peak.c):
 * once recorded, its parts add up to what it says was reserved, and that is no more than the peak. */
static void check_peak_composition(state *s)
{
    gp_peak_composition c = {.size = sizeof c, .version = GP_PEAK_COMPOSITION_VERSION};
    CHECK(gp_get_peak_composition(s->pool, &c) == GP_OK, gp_last_error());
    if (!c.recorded)
        return;
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    CHECK(gp_get_stats(s->pool, &st) == GP_OK, gp_last_error());
    uint64_t sum = c.small.allocated_bytes + c.small.pending_bytes + c.small.free_in_used_bytes +
                   c.small.free_whole_bytes + c.large.allocated_bytes + c.large.pending_bytes +
                   c.large.free_in_used_bytes + c.large.free_whole_bytes + c.unmapped_cached_bytes + c.parked_bytes;
    CHECK(sum == c.reserved_bytes, "the peak composition's parts do not add up to its reserved bytes");
    CHECK(c.reserved_bytes <= st.reserved_bytes_peak, "the peak composition says more than the peak");
}

static void after(state *s, int rc, const snapshot *before, const char *call)
{
    if (verbose < 0)
        verbose = getenv("FUZZ_API_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "  %s -> %d%s%s\n", call, rc, rc ? ": " : "", rc ? gp_last_error() : "");
    if (rc != GP_OK) {
        char detail[160];
        snprintf(detail, sizeof detail, "%s returned %d", call, rc);
        CHECK(rc < 0 && rc >= GP_ERR_CORRUPT && rc != GP_ERR_CORRUPT, detail);
        snprintf(detail, sizeof detail, "%s failed (%s) without a message", call, gp_strerror(rc));
        CHECK(gp_last_error()[0] != '\0', detail);
        /* A call whose undo met a second fault says so. Read before take(): its calls for names that do
         * not exist set the thread's message (this check once read that one, so it never saw the words). */
        bool undo_failed = strstr(gp_last_error(), "undoing it failed too") != NULL;
        snapshot now = take(s);
        same(before, &now, call, undo_failed);
    }
    if (gp_check(s->pool) != GP_OK)
        fail("gp_check failed", gp_last_error());
    check_peak_composition(s);
    sim_clean(s);
}

/* ---- helpers over the model ----------------------------------------------------------------------- */

/* The tenant an allocation on stream i goes to: the thread's current one, the stream's, or default. */
static int tenant_of_alloc(const state *s, int stream)
{
    if (s->pushes > 0)
        return s->push[s->pushes - 1];
    if (s->bound[stream] >= 0)
        return s->bound[stream];
    return 3; /* "default" */
}

static bool untouchable(const state *s, const block *b) { return s->tenants[b->tenant].paused; }

static void pattern(state *s, block *b, int op)
{
    size_t head = b->size < PATTERN_SPAN ? b->size : PATTERN_SPAN;
    gp_stream st = s->streams[b->stream];
    int rc = gp_sim_launch(s->sim, st, b->p, head, op, b->seed, 100);
    CHECK(rc == GP_OK, gp_sim_first_violation(s->sim));
    if (b->size > head) {
        size_t tail = b->size - head < PATTERN_SPAN ? b->size - head : PATTERN_SPAN;
        rc = gp_sim_launch(s->sim, st, (char *)b->p + b->size - tail, tail, op, b->seed ^ 0x5a5a, 100);
        CHECK(rc == GP_OK, gp_sim_first_violation(s->sim));
    }
}

static bool overlaps(const state *s, const void *p, size_t size)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        const block *b = &s->blocks[i];
        uintptr_t c = (uintptr_t)b->p;
        if (b->live && b->p != NULL && a < c + b->size && c < a + size)
            return true;
    }
    return false;
}

static size_t pick_size(state *s, reader *r)
{
    uint8_t k = u8(r);
    static const size_t table[] = {0, 1, 511, 512, 513, 4 * KIB, 8 * KIB - 1, 64 * KIB, MIB, 2 * MIB,
                                   2 * MIB + 1, 4 * MIB, 6 * MIB, 10 * MIB, 20 * MIB};
    if (k < 15 * 12)
        return table[k % 15];
    if (k < 250)
        return (size_t)u24(r) + 1; /* up to 16 MiB */
    if (k < 253)
        return s->device + 1;
    if (k < 255)
        return SIZE_MAX - (size_t)(k & 1) * 511;
    return s->device;
}

static size_t pick_limit(uint8_t k)
{
    /* 2^63 and SIZE_MAX: mins that would wrap when summed (finding 10), limits past any device. */
    static const size_t table[] = {0, MIB, 2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB, 16 * MIB, 64 * MIB,
                                   (size_t)1 << 63, SIZE_MAX};
    return table[k % 10];
}

static gp_tenant_limits limits(uint8_t a, uint8_t b)
{
    gp_tenant_limits lim = {.max = pick_limit(a), .high = pick_limit((uint8_t)(a >> 4)), .min = pick_limit(b)};
    return lim;
}

static void model_free(state *s, int i)
{
    s->freed[i] = s->blocks[i];
    s->blocks[i].live = false;
}

/* ---- operations ----------------------------------------------------------------------------------- */

static void op_alloc(state *s, reader *r)
{
    size_t size = pick_size(s, r);
    int stream = u8(r) % NUM_STREAMS;
    int slot = -1;
    for (int i = 0; i < MAX_BLOCKS && slot < 0; i++)
        if (!s->blocks[i].live)
            slot = i;
    if (slot < 0)
        return;
    say("alloc %zu on stream %d\n", size, stream);
    snapshot before = take(s);
    void *p = (void *)1;
    int rc = gp_alloc(s->pool, &p, size, s->streams[stream]);
    after(s, rc, &before, "gp_alloc");
    if (rc != GP_OK) {
        CHECK(p == NULL, "a failed gp_alloc left *out set");
        return;
    }
    if (size == 0) {
        CHECK(p == NULL, "gp_alloc of 0 bytes returned a pointer");
        return;
    }
    CHECK(p != NULL && ((uintptr_t)p & 511) == 0, "gp_alloc returned a NULL or unaligned pointer");
    CHECK(!overlaps(s, p, size), "gp_alloc returned memory that overlaps a live block");
    int t = tenant_of_alloc(s, stream);
    CHECK(!s->tenants[t].paused, "gp_alloc succeeded in a paused tenant");
    block *b = &s->blocks[slot];
    *b = (block){.live = true, .contents_known = true, .p = p, .size = size, .stream = stream,
                 .uses = 1u << stream, .tenant = t, .seed = ++s->next_seed};
    pattern(s, b, GP_SIM_WRITE);
}

static void op_free(state *s, reader *r)
{
    uint8_t how = u8(r);
    int i = u8(r) % MAX_BLOCKS;
    block *b = &s->blocks[i];
    snapshot before = take(s);
    int rc;
    switch (how % 8) {
    case 0: /* a pointer the pool never returned */
        rc = gp_free(s->pool, (void *)(uintptr_t)0x10000, s->streams[0]);
        CHECK(rc != GP_OK, "gp_free of a foreign pointer succeeded");
        after(s, rc, &before, "gp_free(foreign)");
        return;
    case 1: /* a double free */
        if (!s->freed[i].p || s->freed[i].live || overlaps(s, s->freed[i].p, 1))
            return;
        rc = gp_free(s->pool, s->freed[i].p, s->streams[s->freed[i].stream]);
        CHECK(rc != GP_OK, "a double free succeeded");
        after(s, rc, &before, "gp_free(double)");
        return;
    case 2: /* inside a live block */
        if (!b->live || b->p == NULL || b->size < 1024)
            return;
        rc = gp_free(s->pool, (char *)b->p + 512, s->streams[b->stream]);
        CHECK(rc != GP_OK, "gp_free of an interior pointer succeeded");
        after(s, rc, &before, "gp_free(interior)");
        return;
    case 3: /* a stream the pool never saw */
        if (!b->live || b->p == NULL)
            return;
        rc = gp_free(s->pool, b->p, s->streams[NUM_STREAMS]);
        CHECK(rc != GP_OK, "gp_free on an unknown stream succeeded");
        after(s, rc, &before, "gp_free(unknown stream)");
        return;
    default:
        break;
    }
    if (!b->live || b->p == NULL)
        return;
    int stream = b->stream;
    if (how % 8 == 7) {
        /* On another stream: the block's last use must then be ordered on that stream. */
        stream = u8(r) % NUM_STREAMS;
        if (stream != b->stream)
            gp_sim_synchronize(s->sim);
    }
    if (!untouchable(s, b) && b->contents_known)
        pattern(s, b, GP_SIM_CHECK);
    before = take(s);
    rc = gp_free(s->pool, b->p, s->streams[stream]);
    after(s, rc, &before, "gp_free");
    if (rc == GP_OK)
        model_free(s, i);
}

static void op_record(state *s, reader *r)
{
    int i = u8(r) % MAX_BLOCKS;
    int stream = u8(r) % NUM_STREAMS;
    block *b = &s->blocks[i];
    snapshot before = take(s);
    if (!b->live || b->p == NULL) {
        int rc = gp_record_stream(s->pool, (void *)(uintptr_t)0x20000, s->streams[stream]);
        CHECK(rc != GP_OK, "gp_record_stream of a foreign pointer succeeded");
        after(s, rc, &before, "gp_record_stream(foreign)");
        return;
    }
    int rc = gp_record_stream(s->pool, b->p, s->streams[stream]);
    after(s, rc, &before, "gp_record_stream");
    if (rc == GP_OK) {
        b->uses |= 1u << stream;
        /* A reading kernel on that stream, ordered after the writes by a synchronize: the pool must now
         * keep the block until it completes, wherever it is freed. */
        if (stream != b->stream && !untouchable(s, b)) {
            gp_sim_stream_synchronize(s->sim, s->streams[b->stream]);
            size_t len = b->size < PATTERN_SPAN ? b->size : PATTERN_SPAN;
            CHECK(gp_sim_launch(s->sim, s->streams[stream], b->p, len, GP_SIM_READ, 0, 5000) == GP_OK,
                  gp_sim_first_violation(s->sim));
        }
    }
}

static void op_trim(state *s, reader *r)
{
    uint8_t k = u8(r);
    size_t keep = (k & 3) == 0 ? 0 : (size_t)(k >> 2) * MIB;
    snapshot before = take(s);
    size_t released = 0;
    int rc = gp_trim(s->pool, keep, &released);
    after(s, rc, &before, "gp_trim");
}

static void op_maintain(state *s)
{
    snapshot before = take(s);
    size_t released = 0;
    int rc = gp_maintain(s->pool, (s->next_seed & 1) ? &released : NULL);
    after(s, rc, &before, "gp_maintain");
}

static void op_tenant_create(state *s, reader *r)
{
    int n = u8(r) % NUM_NAMES;
    uint8_t a = u8(r), b = u8(r);
    gp_tenant_limits lim = limits(a, b);
    say("tenant_create '%s' max %zu high %zu min %zu%s\n", names[n], lim.max, lim.high, lim.min,
        (b & 0x80) ? " (NULL limits)" : "");
    snapshot before = take(s);
    int rc = gp_tenant_create(s->pool, names[n], (b & 0x80) ? NULL : &lim);
    after(s, rc, &before, "gp_tenant_create");
    if (rc == GP_OK) {
        CHECK(!s->tenants[n].exists && n < 3, "gp_tenant_create accepted a duplicate or bad name");
        s->tenants[n].exists = true;
    }
}

static void op_set_limits(state *s, reader *r)
{
    int n = u8(r) % NUM_NAMES;
    uint8_t a = u8(r), b = u8(r);
    gp_tenant_limits lim = limits(a, b);
    say("set_limits '%s' max %zu high %zu min %zu\n", names[n], lim.max, lim.high, lim.min);
    snapshot before = take(s);
    int rc = gp_tenant_set_limits(s->pool, names[n], &lim);
    after(s, rc, &before, "gp_tenant_set_limits");
}

static void op_push(state *s, reader *r)
{
    int n = u8(r) % NUM_NAMES;
    if (s->pushes == MAX_PUSH)
        return;
    snapshot before = take(s);
    say("push '%s'\n", names[n]);
    int rc = gp_tenant_push(s->pool, names[n]);
    after(s, rc, &before, "gp_tenant_push");
    if (rc == GP_OK) {
        CHECK(s->tenants[n].exists, "gp_tenant_push of an unknown tenant succeeded");
        s->push[s->pushes++] = n;
    }
}

static void op_pop(state *s)
{
    snapshot before = take(s);
    int rc = gp_tenant_pop(s->pool);
    after(s, rc, &before, "gp_tenant_pop");
    CHECK((rc == GP_OK) == (s->pushes > 0), "gp_tenant_pop without a push succeeded, or one with failed");
    if (rc == GP_OK)
        s->pushes--;
}

static void op_bind(state *s, reader *r)
{
    uint8_t k = u8(r);
    int stream = u8(r) % NUM_STREAMS;
    int n = k % (NUM_NAMES + 1);
    snapshot before = take(s);
    int rc = gp_tenant_bind_stream(s->pool, n == NUM_NAMES ? NULL : names[n], s->streams[stream]);
    after(s, rc, &before, "gp_tenant_bind_stream");
    if (rc == GP_OK)
        s->bound[stream] = n == NUM_NAMES ? -1 : n;
}

static void op_pause(state *s, reader *r)
{
    uint8_t k = u8(r);
    int n = k % NUM_NAMES;
    unsigned flags = (k & 0x80) ? GP_PAUSE_KEEP_CONTENTS : 0;
    /* The tenant's kernels may still be queued (on its blocks' streams, and on streams they were
     * recorded for): the pause waits for them itself; an unmap or copy under one is a bad call. */
    snapshot before = take(s);
    int rc = gp_tenant_pause(s->pool, names[n], flags);
    after(s, rc, &before, "gp_tenant_pause");
    if (!flags && s->tenants[n].exists) {
        /* Contents are not kept without the flag, by contract, whether the pause succeeds or not. */
        for (int i = 0; i < MAX_BLOCKS; i++)
            if (s->blocks[i].live && s->blocks[i].tenant == n)
                s->blocks[i].contents_known = false;
    }
    if (rc == GP_OK) {
        CHECK(s->vmm && s->tenants[n].exists && !s->tenants[n].paused, "gp_tenant_pause succeeded where it cannot");
        s->tenants[n].paused = true;
        s->tenants[n].keep = flags != 0;
    }
}

static void op_resume(state *s, reader *r)
{
    int n = u8(r) % NUM_NAMES;
    snapshot before = take(s);
    int rc = gp_tenant_resume(s->pool, names[n]);
    after(s, rc, &before, "gp_tenant_resume");
    if (rc == GP_OK) {
        CHECK(s->tenants[n].paused, "gp_tenant_resume of a tenant that is not paused succeeded");
        s->tenants[n].paused = false;
    }
}

static void op_fault(state *s, reader *r)
{
    static const unsigned masks[] = {
        GP_SIM_CALL_ALL, GP_SIM_CALL_MEM_ALLOC, GP_SIM_CALL_MEM_FREE,
        GP_SIM_CALL_EVENT_CREATE | GP_SIM_CALL_EVENT_RECORD | GP_SIM_CALL_EVENT_QUERY | GP_SIM_CALL_STREAM_WAIT,
        GP_SIM_CALL_MAP, GP_SIM_CALL_UNMAP, GP_SIM_CALL_PHYS_CREATE | GP_SIM_CALL_PHYS_RELEASE,
        GP_SIM_CALL_VA_RESERVE | GP_SIM_CALL_VA_RELEASE | GP_SIM_CALL_EVENT_SYNC | GP_SIM_CALL_EVENT_DESTROY |
            GP_SIM_CALL_MEM_INFO,
    };
    uint8_t k = u8(r);
    uint64_t n = (uint64_t)(u8(r) % 16);
    say("fail call %llu of mask 0x%x with %d\n", (unsigned long long)n, masks[k % 8], (k & 0x80) ? GP_ERR_OOM : GP_ERR_DEVICE);
    gp_sim_fail_call(s->sim, n, masks[k % 8], (k & 0x80) ? GP_ERR_OOM : GP_ERR_DEVICE);
}

static void op_time(state *s, reader *r)
{
    uint8_t k = u8(r);
    if (k < 32)
        gp_sim_synchronize(s->sim);
    else if (k < 64)
        gp_sim_stream_synchronize(s->sim, s->streams[k % NUM_STREAMS]);
    else
        gp_sim_advance(s->sim, (uint64_t)k * 1000 * (k & 7 ? 1 : 1000));
}

static void op_rewrite(state *s, reader *r)
{
    block *b = &s->blocks[u8(r) % MAX_BLOCKS];
    /* A new pattern on its own stream, when no other stream has used it (a write would race). */
    if (!b->live || b->p == NULL || untouchable(s, b) || b->uses != 1u << b->stream)
        return;
    b->seed = ++s->next_seed;
    b->contents_known = true;
    pattern(s, b, GP_SIM_WRITE);
}

/* True when text is one JSON value whose strings are escaped and whose brackets nest (a light check:
 * enough to catch a name printed raw, which unbalances the quotes). */
static bool json_shaped(const char *text)
{
    int depth = 0;
    bool in_string = false;
    for (const char *c = text; *c != '\0'; c++) {
        if (in_string) {
            if ((unsigned char)*c < 0x20)
                return false;
            if (*c == '\\') {
                if (c[1] == '\0' || strchr("\"\\/bfnrtu", c[1]) == NULL)
                    return false;
                c++;
            } else if (*c == '"') {
                in_string = false;
            }
        } else if (*c == '"') {
            in_string = true;
        } else if (*c == '{' || *c == '[') {
            depth++;
        } else if (*c == '}' || *c == ']') {
            if (--depth < 0)
                return false;
        }
    }
    return !in_string && depth == 0;
}

static void count_text(void *opaque, const char *text) { *(size_t *)opaque += strlen(text); }

static void op_stats(state *s, reader *r)
{
    uint8_t k = u8(r);
    char buf[16384];
    size_t len = k < 128 ? k : sizeof buf;
    size_t needed = 0;
    memset(buf, 'x', sizeof buf);
    int rc = gp_stats_json(s->pool, buf, len, &needed);
    CHECK(rc == GP_OK, gp_last_error());
    if (len > 0)
        CHECK(memchr(buf, '\0', len) != NULL, "gp_stats_json left its buffer without a NUL");
    CHECK(len == 0 || strlen(buf) == (needed < len ? needed : len - 1), "gp_stats_json's needed is wrong");
    if (len == sizeof buf && needed < len)
        CHECK(json_shaped(buf), buf);
    size_t printed = 0;
    CHECK(gp_stats_print(s->pool, count_text, &printed) == GP_OK && printed > 0, gp_last_error());
    gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
    size_t count = 0;
    CHECK(gp_tenant_count(s->pool, &count) == GP_OK, gp_last_error());
    for (size_t i = 0; i < count; i++) {
        char name[GP_TENANT_NAME_MAX];
        CHECK(gp_tenant_name(s->pool, i, name, sizeof name) == GP_OK, gp_last_error());
        CHECK(gp_tenant_get_stats(s->pool, name, &ts) == GP_OK, gp_last_error());
        CHECK(ts.cached_bytes == ts.held_bytes - ts.allocated_bytes || ts.paused, "tenant held != allocated + cached");
    }
    CHECK(gp_tenant_name(s->pool, count, buf, sizeof buf) != GP_OK, "gp_tenant_name past the end succeeded");
}

/* ---- the input's header: backend and configuration ------------------------------------------------ */

static bool open_pool(state *s, reader *r)
{
    uint8_t h = u8(r);
    /* Small devices: out-of-memory paths are reached in a few calls, and a pause that stages a tenant's
     * blocks copies little (a 128 MiB device made single inputs take seconds). */
    static const size_t devices[] = {16 * MIB, 24 * MIB, 32 * MIB, 48 * MIB};
    memset(s, 0, sizeof *s);
    s->vmm = h & 1;
    s->device = devices[(h >> 1) & 3];
    char conf[640];
    snprintf(conf, sizeof conf, "device_memory:%zuMiB,small_size:1MiB,small_segment:2MiB,large_segment:%s,"
             "huge_size:4MiB,peak_composition:on%s%s%s%s%s",
             s->device / MIB, (h & 0x40) ? "2MiB" : "6MiB", (h & 8) ? ",defrag:off" : "",
             (h & 16) ? ",cache_slack:off" : "", (s->vmm && (h & 32)) ? ",vmm_reserve:8MiB" : "",
             (h & 0x80) ? ",max_streams:4,pending_scan:1" : "", (h & 0xc0) == 0xc0 ? ",idle_release:1ms" : "");
    say("pool %s \"%s\"\n", s->vmm ? "sim-vmm" : "sim", conf);
    int rc = gp_pool_create(&s->pool, 0, s->vmm ? "sim-vmm" : "sim", conf);
    if (rc != GP_OK)
        fail("gp_pool_create failed", gp_last_error());
    s->sim = gp_sim_of(s->pool);
    CHECK(s->sim != NULL, "no sim behind a sim pool");
    gp_sim_retain(s->sim);
    s->streams[0] = NULL;
    for (int i = 1; i <= NUM_STREAMS; i++)
        s->streams[i] = gp_sim_stream_create(s->sim);
    for (int i = 0; i < NUM_STREAMS; i++)
        s->bound[i] = -1;
    s->tenants[3].exists = true; /* "default" */
    return true;
}

static void close_pool(state *s)
{
    gp_sim_fail_call(s->sim, 0, 0, 0);
    /* Frames pushed and not popped stay on the thread: destroy must cope (finding 4), and the next
     * input's pool must not see them. */
    s->pushes = 0;
    for (int n = 0; n < NUM_NAMES; n++)
        if (s->tenants[n].paused && gp_tenant_resume(s->pool, names[n]) == GP_OK)
            s->tenants[n].paused = false;
    CHECK(gp_check(s->pool) == GP_OK, gp_last_error());
    for (int i = 0; i < MAX_BLOCKS; i++) {
        block *b = &s->blocks[i];
        if (!b->live || b->p == NULL)
            continue;
        if (!untouchable(s, b) && b->contents_known)
            pattern(s, b, GP_SIM_CHECK);
        int rc = gp_free(s->pool, b->p, s->streams[b->stream]);
        CHECK(rc == GP_OK, gp_last_error());
        b->live = false;
    }
    gp_sim_synchronize(s->sim);
    sim_clean(s);
    CHECK(gp_check(s->pool) == GP_OK, gp_last_error());
    gp_leak_report leaks;
    int rc = gp_pool_destroy(s->pool, &leaks);
    CHECK(rc == GP_OK, gp_last_error());
    gp_sim_report rep;
    gp_sim_get_report(s->sim, &rep);
    CHECK(rep.closed && rep.leaked_bytes_at_close == 0 && rep.leaked_events_at_close == 0 &&
              rep.leaked_handles_at_close == 0 && rep.leaked_mappings_at_close == 0 &&
              rep.leaked_reservations_at_close == 0,
          gp_sim_first_violation(s->sim));
    CHECK(rep.races == 0 && rep.pattern_mismatches == 0 && rep.bad_calls == 0, gp_sim_first_violation(s->sim));
    gp_sim_release(s->sim);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static state s;
    reader r = {.data = data, .size = size, .at = 0};
    unsetenv("GPUPOOL_CONF");
    if (!open_pool(&s, &r))
        return 0;
    for (int ops = 0; ops < MAX_OPS && more(&r); ops++) {
        switch (u8(&r) % 20) {
        case 0: case 1: case 2: op_alloc(&s, &r); break;
        case 3: case 4: op_free(&s, &r); break;
        case 5: op_record(&s, &r); break;
        case 6: op_trim(&s, &r); break;
        case 7: op_maintain(&s); break;
        case 8: op_tenant_create(&s, &r); break;
        case 9: op_set_limits(&s, &r); break;
        case 10: op_push(&s, &r); break;
        case 11: op_pop(&s); break;
        case 12: op_bind(&s, &r); break;
        case 13: op_pause(&s, &r); break;
        case 14: op_resume(&s, &r); break;
        case 15: case 16: op_fault(&s, &r); break;
        case 17: op_time(&s, &r); break;
        case 18: op_rewrite(&s, &r); break;
        default: op_stats(&s, &r); break;
        }
    }
    close_pool(&s);
    return 0;
}
