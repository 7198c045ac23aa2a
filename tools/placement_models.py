#!/usr/bin/env python3
"""Reference models of placement for a trace: how much memory best-fit placement itself needs, apart
from everything else a pool does. They are models, not bounds: each fixes one placement rule and takes
away one constraint of a real device, so that a pool's figure can be read against them.

For every trace (RMM allocation-log CSV, .csv or .csv.gz; the trace `--repeat` times over, what a
pass leaves live freed at its end, as gpupool replay does), all streams in one heap, it prints as
multiples of peak live (requested sizes, as gpupool replay's reserved/live; blocks are placed at their
512 B-rounded sizes):

  floor      peak live in 512 B granules, in whole 2 MiB pages (no pool holds less);
  arena-bf   best fit (smallest free block that fits, lowest address on ties, split, coalesce) in one
             unbounded contiguous address space that grows at its top and shrinks when its top block
             is freed: a cudaMalloc pool with no segment boundaries and no 2 MiB rounding. Its peak
             top over peak live is the fragmentation of online best fit itself;
  pages-bf   the same best fit, requests up to 512 KiB in a second address space (gpupool's small
             heap), and reserved memory = the 2 MiB pages that hold a live byte at that moment: as if
             every whole free page could be unmapped and mapped where it is needed at no cost. The
             peak of that is what a virtual-memory pool that moves pages perfectly reaches with best
             fit; what is left above the floor is free bytes in partly used pages;
  offline    requests above 512 KiB placed knowing every lifetime in advance (greedy by size: largest
             first, each at the lowest address free for its whole lifetime) in one address space, the
             small ones as pages-bf: what a layout planned from a recorded pass could reach.

Usage: tools/placement_models.py [--repeat N] [--models arena-bf,pages-bf,offline] TRACE|FOLDER ...
Standard library only; minutes for traces of 100k events (the models scan free lists linearly).
"""
import argparse
import bisect
import csv
import glob
import gzip
import os
import sys

PAGE = 2 << 20
SMALL = 512 << 10


def rounded(size):
    return max(512, (size + 511) // 512 * 512)


def events(path, repeat):
    """(is_alloc, key, rounded size, requested size) for `repeat` passes, each pass's leftovers freed
    at its end."""
    f = gzip.open(path, 'rt') if path.endswith('.gz') else open(path)
    with f:
        rows = [(r['Action'] == 'allocate', r['Pointer'], int(r['Size'])) for r in csv.DictReader(f)]
    out = []
    for p in range(repeat):
        live = {}
        for alloc, ptr, size in rows:
            key = (p, ptr)
            if alloc and key not in live:
                live[key] = size
                out.append((True, key, rounded(size), size))
            elif not alloc and key in live:
                out.append((False, key, rounded(size), live.pop(key)))
        out += [(False, key, rounded(size), size) for key, size in live.items()]
    return out


class Arena:
    """One contiguous address space with best-fit placement; counts the pages that hold live bytes."""

    def __init__(self):
        self.free = []   # [addr, size], sorted by address, never two adjacent
        self.top = 0
        self.used = {}   # page -> live blocks touching it
        self.pages = 0

    def _touch(self, addr, size, d):
        for page in range(addr // PAGE, (addr + size - 1) // PAGE + 1):
            n = self.used.get(page, 0) + d
            if n == 0:
                del self.used[page]
                self.pages -= 1
            else:
                if n == 1 and d == 1:
                    self.pages += 1
                self.used[page] = n

    def alloc(self, size):
        best = None
        for i, (a, s) in enumerate(self.free):
            if s >= size and (best is None or s < self.free[best][1]):
                best = i
        if best is None:
            if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
                addr = self.free.pop()[0]
            else:
                addr = self.top
            self.top = addr + size
        else:
            addr, s = self.free[best]
            if s == size:
                del self.free[best]
            else:
                self.free[best] = [addr + size, s - size]
        self._touch(addr, size, 1)
        return addr

    def release(self, addr, size):
        self._touch(addr, size, -1)
        i = bisect.bisect_left(self.free, [addr, 0])
        if i < len(self.free) and self.free[i][0] == addr + size:
            size += self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == addr:
            i -= 1
            addr, size = self.free[i][0], self.free[i][1] + size
            del self.free[i]
        if addr + size == self.top:
            self.top = addr
        else:
            self.free.insert(i, [addr, size])


def arena_bf(evs):
    arena, where, peak_top = Arena(), {}, 0
    for alloc, key, size, _ in evs:
        if alloc:
            where[key] = arena.alloc(size)
            peak_top = max(peak_top, arena.top)
        else:
            arena.release(where.pop(key), size)
    return peak_top


def pages_bf(evs, planned=None):
    """Peak of the pages holding live bytes, small and large apart; `planned` places large blocks."""
    heaps, where, peak = (Arena(), Arena()), {}, 0
    for i, (alloc, key, size, _) in enumerate(evs):
        small = size <= SMALL
        if alloc:
            if small or planned is None:
                where[key] = heaps[small].alloc(size)
            else:
                where[key] = planned[i]
                heaps[0]._touch(planned[i], size, 1)
            peak = max(peak, heaps[0].pages + heaps[1].pages)
        else:
            addr = where.pop(key)
            if small or planned is None:
                heaps[small].release(addr, size)
            else:
                heaps[0]._touch(addr, size, -1)
    return peak * PAGE


def offline_layout(evs):
    """Greedy by size: each large block, largest first, at the lowest address free for its lifetime."""
    start, blocks = {}, []
    for i, (alloc, key, size, _) in enumerate(evs):
        if size <= SMALL:
            continue
        if alloc:
            start[key] = i
        else:
            blocks.append((size, start.pop(key), i))
    placed, addr_of = [], {}
    for size, a, b in sorted(blocks, key=lambda x: (-x[0], x[1])):
        busy = sorted((o, s) for o, s, pa, pb in placed if pa < b and a < pb)
        pos = 0
        for o, s in busy:
            if o - pos >= size:
                break
            pos = max(pos, o + s)
        placed.append((pos, size, a, b))
        addr_of[a] = pos
    return addr_of


MODELS = {
    'arena-bf': arena_bf,
    'pages-bf': pages_bf,
    'offline': lambda evs: pages_bf(evs, offline_layout(evs)),
}


def traces_in(spec):
    if os.path.isdir(spec):
        return sorted(glob.glob(os.path.join(spec, '*.csv')) + glob.glob(os.path.join(spec, '*.csv.gz')))
    return [spec]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('paths', nargs='+')
    ap.add_argument('--repeat', type=int, default=3)
    ap.add_argument('--models', default=','.join(MODELS))
    args = ap.parse_args(argv)
    names = args.models.split(',')
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"placement_models.py: unknown model {unknown[0]} (known: {', '.join(MODELS)})", file=sys.stderr)
        return 2
    print(f"{'trace':44s} {'live MiB':>9s} {'floor':>6s}" + ''.join(f" {n:>9s}" for n in names))
    for spec in args.paths:
        for path in traces_in(spec):
            evs = events(path, args.repeat)
            live = peak = live_r = peak_r = 0
            for alloc, _, size, requested in evs:
                live += requested if alloc else -requested
                live_r += size if alloc else -size
                peak, peak_r = max(peak, live), max(peak_r, live_r)
            if peak == 0:
                continue
            floor = (peak_r + PAGE - 1) // PAGE * PAGE
            cells = ''.join(f" {MODELS[n](evs) / peak:>9.3f}" for n in names)
            print(f"{path[-44:]:44s} {peak / (1 << 20):>9.1f} {floor / peak:>6.3f}{cells}", flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
