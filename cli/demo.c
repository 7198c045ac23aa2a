/*
 * demo.c — `gpupool demo`: three model-like workloads share one simulated GPU through one pool.
 *
 * The workloads are SYNTHETIC: generated here in code from made-up model shapes, not recorded from
 * real programs (for real traces use `gpupool replay`). Each runs on its own simulated stream:
 *   - a transformer training step (GPT-like, 12 layers, hidden 2048, batch 8 x 1024 tokens, bf16):
 *     weights, Adam state created at the first step, activations saved in the forward pass and freed
 *     in the backward pass, gradients freed by zero_grad(set_to_none);
 *   - a CNN inference loop (ResNet-50-like stages, batch 128, a short final batch of 67 every 8th);
 *   - a bursty serving loop (requests arriving in bursts, a KV cache per request that grows by
 *     reallocation every 64 tokens, per-step logits).
 * The three event lists are merged by time into one trace and replayed with the replay engine: once
 * observed (stats after every event, for the tables and the SVG) and once timed.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/format.h"
#include "replay.h"
#include "svg.h"
#include "trace.h"

#define KIB ((uint64_t)1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define NUM_MODELS 3

static const char demo_usage[] =
    "usage: gpupool demo [--plot FILE.svg] [--device-memory SIZE] [--conf CONF] [--seconds S]\n"
    "\n"
    "Runs three SYNTHETIC model workloads, generated in code (a transformer training step, a CNN\n"
    "inference loop and a bursty serving loop), on one gpupool pool over one simulated GPU, each on its\n"
    "own stream. Prints a table per model and for the pool, and writes live and reserved bytes over\n"
    "time to demo.svg (or FILE.svg). No GPU and no files are needed.\n"
    "\n"
    "  --plot FILE.svg       where to write the chart (default demo.svg)\n"
    "  --device-memory SIZE  capacity of the simulated GPU (default 80GiB)\n"
    "  --conf CONF           pool configuration, \"key:value,...\" (see `gpupool help config`)\n"
    "  --seconds S           simulated seconds of work (default 8)\n";

/* ---- event lists ------------------------------------------------------------------------------ */

typedef struct model_event {
    uint64_t time_us;
    uint64_t size;
    uint32_t handle; /* the model's own allocation number */
    uint8_t kind;    /* GP_EV_ALLOC or GP_EV_FREE */
} model_event;

typedef struct model {
    const char *name;
    const char *what;
    model_event *ev;
    size_t n, cap;
    uint64_t *handle_size;
    size_t num_handles, handles_cap;
    uint64_t now_us;
    int oom; /* host allocation failed while generating */
    /* filled by the replay */
    uint64_t live, peak_live, allocs, frees;
    double *live_series;
} model;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Uniform in [lo, hi]. */
static uint64_t rng_range(uint64_t lo, uint64_t hi)
{
    return lo + rng_next() % (hi - lo + 1);
}

static void push(model *m, uint8_t kind, uint32_t handle, uint64_t size)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4096;
        model_event *p = realloc(m->ev, cap * sizeof *p);
        if (p == NULL) {
            m->oom = 1;
            return;
        }
        m->ev = p;
        m->cap = cap;
    }
    m->ev[m->n++] = (model_event){.time_us = m->now_us, .size = size, .handle = handle, .kind = kind};
}

static uint32_t m_alloc(model *m, uint64_t size)
{
    if (m->num_handles == m->handles_cap) {
        size_t cap = m->handles_cap ? m->handles_cap * 2 : 4096;
        uint64_t *p = realloc(m->handle_size, cap * sizeof *p);
        if (p == NULL) {
            m->oom = 1;
            return 0;
        }
        m->handle_size = p;
        m->handles_cap = cap;
    }
    uint32_t h = (uint32_t)m->num_handles++;
    m->handle_size[h] = size;
    push(m, GP_EV_ALLOC, h, size);
    return h;
}

static void m_free(model *m, uint32_t h)
{
    push(m, GP_EV_FREE, h, m->handle_size[h]);
}

