/*
 * replay.h — replaying a parsed trace through a gpupool pool on the simulated GPU.
 *
 * One pool per replay, created with backend "sim" and "device_memory:<size>,<conf>". Each distinct
 * trace stream gets its own simulated stream (stream 0x0 is the default stream, NULL). With
 * repeat = N the trace runs N times in a row on the same pool; after each pass every allocation the
 * pass left live is freed on its stream and the sim is synchronised, as between two steps of a
 * training loop. Only the event loop of each pass is timed (CLOCK_MONOTONIC).
 *
 * Live bytes are the replayer's own sum of requested sizes of the allocations that succeeded.
 */
#ifndef GP_CLI_REPLAY_H
#define GP_CLI_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"
#include "trace.h"

#define GP_REPLAY_DEFAULT_DEVICE_MEMORY "80GiB"

/* Called after every event when set (this makes the replay slow: it takes a stats snapshot per event).
 * `index` counts events from 0 across all repeats; live_bytes is the replayer's live sum. */
typedef void (*gp_replay_observer)(void *opaque, unsigned repeat, size_t index, uint64_t live_bytes,
                                   const gp_stats *stats);

/*
 * What one call of each kind costs in the device-time model, in microseconds. The defaults
 * (gp_call_costs_published) are published figures for one 2 MiB page on an A100 (replay.c says which)
 * and a synchronization at 0: counted, not costed, since its cost is the work still queued, which a
 * replay does not have. `gpupool replay --call-costs` takes measured ones (bench/gpu/vmm_probe.c prints
 * the option with the medians it measured on a GPU).
 */
typedef struct gp_call_costs {
    double create_us, map_us, unmap_us, set_access_us, sync_us;
} gp_call_costs;

gp_call_costs gp_call_costs_published(void);
/* Whether a and b give every kind of call the same cost. */
bool gp_call_costs_equal(const gp_call_costs *a, const gp_call_costs *b);
/* Parses "create=US,map=US,unmap=US,access=US,sync=US" (any of them, in any order; the others keep
 * their value in *costs) into *costs. 0, or -1 with what and why in err and *costs unchanged. */
int gp_call_costs_parse(const char *text, gp_call_costs *costs, char *err, size_t errlen);

typedef struct gp_replay_options {
    const char *device_memory; /* the sim's capacity as a config value ("80GiB"); NULL = the default */
    const char *conf;          /* more pool configuration, "key:value,..."; NULL or "" = none */
    unsigned repeat;           /* passes over the trace; 0 is taken as 1 */
    gp_replay_observer observe;
    void *opaque;
    /* When set: record the pool's history and, at the end of the last pass (before what the trace left
     * live is freed), write a memory_viz snapshot there (gp_snapshot_write with snapshot_flags).
     * history_entries: events kept (0 = 4 per trace event + 4096: all of the last pass). */
    const char *snapshot;
    unsigned snapshot_flags;
    size_t history_entries;
    /* When set: gp_check after every pass, once with what the pass left live and once after it is
     * freed; failures are counted in check_failures, the first one's message kept. */
    bool check;
    /* The device-time model's per-call costs (gp_replay_calls); NULL = gp_call_costs_published(). */
    const gp_call_costs *costs;
    /*
     * Work on the streams (0: none, every stream idle whenever the pool asks; else a fraction in (0, 1]).
     * The trace's Time column becomes the simulated GPU's clock (each pass starting where the last one
     * ended), and each event on a stream queues a kernel there that uses the block (GP_SIM_USE: raced
     * as a write, contents not simulated) for stream_work x the time to that stream's next event: the
     * block just allocated, or the block about to be freed (its last use, when it is freed on the stream
     * that allocated it; a free on another stream queues nothing, the trace not saying how the two were
     * ordered). At 1 a stream is busy from each of its events to the next, as a GPU that just keeps
     * pace with its host thread, so the pool may reuse a stream's freed memory on another stream only
     * once that stream's work is done (its fence, borrowing, loans), as on a GPU; and the race checker
     * sees every block's uses, so a block handed to one stream while another still uses it is reported
     * (result.races). Host times then include the simulated kernels. The trace's times are the
     * host's: where the pool holds the host up (a synchronize that runs the GPU past the next event's
     * time), the rest of the trace comes that much later (result.host_stall_ns).
     */
    double stream_work;
} gp_replay_options;

#define GP_REPLAY_MAX_TIMED_REPEATS 1024u

/*
 * One pass's virtual-memory calls by kind, and the device time they model: each call times its cost in
 * gp_replay_options.costs (by default the published A100 figures; synchronizations at 0). syncs: device
 * synchronizes; waits: host waits on one stream's event (before unmapping its free pages, when its
 * fence has not said yet that their uses are over), not costed: what they cost is the work waited for
 * (host_stall_ns, with --stream-work).
 */
