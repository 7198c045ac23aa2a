/*
 * plan_synth.c — a size law per allocation, and the trace at a scale nobody traced.
 *
 * One trace (the template: the given scale nearest the one asked, so that its kernels' choices are the
 * likeliest) gives the order of events; every other trace is aligned with it (plan_align.c), so each
 * template allocation has its size at every scale where it was matched. From those points each
 * allocation gets the simplest law that reproduces all of them to within 512 B (the allocators'
 * rounding unit), tried in order of how many numbers they take from the data:
 *   constant        the same size everywhere (parameters, optimizer state, fixed buffers);
 *   c * s^k, k=1,2  proportional to the scale or to its square (activations; a sequence length's
 *                   attention scores): a tensor's size is a product of dimensions, and the scale is one
 *                   or two of them;
 *   a + b s         anything else growing with the scale (workspaces a kernel sizes for itself);
 *   a + b s + c s^2 with three or more scales, when the straight line misses one of them; when c < 0
 *                   the size grows ever slower (a workspace reaching the cap its kernel sets), which no
 *                   tensor shape does: between the traced scales the curve is used, outside them the
 *                   size at the nearest traced scale is kept (the cap is taken as reached).
 * An allocation matched in no other trace keeps the size it has in the template. The synthesised trace
 * is the template's events with each size taken from its law at the scale asked: "the allocation
 * sequence is the same; sizes that grow with the scale grow".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define SIZE_SLACK 512.0
#define MAX_POINTS 64

const char *gp_size_law_name(int law)
{
    static const char *const names[GP_LAW_COUNT] = {"constant", "proportional", "linear", "quadratic",
                                                    "saturating", "unmatched"};
    return law >= 0 && law < GP_LAW_COUNT ? names[law] : "?";
}

static double model_value(const gp_size_model *m, double s)
{
    switch (m->law) {
    case GP_LAW_POWER:
        return m->c0 * pow(s, m->power);
    case GP_LAW_LINEAR:
        return m->c0 + m->c1 * s;
    case GP_LAW_QUADRATIC:
        return m->c0 + m->c1 * s + m->c2 * s * s;
    case GP_LAW_SATURATING:
        s = s < m->lo ? m->lo : s > m->hi ? m->hi : s;
        return m->c0 + m->c1 * s + m->c2 * s * s;
    default:
        return m->c0;
    }
}

uint64_t gp_size_model_eval(const gp_size_model *model, double scale)
{
    double v = model_value(model, scale);
    if (!(v > 0))
        return 0;
    if (v >= 1.8e19)
        return UINT64_MAX;
    return (uint64_t)llround(v);
}

static int reproduces(const gp_size_model *m, const double *x, const double *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fabs(model_value(m, x[i]) - y[i]) > SIZE_SLACK)
            return 0;
    return 1;
}

/* The law of one allocation from its n points; x[0], y[0] is the template's. */
static gp_size_model fit_law(const double *x, const double *y, size_t n)
{
    gp_size_model m = {.c0 = y[0], .law = GP_LAW_UNMATCHED};
    if (n < 2)
        return m;
    m.law = GP_LAW_CONSTANT;
    int all_equal = 1;
    for (size_t i = 1; i < n; i++)
        all_equal &= y[i] == y[0];
    if (all_equal)
        return m;
    if (y[0] > 0) {
        for (int k = 1; k <= 2; k++) {
            gp_size_model p = {.c0 = y[0] / pow(x[0], k), .law = GP_LAW_POWER, .power = (uint8_t)k};
            if (reproduces(&p, x, y, n))
                return p;
        }
    }
    gp_scale_fit fit;
    char err[128];
    if (gp_fit_scale(x, y, n, 2, &fit, err, sizeof err) == 0) {
        gp_size_model l = {.c0 = fit.fixed, .c1 = fit.linear, .law = GP_LAW_LINEAR};
        if (n == 2 || reproduces(&l, x, y, n))
            return l;
        if (gp_fit_scale(x, y, n, 3, &fit, err, sizeof err) == 0) {
            gp_size_model q = {.c0 = fit.fixed, .c1 = fit.linear, .c2 = fit.quadratic, .law = GP_LAW_QUADRATIC};
            if (q.c2 < 0) {
                q.law = GP_LAW_SATURATING;
                q.lo = q.hi = x[0];
                for (size_t i = 1; i < n; i++) {
                    q.lo = x[i] < q.lo ? x[i] : q.lo;
                    q.hi = x[i] > q.hi ? x[i] : q.hi;
                }
            }
            return q;
        }
        return l;
    }
    return (gp_size_model){.c0 = y[0], .law = GP_LAW_UNMATCHED};
}

void gp_synth_free(gp_synth *synth)
{
    free(synth->models);
    free(synth->unmatched_of);
    memset(synth, 0, sizeof *synth);
}

