/*
 * replay.c — runs a parsed trace through a pool on the simulated GPU (see replay.h).
 *
 * Bookkeeping per event is one array access: the trace reader already turned every pointer into an
 * allocation slot, so pool pointers live in ptrs[slot]. Invariant between events:
 *     live == sum of trace->slot_size[s] over the slots s with ptrs[s] != NULL
 * (an allocation of size 0 succeeds with NULL and adds nothing, so it needs no slot state).
 */
#define _POSIX_C_SOURCE 200809L
#include "replay.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpupool_sim.h"

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void note_failure(gp_replay_result *r, const char *what, int rc)
{
    if (r->first_failure[0] != '\0')
        return;
    const char *msg = gp_last_error();
    snprintf(r->first_failure, sizeof r->first_failure, "%s: %s", what, msg[0] ? msg : gp_strerror(rc));
}

typedef struct replay_state {
    gp_pool *pool;
    gp_sim *sim;
    gp_stream *streams; /* per trace stream index */
    void **ptrs;        /* per slot: the pool's pointer, NULL when not live (or of size 0) */
    uint64_t live;
    uint64_t peak_live;
    uint64_t live_rounded; /* live with every size rounded up to the granule: the page floor's input */
    uint64_t peak_live_rounded;
    /* Stream work (gp_replay_options.stream_work): per event, its time from the trace's first event and
     * the time to the next event on its stream (0 for a stream's last), both in ns; NULL without. */
    uint64_t *at_ns, *gap_ns;
    uint64_t kernels;
} replay_state;

#define REPLAY_GRANULE 512u                /* the pool's (and cudaMalloc's) allocation granule */
#define REPLAY_PAGE ((uint64_t)2 << 20)    /* the device page of current GPUs */

static uint64_t granule_round(uint64_t size)
{
    return (size + REPLAY_GRANULE - 1) / REPLAY_GRANULE * REPLAY_GRANULE;
}

/* The timed pass: nothing but the pool calls and the live sum. */
static void run_pass(const gp_trace *t, replay_state *s, gp_replay_result *r)
{
    if (t->num_events == 0)
        return; /* events is NULL then: NULL + 0 is undefined behaviour in C */
    const gp_trace_event *ev = t->events;
    const gp_trace_event *end = ev + t->num_events;
    gp_pool *pool = s->pool;
    gp_stream *streams = s->streams;
    void **ptrs = s->ptrs;
    uint64_t live = s->live, peak = s->peak_live;
    uint64_t rounded = s->live_rounded, peak_rounded = s->peak_live_rounded;
    for (; ev < end; ev++) {
        if (ev->kind == GP_EV_ALLOC) {
            void *p;
            int rc = gp_alloc(pool, &p, ev->size, streams[ev->stream]);
            if (rc == GP_OK) {
                ptrs[ev->slot] = p; /* NULL for size 0, which then adds nothing to live */
                live += ev->size;
                rounded += granule_round(ev->size);
                if (live > peak)
                    peak = live;
                if (rounded > peak_rounded)
                    peak_rounded = rounded;
            } else {
                r->failed_allocations++;
                note_failure(r, "allocate", rc);
            }
        } else if (ev->kind == GP_EV_FREE) {
            if (ptrs[ev->slot] != NULL) {
                int rc = gp_free(pool, ptrs[ev->slot], streams[ev->stream]);
                if (rc != GP_OK) { /* still live in the pool: free_live frees it on its own stream */
                    r->failed_frees++;
                    note_failure(r, "free", rc);
                    continue;
                }
                ptrs[ev->slot] = NULL;
                live -= ev->size;
                rounded -= granule_round(ev->size);
            }
        }
    }
    s->live = live;
    s->peak_live = peak;
    s->live_rounded = rounded;
    s->peak_live_rounded = peak_rounded;
}

