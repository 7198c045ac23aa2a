/*
 * cmd_replay.c — `gpupool replay`: replays allocation traces on the simulated GPU and reports
 * fragmentation (peak reserved over peak live), device calls and host time per event.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/config.h"
#include "base/error.h"
#include "base/format.h"
#include "replay.h"
#include "replay_compare.h"
#include "replay_models.h"
#include "svg.h"
#include "trace.h"

static const char replay_usage[] =
    "usage: gpupool replay [--device-memory SIZE] [--conf CONF] [--repeat N] [--json] [--plot FILE.svg]\n"
    "                      [--check] [--snapshot FILE.pickle [--snapshot-format dict|list]] TRACE...\n"
    "       gpupool replay [--device-memory SIZE] [--conf CONF] [--json] [--snapshot FILE.pickle]\n"
    "                      [--processes] [--speed F]\n"
    "                      --model NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE] ...\n"
    "\n"
    "Replays each allocation trace (RMM's CSV allocation log: Thread,Time,Action,Pointer,Size,Stream)\n"
    "through a gpupool pool on the simulated GPU, each trace stream on its own simulated stream, and\n"
    "reports peak live bytes, peak reserved bytes, their ratio, device calls, failed allocations and\n"
    "host time per event.\n"
    "\n"
    "  --device-memory SIZE  capacity of the simulated GPU (default 80GiB; sizes take KiB/MiB/GiB)\n"
    "  --conf CONF           pool configuration, \"key:value,...\" (see `gpupool help config`);\n"
    "                        backend:sim-vmm replays on virtual memory (stitching, growth in place)\n"
    "  --repeat N            replay each trace N times on one pool, freeing what is live in between\n"
    "                        (as a training loop would); time per event is the median over passes\n"
    "  --json                print exactly one JSON object on stdout\n"
    "  --call-costs create=US,map=US,unmap=US,access=US,sync=US\n"
    "                        per-call costs (microseconds) of the device-time model of the first and last\n"
    "                        pass (warmup, last_pass_calls); any of them, the others keep the published\n"
    "                        A100 figures (193, 1.5, 26, 36; sync 0); bench/gpu/vmm_probe prints measured ones\n"
    "  --stream-work F       work on the streams, F from 0 (none: the default) to 1: the trace's Time column\n"
    "                        becomes the GPU's clock and each event uses its block on its stream for F x\n"
    "                        the time to that stream's next event (at 1 a stream is busy from each event\n"
    "                        to the next), so that memory moves between streams only as a GPU's events\n"
    "                        allow; a block used by two streams at once is a race (reported; exit 1)\n"
    "  --check               check the pool's invariants (gp_check) after every pass, with what the pass\n"
    "                        left live and after it is freed; a failed check fails the replay (exit 1)\n"
    "  --plot FILE.svg       draw live and reserved bytes over the replay(s) into FILE.svg\n"
    "  --compare pytorch     also replay each trace under PyTorch's caching-allocator policy (default and\n"
    "                        expandable segments) and print its peak reserved beside gpupool's\n"
    "  --snapshot FILE.pickle\n"
    "                        at the end of the last pass, write the pool as PyTorch's memory snapshot\n"
    "                        (segments, blocks and the device trace of the last pass, each model's name\n"
    "                        in the frames) for pytorch.org/memory_viz and torch.cuda._memory_viz\n"
    "  --snapshot-format dict|list\n"
    "                        dict (default): what torch.cuda.memory._snapshot() returns in PyTorch 2.x;\n"
    "                        list: the segment list alone, as PyTorch 1.x's memory_snapshot()\n"
    "  TRACE                 a .csv or .csv.gz file, or - for standard input\n"
    "  --model NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE]\n"
    "                        replay several traces together, interleaved by their Time column, each as\n"
    "                        one tenant (model) with those limits on streams of its own; reports each\n"
    "                        model's peak bytes held and refused allocations\n"
    "  --processes           with --model: each model in a process of its own (its own simulated GPU),\n"
    "                        all against one per-GPU ledger (conf ledger:NAME, else one of the replay's\n"
    "                        own), as one process per model or replica is deployed; the limits are\n"
    "                        then GPU-wide budgets and a NAME given twice is one tenant in two processes\n"
    "  --speed FACTOR        with --model: replay each event no sooner than its Time divided by FACTOR\n"
    "                        (1 = the trace's own pace; default: as fast as possible)\n";

/* Plot data: one bucket per x pixel-ish, holding the largest live and reserved seen in it. */
#define PLOT_BUCKETS 1200u

