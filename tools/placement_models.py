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
  pages-bf-streams  the same with a small and a large heap per stream, as a pool whose streams keep
             their own free lists (gpupool's, PyTorch's): set against pages-bf, what keeping the streams
             apart costs where pages move freely between them;
  pages-bf-streams-busy  the same, with each stream's GPU work as `gpupool replay --stream-work F`
             queues it (a freed block is in use on its stream for F x the time to that stream's next
             row of the trace, --stream-work, default 1): a page its stream has emptied reaches another
             stream only once that work is done, and counts as held until then (its own stream may
             reuse it at once). Fences are ideal: the page moves the moment the work ends. Set
             against pages-bf-streams, what busy streams cost a pool that never makes one stream
             wait for another;
  offline    requests above 512 KiB placed knowing every lifetime in advance (greedy by size: largest
             first, each at the lowest address free for its whole lifetime) in one address space, the
             small ones as pages-bf: what a layout planned from a recorded pass could reach;
  online-plan  what a pool that plans a repeating step as it runs could reach (STWeaver's idea, online):
             when the last 16 large request sizes occurred before and the run of equal sizes
             leading back from both ends is at least min(period, 256) long, the large blocks of the last
             period whose lifetimes are complete are planned (greedy by size, as offline) in an address
             space of their own, and the requests that follow are mapped onto that period in order: a
             request of the planned size goes to its planned address when that is free, anything else
             to best fit (pages-bf's large heap); a request of another size ends the plan until a
             repetition is found again. Counted as pages-bf (pages holding live bytes);
  online-plan-kept  the same, with the planned space's pages kept mapped up to its high-water mark
             (what a pool that makes no map call once the plan is laid out holds);
  lifetime-oracle  large blocks in two best-fit address spaces by their actual lifetime (at least
             --lifetime-events allocation and free events, default 4096, or fewer), counted as pages-bf:
             segregation by lifetime class (as LLAMA, Maas et al., ASPLOS 2020) with lifetimes known,
             an upper bound for any predictor of them, and its figure moves with the threshold;
  lifetime-predicted  the same, each lifetime class predicted from the last block of the same size after
             the same two large request sizes (its lifetime, or its age while it lives; unseen: short).

Usage: tools/placement_models.py [--repeat N] [--models arena-bf,pages-bf,offline,...] [--lifetime-events N]
       [--stream-work F]
       TRACE|FOLDER ...
Standard library only; minutes for traces of 100k events (the models scan free lists linearly).
"""
import argparse
import bisect
import csv
import glob
import gzip
import heapq
import os
import sys

PAGE = 2 << 20
SMALL = 512 << 10


def rounded(size):
    return max(512, (size + 511) // 512 * 512)


def events(path, repeat, times=None):
    """(is_alloc, key, rounded size, requested size) for `repeat` passes, each pass's leftovers freed
    at its end. A key is (pass, pointer, the stream it was allocated on: '' where the trace has no
    Stream column). With `times` (a list), one (now, done) pair per event is appended to it, in ns on
    a GPU clock that follows the trace's Time column (microseconds, never going back; each pass starts
    where the last ended), as `gpupool replay --stream-work` keeps it: `done` is when a freed block's
    last use on its stream ends, at WORK x the time to that stream's next row (its `now` for an
    allocation, for a free on another stream than the allocating one, and for a pass's leftovers)."""
    f = gzip.open(path, 'rt') if path.endswith('.gz') else open(path)
    with f:
        rows = [(r['Action'] == 'allocate', r['Pointer'], int(r['Size']), r.get('Stream') or '',
                 int(r.get('Time') or 0)) for r in csv.DictReader(f)]
    at, gap = [], [0] * len(rows)
    last, clock = {}, 0
    for i, row in enumerate(rows):
        us = max(row[4] - rows[0][4], 0)
        clock = max(clock, us * 1000)
        at.append(clock)
        if row[3] in last:
            gap[last[row[3]]] = clock - at[last[row[3]]]
        last[row[3]] = i
    out, base = [], 0
    for p in range(repeat):
        live = {}
        for i, (alloc, ptr, size, stream, _) in enumerate(rows):
            now = base + at[i]
            if alloc and (p, ptr) not in live:
                key = (p, ptr, stream)
                live[(p, ptr)] = key, size
                out.append((True, key, rounded(size), size))
                if times is not None:
                    times.append((now, now))
            elif not alloc and (p, ptr) in live:
                key, size = live.pop((p, ptr))
                out.append((False, key, rounded(size), size))
                if times is not None:
                    times.append((now, now + int(WORK * gap[i]) if key[2] == stream else now))
        out += [(False, key, rounded(size), size) for key, size in live.values()]
        base += at[-1] if at else 0
        if times is not None:
            times += [(base, base)] * len(live)
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


def pages_bf_streams(evs):
    """pages-bf with a small and a large heap per stream (the stream each block was allocated on):
    what stream-ordered heaps need where every whole free page moves to any stream at no cost."""
    heaps, where, pages, peak = {}, {}, 0, 0
    for alloc, key, size, _ in evs:
        if alloc:
            heap = heaps.setdefault(key[2], (Arena(), Arena()))[size <= SMALL]
            before = heap.pages
            where[key] = heap, heap.alloc(size)
            pages += heap.pages - before
            peak = max(peak, pages)
        else:
            heap, addr = where.pop(key)
            before = heap.pages
            heap.release(addr, size)
            pages += heap.pages - before
    return peak * PAGE


class PageCounting(Arena):
    """An Arena that also records which pages changed between holding a live byte and holding none
    (`changed`: the caller empties it before each alloc or release)."""

    def __init__(self):
        Arena.__init__(self)
        self.changed = []

    def _touch(self, addr, size, d):
        for page in range(addr // PAGE, (addr + size - 1) // PAGE + 1):
            n = self.used.get(page, 0)
            if (n == 0) != (n + d == 0):
                self.changed.append(page)
        Arena._touch(self, addr, size, d)


def pages_bf_streams_busy(evs, times):
    """pages-bf-streams where a stream's whole free page reaches other streams only once its work on it
    is done (`times`: the freed block's last use ends at `done`): until then the page stays held, and
    only its own stream can place blocks in it. Fences are ideal (no round trip, no wait)."""
    heaps, where, live_pages, peak = {}, {}, 0, 0
    cooling, expiries = {}, []  # (stream, small?, page) -> done; heap of (done, that key)
    for (alloc, key, size, _), (now, done) in zip(evs, times):
        while expiries and expiries[0][0] <= now:
            t, k = heapq.heappop(expiries)
            if cooling.get(k) == t:
                del cooling[k]
        small = size <= SMALL
        heap = heaps.setdefault((key[2], small), PageCounting())
        heap.changed.clear()
        before = heap.pages
        if alloc:
            where[key] = heap.alloc(size)
            for page in heap.changed:
                cooling.pop((key[2], small, page), None)
        else:
            heap.release(where.pop(key), size)
            if done > now:
                for page in heap.changed:
                    cooling[(key[2], small, page)] = done
                    heapq.heappush(expiries, (done, (key[2], small, page)))
        live_pages += heap.pages - before
        peak = max(peak, live_pages + len(cooling))
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
            a = start.pop(key)
            blocks.append((size, a, i, a))
    return greedy_by_size(blocks)[0]


def greedy_by_size(blocks):
    """blocks: (size, start, end, id) -> ({id: address}, height): each block, largest first, at the lowest
    address free for its whole lifetime [start, end)."""
    placed, addr_of, height = [], {}, 0
    for size, a, b, ident in sorted(blocks, key=lambda x: (-x[0], x[1])):
        busy = sorted((o, s) for o, s, pa, pb in placed if pa < b and a < pb)
        pos = 0
        for o, s in busy:
            if o - pos >= size:
                break
            pos = max(pos, o + s)
        placed.append((pos, size, a, b))
        addr_of[ident] = pos
        height = max(height, pos + size)
    return addr_of, height


class PlannedSpace:
    """An address space whose blocks go where a plan says, when that place is free."""

    def __init__(self):
        self.live = []   # [addr, end], sorted
        self.used, self.pages, self.top = {}, 0, 0

    def fits(self, addr, size):
        i = bisect.bisect_right(self.live, [addr, float('inf')])
        return not (i > 0 and self.live[i - 1][1] > addr) and not (i < len(self.live) and self.live[i][0] < addr + size)

    def take(self, addr, size):
        bisect.insort(self.live, [addr, addr + size])
        Arena._touch(self, addr, size, 1)
        self.top = max(self.top, addr + size)

    def give(self, addr, size):
        self.live.remove([addr, addr + size])
        Arena._touch(self, addr, size, -1)


def online_plan(evs, kept=False, gram=16, min_run=256, candidates=64):
    small, heap, space = Arena(), Arena(), PlannedSpace()
    where, hist, record_of, seen = {}, [], {}, {}  # hist: [size, alloc clock, free clock or None]
    follow, pos, clock, peak = None, 0, 0, 0
    for alloc, key, size, _ in evs:
        if size <= SMALL:
            if alloc:
                where[key] = (small, small.alloc(size))
            else:
                small.release(where.pop(key)[1], size)
            continue
        clock += 1
        if not alloc:
            hist[record_of.pop(key)][2] = clock
            space_of, addr = where.pop(key)
            (space.give if space_of is space else heap.release)(addr, size)
            continue
        n = len(hist)
        hist.append([size, clock, None])
        record_of[key] = n
        placed = False
        if follow is not None:
            start, period, plan = follow
            if hist[start + pos][0] != size:
                follow = None
            else:
                if pos in plan and space.fits(plan[pos], size):
                    space.take(plan[pos], size)
                    where[key] = (space, plan[pos])
                    placed = True
                pos = (pos + 1) % period
        if not placed:
            where[key] = (heap, heap.alloc(size))
        if n + 1 >= gram:
            prior = seen.setdefault(tuple(h[0] for h in hist[n - gram + 1:n + 1]), [])
            if follow is None and prior:
                best_run, j = 0, None
                for c in prior:
                    run = 0
                    while c - run >= 0 and run < 4096 and hist[n - run][0] == hist[c - run][0]:
                        run += 1
                    if run > best_run or (run == best_run and (j is None or c < j)):
                        best_run, j = run, c
                period = n - j
                if best_run >= min(period, min_run):
                    t0 = hist[j + 1][1]
                    done = [(hist[j + 1 + k][0], hist[j + 1 + k][1] - t0, hist[j + 1 + k][2] - t0, k)
                            for k in range(period) if hist[j + 1 + k][2] is not None]
                    follow, pos = (j + 1, period, greedy_by_size(done)[0]), 0
            prior.append(n)
            del prior[:-candidates]
        planned_pages = (space.top + PAGE - 1) // PAGE if kept else space.pages
        peak = max(peak, small.pages + heap.pages + planned_pages)
    return peak * PAGE


def lifetimes_known(evs, threshold):
    """The allocation events whose block lives threshold events or more."""
    born, long_lived = {}, set()
    for i, (alloc, key, _, _) in enumerate(evs):
        if alloc:
            born[key] = i
        elif i - born[key] >= threshold:
            long_lived.add(born.pop(key))
    return long_lived


def lifetimes_predicted(evs, threshold, context=2):
    """The large allocation events predicted long-lived from the last block of the same size after the
    same `context` large request sizes: its lifetime when it was freed, its age so far when it is
    not; a size and context not seen before is predicted short."""
    last, born, lived, sizes, long_lived = {}, {}, {}, [], set()
    for i, (alloc, key, size, _) in enumerate(evs):
        if not alloc:
            start = born.pop(key)
            lived[start] = i - start
            continue
        born[key] = i
        if size <= SMALL:
            continue
        ctx = (size,) + tuple(sizes[-context:])
        j = last.get(ctx)
        if j is not None and (lived[j] if j in lived else i - j) >= threshold:
            long_lived.add(i)
        last[ctx] = i
        sizes.append(size)
    return long_lived


def lifetime_classes(evs, long_lived):
    small, short, long_, where, peak = Arena(), Arena(), Arena(), {}, 0
    for i, (alloc, key, size, _) in enumerate(evs):
        if alloc:
            space = small if size <= SMALL else long_ if i in long_lived else short
            where[key] = (space, space.alloc(size))
            peak = max(peak, small.pages + short.pages + long_.pages)
        else:
            space, addr = where.pop(key)
            space.release(addr, size)
    return peak * PAGE


MODELS = {  # each takes the events and their times (events(): `times`)
    'arena-bf': lambda evs, _: arena_bf(evs),
    'pages-bf': lambda evs, _: pages_bf(evs),
    'pages-bf-streams': lambda evs, _: pages_bf_streams(evs),
    'pages-bf-streams-busy': pages_bf_streams_busy,
    'offline': lambda evs, _: pages_bf(evs, offline_layout(evs)),
    'online-plan': lambda evs, _: online_plan(evs),
    'online-plan-kept': lambda evs, _: online_plan(evs, kept=True),
    'lifetime-oracle': lambda evs, _: lifetime_classes(evs, lifetimes_known(evs, LIFETIME_EVENTS)),
    'lifetime-predicted': lambda evs, _: lifetime_classes(evs, lifetimes_predicted(evs, LIFETIME_EVENTS)),
}
LIFETIME_EVENTS = 4096
WORK = 1.0  # --stream-work
DEFAULT_MODELS = 'arena-bf,pages-bf,offline'


def traces_in(spec):
    if os.path.isdir(spec):
        return sorted(glob.glob(os.path.join(spec, '*.csv')) + glob.glob(os.path.join(spec, '*.csv.gz')))
    return [spec]


def main(argv):
    global LIFETIME_EVENTS, WORK
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('paths', nargs='+')
    ap.add_argument('--repeat', type=int, default=3)
    ap.add_argument('--models', default=DEFAULT_MODELS, help=f"comma-separated, of: {', '.join(MODELS)}")
    ap.add_argument('--lifetime-events', type=int, default=LIFETIME_EVENTS)
    ap.add_argument('--stream-work', type=float, default=WORK,
                    help='pages-bf-streams-busy: a freed block is in use for this x the time to its '
                         "stream's next event (gpupool replay --stream-work; 0 to 1)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.stream_work <= 1.0:
        print(f"placement_models.py: --stream-work {args.stream_work} is not between 0 and 1", file=sys.stderr)
        return 2
    LIFETIME_EVENTS, WORK = args.lifetime_events, args.stream_work
    names = args.models.split(',')
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"placement_models.py: unknown model {unknown[0]} (known: {', '.join(MODELS)})", file=sys.stderr)
        return 2
    print(f"{'trace':44s} {'live MiB':>9s} {'floor':>6s}" + ''.join(f" {n:>9s}" for n in names))
    for spec in args.paths:
        for path in traces_in(spec):
            times = []
            evs = events(path, args.repeat, times)
            live = peak = live_r = peak_r = 0
            for alloc, _, size, requested in evs:
                live += requested if alloc else -requested
                live_r += size if alloc else -size
                peak, peak_r = max(peak, live), max(peak_r, live_r)
            if peak == 0:
                continue
            floor = (peak_r + PAGE - 1) // PAGE * PAGE
            cells = ''.join(f" {MODELS[n](evs, times) / peak:>9.3f}" for n in names)
            print(f"{path[-44:]:44s} {peak / (1 << 20):>9.1f} {floor / peak:>6.3f}{cells}", flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
