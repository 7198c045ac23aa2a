#!/usr/bin/env python3
"""tests/cli/check_multistream_sets.py — tools/multistream_sets.py builds the same workload from the
same number on every run (the recipe printed and the file written), draws only traces that exist and
are not excluded, gives each copy a stream of its own (as many streams in the file as copies in the
recipe), and refuses bad input with a message and exit 2, writing nothing.

Usage: check_multistream_sets.py SHARED_DIR WORK_DIR. Exits 77 (CTest: skipped) when SHARED_DIR has no
traces or no tools/interleave.py, 1 on any failure, 0 otherwise.
"""
import csv, glob, hashlib, os, shutil, subprocess, sys

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'tools',
                    'multistream_sets.py')


def run(*args):
    return subprocess.run([sys.executable, TOOL] + list(args), capture_output=True, text=True)


def main(argv):
    shared, work = argv[1], argv[2]
    traces = os.path.join(shared, 'traces')
    if not glob.glob(os.path.join(traces, 'models', '*.csv')) or not os.path.isfile(
            os.path.join(shared, 'tools', 'interleave.py')):
        print(f'no traces or no tools/interleave.py in {shared}: skipped')
        return 77
    failures = []
    shutil.rmtree(work, ignore_errors=True)

    # the same numbers, the same recipes; every drawn trace exists; --exclude keeps its prefix out
    a, b = run('--shared', shared, '--dry-run', '100', '40', work), run('--shared', shared, '--dry-run', '100', '40', work)
    if a.returncode != 0 or a.stdout != b.stdout or len(a.stdout.splitlines()) != 40:
        failures.append(f'dry runs differ or failed: rc {a.returncode}, {a.stderr.strip()}')
    if os.path.exists(work):
        failures.append('--dry-run wrote the output folder')
    drawn = set()
    for line in a.stdout.splitlines():
        for part in line.split()[1:]:
            drawn.add(part.rsplit('x', 1)[0] if part.rsplit('x', 1)[-1].isdigit() else part)
    missing = [t for t in drawn if not os.path.isfile(os.path.join(traces, t))]
    if missing:
        failures.append(f'recipes name traces that do not exist: {missing}')
    ex = run('--shared', shared, '--dry-run', '--exclude', 'resnet', '--exclude', 'lm_ctx', '100', '40', work)
    if ex.returncode != 0 or 'lm_ctx' in ex.stdout or '/resnet' in ex.stdout or 'lm_ctx' not in a.stdout:
        failures.append(f'--exclude did not keep lm_ctx and resnet out: {ex.stdout[:200]} {ex.stderr.strip()}')

    # two workloads built twice: the same bytes, one stream per copy
    digests = []
    for attempt in range(2):
        out = os.path.join(work, f'build{attempt}')
        r = run('--shared', shared, '--exclude', 'lm_ctx', '7', '2', out)
        if r.returncode != 0:
            failures.append(f'build failed: {r.stderr.strip()}')
            break
        digests.append([hashlib.sha256(open(os.path.join(out, f'r{n}.csv'), 'rb').read()).hexdigest() for n in (7, 8)])
        for line in r.stdout.splitlines():
            number, parts = line.split()[0], line.split()[1:]
            copies = sum(int(p.rsplit('x', 1)[1]) if p.rsplit('x', 1)[-1].isdigit() else 1 for p in parts)
            with open(os.path.join(out, f'r{number}.csv')) as f:
                streams = {row['Stream'] for row in csv.DictReader(f)}
            if len(streams) != copies:
                failures.append(f'r{number}: {len(streams)} streams for {copies} copies ({" ".join(parts)})')
    if len(digests) == 2 and digests[0] != digests[1]:
        failures.append('the same numbers built different files')

    # bad input: a message, exit 2, nothing written
    for args, words in ((['1', '0', os.path.join(work, 'bad0')], 'COUNT'),
                        (['--shared', os.path.join(work, 'nowhere'), '1', '1', os.path.join(work, 'bad1')], 'no trace'),
                        (['--shared', shared, '--exclude', '', '1', '1', os.path.join(work, 'bad2')], 'no trace')):
        r = run(*args)
        if r.returncode != 2 or words not in r.stderr or os.path.exists(args[-1]):
            failures.append(f'{args}: rc {r.returncode}, stderr {r.stderr.strip()[-200:]!r}')
    for f in failures:
        print('FAIL:', f)
    print(f'check_multistream_sets: {len(failures)} failures')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