/* ---- workload 1: transformer training step ---------------------------------------------------- */

static void gen_transformer(model *m, uint64_t duration_us)
{
    const uint64_t L = 12, h = 2048, b = 8, s = 1024, vocab = 50304, heads = 16;
    const uint64_t tokens = b * s;
    const uint64_t bf16 = 2, fp32 = 4;
    /* parameter tensors per layer: ln1, qkv, proj, ln2, fc1, fc2 (+ biases) */
    const uint64_t layer_params[] = {2 * h, 3 * h * h, 3 * h, h * h, h, 2 * h, 4 * h * h, 4 * h, 4 * h * h, h};
    const size_t per_layer = sizeof layer_params / sizeof layer_params[0];
    const size_t num_params = L * per_layer + 2; /* + embedding and final norm */
    uint64_t *param_elems = malloc(num_params * sizeof *param_elems);
    uint32_t *weights = malloc(num_params * sizeof *weights);
    uint32_t *adam_m = malloc(num_params * sizeof *adam_m);
    uint32_t *adam_v = malloc(num_params * sizeof *adam_v);
    uint32_t *grads = malloc(num_params * sizeof *grads);
    uint32_t(*saved)[8] = malloc(L * sizeof *saved);
    if (!param_elems || !weights || !adam_m || !adam_v || !grads || !saved) {
        m->oom = 1;
        goto out;
    }
    size_t k = 0;
    param_elems[k++] = vocab * h; /* embedding, tied with the output projection */
    for (uint64_t l = 0; l < L; l++)
        for (size_t j = 0; j < per_layer; j++)
            param_elems[k++] = layer_params[j];
    param_elems[k++] = 2 * h;
    for (size_t i = 0; i < num_params; i++) /* model.to("cuda") */
        weights[i] = m_alloc(m, param_elems[i] * bf16);
    m->now_us += 20000;

    const uint64_t step_us = 450000;
    int first = 1;
    while (m->now_us + step_us <= duration_us) {
        uint64_t t0 = m->now_us;
        uint64_t tick = step_us / (L * 8 * 2 + 64);
        uint32_t x = m_alloc(m, tokens * h * bf16); /* token embeddings */
        m->now_us += tick;
        /* forward: each layer keeps 6 activations for backward, frees its temporaries */
        for (uint64_t l = 0; l < L; l++) {
            uint32_t *sv = saved[l];
            sv[0] = m_alloc(m, tokens * h * bf16);          /* ln1 out */
            sv[1] = m_alloc(m, 3 * tokens * h * bf16);      /* qkv */
            uint32_t scores = m_alloc(m, b * heads * s * s * bf16); /* attention scores (temporary) */
            m->now_us += tick;
            sv[2] = m_alloc(m, b * heads * s * 64 * fp32 / 16);     /* softmax stats (logsumexp) */
            sv[3] = m_alloc(m, tokens * h * bf16);          /* attention out */
            m_free(m, scores);
            sv[4] = m_alloc(m, tokens * 4 * h * bf16);      /* fc1 out */
            sv[5] = m_alloc(m, tokens * 4 * h * bf16);      /* gelu out */
            m->now_us += tick;
            sv[6] = m_alloc(m, tokens * h * bf16);          /* fc2 out = residual stream */
            sv[7] = m_alloc(m, tokens * fp32 * 2);          /* layer-norm mean and rstd */
            m->now_us += tick;
        }
        uint32_t logits = m_alloc(m, tokens * vocab * bf16);
        uint32_t logits32 = m_alloc(m, tokens * vocab * fp32); /* upcast for the loss */
        uint32_t loss = m_alloc(m, 4);
        m->now_us += tick * 4;
        /* backward */
        m_free(m, loss);
        uint32_t dlogits = m_alloc(m, tokens * vocab * bf16);
        m_free(m, logits32);
        m_free(m, logits);
        grads[0] = m_alloc(m, param_elems[0] * fp32); /* embedding gradient */
        m_free(m, dlogits);
        uint32_t dx = m_alloc(m, tokens * h * bf16);
        m->now_us += tick * 4;
        for (uint64_t l = L; l-- > 0;) {
            uint32_t *sv = saved[l];
            size_t base = 1 + (size_t)l * per_layer;
            uint32_t d4h = m_alloc(m, tokens * 4 * h * bf16);
            for (size_t j = per_layer / 2; j < per_layer; j++)
                grads[base + j] = m_alloc(m, param_elems[base + j] * fp32);
            m_free(m, sv[6]);
            m_free(m, sv[5]);
            m_free(m, sv[4]);
            m->now_us += tick;
            uint32_t scores = m_alloc(m, b * heads * s * s * bf16); /* recomputed attention */
            uint32_t dqkv = m_alloc(m, 3 * tokens * h * bf16);
            m_free(m, d4h);
            m_free(m, scores);
            for (size_t j = 0; j < per_layer / 2; j++)
                grads[base + j] = m_alloc(m, param_elems[base + j] * fp32);
            m_free(m, sv[3]);
            m_free(m, sv[2]);
            m_free(m, sv[1]);
            m_free(m, sv[0]);
            m_free(m, sv[7]);
            uint32_t ndx = m_alloc(m, tokens * h * bf16);
            m_free(m, dqkv);
            m_free(m, dx);
            dx = ndx;
            m->now_us += tick;
        }
        grads[num_params - 1] = m_alloc(m, param_elems[num_params - 1] * fp32);
        m_free(m, dx);
        m_free(m, x);
        m->now_us += tick * 2;
        /* optimizer: Adam state on the first step, a temporary per parameter, then zero_grad */
        for (size_t i = 0; i < num_params; i++) {
            if (first) {
                adam_m[i] = m_alloc(m, param_elems[i] * fp32);
                adam_v[i] = m_alloc(m, param_elems[i] * fp32);
            }
            uint32_t tmp = m_alloc(m, param_elems[i] * fp32);
            m_free(m, tmp);
        }
        first = 0;
        m->now_us += tick * 4;
        for (size_t i = 0; i < num_params; i++)
            m_free(m, grads[i]); /* zero_grad(set_to_none=True) */
        m->now_us = t0 + step_us;
    }
    /* the weights and the optimizer state stay allocated for the life of the process */
out:
    free(param_elems);
    free(weights);
    free(adam_m);
    free(adam_v);
    free(grads);
    free(saved);
}

