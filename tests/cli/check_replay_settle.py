#!/usr/bin/env python3
"""tests/cli/check_replay_settle.py — whether and when a pool stops calling the device over passes.

`gpupool replay` reports quiet_from_pass: the first pass (from 1) from which no pass made a device, map
or unmap call, 0 when the last pass made one; its text says "settled". tools/bench_traces.py --settle N
replays N passes wherever a backend still called in the last of its --repeat passes, and says from
which pass it made none, or what it still made in pass N.

Two synthetic traces, no ../shared needed, both backends:
  - `steady`: one 40 MiB buffer allocated and freed twice: the first pass makes the memory, every later
    pass reuses it (quiet from pass 2);
  - `churn`: 200 blocks of 500 KiB live together and freed, then one 400 MiB buffer: the two phases
    together are more than the cache cap allows (1.04 x peak), so every pass gives one phase's memory
    back to make the other's (calls in every pass, by design: memory kept near demand).
The virtual-memory calls of the first and the last pass (`warmup`, `last_pass_calls`: counts by kind and
their modelled device time) add up to the pass's map and unmap calls, and are none in a quiet last pass.
`--call-costs` prices them at given per-call costs (what bench/gpu/vmm_probe measures on a GPU).

Usage: check_replay_settle.py GPUPOOL WORK_DIR. Exits 1 on any failure, 0 otherwise.
"""
import json, os, shutil, subprocess, sys

from synthetic_trace import missing_from_output, report, write_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KIB, MIB = 1 << 10, 1 << 20
BACKENDS = ('sim', 'sim-vmm')


def replay(gpupool, trace, backend, repeat, failures, json_out=True):
    cmd = [gpupool, 'replay', '--repeat', str(repeat), '--conf', f'backend:{backend}'] + (['--json'] if json_out else [])
    p = subprocess.run(cmd + [trace], capture_output=True, text=True)
    if p.returncode != 0:
        failures.append(f'{" ".join(cmd)} {trace} failed: {p.stderr.strip()}')
        return None
    return json.loads(p.stdout)['traces'][0] if json_out else p.stdout


