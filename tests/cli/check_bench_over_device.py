#!/usr/bin/env python3
"""tests/cli/check_bench_over_device.py — a workload that asks for more than the device holds.

`gpupool replay --json` reports what the simulated device holds (device_memory_bytes, and as text
device_memory: --conf's device_memory over --device-memory) and what the trace asks for at its peak as recorded
(trace_peak_live_bytes, whatever the pool served). tools/bench_traces.py marks a workload whose trace
asks for more than the device holds, and leaves it out of the summary and the targets (its failed
allocations are the device's size, not the pool's doing), while a workload that fits stays in.

Two synthetic traces, no ../shared needed: `fits` (40 MiB live at most) and `over` (three 40 MiB
buffers live at once), replayed on a 64 MiB device; the PyTorch models are left out (--model names no
file), so only gpupool runs.

Usage: check_bench_over_device.py GPUPOOL WORK_DIR. Exits 1 on any failure, 0 otherwise.
"""
import json, os, shutil, subprocess, sys

from synthetic_trace import missing_from_output, report, write_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20


def main(argv):
    gpupool, work = argv[1], argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fits, over = os.path.join(work, 'fits.csv'), os.path.join(work, 'over.csv')
    write_trace(fits, [[40 * MIB]] * 2)
    write_trace(over, [[40 * MIB] * 3] * 2)
    failures = []

    # replay's own figures: the device as configured (--conf wins over --device-memory), the demand as traced
    for conf, dm, want, text in (('backend:sim-vmm', '64MiB', 64 * MIB, '64MiB'),
                                 ('backend:sim-vmm,device_memory:96MiB', '64MiB', 96 * MIB, '96.0 MiB')):
        p = subprocess.run([gpupool, 'replay', '--json', '--conf', conf, '--device-memory', dm, over],
                           capture_output=True, text=True)
        if p.returncode != 0:
            failures.append(f'replay {conf} failed: {p.stderr.strip()}')
            continue
        r = json.loads(p.stdout)['traces'][0]
        if r.get('device_memory_bytes') != want:
            failures.append(f'{conf} --device-memory {dm}: device_memory_bytes {r.get("device_memory_bytes")}, '
                            f'expected {want}')
        if r.get('device_memory') != text:
            failures.append(f'{conf} --device-memory {dm}: device_memory {r.get("device_memory")!r}, expected {text!r}')
        if r.get('trace_peak_live_bytes') != 120 * MIB:
            failures.append(f'trace_peak_live_bytes {r.get("trace_peak_live_bytes")}, expected {120 * MIB}')
        if r['failed_allocations'] == 0:
            failures.append(f'{conf}: 120 MiB live on a {want >> 20} MiB device failed nothing')

    bench = [sys.executable, os.path.join(ROOT, 'tools', 'bench_traces.py'), '--gpupool', gpupool, '--no-shared',
             '--no-cache', '--model', os.path.join(work, 'no-such-model.py'), '--device-memory', '64MiB',
             '--repeat', '2', fits, over]
    p = subprocess.run(bench + ['--json'], capture_output=True, text=True)
    if p.returncode != 0:
        failures.append(f'bench_traces --json failed ({p.returncode}): {p.stderr.strip()}')
    else:
        out = json.loads(p.stdout)
        rows = {os.path.basename(r['trace']): r for r in out['rows']}
        if not rows['over.csv']['over_device'] or rows['fits.csv']['over_device']:
            failures.append(f"over_device: over {rows['over.csv']['over_device']}, fits {rows['fits.csv']['over_device']}")
        if [os.path.basename(t) for t in out['over_device']] != ['over.csv']:
            failures.append(f"over_device list {out['over_device']}")
        failed = [t for t in out['targets'] if t['target'] == 'no failed allocation']
        if not failed or not failed[0]['met']:
            failures.append(f'the over-device workload still counts in the targets: {failed}')
        if rows['over.csv']['failed_allocations'] == 0:
            failures.append('the over-device workload failed nothing in bench_traces')
    failures += missing_from_output(bench, ('over the device', 'left out of worst'), 'bench_traces table')

    return report(failures, 'replay reports the device and the demand; bench_traces leaves the over-device '
                            'workload out')


if __name__ == '__main__':
    sys.exit(main(sys.argv))
