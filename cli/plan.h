/*
 * plan.h — `gpupool plan`: how much device memory a model needs at a scale (batch size or sequence
 * length) it was not traced at, what that memory is made of, and which models fit on one GPU together.
 *
 * The pieces, one file each:
 *   plan_fit.c      peak live bytes as fixed + linear (+ quadratic) in the scale, least squares
 *   plan_align.c    which allocation of one trace is which allocation of another (sequence alignment)
 *   plan_synth.c    a size law per allocation from the aligned traces, and the trace synthesised at a new
 *                   scale from them
 *   plan_predict.c  the synthesised trace replayed through gpupool (sim, sim-vmm) and PyTorch's policy;
 *                   the largest scale that fits a GPU
 *   plan_compose.c  what one trace's peak is made of (resident before / from the first step, per step,
 *                   temporaries)
 *   plan_estimate.c the footprint from a description (parameters, dtype, optimizer, activations)
 *   plan_models.c   several models replayed together through one pool, with suggested budgets
 *   plan_svg.c      the composition as stacked bars, one per scale
 *   cmd_plan.c      the command line
 */
#ifndef GP_CLI_PLAN_H
#define GP_CLI_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "trace.h"

/* ---- plan_fit.c -------------------------------------------------------------------------------- */

/* y = fixed + linear * x (+ quadratic * x^2), fitted by least squares. */
typedef struct gp_scale_fit {
    int terms;               /* 2: fixed + linear; 3: fixed + linear + quadratic */
    double fixed, linear, quadratic;
    size_t points;
    double max_rel_error;    /* largest |fit(x_i) - y_i| / y_i over the points it was fitted to */
    double loo_max_rel_error; /* largest error predicting each point from the others (with
                                 min(terms, points - 1) terms); -1 when there are only two points */
} gp_scale_fit;

/* Fits n >= 2 points (distinct x > 0) with `terms` (2 or 3; 3 needs n >= 3). 0, or -1 with err. */
int gp_fit_scale(const double *x, const double *y, size_t n, int terms, gp_scale_fit *fit, char *err,
                 size_t errlen);
double gp_fit_eval(const gp_scale_fit *fit, double x);

/* ---- plan_align.c ------------------------------------------------------------------------------ */

#define GP_ALIGN_NONE UINT32_MAX

typedef struct gp_alignment {
    uint32_t *b_of_a;        /* per allocation (slot) of trace a: the matching slot of b, or NONE */
    size_t num_a, num_b;
    size_t matched;          /* pairs */
    size_t unmatched_a;      /* allocations of a with no partner in b */
    size_t unmatched_b;
} gp_alignment;

/* Aligns the allocation sequences of a (traced at scale_a) and b (at scale_b): the longest sequence of
 * pairs, in order, whose sizes are compatible with one allocation at two scales (equal, or growing with
 * the scale no faster than its square). Refuses (-1, "do not align") when more than an eighth of the
 * allocations would stay unmatched: then a and b are not the same model. */
int gp_align(const gp_trace *a, double scale_a, const gp_trace *b, double scale_b, gp_alignment *out,
             char *err, size_t errlen);
void gp_alignment_free(gp_alignment *alignment);

/* ---- plan_synth.c ------------------------------------------------------------------------------ */

enum gp_size_law {
    GP_LAW_CONSTANT = 0, /* the same size at every scale (parameters, optimizer state, fixed buffers) */
    GP_LAW_POWER,        /* c * scale^k, k = 1 or 2 (activations; attention scores for a sequence length) */
    GP_LAW_LINEAR,       /* a + b * scale */
    GP_LAW_QUADRATIC,    /* a + b * scale + c * scale^2 (three or more scales), c > 0 */
    GP_LAW_SATURATING,   /* growing ever slower (c < 0: a workspace reaching its cap): the quadratic
                            between the traced scales, held at the nearest one outside them */
    GP_LAW_UNMATCHED,    /* seen in the template only: kept at its size */
    GP_LAW_COUNT
};

typedef struct gp_size_model {
    double c0, c1, c2;   /* CONSTANT: c0; POWER: c0 * s^power; LINEAR: c0 + c1 s; QUADRATIC: + c2 s^2 */
    double lo, hi;       /* SATURATING: the traced scales it holds between */
    uint8_t law;
    uint8_t power;
} gp_size_model;

typedef struct gp_synth {
    const gp_trace *templ;   /* the trace whose event order the synthesised traces follow */
    double templ_scale;
    size_t templ_index;
    gp_size_model *models;   /* per slot of templ */
    size_t num_models;
    size_t laws[GP_LAW_COUNT];
    size_t unmatched_events; /* allocations of all the traces that no alignment matched */
    size_t *unmatched_of;    /* per given trace: its allocations unmatched against the template */
} gp_synth;

