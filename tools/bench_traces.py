#!/usr/bin/env python3
"""Fragmentation benchmark on the real traces: gpupool against PyTorch's caching allocator.

For every trace in ../shared/traces (relative to the repository root; never copied into the project)
it runs `build/gpupool replay --json --repeat 6` (fragmentation and device calls), `build/gpupool replay
--json --repeat 11` (host time: the median pass, so that the cold first passes, whose time is the
simulated device's, do not decide it) and ../shared/tools/pytorch_policy_model.py --json,
reads PyTorch's peak reserved as measured on the GPU from ../shared/traces/README.md where the README
gives it, and prints one row per trace:

    peak live | gpupool peak reserved | PyTorch peak reserved | gpupool ratio | PyTorch ratio | ...

Targets (a benchmark, not a test): gpupool's reserved/live at most 1.05 on every trace with the default
configuration, and zero device calls in the last of the repeats. The script reports whether each was
met and exits 0 either way (1 only when something could not run). Standard library only.

Usage: tools/bench_traces.py [--gpupool build/gpupool] [--traces DIR] [--repeat N] [--speed-repeat N]
                             [--conf CONF] [--json]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_RATIO = 1.05


def readme_measured(traces_dir):
    """PyTorch peak reserved measured on the GPU, per file name, from the traces' README table."""
    out = {}
    path = os.path.join(traces_dir, 'README.md')
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if len(cells) >= 6 and cells[0].endswith('.csv') and re.fullmatch(r'\d+', cells[4] or ''):
                out[cells[0]] = {'peak_reserved': int(cells[4]), 'warm': '*' in cells[5]}
    return out