/*
 * The event times of stream work (replay.h: stream_work): at_ns[i] from the first event, gap_ns[i] to
 * the next event on the same stream. A time earlier than the one before it (threads of one trace
 * whose clocks differ) counts as that one: the GPU's clock only moves forward. false: out of memory.
 */
static bool stream_work_times(const gp_trace *t, replay_state *s)
{
    size_t n = t->num_events ? t->num_events : 1;
    s->at_ns = calloc(n, sizeof *s->at_ns);
    s->gap_ns = calloc(n, sizeof *s->gap_ns);
    size_t *last = calloc(t->num_streams ? t->num_streams : 1, sizeof *last); /* per stream: index + 1 */
    if (s->at_ns == NULL || s->gap_ns == NULL || last == NULL) {
        free(last);
        return false;
    }
    uint64_t first = t->num_events ? t->events[0].time_us : 0, at = 0;
    for (size_t i = 0; i < t->num_events; i++) {
        const gp_trace_event *ev = &t->events[i];
        uint64_t us = ev->time_us > first ? ev->time_us - first : 0;
        uint64_t ns = us > UINT64_MAX / 1000u ? UINT64_MAX : us * 1000u;
        at = ns > at ? ns : at;
        s->at_ns[i] = at;
        size_t prev = last[ev->stream];
        if (prev != 0)
            s->gap_ns[prev - 1] = at - s->at_ns[prev - 1];
        last[ev->stream] = i + 1;
    }
    free(last);
    return true;
}

/* A kernel on `stream` that uses [p, p + size) for `ns` (GP_SIM_USE); a failed launch is the sim's
 * violation (a block the pool handed out that is not device memory), counted in its report. */
static void use_block(replay_state *s, gp_stream stream, const void *p, size_t size, uint64_t ns)
{
    s->kernels++;
    (void)gp_sim_launch(s->sim, stream, p, size, GP_SIM_USE, 0, ns);
}

/* One allocation event of the untimed passes: the pool call and the live sums; true when it succeeded
 * (ptrs[slot] then holds the pointer, NULL for size 0). */
static bool replay_alloc(replay_state *s, gp_replay_result *r, const gp_trace_event *ev)
{
    void *p;
    int rc = gp_alloc(s->pool, &p, ev->size, s->streams[ev->stream]);
    if (rc != GP_OK) {
        r->failed_allocations++;
        note_failure(r, "allocate", rc);
        return false;
    }
    s->ptrs[ev->slot] = p;
    s->live += ev->size;
    s->live_rounded += granule_round(ev->size);
    if (s->live > s->peak_live)
        s->peak_live = s->live;
    if (s->live_rounded > s->peak_live_rounded)
        s->peak_live_rounded = s->live_rounded;
    return true;
}

/* One free event of the untimed passes (ptrs[slot] != NULL): the pool call and the live sums. */
static void replay_free(replay_state *s, gp_replay_result *r, const gp_trace_event *ev)
{
    int rc = gp_free(s->pool, s->ptrs[ev->slot], s->streams[ev->stream]);
    if (rc != GP_OK) { /* still live in the pool: free_live frees it on its own stream */
        r->failed_frees++;
        note_failure(r, "free", rc);
        return;
    }
    s->ptrs[ev->slot] = NULL;
    s->live -= ev->size;
    s->live_rounded -= granule_round(ev->size);
}

/* What the pool's calls since `since` held the host up (the simulated clock's advance in them): added to
 * the stall and to *base, so that the trace's later events come that much later. Returns the clock. */
static uint64_t host_held(replay_state *s, gp_replay_result *r, uint64_t *base, uint64_t since)
{
    uint64_t now = gp_sim_now(s->sim);
    *base += now - since;
    r->host_stall_ns += now - since;
    return now;
}

