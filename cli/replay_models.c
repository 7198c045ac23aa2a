/*
 * replay_models.c — `gpupool replay --model NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE] ...`: several
 * traces replayed together on one simulated GPU, interleaved by their Time column, each as one tenant
 * on streams of its own, so that budgets can be tried on real workloads: a model over its max shows
 * refused allocations while the others go on unaffected.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/config.h"
#include "base/format.h"
#include "gpupool.h"
#include "gpupool_sim.h"
#include "replay_models.h"
#include "trace.h"

typedef struct model {
    const char *spec;
    char name[GP_TENANT_NAME_MAX];
    char *path;
    gp_tenant_limits limits;
    gp_trace trace;
    void **ptrs;          /* per slot: the pool pointer, NULL when not live */
    gp_stream *streams;   /* per trace stream: its simulated stream, bound to the tenant */
    uint64_t live, peak_live, failed, quota, refused_other;
} model;

typedef struct merged_event {
    uint64_t time_us;
    uint32_t model, index;
} merged_event;

/* NAME=PATH[:max=SIZE][:high=SIZE][:min=SIZE]; 0 on success, else a message in err. */
static int parse_spec(model *m, const char *spec, char *err, size_t errlen)
{
    m->spec = spec;
    const char *eq = strchr(spec, '=');
    if (eq == NULL || eq == spec || (size_t)(eq - spec) >= sizeof m->name) {
        snprintf(err, errlen, "--model %s: expected NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE]", spec);
        return -1;
    }
    memcpy(m->name, spec, (size_t)(eq - spec));
    m->name[eq - spec] = '\0';
    m->path = strdup(eq + 1);
    if (m->path == NULL) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    /* limits are trailing ":key=value" items; the path is what stands before the first of them */
    static const char *const keys[] = {":max=", ":high=", ":min="};
    char *cut = NULL;
    for (int k = 0; k < 3; k++) {
        char *at = strstr(m->path, keys[k]);
        if (at != NULL && (cut == NULL || at < cut))
            cut = at;
    }
    if (cut == NULL)
        return 0;
    char *items = cut + 1;
    *cut = '\0';
    for (char *save = NULL, *item = strtok_r(items, ":", &save); item != NULL; item = strtok_r(NULL, ":", &save)) {
        char *value = strchr(item, '=');
        size_t bytes = 0;
        if (value == NULL || !gp_parse_size(value + 1, &bytes)) {
            snprintf(err, errlen, "--model %s: '%s' is not max=SIZE, high=SIZE or min=SIZE", spec, item);
            return -1;
        }
        *value = '\0';
        if (strcmp(item, "max") == 0)
            m->limits.max = bytes;
        else if (strcmp(item, "high") == 0)
            m->limits.high = bytes;
        else if (strcmp(item, "min") == 0)
            m->limits.min = bytes;
        else {
            snprintf(err, errlen, "--model %s: unknown limit '%s' (max, high or min)", spec, item);
            return -1;
        }
    }
    return 0;
}