/* Aligns every trace with traces[templ] and fits each template allocation's size law from the sizes it
 * has in the traces where it is matched. An alignment that fails names the trace in err. */
int gp_synth_build(gp_synth *synth, const gp_trace *const *traces, const double *scales, size_t n,
                   size_t templ, char *err, size_t errlen);
/* The template's events with every size given by its law at `scale`. An allocation whose law goes below
 * zero there keeps its template size and is counted in *negative. The result is freed with gp_trace_free. */
int gp_synth_trace(const gp_synth *synth, double scale, gp_trace *out, size_t *negative, char *err,
                   size_t errlen);
uint64_t gp_size_model_eval(const gp_size_model *model, double scale);
void gp_synth_free(gp_synth *synth);
const char *gp_size_law_name(int law);

/* ---- plan_predict.c ---------------------------------------------------------------------------- */

typedef struct gp_plan_prediction {
    double scale;
    uint64_t peak_live_bytes;
    uint64_t reserved_cuda, reserved_vmm, reserved_pytorch, reserved_pytorch_expandable;
    uint64_t failed_allocations; /* in the gpupool replays (0 unless the simulated device was too small) */
    size_t negative_sizes;
} gp_plan_prediction;

/* Synthesises the trace at `scale` and replays it through gpupool (backends sim and sim-vmm) and
 * PyTorch's policies. */
int gp_plan_predict(const gp_synth *synth, double scale, gp_plan_prediction *out, char *err, size_t errlen);
/* The same figures measured on a real trace (for the leave-one-out check). */
int gp_plan_measure(const gp_trace *trace, double scale, gp_plan_prediction *out, char *err, size_t errlen);

/* Which reserved figure a search or a verdict uses. */
enum gp_plan_allocator { GP_PLAN_CUDA = 0, GP_PLAN_VMM, GP_PLAN_PYTORCH, GP_PLAN_ALLOCATORS };
uint64_t gp_plan_reserved(const gp_plan_prediction *p, int allocator);
const char *gp_plan_allocator_name(int allocator);

/* The largest integer scale in [1, max_scale] whose peak reserved under `allocator` is at most
 * `capacity` (found by doubling then bisection: peak reserved grows with the scale). 0 when even scale 1
 * does not fit. */
int gp_plan_largest_fit(const gp_synth *synth, int allocator, uint64_t capacity, double max_scale,
                        double *largest, char *err, size_t errlen);

/* ---- plan_compose.c ---------------------------------------------------------------------------- */

enum gp_part {
    GP_PART_RESIDENT_BEFORE = 0, /* allocated before the first step, alive to the end: parameters, buffers */
    GP_PART_RESIDENT_FROM_STEP,  /* allocated from the first step on, alive to the end: optimizer state,
                                    gradients kept between steps, caches */
    GP_PART_PER_STEP,            /* alive at the peak, freed within the run: activations, gradients */
    GP_PART_TEMPORARY,           /* alive at the peak only briefly: workspaces, intermediate results */
    GP_PARTS
};

typedef struct gp_composition {
    uint64_t part_bytes[GP_PARTS]; /* at the moment of peak live: they sum to peak_live_bytes */
    uint64_t peak_live_bytes;
    size_t peak_event;             /* index of the event that reached the peak */
    size_t first_step_slot;        /* the first allocation counted as part of a step */
    size_t temporary_lifetime;     /* allocations at most this many allocations long are temporaries */
    int first_step_found;          /* 0: no transient build-up found; the first transient allocation
                                      is taken as the start */
} gp_composition;

int gp_compose(const gp_trace *trace, gp_composition *out, char *err, size_t errlen);
const char *gp_part_name(int part);

/* ---- plan_svg.c -------------------------------------------------------------------------------- */

/* One stacked bar per column: labels[i] under it, parts[i][GP_PARTS] bytes. */
int gp_plan_svg(const char *path, const char *title, const char *const *labels,
                const uint64_t (*parts)[GP_PARTS], size_t columns, char *err, size_t errlen);

/* ---- cmd_plan.c ------------------------------------------------------------------------------- */

/* A size that must carry its unit ("80GiB", "512MiB", "4096B"): a bare number is refused, naming
 * `option`. 0, or -1 with a message in err. */
int gp_plan_parse_size_with_unit(const char *option, const char *text, uint64_t *out, char *err, size_t errlen);

/* ---- plan_estimate.c --------------------------------------------------------------------------- */

/* `gpupool plan --describe ...`; argv after the subcommand. Returns the exit status. */
int gp_plan_estimate_main(int argc, char **argv);

/* ---- plan_models.c ----------------------------------------------------------------------------- */

/* `gpupool plan --gpu-memory SIZE --model NAME=TRACE ...`. Returns the exit status. */
int gp_plan_models(const char **specs, int count, uint64_t gpu_memory, double margin, int json);

#endif /* GP_CLI_PLAN_H */
