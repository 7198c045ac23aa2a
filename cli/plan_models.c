/*
 * plan_models.c — `gpupool plan --gpu-memory SIZE --model NAME=TRACE ...`: do these models fit on one
 * GPU together, and with which budgets.
 *
 * Each trace is one model (one tenant of one pool, on streams of its own); they are replayed together,
 * interleaved by their Time column with each trace's clock starting at its first event (the models start
 * together), on a simulated device large enough that nothing fails. That gives each model's peak held
 * bytes and the pool's peak reserved. Under PyTorch each model has a caching allocator of its own (one
 * process each, or one stream each: free blocks never move between them) that never gives memory back,
 * so PyTorch's total is the sum of each model's peak reserved alone (cli/pytorch_policy.c).
 *
 * Which model does not fit: the models are added in the order given; the first whose addition takes the
 * replayed total over the GPU does not fit, by what the total then exceeds it by.
 * Budgets suggested (the tenant feature, gpupool.h): max = the model's peak held bytes with the margin
 * on top (room for the rounding and fragmentation it showed, plus the margin); min = its peak live bytes
 * (below that it cannot run its peak; as a guarantee, others may not take it), scaled down by one factor
 * for all models where needed so that every model can still reach its peak held while all the others
 * hold their mins: held_i + sum over j != i of min_j <= GPU (a min the others' peaks cannot leave room
 * for would have them refused). Then the models are replayed once more with those budgets on a device of
 * exactly --gpu-memory, and refusals and failures are reported: the budgets are checked, not only
 * computed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/format.h"
#include "gpupool.h"
#include "gpupool_sim.h"
#include "json_text.h"
#include "plan.h"
#include "pytorch_policy.h"
#include "trace.h"

#define MIB (1ull << 20)

typedef struct model {
    char name[GP_TENANT_NAME_MAX];
    const char *path;
    gp_trace trace;
    int loaded;
    uint64_t start_us;           /* the trace's first Time: replays start every model at 0 */
    uint64_t pytorch_reserved;   /* PyTorch's default policy, alone */
    uint64_t alone_reserved;     /* gpupool, alone in a pool */
    /* results of the latest replay_together */
    uint64_t held_peak, live_peak, refusals, failed;
} model;

typedef struct merged_event {
    uint64_t time_us;
    uint32_t model, index;
} merged_event;

