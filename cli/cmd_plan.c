/*
 * cmd_plan.c — `gpupool plan`: the command line of plan.h's pieces.
 *
 *   gpupool plan [--json] --trace SCALE=TRACE ... [--at SCALE] [--gpu-memory SIZE] [--leave-one-out]
 *                [--svg FILE.svg]
 *       traces of one model at several scales: the fit of peak live bytes, the alignment, the trace
 *       synthesised at --at replayed through gpupool and PyTorch, the largest scale fitting --gpu-memory,
 *       what the memory is made of at each scale; one trace alone gives its composition.
 *   gpupool plan [--json] --gpu-memory SIZE [--margin PCT] --model NAME=TRACE ...     (plan_models.c)
 *   gpupool plan --params N ... (a description; plan_estimate.c)
 *
 * Every bad input is refused before anything runs, with a message naming the option and why.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/config.h"
#include "base/format.h"
#include "json_text.h"
#include "plan.h"

/* How far from the traced scales a prediction is trusted: kernels choose their algorithms by size, and
 * beyond this factor none of their choices has been seen. Stated in --help. */
#define GP_PLAN_EXTRAPOLATION 16.0
#define MAX_TRACES 64
#define MAX_SCALE 1e9

static const char plan_usage[] =
    "usage: gpupool plan [--json] --trace SCALE=TRACE [--trace SCALE=TRACE ...] [--at SCALE]\n"
    "                    [--gpu-memory SIZE] [--leave-one-out] [--svg FILE.svg] [--laws FILE.csv]\n"
    "       gpupool plan [--json] --gpu-memory SIZE [--margin PCT] --model NAME=TRACE [--model ...]\n"
    "       gpupool plan [--json] --params N [--dtype D] [--optimizer O] [--training|--inference] ...\n"
    "                    (`gpupool plan --describe-help` lists the description's options)\n"
    "\n"
    "How much device memory a model needs, from allocation traces (RMM CSV) of it at several scales\n"
    "(batch size or sequence length, a positive integer):\n"
    "  --trace SCALE=TRACE   a trace of the model at SCALE; give two or more to predict\n"
    "  --at SCALE            predict at SCALE: the peak live bytes fitted as fixed + linear (+ quadratic\n"
    "                        with three or more traces), and the trace synthesised at SCALE (same\n"
    "                        allocations, sizes following each allocation's own law) replayed through\n"
    "                        gpupool (backends sim and sim-vmm) and PyTorch's caching allocator policy;\n"
    "                        within 1/16 of the smallest and 16 times the largest traced scale\n"
    "  --gpu-memory SIZE     also the largest scale whose peak reserved fits SIZE (with a unit: 80GiB)\n"
    "  --leave-one-out       predict each given trace from the others and print the errors\n"
    "  --svg FILE.svg        draw what the memory is made of at each scale as stacked bars\n"
    "  --laws FILE.csv       write each allocation's size law (slot, law, coefficients, sizes)\n"
    "  --json                one JSON object on stdout\n"
    "With one trace and no --at: what its peak is made of (parameters and buffers, state from the first\n"
    "step on, per-step activations and gradients, temporaries).\n"
    "\n"
    "Several models on one GPU: --model NAME=TRACE ... with --gpu-memory replays them together through\n"
    "one pool, one tenant each, and suggests max and min budgets with a --margin (default 10%).\n";

typedef struct given {
    const char *spec;
    double scale;
    const char *path;
    gp_trace trace;
    int loaded;
} given;

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* A scale: a positive integer (batch size, sequence length). */
static int parse_scale(const char *text, double *out)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return 0;
    char *end;
    double v = strtod(text, &end);
    if (*end != '\0' || !(v >= 1) || v > MAX_SCALE || v != floor(v))
        return 0;
    *out = v;
    return 1;
}

int gp_plan_parse_size_with_unit(const char *option, const char *text, uint64_t *out, char *err, size_t errlen)
{
    size_t n = strlen(text);
    size_t bytes = 0;
    if (n == 0 || !isalpha((unsigned char)text[n - 1])) {
        snprintf(err, errlen, "%s %s: give a unit (for example 80GiB, 512MiB or 4096B)", option, text);
        return -1;
    }
    if (!gp_parse_size(text, &bytes) || bytes == 0) {
        snprintf(err, errlen, "%s %s: not a size (a number above 0 with B, KiB, MiB, GiB or TiB)", option, text);
        return -1;
    }
    *out = bytes;
    return 0;
}

