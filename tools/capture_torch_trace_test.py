#!/usr/bin/env python3
"""Tests of capture_torch_trace.py: a PyTorch step recorded on the CPU, checked
record by record, then replayed by `remat sim --verify`. Needs torch; without
it the test is skipped (exit 77).

Usage: capture_torch_trace_test.py PATH/TO/remat"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:
    print("capture_torch_trace_test: torch is not installed; skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capture_torch_trace as capture  # noqa: E402

REMAT = sys.argv.pop(1) if len(sys.argv) > 1 else "build/bin/remat"


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class CaptureTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.path = os.path.join(self.dir.name, "step.jsonl")

    def capture_mlp(self):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(64, 256), torch.nn.GELU()]
        for _ in range(6):  # deep enough that half the peak holds one layer's work
            layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 64))
        x = torch.randn(1024, 64)

        def step(rec):
            loss = model(x).square().mean()
            rec.phase("backward")
            loss.backward()

        n = capture.record(step, self.path)
        return model, x, n

    def test_records_the_forward_the_backward_and_the_releases(self):
        model, x, n = self.capture_mlp()
        records = read(self.path)
        self.assertEqual(len(records), n)
        kinds = [r["op"] for r in records]
        self.assertEqual(kinds.count("phase"), 1)
        backward = kinds.index("phase")
        calls = [r for r in records if r["op"] == "call"]
        names = [c["name"] for c in calls]
        self.assertIn("aten::addmm", names[:backward])
        self.assertIn("aten::mm", names)  # the backward's weight gradients
        # Every id is defined once, before it is used, and released at most once.
        defined, released = set(), set()
        for r in records:
            if r["op"] == "constant":
                self.assertNotIn(r["id"], defined)
                defined.add(r["id"])
            elif r["op"] == "call":
                for i in r["inputs"]:
                    self.assertIn(i, defined)
                    self.assertNotIn(i, released)
                for o in r["outputs"]:
                    self.assertNotIn(o["id"], defined)
                    self.assertGreaterEqual(o["bytes"], 0)
                    defined.add(o["id"])
                self.assertGreaterEqual(r["cost_ns"], 0)
            elif r["op"] == "release":
                self.assertIn(r["id"], defined)
                self.assertNotIn(r["id"], released)
                released.add(r["id"])
        # The first layer's output (1024 x 256 floats) is a call output with its bytes.
        first = next(c for c in calls if c["name"] == "aten::addmm")
        self.assertEqual(first["outputs"][0]["bytes"], 1024 * 256 * 4)
        # The parameters are constants of their own size, never released.
        constants = {r["id"]: r["bytes"] for r in records if r["op"] == "constant"}
        sizes = sorted(constants.values())
        self.assertEqual(sizes.count(256 * 64 * 4), 2)  # the first and last weights
        self.assertEqual(sizes.count(256 * 256 * 4), 7)  # six square weights, and x (1024 x 64)
        # All of them (and the biases) are held by the model or the test throughout.
        self.assertFalse(set(constants) & released)
        # Activations die during the backward: something is released after it starts.
        self.assertIn("release", kinds[backward:])

    def test_remat_replays_it_byte_for_byte_under_half_its_peak(self):
        self.capture_mlp()
        out = subprocess.run([REMAT, "sim", self.path, "--budget-ratio", "0.5", "--policy", "dtr",
                              "--accounting", "live", "--verify", "--json"],
                             capture_output=True, text=True, check=False)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        report = json.loads(out.stdout)
        self.assertEqual(report["status"], "ok")
        self.assertGreater(report["evictions"], 0)
        self.assertGreater(report["verified_accesses"], 0)
        self.assertEqual(report["mismatches"], 0)


if __name__ == "__main__":
    unittest.main()
