#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot to an allocation trace that `gpupool replay` reads.

The snapshot is the pickle written by torch.cuda.memory._dump_snapshot() after
torch.cuda.memory._record_memory_history(). The output is RMM's allocation-log CSV:

    Thread,Time,Action,Pointer,Size,Stream

Action is `allocate`, `free` or `allocate failure` (PyTorch's `oom`); Pointer and Stream are hex; Time
is microseconds since the first traced event; Size is the size the program asked for.

Blocks that were live before PyTorch's trace ring buffer began -- freed in the trace without an
allocation, or still allocated in the final segment list without one -- are written first, as
allocations at time 0, so that the trace's live bytes are right from its first line.

It also prints what PyTorch's own allocator held (its reserved bytes) at the trace's start and at its
peak, from the segment_alloc / segment_free (segment_map / segment_unmap) events and the final segment
list, and the ratio of that peak to the trace's peak live bytes.

The pickle is read with an unpickler that refuses every class: a snapshot holds only dicts, lists,
tuples, strings and numbers, and a pickle that names a class is rejected rather than run.
Standard library only.

Usage: snapshot_to_csv.py SNAPSHOT.pickle [-o OUT.csv] [--device N] [--json]
       snapshot_to_csv.py --self-test
"""
import argparse
import collections
import csv
import gzip
import io
import json
import os
import pickle
import sys
import tempfile


class RefusingUnpickler(pickle.Unpickler):
    """An unpickler that loads only built-in containers and scalars: every class is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a memory snapshot holds only plain data, "
            "and this tool never imports classes named by a pickle")


def load_snapshot(path):
    with open(path, 'rb') as f:
        data = f.read()
    if data[:2] == b'\x1f\x8b':
        data = gzip.decompress(data)
    snapshot = RefusingUnpickler(io.BytesIO(data)).load()
    if not isinstance(snapshot, dict) or 'segments' not in snapshot:
        raise ValueError(f"{path}: not a PyTorch memory snapshot (expected a dict with 'segments' and "
                         "'device_traces', as written by torch.cuda.memory._dump_snapshot)")
    return snapshot


def final_blocks(segment):
    """Yields (address, block) for each block of a segment, computing addresses where absent."""
    addr = segment.get('address', 0)
    for block in segment.get('blocks', []):
        baddr = block.get('address', addr)
        yield baddr, block
        addr = baddr + block.get('size', 0)