typedef struct gp_replay_calls {
    uint64_t creates, releases, maps, unmaps, set_access, syncs, waits;
    double model_us;
} gp_replay_calls;

typedef struct gp_replay_result {
    uint64_t events;               /* events per pass (allocate, free, allocate failure lines) */
    unsigned repeats;
    uint64_t peak_live_bytes;      /* largest sum of requested sizes live at once */
    uint64_t peak_live_rounded_bytes; /* the same with every size rounded up to the 512 B granule */
    uint64_t page_floor_bytes;     /* peak_live_rounded_bytes in whole 2 MiB pages: no pool holds less */
    uint64_t peak_reserved_bytes;  /* the pool's reserved_bytes_peak */
    uint64_t peak_allocated_bytes; /* the pool's allocated_bytes_peak (rounded block sizes) */
    uint64_t sim_peak_bytes;       /* the sim's own peak of device memory allocated (2 MiB pages) */
    double reserved_over_live;     /* peak_reserved_bytes / peak_live_bytes */
    uint64_t device_alloc_calls;   /* device allocate calls (cudaMalloc or cuMemCreate), all passes */
    uint64_t device_free_calls;    /* device free calls (cudaFree or cuMemRelease), all passes */
    uint64_t device_calls_last_repeat; /* device allocate + free calls in the last pass */
    uint64_t device_calls_first_repeat;
    uint64_t map_calls, unmap_calls;   /* pages mapped and unmapped, all passes (sim-vmm; 0 on sim) */
    uint64_t map_calls_last_repeat;    /* map + unmap calls in the last pass */
    uint64_t map_calls_first_repeat;
    /* The first pass (counted from 1) from which no pass made a device, map or unmap call: the pool had
     * settled there. 0 when the last pass made one (it had not settled, or settles later or never:
     * replay more passes to tell). */
    unsigned quiet_from_pass;
    /* The first (warm-up) pass and the last one, per kind of virtual-memory call (sim-vmm; 0 on sim),
     * with what they would cost on a GPU (gp_replay_calls). */
    gp_replay_calls first, last;
    gp_call_costs costs; /* the per-call costs the model of first and last used */
    uint64_t failed_allocations;   /* gp_alloc failures, all passes */
    uint64_t failed_frees;         /* gp_free failures (e.g. a free on a stream no allocation used): the
                                    * block stays live and is freed on its own stream at the pass's end */
    uint64_t allocated_bytes_end;  /* the pool's allocated bytes after the last pass (0 unless leaked) */
    uint64_t trace_alloc_failures; /* `allocate failure` lines per pass (not replayed) */
    uint64_t segments_end;         /* device allocations the pool held after the last pass */
    double host_ns_per_event;      /* median over passes of (loop time / events) */
    double host_ns_per_event_min;
    double host_ns_per_event_max;
    double host_ns_per_event_first; /* the first (cold) pass */
    char first_failure[256];       /* gp_last_error() of the first failed call, "" if none */
    uint64_t check_failures;       /* gp_check calls that failed (options.check), all passes */
    char first_check_failure[256]; /* gp_last_error() of the first one, "" if none */
    char stats_json[8192];         /* gp_stats_json after the last pass, before the pool is destroyed */
    /* What reserved memory was made of right after the allocation that last raised its peak (the pool
     * runs with peak_composition:on unless the configuration turns it off; recorded 0 then). */
    gp_peak_composition peak;
    uint64_t allocations_per_pass; /* successful allocations of the first pass, to place peak.num_allocs */
    /* With stream work (options.stream_work): the kernels queued and the races the simulated GPU saw,
     * all passes (uses of one block by two streams that nothing ordered); the first violation's text
     * ("" if none). */
    double stream_work;
    uint64_t kernels, races;
    /* With stream work: how long the pool held the host up in all (device and event synchronizes that
     * ran the simulated GPU past the next event's time), ns; the trace's later events came that much
     * later (replay.c: run_pass_worked). */
    uint64_t host_stall_ns;
    /* The most ops queued on one simulated stream at once (gp_sim_report.deepest_queue): with stream
     * work at 1, a stream's kernels keep pace with its events, so a few at most. */
    uint64_t deepest_queue;
    /* device calls the sim refused as wrong, with or without stream work: a kernel on memory not
     * allocated or not mapped, a free of an unknown address, ... (gp_sim_report.bad_calls) */
    uint64_t bad_calls;
    char first_violation[256];
} gp_replay_result;

/* Replays `trace`. Returns 0, or -1 with a message in err when the pool cannot be created or another
 * setup step fails (failed allocations during the replay are counted, not errors). */
int gp_replay_run(const gp_trace *trace, const gp_replay_options *options, gp_replay_result *result,
                  char *err, size_t errlen);

#endif /* GP_CLI_REPLAY_H */