static double rel_error(double predicted, double measured)
{
    return measured != 0 ? (predicted - measured) / measured : 0.0;
}

/* Index of the given scale nearest `scale` on a log axis, skipping `skip`. */
static size_t nearest(const given *g, size_t n, double scale, size_t skip)
{
    size_t best = n;
    double best_d = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == skip)
            continue;
        double d = fabs(log(g[i].scale / scale));
        if (best == n || d < best_d) {
            best = i;
            best_d = d;
        }
    }
    return best;
}

static int build_synth(const given *g, size_t n, size_t skip, double at, gp_synth *synth, char *err, size_t errlen)
{
    const gp_trace *traces[MAX_TRACES] = {0};
    double scales[MAX_TRACES] = {0};
    size_t k = 0, templ = 0, want = nearest(g, n, at, skip);
    for (size_t i = 0; i < n; i++) {
        if (i == skip)
            continue;
        if (i == want)
            templ = k;
        traces[k] = &g[i].trace;
        scales[k++] = g[i].scale;
    }
    if (gp_synth_build(synth, traces, scales, k, templ, err, errlen) != 0) {
        /* name the trace by its --trace spec */
        char inner[900];
        snprintf(inner, sizeof inner, "%s", err);
        const char *with = "does not align with ";
        for (size_t i = 0; i < n; i++)
            if (i != skip && strncmp(inner, g[i].path, strlen(g[i].path)) == 0 &&
                inner[strlen(g[i].path)] == ' ') {
                const char *rest = inner + strlen(g[i].path) + 1;
                size_t tp = strlen(g[want].path), wl = strlen(with);
                if (strncmp(rest, with, wl) == 0 && strncmp(rest + wl, g[want].path, tp) == 0)
                    snprintf(err, errlen, "--trace %s: %s--trace %s%s", g[i].spec, with, g[want].spec, rest + wl + tp);
                else
                    snprintf(err, errlen, "--trace %s: %s", g[i].spec, rest);
                return -1;
            }
        snprintf(err, errlen, "%s", inner);
        return -1;
    }
    return 0;
}

static void print_size_cell(uint64_t bytes)
{
    char a[GP_SIZE_TEXT_MAX];
    printf(" %12s", gp_format_size(bytes, a));
}

static void json_prediction(const gp_plan_prediction *p)
{
    printf("{\"scale\":%.0f,\"peak_live_bytes\":%llu,\"peak_reserved_bytes\":{\"cuda\":%llu,\"vmm\":%llu,"
           "\"pytorch\":%llu,\"pytorch_expandable\":%llu}}",
           p->scale, (unsigned long long)p->peak_live_bytes, (unsigned long long)p->reserved_cuda,
           (unsigned long long)p->reserved_vmm, (unsigned long long)p->reserved_pytorch,
           (unsigned long long)p->reserved_pytorch_expandable);
}