/* ---- workload 2: CNN inference loop ----------------------------------------------------------- */

static void gen_cnn(model *m, uint64_t duration_us)
{
    /* ResNet-50-like: (channels, spatial size, blocks) per stage; fp16 activations */
    struct stage { uint64_t c, hw, blocks; };
    static const struct stage stages[] = {{256, 56, 3}, {512, 28, 4}, {1024, 14, 6}, {2048, 7, 3}};
    const uint64_t fp16 = 2;
    /* weights: ~25 M parameters in 161 tensors of varied sizes */
    uint64_t in_c = 64;
    for (size_t si = 0; si < 4; si++) {
        for (uint64_t blk = 0; blk < stages[si].blocks; blk++) {
            uint64_t mid = stages[si].c / 4;
            m_alloc(m, in_c * mid * fp16);       /* 1x1 reduce */
            m_alloc(m, mid * mid * 9 * fp16);    /* 3x3 */
            m_alloc(m, mid * stages[si].c * fp16); /* 1x1 expand */
            for (int bn = 0; bn < 3; bn++)
                m_alloc(m, 4 * stages[si].c * fp16); /* batch-norm scale, shift, mean, var */
            if (blk == 0)
                m_alloc(m, in_c * stages[si].c * fp16); /* downsample */
            in_c = stages[si].c;
        }
    }
    m_alloc(m, 3 * 64 * 49 * fp16);    /* stem */
    m_alloc(m, 2048 * 1000 * fp16);    /* fc */
    m->now_us += 5000;

    const uint64_t iter_us = 40000;
    for (uint64_t it = 0; m->now_us + iter_us <= duration_us; it++) {
        uint64_t t0 = m->now_us;
        uint64_t b = (it % 8 == 7) ? 67 : 128; /* a short final batch every 8th iteration */
        uint64_t tick = iter_us / 40;
        uint32_t input = m_alloc(m, b * 3 * 224 * 224 * fp16);
        m->now_us += tick;
        uint32_t x = m_alloc(m, b * 64 * 112 * 112 * fp16); /* stem conv */
        m_free(m, input);
        uint32_t pooled = m_alloc(m, b * 64 * 56 * 56 * fp16);
        m_free(m, x);
        x = pooled;
        m->now_us += tick;
        for (size_t si = 0; si < 4; si++) {
            for (uint64_t blk = 0; blk < stages[si].blocks; blk++) {
                uint64_t hw = stages[si].hw, c = stages[si].c, mid = c / 4;
                uint32_t a = m_alloc(m, b * mid * hw * hw * fp16);
                uint32_t a2 = m_alloc(m, b * mid * hw * hw * fp16);
                m_free(m, a);
                uint32_t y = m_alloc(m, b * c * hw * hw * fp16);
                m_free(m, a2);
                if (blk == 0) {
                    uint32_t ds = m_alloc(m, b * c * hw * hw * fp16); /* downsampled shortcut */
                    m_free(m, ds);
                }
                m_free(m, x); /* the residual input is consumed by the add */
                x = y;
                m->now_us += tick / 2;
            }
        }
        uint32_t feat = m_alloc(m, b * 2048 * fp16);
        m_free(m, x);
        uint32_t logits = m_alloc(m, b * 1000 * 4);
        m_free(m, feat);
        uint32_t probs = m_alloc(m, b * 1000 * 4);
        m_free(m, logits);
        m->now_us += tick;
        m_free(m, probs); /* copied to the host */
        m->now_us = t0 + iter_us;
    }
}

