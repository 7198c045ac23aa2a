/*
 * plan_estimate.c — `gpupool plan --params N ...`: the footprint of a model nobody has traced yet, from a
 * description, beside the rules of thumb people use and (with --trace) a trace of it.
 *
 * The accounting, per parameter (P parameters):
 *   weights     P * bytes(dtype); mixed-precision training keeps fp32 master weights besides the
 *               16-bit copy: 4 + 2 bytes;
 *   gradients   training only, in the compute dtype (16-bit with mixed precision, else the dtype);
 *   optimizer   none or plain SGD 0; SGD with momentum one state, Adam/AdamW two (exp_avg, exp_avg_sq),
 *               fp32 under mixed precision, else in the weights' dtype; 8-bit Adam two 1-byte states;
 *   activations either --activation-bytes-per-sample times --batch, or for a transformer Korthikanti et
 *               al.'s count ("Reducing Activation Recomputation in Large Transformer Models", 2022) of
 *               what one layer keeps for the backward pass, s*b*h*(34 + 5*a*s/h) bytes with 16-bit
 *               activations (doubled for fp32), times the layers, plus the logits b*s*V twice (their
 *               values and their gradient); in inference nothing is kept for a backward pass, so one
 *               layer's worth plus the logits.
 * This is what is live, not what an allocator reserves: rounding and fragmentation come on top, and only
 * a replay (gpupool plan --trace) measures them. Temporaries (workspaces) are not in the description.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/format.h"
#include "json_text.h"
#include "plan.h"

static const char estimate_usage[] =
    "usage: gpupool plan [--json] --params N [--dtype fp32|fp16|bf16|int8] [--training|--inference]\n"
    "                    [--optimizer none|sgd|sgd-momentum|adam|adamw|adam-8bit] [--mixed-precision]\n"
    "                    [--batch B] [--activation-bytes-per-sample SIZE |\n"
    "                     --layers L --hidden H --heads A --vocab V --seq S] [--trace TRACE]\n"
    "\n"
    "  --params N        parameter count: a number, or with K, M, B (10^9) or T: 11.7M, 7B\n"
    "  --dtype D         the weights' dtype (default fp32)\n"
    "  --optimizer O     default adamw when training, none for inference\n"
    "  --mixed-precision 16-bit compute with fp32 master weights and optimizer state\n"
    "  --batch B         samples per step (default 1)\n"
    "  --activation-bytes-per-sample SIZE   what one sample keeps for the backward pass (with a unit)\n"
    "  --layers --hidden --heads --vocab --seq   a transformer's shape, for its activations\n"
    "  --trace TRACE     a trace of the same model, to compare with (what its peak is made of)\n";

typedef struct description {
    double params;
    const char *dtype;
    double dtype_bytes;
    int training, mixed;
    const char *optimizer;
    double batch;
    uint64_t per_sample;
    double layers, hidden, heads, vocab, seq;
    const char *trace;
} description;

static int parse_count(const char *text, double *out)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return 0;
    char *end;
    double v = strtod(text, &end);
    double scale = 1;
    if (*end == 'K' || *end == 'k')
        scale = 1e3, end++;
    else if (*end == 'M' || *end == 'm')
        scale = 1e6, end++;
    else if (*end == 'B' || *end == 'b' || *end == 'G' || *end == 'g')
        scale = 1e9, end++;
    else if (*end == 'T' || *end == 't')
        scale = 1e12, end++;
    if (*end != '\0' || !(v > 0) || !isfinite(v))
        return 0;
    *out = v * scale;
    return 1;
}

static double dtype_size(const char *d)
{
    if (strcmp(d, "fp32") == 0 || strcmp(d, "float32") == 0)
        return 4;
    if (strcmp(d, "fp16") == 0 || strcmp(d, "bf16") == 0 || strcmp(d, "float16") == 0 || strcmp(d, "bfloat16") == 0)
        return 2;
    if (strcmp(d, "int8") == 0 || strcmp(d, "fp8") == 0)
        return 1;
    return 0;
}

static const char *const optimizers[] = {"none", "sgd", "sgd-momentum", "adam", "adamw", "adam-8bit"};

static void row(const char *what, double bytes, double trace_bytes, int have_trace)
{
    char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
    printf("  %-42s %12s", what, gp_format_size((size_t)bytes, a));
    if (have_trace)
        printf(" %12s  %+7.1f%%", gp_format_size((size_t)trace_bytes, b),
               trace_bytes > 0 ? 100.0 * (bytes / trace_bytes - 1.0) : 0.0);
    printf("\n");
}

int gp_plan_estimate_main(int argc, char **argv)
{
    description d = {.dtype = "fp32", .dtype_bytes = 4, .training = 1, .optimizer = NULL, .batch = 1};
    int json = 0, have_params = 0, inference = 0, training = 0;
    char err[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--describe-help") == 0 || strcmp(a, "--help") == 0) {
            fputs(estimate_usage, stdout);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(a, "--training") == 0) {
            training = 1;
            continue;
        }
        if (strcmp(a, "--inference") == 0) {
            inference = 1;
            continue;
        }
        if (strcmp(a, "--mixed-precision") == 0) {
            d.mixed = 1;
            continue;
        }
        static const char *const names[] = {"--params", "--dtype", "--optimizer", "--batch",
                                            "--activation-bytes-per-sample", "--layers", "--hidden", "--heads",
                                            "--vocab", "--seq", "--trace"};
        int which = -1;
        const char *value = NULL;
        for (int k = 0; k < 11; k++) {
            size_t len = strlen(names[k]);
            if (strncmp(a, names[k], len) == 0 && (a[len] == '\0' || a[len] == '=')) {
                which = k;
                value = a[len] == '=' ? a + len + 1 : i + 1 < argc ? argv[++i] : NULL;
                break;
            }
        }
        if (which < 0) {
            fprintf(stderr, "gpupool plan: %s is not an option of a description (see --describe-help)\n", a);
            return 2;
        }
        if (value == NULL) {
            fprintf(stderr, "gpupool plan: %s needs a value\n", names[which]);
            return 2;
        }
        double *counts[] = {&d.params, NULL, NULL, &d.batch, NULL, &d.layers, &d.hidden, &d.heads, &d.vocab, &d.seq};
        if (which == 1) {
            d.dtype = value;
            d.dtype_bytes = dtype_size(value);
            if (d.dtype_bytes == 0) {
                fprintf(stderr, "gpupool plan: --dtype %s: unknown dtype (fp32, fp16, bf16 or int8)\n", value);
                return 2;
            }
        } else if (which == 2) {
            int known = 0;
            for (size_t k = 0; k < sizeof optimizers / sizeof optimizers[0]; k++)
                known |= strcmp(value, optimizers[k]) == 0;
            if (!known) {
                fprintf(stderr, "gpupool plan: --optimizer %s: unknown optimizer (none, sgd, sgd-momentum, adam, "
                        "adamw or adam-8bit)\n", value);
                return 2;
            }
            d.optimizer = value;
        } else if (which == 4) {
            if (gp_plan_parse_size_with_unit("--activation-bytes-per-sample", value, &d.per_sample, err, sizeof err) != 0) {
                fprintf(stderr, "gpupool plan: %s\n", err);
                return 2;
            }
        } else if (which == 10) {
            d.trace = value;
        } else {
            if (!parse_count(value, counts[which]) ||
                (which != 0 && *counts[which] != floor(*counts[which]))) {
                fprintf(stderr, "gpupool plan: %s %s: expected a whole number above 0%s\n", names[which], value,
                        which == 0 ? " (suffixes K, M, B, T allowed)" : "");
                return 2;
            }
            have_params |= which == 0;
        }
    }
    if (!have_params) {
        fprintf(stderr, "gpupool plan: a description needs --params N\n");
        return 2;
    }
    if (training && inference) {
        fprintf(stderr, "gpupool plan: --training and --inference together: give one\n");
        return 2;
    }
    d.training = !inference;
    if (d.optimizer == NULL)
        d.optimizer = d.training ? "adamw" : "none";
    else if (!d.training && strcmp(d.optimizer, "none") != 0) {
        fprintf(stderr, "gpupool plan: --optimizer %s with --inference: inference runs no optimizer\n", d.optimizer);
        return 2;
    }
    int transformer = d.layers > 0 || d.hidden > 0 || d.heads > 0 || d.vocab > 0 || d.seq > 0;
    if (transformer && !(d.layers > 0 && d.hidden > 0 && d.heads > 0 && d.vocab > 0 && d.seq > 0)) {
        fprintf(stderr, "gpupool plan: a transformer's shape needs all of --layers, --hidden, --heads, --vocab and --seq\n");
        return 2;
    }
    if (transformer && d.per_sample) {
        fprintf(stderr, "gpupool plan: give --activation-bytes-per-sample or a transformer's shape, not both\n");
        return 2;
    }
    if (d.mixed && d.dtype_bytes != 4) {
        fprintf(stderr, "gpupool plan: --mixed-precision keeps fp32 master weights: --dtype %s contradicts it (leave "
                "--dtype at fp32)\n", d.dtype);
        return 2;
    }
    double P = d.params;
    double compute = d.mixed ? 2 : d.dtype_bytes; /* bytes of an activation or a gradient element */
    double weights = P * (d.mixed ? 4 + 2 : d.dtype_bytes);
    double grads = d.training ? P * compute : 0;
    double state_bytes = d.mixed ? 4 : d.dtype_bytes;
    double optimizer = 0;
    if (strcmp(d.optimizer, "sgd-momentum") == 0)
        optimizer = P * state_bytes;
    else if (strcmp(d.optimizer, "adam") == 0 || strcmp(d.optimizer, "adamw") == 0)
        optimizer = 2 * P * state_bytes;
    else if (strcmp(d.optimizer, "adam-8bit") == 0)
        optimizer = 2 * P * 1;
    double activations = 0;
    if (d.per_sample)
        activations = (double)d.per_sample * d.batch;
    else if (transformer) {
        double s = d.seq, b = d.batch, h = d.hidden, a = d.heads;
        double per_layer = s * b * h * (34 + 5 * a * s / h) * (compute / 2);
        double logits = 2 * b * s * d.vocab * compute;
        activations = (d.training ? d.layers * per_layer : per_layer) + logits;
    }
    double total = weights + grads + optimizer + activations;
    double rule_inference_bf16 = 2 * P, rule_mixed_adam = 16 * P, rule_accelerate = P * d.dtype_bytes * 1.2;
    /* the trace, when given: its peak's composition */
    gp_composition comp = {0};
    int have_trace = 0;
    if (d.trace != NULL) {
        gp_trace t;
        if (gp_trace_read(&t, d.trace, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: --trace %s: %s\n", d.trace, err);
            return 2;
        }
        int rc = gp_compose(&t, &comp, err, sizeof err);
        gp_trace_free(&t);
        if (rc != 0) {
            fprintf(stderr, "gpupool plan: --trace %s: %s\n", d.trace, err);
            return 1;
        }
        have_trace = 1;
    }
    double t_weights = (double)comp.part_bytes[GP_PART_RESIDENT_BEFORE];
    double t_state = (double)comp.part_bytes[GP_PART_RESIDENT_FROM_STEP];
    double t_step = (double)(comp.part_bytes[GP_PART_PER_STEP] + comp.part_bytes[GP_PART_TEMPORARY]);
    if (json) {
        printf("{\"description\":{\"params\":%.0f,\"dtype\":\"%s\",\"training\":%s,\"mixed_precision\":%s,"
               "\"optimizer\":\"%s\",\"batch\":%.0f},\"estimate\":{\"weights_bytes\":%.0f,\"gradients_bytes\":%.0f,"
               "\"optimizer_bytes\":%.0f,\"activations_bytes\":%.0f,\"peak_live_bytes\":%.0f},"
               "\"rules_of_thumb\":{\"bf16_inference_2_bytes_per_param\":%.0f,\"mixed_adam_16_bytes_per_param\":%.0f,"
               "\"accelerate_dtype_plus_20_percent\":%.0f}",
               P, d.dtype, d.training ? "true" : "false", d.mixed ? "true" : "false", d.optimizer, d.batch, weights,
               grads, optimizer, activations, total, rule_inference_bf16, rule_mixed_adam, rule_accelerate);
        if (have_trace)
        {
            printf(",\"trace\":{\"path\":");
            gp_json_string(stdout, d.trace);
            printf(",\"resident_before_first_step\":%.0f,\"resident_from_first_step\":%.0f,"
                   "\"per_step_and_temporaries\":%.0f,\"peak_live_bytes\":%llu}",
                   t_weights, t_state, t_step, (unsigned long long)comp.peak_live_bytes);
        }
        printf("}\n");
        return 0;
    }
    char a[GP_SIZE_TEXT_MAX];
    printf("%s of %.4g parameters, %s%s, optimizer %s, batch %.0f\n", d.training ? "training" : "inference", P, d.dtype,
           d.mixed ? " with mixed precision" : "", d.optimizer, d.batch);
    printf("  %-42s %12s%s\n", "part", "estimate", have_trace ? "        trace  estimate vs trace" : "");
    row("weights (parameters)", weights, t_weights, have_trace);
    if (have_trace) {
        row("gradients + optimizer state", grads + optimizer, t_state, have_trace);
        printf("    (a trace keeps gradients with the optimizer state when they live from step to step, and with\n"
               "     the activations when zero_grad frees them)\n");
        row("activations (+ temporaries in the trace)", activations, t_step, have_trace);
    } else {
        row("gradients", grads, 0, 0);
        row("optimizer state", optimizer, 0, 0);
        row("activations", activations, 0, 0);
    }
    row("peak live", total, (double)comp.peak_live_bytes, have_trace);
    if (have_trace) {
        /* where the description and the trace differ by more than a tenth, and the likely reason */
        double rel_w = t_weights > 0 ? weights / t_weights - 1 : 0, rel_s = t_state > 0 ? (grads + optimizer) / t_state - 1 : 0;
        double rel_a = t_step > 0 ? activations / t_step - 1 : 0;
        if (fabs(rel_w) > 0.1)
            printf("  weights differ by %+.0f%%: check --params and --dtype (or the trace's buffers, or a first step "
                   "found early: plan_compose's limits)\n", 100 * rel_w);
        if (fabs(rel_s) > 0.1)
            printf("  gradients + state differ by %+.0f%%: %s\n", 100 * rel_s,
                   rel_s > 0 ? "the trace frees its gradients between steps (they are in its per-step part), or its "
                               "optimizer keeps less state"
                             : "the trace keeps more between steps (gradients, caches, a second copy of the weights)");
        if (fabs(rel_a) > 0.1)
            printf("  activations differ by %+.0f%%: %s\n", 100 * rel_a,
                   rel_a < 0 ? "the trace's per-step part holds gradients and kernel workspaces too, and the "
                               "framework's own intermediates (the description counts what one layer keeps)"
                             : "the trace recomputes or frees activations earlier than the description assumes");
    }
    if (!d.per_sample && !transformer)
        printf("  (no activations described: give --activation-bytes-per-sample or a transformer's shape)\n");
    printf("rules of thumb, beside this estimate (%s):\n", gp_format_size((size_t)total, a));
    printf("  2 bytes per parameter (bf16 inference)        %12s  %+7.1f%%\n", gp_format_size((size_t)rule_inference_bf16, a),
           100.0 * (rule_inference_bf16 / total - 1));
    printf("  16 bytes per parameter (mixed-precision Adam) %12s  %+7.1f%%\n", gp_format_size((size_t)rule_mixed_adam, a),
           100.0 * (rule_mixed_adam / total - 1));
    printf("  parameters x dtype + 20%% (accelerate)        %12s  %+7.1f%%\n", gp_format_size((size_t)rule_accelerate, a),
           100.0 * (rule_accelerate / total - 1));
    printf("the rules count parameters only: activations (%s here) and, for inference, anything but the weights\n"
           "are left out; none counts the allocator's rounding and fragmentation (replay a trace for that)\n",
           gp_format_size((size_t)activations, a));
    return 0;
}
