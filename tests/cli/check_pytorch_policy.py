#!/usr/bin/env python3
"""tests/cli/check_pytorch_policy.py — the C port of PyTorch's allocator policies (cli/pytorch_policy.c,
`gpupool replay --compare pytorch`) against the reference model ../shared/tools/pytorch_policy_model.py,
on every trace in ../shared/traces, models/ and multistream/: the same peak live and peak reserved bytes
under both policies (default and --expandable), hence the same ratios to three decimals.

Usage: check_pytorch_policy.py GPUPOOL SHARED_DIR. Exits 77 (CTest: skipped) when SHARED_DIR has no traces
or no tools/pytorch_policy_model.py, 1 on any difference, 0 when every trace agrees.
"""
import glob, json, os, subprocess, sys


def main(gpupool, shared):
    model = os.path.join(shared, 'tools', 'pytorch_policy_model.py')
    traces = sorted(glob.glob(os.path.join(shared, 'traces', '*.csv')) +
                    glob.glob(os.path.join(shared, 'traces', 'models', '*.csv')) +
                    glob.glob(os.path.join(shared, 'traces', 'multistream', '*.csv')))
    if not traces or not os.path.exists(model):
        print(f'skipped: no traces or no pytorch_policy_model.py under {shared}')
        return 77
    out = subprocess.run([gpupool, 'replay', '--json', '--compare', 'pytorch', *traces], check=True,
                         capture_output=True, text=True).stdout
    ours = {t['path']: t['pytorch'] for t in json.loads(out)['traces']}
    failures = 0
    for policy, flags in (('default', []), ('expandable', ['--expandable'])):
        ref = json.loads(subprocess.run([sys.executable, model, '--json', *flags, *traces], check=True,
                                        capture_output=True, text=True).stdout)['traces']
        for r in ref:
            c = ours[r['path']][policy]
            same = (c['peak_live_bytes'] == r['peak_live_bytes'] and
                    c['peak_reserved_bytes'] == r['peak_reserved_bytes'] and
                    f"{c['reserved_over_live']:.3f}" == f"{r['reserved_over_live']:.3f}")
            print(f"{'ok  ' if same else 'DIFF'} {policy:10s} {os.path.basename(r['path']):32s} "
                  f"model {r['peak_reserved_bytes']:>13d} B {r['reserved_over_live']:.3f}  "
                  f"C {c['peak_reserved_bytes']:>13d} B {c['reserved_over_live']:.3f}")
            failures += not same
    print(f'{len(traces)} traces x 2 policies: {failures} differ')
    return 1 if failures else 0


if __name__ == '__main__':
    if len(sys.argv) != 3:
        print(next(l for l in __doc__.splitlines() if l.startswith('Usage')), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