/* ---- workload 3: bursty serving loop ---------------------------------------------------------- */

#define MAX_REQUESTS 64

static void gen_serving(model *m, uint64_t duration_us)
{
    const uint64_t kv_per_token = 2 * 24 * 2048 * 2; /* K and V, 24 layers, hidden 2048, fp16 */
    const uint64_t vocab = 32000;
    /* weights: a 1.3 B parameter model in 24 layers of 8 tensors, fp16 */
    for (int l = 0; l < 24; l++) {
        m_alloc(m, 3 * 2048 * 2048 * 2);
        m_alloc(m, 2048 * 2048 * 2);
        m_alloc(m, 2 * 4 * 2048 * 2048 * 2);
        for (int j = 0; j < 5; j++)
            m_alloc(m, 2048 * 2 * (uint64_t)(j + 1));
    }
    m_alloc(m, vocab * 2048 * 2);
    m->now_us += 10000;

    struct request { int active; uint32_t kv; uint64_t tokens, capacity, remaining; } req[MAX_REQUESTS];
    memset(req, 0, sizeof req);
    const uint64_t step_us = 30000;
    while (m->now_us + step_us <= duration_us) {
        /* bursts: most steps bring nothing, some bring a handful of requests at once */
        uint64_t r = rng_next() % 100;
        int arrivals = r < 85 ? 0 : r < 95 ? (int)rng_range(1, 3) : (int)rng_range(6, 14);
        for (int a = 0; a < arrivals; a++) {
            int slot = -1;
            for (int i = 0; i < MAX_REQUESTS; i++)
                if (!req[i].active) {
                    slot = i;
                    break;
                }
            if (slot < 0)
                break; /* full: the request is turned away */
            uint64_t prompt = rng_range(64, 2048);
            struct request *q = &req[slot];
            q->active = 1;
            q->tokens = prompt;
            q->capacity = (prompt + 63) / 64 * 64;
            q->remaining = rng_range(8, 96);
            /* prefill: activations for the whole prompt, then the KV cache */
            uint32_t act = m_alloc(m, prompt * 2048 * 4 * 2);
            q->kv = m_alloc(m, q->capacity * kv_per_token);
            m_free(m, act);
        }
        int batch = 0;
        for (int i = 0; i < MAX_REQUESTS; i++)
            batch += req[i].active;
        if (batch > 0) {
            /* one decode step for the whole batch */
            uint32_t hidden = m_alloc(m, (uint64_t)batch * 2048 * 2);
            uint32_t logits = m_alloc(m, (uint64_t)batch * vocab * 4);
            m_free(m, hidden);
            for (int i = 0; i < MAX_REQUESTS; i++) {
                struct request *q = &req[i];
                if (!q->active)
                    continue;
                q->tokens++;
                if (q->tokens > q->capacity) { /* grow the cache by 64 tokens: copy into a larger one */
                    q->capacity += 64;
                    uint32_t bigger = m_alloc(m, q->capacity * kv_per_token);
                    m_free(m, q->kv);
                    q->kv = bigger;
                }
                if (--q->remaining == 0) {
                    m_free(m, q->kv);
                    q->active = 0;
                }
            }
            m_free(m, logits);
        }
        m->now_us += step_us;
    }
    for (int i = 0; i < MAX_REQUESTS; i++)
        if (req[i].active) {
            m_free(m, req[i].kv);
            req[i].active = 0;
        }
}