typedef struct plot_data {
    size_t total;     /* events observed in all passes */
    size_t buckets;
    double *x;        /* first event index of each bucket */
    double *live;
    double *reserved;
    double *allocated;
} plot_data;

static void plot_observe(void *opaque, unsigned repeat, size_t index, uint64_t live, const gp_stats *stats)
{
    (void)repeat;
    plot_data *p = opaque;
    size_t b = p->total ? index * p->buckets / p->total : 0;
    if (b >= p->buckets)
        b = p->buckets - 1;
    if ((double)live > p->live[b])
        p->live[b] = (double)live;
    if ((double)stats->reserved_bytes > p->reserved[b])
        p->reserved[b] = (double)stats->reserved_bytes;
    if ((double)stats->allocated_bytes > p->allocated[b])
        p->allocated[b] = (double)stats->allocated_bytes;
}

/* s as a JSON string (format.c escapes quotes, control bytes and bytes that are not UTF-8). */
static void json_string(FILE *f, const char *s)
{
    size_t n = gp_format_json_string(NULL, 0, s);
    char *quoted = malloc(n + 1);
    if (quoted == NULL) {
        fputs("null", f);
        return;
    }
    gp_format_json_string(quoted, n + 1, s);
    fputs(quoted, f);
    free(quoted);
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* What the peak reserved bytes held, as fractions of them (gp_peak_composition). */
static void print_peak(const gp_peak_composition *c, uint64_t per_pass)
{
    if (!c->recorded || c->reserved_bytes == 0)
        return;
    char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
    double res = (double)c->reserved_bytes;
    const char *unit = c->unit_is_page ? "page" : "segment";
    uint64_t n = c->num_allocs ? c->num_allocs - 1 : 0; /* allocations before the one that set the peak */
    printf("  at the peak           %s reserved, right after allocation %llu of pass %llu (%s)\n",
           gp_format_size(c->reserved_bytes, a), (unsigned long long)(per_pass ? n % per_pass + 1 : n + 1),
           (unsigned long long)(per_pass ? n / per_pass + 1 : 1), gp_format_size(c->request_bytes, b));
    printf("                        live %.1f%%, pending %.1f%%, free in partly used %ss %.1f%% (small heap %.1f%%), "
           "free in wholly free %ss %.1f%%, unmapped or parked pages %.1f%%\n",
           100.0 * (double)(c->small.allocated_bytes + c->large.allocated_bytes) / res,
           100.0 * (double)(c->small.pending_bytes + c->large.pending_bytes) / res, unit,
           100.0 * (double)(c->small.free_in_used_bytes + c->large.free_in_used_bytes) / res,
           100.0 * (double)c->small.free_in_used_bytes / res, unit,
           100.0 * (double)(c->small.free_whole_bytes + c->large.free_whole_bytes) / res,
           100.0 * (double)(c->unmapped_cached_bytes + c->parked_bytes) / res);
}

/* A pass's virtual-memory calls and their modelled device time, when it made any. */
static void print_calls(const char *label, const char *which, const gp_replay_calls *c, const gp_call_costs *costs)
{
    if (c->creates + c->maps + c->unmaps == 0)
        return;
    gp_call_costs published = gp_call_costs_published();
    bool given = !gp_call_costs_equal(costs, &published);
    printf("  %-21s %.1f ms: %s pass %llu creates, %llu maps, %llu set-access, %llu unmaps (%llu syncs, %llu "
           "waits) at %s costs per call\n",
           label, c->model_us / 1000.0, which, (unsigned long long)c->creates, (unsigned long long)c->maps,
           (unsigned long long)c->set_access, (unsigned long long)c->unmaps, (unsigned long long)c->syncs,
           (unsigned long long)c->waits, given ? "the given (--call-costs)" : "A100");
}

static void print_text(const gp_trace *t, const gp_replay_result *r)
{
    char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
    printf("%s\n", t->path);
    printf("  events                %llu per pass (%zu allocations, %zu frees, %zu allocate failures), "
           "%zu stream%s, %u pass%s\n",
           (unsigned long long)r->events, t->num_allocs, t->num_frees, t->num_alloc_failures, t->num_streams,
           t->num_streams == 1 ? "" : "s", r->repeats, r->repeats == 1 ? "" : "es");
    printf("  peak live             %s (%llu B)\n", gp_format_size(r->peak_live_bytes, a),
           (unsigned long long)r->peak_live_bytes);
    printf("  peak reserved         %s (%llu B)\n", gp_format_size(r->peak_reserved_bytes, b),
           (unsigned long long)r->peak_reserved_bytes);
    printf("  reserved / live       %.3f\n", r->reserved_over_live);
    printf("  device calls          %llu allocate, %llu free; %llu in the first pass, %llu in the last\n",
           (unsigned long long)r->device_alloc_calls, (unsigned long long)r->device_free_calls,
           (unsigned long long)r->device_calls_first_repeat, (unsigned long long)r->device_calls_last_repeat);
    if (r->map_calls + r->unmap_calls > 0)
        printf("  map calls             %llu map, %llu unmap; %llu in the first pass, %llu in the last\n",
               (unsigned long long)r->map_calls, (unsigned long long)r->unmap_calls,
               (unsigned long long)r->map_calls_first_repeat, (unsigned long long)r->map_calls_last_repeat);
    if (r->quiet_from_pass > 0 && r->quiet_from_pass == r->repeats)
        printf("  settled               in pass %u, the last: no device, map or unmap call in it\n", r->repeats);
    else if (r->quiet_from_pass > 0)
        printf("  settled               from pass %u: no device, map or unmap call in passes %u-%u\n",
               r->quiet_from_pass, r->quiet_from_pass, r->repeats);
    else
        printf("  settled               no: the last pass made device, map or unmap calls (--repeat more to see "
               "whether they stop)\n");
    print_calls("warm-up model", "first", &r->first, &r->costs);
    if (r->repeats > 1)
        print_calls("last-pass model", "last", &r->last, &r->costs);
    printf("  page floor            %.3f x live (peak live in 512 B granules, in whole 2 MiB pages)\n",
           r->peak_live_bytes ? (double)r->page_floor_bytes / (double)r->peak_live_bytes : 0.0);
    print_peak(&r->peak, r->allocations_per_pass);
    if (r->stream_work > 0)
        printf("  stream work           %g of each gap between a stream's events: %llu kernels, %llu races, "
               "host held up %.3f ms, at most %llu ops queued on a stream\n",
               r->stream_work, (unsigned long long)r->kernels, (unsigned long long)r->races,
               (double)r->host_stall_ns / 1e6, (unsigned long long)r->deepest_queue);
    if (r->races + r->bad_calls > 0)
        printf("  simulated GPU         %llu races, %llu bad calls (first: %s)\n", (unsigned long long)r->races,
               (unsigned long long)r->bad_calls, r->first_violation);
    printf("  failed allocations    %llu\n", (unsigned long long)r->failed_allocations);
    printf("  failed frees          %llu\n", (unsigned long long)r->failed_frees);
    if (r->first_failure[0])
        printf("  first failure         %s\n", r->first_failure);
    if (r->check_failures > 0)
        printf("  failed pool checks    %llu (first: %s)\n", (unsigned long long)r->check_failures,
               r->first_check_failure);
    double eps = r->host_ns_per_event > 0 ? 1e9 / r->host_ns_per_event : 0.0;
    printf("  host time             %.1f ns/event, median of %u pass%s (%.2f M events/s; first pass %.1f ns)\n",
           r->host_ns_per_event, r->repeats, r->repeats == 1 ? "" : "es", eps / 1e6, r->host_ns_per_event_first);
}

/* A pass's virtual-memory calls as JSON (replay.h: gp_replay_calls). */
static void json_calls(FILE *f, const gp_replay_calls *c)
{
    fprintf(f,
            "{\"creates\":%llu,\"releases\":%llu,\"maps\":%llu,\"unmaps\":%llu,\"set_access\":%llu,"
            "\"syncs\":%llu,\"waits\":%llu,\"model_us\":%.1f}",
            (unsigned long long)c->creates, (unsigned long long)c->releases, (unsigned long long)c->maps,
            (unsigned long long)c->unmaps, (unsigned long long)c->set_access, (unsigned long long)c->syncs,
            (unsigned long long)c->waits, c->model_us);
}

static void print_json_trace(FILE *f, const gp_trace *t, const gp_replay_result *r, const char *dm,
                             size_t device_bytes, const char *conf)
{
    double eps = r->host_ns_per_event > 0 ? 1e9 / r->host_ns_per_event : 0.0;
    fputs("{\"path\":", f);
    json_string(f, t->path);
    fprintf(f,
            ",\"events\":%llu,\"peak_live_bytes\":%llu,\"peak_reserved_bytes\":%llu,"
            "\"reserved_over_live\":%.6f,\"device_alloc_calls\":%llu,\"device_free_calls\":%llu,"
            "\"device_calls_last_repeat\":%llu,\"failed_allocations\":%llu,\"host_ns_per_event\":%.3f,"
            "\"events_per_second\":%.0f,\"repeats\":%u,\"device_calls_first_repeat\":%llu,"
            "\"peak_allocated_bytes\":%llu,\"sim_peak_bytes\":%llu,\"host_ns_per_event_min\":%.3f,"
            "\"host_ns_per_event_max\":%.3f,\"host_ns_per_event_first\":%.3f,\"allocations\":%zu,"
            "\"frees\":%zu,\"trace_allocate_failures\":%zu,\"unknown_frees\":%zu,\"double_allocations\":%zu,"
            "\"streams\":%zu,\"threads\":%zu,\"failed_frees\":%llu,\"segments_end\":%llu,"
            "\"allocated_bytes_end\":%llu,\"device_memory\":",
            (unsigned long long)r->events, (unsigned long long)r->peak_live_bytes,
            (unsigned long long)r->peak_reserved_bytes, r->reserved_over_live,
            (unsigned long long)r->device_alloc_calls, (unsigned long long)r->device_free_calls,
            (unsigned long long)r->device_calls_last_repeat, (unsigned long long)r->failed_allocations,
            r->host_ns_per_event, eps, r->repeats, (unsigned long long)r->device_calls_first_repeat,
            (unsigned long long)r->peak_allocated_bytes, (unsigned long long)r->sim_peak_bytes,
            r->host_ns_per_event_min, r->host_ns_per_event_max, r->host_ns_per_event_first, t->num_allocs,
            t->num_frees, t->num_alloc_failures, t->unknown_frees, t->double_allocs, t->num_streams,
            t->num_threads, (unsigned long long)r->failed_frees, (unsigned long long)r->segments_end,
            (unsigned long long)r->allocated_bytes_end);
    json_string(f, dm);
    /* what the simulated device holds (--conf's device_memory wins over --device-memory), and what the
     * trace asks for at its peak as recorded: a trace that asks for more than the device holds fails
     * allocations whatever the pool does (tools/bench_traces.py leaves such workloads out of its targets) */
    fprintf(f, ",\"device_memory_bytes\":%zu,\"trace_peak_live_bytes\":%llu", device_bytes,
            (unsigned long long)t->peak_live_bytes);
    fprintf(f, ",\"map_calls\":%llu,\"unmap_calls\":%llu,\"map_calls_first_repeat\":%llu,\"map_calls_last_repeat\":%llu",
            (unsigned long long)r->map_calls, (unsigned long long)r->unmap_calls,
            (unsigned long long)r->map_calls_first_repeat, (unsigned long long)r->map_calls_last_repeat);
    fprintf(f, ",\"quiet_from_pass\":%u", r->quiet_from_pass);
    fprintf(f,
            ",\"peak_live_rounded_bytes\":%llu,\"page_floor_bytes\":%llu,\"page_floor_over_live\":%.6f,"
            "\"warmup\":",
            (unsigned long long)r->peak_live_rounded_bytes, (unsigned long long)r->page_floor_bytes,
            r->peak_live_bytes ? (double)r->page_floor_bytes / (double)r->peak_live_bytes : 0.0);
    json_calls(f, &r->first);
    fputs(",\"last_pass_calls\":", f);
    json_calls(f, &r->last);
    fprintf(f, ",\"call_costs_us\":{\"create\":%g,\"map\":%g,\"unmap\":%g,\"access\":%g,\"sync\":%g}",
            r->costs.create_us, r->costs.map_us, r->costs.unmap_us, r->costs.set_access_us, r->costs.sync_us);
    fprintf(f,
            ",\"stream_work\":%g,\"kernels\":%llu,\"races\":%llu,\"host_stall_ns\":%llu,\"deepest_queue\":%llu,"
            "\"bad_calls\":%llu,\"first_violation\":",
            r->stream_work, (unsigned long long)r->kernels, (unsigned long long)r->races,
            (unsigned long long)r->host_stall_ns, (unsigned long long)r->deepest_queue,
            (unsigned long long)r->bad_calls);
    json_string(f, r->first_violation);
    fputs(",\"conf\":", f);
    json_string(f, conf);
    fputs(",\"first_failure\":", f);
    json_string(f, r->first_failure);
    fprintf(f, ",\"check_failures\":%llu,\"first_check_failure\":", (unsigned long long)r->check_failures);
    json_string(f, r->first_check_failure);
    fprintf(f, ",\"pool\":%s", r->stats_json[0] ? r->stats_json : "null"); /* the caller closes it */
}

/*
 * Checks the configuration before any trace is read, so that its errors name their source
 * (GPUPOOL_CONF, --device-memory or --conf) and not a trace. 0, or 2 with a message printed.
 */
static int check_configuration(const char *dm, const char *conf, size_t *device_bytes, size_t *dm_bytes)
{
    gp_config cfg;
    gp_config_defaults(&cfg);
    char item[256];
    snprintf(item, sizeof item, "device_memory:%s", dm);
    const char *env = getenv("GPUPOOL_CONF");
    int rc = gp_config_apply(&cfg, env, "GPUPOOL_CONF");
    if (rc == GP_OK && strlen(dm) < 200)
        rc = gp_config_apply(&cfg, item, "--device-memory");
    else if (rc == GP_OK)
        rc = gp_error_set(GP_ERR_CONFIG, "--device-memory: a value of %zu characters is not a size", strlen(dm));
    *dm_bytes = cfg.device_memory;
    if (rc == GP_OK)
        rc = gp_config_apply(&cfg, conf, "--conf");
    if (rc == GP_OK)
        rc = gp_config_apply(&cfg, "backend:sim", "replay");
    if (rc == GP_OK)
        rc = gp_config_validate(&cfg);
    if (rc == GP_OK) {
        *device_bytes = cfg.device_memory;
        return 0;
    }
    fprintf(stderr, "gpupool replay: %s\n", gp_last_error());
    return 2;
}

int gp_cmd_replay(int argc, char **argv)
{
    const char *dm = GP_REPLAY_DEFAULT_DEVICE_MEMORY;
    const char *conf = "";
    const char *plot = NULL;
    const char *compare = NULL;
    unsigned repeat = 1;
    int json = 0, repeat_given = 0, processes = 0, check = 0, costs_given = 0;
    double speed = 0, stream_work = 0;
    gp_call_costs costs = gp_call_costs_published();
    const char *snapshot = NULL;
    unsigned snapshot_flags = 0;
    int first_trace = argc;
    const char **model_specs = calloc((size_t)argc, sizeof *model_specs);
    int num_models = 0;
    int status = 0;
    if (model_specs == NULL)
        return 1;
    /* Every return from here on goes through `done`, which frees model_specs. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *value = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(replay_usage, stdout);
            goto done;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(a, "--check") == 0) {
            check = 1;
            continue;
        }
        if (strcmp(a, "--processes") == 0) {
            processes = 1;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            first_trace = i + 1;
            break;
        }
        if (a[0] != '-' || strcmp(a, "-") == 0) { /* "-": a trace on standard input */
            first_trace = i;
            break;
        }
        const char *names[] = {"--device-memory", "--conf", "--repeat", "--plot", "--model", "--snapshot-format",
                               "--snapshot", "--speed", "--compare", "--call-costs", "--stream-work"};
        int which = -1;
        for (int k = 0; k < 11; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(a, names[k], n) == 0 && (a[n] == '\0' || a[n] == '=')) {
                which = k;
                if (a[n] == '=')
                    value = a + n + 1;
                else if (i + 1 < argc)
                    value = argv[++i];
                break;
            }
        }
        if (which < 0) {
            fprintf(stderr, "gpupool replay: unknown option %s\n\n%s", a, replay_usage);
            status = 2;
            goto done;
        }
        if (value == NULL) {
            fprintf(stderr, "gpupool replay: %s needs a value\n", names[which]);
            status = 2;
            goto done;
        }
        if (which == 0) {
            dm = value;
        } else if (which == 1) {
            conf = value;
        } else if (which == 2) {
            char *end;
            unsigned long n = strtoul(value, &end, 10);
            if (*end != '\0' || n == 0 || n > GP_REPLAY_MAX_TIMED_REPEATS) {
                fprintf(stderr, "gpupool replay: --repeat %s: expected a count from 1 to %u\n", value,
                        GP_REPLAY_MAX_TIMED_REPEATS);
                status = 2;
                goto done;
            }
            repeat = (unsigned)n;
            repeat_given = 1;
        } else if (which == 4) {
            model_specs[num_models++] = value;
        } else if (which == 5) {
            if (strcmp(value, "dict") == 0) {
                snapshot_flags = 0;
            } else if (strcmp(value, "list") == 0) {
                snapshot_flags = GP_SNAPSHOT_LIST;
            } else {
                fprintf(stderr, "gpupool replay: --snapshot-format %s: expected dict or list\n", value);
                status = 2;
                goto done;
            }
        } else if (which == 6) {
            snapshot = value;
        } else if (which == 7) {
            char *end;
            speed = strtod(value, &end);
            if (*end != '\0' || !(speed > 0)) {
                fprintf(stderr, "gpupool replay: --speed %s: expected a factor above 0 (1 = the trace's own pace)\n",
                        value);
                free(model_specs);
                return 2;
            }
        } else if (which == 10) {
            char *end;
            stream_work = strtod(value, &end);
            if (*end != '\0' || end == value || !(stream_work >= 0.0 && stream_work <= 1.0)) {
                fprintf(stderr, "gpupool replay: --stream-work %s: expected a fraction from 0 (no work) to 1 "
                                "(each stream busy until its next event)\n", value);
                status = 2;
                goto done;
            }
        } else if (which == 9) {
            costs_given = 1;
            char err[256];
            if (gp_call_costs_parse(value, &costs, err, sizeof err) != 0) {
                fprintf(stderr, "gpupool replay: --call-costs %s: %s\n", value, err);
                status = 2;
                goto done;
            }
        } else if (which == 8) {
            char err[256];
            if (gp_compare_check(value, err, sizeof err) != 0) {
                fprintf(stderr, "gpupool replay: %s\n", err);
                free(model_specs);
                return 2;
            }
            compare = value;
        } else {
            plot = value;
        }
    }
    size_t device_bytes = 0, dm_bytes = 0;
    if ((status = check_configuration(dm, conf, &device_bytes, &dm_bytes)) != 0)
        goto done;
    /* --json's device_memory: --device-memory as given, or the size --conf's device_memory set instead */
    char dm_used[GP_SIZE_TEXT_MAX];
    const char *dm_json = device_bytes == dm_bytes ? dm : gp_format_size(device_bytes, dm_used);
    if (num_models > 0) {
        if (first_trace < argc) {
            fprintf(stderr, "gpupool replay: give traces either as --model NAME=TRACE or plainly, not both\n");
            status = 2;
        } else if (repeat_given || plot != NULL || check || costs_given || stream_work > 0) {
            fprintf(stderr, "gpupool replay: %s does not apply to --model (the models replay once, together)\n",
                    repeat_given ? "--repeat" : plot != NULL ? "--plot" : check ? "--check"
                    : costs_given ? "--call-costs" : "--stream-work");
            status = 2;
        } else {
            status = gp_replay_models(model_specs, num_models, dm, conf, json, snapshot, snapshot_flags, processes,
                                      speed);
            if (status == 0 && snapshot != NULL && !json)
                printf("snapshot written to %s\n", snapshot);
        }
        goto done;
    }
    if (first_trace >= argc) {
        fprintf(stderr, "gpupool replay: no trace given\n\n%s", replay_usage);
        status = 2;
        goto done;
    }
    free(model_specs);
    model_specs = NULL;
    int num_traces = argc - first_trace;
    if (snapshot != NULL && num_traces > 1) {
        fprintf(stderr, "gpupool replay: --snapshot writes one pool: give one trace (or several as --model)\n");
        return 2;
    }
    gp_svg_panel *panels = plot ? calloc((size_t)num_traces, sizeof *panels) : NULL;
    gp_svg_series *series = plot ? calloc((size_t)num_traces * 3, sizeof *series) : NULL;
    plot_data *plots = plot ? calloc((size_t)num_traces, sizeof *plots) : NULL;
    char **titles = plot ? calloc((size_t)num_traces, sizeof *titles) : NULL;
    if (plot && (panels == NULL || series == NULL || plots == NULL || titles == NULL)) {
        fprintf(stderr, "gpupool replay: out of host memory\n");
        free(panels);
        free(series);
        free(plots);
        free(titles);
        return 1;
    }

    if (json)
        fputs("{\"traces\":[", stdout);
    for (int ti = 0; ti < num_traces; ti++) {
        const char *path = argv[first_trace + ti];
        gp_trace trace;
        char err[1024];
        if (gp_trace_read(&trace, path, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool replay: %s\n", err);
            status = 1;
            break;
        }
        if (trace.unknown_frees)
            fprintf(stderr,
                    "gpupool replay: %s: %zu free%s of pointers the trace never allocated (first at %s:%zu); "
                    "counted, not replayed\n",
                    path, trace.unknown_frees, trace.unknown_frees == 1 ? "" : "s", path,
                    trace.first_unknown_free_line);
        if (trace.double_allocs)
            fprintf(stderr,
                    "gpupool replay: %s: %zu allocation%s of a pointer already live (first at %s:%zu); the "
                    "older allocation stays live until the end of the pass\n",
                    path, trace.double_allocs, trace.double_allocs == 1 ? "" : "s", path,
                    trace.first_double_alloc_line);
        gp_replay_options opt = {.device_memory = dm, .conf = conf, .repeat = repeat, .snapshot = snapshot,
                                 .snapshot_flags = snapshot_flags, .check = check, .costs = &costs,
                                 .stream_work = stream_work};
        gp_replay_result *res = malloc(sizeof *res);
        if (res == NULL) {
            fprintf(stderr, "gpupool replay: out of host memory\n");
            gp_trace_free(&trace);
            status = 1;
            break;
        }
        if (gp_replay_run(&trace, &opt, res, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool replay: %s: %s\n", path, err);
            free(res);
            gp_trace_free(&trace);
            status = 1;
            break;
        }
        if (json) {
            if (ti > 0)
                fputc(',', stdout);
            print_json_trace(stdout, &trace, res, dm_json, device_bytes, conf);
        } else {
            if (ti > 0)
                putchar('\n');
            print_text(&trace, res);
            if (snapshot != NULL)
                printf("  snapshot              written to %s\n", snapshot);
        }
        if (compare != NULL && gp_compare_pytorch_print(stdout, &trace, res, json, err, sizeof err) != 0) {
            fprintf(stderr, "gpupool replay: %s\n", err);
            status = 1;
        }
        if (json)
            fputc('}', stdout);
        if (res->check_failures > 0) {
            fprintf(stderr, "gpupool replay: %s: %llu pool check%s failed (first: %s)\n", path,
                    (unsigned long long)res->check_failures, res->check_failures == 1 ? "" : "s",
                    res->first_check_failure);
            status = 1;
        }
        if (res->races + res->bad_calls > 0) { /* the pool gave the device a call or a block it must not */
            fprintf(stderr, "gpupool replay: %s: the simulated GPU saw %llu race%s and %llu bad call%s (first: %s)\n",
                    path, (unsigned long long)res->races, res->races == 1 ? "" : "s",
                    (unsigned long long)res->bad_calls, res->bad_calls == 1 ? "" : "s", res->first_violation);
            status = 1;
        }
        if (res->failed_frees > 0) { /* the blocks stayed live and were freed at each pass's end */
            fprintf(stderr, "gpupool replay: %s: %llu free%s failed (first: %s)\n", path,
                    (unsigned long long)res->failed_frees, res->failed_frees == 1 ? "" : "s", res->first_failure);
            status = 1;
        }
        if (plot) {
            /* a second, observed run (stats after every event), so that the timed run stays clean */
            plot_data *pd = &plots[ti];
            pd->total = trace.num_events * repeat;
            pd->buckets = pd->total < PLOT_BUCKETS ? (pd->total ? pd->total : 1) : PLOT_BUCKETS;
            pd->x = calloc(pd->buckets, sizeof *pd->x);
            pd->live = calloc(pd->buckets, sizeof *pd->live);
            pd->reserved = calloc(pd->buckets, sizeof *pd->reserved);
            pd->allocated = calloc(pd->buckets, sizeof *pd->allocated);
            titles[ti] = malloc(512);
            gp_replay_result *observed = malloc(sizeof *observed);
            if (!pd->x || !pd->live || !pd->reserved || !pd->allocated || !titles[ti] || !observed) {
                fprintf(stderr, "gpupool replay: out of host memory\n");
                status = 1;
            } else {
                for (size_t b = 0; b < pd->buckets; b++) {
                    size_t event = (b * pd->total + pd->buckets - 1) / pd->buckets; /* rounded up */
                    pd->x[b] = (double)event;
                }
                opt.observe = plot_observe;
                opt.opaque = pd;
                opt.snapshot = NULL; /* written by the timed run */
                opt.stream_work = 0; /* the observed run is the plain one: the plot shows its figures */
                if (gp_replay_run(&trace, &opt, observed, err, sizeof err) != 0) {
                    fprintf(stderr, "gpupool replay: %s: %s\n", path, err);
                    status = 1;
                }
                snprintf(titles[ti], 512, "%s: peak reserved / peak live = %.3f, %u pass%s",
                         base_name(path), res->reserved_over_live, repeat, repeat == 1 ? "" : "es");
                gp_svg_series *s = &series[(size_t)ti * 3];
                s[0] = (gp_svg_series){.name = "reserved (device memory held by the pool)", .color = "#d62728",
                                       .y = pd->reserved, .filled = 1};
                s[1] = (gp_svg_series){.name = "allocated (blocks handed out, 512 B rounded)",
                                       .color = "#7f7f7f", .y = pd->allocated, .dashed = 1};
                s[2] = (gp_svg_series){.name = "live (requested bytes)", .color = "#1f77b4", .y = pd->live};
                panels[ti] = (gp_svg_panel){.title = titles[ti], .x_label = "event (all passes)", .x = pd->x,
                                            .n = pd->buckets, .series = s, .num_series = 3};
            }
            free(observed);
        }
        free(res);
        gp_trace_free(&trace);
        if (status != 0)
            break;
    }
    if (json)
        fputs("]}\n", stdout);
    if (plot && status == 0) {
        char err[1024];
        if (gp_svg_write(plot, "gpupool replay on the simulated GPU", panels, (size_t)num_traces, err,
                         sizeof err) != 0) {
            fprintf(stderr, "gpupool replay: %s\n", err);
            status = 1;
        } else if (!json) {
            printf("\nplot written to %s\n", plot);
        }
    }
    if (plot) {
        for (int ti = 0; ti < num_traces; ti++) {
            free(plots[ti].x);
            free(plots[ti].live);
            free(plots[ti].reserved);
            free(plots[ti].allocated);
            free(titles[ti]);
        }
        free(plots);
        free(titles);
        free(panels);
        free(series);
    }
    return status;
done:
    free(model_specs);
    return status;
}
