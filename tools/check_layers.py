#!/usr/bin/env python3
"""Checks the layering of pool/ (pool/README.md): every #include "..." in pool/<layer>/ names a header
of its own layer or a lower one, or a public header of include/.

Layers, lowest first: base, backend, ds, policy, provider, api, torch. The simulated GPU (sim) sees
base, backend and itself, and no other layer may include it, except the CUDA emulation (cuda_emu, a
test device built only into test binaries), which sees base, backend, sim and itself and which nothing
includes. An include that names no layer folder
(other than a public header) is an error too, so that a header cannot slip in through -I pool.

Usage: tools/check_layers.py [POOL_DIR]     (default: pool/ next to this script's folder)
       tools/check_layers.py --self-test   (plants an upward include in a copy of pool/: must fail)
Prints one line per violation (file:line: what and why) and exits 1 when there is any, else 0.
Standard library only; run by CTest as the test `layers` (tests/CMakeLists.txt).
"""
import os
import re
import shutil
import sys
import tempfile

ORDER = ['base', 'backend', 'ds', 'policy', 'provider', 'api', 'torch']
RANK = {layer: i for i, layer in enumerate(ORDER)}
SIM_SEES = {'base', 'backend', 'sim'}
EMU_SEES = {'base', 'backend', 'sim', 'cuda_emu'}
PUBLIC = {'gpupool.h', 'gpupool_sim.h'}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def allowed(layer, target):
    """None when a file of `layer` may include a header of layer `target`, else the reason."""
    if layer == 'sim':
        return None if target in SIM_SEES else 'the simulated GPU sees only base, backend and sim'
    if layer == 'cuda_emu':
        return None if target in EMU_SEES else 'the CUDA emulation sees only base, backend, sim and cuda_emu'
    if target == 'cuda_emu':
        return 'only the CUDA emulation includes cuda_emu/ headers (a test device, never in the library)'
    if target == 'sim':
        return 'only the sim itself includes sim/ headers (the core never names a backend)'
    if target not in RANK:
        return f'no layer named {target}/'
    if RANK[target] > RANK[layer]:
        return f'{target} is above {layer} (order: {" < ".join(ORDER)})'
    return None


def check(pool):
    problems = []
    layers = sorted(d for d in os.listdir(pool) if os.path.isdir(os.path.join(pool, d)))
    for layer in layers:
        if layer not in RANK and layer not in ('sim', 'cuda_emu'):
            problems.append(f'{pool}/{layer}: a folder that is no layer (known: {", ".join(ORDER)}, sim, cuda_emu)')
            continue
        folder = os.path.join(pool, layer)
        for name in sorted(os.listdir(folder)):
            if not name.endswith(('.c', '.h')):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding='utf-8') as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    header = m.group(1)
                    if header in PUBLIC:
                        continue
                    if '/' not in header:
                        problems.append(f'{path}:{lineno}: #include "{header}" names no layer '
                                        f'(write "<layer>/{header}")')
                        continue
                    target = header.split('/', 1)[0]
                    why = allowed(layer, target)
                    if why is None and not os.path.exists(os.path.join(pool, header)):
                        why = 'no such header'
                    if why is not None:
                        problems.append(f'{path}:{lineno}: {layer}/ includes "{header}": {why}')
    for name in sorted(os.listdir(pool)):
        if name.endswith(('.c', '.h')):
            problems.append(f'{pool}/{name}: a source file outside every layer folder')
    return problems


def self_test(pool):
    """The check must be able to fail: a copy of pool/ passes, and fails once ds/heap.c includes an API
    header (and once the sim includes a provider's)."""
    if check(pool):
        print('check_layers.py --self-test: pool/ itself breaks the layering; run without --self-test')
        return 1
    plants = [('ds/heap.c', 'api/api.h'), ('sim/sim_clock.c', 'provider/pool_state.h'),
              ('provider/segment.c', 'sim/sim_internal.h'), ('api/alloc.c', 'cuda_emu/cuda_emu.h'),
              ('cuda_emu/emu_rules.c', 'provider/pool_state.h')]
    for where, header in plants:
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, 'pool')
            shutil.copytree(pool, copy)
            with open(os.path.join(copy, where), 'a', encoding='utf-8') as f:
                f.write(f'#include "{header}"\n')
            found = check(copy)
            if not any(where in p and header in p for p in found):
                print(f'check_layers.py --self-test: FAILED: #include "{header}" planted in {where} was not found')
                return 1
            print(f'check_layers.py --self-test: planted #include "{header}" in {where}: found ({found[0]})')
    print('check_layers.py --self-test: passed')
    return 0


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(argv) > 1 and argv[1] == '--self-test':
        return self_test(argv[2] if len(argv) > 2 else os.path.join(root, 'pool'))
    pool = argv[1] if len(argv) > 1 else os.path.join(root, 'pool')
    if not os.path.isdir(pool):
        print(f'check_layers.py: {pool} is not a folder', file=sys.stderr)
        return 2
    problems = check(pool)
    for p in problems:
        print(p)
    if problems:
        print(f'check_layers.py: {len(problems)} include(s) break the layering of {pool} (pool/README.md)')
        return 1
    print(f'check_layers.py: the includes of {pool} respect the layers ({" < ".join(ORDER)}; sim: base, backend)')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
