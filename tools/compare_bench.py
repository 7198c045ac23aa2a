#!/usr/bin/env python3
"""compare_bench.py — what a change did, workload by workload: two runs of `tools/bench_traces.py --json`
(before and after; another build with --gpupool, another configuration with --conf) set side by side.

Why: a layout rule moves single workloads by 0.01-0.02 either way (bench/RESULTS.md, "the seed alone
moves a workload"), so a change is judged by how many workloads it makes better and worse, by its tails
against the per-workload targets of issue 11, and by the calls it leaves in the last pass, never by one
mean or a favourite trace. This prints those, per folder of workloads and over all of them.

Usage: tools/compare_bench.py [--column C] [--threshold T] [--top N] BEFORE.json AFTER.json
  --column C     sim_vmm (default), cuda, pytorch, pytorch_expandable or page_floor_over_live
  --threshold T  a workload counts as better or worse when it moves by more than T (default 0.002)
  --top N        also list the N largest moves each way (default 8; 0: none)
Workloads larger than the device (`over_device` in either run) are left out, as bench_traces.py leaves
them out of its summary; workloads in one run only are counted and named, not compared.
Targets (issue 11): sim_vmm <= 1.03 on one stream and <= 1.05 on several; cuda <= 1.10. Last-pass calls:
device and map calls for sim_vmm, device calls for cuda.
Exit 0 with the comparison on stdout; 2 with one line on stderr (and nothing on stdout) when an input
cannot be read, is not bench_traces.py's JSON, or the two runs share no workload. Standard library only.
"""
import argparse
import json
import math
import os
import sys

COLUMNS = ('sim_vmm', 'cuda', 'pytorch', 'pytorch_expandable', 'page_floor_over_live')
CALLS = {'sim_vmm': ('vmm_last_pass_device_calls', 'vmm_last_pass_map_calls'),
         'cuda': ('cuda_last_pass_device_calls',)}


class InputError(Exception):
    pass


def target(column, streams):
    """The issue's bound for a workload of `streams` streams in `column`, or None where it sets none."""
    if column == 'sim_vmm':
        return 1.03 if streams == 1 else 1.05
    if column == 'cuda':
        return 1.10
    return None


def load(path, column):
    """({trace: row} of the workloads that fit the device, each with a number in `column`; the set of
    those that do not)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise InputError(f'{path}: cannot read it ({e.strerror})')
    except ValueError as e:
        raise InputError(f'{path}: not JSON ({e})')
    if not isinstance(data, dict) or not isinstance(data.get('rows'), list):
        raise InputError(f'{path}: not the output of tools/bench_traces.py --json (no "rows" list)')
    rows, over = {}, set()
    for i, row in enumerate(data['rows']):
        if not isinstance(row, dict) or not isinstance(row.get('trace'), str):
            raise InputError(f'{path}: row {i} has no "trace"')
        if row.get('over_device'):
            over.add(row['trace'])
            continue
        value = row.get(column)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise InputError(f'{path}: row {i} ({row["trace"]}) has no positive number in "{column}"')
        rows[row['trace']] = row
    return rows, over


def past_target(row, column):
    bound = target(column, row.get('streams', 1))
    return bound is not None and row[column] > bound


def calls(row, column):
    return sum(int(row.get(k) or 0) for k in CALLS.get(column, ()))


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary(name, pairs, column, threshold):
    """One line: the folder's count, geomean, worst, workloads past the target, last-pass calls, moves."""
    before = [b[column] for b, _ in pairs]
    after = [a[column] for _, a in pairs]
    over_b = sum(1 for b, _ in pairs if past_target(b, column))
    over_a = sum(1 for _, a in pairs if past_target(a, column))
    calling_b = sum(1 for b, _ in pairs if calls(b, column) > 0)
    calling_a = sum(1 for _, a in pairs if calls(a, column) > 0)
    better = sum(1 for b, a in pairs if a[column] < b[column] - threshold)
    worse = sum(1 for b, a in pairs if a[column] > b[column] + threshold)
    line = (f'{name:<14} n={len(pairs):<4} geomean {geomean(before):.4f} -> {geomean(after):.4f}'
            f'  worst {max(before):.3f} -> {max(after):.3f}')
    if target(column, 1) is not None:
        line += f'  past target {over_b} -> {over_a}'
    if column in CALLS:
        line += (f'  last-pass calls on {calling_b} -> {calling_a}'
                 f' ({sum(calls(b, column) for b, _ in pairs)} -> {sum(calls(a, column) for _, a in pairs)})')
    return line + f'  better {better}  worse {worse}'


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--column', default='sim_vmm')
    ap.add_argument('--threshold', type=float, default=0.002)
    ap.add_argument('--top', type=int, default=8)
    ap.add_argument('before')
    ap.add_argument('after')
    args = ap.parse_args(argv)
    try:
        if args.column not in COLUMNS:
            raise InputError(f'--column {args.column}: not one of {", ".join(COLUMNS)}')
        if not args.threshold >= 0 or args.top < 0:
            raise InputError('--threshold and --top must not be negative')
        (before, over_b), (after, over_a) = load(args.before, args.column), load(args.after, args.column)
        for trace in over_b | over_a:  # larger than the device in either run: compared in neither
            before.pop(trace, None)
            after.pop(trace, None)
        common = sorted(set(before) & set(after))
        if not common:
            raise InputError(f'{args.before} and {args.after} share no workload that fits the device')
    except InputError as e:
        print(f'compare_bench.py: {e}', file=sys.stderr)
        return 2
    col = args.column
    print(f'{col}: {args.before} -> {args.after}')
    groups = {}
    for trace in common:
        groups.setdefault(os.path.basename(os.path.dirname(trace)) or '.', []).append((before[trace], after[trace]))
    for name in sorted(groups):
        print(summary(name, groups[name], col, args.threshold))
    pairs = [(before[t], after[t]) for t in common]
    print(summary('all', pairs, col, args.threshold))
    only = sorted(set(before) ^ set(after))
    if only:
        print(f'in one run only ({len(only)}): ' + ', '.join(only))
    if args.top > 0:
        moves = sorted(((after[t][col] - before[t][col], t) for t in common), key=lambda m: (m[0], m[1]))
        shown = [m for m in moves[:args.top] if m[0] < -args.threshold]
        shown += [m for m in moves[-args.top:] if m[0] > args.threshold and m not in shown]
        for delta, t in shown:
            b, a = before[t], after[t]
            print(f'{delta:+.4f} {t}  {b[col]:.4f} -> {a[col]:.4f}  streams {a.get("streams", 1)}'
                  + (f'  last-pass calls {calls(b, col)} -> {calls(a, col)}' if col in CALLS else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