def convert(snapshot, device=None):
    """Returns (rows, summary). rows are (time_us, action, pointer, size, stream) tuples."""
    traces = snapshot.get('device_traces', [])
    if device is None:
        nonempty = [i for i, t in enumerate(traces) if t]
        device = nonempty[0] if nonempty else 0
    trace = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot.get('segments', []) if s.get('device', device) == device]

    times = [e['time_us'] for e in trace if 'time_us' in e]
    t0 = min(times) if times else 0

    live = {}           # addr -> (size, stream), as the trace shows it
    pre_live = []       # (addr, size, stream) freed in the trace without an allocation
    rows = []
    seg_delta = 0       # reserved bytes added by the trace's segment events
    seg_running = [0]   # reserved after each trace event, relative to the start
    allocs = frees = failures = 0
    for i, e in enumerate(trace):
        action = e.get('action')
        addr = e.get('addr', 0)
        size = e.get('size', 0)
        stream = e.get('stream', 0)
        t = e['time_us'] - t0 if 'time_us' in e else i
        if action == 'alloc':
            if addr in live:  # allocated again without a traced free: close the older one
                osize, ostream = live.pop(addr)
                rows.append((t, 'free', addr, osize, ostream))
                frees += 1
            live[addr] = (size, stream)
            rows.append((t, 'allocate', addr, size, stream))
            allocs += 1
        elif action in ('free_requested', 'free'):
            if addr in live:
                size, stream = live.pop(addr)[0], stream
            else:
                pre_live.append((addr, size, stream))
            rows.append((t, 'free', addr, size, stream))
            frees += 1
        elif action == 'free_completed':
            pass  # the program's free is free_requested; completion only returns the block to the cache
        elif action == 'oom':
            rows.append((t, 'allocate failure', 0, size, stream))
            failures += 1
        elif action in ('segment_alloc', 'segment_map'):
            seg_delta += size
        elif action in ('segment_free', 'segment_unmap'):
            seg_delta -= size
        seg_running.append(seg_delta)

    # blocks still allocated at the end that the trace never allocated
    end_reserved = 0
    for seg in segments:
        end_reserved += seg.get('total_size', 0)
        for baddr, block in final_blocks(seg):
            if block.get('state') in ('active_allocated', 'active_pending_free') and baddr not in live:
                req = block.get('requested_size') or block.get('size', 0)
                pre_live.append((baddr, req, seg.get('stream', 0)))
                live[baddr] = (req, seg.get('stream', 0))

    start_reserved = end_reserved - seg_delta
    peak_reserved = start_reserved + max(seg_running)

    out = [(0, 'allocate', a, s, st) for a, s, st in pre_live] + rows
    cur = peak_live = 0
    sizes = {}
    for _, action, addr, size, _ in out:
        if action == 'allocate':
            sizes[addr] = size
            cur += size
            peak_live = max(peak_live, cur)
        elif action == 'free' and addr in sizes:
            cur -= sizes.pop(addr)
    summary = {
        'device': device,
        'events': len(out),
        'allocations': allocs + len(pre_live),
        'frees': frees,
        'allocate_failures': failures,
        'live_before_trace': len(pre_live),
        'peak_live_bytes': peak_live,
        'pytorch_start_reserved_bytes': start_reserved,
        'pytorch_peak_reserved_bytes': peak_reserved,
        'pytorch_end_reserved_bytes': end_reserved,
        'pytorch_reserved_over_live': peak_reserved / peak_live if peak_live else 0.0,
        'has_time': bool(times),
    }
    return out, summary


def write_csv(rows, f):
    w = csv.writer(f, lineterminator='\n')
    w.writerow(['Thread', 'Time', 'Action', 'Pointer', 'Size', 'Stream'])
    for t, action, addr, size, stream in rows:
        w.writerow([0, t, action, hex(addr), size, hex(stream)])


def print_summary(s, out_name, f):
    print(f"{out_name}: {s['events']} events ({s['allocations']} allocations, of which "
          f"{s['live_before_trace']} live before the trace began; {s['frees']} frees; "
          f"{s['allocate_failures']} allocate failures) from device {s['device']}", file=f)
    if not s['has_time']:
        print("  the snapshot has no time_us: Time is the event's index", file=f)
    print(f"  peak live               {s['peak_live_bytes']} bytes", file=f)
    print(f"  PyTorch start reserved  {s['pytorch_start_reserved_bytes']} bytes", file=f)
    print(f"  PyTorch peak reserved   {s['pytorch_peak_reserved_bytes']} bytes", file=f)
    print(f"  PyTorch reserved / live {s['pytorch_reserved_over_live']:.3f}", file=f)


