#!/usr/bin/env python3
"""record_cpu_trace.py — records a program's tensor allocations on a CPU as the allocation trace
(RMM's CSV: Thread,Time,Action,Pointer,Size,Stream) that `gpupool replay` and `gpupool plan` read: how
much GPU memory a model needs, and how gpupool and PyTorch's allocator would hold it, asked of a
machine with no GPU.

How: tools/record_cpu_trace.c, built here with the system C compiler, is preloaded into COMMAND and
logs every 64-byte-aligned posix_memalign and its free: PyTorch's CPU tensors (c10's allocator). The
model code is the same on a GPU, so the tensors, their order and their sizes are much the same; kernel
workspaces differ (oneDNN's here, cuBLAS/cuDNN's on a GPU). ../shared/traces/models/ was recorded the
same way. One stream (0x0): a CPU run has no CUDA streams.

Usage: tools/record_cpu_trace.py [--build-dir DIR] OUT.csv COMMAND [ARG...]
  OUT.csv           the trace to write (its folder must exist)
  COMMAND ARG...    the program to run, e.g. /usr/bin/python3 train.py (no shell)
  --build-dir DIR   where the interposer is built (default: a temporary folder, removed after)
Exit status: COMMAND's own where it fails (the trace then holds what it did until then), 2 for bad
arguments, 1 when the interposer cannot be built or the trace is not a well-formed one. Prints the
trace's allocations, frees and peak live bytes. Standard library only.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, 'record_cpu_trace.c')


def build(build_dir):
    """The interposer's shared object, compiled into build_dir; exits 1 with the compiler's words."""
    cc = os.environ.get('CC') or shutil.which('cc') or shutil.which('gcc') or shutil.which('clang')
    if cc is None:
        sys.exit('record_cpu_trace: no C compiler (cc, gcc or clang) to build the interposer with')
    lib = os.path.join(build_dir, 'record_cpu_trace.so')
    r = subprocess.run([cc, '-std=c11', '-O2', '-Wall', '-shared', '-fPIC', '-o', lib, SOURCE, '-ldl', '-lpthread'],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        sys.exit(f'record_cpu_trace: building {SOURCE} with {cc} failed (exit {r.returncode})')
    return lib


def summary(path):
    """(allocations, frees, peak live bytes, problems) of a recorded trace."""
    live, sizes, allocations, frees, peak, problems = 0, {}, 0, 0, 0, []
    with open(path, newline='') as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header != ['Thread', 'Time', 'Action', 'Pointer', 'Size', 'Stream']:
            return 0, 0, 0, [f'{path}: no trace header (was the program run at all?)']
        for line, row in enumerate(rows, start=2):
            if len(row) != 6:
                problems.append(f'{path}:{line}: {len(row)} fields, not 6 (the program may have been killed)')
                break
            action, ptr, size = row[2], row[3], int(row[4])
            if action == 'allocate':
                if ptr in sizes:
                    problems.append(f'{path}:{line}: {ptr} allocated twice')
                sizes[ptr] = size
                live += size
                allocations += 1
                peak = max(peak, live)
            elif sizes.get(ptr) != size:
                problems.append(f'{path}:{line}: free of {ptr} ({size} B) that no live allocation matches')
            else:
                live -= sizes.pop(ptr)
                frees += 1
    return allocations, frees, peak, problems


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--build-dir')
    ap.add_argument('out')
    ap.add_argument('command', nargs=argparse.REMAINDER)
    args = ap.parse_args(argv[1:])
    if not args.command:
        ap.error('no COMMAND to run (e.g. /usr/bin/python3 train.py)')
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        ap.error(f'{args.out}: folder {folder} does not exist')
    if shutil.which(args.command[0]) is None:
        ap.error(f'{args.command[0]}: no such program')
    tmp = None
    if args.build_dir:
        os.makedirs(args.build_dir, exist_ok=True)
        lib = build(args.build_dir)
    else:
        tmp = tempfile.mkdtemp(prefix='gpupool-record-')
        lib = build(tmp)
    env = dict(os.environ)
    env['LD_PRELOAD'] = lib + (' ' + env['LD_PRELOAD'] if env.get('LD_PRELOAD') else '')
    env['GP_TRACE_OUT'] = os.path.abspath(args.out)
    try:
        rc = subprocess.run(args.command, env=env).returncode
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if not os.path.exists(args.out):
        print(f'record_cpu_trace: {args.out} was not written (exit {rc})', file=sys.stderr)
        return rc or 1
    allocations, frees, peak, problems = summary(args.out)
    for p in problems[:10]:
        print(f'record_cpu_trace: {p}', file=sys.stderr)
    print(f'{args.out}: {allocations} allocations, {frees} frees, peak live {peak} bytes '
          f'({peak / (1 << 20):.1f} MiB)')
    if rc != 0:
        print(f'record_cpu_trace: {args.command[0]} exited with {rc}; the trace holds what it did until then',
              file=sys.stderr)
        return rc
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
