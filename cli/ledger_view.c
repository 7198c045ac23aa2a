/*
 * ledger_view.c — the per-GPU ledger shown to people and programs: the `gpupool top` table, its JSON
 * (`--once --json`), and the Prometheus text exposition format served by `gpupool exporter`. All three
 * print one gp_ledger_view (a read of the ledger, pool/provider/ledger.h); none writes to the ledger.
 *
 * Figures: held = device memory charged to a tenant (what the budgets count); live = bytes handed
 * out, and cached = held - live, as each pool last published them (on its slow paths and in
 * gp_maintain, at most every 10 ms), so a pool that makes no slow-path call shows figures as of its
 * last one ("seen" says how long ago).
 */
#include "ledger_view.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/format.h"

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

static const char *size_or_none(uint64_t bytes, char *buf)
{
    return bytes ? gp_format_size((size_t)bytes, buf) : "-";
}

static double age_seconds(uint64_t published_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    return now > published_ns ? (double)(now - published_ns) / 1e9 : 0.0;
}

/* The device label: the ledger's name without "/gpupool.". */
const char *gp_ledger_view_device(const gp_ledger_view *v)
{
    const char *prefix = "/gpupool.";
    return strncmp(v->name, prefix, strlen(prefix)) == 0 ? v->name + strlen(prefix) : v->name;
}

void gp_ledger_view_print_table(FILE *f, const gp_ledger_view *v)
{
    char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX], c[GP_SIZE_TEXT_MAX], d[GP_SIZE_TEXT_MAX], e[GP_SIZE_TEXT_MAX],
        g[GP_SIZE_TEXT_MAX];
    time_t now = time(NULL);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    fprintf(f, "gpupool top  ledger %s (layout v%u)  device %s  charged %s (%.1f%%)  %u pools  %s\n", v->name,
            v->version, gp_format_size((size_t)v->capacity, a), gp_format_size((size_t)v->device_held, b),
            v->capacity ? 100.0 * (double)v->device_held / (double)v->capacity : 0.0, v->num_pools, when);
    fprintf(f, "charges %llu  refused attempts %llu  trim requests %llu  reclaimed %s from %llu dead pools  lock recoveries %llu\n\n",
            (unsigned long long)v->charges, (unsigned long long)v->refusals, (unsigned long long)v->pressure_asks,
            gp_format_size((size_t)v->reclaimed_bytes, a), (unsigned long long)v->reclaimed_pools,
            (unsigned long long)v->lock_recoveries);
    fprintf(f, "%-16s %10s %10s %10s %10s %10s %10s %10s %9s\n", "TENANT", "MAX", "HIGH", "MIN", "HELD", "LIVE",
            "CACHED", "PEAK", "REFUSED");
    for (unsigned t = 0; t < v->num_tenants; t++) {
        const gp_ledger_view_tenant *vt = &v->tenants[t];
        if (vt->name[0] == '\0')
            continue;
        fprintf(f, "%-16s %10s %10s %10s %10s %10s %10s %10s %9llu\n", vt->name, size_or_none(vt->max, a),
                size_or_none(vt->high, b), size_or_none(vt->min, c), gp_format_size((size_t)vt->held, d),
                gp_format_size((size_t)vt->live, e), gp_format_size((size_t)sat_sub(vt->held, vt->live), g),
                gp_format_size((size_t)vt->peak, (char[GP_SIZE_TEXT_MAX]){0}), (unsigned long long)vt->refusals);
    }
    fprintf(f, "\n%-8s %-14s %4s %-16s %10s %10s %10s %10s %8s %6s %9s %7s\n", "PID", "COMMAND", "DEV", "TENANT",
            "HELD", "LIVE", "CACHED", "PEAK", "REFUSED", "OOMS", "DEV.CALLS", "SEEN");
    for (unsigned i = 0; i < v->num_pools; i++) {
        const gp_ledger_view_pool *vp = &v->pools[i];
        uint64_t live = 0;
        for (unsigned t = 0; t < v->num_tenants; t++)
            live += vp->charges[t].live;
        fprintf(f, "%-8d %-14.14s %4d %-16s %10s %10s %10s %10s %8s %6llu %9llu %6.1fs%s\n", vp->pid, vp->command,
                vp->device, vp->alive ? "(all)" : "(DEAD)", gp_format_size((size_t)vp->device_held, a),
                gp_format_size((size_t)live, b), gp_format_size((size_t)sat_sub(vp->device_held, live), c),
                gp_format_size((size_t)vp->device_peak, d), "", (unsigned long long)vp->ooms,
                (unsigned long long)vp->device_allocs + vp->device_frees, age_seconds(vp->published_ns),
                vp->pressure_pending ? " asked to trim" : "");
        for (unsigned t = 0; t < v->num_tenants; t++) {
            const gp_ledger_view_charge *ch = &vp->charges[t];
            if (ch->held == 0 && ch->live == 0 && ch->refusals == 0 && ch->peak == 0)
                continue;
            fprintf(f, "%-8s %-14s %4s %-16s %10s %10s %10s %10s %8llu\n", "", "", "", v->tenants[t].name,
                    gp_format_size((size_t)ch->held, a), gp_format_size((size_t)ch->live, b),
                    gp_format_size((size_t)sat_sub(ch->held, ch->live), c), gp_format_size((size_t)ch->peak, d),
                    (unsigned long long)ch->refusals);
        }
    }
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

