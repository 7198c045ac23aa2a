#!/usr/bin/env python3
"""tests/cli/check_compare_bench.py — tools/compare_bench.py sets two bench_traces.py runs side by side.

Two small JSON files in bench_traces.py's shape (no replay, no ../shared): four workloads in two
folders, one of them larger than the device in the first run, one only in the second. The comparison
must count what moved and by how much (geomean, worst, workloads past issue 11's per-stream-count
targets, last-pass calls, better and worse past the threshold), leave the over-device workload out,
name the one present in one run only, and list the largest moves. Bad input (a missing file, text
that is not JSON, JSON without rows, a column no row has, an unknown column, two runs with nothing in
common, a negative threshold) exits 2 with one line that names it, and prints nothing on stdout.

Usage: check_compare_bench.py WORK_DIR. Exits 1 on any failure, 0 otherwise.
"""
import json, math, os, shutil, subprocess, sys

from synthetic_trace import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, 'tools', 'compare_bench.py')


def row(trace, streams, vmm, cuda, maps=0, over=False):
    return {'trace': trace, 'streams': streams, 'over_device': over, 'sim_vmm': vmm, 'cuda': cuda,
            'vmm_last_pass_device_calls': 0, 'vmm_last_pass_map_calls': maps, 'cuda_last_pass_device_calls': 0}


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def main(argv):
    work = argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    before, after = os.path.join(work, 'before.json'), os.path.join(work, 'after.json')
    with open(before, 'w') as f:
        json.dump({'rows': [row('/s/A/one.csv', 1, 1.02, 1.05), row('/s/A/three.csv', 3, 1.06, 1.20, maps=10),
                            row('/s/B/two.csv', 2, 1.01, 1.12), row('/s/B/big.csv', 2, 1.50, 1.60, over=True)]}, f)
    with open(after, 'w') as f:
        json.dump({'rows': [row('/s/A/one.csv', 1, 1.04, 1.05, maps=3), row('/s/A/three.csv', 3, 1.04, 1.20),
                            row('/s/B/two.csv', 2, 1.0105, 1.08), row('/s/B/big.csv', 2, 1.40, 1.60),
                            row('/s/B/new.csv', 1, 1.00, 1.00)]}, f)
    failures = []

    p = run('--top', '2', before, after)
    lines = {line.split()[0]: line for line in p.stdout.splitlines() if line.strip()}
    g_before = math.exp((math.log(1.02) + math.log(1.06) + math.log(1.01)) / 3)
    g_after = math.exp((math.log(1.04) + math.log(1.04) + math.log(1.0105)) / 3)
    wants = {'all': [f'n=3 ', f'geomean {g_before:.4f} -> {g_after:.4f}', 'worst 1.060 -> 1.040',
                     'past target 1 -> 1', 'last-pass calls on 1 -> 1 (10 -> 3)', 'better 1  worse 1'],
             'A': ['n=2 ', 'past target 1 -> 1', 'better 1  worse 1'],
             'B': ['n=1 ', 'better 0  worse 0'],
             '+0.0200': ['/s/A/one.csv  1.0200 -> 1.0400', 'last-pass calls 0 -> 3'],
             '-0.0200': ['/s/A/three.csv  1.0600 -> 1.0400', 'streams 3']}
    if p.returncode != 0:
        failures.append(f'exit {p.returncode}: {p.stderr.strip()}')
    for key, texts in wants.items():
        for text in texts:
            if text not in lines.get(key, ''):
                failures.append(f'line {key!r} lacks {text!r}: {lines.get(key)!r}')
    if 'in one run only (1): /s/B/new.csv' not in p.stdout:
        failures.append(f'the workload of one run is not named: {p.stdout}')
    if 'big.csv' in p.stdout:
        failures.append(f'the over-device workload was compared: {p.stdout}')
    if '/s/B/two.csv' in p.stdout:
        failures.append(f'a move within the threshold was listed: {p.stdout}')

    # cuda: the 1.10 target for any stream count, no map calls counted
    p = run('--column', 'cuda', '--top', '0', before, after)
    all_line = [line for line in p.stdout.splitlines() if line.startswith('all')]
    if p.returncode != 0 or not all_line or 'past target 2 -> 1' not in all_line[0] or 'better 1  worse 0' not in all_line[0]:
        failures.append(f'cuda column: {p.returncode} {p.stdout} {p.stderr}')

    bad_json, no_rows, no_column = (os.path.join(work, n) for n in ('bad.json', 'norows.json', 'nocol.json'))
    with open(bad_json, 'w') as f:
        f.write('{"rows": [')
    with open(no_rows, 'w') as f:
        json.dump({'summary': {}}, f)
    with open(no_column, 'w') as f:
        json.dump({'rows': [{'trace': '/s/A/one.csv', 'streams': 1, 'cuda': 1.1}]}, f)
    only_other = os.path.join(work, 'other.json')
    with open(only_other, 'w') as f:
        json.dump({'rows': [row('/s/C/x.csv', 1, 1.0, 1.0)]}, f)
    for args, names in ((['/nonexistent/x.json', after], '/nonexistent/x.json'),
                        ([bad_json, after], 'not JSON'),
                        ([no_rows, after], 'no "rows" list'),
                        ([no_column, after], '"sim_vmm"'),
                        (['--column', 'speed', before, after], '--column speed'),
                        ([before, only_other], 'share no workload'),
                        (['--threshold', '-1', before, after], '--threshold')):
        p = run(*args)
        if p.returncode != 2 or p.stdout or names not in p.stderr or len(p.stderr.strip().splitlines()) != 1:
            failures.append(f'{args}: exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r} (wants {names!r})')

    return report(failures, 'compare_bench.py counts the moves, keeps to the targets and refuses bad input')


if __name__ == '__main__':
    sys.exit(main(sys.argv))