/* --leave-one-out: each trace predicted from the others. */
static int leave_one_out(const given *g, size_t n, int json, double *worst)
{
    char err[1024];
    *worst = 0;
    if (json)
        printf(",\"leave_one_out\":[");
    else
        printf("\nleave one out: each scale predicted from the others (error = predicted / measured - 1)\n"
               "%8s %-10s %12s %12s %12s %12s %9s %9s %9s %9s\n", "scale", "from", "live", "cuda", "vmm",
               "pytorch", "live", "cuda", "vmm", "pytorch");
    for (size_t i = 0; i < n; i++) {
        gp_synth synth;
        if (build_synth(g, n, i, g[i].scale, &synth, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: %s\n", err);
            return 1;
        }
        gp_plan_prediction p, m;
        if (gp_plan_predict(&synth, g[i].scale, &p, err, sizeof err) != 0 ||
            gp_plan_measure(&g[i].trace, g[i].scale, &m, err, sizeof err) != 0) {
            gp_synth_free(&synth);
            fprintf(stderr, "gpupool plan: %s\n", err);
            return 1;
        }
        double e[4] = {rel_error((double)p.peak_live_bytes, (double)m.peak_live_bytes),
                       rel_error((double)p.reserved_cuda, (double)m.reserved_cuda),
                       rel_error((double)p.reserved_vmm, (double)m.reserved_vmm),
                       rel_error((double)p.reserved_pytorch, (double)m.reserved_pytorch)};
        for (int k = 0; k < 3; k++) /* the target: peak live and gpupool's two backends */
            if (fabs(e[k]) > *worst)
                *worst = fabs(e[k]);
        char from[64] = "";
        for (size_t j = 0, len = 0; j < n; j++)
            if (j != i)
                len += (size_t)snprintf(from + len, sizeof from - len, "%s%.0f", len ? "," : "", g[j].scale);
        if (json) {
            printf("%s{\"scale\":%.0f,\"path\":", i ? "," : "", g[i].scale);
            gp_json_string(stdout, g[i].path);
            printf(",\"unmatched_events\":%zu,\"predicted\":", synth.unmatched_events);
            json_prediction(&p);
            printf(",\"measured\":");
            json_prediction(&m);
            printf(",\"error\":{\"peak_live\":%.6f,\"cuda\":%.6f,\"vmm\":%.6f,\"pytorch\":%.6f}}", e[0], e[1], e[2], e[3]);
        } else {
            printf("%8.0f %-10s", g[i].scale, from);
            print_size_cell(p.peak_live_bytes);
            print_size_cell(p.reserved_cuda);
            print_size_cell(p.reserved_vmm);
            print_size_cell(p.reserved_pytorch);
            printf(" %+8.2f%% %+8.2f%% %+8.2f%% %+8.2f%%   predicted\n", 100 * e[0], 100 * e[1], 100 * e[2], 100 * e[3]);
            printf("%8s %-10s", "", "measured");
            print_size_cell(m.peak_live_bytes);
            print_size_cell(m.reserved_cuda);
            print_size_cell(m.reserved_vmm);
            print_size_cell(m.reserved_pytorch);
            printf("\n");
        }
        gp_synth_free(&synth);
    }
    if (json)
        printf("],\"leave_one_out_max_error\":%.6f", *worst);
    else
        printf("largest error on peak live and gpupool's peak reserved: %.2f%%\n", 100 * *worst);
    return 0;
}

/* --laws: one line per template allocation. */
static int write_laws(const char *path, const gp_synth *synth, int have_at, double at, char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errlen, "--laws %s: cannot write it", path);
        return -1;
    }
    fprintf(f, "slot,law,power,c0,c1,c2,size_at_%.0f%s\n", synth->templ_scale, have_at ? ",size_at_at" : "");
    for (size_t i = 0; i < synth->num_models; i++) {
        const gp_size_model *m = &synth->models[i];
        fprintf(f, "%zu,%s,%u,%.6g,%.6g,%.6g,%llu", i, gp_size_law_name(m->law), m->power, m->c0, m->c1, m->c2,
                (unsigned long long)synth->templ->slot_size[i]);
        if (have_at)
            fprintf(f, ",%llu", (unsigned long long)gp_size_model_eval(m, at));
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        snprintf(err, errlen, "--laws %s: write failed", path);
        return -1;
    }
    return 0;
}

static const char *const keys[GP_PARTS] = {"resident_before_first_step", "resident_from_first_step", "per_step",
                                           "temporaries"};

/* How one part of the composition scales: fixed + linear over the given traces (n >= 2). */
static int part_fit(const given *g, const gp_composition *comp, size_t n, int part, gp_scale_fit *fit)
{
    double x[MAX_TRACES], y[MAX_TRACES];
    char err[128];
    if (n < 2)
        return 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = g[i].scale;
        y[i] = (double)comp[i].part_bytes[part];
    }
    return gp_fit_scale(x, y, n, 2, fit, err, sizeof err) == 0;
}