void gp_ledger_view_print_json(FILE *f, const gp_ledger_view *v)
{
    fputs("{\"ledger\":", f);
    json_string(f, v->name);
    fprintf(f,
            ",\"version\":%u,\"capacity_bytes\":%llu,\"held_bytes\":%llu,\"charges\":%llu,\"refused_charges\":%llu,"
            "\"trim_requests\":%llu,\"reclaimed_bytes\":%llu,\"reclaimed_pools\":%llu,\"lock_recoveries\":%llu,"
            "\"tenants\":[",
            v->version, (unsigned long long)v->capacity, (unsigned long long)v->device_held,
            (unsigned long long)v->charges, (unsigned long long)v->refusals, (unsigned long long)v->pressure_asks,
            (unsigned long long)v->reclaimed_bytes, (unsigned long long)v->reclaimed_pools,
            (unsigned long long)v->lock_recoveries);
    int first = 1;
    for (unsigned t = 0; t < v->num_tenants; t++) {
        const gp_ledger_view_tenant *vt = &v->tenants[t];
        if (vt->name[0] == '\0')
            continue;
        fputs(first ? "{\"name\":" : ",{\"name\":", f);
        first = 0;
        json_string(f, vt->name);
        fprintf(f,
                ",\"max_bytes\":%llu,\"high_bytes\":%llu,\"min_bytes\":%llu,\"held_bytes\":%llu,\"live_bytes\":%llu,"
                "\"cached_bytes\":%llu,\"peak_held_bytes\":%llu,\"refusals\":%llu}",
                (unsigned long long)vt->max, (unsigned long long)vt->high, (unsigned long long)vt->min,
                (unsigned long long)vt->held, (unsigned long long)vt->live,
                (unsigned long long)sat_sub(vt->held, vt->live), (unsigned long long)vt->peak,
                (unsigned long long)vt->refusals);
    }
    fputs("],\"processes\":[", f);
    for (unsigned i = 0; i < v->num_pools; i++) {
        const gp_ledger_view_pool *vp = &v->pools[i];
        fprintf(f, "%s{\"pid\":%d,\"command\":", i ? "," : "", vp->pid);
        json_string(f, vp->command);
        fprintf(f,
                ",\"device\":%d,\"alive\":%s,\"held_bytes\":%llu,\"peak_held_bytes\":%llu,\"device_allocs\":%llu,"
                "\"device_frees\":%llu,\"ooms\":%llu,\"seen_seconds_ago\":%.3f,\"asked_to_trim\":%s,\"tenants\":[",
                vp->device, vp->alive ? "true" : "false", (unsigned long long)vp->device_held,
                (unsigned long long)vp->device_peak, (unsigned long long)vp->device_allocs,
                (unsigned long long)vp->device_frees, (unsigned long long)vp->ooms, age_seconds(vp->published_ns),
                vp->pressure_pending ? "true" : "false");
        int tfirst = 1;
        for (unsigned t = 0; t < v->num_tenants; t++) {
            const gp_ledger_view_charge *ch = &vp->charges[t];
            if (ch->held == 0 && ch->live == 0 && ch->refusals == 0 && ch->peak == 0)
                continue;
            fputs(tfirst ? "{\"name\":" : ",{\"name\":", f);
            tfirst = 0;
            json_string(f, v->tenants[t].name);
            fprintf(f, ",\"held_bytes\":%llu,\"live_bytes\":%llu,\"cached_bytes\":%llu,\"peak_held_bytes\":%llu,"
                       "\"refusals\":%llu}",
                    (unsigned long long)ch->held, (unsigned long long)ch->live,
                    (unsigned long long)sat_sub(ch->held, ch->live), (unsigned long long)ch->peak,
                    (unsigned long long)ch->refusals);
        }
        fputs("]}", f);
    }
    fputs("]}\n", f);
}