def run_json(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def mib(n):
    return f"{n / (1 << 20):,.1f}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--gpupool', default=os.path.join(ROOT, 'build', 'gpupool'))
    ap.add_argument('--traces', default=os.path.join(os.path.dirname(ROOT), 'shared', 'traces'))
    ap.add_argument('--model', default=os.path.join(os.path.dirname(ROOT), 'shared', 'tools',
                                                    'pytorch_policy_model.py'))
    ap.add_argument('--repeat', type=int, default=6, help='passes for fragmentation and device calls')
    ap.add_argument('--speed-repeat', type=int, default=11, help='passes for the host time (median)')
    ap.add_argument('--conf', default='')
    ap.add_argument('--target', type=float, default=None,
                    help='reserved/live target (default 1.05; 1.03 with backend:sim-vmm, issue 4)')
    ap.add_argument('--json', action='store_true', help='print the rows as one JSON object')
    args = ap.parse_args(argv)

    traces = sorted(glob.glob(os.path.join(args.traces, '*.csv')))
    if not traces:
        print(f"bench_traces.py: no traces at {args.traces} (the shared traces are absent); skipped")
        return 0
    if not os.access(args.gpupool, os.X_OK):
        print(f"bench_traces.py: {args.gpupool} not found: build first (cmake -S . -B build && "
              "cmake --build build)", file=sys.stderr)
        return 1
    cmd = [args.gpupool, 'replay', '--json']
    if args.conf:
        cmd += ['--conf', args.conf]
    try:
        ours = {os.path.basename(t['path']): t
                for t in run_json(cmd + ['--repeat', str(args.repeat)] + traces)['traces']}
        speed = {os.path.basename(t['path']): t
                 for t in run_json(cmd + ['--repeat', str(args.speed_repeat)] + traces)['traces']}
        model = {}
        if os.path.exists(args.model):
            model = {os.path.basename(t['path']): t
                     for t in run_json([sys.executable, args.model, '--json'] + traces)['traces']}
    except (RuntimeError, ValueError, KeyError) as e:
        print(f"bench_traces.py: {e}", file=sys.stderr)
        return 1
    measured = readme_measured(args.traces)

    rows = []
    for path in traces:
        name = os.path.basename(path)
        g = ours[name]
        live = g['peak_live_bytes']
        m = measured.get(name)
        pm = model.get(name)
        rows.append({
            'trace': name,
            'events': g['events'],
            'peak_live_bytes': live,
            'gpupool_peak_reserved_bytes': g['peak_reserved_bytes'],
            'gpupool_reserved_over_live': g['reserved_over_live'],
            'pytorch_measured_peak_reserved_bytes': m['peak_reserved'] if m else None,
            'pytorch_measured_reserved_over_live': m['peak_reserved'] / live if m and live else None,
            'pytorch_measured_warm_start': m['warm'] if m else None,
            'pytorch_model_peak_reserved_bytes': pm['peak_reserved_bytes'] if pm else None,
            'pytorch_model_reserved_over_live': pm['reserved_over_live'] if pm else None,
            'device_calls_first_repeat': g.get('device_calls_first_repeat'),
            'device_calls_last_repeat': g['device_calls_last_repeat'],
            'map_calls_first_repeat': g.get('map_calls_first_repeat', 0),
            'map_calls_last_repeat': g.get('map_calls_last_repeat', 0),
            'failed_allocations': g['failed_allocations'],
            'host_ns_per_event': speed[name]['host_ns_per_event'],
            'host_ns_per_event_first_pass': speed[name]['host_ns_per_event_first'],
            'events_per_second': 1e9 / speed[name]['host_ns_per_event'] if speed[name]['host_ns_per_event'] else 0.0,
        })

    target = args.target if args.target is not None else (1.03 if 'sim-vmm' in args.conf else TARGET_RATIO)
    ratio_met = all(r['gpupool_reserved_over_live'] <= target for r in rows)
    calls_met = all(r['device_calls_last_repeat'] == 0 and r['map_calls_last_repeat'] == 0 for r in rows)
    speed_met = all(r['events_per_second'] >= 5e6 for r in rows)
    if args.json:
        print(json.dumps({'repeat': args.repeat, 'speed_repeat': args.speed_repeat, 'conf': args.conf, 'rows': rows,
                          'target_ratio_met': ratio_met, 'target_last_repeat_calls_met': calls_met,
                          'target_5M_events_per_second_met': speed_met}))
        return 0

    conf = args.conf or 'default configuration'
    print(f"gpupool replay --repeat {args.repeat} ({conf}) against PyTorch's caching allocator; "
          "sizes in MiB")
    hdr = (f"{'trace':30s} {'peak live':>11s} {'gpupool rsv':>11s} {'PyTorch rsv':>11s} {'gpupool':>8s} "
           f"{'PyTorch':>8s} {'model':>7s} {'calls':>11s} {'maps':>11s} {'Mev/s':>6s}")
    print(hdr)
    print('-' * len(hdr))
    for r in rows:
        pt = r['pytorch_measured_peak_reserved_bytes']
        pt_ratio = r['pytorch_measured_reserved_over_live']
        model_ratio = r['pytorch_model_reserved_over_live']
        warm = '*' if r['pytorch_measured_warm_start'] else ' '
        print(f"{r['trace'][:30]:30s} {mib(r['peak_live_bytes']):>11s} "
              f"{mib(r['gpupool_peak_reserved_bytes']):>11s} {(mib(pt) if pt else '-'):>11s} "
              f"{r['gpupool_reserved_over_live']:8.3f} "
              f"{(f'{pt_ratio:.3f}' if pt_ratio else '-'):>7s}{warm} "
              f"{(f'{model_ratio:.3f}' if model_ratio else '-'):>7s} "
              f"{r['device_calls_first_repeat']:>5d}/{r['device_calls_last_repeat']:<5d} "
              f"{r['map_calls_first_repeat']:>5d}/{r['map_calls_last_repeat']:<5d} "
              f"{r['events_per_second'] / 1e6:6.1f}")
    print()
    print("gpupool/PyTorch: peak reserved over peak live. PyTorch: measured on the GPU (README; * = the run "
          "began with a warm cache, not a clean comparison); model: pytorch_policy_model.py on the same trace.")
    print(f"calls: device allocate+free calls (maps: map+unmap calls, sim-vmm) in the first/last of {args.repeat} "
          f"repeats. Mev/s: million events "
          f"per second, median of {args.speed_repeat} passes (single thread, simulated GPU).")
    worst = max(rows, key=lambda r: r['gpupool_reserved_over_live'])
    print(f"target reserved/live <= {target}: {'MET' if ratio_met else 'MISSED'} "
          f"(worst {worst['gpupool_reserved_over_live']:.3f} on {worst['trace']})")
    print(f"target zero device and map calls in the last repeat: {'MET' if calls_met else 'MISSED'} "
          f"({sum(1 for r in rows if r['device_calls_last_repeat'] or r['map_calls_last_repeat'])} trace(s) with calls)")
    slowest = min(rows, key=lambda r: r['events_per_second'])
    print(f"target >= 5 M events/s: {'MET' if speed_met else 'MISSED'} "
          f"(slowest {slowest['events_per_second'] / 1e6:.1f} M/s on {slowest['trace']})")
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
