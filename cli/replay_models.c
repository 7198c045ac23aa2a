/*
 * replay_models.c — `gpupool replay --model NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE] ...`: several
 * traces replayed together on one simulated GPU, interleaved by their Time column, each as one tenant
 * on streams of its own, so that budgets can be tried on real workloads: a model over its max shows
 * refused allocations while the others go on unaffected.
 *
 * With --processes each model runs in a process of its own (fork), each with its own simulated GPU,
 * all against one per-GPU ledger (pool/provider/ledger.h), as a serving deployment with one process
 * per model or replica would: a model's limits are then GPU-wide budgets in the ledger, and a name
 * given twice is one tenant in two processes (two replicas sharing one budget). The parent makes the
 * ledger, starts the children, prints each child's report and the ledger's GPU-wide peak per tenant.
 */
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/config.h"
#include "base/format.h"
#include "gpupool.h"
#include "gpupool_sim.h"
#include "provider/ledger.h"
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

/* s as a JSON string on stdout (format.c's escaping). */
static void put_json_string(const char *s)
{
    size_t n = gp_format_json_string(NULL, 0, s);
    char *quoted = malloc(n + 1);
    if (quoted == NULL) {
        fputs("null", stdout);
        return;
    }
    gp_format_json_string(quoted, n + 1, s);
    fputs(quoted, stdout);
    free(quoted);
}

typedef struct merged_event {
    uint64_t time_us;
    uint32_t model, index;
} merged_event;

