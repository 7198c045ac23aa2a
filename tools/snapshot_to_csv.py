#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot to an allocation trace that `gpupool replay` reads.

The snapshot is a pickle of either shape PyTorch writes: the dict of torch.cuda.memory._snapshot()
(written by torch.cuda.memory._dump_snapshot() after _record_memory_history(), and by gpupool's
dump_snapshot() and `gpupool replay --snapshot`), or the list of segments that
`pickle.dump(torch.cuda.memory_snapshot())` writes (no events: only --state-only reads it). Gzipped
pickles are read too. The output is RMM's allocation-log CSV:

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

Devices: a snapshot holds one trace per device. --device N converts device N; without it the tool
converts the one device whose trace has events and says which other devices it skipped; several
devices with events and no --device is an error that lists them.

A snapshot (or device) without events is an error (exit 1), since a trace made of its final state
alone says nothing about the program's allocations over time; --state-only writes that final state
(every block allocated, as allocations at time 0) and says so. Every message names the file once.

Usage: snapshot_to_csv.py SNAPSHOT.pickle [-o OUT.csv] [--device N] [--state-only] [--json]
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


class ConversionError(ValueError):
    """A snapshot this tool cannot turn into a trace; the message does not name the file (main does)."""


def load_snapshot(path):
    """The snapshot as a dict with 'segments' and 'device_traces' (a list of segments, PyTorch 1.x's
    memory_snapshot(), gets an empty trace per device and 'shape': 'list')."""
    with open(path, 'rb') as f:
        data = f.read()
    if data[:2] == b'\x1f\x8b':
        data = gzip.decompress(data)
    snapshot = RefusingUnpickler(io.BytesIO(data)).load()
    if isinstance(snapshot, list) and all(isinstance(s, dict) and 'blocks' in s for s in snapshot):
        devices = {s.get('device', 0) for s in snapshot}
        return {'segments': snapshot, 'device_traces': [[] for _ in range(max(devices, default=0) + 1)],
                'shape': 'list'}
    if not isinstance(snapshot, dict) or 'segments' not in snapshot:
        raise ConversionError("not a PyTorch memory snapshot (expected the dict of "
                              "torch.cuda.memory._snapshot() or the list of segments of "
                              "torch.cuda.memory_snapshot())")
    snapshot = dict(snapshot)
    snapshot.setdefault('device_traces', [])
    snapshot['shape'] = 'dict'
    return snapshot


def devices_of(snapshot):
    """{device: number of trace events} for every device the snapshot mentions."""
    out = {i: len(t or []) for i, t in enumerate(snapshot.get('device_traces', []))}
    for seg in snapshot.get('segments', []):
        out.setdefault(seg.get('device', 0), 0)
    return out


def choose_device(snapshot, device, state_only):
    """(device, skipped devices, note) following the rules in the module's docstring."""
    counts = devices_of(snapshot)
    if device is not None:
        if device not in counts:
            raise ConversionError(f"device {device} is not in the snapshot (it has device"
                                  f"{'s' if len(counts) != 1 else ''} {', '.join(map(str, sorted(counts))) or 'none'})")
        chosen = device
    else:
        with_events = [d for d, n in sorted(counts.items()) if n > 0]
        if len(with_events) > 1:
            raise ConversionError(f"devices {', '.join(map(str, with_events))} all have events: choose one "
                                  "with --device")
        if with_events:
            chosen = with_events[0]
        elif state_only and counts:
            with_segments = sorted({s.get('device', 0) for s in snapshot.get('segments', [])})
            if len(with_segments) > 1:
                raise ConversionError(f"devices {', '.join(map(str, with_segments))} all have segments: "
                                      "choose one with --device")
            chosen = with_segments[0] if with_segments else min(counts)
        else:
            chosen = None
    if chosen is None or (counts.get(chosen, 0) == 0 and not state_only):
        where = f"device {chosen}" if chosen is not None and len(counts) > 1 else "the snapshot"
        why = ("it is the list of segments of torch.cuda.memory_snapshot(), which has no trace"
               if snapshot.get('shape') == 'list' else
               "record them with torch.cuda.memory._record_memory_history() (gpupool: record_history()) "
               "before taking it")
        raise ConversionError(f"{where} has no allocation events ({why}); --state-only writes its final "
                              "state as allocations at time 0")
    skipped = [d for d in sorted(counts) if d != chosen]
    return chosen, skipped


def final_blocks(segment):
    """Yields (address, block) for each block of a segment, computing addresses where absent."""
    addr = segment.get('address', 0)
    for block in segment.get('blocks', []):
        baddr = block.get('address', addr)
        yield baddr, block
        addr = baddr + block.get('size', 0)


def convert(snapshot, device=None, state_only=False):
    """Returns (rows, summary). rows are (time_us, action, pointer, size, stream) tuples. Raises
    ConversionError for a snapshot (or device) without events unless state_only."""
    traces = snapshot.get('device_traces', [])
    device, skipped = choose_device(snapshot, device, state_only)
    trace = (traces[device] or []) if device < len(traces) else []
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
        'skipped_devices': skipped,
        'state_only': not trace,
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
    if s['skipped_devices']:
        print(f"  skipped device{'s' if len(s['skipped_devices']) > 1 else ''} "
              f"{', '.join(map(str, s['skipped_devices']))} (convert one with --device N)", file=f)
    if s['state_only']:
        print("  --state-only: the snapshot's final state only (its blocks as allocations at time 0), "
              "no events", file=f)
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
    ap.add_argument('--state-only', action='store_true',
                    help='a snapshot without events: write its final state as allocations at time 0')
    ap.add_argument('--json', action='store_true', help='print the summary as JSON')
    ap.add_argument('--self-test', action='store_true', help='check the converter on a built-in snapshot')
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.snapshot:
        ap.error('a snapshot is required')
    try:
        snapshot = load_snapshot(args.snapshot)
        rows, summary = convert(snapshot, args.device, args.state_only)
    except OSError as e:  # its text names the file already: name it once
        print(f"snapshot_to_csv.py: {args.snapshot}: {e.strerror or e}", file=sys.stderr)
        return 1
    except (ValueError, pickle.UnpicklingError, EOFError, KeyError, TypeError) as e:
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