/*
 * The pass with stream work (replay.h: stream_work): the simulated clock follows the trace's, and each
 * event's block is used on its stream until that stream's next event (times the fraction).
 * The trace's times are the host's: where the pool holds the host up in an event's call (a device or
 * event synchronize runs the simulated GPU on until the work waited for is done), the rest of the trace
 * comes that much later, as a host thread that was held up issues its next calls late; the GPU runs
 * meanwhile, and the event's own kernel starts when the call returns. Holding the trace to its first
 * times instead issues the events after a stall with the GPU's clock standing still (or, measured from
 * a later event, late by the trace's time in between): kernels queue up behind each other, and each
 * stall leaves the streams further behind their hosts for good (at 1, each kernel lasts until its
 * stream's next event, so a backlog never drains), which is not a GPU that keeps pace.
 */
static void run_pass_worked(const gp_trace *t, replay_state *s, gp_replay_result *r, double fraction)
{
    uint64_t base = gp_sim_now(s->sim);
    for (size_t i = 0; i < t->num_events; i++) {
        const gp_trace_event *ev = &t->events[i];
        uint64_t now = gp_sim_now(s->sim), due = base + s->at_ns[i];
        assert(due >= now); /* every call's hold moved base, and the trace's times never go back */
        if (due > now)
            gp_sim_advance(s->sim, due - now);
        uint64_t called = due;
        uint64_t work = (uint64_t)((double)s->gap_ns[i] * fraction);
        gp_stream stream = s->streams[ev->stream];
        if (ev->kind == GP_EV_ALLOC) {
            bool used = replay_alloc(s, r, ev) && s->ptrs[ev->slot] != NULL;
            called = host_held(s, r, &base, called); /* before its kernel: the block is the call's */
            if (used)
                use_block(s, stream, s->ptrs[ev->slot], ev->size, work);
        } else if (ev->kind == GP_EV_FREE && s->ptrs[ev->slot] != NULL) {
            if (t->slot_stream[ev->slot] == ev->stream) /* its last use, ordered before the free */
                use_block(s, stream, s->ptrs[ev->slot], ev->size, work);
            replay_free(s, r, ev);
        }
        (void)host_held(s, r, &base, called);
    }
}

/* The observed pass: the same bookkeeping, with a stats snapshot and a callback after every event. */
static void run_pass_observed(const gp_trace *t, replay_state *s, gp_replay_result *r,
                              const gp_replay_options *o, unsigned repeat)
{
    gp_stats stats;
    for (size_t i = 0; i < t->num_events; i++) {
        const gp_trace_event *ev = &t->events[i];
        if (ev->kind == GP_EV_ALLOC)
            (void)replay_alloc(s, r, ev);
        else if (ev->kind == GP_EV_FREE && s->ptrs[ev->slot] != NULL)
            replay_free(s, r, ev);
        memset(&stats, 0, sizeof stats);
        stats.size = sizeof stats;
        stats.version = GP_STATS_VERSION;
        if (gp_get_stats(s->pool, &stats) != GP_OK)
            memset(&stats, 0, sizeof stats);
        o->observe(o->opaque, repeat, (size_t)repeat * t->num_events + i, s->live, &stats);
    }
}

/* gp_check of the pool (options.check): a failure is counted, the first one's message kept. */
static void check_pool(replay_state *s, gp_replay_result *r)
{
    if (gp_check(s->pool) == GP_OK)
        return;
    if (r->check_failures++ == 0)
        snprintf(r->first_check_failure, sizeof r->first_check_failure, "%s", gp_last_error());
}

/* Frees what the pass left live, each on the stream it was allocated on. */
static void free_live(const gp_trace *t, replay_state *s, gp_replay_result *r)
{
    for (size_t slot = 0; slot < t->num_allocs; slot++) {
        if (s->ptrs[slot] == NULL)
            continue;
        int rc = gp_free(s->pool, s->ptrs[slot], s->streams[t->slot_stream[slot]]);
        if (rc != GP_OK) {
            r->failed_frees++;
            note_failure(r, "free", rc);
        }
        s->ptrs[slot] = NULL;
    }
    s->live = 0;
    s->live_rounded = 0;
}