/* ---- Prometheus text exposition format (version 0.0.4) ---------------------------------------------- */

/* Label values here are ledger names (letters, digits, '.', '_', '-'), tenant names and numbers; a tenant
 * name may hold anything, so '\\', '"' and newlines are escaped as the format requires. */
static void label_value(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Labels: device (the ledger), pid and pool (its entry in the ledger: a process may have several pools)
 * for per-process figures, tenant for per-tenant ones. */
static void sample(FILE *f, const char *name, const char *device, const gp_ledger_view_pool *pool, const char *tenant,
                   uint64_t value)
{
    fprintf(f, "%s{device=\"", name);
    label_value(f, device);
    fputc('"', f);
    if (pool != NULL)
        fprintf(f, ",pid=\"%d\",pool=\"%u\"", pool->pid, pool->slot);
    if (tenant != NULL) {
        fputs(",tenant=\"", f);
        label_value(f, tenant);
        fputc('"', f);
    }
    fprintf(f, "} %llu\n", (unsigned long long)value);
}

typedef enum { TENANT_MAX, TENANT_HIGH, TENANT_MIN, TENANT_HELD, TENANT_PEAK } tenant_field;
typedef enum { CHARGE_HELD, CHARGE_LIVE, CHARGE_CACHED, CHARGE_REFUSALS } charge_field;
typedef enum { POOL_HELD, POOL_PEAK, POOL_ALLOCS, POOL_FREES, POOL_OOMS, POOL_ALIVE } pool_field;

void gp_ledger_view_print_prometheus(FILE *f, const gp_ledger_view *v)
{
    const char *dev = gp_ledger_view_device(v);
    static const struct { const char *name, *type, *help; } ledger_metrics[] = {
        {"gpupool_ledger_capacity_bytes", "gauge", "Device memory the ledger's budgets are held against."},
        {"gpupool_ledger_held_bytes", "gauge", "Device memory charged to the ledger by all pools."},
        {"gpupool_ledger_pools", "gauge", "Pools registered in the ledger (one per gp_pool, any process)."},
        {"gpupool_ledger_charges_total", "counter", "Charges the ledger granted."},
        {"gpupool_ledger_refused_charges_total", "counter",
         "Charge attempts the ledger refused (over a max, the device or a min; a waiting process retries every ms)."},
        {"gpupool_ledger_trim_requests_total", "counter", "Requests to trim cache sent to other processes."},
        {"gpupool_ledger_reclaimed_bytes_total", "counter", "Bytes reclaimed from pools of dead processes."},
        {"gpupool_ledger_reclaimed_pools_total", "counter", "Pools of dead processes reclaimed."},
        {"gpupool_ledger_lock_recoveries_total", "counter", "Times the ledger lock was recovered from a dead holder."},
    };
    uint64_t ledger_values[] = {v->capacity,      v->device_held,     v->num_pools,
                                v->charges,       v->refusals,        v->pressure_asks,
                                v->reclaimed_bytes, v->reclaimed_pools, v->lock_recoveries};
    for (size_t m = 0; m < sizeof ledger_metrics / sizeof ledger_metrics[0]; m++) {
        header(f, ledger_metrics[m].name, ledger_metrics[m].type, ledger_metrics[m].help);
        sample(f, ledger_metrics[m].name, dev, NULL, NULL, ledger_values[m]);
    }

    static const struct { const char *name, *help; tenant_field field; } tenant_metrics[] = {
        {"gpupool_tenant_max_bytes", "GPU-wide max of the tenant (0 = none).", TENANT_MAX},
        {"gpupool_tenant_high_bytes", "GPU-wide high of the tenant (0 = none).", TENANT_HIGH},
        {"gpupool_tenant_min_bytes", "GPU-wide min of the tenant (0 = none).", TENANT_MIN},
        {"gpupool_tenant_held_bytes", "Device memory charged to the tenant, all processes together.", TENANT_HELD},
        {"gpupool_tenant_peak_held_bytes", "Highest device memory charged to the tenant at once.", TENANT_PEAK},
    };
    for (size_t m = 0; m < sizeof tenant_metrics / sizeof tenant_metrics[0]; m++) {
        header(f, tenant_metrics[m].name, "gauge", tenant_metrics[m].help);
        for (unsigned t = 0; t < v->num_tenants; t++) {
            const gp_ledger_view_tenant *vt = &v->tenants[t];
            if (vt->name[0] == '\0')
                continue;
            uint64_t x = tenant_metrics[m].field == TENANT_MAX    ? vt->max
                         : tenant_metrics[m].field == TENANT_HIGH ? vt->high
                         : tenant_metrics[m].field == TENANT_MIN  ? vt->min
                         : tenant_metrics[m].field == TENANT_HELD ? vt->held
                                                                  : vt->peak;
            sample(f, tenant_metrics[m].name, dev, NULL, vt->name, x);
        }
    }

    static const struct { const char *name, *type, *help; charge_field field; } charge_metrics[] = {
        {"gpupool_process_tenant_held_bytes", "gauge", "Device memory a process's pool holds for a tenant.", CHARGE_HELD},
        {"gpupool_process_tenant_live_bytes", "gauge", "Bytes handed out to a tenant by a process's pool (as last published).", CHARGE_LIVE},
        {"gpupool_process_tenant_cached_bytes", "gauge", "Held minus live: cache a process's pool could give back.", CHARGE_CACHED},
        {"gpupool_process_tenant_refusals_total", "counter", "Allocations of a tenant refused as over budget in a process.", CHARGE_REFUSALS},
    };
    for (size_t m = 0; m < sizeof charge_metrics / sizeof charge_metrics[0]; m++) {
        header(f, charge_metrics[m].name, charge_metrics[m].type, charge_metrics[m].help);
        for (unsigned i = 0; i < v->num_pools; i++) {
            const gp_ledger_view_pool *vp = &v->pools[i];
            for (unsigned t = 0; t < v->num_tenants; t++) {
                const gp_ledger_view_charge *ch = &vp->charges[t];
                if (v->tenants[t].name[0] == '\0' || (ch->held == 0 && ch->live == 0 && ch->refusals == 0 && ch->peak == 0))
                    continue;
                uint64_t x = charge_metrics[m].field == CHARGE_HELD   ? ch->held
                             : charge_metrics[m].field == CHARGE_LIVE ? ch->live
                             : charge_metrics[m].field == CHARGE_CACHED ? sat_sub(ch->held, ch->live)
                                                                        : ch->refusals;
                sample(f, charge_metrics[m].name, dev, vp, v->tenants[t].name, x);
            }
        }
    }

    static const struct { const char *name, *type, *help; pool_field field; } pool_metrics[] = {
        {"gpupool_process_held_bytes", "gauge", "Device memory a process's pool holds (its reserved bytes).", POOL_HELD},
        {"gpupool_process_peak_held_bytes", "gauge", "Highest device memory a process's pool held.", POOL_PEAK},
        {"gpupool_process_device_allocs_total", "counter", "Device allocations (cudaMalloc, cuMemCreate) by a process's pool.", POOL_ALLOCS},
        {"gpupool_process_device_frees_total", "counter", "Device frees (cudaFree, cuMemRelease) by a process's pool.", POOL_FREES},
        {"gpupool_process_ooms_total", "counter", "Allocations a process's pool failed as out of memory.", POOL_OOMS},
        {"gpupool_process_alive", "gauge", "1 while the process that registered the pool runs.", POOL_ALIVE},
    };
    for (size_t m = 0; m < sizeof pool_metrics / sizeof pool_metrics[0]; m++) {
        header(f, pool_metrics[m].name, pool_metrics[m].type, pool_metrics[m].help);
        for (unsigned i = 0; i < v->num_pools; i++) {
            const gp_ledger_view_pool *vp = &v->pools[i];
            uint64_t x = pool_metrics[m].field == POOL_HELD     ? vp->device_held
                         : pool_metrics[m].field == POOL_PEAK   ? vp->device_peak
                         : pool_metrics[m].field == POOL_ALLOCS ? vp->device_allocs
                         : pool_metrics[m].field == POOL_FREES  ? vp->device_frees
                         : pool_metrics[m].field == POOL_OOMS   ? vp->ooms
                                                                : (uint64_t)vp->alive;
            sample(f, pool_metrics[m].name, dev, vp, NULL, x);
        }
    }
}
