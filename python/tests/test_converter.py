"""tools/snapshot_to_csv.py on the snapshot shapes real programs write (issue 13 item 5): both shapes,
several devices, snapshots without events; every message names the file once."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pickle
import tempfile
import unittest

from _support import REPO

MiB = 1 << 20
_spec = importlib.util.spec_from_file_location("snapshot_to_csv", os.path.join(REPO, "tools", "snapshot_to_csv.py"))
conv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conv)


def segment(device, address, blocks):
    return {"device": device, "address": address, "total_size": sum(b["size"] for b in blocks), "stream": 0,
            "segment_type": "large", "blocks": blocks}


def events(n, base=0x7000000):
    out = []
    for i in range(n):
        out.append({"action": "alloc", "addr": base + i * MiB, "size": MiB, "stream": 0, "time_us": 10 * i})
        out.append({"action": "free_requested", "addr": base + i * MiB, "size": MiB, "stream": 0,
                    "time_us": 10 * i + 5})
    return out


class Converter(unittest.TestCase):
    def run_tool(self, snapshot, *args):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snap.pickle")
            with open(path, "wb") as f:
                pickle.dump(snapshot, f)
            out = os.path.join(d, "out.csv")
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as so:
                rc = conv.main([path, "-o", out, *args])
            csv = None
            if os.path.exists(out):
                with open(out) as f:
                    csv = f.read()
            return rc, err.getvalue() + so.getvalue(), csv, path

    def test_the_list_of_segments_is_read_and_without_events_needs_state_only(self):
        snap = [segment(0, 0x1000000, [{"size": 2 * MiB, "state": "active_allocated", "requested_size": 2 * MiB},
                                       {"size": 18 * MiB, "state": "inactive"}])]
        rc, msg, csv, path = self.run_tool(snap)
        self.assertEqual(rc, 1, "a snapshot without events is an error")
        self.assertIn("no allocation events", msg)
        self.assertIn("--state-only", msg)
        self.assertEqual(msg.count(path), 1, f"the file is named once: {msg}")
        rc, msg, csv, _ = self.run_tool(snap, "--state-only")
        self.assertEqual(rc, 0, msg)
        self.assertIn("--state-only", msg, "it says the trace is the final state only")
        self.assertEqual(csv.splitlines()[1], "0,0,allocate,0x1000000,2097152,0x0")

    def test_a_dict_without_events_is_an_error(self):
        snap = {"segments": [segment(0, 0x1000000, [{"size": 2 * MiB, "state": "active_allocated"}])],
                "device_traces": [[]]}
        rc, msg, _, path = self.run_tool(snap)
        self.assertEqual(rc, 1)
        self.assertIn("_record_memory_history", msg)
        self.assertEqual(msg.count(path), 1, msg)

    def test_the_device_with_events_is_chosen_and_the_others_named(self):
        snap = {"segments": [], "device_traces": [[], events(3), []]}
        rc, msg, csv, _ = self.run_tool(snap)
        self.assertEqual(rc, 0, msg)
        self.assertIn("from device 1", msg)
        self.assertIn("skipped devices 0, 2", msg)
        self.assertEqual(len(csv.splitlines()), 1 + 6)

    def test_several_devices_with_events_need_device(self):
        snap = {"segments": [], "device_traces": [events(2), events(3), events(1)]}
        rc, msg, _, path = self.run_tool(snap)
        self.assertEqual(rc, 1)
        self.assertIn("--device", msg)
        self.assertIn("0, 1, 2", msg)
        rc, msg, csv, _ = self.run_tool(snap, "--device", "2")
        self.assertEqual(rc, 0, msg)
        self.assertIn("from device 2", msg)
        self.assertIn("skipped devices 0, 1", msg)
        self.assertEqual(len(csv.splitlines()), 1 + 2)

    def test_a_device_asked_for_that_is_absent_or_empty_is_an_error(self):
        snap = {"segments": [], "device_traces": [events(1), []]}
        rc, msg, _, _ = self.run_tool(snap, "--device", "5")
        self.assertEqual(rc, 1)
        self.assertIn("device 5 is not in the snapshot", msg)
        rc, msg, _, _ = self.run_tool(snap, "--device", "1")
        self.assertEqual(rc, 1)
        self.assertIn("device 1 has no allocation events", msg)

    def test_not_a_snapshot_and_a_missing_file_name_the_file_once(self):
        rc, msg, _, path = self.run_tool({"something": 1})
        self.assertEqual(rc, 1)
        self.assertIn("not a PyTorch memory snapshot", msg)
        self.assertEqual(msg.count(path), 1, msg)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = conv.main(["/nonexistent/snap.pickle"])
        self.assertEqual(rc, 1)
        self.assertEqual(err.getvalue().count("/nonexistent/snap.pickle"), 1, err.getvalue())

    def test_self_test(self):
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(conv.main(["--self-test"]), 0)


if __name__ == "__main__":
    unittest.main()