/* Calls that take or give device memory: cudaMalloc/cudaFree, or cuMemCreate/cuMemRelease. */
#define DEVICE_ALLOC_CALLS (GP_SIM_CALL_MEM_ALLOC | GP_SIM_CALL_PHYS_CREATE)
#define DEVICE_FREE_CALLS (GP_SIM_CALL_MEM_FREE | GP_SIM_CALL_PHYS_RELEASE)

/* The last max_streams value --conf gives (later keys override earlier ones), 0 if none. */
static unsigned long conf_max_streams(const char *conf)
{
    unsigned long value = 0;
    for (const char *at = strstr(conf, "max_streams:"); at != NULL; at = strstr(at + 1, "max_streams:"))
        if (at == conf || at[-1] == ',' || at[-1] == ' ')
            value = strtoul(at + strlen("max_streams:"), NULL, 10);
    return value;
}

static uint64_t device_calls(gp_sim *sim)
{
    return gp_sim_calls(sim, DEVICE_ALLOC_CALLS | DEVICE_FREE_CALLS);
}

/*
 * The device-time model of a pass (gp_replay_calls): its virtual-memory calls at per-call costs. The
 * defaults are published figures for one 2 MiB page on an A100 (kvcached's benchmarks): cuMemCreate
 * 193 us, cuMemSetAccess 36 us, cuMemMap 1.5 us, cuMemUnmap 26 us. Each call is charged once, whatever
 * its size: a model, a lower bound for calls that cover several pages (whose cost on a GPU is not
 * published), and it leaves out cuMemRelease and, by default, the device synchronizations before
 * unmapping (counted, not costed: their cost depends on the work still queued). Of the first pass it is
 * the warm-up; of the last, what a loop that has not settled pays in every step. Measured costs come in
 * through gp_replay_options.costs (`--call-costs`).
 */
gp_call_costs gp_call_costs_published(void)
{
    gp_call_costs c = {.create_us = 193.0, .map_us = 1.5, .unmap_us = 26.0, .set_access_us = 36.0, .sync_us = 0.0};
    return c;
}

bool gp_call_costs_equal(const gp_call_costs *a, const gp_call_costs *b)
{
    return a->create_us == b->create_us && a->map_us == b->map_us && a->unmap_us == b->unmap_us &&
           a->set_access_us == b->set_access_us && a->sync_us == b->sync_us;
}

int gp_call_costs_parse(const char *text, gp_call_costs *costs, char *err, size_t errlen)
{
    static const char *const keys[] = {"create", "map", "unmap", "access", "sync"};
    gp_call_costs c = *costs;
    double *slots[] = {&c.create_us, &c.map_us, &c.unmap_us, &c.set_access_us, &c.sync_us};
    if (text == NULL || *text == '\0') {
        snprintf(err, errlen, "no costs given: expected create=US,map=US,unmap=US,access=US,sync=US (any of them)");
        return -1;
    }
    for (const char *item = text; item != NULL;) {
        const char *comma = strchr(item, ',');
        size_t len = comma ? (size_t)(comma - item) : strlen(item);
        const char *eq = memchr(item, '=', len);
        size_t klen = eq ? (size_t)(eq - item) : len;
        int k = -1;
        for (int i = 0; i < 5; i++)
            if (strlen(keys[i]) == klen && strncmp(item, keys[i], klen) == 0)
                k = i;
        if (k < 0) {
            snprintf(err, errlen, "'%.*s': not one of create, map, unmap, access, sync", (int)klen, item);
            return -1;
        }
        char value[64];
        size_t vlen = eq ? len - klen - 1 : 0;
        char *end = NULL;
        double v = 0;
        if (eq != NULL && vlen > 0 && vlen < sizeof value) {
            memcpy(value, eq + 1, vlen);
            value[vlen] = '\0';
            v = strtod(value, &end);
        }
        if (end == NULL || *end != '\0' || !(v >= 0) || v > 1e9) {
            snprintf(err, errlen, "%s: '%.*s' is not a cost in microseconds (a number from 0 to 1e9)", keys[k],
                     (int)(eq ? vlen : 0), eq ? eq + 1 : "");
            return -1;
        }
        *slots[k] = v;
        item = comma ? comma + 1 : NULL;
    }
    *costs = c;
    return 0;
}