/* ---- merge into one trace --------------------------------------------------------------------- */

/* Merges the models' events by time (ties in model order) into a trace with one stream per model. */
static int build_trace(model *models, gp_trace *t, uint8_t **event_model)
{
    memset(t, 0, sizeof *t);
    size_t total = 0, allocs = 0;
    for (int i = 0; i < NUM_MODELS; i++) {
        total += models[i].n;
        allocs += models[i].num_handles;
    }
    t->path = malloc(sizeof "demo (synthetic)");
    t->events = malloc((total ? total : 1) * sizeof *t->events);
    t->streams = malloc(NUM_MODELS * sizeof *t->streams);
    t->slot_stream = malloc((allocs ? allocs : 1) * sizeof *t->slot_stream);
    t->slot_size = malloc((allocs ? allocs : 1) * sizeof *t->slot_size);
    *event_model = malloc(total ? total : 1);
    uint32_t *slot_of[NUM_MODELS];
    for (int i = 0; i < NUM_MODELS; i++)
        slot_of[i] = malloc((models[i].num_handles ? models[i].num_handles : 1) * sizeof(uint32_t));
    int bad = !t->path || !t->events || !t->streams || !t->slot_stream || !t->slot_size || !*event_model;
    for (int i = 0; i < NUM_MODELS; i++)
        bad |= slot_of[i] == NULL;
    if (!bad) {
        memcpy(t->path, "demo (synthetic)", sizeof "demo (synthetic)");
        t->num_streams = NUM_MODELS;
        for (int i = 0; i < NUM_MODELS; i++)
            t->streams[i] = (uint64_t)i + 1; /* three distinct non-default streams */
        size_t pos[NUM_MODELS] = {0};
        uint64_t live = 0;
        for (size_t e = 0; e < total; e++) {
            int best = -1;
            for (int i = 0; i < NUM_MODELS; i++)
                if (pos[i] < models[i].n &&
                    (best < 0 || models[i].ev[pos[i]].time_us < models[best].ev[pos[best]].time_us))
                    best = i;
            if (best < 0)
                break; /* cannot happen: total counts every model's events */
            const model_event *me = &models[best].ev[pos[best]++];
            gp_trace_event *ev = &t->events[t->num_events++];
            (*event_model)[e] = (uint8_t)best;
            ev->time_us = me->time_us;
            ev->size = me->size;
            ev->stream = (uint16_t)best;
            ev->kind = me->kind;
            ev->reserved = 0;
            if (me->kind == GP_EV_ALLOC) {
                uint32_t slot = (uint32_t)t->num_allocs++;
                slot_of[best][me->handle] = slot;
                t->slot_stream[slot] = (uint16_t)best;
                t->slot_size[slot] = me->size;
                ev->slot = slot;
                ev->ptr = ((uint64_t)(best + 1) << 44) | ((uint64_t)me->handle << 9);
                live += me->size;
                if (live > t->peak_live_bytes)
                    t->peak_live_bytes = live;
            } else {
                ev->slot = slot_of[best][me->handle];
                ev->ptr = ((uint64_t)(best + 1) << 44) | ((uint64_t)me->handle << 9);
                t->num_frees++;
                live -= me->size;
            }
        }
        t->end_live_bytes = live;
        t->num_threads = 1;
    }
    for (int i = 0; i < NUM_MODELS; i++)
        free(slot_of[i]);
    if (bad) {
        gp_trace_free(t);
        free(*event_model);
        *event_model = NULL;
        return -1;
    }
    return 0;
}

