"""tests/cli/synthetic_trace.py — what the CLI checks share: a synthetic allocation trace written in
RMM's allocation-log CSV (the format `gpupool replay` reads), a command's output looked through, and the
report a check ends with.

Standard library only; imported by the check scripts beside it (their folder is on sys.path when they
run as scripts).
"""

import subprocess

HEADER = 'Thread,Time,Action,Pointer,Size,Stream\n'


def write_trace(path, phases):
    """phases: lists of sizes; each phase's sizes are allocated one after another (all live together)
    on stream 0x0, then freed, phase after phase. Pointers never repeat."""
    with open(path, 'w') as f:
        f.write(HEADER)
        t, ptr = 0, 0x10000000
        for sizes in phases:
            ptrs = []
            for size in sizes:
                t, ptr = t + 1, ptr + 0x10000000
                ptrs.append((ptr, size))
                f.write(f'0,{t},allocate,{hex(ptr)},{size},0x0\n')
            for p, size in ptrs:
                t += 1
                f.write(f'0,{t},free,{hex(p)},{size},0x0\n')


def missing_from_output(cmd, wants, what):
    """Runs cmd and returns a failure for each text of `wants` that its output lacks, or for a non-zero
    exit (`what` names the output in the message)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    return [f'{what} lacks {want!r} ({p.returncode}): {p.stdout[-900:]} {p.stderr.strip()}'
            for want in wants if p.returncode != 0 or want not in p.stdout]


def report(failures, passed):
    """Prints every failure (or `passed` when there is none) and returns the check's exit status."""
    for f in failures:
        print('FAIL:', f)
    if not failures:
        print(passed)
    return 1 if failures else 0