static int compare_events(const void *a, const void *b)
{
    const merged_event *x = a, *y = b;
    if (x->time_us != y->time_us)
        return x->time_us < y->time_us ? -1 : 1;
    if (x->model != y->model)
        return x->model < y->model ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Replays models[0..count) together; limits may be NULL (no budgets). *reserved: the pool's peak. */
static int replay_together(model *models, int count, const gp_tenant_limits *limits, uint64_t device_memory,
                           uint64_t *reserved, char *err, size_t errlen)
{
    size_t total = 0;
    for (int i = 0; i < count; i++)
        total += models[i].trace.num_events;
    merged_event *events = malloc((total ? total : 1) * sizeof *events);
    void ***ptrs = calloc((size_t)count, sizeof *ptrs);
    gp_stream **streams = calloc((size_t)count, sizeof *streams);
    uint64_t *live = calloc((size_t)count, sizeof *live);
    gp_pool *pool = NULL;
    int rc = -1;
    if (events == NULL || ptrs == NULL || streams == NULL || live == NULL) {
        snprintf(err, errlen, "out of host memory");
        goto out;
    }
    size_t k = 0;
    for (int i = 0; i < count; i++)
        for (size_t e = 0; e < models[i].trace.num_events; e++)
            events[k++] = (merged_event){models[i].trace.events[e].time_us - models[i].start_us, (uint32_t)i,
                                         (uint32_t)e};
    qsort(events, total, sizeof *events, compare_events);
    char cfg[128];
    snprintf(cfg, sizeof cfg, "backend:sim,device_memory:%lluMiB", (unsigned long long)(device_memory / MIB));
    if (gp_pool_create(&pool, 0, NULL, cfg) != GP_OK) {
        snprintf(err, errlen, "cannot create a simulated pool with \"%s\": %s", cfg, gp_last_error());
        pool = NULL;
        goto out;
    }
    gp_sim *sim = gp_sim_of(pool);
    for (int i = 0; i < count; i++) {
        model *m = &models[i];
        m->held_peak = m->live_peak = m->refusals = m->failed = 0;
        ptrs[i] = calloc(m->trace.num_allocs ? m->trace.num_allocs : 1, sizeof **ptrs);
        streams[i] = calloc(m->trace.num_streams ? m->trace.num_streams : 1, sizeof **streams);
        if (ptrs[i] == NULL || streams[i] == NULL || gp_tenant_create(pool, m->name, limits ? &limits[i] : NULL) != GP_OK) {
            snprintf(err, errlen, "model %s: %s", m->name, ptrs[i] && streams[i] ? gp_last_error() : "out of host memory");
            goto out;
        }
        for (size_t s = 0; s < m->trace.num_streams; s++) {
            streams[i][s] = gp_sim_stream_create(sim);
            gp_tenant_bind_stream(pool, m->name, streams[i][s]);
        }
    }
    for (size_t e = 0; e < total; e++) {
        int i = (int)events[e].model;
        model *m = &models[i];
        const gp_trace_event *ev = &m->trace.events[events[e].index];
        if (ev->kind == GP_EV_ALLOC) {
            void *p = NULL;
            int arc = gp_alloc(pool, &p, ev->size, streams[i][ev->stream]);
            if (arc == GP_OK) {
                ptrs[i][ev->slot] = p;
                live[i] += ev->size;
                if (live[i] > m->live_peak)
                    m->live_peak = live[i];
            } else {
                m->failed++;
            }
        } else if (ev->kind == GP_EV_FREE && ptrs[i][ev->slot] != NULL) {
            if (gp_free(pool, ptrs[i][ev->slot], streams[i][ev->stream]) != GP_OK) {
                snprintf(err, errlen, "model %s: free failed: %s", m->name, gp_last_error());
                goto out;
            }
            ptrs[i][ev->slot] = NULL;
            live[i] -= ev->size;
        }
    }
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    gp_get_stats(pool, &st);
    *reserved = st.reserved_bytes_peak;
    for (int i = 0; i < count; i++) {
        gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
        gp_tenant_get_stats(pool, models[i].name, &ts);
        models[i].held_peak = ts.held_bytes_peak;
        models[i].refusals = ts.refusals;
    }
    rc = 0;
out:
    for (int i = 0; i < count && ptrs != NULL && streams != NULL; i++) {
        if (pool != NULL && ptrs[i] != NULL && streams[i] != NULL)
            for (size_t s = 0; s < models[i].trace.num_allocs; s++)
                if (ptrs[i][s] != NULL)
                    gp_free(pool, ptrs[i][s], streams[i][models[i].trace.slot_stream[s]]);
        free(ptrs[i]);
        free(streams[i]);
    }
    if (pool != NULL)
        gp_pool_destroy(pool, NULL);
    free(ptrs);
    free(streams);
    free(live);
    free(events);
    return rc;
}

static uint64_t round_up_mib(double bytes)
{
    uint64_t b = (uint64_t)bytes;
    return (b + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
}

int gp_plan_models(const char **specs, int count, uint64_t gpu_memory, double margin, int json)
{
    char err[1024];
    int status = 0;
    model *models = calloc((size_t)count, sizeof *models);
    gp_tenant_limits *limits = calloc((size_t)count, sizeof *limits);
    uint64_t *prefix = calloc((size_t)count, sizeof *prefix);
    if (models == NULL || limits == NULL || prefix == NULL) {
        fprintf(stderr, "gpupool plan: out of host memory\n");
        status = 1;
        goto out;
    }
    uint64_t sum_live = 0;
    for (int i = 0; i < count && status == 0; i++) {
        model *m = &models[i];
        const char *eq = strchr(specs[i], '=');
        if (eq == NULL || eq == specs[i] || (size_t)(eq - specs[i]) >= sizeof m->name || eq[1] == '\0') {
            fprintf(stderr, "gpupool plan: --model %s: expected NAME=TRACE (a name of 1 to %d bytes)\n", specs[i],
                    GP_TENANT_NAME_MAX - 1);
            status = 2;
            break;
        }
        memcpy(m->name, specs[i], (size_t)(eq - specs[i]));
        m->path = eq + 1;
        for (int j = 0; j < i; j++)
            if (strcmp(models[j].name, m->name) == 0) {
                fprintf(stderr, "gpupool plan: --model %s: the name %s is given twice\n", specs[i], m->name);
                status = 2;
            }
        if (status != 0)
            break;
        if (gp_trace_read(&m->trace, m->path, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: --model %s: %s\n", specs[i], err);
            status = 2;
            break;
        }
        m->loaded = 1;
        m->start_us = m->trace.num_events ? m->trace.events[0].time_us : 0;
        for (size_t e = 0; e < m->trace.num_events; e++)
            if (m->trace.events[e].time_us < m->start_us)
                m->start_us = m->trace.events[e].time_us;
        gp_pytorch_result pr;
        if (gp_pytorch_replay(&m->trace, GP_PYTORCH_DEFAULT, &pr, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool plan: --model %s: %s\n", specs[i], err);
            status = 1;
            break;
        }
        m->pytorch_reserved = pr.peak_reserved_bytes;
        sum_live += m->trace.peak_live_bytes;
    }
    if (status != 0)
        goto out;
    /* big enough that nothing fails: every model's PyTorch figure (which never shares) and some */
    uint64_t roomy = 0;
    for (int i = 0; i < count; i++)
        roomy += models[i].pytorch_reserved * 2;
    roomy = roomy > gpu_memory ? roomy : gpu_memory;
    roomy = (roomy + 1024 * MIB) / MIB * MIB;
    for (int i = 0; i < count && status == 0; i++) {
        uint64_t r = 0;
        if (replay_together(&models[i], 1, NULL, roomy, &r, err, sizeof err) != 0)
            status = 1;
        else
            models[i].alone_reserved = r;
    }
    /* the first k models together, k = 1..count: where the total passes the GPU */
    int first_over = -1, first_over_pytorch = -1;
    uint64_t pytorch_sum = 0, together = 0;
    for (int k = 1; k <= count && status == 0; k++) {
        if (replay_together(models, k, NULL, roomy, &prefix[k - 1], err, sizeof err) != 0) {
            status = 1;
            break;
        }
        pytorch_sum += models[k - 1].pytorch_reserved;
        if (first_over < 0 && prefix[k - 1] > gpu_memory)
            first_over = k - 1;
        if (first_over_pytorch < 0 && pytorch_sum > gpu_memory)
            first_over_pytorch = k - 1;
    }
    if (status != 0) {
        fprintf(stderr, "gpupool plan: %s\n", err);
        goto out;
    }
    together = prefix[count - 1]; /* the last replay was of all of them: held peaks are the full run's */
    uint64_t sum_min = 0, sum_max = 0;
    double min_factor = 1.0;
    for (int i = 0; i < count; i++) {
        double others = (double)sum_live - (double)models[i].trace.peak_live_bytes;
        double room = (double)gpu_memory - (double)models[i].held_peak;
        if (others > 0) {
            double f = room > 0 ? room / others : 0.0;
            min_factor = f < min_factor ? f : min_factor;
        }
    }
    for (int i = 0; i < count; i++) {
        /* mins rounded down to 2 MiB so that the condition above still holds */
        uint64_t mn = (uint64_t)((double)models[i].trace.peak_live_bytes * min_factor);
        limits[i].min = mn / (2 * MIB) * (2 * MIB);
        limits[i].max = round_up_mib((double)models[i].held_peak * (1.0 + margin));
        if (limits[i].max < limits[i].min)
            limits[i].max = limits[i].min;
        sum_min += limits[i].min;
        sum_max += limits[i].max;
    }
    /* the check: with those budgets on the GPU itself (when the mins fit it at all) */
    uint64_t checked_reserved = 0, refusals = 0, failures = 0;
    int checked = 0;
    model *held = malloc((size_t)count * sizeof *held);
    if (held == NULL) {
        status = 1;
        goto out;
    }
    memcpy(held, models, (size_t)count * sizeof *held);
    if (sum_min <= gpu_memory && replay_together(models, count, limits, gpu_memory, &checked_reserved, err, sizeof err) == 0) {
        checked = 1;
        for (int i = 0; i < count; i++) {
            refusals += models[i].refusals;
            failures += models[i].failed;
        }
    }
    for (int i = 0; i < count; i++) { /* report the unbudgeted run's peaks, keep the checked run's counts */
        uint64_t r = models[i].refusals, f = models[i].failed;
        models[i] = held[i];
        models[i].refusals = checked ? r : 0;
        models[i].failed = checked ? f : 0;
    }
    free(held);
    char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX], c[GP_SIZE_TEXT_MAX], d[GP_SIZE_TEXT_MAX], e[GP_SIZE_TEXT_MAX],
        f2[GP_SIZE_TEXT_MAX];
    if (json) {
        printf("{\"gpu_memory\":%llu,\"margin\":%.4f,\"min_factor\":%.4f,\"models\":[", (unsigned long long)gpu_memory,
               margin, min_factor);
        for (int i = 0; i < count; i++) {
            const model *m = &models[i];
            printf("%s{\"name\":", i ? "," : "");
            gp_json_string(stdout, m->name);
            printf(",\"trace\":");
            gp_json_string(stdout, m->path);
            printf(",\"peak_live_bytes\":%llu,\"peak_held_bytes\":%llu,"
                   "\"alone_peak_reserved_bytes\":%llu,\"pytorch_peak_reserved_bytes\":%llu,\"suggested_max\":%llu,"
                   "\"suggested_min\":%llu,\"refusals_with_budgets\":%llu,\"failed_with_budgets\":%llu,\"fits\":%s}",
                   (unsigned long long)m->trace.peak_live_bytes,
                   (unsigned long long)m->held_peak, (unsigned long long)m->alone_reserved,
                   (unsigned long long)m->pytorch_reserved, (unsigned long long)limits[i].max,
                   (unsigned long long)limits[i].min, (unsigned long long)m->refusals, (unsigned long long)m->failed,
                   first_over >= 0 && i >= first_over ? "false" : "true");
        }
        printf("],\"total\":{\"gpupool_peak_reserved_bytes\":%llu,\"pytorch_peak_reserved_bytes\":%llu,"
               "\"peak_live_bytes_sum\":%llu,\"suggested_min_sum\":%llu,\"suggested_max_sum\":%llu},",
               (unsigned long long)together, (unsigned long long)pytorch_sum, (unsigned long long)sum_live,
               (unsigned long long)sum_min, (unsigned long long)sum_max);
        if (first_over >= 0)
        {
            printf("\"does_not_fit\":{\"model\":");
            gp_json_string(stdout, models[first_over].name);
            printf(",\"over_by_bytes\":%llu},", (unsigned long long)(prefix[first_over] - gpu_memory));
        }
        else
            printf("\"does_not_fit\":null,");
        if (first_over_pytorch >= 0) {
            uint64_t s = 0;
            for (int i = 0; i <= first_over_pytorch; i++)
                s += models[i].pytorch_reserved;
            printf("\"pytorch_does_not_fit\":{\"model\":");
            gp_json_string(stdout, models[first_over_pytorch].name);
            printf(",\"over_by_bytes\":%llu},", (unsigned long long)(s - gpu_memory));
        } else {
            printf("\"pytorch_does_not_fit\":null,");
        }
        printf("\"budget_check\":{\"run\":%s,\"peak_reserved_bytes\":%llu,\"refusals\":%llu,\"failed_allocations\":%llu}}\n",
               checked ? "true" : "false", (unsigned long long)checked_reserved, (unsigned long long)refusals,
               (unsigned long long)failures);
    } else {
        printf("%-14s %11s %11s %12s %12s %11s %11s  %s\n", "model", "peak live", "held peak", "alone (gp)",
               "PyTorch", "max", "min", "trace");
        for (int i = 0; i < count; i++) {
            const model *m = &models[i];
            printf("%-14s %11s %11s %12s %12s %11s %11s  %s\n", m->name, gp_format_size(m->trace.peak_live_bytes, a),
                   gp_format_size(m->held_peak, b), gp_format_size(m->alone_reserved, c),
                   gp_format_size(m->pytorch_reserved, d), gp_format_size(limits[i].max, e),
                   gp_format_size(limits[i].min, f2), m->path);
        }
        printf("together on one pool: gpupool %s, PyTorch %s (one caching allocator per model), on a %s GPU\n",
               gp_format_size(together, a), gp_format_size(pytorch_sum, b), gp_format_size(gpu_memory, c));
        printf("budgets: max = held peak + %.0f%%, min = peak live", 100 * margin);
        if (min_factor < 1.0)
            printf(" x %.2f (so that each model can reach its peak while the others hold their mins)", min_factor);
        printf("; sums: max %s, min %s\n", gp_format_size(sum_max, a), gp_format_size(sum_min, b));
        if (first_over >= 0)
            printf("does not fit under gpupool: %s (with the models before it the pool needs %s, %s over)\n",
                   models[first_over].name, gp_format_size(prefix[first_over], a),
                   gp_format_size(prefix[first_over] - gpu_memory, b));
        else
            printf("all fit under gpupool, %s to spare\n", gp_format_size(gpu_memory - together, a));
        if (first_over_pytorch >= 0) {
            uint64_t s = 0;
            for (int i = 0; i <= first_over_pytorch; i++)
                s += models[i].pytorch_reserved;
            printf("does not fit under PyTorch: %s (%s over)\n", models[first_over_pytorch].name,
                   gp_format_size(s - gpu_memory, a));
        } else {
            printf("all fit under PyTorch, %s to spare\n", gp_format_size(gpu_memory - pytorch_sum, a));
        }
        if (checked)
            printf("check: replayed with these budgets on the %s GPU: peak reserved %s, %llu refused, %llu failed\n",
                   gp_format_size(gpu_memory, a), gp_format_size(checked_reserved, b), (unsigned long long)refusals,
                   (unsigned long long)failures);
        if (checked && refusals + failures > 0)
            printf("the budgets do not hold on this GPU as replayed: raise the GPU, lower --margin, or leave a "
                   "model out\n");
        else
            printf("check: not run, the mins alone (%s) exceed the GPU\n", gp_format_size(sum_min, a));
    }
out:
    for (int i = 0; i < count && models != NULL; i++)
        if (models[i].loaded)
            gp_trace_free(&models[i].trace);
    free(models);
    free(limits);
    free(prefix);
    return status;
}