/* ---- observation ------------------------------------------------------------------------------ */

#define PLOT_BUCKETS 1200u

typedef struct demo_obs {
    const gp_trace *trace;
    const uint8_t *event_model;
    model *models;
    size_t buckets;
    uint64_t t_end;
    double *x_ms, *reserved, *live, *model_live[NUM_MODELS];
    uint64_t reserved_below_live; /* events after which reserved < live (never, if the pool is right) */
    uint64_t device_calls_half;   /* device allocate + free calls up to the middle of the run */
    uint64_t device_calls_end;
    uint64_t peak_reserved, peak_live;
} demo_obs;

static void demo_observe(void *opaque, unsigned repeat, size_t index, uint64_t live, const gp_stats *st)
{
    (void)repeat;
    demo_obs *o = opaque;
    const gp_trace_event *ev = &o->trace->events[index];
    model *m = &o->models[o->event_model[index]];
    if (ev->kind == GP_EV_ALLOC) {
        m->live += ev->size;
        m->allocs++;
        if (m->live > m->peak_live)
            m->peak_live = m->live;
    } else if (ev->kind == GP_EV_FREE) {
        m->live -= ev->size;
        m->frees++;
    }
    if (st->reserved_bytes < live)
        o->reserved_below_live++;
    uint64_t calls = st->num_device_allocs + st->num_device_frees;
    if (ev->time_us * 2 <= o->t_end)
        o->device_calls_half = calls;
    o->device_calls_end = calls;
    if (st->reserved_bytes > o->peak_reserved)
        o->peak_reserved = st->reserved_bytes;
    if (live > o->peak_live)
        o->peak_live = live;
    size_t b = (size_t)((double)ev->time_us / (double)(o->t_end + 1) * (double)o->buckets);
    if (b >= o->buckets)
        b = o->buckets - 1;
    if ((double)st->reserved_bytes > o->reserved[b])
        o->reserved[b] = (double)st->reserved_bytes;
    if ((double)live > o->live[b])
        o->live[b] = (double)live;
    for (int i = 0; i < NUM_MODELS; i++)
        if ((double)o->models[i].live > o->model_live[i][b])
            o->model_live[i][b] = (double)o->models[i].live;
}

/* Buckets no event fell into (idle time) carry the previous bucket's values. */
static void fill_gaps(double *y, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (y[i] == 0.0)
            y[i] = y[i - 1];
}

/* ---- the command ------------------------------------------------------------------------------ */