static gp_replay_calls vmm_calls(gp_sim *sim)
{
    gp_replay_calls c = {
        .creates = gp_sim_calls(sim, GP_SIM_CALL_PHYS_CREATE),
        .releases = gp_sim_calls(sim, GP_SIM_CALL_PHYS_RELEASE),
        .maps = gp_sim_calls(sim, GP_SIM_CALL_MAP),
        .unmaps = gp_sim_calls(sim, GP_SIM_CALL_UNMAP),
        .set_access = gp_sim_calls(sim, GP_SIM_CALL_SET_ACCESS),
        .syncs = gp_sim_calls(sim, GP_SIM_CALL_DEVICE_SYNC),
        .waits = gp_sim_calls(sim, GP_SIM_CALL_EVENT_SYNC),
    };
    return c;
}

/* The calls made between two counts, and their modelled device time at `costs`. */
static gp_replay_calls calls_between(const gp_replay_calls *before, const gp_replay_calls *after,
                                     const gp_call_costs *costs)
{
    gp_replay_calls d = {
        .creates = after->creates - before->creates,
        .releases = after->releases - before->releases,
        .maps = after->maps - before->maps,
        .unmaps = after->unmaps - before->unmaps,
        .set_access = after->set_access - before->set_access,
        .syncs = after->syncs - before->syncs,
        .waits = after->waits - before->waits,
    };
    d.model_us = (double)d.creates * costs->create_us + (double)d.set_access * costs->set_access_us +
                 (double)d.maps * costs->map_us + (double)d.unmaps * costs->unmap_us +
                 (double)d.syncs * costs->sync_us;
    return d;
}

