"""Snapshots for PyTorch's memory viewers (issue 13 item 2): gpupool.snapshot.dump_snapshot() and
`gpupool replay --snapshot`, both written by libgpupool's own pickle writer, read by readers nobody
here wrote: Python's unpicklers (the C one and the pure-Python one), Debian's python3-torch (1.13)
torch.cuda._memory_viz (its `stats` command, and its `segments` and `memory` functions with a
format_flamegraph that returns the folded lines; skipped with a message where no interpreter here
imports it), and tools/snapshot_to_csv.py, which must turn the dict back into the same trace.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

from _support import REPO, MiB, SimTestCase, gpupool

from gpupool import snapshot

_spec = importlib.util.spec_from_file_location("snapshot_to_csv", os.path.join(REPO, "tools", "snapshot_to_csv.py"))
conv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conv)

CLI = os.environ.get("GPUPOOL_CLI") or shutil.which("gpupool")


def load_both_ways(path):
    """The pickle loaded by the C unpickler, the pure-Python one and the converter's (which refuses
    every class); all three must agree."""
    with open(path, "rb") as f:
        data = f.read()
    a = pickle.loads(data)
    import io

    b = pickle._Unpickler(io.BytesIO(data)).load()
    c = conv.RefusingUnpickler(io.BytesIO(data)).load()
    assert a == b == c
    return a


def viz_python():
    """An interpreter that imports torch.cuda._memory_viz (this one, or Debian's), or None."""
    for exe in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        if exe and os.path.exists(exe):
            r = subprocess.run([exe, "-c", "import torch.cuda._memory_viz"], capture_output=True)
            if r.returncode == 0:
                return exe
    return None


VIZ = viz_python()

VIZ_SCRIPT = r"""
import pickle, sys
import torch.cuda._memory_viz as viz
snap = pickle.load(open(sys.argv[1], 'rb'))
segments = snap['segments'] if isinstance(snap, dict) else snap
st = viz.stats(segments)
print('STATS', st['segments'], st['total_size'].value, st.get('active_allocated', viz.Bytes(0)).value)
folded = viz.segments(segments, format_flamegraph=lambda lines: lines)
mem = viz.memory(segments, format_flamegraph=lambda lines: lines)
print('SEGMENTS', sum(int(l.rsplit(' ', 1)[1]) for l in folded.splitlines()))
print('MEMORY', sum(int(l.rsplit(' ', 1)[1]) for l in mem.splitlines()))
for l in mem.splitlines():
    print('LINE', l)
"""


class Snapshot(SimTestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def workload(self):
        snapshot.record_history(1000)
        a = self.malloc(1000)
        b = self.malloc(300 * 1024)
        with gpupool.model("llama"):
            c = self.malloc(30 * MiB)
        with gpupool.model("resnet"):
            d = self.malloc(4 * MiB)
        self.free(b)
        return a, c, d

    def check_segments(self, segments):
        self.assertTrue(segments)
        for seg in segments:
            self.assertEqual(seg["total_size"], sum(b["size"] for b in seg["blocks"]))
            addr = seg["address"]
            for b in seg["blocks"]:
                self.assertEqual(b["address"], addr, "blocks tile their segment")
                addr += b["size"]
                self.assertIn(b["state"], ("active_allocated", "active_pending_free", "inactive"))
            self.assertEqual(seg["frames"][0]["name"], seg["tenant"])
        live = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
        self.assertEqual(sum(b["size"] for b in live), gpupool.stats()["allocated_bytes"])
        tenants = {b["frames"][0]["name"] for b in live}
        self.assertEqual(tenants, {"default", "llama", "resnet"}, "each block names its tenant")

    def test_dict_has_segments_blocks_and_the_device_trace(self):
        self.workload()
        path = snapshot.dump_snapshot(self.path("s.pickle"))
        snap = load_both_ways(path)
        self.assertEqual(set(snap), {"segments", "device_traces", "allocator_settings"})
        self.check_segments(snap["segments"])
        trace = snap["device_traces"][0]
        actions = [e["action"] for e in trace]
        for a in ("segment_alloc", "alloc", "free_requested", "free_completed"):
            self.assertIn(a, actions)
        self.assertEqual(actions.count("alloc"), 4)
        times = [e["time_us"] for e in trace]
        self.assertEqual(times, sorted(times))
        freed = [e for e in trace if e["action"] == "free_requested"]
        self.assertEqual([e["size"] for e in freed], [300 * 1024])
        self.assertEqual({e["frames"][0]["name"] for e in trace if e["action"] == "alloc"},
                         {"default", "llama", "resnet"})

    def test_list_is_the_segment_list_alone(self):
        self.workload()
        snap = load_both_ways(snapshot.dump_snapshot(self.path("l.pickle"), format="list"))
        self.assertIsInstance(snap, list)
        self.check_segments(snap)

    def test_without_history_the_trace_is_empty(self):
        self.malloc(MiB)
        snap = load_both_ways(snapshot.dump_snapshot(self.path("s.pickle")))
        self.assertEqual(snap["device_traces"], [[]])
        self.assertEqual(len(snap["segments"]), 1)

    def test_round_trip_through_snapshot_to_csv(self):
        a, c, d = self.workload()
        self.free(a)
        snap = conv.load_snapshot(snapshot.dump_snapshot(self.path("s.pickle")))
        rows, summary = conv.convert(snap)
        got = [(action, size) for _, action, _, size, _ in rows]
        self.assertEqual(got, [("allocate", 1000), ("allocate", 300 * 1024), ("allocate", 30 * MiB),
                               ("allocate", 4 * MiB), ("free", 300 * 1024), ("free", 1000)])
        self.assertEqual(summary["live_before_trace"], 0)
        self.assertEqual(summary["peak_live_bytes"], 1000 + 300 * 1024 + 34 * MiB)
        self.assertEqual(summary["pytorch_end_reserved_bytes"], gpupool.stats()["reserved_bytes"])

    def test_bad_path_and_format_are_errors_and_leave_no_file(self):
        with self.assertRaises(gpupool.GpupoolError) as e:
            snapshot.dump_snapshot("/nonexistent-dir/s.pickle")
        self.assertIn("/nonexistent-dir/s.pickle", str(e.exception))
        self.assertFalse(os.path.exists("/nonexistent-dir"))
        with self.assertRaises(ValueError):
            snapshot.dump_snapshot(self.path("x.pickle"), format="json")
        self.assertEqual(os.listdir(self.dir), [])
        with self.assertRaises(ValueError):
            snapshot.record_history(-1)

    @unittest.skipUnless(VIZ, "no interpreter here imports torch.cuda._memory_viz (apt-get install python3-torch)")
    def test_pytorchs_memory_viz_reads_both_formats(self):
        self.workload()
        for fmt in ("dict", "list"):
            path = snapshot.dump_snapshot(self.path(f"{fmt}.pickle"), format=fmt)
            segments = snapshot_segments = load_both_ways(path)
            if fmt == "dict":
                segments = snapshot_segments["segments"]
            r = subprocess.run([VIZ, "-c", VIZ_SCRIPT, path], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if not line.startswith("LINE"))
            reserved = sum(s["total_size"] for s in segments)
            n, total, active = map(int, out["STATS"].split())
            self.assertEqual((n, total), (len(segments), reserved))
            self.assertEqual(active, gpupool.stats()["allocated_bytes"])
            self.assertEqual(int(out["SEGMENTS"]), reserved, "the folded lines cover every byte")
            self.assertEqual(int(out["MEMORY"]), reserved)
            lines = [l for l in r.stdout.splitlines() if l.startswith("LINE")]
            for tenant in ("default", "llama", "resnet"):
                self.assertTrue(any(f"gpupool tenant:0:{tenant}" in l for l in lines), (tenant, lines))
        # and the command line's `stats`
        r = subprocess.run([VIZ, "-m", "torch.cuda._memory_viz", "stats", self.path("list.pickle")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("'segments': ", r.stdout)


class SnapshotVmm(SimTestCase):
    CONF = "backend:sim-vmm,device_memory:256MiB"

    def test_mapped_runs_are_expandable_segments_with_map_events(self):
        snapshot.record_history(1000)
        a = self.malloc(6 * MiB)
        b = self.malloc(MiB)
        with tempfile.TemporaryDirectory() as d:
            snap = load_both_ways(snapshot.dump_snapshot(os.path.join(d, "s.pickle")))
        for seg in snap["segments"]:
            self.assertTrue(seg["is_expandable"])
            self.assertEqual(seg["total_size"], sum(x["size"] for x in seg["blocks"]))
            self.assertNotEqual(seg["total_size"], 0)
        self.assertEqual(sum(s["total_size"] for s in snap["segments"]), gpupool.stats()["mapped_bytes"])
        actions = {e["action"] for e in snap["device_traces"][0]}
        self.assertIn("segment_map", actions)
        self.assertNotIn("segment_alloc", actions)
        self.free(a)
        self.free(b)


@unittest.skipUnless(CLI and os.path.exists(CLI), "the gpupool command is not built (GPUPOOL_CLI unset)")
class ReplaySnapshot(unittest.TestCase):
    TRACE = ("Thread,Time,Action,Pointer,Size,Stream\n"
             "0,1,allocate,0x1000,4096,0x0\n"
             "0,2,allocate,0x9000,31457280,0x0\n"
             "0,3,allocate,0x2000,100000,0x0\n"
             "0,4,free,0x1000,4096,0x0\n"
             "0,5,free,0x9000,31457280,0x0\n")

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.trace = os.path.join(self.dir, "t.csv")
        with open(self.trace, "w") as f:
            f.write(self.TRACE)

    def replay(self, *args):
        return subprocess.run([CLI, "replay", *args], capture_output=True, text=True)

    def test_replay_snapshot_round_trips_to_the_same_trace(self):
        out = os.path.join(self.dir, "r.pickle")
        r = self.replay("--snapshot", out, "--repeat", "2", self.trace)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"snapshot              written to {out}", r.stdout)
        snap = load_both_ways(out)
        self.assertIn("device_traces", snap)
        rows, summary = conv.convert(conv.load_snapshot(out))
        # the last pass's events, as the trace has them (pointers are the pool's, sizes the trace's)
        want = [(line.split(",")[2], int(line.split(",")[4])) for line in self.TRACE.splitlines()[1:]]
        got = [(action, size) for _, action, _, size, _ in rows if size in {4096, 31457280, 100000}]
        self.assertEqual(got[-len(want):], want)
        # the block the trace leaves live is live in the snapshot's segments
        live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        self.assertEqual([b["requested_size"] for b in live], [100000])
        # the CSV it converts to replays like the original
        csv = os.path.join(self.dir, "back.csv")
        with open(csv, "w") as f:
            conv.write_csv(rows, f)
        r2 = self.replay("--json", csv)
        self.assertEqual(r2.returncode, 0, r2.stderr)

    def test_list_format_and_models(self):
        out = os.path.join(self.dir, "l.pickle")
        other = os.path.join(self.dir, "u.csv")
        with open(other, "w") as f:
            f.write(self.TRACE.replace("0x", "0x7"))
        r = self.replay("--snapshot", out, "--snapshot-format", "list", "--model", f"a={self.trace}",
                        "--model", f"b={other}")
        self.assertEqual(r.returncode, 0, r.stderr)
        snap = load_both_ways(out)
        self.assertIsInstance(snap, list)
        self.assertEqual({s["tenant"] for s in snap}, {"a", "b"})

    def test_bad_snapshot_options(self):
        r = self.replay("--snapshot-format", "json", "--snapshot", "x.pickle", self.trace)
        self.assertEqual(r.returncode, 2)
        self.assertIn("expected dict or list", r.stderr)
        r = self.replay("--snapshot", os.path.join(self.dir, "s.pickle"), self.trace, self.trace)
        self.assertEqual(r.returncode, 2)
        r = self.replay("--snapshot", "/nonexistent-dir/s.pickle", self.trace)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent-dir/s.pickle", r.stderr)

    def test_gzip_and_stdin_traces(self):
        import gzip

        gz = self.trace + ".gz"
        with gzip.open(gz, "wt") as f:
            f.write(self.TRACE)
        a = self.replay("--json", self.trace)
        b = self.replay("--json", gz)
        with open(gz, "rb") as f:
            c = subprocess.run([CLI, "replay", "--json", "-"], stdin=f, capture_output=True, text=True)
        for r in (a, b, c):
            self.assertEqual(r.returncode, 0, r.stderr)
        import json

        peaks = [json.loads(r.stdout)["traces"][0]["peak_live_bytes"] for r in (a, b, c)]
        self.assertEqual(peaks, [4096 + 31457280 + 100000] * 3)
        self.assertEqual(json.loads(c.stdout)["traces"][0]["path"], "<stdin>")


if __name__ == "__main__":
    unittest.main()
