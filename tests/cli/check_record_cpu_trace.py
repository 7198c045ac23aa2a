#!/usr/bin/env python3
"""tests/cli/check_record_cpu_trace.py — tools/record_cpu_trace.py records exactly a program's
64-byte-aligned posix_memalign allocations and their frees, with the sizes asked, as a trace that
`gpupool replay` reads: not malloc, not other alignments, not size 0, not a forked child's, and a
program it starts (exec) neither records nor truncates the file; bad arguments are refused with exit 2
and a failing program's exit status is passed on. Where /usr/bin/python3 has torch, a tiny training
step is recorded and replayed too.

A C program of known allocations (built here with the system compiler; no ../shared).
Usage: check_record_cpu_trace.py GPUPOOL WORK_DIR. Exits 1 on any failure.
"""
import csv
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, 'tools', 'record_cpu_trace.py')

PROGRAM = r'''
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
    void *a, *b, *c, *d = NULL, *e, *x;
    if (posix_memalign(&a, 64, 1000) || posix_memalign(&b, 64, 3000))
        return 10;
    void *m = malloc(500);                   /* not recorded: malloc */
    if (posix_memalign(&c, 16, 700))         /* not recorded: another alignment */
        return 11;
    (void)posix_memalign(&d, 64, 0);         /* not recorded: size 0 */
    pid_t pid = fork();
    if (pid == 0) {                          /* a forked child records nothing */
        if (posix_memalign(&x, 64, 777) == 0)
            free(x);
        free(b);
        exit(0);                             /* exit(): at-exit handlers and stdio flushing run */
    }
    waitpid(pid, NULL, 0);
    if (system("sh -c 'exit 0'") != 0)       /* a program it starts: no record, no truncation */
        return 12;
    free(a);
    free(b);
    free(m);
    free(c);
    free(d);
    if (posix_memalign(&e, 64, 4096))        /* left live at the end */
        return 13;
    printf("%p %p %p\n", a, b, e);
    return 0;
}
'''

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f'FAIL: {what}')


def rows(path):
    with open(path, newline='') as f:
        return list(csv.reader(f))


def replay(gpupool, trace):
    r = subprocess.run([gpupool, 'replay', '--json', trace], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr
    return json.loads(r.stdout)['traces'][0], ''


def main(argv):
    gpupool, work = argv[1], argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cc = shutil.which('cc') or shutil.which('gcc') or shutil.which('clang')
    if cc is None:
        print('skipped: no C compiler')
        return 77
    src, exe = os.path.join(work, 'pattern.c'), os.path.join(work, 'pattern')
    with open(src, 'w') as f:
        f.write(PROGRAM)
    subprocess.run([cc, '-O0', '-o', exe, src], check=True)

    # 1. Exactly the recorded allocations, in order, with their sizes and pointers.
    trace = os.path.join(work, 'pattern.csv')
    r = subprocess.run([sys.executable, TOOL, '--build-dir', os.path.join(work, 'lib'), trace, exe],
                       capture_output=True, text=True)
    check(r.returncode == 0, f'recording the pattern exits 0 (got {r.returncode}: {r.stderr})')
    a, b, e = r.stdout.split()[:3]
    got = rows(trace)
    check(got[0] == ['Thread', 'Time', 'Action', 'Pointer', 'Size', 'Stream'], f'header: {got[0]}')
    body = [(x[2], int(x[3], 16), int(x[4]), x[5]) for x in got[1:]]
    want = [('allocate', int(a, 16), 1000, '0x0'), ('allocate', int(b, 16), 3000, '0x0'),
            ('free', int(a, 16), 1000, '0x0'), ('free', int(b, 16), 3000, '0x0'),
            ('allocate', int(e, 16), 4096, '0x0')]
    check(body == want, f'the pattern\'s rows: {body} (want {want})')
    times = [int(x[1]) for x in got[1:]]
    check(times == sorted(times), f'times in order: {times}')
    check('3 allocations, 2 frees, peak live 4096 bytes' in r.stdout, f'summary: {r.stdout!r}')

    # 2. gpupool replays it.
    t, err = replay(gpupool, trace)
    check(t is not None and t['failed_allocations'] == 0 and t['allocations'] == 3 and t['frees'] == 2
          and t['peak_live_bytes'] == 4096, f'gpupool replay of the recorded trace: {t} {err}')

    # 3. Bad arguments: exit 2, nothing run.
    for args, what in (([trace], 'no command'), ([os.path.join(work, 'no', 'x.csv'), exe], 'missing folder'),
                       ([trace, os.path.join(work, 'no-such-program')], 'missing program')):
        r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
        check(r.returncode == 2 and 'error' in r.stderr, f'{what}: exit 2 with a message (got {r.returncode})')
    check(rows(trace)[1:] == got[1:], 'a refused run leaves an earlier trace alone')

    # 4. A failing program: its exit status, and the trace of what it did.
    failing = os.path.join(work, 'failing.csv')
    r = subprocess.run([sys.executable, TOOL, failing, 'sh', '-c', 'exit 3'], capture_output=True, text=True)
    check(r.returncode == 3 and 'exited with 3' in r.stderr, f'a failing program: exit 3 (got {r.returncode})')
    check(os.path.exists(failing) and rows(failing)[0][0] == 'Thread', 'its trace is written (header only)')

    # 5. A real PyTorch step, where Debian's torch is installed.
    py = '/usr/bin/python3'
    if os.path.exists(py) and subprocess.run([py, '-c', 'import torch'], capture_output=True).returncode == 0:
        step = os.path.join(work, 'torch_step.csv')
        code = ('import torch\nm = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), '
                'torch.nn.Linear(512, 10))\no = torch.optim.AdamW(m.parameters())\nfor _ in range(3):\n'
                '    loss = m(torch.randn(32, 256)).square().mean()\n    o.zero_grad()\n    loss.backward()\n'
                '    o.step()\n')
        r = subprocess.run([sys.executable, TOOL, step, py, '-c', code], capture_output=True, text=True)
        check(r.returncode == 0, f'recording a torch step exits 0 (got {r.returncode}: {r.stderr[-500:]})')
        t, err = replay(gpupool, step)
        # parameters 2 x (256x512 + 512 + 512x10 + 10) floats, AdamW's two states each, gradients: > 2 MiB
        check(t is not None and t['failed_allocations'] == 0 and t['allocations'] > 50
              and t['peak_live_bytes'] > 2 * (1 << 20), f'the torch step\'s trace replays: {t} {err}')
    else:
        print('note: /usr/bin/python3 has no torch; the PyTorch case is skipped')

    print('record_cpu_trace:', 'FAILED' if failures else 'ok')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
