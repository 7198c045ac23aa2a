#!/usr/bin/env python3
"""multistream_sets.py — builds a set of several-models-on-one-GPU workloads to check a rule on, from
the single-stream traces in ../shared/traces (and models/), with ../shared/tools/interleave.py.

Why: the several-stream figures move by 0.01-0.02 on any single workload with any layout change (the
seed alone does), so a rule is judged by the mean over many workloads, built before its figures are
looked at. Each workload is a recipe drawn from its number N alone (random.Random(N)): 1-4 traces, each
used 1-3 times (`xK`: K copies, each on a stream of its own), interleaved with `--seed N`. The same N
gives the same workload on any machine, so a set is named by its first number and its size
(bench/RESULTS.md lists the recipes of every set it reports).

Usage: tools/multistream_sets.py [--shared DIR] [--exclude PREFIX]... [--dry-run] FIRST COUNT OUTDIR
  FIRST COUNT      workloads FIRST .. FIRST+COUNT-1, written as OUTDIR/rN.csv
  --exclude PREFIX leave traces whose file name starts with PREFIX out of the draw (for example
                   lm_ctx: four of them exceed an 80 GiB device)
  --dry-run        print the recipes only
Prints one line per workload: N and its recipe. Standard library only."""
import argparse
import glob
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw_pool(shared, exclude):
    """The traces a recipe draws from, as paths relative to shared/traces, in a fixed order."""
    traces = os.path.join(shared, 'traces')
    found = glob.glob(os.path.join(traces, '*.csv')) + glob.glob(os.path.join(traces, 'models', '*.csv'))
    return sorted(os.path.relpath(p, traces) for p in found
                  if not any(os.path.basename(p).startswith(x) for x in exclude))


def recipe(number, pool):
    """Workload `number`: 1-4 draws from pool, each with a copy count of 1-3 (written xK when K > 1)."""
    rnd = random.Random(number)
    parts = []
    for _ in range(rnd.randint(1, 4)):
        trace, copies = rnd.choice(pool), rnd.randint(1, 3)
        parts.append(trace + (f'x{copies}' if copies > 1 else ''))
    return parts


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--shared', default=os.path.join(os.path.dirname(ROOT), 'shared'))
    ap.add_argument('--exclude', action='append', default=[])
    ap.add_argument('--dry-run', action='store_true')
    ap.add_argument('first', type=int)
    ap.add_argument('count', type=int)
    ap.add_argument('outdir')
    a = ap.parse_args(argv)
    if a.count < 1:
        ap.error(f'COUNT must be at least 1, not {a.count}')
    interleave = os.path.join(a.shared, 'tools', 'interleave.py')
    pool = draw_pool(a.shared, a.exclude)
    if not pool:
        ap.error(f'no trace to draw from in {a.shared}/traces (after --exclude {a.exclude})')
    if not a.dry_run and not os.path.isfile(interleave):
        ap.error(f'{interleave} does not exist: --shared names the folder that holds traces/ and tools/')
    if not a.dry_run:
        os.makedirs(a.outdir, exist_ok=True)
    traces = os.path.join(a.shared, 'traces')
    for number in range(a.first, a.first + a.count):
        parts = recipe(number, pool)
        print(number, ' '.join(parts), flush=True)
        if a.dry_run:
            continue
        out = os.path.join(a.outdir, f'r{number}.csv')
        subprocess.run([sys.executable, interleave, '--seed', str(number), out] +
                       [os.path.join(traces, p) for p in parts], check=True)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