/* NAME=PATH[:max=SIZE][:high=SIZE][:min=SIZE]; 0 on success, else a message in err. */
static int parse_spec(model *m, const char *spec, char *err, size_t errlen)
{
    m->spec = spec;
    const char *eq = strchr(spec, '=');
    if (eq == NULL || eq == spec) {
        snprintf(err, errlen, "--model %s: expected NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE]", spec);
        return -1;
    }
    if ((size_t)(eq - spec) >= sizeof m->name) {
        snprintf(err, errlen, "--model %.*s...: the model name is %zu bytes; a tenant name is 1 to %zu", 16, spec,
                 (size_t)(eq - spec), sizeof m->name - 1);
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
    if (cut != NULL)
        *cut = '\0';
    if (m->path[0] == '\0') {
        snprintf(err, errlen, "--model %s: no trace path after '=' (expected NAME=TRACE)", spec);
        return -1;
    }
    if (cut == NULL)
        return 0;
    char *items = cut + 1;
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

static int replay_in_processes(const char **specs, int count, const char *device_memory, const char *conf, int json,
                               double speed);

/* Sleeps until trace time `t_us` (relative to `t0_us`, divided by `speed`) has passed since `start`. */
static void keep_pace(const struct timespec *start, uint64_t t0_us, uint64_t t_us, double speed)
{
    double due = (double)(t_us > t0_us ? t_us - t0_us : 0) / 1e6 / speed;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double elapsed = (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
    if (due > elapsed + 1e-4) {
        double wait = due - elapsed;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

int gp_replay_models(const char **specs, int count, const char *device_memory, const char *conf, int json,
                     const char *snapshot, unsigned snapshot_flags, int processes, double speed)
{
    if (processes && snapshot != NULL)
        return fprintf(stderr, "gpupool replay: --snapshot writes one pool: not with --processes\n"), 2;
    if (processes)
        return replay_in_processes(specs, count, device_memory, conf, json, speed);
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
    if (status == 0 && events == NULL) {
        fprintf(stderr, "gpupool replay: out of host memory for %zu events\n", total);
        status = 1;
    }
    gp_pool *pool = NULL;
    gp_sim *sim = NULL;
    if (status == 0) {
        size_t n = 0;
        for (int i = 0; i < count; i++)
            for (size_t e = 0; e < models[i].trace.num_events; e++)
                events[n++] = (merged_event){models[i].trace.events[e].time_us, (uint32_t)i, (uint32_t)e};
        qsort(events, total, sizeof *events, compare_events);
        /* room for every model's streams (max_streams counts (stream, tenant) pairs; default 256), unless
         * --conf sets max_streams itself */
        size_t streams = 0;
        for (int i = 0; i < count; i++)
            streams += models[i].trace.num_streams;
        char cfg[2048];
        snprintf(cfg, sizeof cfg, "backend:sim,device_memory:%s,max_streams:%zu%s%s", device_memory,
                 streams > 256 ? streams : 256, conf[0] ? "," : "", conf);
        if (gp_pool_create(&pool, 0, NULL, cfg) != GP_OK || (sim = gp_sim_of(pool)) == NULL) {
            fprintf(stderr, "gpupool replay: cannot create a simulated pool with \"%s\": %s\n", cfg, gp_last_error());
            status = 1;
        } else if (snapshot != NULL && gp_history_record(pool, 4 * total + 4096) != GP_OK) {
            fprintf(stderr, "gpupool replay: --snapshot: %s\n", gp_last_error());
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
    int with_ledger = strstr(conf, "ledger:") != NULL;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uint64_t t0 = total > 0 && events != NULL ? models[events[0].model].trace.events[events[0].index].time_us : 0;
    for (size_t e = 0; e < total && status == 0; e++) {
        if (speed > 0) {
            if (with_ledger) /* idle until the next event: answer requests to trim, as a server's idle loop would */
                gp_maintain(pool, NULL);
            keep_pace(&start, t0, models[events[e].model].trace.events[events[e].index].time_us, speed);
        }
        if (with_ledger && e % 256 == 0)
            gp_maintain(pool, NULL); /* answers other processes' requests to trim, publishes figures */
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
                /* the block stays live; the end of the replay frees it on its own stream */
                fprintf(stderr, "gpupool replay: model %s: free failed: %s\n", m->name, gp_last_error());
                status = 1;
                continue;
            }
            m->live -= m->trace.slot_size[ev->slot];
            m->ptrs[ev->slot] = NULL;
        }
    }
    if (status != 0 && pool != NULL) /* a failed free stopped the replay: free what is live */
        for (int i = 0; i < count; i++)
            for (size_t s = 0; models[i].ptrs != NULL && s < models[i].trace.num_allocs; s++)
                if (models[i].ptrs[s] != NULL)
                    gp_free(pool, models[i].ptrs[s], models[i].streams[models[i].trace.slot_stream[s]]);
    if (status == 0 && snapshot != NULL && gp_snapshot_write(&pool, 1, snapshot, snapshot_flags) != GP_OK) {
        fprintf(stderr, "gpupool replay: --snapshot: %s\n", gp_last_error());
        status = 1;
    }
    if (status == 0) {
        gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
        gp_get_stats(pool, &st);
        if (json) {
            fputs("{\"device_memory\":", stdout);
            put_json_string(device_memory);
            printf(",\"peak_reserved_bytes\":%llu,\"tenants\":[", (unsigned long long)st.reserved_bytes_peak);
        }
        else
            printf("%-16s %12s %14s %14s %10s %10s  %s\n", "model", "max", "peak live", "peak held", "refused",
                   "other", "trace");
        for (int i = 0; i < count; i++) {
            model *m = &models[i];
            gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
            gp_tenant_get_stats(pool, m->name, &ts);
            char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX], c[GP_SIZE_TEXT_MAX];
            if (json) {
                fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
                put_json_string(m->name);
                fputs(",\"trace\":", stdout);
                put_json_string(m->path);
                printf(",\"max\":%llu,\"min\":%llu,\"peak_bytes\":%llu,"
                       "\"peak_live_bytes\":%llu,\"refusals\":%llu,\"failed_allocations\":%llu}",
                       (unsigned long long)m->limits.max,
                       (unsigned long long)m->limits.min, (unsigned long long)ts.held_bytes_peak,
                       (unsigned long long)m->peak_live, (unsigned long long)ts.refusals,
                       (unsigned long long)m->failed);
            } else {
                printf("%-16s %12s %14s %14s %10llu %10llu  %s\n", m->name,
                       m->limits.max ? gp_format_size(m->limits.max, a) : "none", gp_format_size(m->peak_live, b),
                       gp_format_size(ts.held_bytes_peak, c), (unsigned long long)m->quota,
                       (unsigned long long)m->refused_other, m->path);
            }
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

/* ---- one process per model ---------------------------------------------------------------------- */

static int replay_in_processes(const char **specs, int count, const char *device_memory, const char *conf, int json,
                               double speed)
{
    size_t capacity = 0;
    if (!gp_parse_size(device_memory, &capacity)) {
        fprintf(stderr, "gpupool replay: --device-memory %s is not a size\n", device_memory);
        return 2;
    }
    /* The ledger: the one the configuration names, else one of this replay's own. */
    char ledger_value[64] = "", shm[GP_LEDGER_NAME_MAX];
    const char *at = strstr(conf, "ledger:");
    if (at != NULL) {
        size_t n = strcspn(at + 7, ",");
        snprintf(ledger_value, sizeof ledger_value, "%.*s", (int)n, at + 7);
    } else {
        snprintf(ledger_value, sizeof ledger_value, "replay-%d", (int)getpid());
    }
    gp_ledger *ledger = NULL;
    if (gp_ledger_shm_name(ledger_value, 0, NULL, shm) != GP_OK || gp_ledger_open(&ledger, shm, capacity) != GP_OK) {
        fprintf(stderr, "gpupool replay --processes: %s\n", gp_last_error());
        return 1;
    }
    /* Each model's limits become its GPU-wide budget; the children take them from the ledger. */
    char (*child_conf)[4096] = calloc((size_t)count, sizeof *child_conf);
    int (*pipes)[2] = calloc((size_t)count, sizeof *pipes);
    pid_t *pids = calloc((size_t)count, sizeof *pids);
    int status = child_conf != NULL && pipes != NULL && pids != NULL ? 0 : 1;
    for (int i = 0; i < count && status == 0; i++) {
        model m;
        memset(&m, 0, sizeof m);
        char err[1024];
        if (parse_spec(&m, specs[i], err, sizeof err) != 0) {
            fprintf(stderr, "gpupool replay: %s\n", err);
            status = 2;
        } else if ((m.limits.max | m.limits.high | m.limits.min) != 0 &&
                   gp_ledger_set_budget(ledger, m.name, m.limits.max, m.limits.high, m.limits.min,
                                        GP_LEDGER_SET_MAX | GP_LEDGER_SET_HIGH | GP_LEDGER_SET_MIN) != GP_OK) {
            fprintf(stderr, "gpupool replay: --model %s: %s\n", specs[i], gp_last_error());
            status = 2;
        }
        snprintf(child_conf[i], sizeof child_conf[i], "%s%sledger:%s", at != NULL ? "" : conf,
                 at != NULL || conf[0] == '\0' ? "" : ",", ledger_value);
        if (at != NULL)
            snprintf(child_conf[i], sizeof child_conf[i], "%s", conf);
        free(m.path);
    }
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < count && status == 0; i++) {
        if (pipe(pipes[i]) != 0) {
            status = 1;
            break;
        }
        pids[i] = fork();
        if (pids[i] == 0) {
            close(pipes[i][0]);
            dup2(pipes[i][1], STDOUT_FILENO);
            close(pipes[i][1]);
            gp_ledger_close(ledger);
            /* the model's limits are in the ledger: the child's tenant itself has none */
            char spec[4096];
            snprintf(spec, sizeof spec, "%s", specs[i]);
            char *cut = strstr(spec, ":max=");
            char *c2 = strstr(spec, ":high="), *c3 = strstr(spec, ":min=");
            if (c2 != NULL && (cut == NULL || c2 < cut))
                cut = c2;
            if (c3 != NULL && (cut == NULL || c3 < cut))
                cut = c3;
            if (cut != NULL)
                *cut = '\0';
            const char *one[] = {spec};
            int rc = gp_replay_models(one, 1, device_memory, child_conf[i], json, NULL, 0, 0, speed);
            fflush(stdout);
            _exit(rc);
        }
        close(pipes[i][1]);
        if (pids[i] < 0) {
            status = 1;
            break;
        }
    }
    if (json)
        printf("{\"ledger\":\"%s\",\"device_memory\":\"%s\",\"processes\":[", shm, device_memory);
    for (int i = 0; i < count && pids != NULL; i++) {
        if (pids[i] <= 0)
            continue;
        char *out = NULL;
        size_t len = 0, cap = 0;
        char buf[4096];
        ssize_t n;
        while ((n = read(pipes[i][0], buf, sizeof buf)) > 0) {
            if (len + (size_t)n + 1 > cap) {
                cap = (len + (size_t)n + 1) * 2;
                char *grown = realloc(out, cap);
                if (grown == NULL)
                    break;
                out = grown;
            }
            memcpy(out + len, buf, (size_t)n);
            len += (size_t)n;
        }
        close(pipes[i][0]);
        int ws = 0;
        waitpid(pids[i], &ws, 0);
        int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
        if (code != 0 && status == 0)
            status = code;
        while (len > 0 && out[len - 1] == '\n')
            len--;
        if (json)
            printf("%s{\"pid\":%d,\"exit\":%d,\"model\":\"%s\",\"report\":%.*s}", i ? "," : "", (int)pids[i], code,
                   specs[i], len ? (int)len : 4, len ? out : "null");
        else
            printf("-- process %d: --model %s (exit %d; its limits are GPU-wide, in the ledger)\n%.*s\n",
                   (int)pids[i], specs[i], code, (int)len, out ? out : "");
        free(out);
    }
    gp_ledger_view *v = malloc(sizeof *v);
    if (v != NULL && gp_ledger_view_read(ledger, v, true) == GP_OK) {
        if (json)
            printf("],\"tenants\":[");
        else
            printf("-- ledger %s: GPU-wide peak held per tenant (all processes together)\n", shm);
        int first = 1;
        for (unsigned t = 0; t < v->num_tenants; t++) {
            if (v->tenants[t].name[0] == '\0')
                continue;
            char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
            if (json)
                printf("%s{\"name\":\"%s\",\"max\":%llu,\"peak_held_bytes\":%llu}", first ? "" : ",",
                       v->tenants[t].name, (unsigned long long)v->tenants[t].max,
                       (unsigned long long)v->tenants[t].peak);
            else
                printf("%-16s max %10s  peak held %10s\n", v->tenants[t].name,
                       v->tenants[t].max ? gp_format_size((size_t)v->tenants[t].max, a) : "none",
                       gp_format_size((size_t)v->tenants[t].peak, b));
            first = 0;
        }
        if (json)
            printf("],\"refused_charges\":%llu,\"reclaimed_bytes\":%llu}\n", (unsigned long long)v->refusals,
                   (unsigned long long)v->reclaimed_bytes);
    } else if (json) {
        printf("]}\n");
    }
    free(v);
    gp_ledger_close(ledger);
    if (at == NULL)
        gp_ledger_unlink(shm); /* this replay's own ledger */
    free(child_conf);
    free(pipes);
    free(pids);
    return status;
}
