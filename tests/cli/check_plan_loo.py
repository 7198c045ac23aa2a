#!/usr/bin/env python3
"""tests/cli/check_plan_loo.py — `gpupool plan --leave-one-out` on the shared traces of one model at three
scales (resnet18_train at batch 8/16/32, gpt_train at sequence 64/128/256): each scale predicted from the
other two (extrapolating down, interpolating, extrapolating up) must be within 5% of the trace's own peak
live bytes and of gpupool's peak reserved on both backends (the target of issue 14). Prints the table.

Usage: check_plan_loo.py GPUPOOL SHARED_DIR. Exits 77 (CTest: skipped) when the traces are absent.
"""
import json, os, subprocess, sys

FAMILIES = [('resnet18_train_b{}.csv', [8, 16, 32]), ('gpt_train_s{}.csv', [64, 128, 256])]
TARGET = 0.05


def main(gpupool, shared):
    models = os.path.join(shared, 'traces', 'models')
    if not all(os.path.exists(os.path.join(models, p.format(s))) for p, ss in FAMILIES for s in ss):
        print(f'skipped: the resnet18_train and gpt_train traces are not under {models}')
        return 77
    worst = 0.0
    print(f"{'trace':24s} {'from':>8s} {'live':>8s} {'cuda':>8s} {'vmm':>8s} {'pytorch':>8s}")
    for pattern, scales in FAMILIES:
        args = [gpupool, 'plan', '--json', '--leave-one-out']
        for s in scales:
            args += ['--trace', f'{s}={os.path.join(models, pattern.format(s))}']
        out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        for r in out['leave_one_out']:
            e = r['error']
            others = ','.join(str(s) for s in scales if s != r['scale'])
            print(f"{os.path.basename(r['path']):24s} {others:>8s} " +
                  ' '.join(f"{100 * e[k]:+7.2f}%" for k in ('peak_live', 'cuda', 'vmm', 'pytorch')))
            worst = max(worst, abs(e['peak_live']), abs(e['cuda']), abs(e['vmm']))
    print(f'largest error on peak live and gpupool reserved: {100 * worst:.3f}% (target {100 * TARGET:.0f}%)')
    return 0 if worst <= TARGET else 1


if __name__ == '__main__':
    if len(sys.argv) != 3:
        print(next(l for l in __doc__.splitlines() if l.startswith('Usage')), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