def main(argv):
    gpupool, work = argv[1], argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    steady, churn = os.path.join(work, 'steady.csv'), os.path.join(work, 'churn.csv')
    write_trace(steady, [[40 * MIB], [40 * MIB]])
    write_trace(churn, [[500 * KIB] * 200, [400 * MIB]])
    failures = []

    for backend in BACKENDS:
        r = replay(gpupool, steady, backend, 3, failures)
        if r and (r['quiet_from_pass'] != 2 or r['device_calls_first_repeat'] == 0):
            failures.append(f'steady on {backend}: quiet_from_pass {r["quiet_from_pass"]} (expected 2), '
                            f'{r["device_calls_first_repeat"]} device calls in the first pass')
        if r and any(r['last_pass_calls'][k] for k in ('creates', 'maps', 'unmaps', 'set_access', 'syncs')):
            failures.append(f'steady on {backend}: a quiet last pass has calls in last_pass_calls {r["last_pass_calls"]}')
        r = replay(gpupool, steady, backend, 1, failures)
        if r and r['quiet_from_pass'] != 0:  # the only pass made the memory
            failures.append(f'steady on {backend}, one pass: quiet_from_pass {r["quiet_from_pass"]}, expected 0')
        r = replay(gpupool, churn, backend, 3, failures)
        if r and (r['quiet_from_pass'] != 0 or r['device_calls_last_repeat'] + r['map_calls_last_repeat'] == 0):
            failures.append(f'churn on {backend}: quiet_from_pass {r["quiet_from_pass"]}, last pass '
                            f'{r["device_calls_last_repeat"]} device + {r["map_calls_last_repeat"]} map calls')
        for which, total in (('warmup', 'map_calls_first_repeat'), ('last_pass_calls', 'map_calls_last_repeat')):
            c = r[which] if r else None
            if c and (c['maps'] + c['unmaps'] != r[total] or (backend == 'sim-vmm') != (c['model_us'] > 0) or
                      c['syncs'] > c['unmaps'] or c['set_access'] > c['maps']):
                failures.append(f'churn on {backend}: {which} {c} does not add up to {total} {r[total]}')
        text = replay(gpupool, steady, backend, 3, failures, json_out=False) or ''
        if 'settled               from pass 2: no device, map or unmap call in passes 2-3' not in text:
            failures.append(f'steady on {backend}: text does not say it settled from pass 2:\n{text}')
        text = replay(gpupool, churn, backend, 3, failures, json_out=False) or ''
        if 'settled               no: the last pass made' not in text:
            failures.append(f'churn on {backend}: text does not say it has not settled:\n{text}')
        if (backend == 'sim-vmm') != ('last-pass model' in text):
            failures.append(f'churn on {backend}: the last-pass model line is {"missing" if backend == "sim-vmm" else "there"}:\n{text}')

    # --call-costs: the model's per-call costs; creates alone at 1 us each make model_us the create count
    # in both records, the costs used come back in call_costs_us, and a bad value changes nothing: exit 2,
    # nothing on stdout, and a message that names the key
    for costs, unit in (('create=1,map=0,unmap=0,access=0', 'creates'), ('map=0,create=0,unmap=0,access=0,sync=2', 'syncs')):
        p = subprocess.run([gpupool, 'replay', '--json', '--repeat', '3', '--conf', 'backend:sim-vmm',
                            '--call-costs', costs, churn], capture_output=True, text=True)
        r = json.loads(p.stdout)['traces'][0] if p.returncode == 0 else None
        weight = 2 if unit == 'syncs' else 1
        if r is None or any(abs(r[w]['model_us'] - weight * r[w][unit]) > 0.05 for w in ('warmup', 'last_pass_calls')):
            failures.append(f'--call-costs {costs}: {p.returncode} {p.stderr.strip()} '
                            f'{r and (r["warmup"], r["last_pass_calls"])}')
        elif r['call_costs_us'] != {'create': 1 if unit == 'creates' else 0, 'map': 0, 'unmap': 0, 'access': 0,
                                    'sync': 2 if unit == 'syncs' else 0}:
            failures.append(f'--call-costs {costs}: call_costs_us {r["call_costs_us"]}')
    r = replay(gpupool, churn, 'sim-vmm', 1, failures)
    if r and r['call_costs_us'] != {'create': 193, 'map': 1.5, 'unmap': 26, 'access': 36, 'sync': 0}:
        failures.append(f'without --call-costs: call_costs_us {r["call_costs_us"]} (the published A100 figures)')
    for bad, says in (('create=-1', "create: '-1' is not a cost"), ('copy=3', "'copy': not one of create"),
                      ('map=1x', "map: '1x' is not a cost"), ('', 'no costs given')):
        p = subprocess.run([gpupool, 'replay', '--json', '--call-costs', bad, churn], capture_output=True, text=True)
        if p.returncode != 2 or p.stdout or says not in p.stderr:
            failures.append(f'--call-costs {bad!r}: exit {p.returncode}, stdout {p.stdout[:80]!r}, stderr {p.stderr.strip()!r}')

    # bench_traces --settle: one pass of `steady` calls in its last, and five passes show it stops from the
    # second; `churn` still calls in the fifth; no PyTorch model (--model names no file)
    bench = [sys.executable, os.path.join(ROOT, 'tools', 'bench_traces.py'), '--gpupool', gpupool, '--no-shared',
             '--no-cache', '--model', os.path.join(work, 'no-such-model.py'), '--repeat', '1', '--settle', '5',
             steady, churn]
    p = subprocess.run(bench + ['--json'], capture_output=True, text=True)
    if p.returncode != 0:
        failures.append(f'bench_traces --settle --json failed ({p.returncode}): {p.stderr.strip()}')
    else:
        rows = {os.path.basename(r['trace']): r for r in json.loads(p.stdout)['rows']}
        for name, quiet in (('steady.csv', 2), ('churn.csv', 0)):
            settle = rows[name]['settle']
            for backend in ('cuda', 'vmm'):
                m = settle.get(backend)
                if not m or m['passes'] != 5 or m['quiet_from_pass'] != quiet:
                    failures.append(f'bench_traces --settle 5, {name} on {backend}: {m} (expected quiet from {quiet})')
            if quiet == 0 and not (settle.get('cuda', {}).get('last_pass_device_calls') and
                                   settle.get('vmm', {}).get('last_pass_map_calls')):
                failures.append(f'churn in pass 5 made no calls: {settle}')
    # bench_traces --call-costs reaches replay: creates alone at 2 us each
    p = subprocess.run(bench[:bench.index('--settle')] + ['--call-costs', 'create=2,map=0,unmap=0,access=0', '--json',
                                                          steady], capture_output=True, text=True)
    w = json.loads(p.stdout)['rows'][0]['vmm_warmup'] if p.returncode == 0 else None
    if w is None or w['creates'] == 0 or abs(w['model_us'] - 2 * w['creates']) > 0.05:
        failures.append(f'bench_traces --call-costs: {p.returncode} {p.stderr.strip()[-200:]} {w}')
    failures += missing_from_output(bench, ('steady.csv: cuda 1, vmm ', 'over 5 passes: cuda makes none from pass 2, '
                                            'vmm makes none from pass 2', 'over 5 passes: cuda still calls in pass 5 ('),
                                    'bench_traces --settle table')

    return report(failures, 'replay says from which pass a pool made no call; bench_traces --settle says it '
                            'over more passes')


if __name__ == '__main__':
    sys.exit(main(sys.argv))
