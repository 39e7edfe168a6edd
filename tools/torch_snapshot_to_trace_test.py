#!/usr/bin/env python3
"""Tests of torch_snapshot_to_trace.py on hand-made snapshots (ctest runs it)."""
import contextlib
import io
import os
import pickle
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_snapshot_to_trace as tool  # noqa: E402

HEADER = "Thread,Time,Action,Pointer,Size,Stream"


def entry(action, addr, size, time_us, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": time_us, "frames": []}


class ConvertTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def write_snapshot(self, snapshot, protocol=2):
        with open(self.path("snap.pickle"), "wb") as f:
            pickle.dump(snapshot, f, protocol=protocol)
        return self.path("snap.pickle")

    def run_tool(self, snapshot, *args):
        """(exit status, CSV lines or None, stderr)."""
        source = self.write_snapshot(snapshot) if not isinstance(snapshot, str) else snapshot
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = tool.main([source, "-o", self.path("out.csv"), *args])
        lines = None
        if status == 0:
            with open(self.path("out.csv")) as f:
                lines = f.read().splitlines()
        return status, lines, err.getvalue()

    def test_frees_land_at_their_completion_or_their_request(self):
        trace = [
            entry("segment_alloc", 0x7f0000000000, 2 << 20, 10),
            entry("alloc", 0x7f0000000000, 700, 10),
            entry("alloc", 0x7f0000000400, 3000, 20, stream=0x55d0c8a3f2b0),
            entry("free_requested", 0x7f0000000000, 700, 30),
            entry("alloc", 0x7f0000001000, 512, 40),
            entry("free_completed", 0x7f0000000000, 700, 50),
            entry("free_requested", 0x7f0000000400, 3000, 60, stream=0x55d0c8a3f2b0),
            entry("oom", 0, 1 << 40, 70),
        ]
        status, lines, err = self.run_tool({"segments": [], "device_traces": [trace]})
        self.assertEqual(status, 0, err)
        self.assertEqual(lines, [
            HEADER,
            "0,00:00:00.000010,allocate,0x7f0000000000,700,0x0",
            "0,00:00:00.000020,allocate,0x7f0000000400,3000,0x55d0c8a3f2b0",
            "0,00:00:00.000040,allocate,0x7f0000001000,512,0x0",
            "0,00:00:00.000050,free,0x7f0000000000,700,0x0",
            "0,00:00:00.000060,free,0x7f0000000400,3000,0x55d0c8a3f2b0",
        ])
        self.assertIn("3 allocations, 2 frees", err)
        self.assertIn("skipped 1 oom events", err)
        self.assertIn("skipped 1 segment_alloc events", err)

    def test_frees_of_allocations_made_before_the_trace_are_skipped_and_counted(self):
        trace = [
            entry("free_requested", 0x1000, 512, 1),   # with its completion: one free
            entry("free_completed", 0x1000, 512, 2),
            entry("free_completed", 0x2000, 512, 3),   # a lone completion: another
            entry("alloc", 0x1000, 100, 4),
            entry("free_completed", 0x1000, 100, 5),   # no request recorded: still the free
        ]
        status, lines, err = self.run_tool({"device_traces": [trace]})
        self.assertEqual(status, 0, err)
        self.assertEqual(lines[1:], ["0,00:00:00.000004,allocate,0x1000,100,0x0",
                                     "0,00:00:00.000005,free,0x1000,100,0x0"])
        self.assertIn("skipped 2 frees of allocations made before the trace began", err)

    def test_times_are_the_time_of_day(self):
        self.assertEqual(tool.format_time(0), "00:00:00.000000")
        self.assertEqual(tool.format_time(50_531_000_040), "14:02:11.000040")
        # Unix time (as PyTorch records it): 2024-01-01 10:00:00.5 UTC.
        self.assertEqual(tool.format_time(1_704_103_200_500_000), "10:00:00.500000")

    def test_device_choice(self):
        two = {"device_traces": [[entry("alloc", 0x10, 8, 1)], [entry("alloc", 0x20, 16, 1)]]}
        status, _, err = self.run_tool(two)
        self.assertEqual(status, 2)
        self.assertIn("devices [0, 1] recorded history; choose one with --device", err)
        status, lines, err = self.run_tool(two, "--device", "1")
        self.assertEqual(status, 0, err)
        self.assertEqual(lines[1:], ["0,00:00:00.000001,allocate,0x20,16,0x0"])
        status, _, err = self.run_tool(two, "--device", "5")
        self.assertEqual(status, 2)
        self.assertIn("no device 5", err)
        # The only device that recorded anything is picked without --device.
        status, lines, _ = self.run_tool({"device_traces": [[], [entry("alloc", 0x20, 16, 1)]]})
        self.assertEqual(status, 0)

    def test_snapshots_without_history_are_refused(self):
        status, _, err = self.run_tool({"segments": []})
        self.assertEqual(status, 2)
        self.assertIn("no device_traces", err)
        status, _, err = self.run_tool({"segments": [], "device_traces": [[]]})
        self.assertEqual(status, 2)
        self.assertIn("no history was recorded", err)
        status, _, err = self.run_tool([1, 2])
        self.assertEqual(status, 2)
        self.assertIn("not a memory snapshot", err)

    def test_malformed_entries_are_refused(self):
        status, _, err = self.run_tool({"device_traces": [[entry("alloc", -1, 8, 1)]]})
        self.assertEqual(status, 2)
        self.assertIn("trace entry 0 (alloc) needs non-negative integers", err)
        trace = [entry("alloc", 0x10, 8, 1), entry("alloc", 0x10, 8, 2)]
        status, _, err = self.run_tool({"device_traces": [trace]})
        self.assertEqual(status, 2)
        self.assertIn("trace entry 1: alloc at 0x10, which is already allocated", err)

    def test_refuses_pickles_that_would_run_code(self):
        marker = self.path("ran")

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        with open(self.path("evil.pickle"), "wb") as f:
            pickle.dump({"device_traces": [[Evil()]]}, f, protocol=2)
        status, _, err = self.run_tool(self.path("evil.pickle"))
        self.assertEqual(status, 2)
        self.assertIn("refusing to load", err)
        self.assertFalse(os.path.exists(marker))

    def test_plain_containers_and_newer_protocols_load(self):
        snapshot = {"device_traces": [[entry("alloc", 0x10, 8, 1)]], "tags": {1, 2},
                    "frozen": frozenset([3])}
        for protocol in (2, pickle.HIGHEST_PROTOCOL):
            with open(self.path("snap.pickle"), "wb") as f:
                pickle.dump(snapshot, f, protocol=protocol)
            status, _, err = self.run_tool(self.path("snap.pickle"))
            self.assertEqual(status, 0, err)

    def test_the_output_is_never_the_snapshot(self):
        source = self.write_snapshot({"device_traces": [[entry("alloc", 0x10, 8, 1)]]})
        with open(source, "rb") as f:
            before = f.read()
        os.link(source, self.path("hard.pickle"))
        os.symlink(source, self.path("soft.pickle"))
        spelled = os.path.join(self.dir.name, ".", "snap.pickle")
        for output in (source, spelled, self.path("hard.pickle"), self.path("soft.pickle")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                status = tool.main([source, "-o", output])
            self.assertEqual(status, 2, output)
            self.assertIn("is the snapshot: refusing to overwrite an input", err.getvalue())
            self.assertEqual(len(err.getvalue().splitlines()), 1)
        with open(source, "rb") as f:
            self.assertEqual(f.read(), before)
        # An output that cannot be created is refused before the snapshot is read.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = tool.main([self.path("missing.pickle"), "-o",
                                self.path("no/such/dir/out.csv")])
        self.assertEqual(status, 2)
        self.assertIn("cannot create: no directory", err.getvalue())

    def test_unreadable_inputs_exit_two(self):
        status, _, err = self.run_tool(self.path("missing.pickle"))
        self.assertEqual(status, 2)
        self.assertIn("missing.pickle", err)
        with open(self.path("text.pickle"), "w") as f:
            f.write("Thread,Time\n")
        status, _, err = self.run_tool(self.path("text.pickle"))
        self.assertEqual(status, 2)
        self.assertIn("torch_snapshot_to_trace:", err)


if __name__ == "__main__":
    unittest.main()
