#!/usr/bin/env python3
"""tests/cli/check_placement_models.py — tools/placement_models.py's busy-stream model
(pages-bf-streams-busy): a page a stream has emptied reaches another stream only once that stream's
work on it is done (the time to its next row, times --stream-work), and counts as held until then;
its own stream reuses it at once; a free on another stream than the allocating one leaves nothing in
use; --stream-work 0 gives pages-bf-streams' figure; a bad --stream-work is refused with exit 2.

Synthetic traces (no ../shared). Usage: check_placement_models.py WORK_DIR. Exits 1 on any failure.
"""
import os, shutil, subprocess, sys

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'tools',
                    'placement_models.py')
MIB = 1 << 20
MODELS = 'pages-bf-streams,pages-bf-streams-busy'


def write(path, rows):
    with open(path, 'w') as f:
        f.write('Thread,Time,Action,Pointer,Size,Stream\n')
        for t, action, ptr, size, stream in rows:
            f.write(f'1,{t},{action},{ptr},{size},{stream}\n')


def figures(path, *extra):
    """(rc, {model: multiple of peak live}, stderr) for one trace, one pass."""
    r = subprocess.run([sys.executable, TOOL, '--repeat', '1', '--models', MODELS, *extra, path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return r.returncode, {}, r.stderr
    lines = r.stdout.splitlines()
    names = MODELS.split(',')
    cells = lines[1].split()[-len(names):]
    return 0, dict(zip(names, map(float, cells))), r.stderr


def main(argv):
    work = argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    # Stream A uses 4 MiB (two pages) and frees it at 10 us; its next row is at 1000 us, so its last
    # kernel on those pages runs until then. B asks for 4 MiB at 20 us: with idle streams (or work 0)
    # A's pages serve it (peak two pages, live 4 MiB: 1.0); busy, B needs two more (2.0).
    handoff = os.path.join(work, 'handoff.csv')
    write(handoff, [(0, 'allocate', '0xa0', 4 * MIB, '0x1'), (10, 'free', '0xa0', 4 * MIB, '0x1'),
                    (20, 'allocate', '0xb0', 4 * MIB, '0x2'), (30, 'free', '0xb0', 4 * MIB, '0x2'),
                    (1000, 'allocate', '0xa1', 512, '0x1'), (1010, 'free', '0xa1', 512, '0x1')])
    rc, f, err = figures(handoff)
    if rc != 0 or f != {'pages-bf-streams': 1.0, 'pages-bf-streams-busy': 2.0}:
        failures.append(f'handoff, busy: expected 1.0 and 2.0, got {f} (rc {rc}: {err.strip()})')
    rc, f, err = figures(handoff, '--stream-work', '0')
    if rc != 0 or f != {'pages-bf-streams': 1.0, 'pages-bf-streams-busy': 1.0}:
        failures.append(f'handoff, --stream-work 0: expected 1.0 and 1.0, got {f} (rc {rc}: {err.strip()})')
    # half the work: A's kernel ends at 10 + 0.5 x 990 us, still after B's request
    rc, f, err = figures(handoff, '--stream-work', '0.5')
    if rc != 0 or f.get('pages-bf-streams-busy') != 2.0:
        failures.append(f'handoff, --stream-work 0.5: expected 2.0 busy, got {f} (rc {rc}: {err.strip()})')

    # Cases where nothing waits (busy 1.0): B asks only after A's next row (A's work on the pages is
    # done by then); A's own stream reuses its emptied pages at once; a free on another stream than the
    # allocating one queues no work (as gpupool replay).
    nothing_waits = {
        'later': [(0, 'allocate', '0xa0', 4 * MIB, '0x1'), (10, 'free', '0xa0', 4 * MIB, '0x1'),
                  (20, 'allocate', '0xa1', 512, '0x1'), (30, 'free', '0xa1', 512, '0x1'),
                  (40, 'allocate', '0xb0', 4 * MIB, '0x2'), (50, 'free', '0xb0', 4 * MIB, '0x2')],
        'own stream': [(0, 'allocate', '0xa0', 4 * MIB, '0x1'), (10, 'free', '0xa0', 4 * MIB, '0x1'),
                       (20, 'allocate', '0xa1', 4 * MIB, '0x1'), (30, 'free', '0xa1', 4 * MIB, '0x1'),
                       (1000, 'allocate', '0xa2', 512, '0x1'), (1010, 'free', '0xa2', 512, '0x1')],
        'cross-stream free': [(0, 'allocate', '0xa0', 4 * MIB, '0x1'), (10, 'free', '0xa0', 4 * MIB, '0x3'),
                              (20, 'allocate', '0xb0', 4 * MIB, '0x2'), (30, 'free', '0xb0', 4 * MIB, '0x2'),
                              (1000, 'allocate', '0xc0', 512, '0x3'), (1010, 'free', '0xc0', 512, '0x3')],
    }
    for name, rows in nothing_waits.items():
        path = os.path.join(work, name.replace(' ', '_') + '.csv')
        write(path, rows)
        rc, f, err = figures(path)
        if rc != 0 or f.get('pages-bf-streams-busy') != 1.0:
            failures.append(f'{name}: expected 1.0 busy, got {f} (rc {rc}: {err.strip()})')

    for bad in ('1.5', '-0.1'):
        rc, f, err = figures(handoff, '--stream-work', bad)
        if rc != 2 or 'stream-work' not in err:
            failures.append(f'--stream-work {bad}: expected exit 2 with a message, got {rc}: {err.strip()}')

    for failure in failures:
        print('FAIL', failure)
    print(f'check_placement_models: {len(failures)} failures' if failures else 'check_placement_models: passed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
