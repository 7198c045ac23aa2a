#!/usr/bin/env python3
"""tests/cli/check_replay_work.py — `gpupool replay --stream-work F`: the streams busy as on a GPU.

Without it a replay queues no work on the simulated GPU, so every stream is idle whenever the pool
asks and memory moves between streams freely. With it the trace's Time column is the GPU's clock and
each event uses its block on its stream until that stream's next event (times F); the race checker
then sees every block's uses.

A synthetic trace on two streams, no ../shared needed: stream A allocates X and K (8 MiB each), frees
X, and frees K 1000 us later (so A's work on X runs until then); stream B asks for 8 MiB in between.
  - --stream-work 0 (the default): no kernels; on sim-vmm B borrows A's free X (A is idle), 16 MiB of
    blocks reserved in A's range alone;
  - --stream-work 1 on sim-vmm: A is busy; with reuse_wait:on B borrows X by waiting on A's fence
    (num_stream_waits >= 1), reserving no more than without work; with reuse_wait off (the default) B
    gets memory of its own (more reserved, no wait);
  - every replay with work (sim, sim-vmm, and sim-vmm with tenant_best_fit:on): kernels = the events
    that use a block, no race, no bad call, exit 0, and the text output says so;
  - a device call that holds the host up (on sim, stream A's growth past the cache cap frees its cached
    segments, and cudaFree waits for the device while stream B's work runs 1 s on) delays the rest of
    the trace by that much (host_stall_ns about 1 s), and the streams' work keeps pace after it
    (deepest_queue 3 at most; without the delay, C's 20 events queued up behind a clock standing
    still);
  - on sim-vmm the same growth unmaps A's free pages after waiting for A's own work only (its fence),
    not for B's: no device synchronize, the host held up far less than B's 1 s, and no unmap under a
    kernel that still uses the range (the sim refuses one as a bad call);
  - bad values (2, -0.5, "x", "") exit 2 naming --stream-work, and --stream-work with --model too.

Usage: check_replay_work.py GPUPOOL WORK_DIR. Exits 1 on any failure, 0 otherwise.
"""
import json, os, shutil, subprocess, sys

from synthetic_trace import HEADER, missing_from_output, report

MIB = 1 << 20


def write_two_streams(path):
    rows = [
        (0, 'allocate', 0x1000, 8 * MIB, '0x1'),    # X on A
        (1, 'allocate', 0x2000, 8 * MIB, '0x1'),    # K on A
        (2, 'free', 0x1000, 8 * MIB, '0x1'),        # X freed on A: A uses it until its next event
        (3, 'allocate', 0x3000, 8 * MIB, '0x2'),    # B asks for X's size
        (4, 'free', 0x3000, 8 * MIB, '0x2'),
        (1000, 'free', 0x2000, 8 * MIB, '0x1'),     # A's next event
    ]
    with open(path, 'w') as f:
        f.write(HEADER)
        for t, action, ptr, size, stream in rows:
            f.write(f'0,{t},{action},{hex(ptr)},{size},{stream}\n')
    return len(rows)  # every event uses a block: each free is on the stream that allocated it


def write_stall(path):
    """Stream A's growth past the cache cap gives its unfit free memory back while stream B's work runs
    1 s on: cudaFree (sim) waits for the device, so for B's work, about 1 s; unmapping (sim-vmm) waits
    for A's own work only. Then stream C goes on with 20 events 10 us apart."""
    rows = [
        (0, 'allocate', 0x1000, 64 * MIB, '0x1'),   # A: 64 MiB, a pin, 32 MiB
        (1, 'allocate', 0x1100, 2 * MIB, '0x1'),
        (2, 'allocate', 0x1200, 32 * MIB, '0x1'),
        (3, 'free', 0x1000, 64 * MIB, '0x1'),       # A's cache: holes of 64 and 32 MiB
        (4, 'free', 0x1200, 32 * MIB, '0x1'),
        (5, 'allocate', 0x2000, 8 * MIB, '0x2'),    # B: in use until B's next event, 1 s on
        (6, 'allocate', 0x4000, 80 * MIB, '0x1'),   # A: fits no hole, past the cap
    ]
    rows += [(10 + 10 * i, 'allocate' if i % 2 == 0 else 'free', 0x5000, 512, '0x3') for i in range(20)]
    rows += [(300, 'free', 0x4000, 80 * MIB, '0x1'), (301, 'free', 0x1100, 2 * MIB, '0x1'),
             (1000005, 'free', 0x2000, 8 * MIB, '0x2')]
    with open(path, 'w') as f:
        f.write(HEADER)
        for t, action, ptr, size, stream in rows:
            f.write(f'0,{t},{action},{hex(ptr)},{size},{stream}\n')


def replay(gpupool, trace, conf, work, failures, repeat=2):
    cmd = [gpupool, 'replay', '--json', '--repeat', str(repeat), '--conf', conf]
    if work is not None:
        cmd += ['--stream-work', str(work)]
    p = subprocess.run(cmd + [trace], capture_output=True, text=True)
    if p.returncode != 0:
        failures.append(f'{" ".join(cmd)} {trace} exited {p.returncode}: {p.stderr.strip()}')
        return None
    return json.loads(p.stdout)['traces'][0]