def self_test():
    """Builds a small snapshot in memory and checks the conversion; also checks that classes are refused."""
    MIB = 1 << 20
    snap = {
        'segments': [{
            'device': 0, 'address': 0x1000000, 'total_size': 20 * MIB, 'stream': 0, 'segment_type': 'large',
            'segment_pool_id': (0, 0),
            'blocks': [
                {'size': 2 * MIB, 'requested_size': 2 * MIB - 100, 'state': 'active_allocated'},  # pre-live
                {'size': 4 * MIB, 'requested_size': 4 * MIB, 'state': 'active_allocated'},        # traced
                {'size': 14 * MIB, 'state': 'inactive'},
            ]}],
        'device_traces': [[
            {'action': 'free_requested', 'addr': 0x5000000, 'size': 3 * MIB, 'stream': 0, 'time_us': 1000},
            {'action': 'free_completed', 'addr': 0x5000000, 'size': 3 * MIB, 'stream': 0, 'time_us': 1001},
            {'action': 'segment_free', 'addr': 0x5000000, 'size': 20 * MIB, 'stream': 0, 'time_us': 1002},
            {'action': 'segment_alloc', 'addr': 0x9000000, 'size': 40 * MIB, 'stream': 0, 'time_us': 1010},
            {'action': 'alloc', 'addr': 0x9000000, 'size': 30 * MIB, 'stream': 0, 'time_us': 1011},
            {'action': 'alloc', 'addr': 0x1200000, 'size': 4 * MIB, 'stream': 0, 'time_us': 1020},
            {'action': 'free_requested', 'addr': 0x9000000, 'size': 30 * MIB, 'stream': 0, 'time_us': 1030},
            {'action': 'free_completed', 'addr': 0x9000000, 'size': 30 * MIB, 'stream': 0, 'time_us': 1031},
            {'action': 'segment_free', 'addr': 0x9000000, 'size': 40 * MIB, 'stream': 0, 'time_us': 1040},
            {'action': 'oom', 'addr': 0, 'size': 100 * MIB, 'stream': 0, 'time_us': 1050, 'device_free': 0},
        ]],
    }
    rows, s = convert(RefusingUnpickler(io.BytesIO(pickle.dumps(snap))).load())
    assert rows[0] == (0, 'allocate', 0x5000000, 3 * MIB, 0), rows[0]
    assert rows[1] == (0, 'allocate', 0x1000000, 2 * MIB - 100, 0), rows[1]
    assert rows[2] == (0, 'free', 0x5000000, 3 * MIB, 0), rows[2]
    assert rows[3] == (11, 'allocate', 0x9000000, 30 * MIB, 0), rows[3]
    assert rows[-1] == (50, 'allocate failure', 0, 100 * MIB, 0), rows[-1]
    assert s['live_before_trace'] == 2, s
    assert s['pytorch_end_reserved_bytes'] == 20 * MIB, s
    assert s['pytorch_start_reserved_bytes'] == 40 * MIB, s  # 20 at the end - 40 + 40 + 20 freed
    assert s['pytorch_peak_reserved_bytes'] == 60 * MIB, s
    assert s['peak_live_bytes'] == 2 * MIB - 100 + 30 * MIB + 4 * MIB, s

    try:  # any class, even a harmless one from the standard library, is refused
        RefusingUnpickler(io.BytesIO(pickle.dumps({'segments': [], 'x': collections.OrderedDict()}))).load()
        raise AssertionError("a class was loaded")
    except pickle.UnpicklingError:
        pass
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, 'snap.pickle.gz')
        with gzip.open(p, 'wb') as f:
            pickle.dump(snap, f)
        rows2, _ = convert(load_snapshot(p))
        assert rows2 == rows
        buf = io.StringIO()
        write_csv(rows, buf)
        lines = buf.getvalue().splitlines()
        assert lines[0] == 'Thread,Time,Action,Pointer,Size,Stream'
        assert lines[1] == '0,0,allocate,0x5000000,3145728,0x0', lines[1]
    print("snapshot_to_csv.py self-test: ok")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('snapshot', nargs='?', help='snapshot pickle from torch.cuda.memory._dump_snapshot')
    ap.add_argument('-o', '--output', help='CSV to write (default: standard output)')
    ap.add_argument('--device', type=int, default=None,
                    help='device whose trace to convert (default: the first with events)')
    ap.add_argument('--json', action='store_true', help='print the summary as JSON')
    ap.add_argument('--self-test', action='store_true', help='check the converter on a built-in snapshot')
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.snapshot:
        ap.error('a snapshot is required')
    try:
        snapshot = load_snapshot(args.snapshot)
        rows, summary = convert(snapshot, args.device)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError, KeyError, TypeError) as e:
        print(f"snapshot_to_csv.py: {args.snapshot}: {e}", file=sys.stderr)
        return 1
    report = sys.stdout
    if args.output:
        with open(args.output, 'w', newline='') as f:
            write_csv(rows, f)
    else:
        write_csv(rows, sys.stdout)
        report = sys.stderr
    if args.json:
        print(json.dumps(summary), file=report)
    else:
        print_summary(summary, args.output or '<stdout>', report)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