int gp_replay_run(const gp_trace *trace, const gp_replay_options *options, gp_replay_result *result,
                  char *err, size_t errlen)
{
    gp_replay_options defaults = {0};
    const gp_replay_options *o = options ? options : &defaults;
    gp_call_costs costs = o->costs != NULL ? *o->costs : gp_call_costs_published();
    gp_replay_result *r = result;
    memset(r, 0, sizeof *r);
    r->costs = costs;
    unsigned repeats = o->repeat ? o->repeat : 1;
    r->repeats = repeats;
    r->events = trace->num_events;
    r->trace_alloc_failures = trace->num_alloc_failures;

    const char *dm = o->device_memory && o->device_memory[0] ? o->device_memory
                                                             : GP_REPLAY_DEFAULT_DEVICE_MEMORY;
    const char *conf = o->conf ? o->conf : "";
    size_t cfg_len = strlen(dm) + strlen(conf) + 128;
    char *cfg = malloc(cfg_len);
    replay_state s = {0};
    double *ns = malloc(repeats * sizeof *ns);
    s.streams = calloc(trace->num_streams ? trace->num_streams : 1, sizeof *s.streams);
    s.ptrs = calloc(trace->num_allocs ? trace->num_allocs : 1, sizeof *s.ptrs);
    int ret = 0;
    double work = o->stream_work;
    if (!(work >= 0.0 && work <= 1.0)) {
        ret = fail(err, errlen, "stream work %g: expected a fraction from 0 (no work) to 1 (each stream busy "
                   "until its next event)", work);
        goto out;
    }
    r->stream_work = work;
    if (work > 0.0 && o->observe != NULL) {
        ret = fail(err, errlen, "stream work is not replayed with an observer (--plot)");
        goto out;
    }
    if (work > 0.0 && !stream_work_times(trace, &s)) {
        ret = fail(err, errlen, "%s: out of host memory", trace->path);
        goto out;
    }
    if (cfg == NULL || ns == NULL || s.streams == NULL || s.ptrs == NULL) {
        ret = fail(err, errlen, "%s: out of host memory", trace->path);
        goto out;
    }
    unsigned long asked = conf_max_streams(conf);
    if (asked != 0 && asked < trace->num_streams) {
        ret = fail(err, errlen, "the trace uses %zu streams but --conf sets max_streams:%lu; raise it or leave it out "
                   "(replay then makes room for every stream)", trace->num_streams, asked);
        goto out;
    }
    /* backend:sim unless --conf names another (sim-vmm); later keys override earlier ones. The pool
     * tracks max_streams streams (default 256): room for every stream of the trace is made, unless
     * --conf sets max_streams, which is then checked against the trace. */
    unsigned need_streams = trace->num_streams > 256 ? (unsigned)trace->num_streams : 256u;
    snprintf(cfg, cfg_len, "backend:sim,device_memory:%s,max_streams:%u,peak_composition:on%s%s", dm, need_streams,
             conf[0] ? "," : "", conf);
    int rc = gp_pool_create(&s.pool, 0, NULL, cfg);
    if (rc != GP_OK) {
        ret = fail(err, errlen, "cannot create a pool with \"%s\": %s: %s", cfg, gp_strerror(rc),
                   gp_last_error());
        s.pool = NULL;
        goto out;
    }
    s.sim = gp_sim_of(s.pool);
    if (s.sim == NULL) {
        ret = fail(err, errlen, "replay runs on a simulated GPU: backend sim or sim-vmm, not the one in \"%s\"", cfg);
        goto out;
    }
    for (size_t i = 0; i < trace->num_streams; i++)
        s.streams[i] = trace->streams[i] == 0 ? NULL : gp_sim_stream_create(s.sim);
    if (o->snapshot != NULL) {
        size_t entries = o->history_entries ? o->history_entries : 4 * trace->num_events + 4096;
        rc = gp_history_record(s.pool, entries);
        if (rc != GP_OK) {
            ret = fail(err, errlen, "--snapshot: %s", gp_last_error());
            goto out;
        }
    }

    for (unsigned rep = 0; rep < repeats; rep++) {
        gp_replay_calls vmm_before = vmm_calls(s.sim);
        uint64_t calls_before_pass = device_calls(s.sim);
        if (o->observe) {
            uint64_t t0 = now_ns();
            run_pass_observed(trace, &s, r, o, rep);
            ns[rep] = (double)(now_ns() - t0);
        } else if (work > 0.0) {
            uint64_t t0 = now_ns();
            run_pass_worked(trace, &s, r, work);
            ns[rep] = (double)(now_ns() - t0);
        } else {
            uint64_t t0 = now_ns();
            run_pass(trace, &s, r);
            ns[rep] = (double)(now_ns() - t0);
        }
        ns[rep] = trace->num_events ? ns[rep] / (double)trace->num_events : 0.0;
        if (o->snapshot != NULL && rep + 1 == repeats) {
            gp_pool *pools[1] = {s.pool};
            rc = gp_snapshot_write(pools, 1, o->snapshot, o->snapshot_flags);
            if (rc != GP_OK) {
                ret = fail(err, errlen, "--snapshot: %s", gp_last_error());
                free_live(trace, &s, r);
                goto out;
            }
        }
        if (o->check)
            check_pool(&s, r);
        free_live(trace, &s, r);
        gp_sim_synchronize(s.sim);
        if (o->check)
            check_pool(&s, r);
        gp_replay_calls vmm_after = vmm_calls(s.sim);
        r->last = calls_between(&vmm_before, &vmm_after, &costs);
        uint64_t calls = device_calls(s.sim) - calls_before_pass;
        uint64_t maps = r->last.maps + r->last.unmaps;
        if (rep == 0) {
            gp_stats first = {.size = sizeof first, .version = GP_STATS_VERSION};
            if (gp_get_stats(s.pool, &first) == GP_OK)
                r->allocations_per_pass = first.num_allocs;
            r->device_calls_first_repeat = calls;
            r->map_calls_first_repeat = maps;
            r->first = r->last;
        }
        r->device_calls_last_repeat = calls;
        r->map_calls_last_repeat = maps;
        if (calls + maps > 0)
            r->quiet_from_pass = 0;
        else if (r->quiet_from_pass == 0)
            r->quiet_from_pass = rep + 1;
    }

    gp_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.size = sizeof stats;
    stats.version = GP_STATS_VERSION;
    rc = gp_get_stats(s.pool, &stats);
    if (rc != GP_OK) {
        ret = fail(err, errlen, "gp_get_stats: %s: %s", gp_strerror(rc), gp_last_error());
        goto out;
    }
    r->peak = (gp_peak_composition){.size = sizeof r->peak, .version = GP_PEAK_COMPOSITION_VERSION};
    rc = gp_get_peak_composition(s.pool, &r->peak);
    if (rc != GP_OK) {
        ret = fail(err, errlen, "gp_get_peak_composition: %s: %s", gp_strerror(rc), gp_last_error());
        goto out;
    }
    size_t needed = 0;
    if (gp_stats_json(s.pool, r->stats_json, sizeof r->stats_json, &needed) != GP_OK ||
        needed >= sizeof r->stats_json)
        snprintf(r->stats_json, sizeof r->stats_json, "null");
    gp_sim_report report;
    gp_sim_get_report(s.sim, &report);
    r->kernels = s.kernels;
    r->races = report.races;
    r->bad_calls = report.bad_calls;
    r->deepest_queue = report.deepest_queue;
    snprintf(r->first_violation, sizeof r->first_violation, "%s", gp_sim_first_violation(s.sim));

    r->allocated_bytes_end = stats.allocated_bytes;
    r->peak_live_bytes = s.peak_live;
    r->peak_live_rounded_bytes = s.peak_live_rounded;
    r->page_floor_bytes = (s.peak_live_rounded + REPLAY_PAGE - 1) / REPLAY_PAGE * REPLAY_PAGE;
    r->peak_reserved_bytes = stats.reserved_bytes_peak;
    r->peak_allocated_bytes = stats.allocated_bytes_peak;
    r->sim_peak_bytes = report.allocated_peak;
    r->segments_end = stats.segments;
    r->reserved_over_live = s.peak_live ? (double)stats.reserved_bytes_peak / (double)s.peak_live : 0.0;
    r->device_alloc_calls = gp_sim_calls(s.sim, DEVICE_ALLOC_CALLS);
    r->device_free_calls = gp_sim_calls(s.sim, DEVICE_FREE_CALLS);
    r->map_calls = gp_sim_calls(s.sim, GP_SIM_CALL_MAP);
    r->unmap_calls = gp_sim_calls(s.sim, GP_SIM_CALL_UNMAP);

    r->host_ns_per_event_first = ns[0];
    qsort(ns, repeats, sizeof *ns, compare_double);
    r->host_ns_per_event_min = ns[0];
    r->host_ns_per_event_max = ns[repeats - 1];
    r->host_ns_per_event = repeats % 2 ? ns[repeats / 2] : (ns[repeats / 2 - 1] + ns[repeats / 2]) / 2.0;

out:
    if (s.pool != NULL) {
        gp_leak_report leaks;
        gp_pool_destroy(s.pool, &leaks);
    }
    free(cfg);
    free(ns);
    free(s.streams);
    free(s.ptrs);
    free(s.at_ns);
    free(s.gap_ns);
    return ret;
}