int gp_cmd_demo(int argc, char **argv)
{
    const char *plot = "demo.svg";
    const char *dm = GP_REPLAY_DEFAULT_DEVICE_MEMORY;
    const char *conf = "";
    double seconds = 8.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(demo_usage, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gpupool demo: %s: unknown option or missing value\n\n%s", a, demo_usage);
            return 2;
        }
        if (strcmp(a, "--plot") == 0)
            plot = argv[++i];
        else if (strcmp(a, "--device-memory") == 0)
            dm = argv[++i];
        else if (strcmp(a, "--conf") == 0)
            conf = argv[++i];
        else if (strcmp(a, "--seconds") == 0) {
            char *end;
            seconds = strtod(argv[++i], &end);
            if (*end != '\0' || !(seconds >= 1.0 && seconds <= 3600.0)) {
                fprintf(stderr, "gpupool demo: --seconds %s: expected 1 to 3600\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "gpupool demo: unknown option %s\n\n%s", a, demo_usage);
            return 2;
        }
    }

    uint64_t duration_us = (uint64_t)(seconds * 1e6);
    model models[NUM_MODELS] = {
        {.name = "transformer-train", .what = "synthetic transformer training step (GPT-like, 12 x 2048, bf16)"},
        {.name = "cnn-infer", .what = "synthetic CNN inference loop (ResNet-50-like, batch 128)"},
        {.name = "llm-serve", .what = "synthetic bursty serving loop (KV caches that grow and go)"},
    };
    rng_state = 0x9E3779B97F4A7C15ull;
    gen_transformer(&models[0], duration_us);
    gen_cnn(&models[1], duration_us);
    gen_serving(&models[2], duration_us);
    int status = 0;
    for (int i = 0; i < NUM_MODELS; i++)
        if (models[i].oom) {
            fprintf(stderr, "gpupool demo: out of host memory while generating the workloads\n");
            status = 1;
        }
    gp_trace trace = {0};
    uint8_t *event_model = NULL;
    if (status == 0 && build_trace(models, &trace, &event_model) != 0) {
        fprintf(stderr, "gpupool demo: out of host memory\n");
        status = 1;
    }
    demo_obs obs = {.trace = &trace, .event_model = event_model, .models = models, .buckets = PLOT_BUCKETS,
                    .t_end = duration_us};
    obs.x_ms = calloc(PLOT_BUCKETS, sizeof(double));
    obs.reserved = calloc(PLOT_BUCKETS, sizeof(double));
    obs.live = calloc(PLOT_BUCKETS, sizeof(double));
    for (int i = 0; i < NUM_MODELS; i++)
        obs.model_live[i] = calloc(PLOT_BUCKETS, sizeof(double));
    if (!obs.x_ms || !obs.reserved || !obs.live || !obs.model_live[0] || !obs.model_live[1] ||
        !obs.model_live[2]) {
        fprintf(stderr, "gpupool demo: out of host memory\n");
        status = 1;
    }

    gp_replay_result *observed = malloc(sizeof *observed), *timed = malloc(sizeof *timed);
    char err[1024];
    if (status == 0 && (observed == NULL || timed == NULL)) {
        fprintf(stderr, "gpupool demo: out of host memory\n");
        status = 1;
    }
    if (status == 0) {
        gp_replay_options opt = {.device_memory = dm, .conf = conf, .repeat = 1, .observe = demo_observe,
                                 .opaque = &obs};
        if (gp_replay_run(&trace, &opt, observed, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool demo: %s\n", err);
            status = 1;
        }
    }
    if (status == 0) {
        gp_replay_options opt = {.device_memory = dm, .conf = conf, .repeat = 3};
        if (gp_replay_run(&trace, &opt, timed, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool demo: %s\n", err);
            status = 1;
        }
    }

    if (status == 0) {
        char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX], c[GP_SIZE_TEXT_MAX];
        printf("gpupool demo: three SYNTHETIC workloads (generated in code, not recorded) sharing one\n"
               "simulated %s GPU through one pool, %.0f simulated seconds, each model on its own stream.\n\n",
               dm, seconds);
        printf("%-18s  %-62s\n", "model", "workload");
        for (int i = 0; i < NUM_MODELS; i++)
            printf("%-18s  %-62s\n", models[i].name, models[i].what);
        printf("\n%-18s %10s %10s %12s %12s\n", "model", "allocs", "frees", "peak live", "live at end");
        for (int i = 0; i < NUM_MODELS; i++)
            printf("%-18s %10llu %10llu %12s %12s\n", models[i].name, (unsigned long long)models[i].allocs,
                   (unsigned long long)models[i].frees, gp_format_size(models[i].peak_live, a),
                   gp_format_size(models[i].live, b));
        uint64_t sum_peaks = models[0].peak_live + models[1].peak_live + models[2].peak_live;
        printf("\npool (one simulated GPU, %s)\n", dm);
        printf("  events                     %llu (%zu allocations, %zu frees)\n",
               (unsigned long long)observed->events, trace.num_allocs, trace.num_frees);
        printf("  peak live, all models      %s (sum of the models' own peaks: %s)\n",
               gp_format_size(observed->peak_live_bytes, a), gp_format_size(sum_peaks, c));
        printf("  peak reserved              %s\n", gp_format_size(observed->peak_reserved_bytes, b));
        printf("  reserved / live            %.3f\n", observed->reserved_over_live);
        printf("  device calls               %llu allocate, %llu free; %llu in the second half of the run\n",
               (unsigned long long)observed->device_alloc_calls, (unsigned long long)observed->device_free_calls,
               (unsigned long long)(obs.device_calls_end - obs.device_calls_half));
        printf("  failed allocations         %llu\n", (unsigned long long)observed->failed_allocations);
        printf("  reserved below live        %llu events (must be 0)\n",
               (unsigned long long)obs.reserved_below_live);
        printf("  host time                  %.1f ns/event (%.1f M events/s; median of 3 timed replays)\n",
               timed->host_ns_per_event, timed->host_ns_per_event > 0 ? 1e3 / timed->host_ns_per_event : 0.0);
        if (observed->failed_allocations)
            printf("  first failure              %s\n", observed->first_failure);

        for (size_t i = 0; i < PLOT_BUCKETS; i++)
            obs.x_ms[i] = (double)i * (double)duration_us / 1000.0 / PLOT_BUCKETS;
        fill_gaps(obs.reserved, PLOT_BUCKETS);
        fill_gaps(obs.live, PLOT_BUCKETS);
        for (int i = 0; i < NUM_MODELS; i++)
            fill_gaps(obs.model_live[i], PLOT_BUCKETS);
        char title0[256], title1[256];
        snprintf(title0, sizeof title0, "pool: peak reserved %s for peak live %s (ratio %.3f)",
                 gp_format_size(observed->peak_reserved_bytes, a), gp_format_size(observed->peak_live_bytes, b),
                 observed->reserved_over_live);
        snprintf(title1, sizeof title1, "live bytes per model (each on its own stream)");
        gp_svg_series s0[2] = {
            {.name = "reserved (device memory held by the pool)", .color = "#d62728", .y = obs.reserved, .filled = 1},
            {.name = "live, all models", .color = "#1f77b4", .y = obs.live},
        };
        gp_svg_series s1[NUM_MODELS] = {
            {.name = "transformer-train (synthetic)", .color = "#2ca02c", .y = obs.model_live[0]},
            {.name = "cnn-infer (synthetic)", .color = "#9467bd", .y = obs.model_live[1]},
            {.name = "llm-serve (synthetic)", .color = "#ff7f0e", .y = obs.model_live[2]},
        };
        gp_svg_panel panels[2] = {
            {.title = title0, .x_label = "simulated time (ms)", .x = obs.x_ms, .n = PLOT_BUCKETS, .series = s0,
             .num_series = 2},
            {.title = title1, .x_label = "simulated time (ms)", .x = obs.x_ms, .n = PLOT_BUCKETS, .series = s1,
             .num_series = NUM_MODELS},
        };
        if (gp_svg_write(plot, "gpupool demo: three synthetic workloads on one simulated GPU", panels, 2, err,
                         sizeof err) != 0) {
            fprintf(stderr, "gpupool demo: %s\n", err);
            status = 1;
        } else {
            printf("\nchart written to %s\n", plot);
        }
        if (observed->failed_allocations || obs.reserved_below_live)
            status = 1;
    }

    free(observed);
    free(timed);
    free(obs.x_ms);
    free(obs.reserved);
    free(obs.live);
    for (int i = 0; i < NUM_MODELS; i++) {
        free(obs.model_live[i]);
        free(models[i].ev);
        free(models[i].handle_size);
    }
    free(event_model);
    gp_trace_free(&trace);
    return status;
}
