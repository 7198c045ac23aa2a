#!/usr/bin/env python3
"""tests/cli/check_interleaved.py — several models on one GPU, as a fuzz test of the pool's sequencing:
workloads built from the real traces in ../shared/traces by ../shared/tools/interleave.py (each copy of a
trace on a stream of its own, random start offsets), from mixes picked by a seeded generator, replayed
with `gpupool replay --check --repeat 2` (gp_check after every pass, with what the pass left live and
after it is freed) under several configurations, the default and ones that turn mechanisms off or
squeeze the device. Every replay must exit 0 with no failed check and nothing left allocated; on the
default 80 GiB device no allocation may fail; on a device just above the workload's page floor
allocations may fail (cleanly), nothing else. Each workload is also replayed with busy streams
(`--stream-work 1`: every block in use on the device for as long as the trace holds it), where frees
stay pending and growth, stitching and borrowing meet other orders. Found at first: a pool destroy that
broke its heap's accounting when a pending free lay beside a page lent to another stream
(provider/pending.c). REGRESSIONS are fixed workloads (recipes of tools/multistream_sets.py) that once
failed, replayed besides the seeded ones.

Usage: check_interleaved.py GPUPOOL SHARED_DIR WORK_DIR [FIRST_SEED [COUNT]]. Exits 77 (CTest: skipped)
when SHARED_DIR has no traces or no tools/interleave.py, 1 on any failure, 0 otherwise. The seeds make
the run reproducible; other seeds explore other mixes.
"""
import glob, json, os, random, re, subprocess, sys

CONFIGS = ['backend:sim-vmm', 'backend:sim-vmm,loans:off,borrow:off', 'backend:sim-vmm,cache_slack:0,thread_cache:off',
           'backend:sim']

# (seed, traces relative to SHARED_DIR/traces, configuration, stream work, what went wrong): replayed
# (with --check) under the configuration and stream work they failed under.
REGRESSIONS = [
    (9501, ['models/squeezenet_serve.csvx2'], 'backend:sim-vmm', '1',
     'two replicas of a serving CNN, busy streams: growth filling an UNMAPPED stretch whole lost the FREE '
     'block after it to stitching, and 3 requests failed with the device nearly empty (provider/vmm.c, '
     'growth_spot)'),
]


def replay(gpupool, conf, path, device_memory=None, work=None):
    cmd = [gpupool, 'replay', '--check', '--repeat', '2', '--json', '--conf', conf]
    if device_memory is not None:
        cmd += ['--device-memory', device_memory]
    if work is not None:
        cmd += ['--stream-work', work]
    r = subprocess.run(cmd + [path], capture_output=True, text=True)
    try:
        t = json.loads(r.stdout)['traces'][0]
    except (ValueError, KeyError, IndexError):
        t = None
    return r, t


def main(gpupool, shared, work, first_seed, count):
    tool = os.path.join(shared, 'tools', 'interleave.py')
    # the traces of real models, and the small top-level one (the LLM traces of 5-52 GiB take minutes
    # under the sanitizers, which run this test too)
    traces = sorted(glob.glob(os.path.join(shared, 'traces', 'models', '*.csv')) +
                    glob.glob(os.path.join(shared, 'traces', 'cnn_eor.csv')))
    if len(traces) < 2 or not os.path.exists(tool):
        print(f'skipped: no traces or no tools/interleave.py under {shared}')
        return 77
    os.makedirs(work, exist_ok=True)
    failures = 0
    workloads = []  # (seed, mix, runs: None for every run below)
    for seed in range(first_seed, first_seed + count):
        rng = random.Random(seed)
        mix = [f'{t}x{rng.choice([1, 2, 3])}' for t in rng.sample(traces, rng.randint(2, 3))]
        workloads.append((seed, mix, None))
    for seed, parts, conf, busy, _ in REGRESSIONS:  # where ../shared still has their traces
        mix = [os.path.join(shared, 'traces', p) for p in parts]
        if all(os.path.exists(re.sub(r'x[0-9]+$', '', m)) for m in mix):
            workloads.append((seed, mix, [(conf, None, busy)]))
    for seed, mix, runs in workloads:
        path = os.path.join(work, f'interleaved_{seed}.csv')
        subprocess.run([sys.executable, tool, '--seed', str(seed), path, *mix], check=True,
                       stdout=subprocess.DEVNULL)
        names = ' '.join(os.path.basename(m) for m in mix)
        if runs is None:
            # the cudaMalloc path's figures do not depend on the streams' work (steal_wait): sim-vmm busy only
            runs = [(conf, None, None) for conf in CONFIGS] + [('backend:sim-vmm', None, '1')]
            _, t = replay(gpupool, 'backend:sim-vmm', path)
            if t is not None:  # a device 2 % above the page floor: failures allowed, nothing else
                runs.append(('backend:sim-vmm', f"{int(t['page_floor_bytes'] * 1.02) // (1 << 20) + 1}MiB", None))
        for conf, dm, busy in runs:
            r, t = replay(gpupool, conf, path, dm, busy)
            problems = []
            if r.returncode != 0:
                problems.append(f'exit {r.returncode}: {r.stderr.strip()[-500:]}')
            if t is None:
                problems.append('no JSON result')
            else:
                if t['check_failures'] != 0:
                    problems.append(f"{t['check_failures']} failed checks: {t['first_check_failure']}")
                if t['allocated_bytes_end'] != 0:
                    problems.append(f"{t['allocated_bytes_end']} bytes still allocated")
                if dm is None and t['failed_allocations'] != 0:
                    problems.append(f"{t['failed_allocations']} failed allocations: {t['first_failure']}")
            where = (f"seed {seed} [{names}] conf {conf}" + (f' device {dm}' if dm else '') +
                     (f' stream work {busy}' if busy else ''))
            if problems:
                failures += 1
                print(f'FAIL {where}: ' + '; '.join(problems))
            else:
                print(f"ok   {where}: reserved/live {t['reserved_over_live']:.3f}, "
                      f"{t['failed_allocations']} failed allocations")
        os.remove(path)
    print(f'{len(workloads)} workloads: {failures} failed replays')
    return 1 if failures else 0


if __name__ == '__main__':
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1,
                  int(sys.argv[5]) if len(sys.argv) > 5 else 3))