def main(argv):
    gpupool, work = argv[1], argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    trace = os.path.join(work, 'two_streams.csv')
    events = write_two_streams(trace)
    failures = []

    for backend in ('sim', 'sim-vmm', 'sim-vmm,tenant_best_fit:on'):
        for fraction in (0.5, 1):
            r = replay(gpupool, trace, f'backend:{backend}', fraction, failures)
            if r is None:
                continue
            if r['kernels'] != 2 * events:
                failures.append(f'{backend} --stream-work {fraction}: {r["kernels"]} kernels, expected {2 * events}')
            if r['races'] or r['bad_calls'] or r['first_violation']:
                failures.append(f'{backend} --stream-work {fraction}: {r["races"]} races, {r["bad_calls"]} bad calls: '
                                f'{r["first_violation"]}')
            if r['stream_work'] != fraction:
                failures.append(f'{backend}: stream_work {r["stream_work"]}, expected {fraction}')

    idle = replay(gpupool, trace, 'backend:sim-vmm', None, failures)
    busy = replay(gpupool, trace, 'backend:sim-vmm,reuse_wait:on', 1, failures)
    apart = replay(gpupool, trace, 'backend:sim-vmm', 1, failures)
    if idle and (idle['kernels'] != 0 or idle['stream_work'] != 0 or idle['pool']['num_stream_waits'] != 0):
        failures.append(f'no --stream-work: {idle["kernels"]} kernels, stream_work {idle["stream_work"]}, '
                        f'{idle["pool"]["num_stream_waits"]} waits (expected none: every stream idle)')
    if busy and busy['pool']['num_stream_waits'] < 1:
        failures.append('--stream-work 1: B took A\'s busy block without waiting on A\'s fence, or not at all '
                        f'(num_stream_waits {busy["pool"]["num_stream_waits"]})')
    if idle and busy and busy['peak_reserved_bytes'] > idle['peak_reserved_bytes']:
        failures.append(f'--stream-work 1 with reuse_wait reserved {busy["peak_reserved_bytes"]} B, more than '
                        f'without work ({idle["peak_reserved_bytes"]} B): the wait should let B borrow X')
    if apart and (apart['pool']['num_stream_waits'] != 0 or
                  (busy and apart['peak_reserved_bytes'] <= busy['peak_reserved_bytes'])):
        failures.append(f'reuse_wait:off with work: {apart["pool"]["num_stream_waits"]} waits, reserved '
                        f'{apart["peak_reserved_bytes"]} B (expected no wait and more than '
                        f'{busy and busy["peak_reserved_bytes"]} B: B cannot use busy A\'s block)')

    # A host held up by a synchronize issues the rest of the trace late, and the GPU has run meanwhile:
    # C's work keeps pace with its events (a kernel and an event record at most), not queued up behind
    # a clock that waits for the trace's first times
    stall = os.path.join(work, 'stall.csv')
    write_stall(stall)
    held = replay(gpupool, stall, 'backend:sim', 1, failures, repeat=1)
    if held and (held['pool']['num_device_frees'] < 1 or not 0.9e9 <= held['host_stall_ns'] <= 1.1e9):
        failures.append(f'stall: {held["pool"]["num_device_frees"]} device frees, host held up '
                        f'{held["host_stall_ns"]} ns (expected about 1 s: cudaFree waits for B\'s work)')
    if held and (held['deepest_queue'] > 3 or held['races']):
        failures.append(f'stall: {held["deepest_queue"]} ops queued on one stream at once, {held["races"]} races '
                        '(expected 3 at most: each stream keeps pace with its events after the stall)')
    for conf in ('backend:sim', 'backend:sim-vmm'):
        idle = replay(gpupool, stall, conf, None, failures, repeat=1)
        if idle and (idle['host_stall_ns'] != 0 or idle['deepest_queue'] > 1):
            failures.append(f'{conf}: stall without work: host held up {idle["host_stall_ns"]} ns, '
                            f'{idle["deepest_queue"]} ops queued (expected none held up, and no kernels: the '
                            'pool\'s event records at most)')
    own = replay(gpupool, stall, 'backend:sim-vmm', 1, failures, repeat=1)
    if own and (own['pool']['num_unmaps'] < 1 or own['pool']['num_device_syncs'] != 0 or
                own['warmup']['syncs'] != 0 or own['host_stall_ns'] >= 1e6 or own['races'] or own['bad_calls']):
        failures.append(f'sim-vmm stall: {own["pool"]["num_unmaps"]} pages unmapped after '
                        f'{own["pool"]["num_unmap_waits"]} waits and {own["pool"]["num_device_syncs"]} device '
                        f'synchronizes, host held up {own["host_stall_ns"]} ns, {own["races"]} races, '
                        f'{own["bad_calls"]} bad calls: {own["first_violation"]} (expected A\'s unmaps to wait for '
                        'A\'s work only, under 1 ms, not B\'s 1 s)')

    failures += missing_from_output([gpupool, 'replay', '--stream-work', '1', '--conf', 'backend:sim-vmm', trace],
                                    ['stream work           1 of each gap', '6 kernels, 0 races, host held up 0.000 ms'], 'text output')
    for bad in ('2', '-0.5', 'x', ''):
        p = subprocess.run([gpupool, 'replay', '--stream-work', bad, trace], capture_output=True, text=True)
        if p.returncode != 2 or '--stream-work' not in p.stderr or p.stdout:
            failures.append(f'--stream-work {bad!r}: exit {p.returncode}, stderr {p.stderr.strip()!r}, '
                            f'stdout {p.stdout[:80]!r} (expected exit 2 naming the option, nothing on stdout)')
    p = subprocess.run([gpupool, 'replay', '--stream-work', '1', '--model', f'a={trace}'], capture_output=True,
                       text=True)
    if p.returncode != 2 or '--stream-work' not in p.stderr:
        failures.append(f'--stream-work with --model: exit {p.returncode}, {p.stderr.strip()!r}')
    return report(failures, 'check_replay_work: passed')


if __name__ == '__main__':
    sys.exit(main(sys.argv))