int gp_synth_build(gp_synth *synth, const gp_trace *const *traces, const double *scales, size_t n,
                   size_t templ, char *err, size_t errlen)
{
    memset(synth, 0, sizeof *synth);
    if (n < 1 || n > MAX_POINTS || templ >= n) {
        snprintf(err, errlen, "between 1 and %d traces, not %zu", MAX_POINTS, n);
        return -1;
    }
    const gp_trace *t = traces[templ];
    synth->templ = t;
    synth->templ_scale = scales[templ];
    synth->templ_index = templ;
    synth->num_models = t->num_allocs;
    synth->models = calloc(t->num_allocs ? t->num_allocs : 1, sizeof *synth->models);
    synth->unmatched_of = calloc(n, sizeof *synth->unmatched_of);
    gp_alignment *al = calloc(n, sizeof *al);
    if (synth->models == NULL || synth->unmatched_of == NULL || al == NULL) {
        free(al);
        gp_synth_free(synth);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    int rc = 0;
    for (size_t j = 0; j < n && rc == 0; j++) {
        if (j == templ)
            continue;
        rc = gp_align(t, scales[templ], traces[j], scales[j], &al[j], err, errlen);
        if (rc == 0) {
            synth->unmatched_of[j] = al[j].unmatched_b;
            synth->unmatched_of[templ] += al[j].unmatched_a;
            synth->unmatched_events += al[j].unmatched_a + al[j].unmatched_b;
        } else {
            /* the caller names the trace: put its path first */
            char inner[768];
            snprintf(inner, sizeof inner, "%s", err);
            snprintf(err, errlen, "%s %s", traces[j]->path, inner);
        }
    }
    for (size_t slot = 0; slot < t->num_allocs && rc == 0; slot++) {
        double x[MAX_POINTS], y[MAX_POINTS];
        size_t k = 0;
        x[k] = scales[templ];
        y[k++] = (double)t->slot_size[slot];
        for (size_t j = 0; j < n; j++) {
            if (j == templ || al[j].b_of_a[slot] == GP_ALIGN_NONE)
                continue;
            x[k] = scales[j];
            y[k++] = (double)traces[j]->slot_size[al[j].b_of_a[slot]];
        }
        synth->models[slot] = fit_law(x, y, k);
        synth->laws[synth->models[slot].law]++;
    }
    for (size_t j = 0; j < n; j++)
        gp_alignment_free(&al[j]);
    free(al);
    if (rc != 0)
        gp_synth_free(synth);
    return rc;
}

int gp_synth_trace(const gp_synth *synth, double scale, gp_trace *out, size_t *negative, char *err,
                   size_t errlen)
{
    const gp_trace *t = synth->templ;
    memset(out, 0, sizeof *out);
    size_t slots = t->num_allocs ? t->num_allocs : 1;
    char name[512];
    snprintf(name, sizeof name, "%s synthesised at scale %g", t->path, scale);
    out->path = strdup(name);
    out->events = malloc((t->num_events ? t->num_events : 1) * sizeof *out->events);
    out->streams = malloc((t->num_streams ? t->num_streams : 1) * sizeof *out->streams);
    out->slot_stream = malloc(slots * sizeof *out->slot_stream);
    out->slot_size = malloc(slots * sizeof *out->slot_size);
    if (out->path == NULL || out->events == NULL || out->streams == NULL || out->slot_stream == NULL ||
        out->slot_size == NULL) {
        gp_trace_free(out);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    /* a law that would go below zero here has left the range where it holds (a workspace that shrank
     * between two scales, extrapolated): the allocation keeps its template size, and is counted */
    size_t below = 0;
    for (size_t s = 0; s < t->num_allocs; s++) {
        if (model_value(&synth->models[s], scale) < 0) {
            below++;
            out->slot_size[s] = t->slot_size[s];
        } else {
            out->slot_size[s] = gp_size_model_eval(&synth->models[s], scale);
        }
    }
    memcpy(out->slot_stream, t->slot_stream, t->num_allocs * sizeof *out->slot_stream);
    memcpy(out->streams, t->streams, t->num_streams * sizeof *out->streams);
    out->num_events = t->num_events;
    out->num_allocs = t->num_allocs;
    out->num_frees = t->num_frees;
    out->num_alloc_failures = t->num_alloc_failures;
    out->num_lines = t->num_lines;
    out->num_streams = t->num_streams;
    out->num_threads = t->num_threads;
    uint64_t live = 0;
    for (size_t e = 0; e < t->num_events; e++) {
        gp_trace_event ev = t->events[e];
        if (ev.kind == GP_EV_ALLOC || ev.kind == GP_EV_FREE)
            ev.size = out->slot_size[ev.slot];
        if (ev.kind == GP_EV_ALLOC) {
            live += ev.size;
            if (live > out->peak_live_bytes)
                out->peak_live_bytes = live;
        } else if (ev.kind == GP_EV_FREE) {
            live -= ev.size;
        }
        out->events[e] = ev;
    }
    out->end_live_bytes = live;
    if (negative != NULL)
        *negative = below;
    return 0;
}