static int compare_events(const void *a, const void *b)
{
    const merged_event *x = a, *y = b;
    if (x->time_us != y->time_us)
        return x->time_us < y->time_us ? -1 : 1;
    if (x->model != y->model)
        return x->model < y->model ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int gp_replay_models(const char **specs, int count, const char *device_memory, const char *conf, int json)
{
    char err[1024];
    model *models = calloc((size_t)count, sizeof *models);
    if (models == NULL)
        return fprintf(stderr, "gpupool replay: out of host memory\n"), 1;
    int status = 0;
    size_t total = 0;
    for (int i = 0; i < count && status == 0; i++) {
        if (parse_spec(&models[i], specs[i], err, sizeof err) != 0 ||
            gp_trace_read(&models[i].trace, models[i].path, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool replay: %s\n", err);
            status = 2;
            break;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(models[j].name, models[i].name) == 0) {
                fprintf(stderr, "gpupool replay: --model %s: the name %s is used twice\n", specs[i], models[i].name);
                status = 2;
            }
        total += models[i].trace.num_events;
    }
    merged_event *events = status == 0 ? malloc((total ? total : 1) * sizeof *events) : NULL;
    gp_pool *pool = NULL;
    gp_sim *sim = NULL;
    if (status == 0) {
        size_t n = 0;
        for (int i = 0; i < count; i++)
            for (size_t e = 0; e < models[i].trace.num_events; e++)
                events[n++] = (merged_event){models[i].trace.events[e].time_us, (uint32_t)i, (uint32_t)e};
        qsort(events, total, sizeof *events, compare_events);
        char cfg[2048];
        snprintf(cfg, sizeof cfg, "backend:sim,device_memory:%s%s%s", device_memory, conf[0] ? "," : "", conf);
        if (gp_pool_create(&pool, 0, NULL, cfg) != GP_OK || (sim = gp_sim_of(pool)) == NULL) {
            fprintf(stderr, "gpupool replay: cannot create a simulated pool with \"%s\": %s\n", cfg, gp_last_error());
            status = 1;
        }
    }
    for (int i = 0; i < count && status == 0; i++) {
        model *m = &models[i];
        m->ptrs = calloc(m->trace.num_allocs ? m->trace.num_allocs : 1, sizeof *m->ptrs);
        m->streams = calloc(m->trace.num_streams ? m->trace.num_streams : 1, sizeof *m->streams);
        if (m->ptrs == NULL || m->streams == NULL || gp_tenant_create(pool, m->name, &m->limits) != GP_OK) {
            fprintf(stderr, "gpupool replay: model %s: %s\n", m->name, gp_last_error());
            status = 1;
            break;
        }
        for (size_t s = 0; s < m->trace.num_streams; s++) {
            m->streams[s] = gp_sim_stream_create(sim);
            gp_tenant_bind_stream(pool, m->name, m->streams[s]);
        }
    }
    for (size_t e = 0; e < total && status == 0; e++) {
        model *m = &models[events[e].model];
        const gp_trace_event *ev = &m->trace.events[events[e].index];
        gp_stream stream = m->streams[ev->stream];
        if (ev->kind == GP_EV_ALLOC) {
            void *p = NULL;
            int rc = gp_alloc(pool, &p, ev->size, stream);
            if (rc == GP_OK) {
                m->ptrs[ev->slot] = p;
                m->live += ev->size;
                if (m->live > m->peak_live)
                    m->peak_live = m->live;
            } else {
                m->failed++;
                m->quota += rc == GP_ERR_QUOTA;
                m->refused_other += rc != GP_ERR_QUOTA;
            }
        } else if (ev->kind == GP_EV_FREE && m->ptrs[ev->slot] != NULL) {
            if (gp_free(pool, m->ptrs[ev->slot], stream) != GP_OK) {
                fprintf(stderr, "gpupool replay: model %s: free failed: %s\n", m->name, gp_last_error());
                status = 1;
            }
            m->live -= m->trace.slot_size[ev->slot];
            m->ptrs[ev->slot] = NULL;
        }
    }
    if (status == 0) {
        gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
        gp_get_stats(pool, &st);
        if (json)
            printf("{\"device_memory\":\"%s\",\"peak_reserved_bytes\":%llu,\"tenants\":[", device_memory,
                   (unsigned long long)st.reserved_bytes_peak);
        else
            printf("%-16s %12s %14s %14s %10s %10s  %s\n", "model", "max", "peak live", "peak held", "refused",
                   "other", "trace");
        for (int i = 0; i < count; i++) {
            model *m = &models[i];
            gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
            gp_tenant_get_stats(pool, m->name, &ts);
            char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX], c[GP_SIZE_TEXT_MAX];
            if (json)
                printf("%s{\"name\":\"%s\",\"trace\":\"%s\",\"max\":%llu,\"min\":%llu,\"peak_bytes\":%llu,"
                       "\"peak_live_bytes\":%llu,\"refusals\":%llu,\"failed_allocations\":%llu}",
                       i ? "," : "", m->name, m->path, (unsigned long long)m->limits.max,
                       (unsigned long long)m->limits.min, (unsigned long long)ts.held_bytes_peak,
                       (unsigned long long)m->peak_live, (unsigned long long)ts.refusals,
                       (unsigned long long)m->failed);
            else
                printf("%-16s %12s %14s %14s %10llu %10llu  %s\n", m->name,
                       m->limits.max ? gp_format_size(m->limits.max, a) : "none", gp_format_size(m->peak_live, b),
                       gp_format_size(ts.held_bytes_peak, c), (unsigned long long)m->quota,
                       (unsigned long long)m->refused_other, m->path);
        }
        if (json)
            printf("]}\n");
        else
            printf("pool: peak reserved %s on a %s simulated GPU\n",
                   gp_format_size(st.reserved_bytes_peak, (char[GP_SIZE_TEXT_MAX]){0}), device_memory);
        for (int i = 0; i < count; i++)
            for (size_t s = 0; s < models[i].trace.num_allocs; s++)
                if (models[i].ptrs[s] != NULL)
                    gp_free(pool, models[i].ptrs[s], models[i].streams[models[i].trace.slot_stream[s]]);
    }
    if (pool != NULL)
        gp_pool_destroy(pool, NULL);
    for (int i = 0; i < count; i++) {
        free(models[i].ptrs);
        free(models[i].streams);
        free(models[i].path);
        if (models[i].trace.events != NULL)
            gp_trace_free(&models[i].trace);
    }
    free(events);
    free(models);
    return status;
}