static int plan_traces(given *g, size_t n, int have_at, double at, uint64_t gpu_memory, int loo,
                       const char *svg, const char *laws, int json)
{
    char err[1024];
    double lo = g[0].scale, hi = g[0].scale;
    for (size_t i = 0; i < n; i++) {
        lo = g[i].scale < lo ? g[i].scale : lo;
        hi = g[i].scale > hi ? g[i].scale : hi;
    }
    double range_lo = lo / GP_PLAN_EXTRAPOLATION, range_hi = hi * GP_PLAN_EXTRAPOLATION;
    if (have_at && (at < range_lo || at > range_hi)) {
        fprintf(stderr, "gpupool plan: --at %.0f: outside the range the traces support (%g to %g: 1/%.0f of the "
                "smallest to %.0f times the largest traced scale)\n", at, range_lo < 1 ? 1 : range_lo, range_hi,
                GP_PLAN_EXTRAPOLATION, GP_PLAN_EXTRAPOLATION);
        return 2;
    }
    if (n < 2 && (have_at || gpu_memory || loo)) {
        fprintf(stderr, "gpupool plan: %s needs traces at two or more scales (--trace SCALE=TRACE twice)\n",
                have_at ? "--at" : gpu_memory ? "--gpu-memory" : "--leave-one-out");
        return 2;
    }
    if (loo && n < 3) {
        fprintf(stderr, "gpupool plan: --leave-one-out needs three or more traces (it predicts each from two others)\n");
        return 2;
    }
    /* composition of every given trace */
    gp_composition comp[MAX_TRACES + 1];
    for (size_t i = 0; i < n; i++)
        if (gp_compose(&g[i].trace, &comp[i], err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: %s\n", err);
            return 1;
        }
    /* the fit of peak live bytes */
    double xs[MAX_TRACES], ys[MAX_TRACES];
    for (size_t i = 0; i < n; i++) {
        xs[i] = g[i].scale;
        ys[i] = (double)g[i].trace.peak_live_bytes;
    }
    gp_scale_fit fit = {0};
    int have_fit = n >= 2 && gp_fit_scale(xs, ys, n, n >= 3 ? 3 : 2, &fit, err, sizeof err) == 0;
    /* the synthesis: template nearest --at (or the largest scale for a capacity search alone) */
    gp_synth synth = {0};
    int have_synth = 0;
    double target = have_at ? at : hi;
    if (n >= 2) {
        if (build_synth(g, n, n, target, &synth, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: %s\n", err);
            return 2;
        }
        have_synth = 1;
        if (laws != NULL && write_laws(laws, &synth, have_at, at, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: %s\n", err);
            gp_synth_free(&synth);
            return 1;
        }
    }
    int status = 0;
    gp_plan_prediction pred = {0};
    if (have_at) {
        if (gp_plan_predict(&synth, at, &pred, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: %s\n", err);
            gp_synth_free(&synth);
            return 1;
        }
        if (pred.negative_sizes > 0 && !json)
            fprintf(stderr, "gpupool plan: --at %.0f: %zu allocation%s would shrink below zero there by their fitted "
                    "law; kept at the template's size\n", at, pred.negative_sizes, pred.negative_sizes == 1 ? "" : "s");
        gp_trace st;
        if (gp_synth_trace(&synth, at, &st, NULL, err, sizeof err) == 0) {
            gp_compose(&st, &comp[n], err, sizeof err);
            gp_trace_free(&st);
        }
    }
    double largest[GP_PLAN_ALLOCATORS] = {0};
    if (gpu_memory) {
        for (int a = 0; a < GP_PLAN_ALLOCATORS; a++)
            if (gp_plan_largest_fit(&synth, a, gpu_memory, floor(range_hi), &largest[a], err, sizeof err) != 0) {
                fprintf(stderr, "gpupool plan: %s\n", err);
                gp_synth_free(&synth);
                return 1;
            }
    }
    /* ---- output ---- */
    if (json) {
        printf("{\"traces\":[");
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"scale\":%.0f,\"path\":", i ? "," : "", g[i].scale);
            gp_json_string(stdout, g[i].path);
            printf(",\"allocations\":%zu,\"peak_live_bytes\":%llu,\"unmatched\":%zu,\"composition\":{", g[i].trace.num_allocs,
                   (unsigned long long)g[i].trace.peak_live_bytes, have_synth ? synth.unmatched_of[i] : 0);
            for (int p = 0; p < GP_PARTS; p++)
                printf("%s\"%s\":%llu", p ? "," : "", keys[p], (unsigned long long)comp[i].part_bytes[p]);
            printf("}}");
        }
        printf("]");
        if (n >= 2) {
            printf(",\"composition_fit\":{");
            for (int p = 0; p < GP_PARTS; p++) {
                gp_scale_fit pf = {0};
                part_fit(g, comp, n, p, &pf);
                printf("%s\"%s\":{\"fixed_bytes\":%.0f,\"bytes_per_unit\":%.1f}", p ? "," : "", keys[p], pf.fixed,
                       pf.linear);
            }
            printf("}");
        }
        if (have_at) {
            printf(",\"predicted_composition\":{");
            for (int p = 0; p < GP_PARTS; p++)
                printf("%s\"%s\":%llu", p ? "," : "", keys[p], (unsigned long long)comp[n].part_bytes[p]);
            printf("}");
        }
        if (have_synth) {
            printf(",\"alignment\":{\"template_scale\":%.0f,\"unmatched_events\":%zu,\"laws\":{", synth.templ_scale,
                   synth.unmatched_events);
            for (int l = 0; l < GP_LAW_COUNT; l++)
                printf("%s\"%s\":%zu", l ? "," : "", gp_size_law_name(l), synth.laws[l]);
            printf("}}");
        }
        if (have_fit)
            printf(",\"fit\":{\"terms\":%d,\"fixed_bytes\":%.1f,\"bytes_per_unit\":%.3f,\"bytes_per_unit_squared\":%.5f,"
                   "\"max_rel_error\":%.6f,\"leave_one_out_max_rel_error\":%.6f}",
                   fit.terms, fit.fixed, fit.linear, fit.quadratic, fit.max_rel_error, fit.loo_max_rel_error);
        if (have_at) {
            printf(",\"prediction\":");
            json_prediction(&pred);
            printf(",\"fit_peak_live_bytes\":%.0f,\"allocations_kept_at_template_size\":%zu", gp_fit_eval(&fit, at),
                   pred.negative_sizes);
        }
        if (gpu_memory)
            printf(",\"largest_fitting_scale\":{\"gpu_memory\":%llu,\"cuda\":%.0f,\"vmm\":%.0f,\"pytorch\":%.0f,"
                   "\"search_limit\":%.0f}",
                   (unsigned long long)gpu_memory, largest[0], largest[1], largest[2], floor(range_hi));
    } else {
        printf("%8s %9s %12s %10s  %s\n", "scale", "allocs", "peak live", "unmatched", "trace");
        for (size_t i = 0; i < n; i++) {
            char a[GP_SIZE_TEXT_MAX];
            printf("%8.0f %9zu %12s %10zu  %s\n", g[i].scale, g[i].trace.num_allocs,
                   gp_format_size(g[i].trace.peak_live_bytes, a), have_synth ? synth.unmatched_of[i] : 0, g[i].path);
        }
        if (have_synth) {
            printf("alignment: template scale %.0f; %zu allocations without a partner in another trace\n", synth.templ_scale,
                   synth.unmatched_events);
            printf("size laws:");
            for (int l = 0; l < GP_LAW_COUNT; l++)
                printf(" %s %zu%s", gp_size_law_name(l), synth.laws[l], l + 1 < GP_LAW_COUNT ? "," : "\n");
        }
        if (have_fit) {
            char a[GP_SIZE_TEXT_MAX];
            printf("fit: peak live = %s + %.0f B * scale", gp_format_size(fit.fixed > 0 ? (size_t)fit.fixed : 0, a), fit.linear);
            if (fit.terms == 3)
                printf(" + %.1f B * scale^2", fit.quadratic);
            printf("; largest error on the traces %.2f%%", 100 * fit.max_rel_error);
            if (fit.loo_max_rel_error >= 0)
                printf(", leaving one out %.2f%%", 100 * fit.loo_max_rel_error);
            printf("\n");
        }
        if (have_at) {
            char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
            printf("\nprediction at scale %.0f (trace synthesised from scale %.0f's and replayed)\n", at, synth.templ_scale);
            printf("  peak live                 %s (the fit says %s)\n", gp_format_size(pred.peak_live_bytes, a),
                   gp_format_size((size_t)fmax(0, gp_fit_eval(&fit, at)), b));
            printf("  peak reserved, gpupool    %s (cudaMalloc segments), ", gp_format_size(pred.reserved_cuda, a));
            printf("%s (virtual memory)\n", gp_format_size(pred.reserved_vmm, b));
            printf("  peak reserved, PyTorch    %s (default), ", gp_format_size(pred.reserved_pytorch, a));
            printf("%s (expandable segments)\n", gp_format_size(pred.reserved_pytorch_expandable, b));
        }
        if (gpu_memory) {
            char a[GP_SIZE_TEXT_MAX];
            printf("\nlargest scale fitting %s:", gp_format_size(gpu_memory, a));
            for (int k = 0; k < GP_PLAN_ALLOCATORS; k++) {
                if (largest[k] >= floor(range_hi))
                    printf(" %s %.0f or more (the search stops at %.0f)%s", gp_plan_allocator_name(k), largest[k],
                           floor(range_hi), k + 1 < GP_PLAN_ALLOCATORS ? "," : "\n");
                else if (largest[k] == 0)
                    printf(" %s none (scale 1 does not fit)%s", gp_plan_allocator_name(k), k + 1 < GP_PLAN_ALLOCATORS ? "," : "\n");
                else
                    printf(" %s %.0f%s", gp_plan_allocator_name(k), largest[k], k + 1 < GP_PLAN_ALLOCATORS ? "," : "\n");
            }
        }
        printf("\nwhat the memory at the peak is made of\n%-36s", "part");
        for (size_t i = 0; i < n; i++)
            printf(" %10.0f%s", g[i].scale, "  ");
        if (have_at)
            printf(" %10.0f* ", at);
        printf("%s\n", n >= 2 ? "   how it scales (fixed + per unit of scale)" : "");
        for (int p = 0; p < GP_PARTS; p++) {
            printf("%-36s", gp_part_name(p));
            for (size_t i = 0; i < n + (size_t)have_at; i++) {
                char a[GP_SIZE_TEXT_MAX];
                printf(" %12s", gp_format_size(comp[i].part_bytes[p], a));
            }
            gp_scale_fit pf;
            if (part_fit(g, comp, n, p, &pf)) {
                char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
                printf("   %s + %s", gp_format_size(pf.fixed > 0 ? (size_t)pf.fixed : 0, a),
                       gp_format_size(pf.linear > 0 ? (size_t)pf.linear : 0, b));
            }
            printf("\n");
        }
        if (have_at)
            printf("* synthesised\n");
    }
    if (loo) {
        double worst;
        status = leave_one_out(g, n, json, &worst);
    }
    if (json)
        printf("}\n");
    if (svg != NULL && status == 0) {
        const char *labels[MAX_TRACES + 1];
        char text[MAX_TRACES + 1][48];
        uint64_t parts[MAX_TRACES + 1][GP_PARTS];
        size_t cols = n + (size_t)have_at;
        for (size_t i = 0; i < cols; i++) {
            snprintf(text[i], sizeof text[i], i < n ? "scale %.0f" : "scale %.0f (predicted)", i < n ? g[i].scale : at);
            labels[i] = text[i];
            memcpy(parts[i], comp[i].part_bytes, sizeof parts[i]);
        }
        char title[256];
        snprintf(title, sizeof title, "What the peak live bytes are made of: %s", base_name(g[0].path));
        if (gp_plan_svg(svg, title, labels, (const uint64_t(*)[GP_PARTS])parts, cols, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: %s\n", err);
            status = 1;
        } else if (!json) {
            printf("chart written to %s\n", svg);
        }
    }
    if (have_synth)
        gp_synth_free(&synth);
    return status;
}

int gp_cmd_plan(int argc, char **argv)
{
    given g[MAX_TRACES];
    size_t n = 0;
    const char *models[MAX_TRACES];
    int num_models = 0;
    int json = 0, loo = 0, have_at = 0, describe = 0;
    double at = 0, margin = 0.10;
    uint64_t gpu_memory = 0;
    const char *svg = NULL, *laws = NULL;
    char err[1024];
    int status = 0;
    /* a description (--params) has options of its own: plan_estimate.c reads them all */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--params") == 0 || strncmp(argv[i], "--params=", 9) == 0 ||
            strcmp(argv[i], "--describe-help") == 0)
            describe = 1;
    if (describe)
        return gp_plan_estimate_main(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(plan_usage, stdout);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(a, "--leave-one-out") == 0) {
            loo = 1;
            continue;
        }
        static const char *const names[] = {"--trace", "--at", "--gpu-memory", "--svg", "--model", "--margin",
                                            "--laws"};
        int which = -1;
        const char *value = NULL;
        for (int k = 0; k < 7; k++) {
            size_t len = strlen(names[k]);
            if (strncmp(a, names[k], len) == 0 && (a[len] == '\0' || a[len] == '=')) {
                which = k;
                value = a[len] == '=' ? a + len + 1 : i + 1 < argc ? argv[++i] : NULL;
                break;
            }
        }
        if (which < 0) {
            fprintf(stderr, "gpupool plan: unknown option %s\n\n%s", a, plan_usage);
            return 2;
        }
        if (value == NULL) {
            fprintf(stderr, "gpupool plan: %s needs a value\n", names[which]);
            return 2;
        }
        if (which == 0) {
            const char *eq = strchr(value, '=');
            char scale_text[32];
            if (n == MAX_TRACES) {
                fprintf(stderr, "gpupool plan: --trace %s: at most %d traces\n", value, MAX_TRACES);
                return 2;
            }
            if (eq == NULL || eq == value || (size_t)(eq - value) >= sizeof scale_text || eq[1] == '\0') {
                fprintf(stderr, "gpupool plan: --trace %s: expected SCALE=TRACE (for example 16=resnet_b16.csv)\n", value);
                return 2;
            }
            memcpy(scale_text, value, (size_t)(eq - value));
            scale_text[eq - value] = '\0';
            given *t = &g[n];
            memset(t, 0, sizeof *t);
            t->spec = value;
            t->path = eq + 1;
            if (!parse_scale(scale_text, &t->scale)) {
                fprintf(stderr, "gpupool plan: --trace %s: the scale '%s' is not a whole number from 1 to %.0f\n", value,
                        scale_text, MAX_SCALE);
                return 2;
            }
            for (size_t j = 0; j < n; j++)
                if (g[j].scale == t->scale) {
                    fprintf(stderr, "gpupool plan: --trace %s: scale %.0f is given twice (also --trace %s)\n", value,
                            t->scale, g[j].spec);
                    return 2;
                }
            n++;
        } else if (which == 1) {
            if (!parse_scale(value, &at)) {
                fprintf(stderr, "gpupool plan: --at %s: not a whole number from 1 to %.0f\n", value, MAX_SCALE);
                return 2;
            }
            have_at = 1;
        } else if (which == 2) {
            if (gp_plan_parse_size_with_unit("--gpu-memory", value, &gpu_memory, err, sizeof err) != 0) {
                fprintf(stderr, "gpupool plan: %s\n", err);
                return 2;
            }
        } else if (which == 3) {
            svg = value;
        } else if (which == 6) {
            laws = value;
        } else if (which == 4) {
            if (num_models == MAX_TRACES) {
                fprintf(stderr, "gpupool plan: --model %s: at most %d models\n", value, MAX_TRACES);
                return 2;
            }
            models[num_models++] = value;
        } else {
            char *end;
            double pct = strtod(value, &end);
            if (end == value || (*end != '%' && *end != '\0') || (*end == '%' && end[1] != '\0') || !(pct >= 0) ||
                pct > 1000) {
                fprintf(stderr, "gpupool plan: --margin %s: expected a percentage from 0 to 1000 (10 or 10%%)\n", value);
                return 2;
            }
            margin = pct / 100.0;
        }
    }
    if (num_models > 0) {
        if (n > 0 || have_at || loo) {
            fprintf(stderr, "gpupool plan: --model plans several models on one GPU; it does not take --trace, --at "
                    "or --leave-one-out\n");
            return 2;
        }
        if (gpu_memory == 0) {
            fprintf(stderr, "gpupool plan: --model needs --gpu-memory SIZE (the GPU they are to share)\n");
            return 2;
        }
        return gp_plan_models(models, num_models, gpu_memory, margin, json);
    }
    if (n == 0) {
        fprintf(stderr, "gpupool plan: no trace given (--trace SCALE=TRACE, --model NAME=TRACE or --params N)\n\n%s",
                plan_usage);
        return 2;
    }
    for (size_t i = 0; i < n && status == 0; i++) {
        if (gp_trace_read(&g[i].trace, g[i].path, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: --trace %s: %s\n", g[i].spec, err);
            status = 2;
        } else {
            g[i].loaded = 1;
            if (g[i].trace.num_allocs == 0) {
                fprintf(stderr, "gpupool plan: --trace %s: the trace has no allocations\n", g[i].spec);
                status = 2;
            }
        }
    }
    if (status == 0)
        status = plan_traces(g, n, have_at, at, gpu_memory, loo, svg, laws, json);
    for (size_t i = 0; i < n; i++)
        if (g[i].loaded)
            gp_trace_free(&g[i].trace);
    return status;
}
