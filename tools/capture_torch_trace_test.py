#!/usr/bin/env python3
"""Tests of capture_torch_trace.py: a PyTorch step recorded on the CPU, checked
record by record, then replayed by `remat sim --verify`; the model costs; the
densenet121 and lstm steps replayed by `remat sim`.

    capture_torch_trace_test.py [PATH/TO/remat]     (ctest runs it so)
    pytest tools/capture_torch_trace_test.py        (remat: $REMAT, else build/bin/remat)

Needs torch; without it every test is skipped (run as a script: exit 77, which
ctest reports as skipped). The densenet121 test also needs torchvision, and the
replays a remat binary; each is skipped, saying why, without it."""
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    torch = None
try:
    import torchvision
except ImportError:
    torchvision = None

if torch is not None:
    import capture_torch_trace as capture

REMAT = os.environ.get("REMAT", os.path.join(HERE, os.pardir, "build", "bin", "remat"))
NO_TORCH = "torch is not installed"
NO_TORCHVISION = "torchvision is not installed"


def needs_remat(test):
    """Skips `test` when the remat binary is missing (looked up when it runs,
    after the command line may have named it)."""
    def run(self, *args, **kwargs):
        if not os.access(REMAT, os.X_OK):
            self.skipTest(f"no remat binary at {REMAT} (pass its path, or set REMAT)")
        return test(self, *args, **kwargs)
    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@unittest.skipIf(torch is None, NO_TORCH)
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

    @needs_remat
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


def mm_step(m, k, n):
    a, b = torch.ones(m, k), torch.ones(k, n)

    def step(rec):
        torch.mm(a, b)
    return step


@unittest.skipIf(torch is None, NO_TORCH)
class ModelCostTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def calls(self, step, **costs):
        path = self.path("step.jsonl")
        capture.record(step, path, **costs)
        return [r for r in read(path) if r["op"] == "call"]

    def test_the_same_step_gives_the_same_file(self):
        def mlp_step():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(),
                                        torch.nn.Linear(128, 32))
            x = torch.randn(64, 32)

            def step(rec):
                loss = model(x).square().mean()
                rec.phase("backward")
                loss.backward()
            return step

        capture.record(mlp_step(), self.path("a.jsonl"))
        capture.record(mlp_step(), self.path("b.jsonl"), cost="model")
        self.assertTrue(filecmp.cmp(self.path("a.jsonl"), self.path("b.jsonl"), shallow=False))
        self.assertGreater(len(read(self.path("a.jsonl"))), 10)

    def test_a_matmul_costs_its_flops_at_the_rate(self):
        # 1 TFLOP/s is 1000 FLOPs a ns; memory and launches made free.
        rates = {"tflops": 1.0, "hbm_gbps": 1e12, "launch_ns": 0}
        (mm,) = self.calls(mm_step(64, 125, 32), **rates)
        self.assertEqual(mm["name"], "aten::mm")
        self.assertEqual(mm["cost_ns"], 2 * 64 * 125 * 32 // 1000)  # 512
        (twice,) = self.calls(mm_step(64, 250, 32), **rates)
        self.assertEqual(twice["cost_ns"], 2 * mm["cost_ns"])
        (rounded,) = self.calls(mm_step(64, 128, 32), **rates)
        self.assertEqual(rounded["cost_ns"], 525)  # 524,288 FLOPs: 524.288 ns, rounded up
        # At 400 TFLOP/s the same mm is under the 1 us floor.
        (floor,) = self.calls(mm_step(64, 128, 32))
        self.assertEqual(floor["cost_ns"], 1000)
        # A big one is FLOP-bound at the default rates: 2*1024^3 / 400e3 ns, rounded up.
        (big,) = self.calls(mm_step(1024, 1024, 1024))
        self.assertEqual(big["cost_ns"], 5369)

    def test_an_elementwise_op_costs_its_bytes_and_a_view_nothing(self):
        x, y = torch.ones(1 << 20), torch.ones(1 << 20)

        def step(rec):
            z = x + y  # reads 8 MiB, writes 4 MiB
            z.view(1024, 1024)
            x.mul_(2)  # in place: reads and writes 4 MiB

        calls = self.calls(step, hbm_gbps=1000.0)
        self.assertEqual([c["name"] for c in calls], ["aten::add", "aten::mul_"])
        self.assertEqual(calls[0]["cost_ns"], 3 * 4 * (1 << 20) // 1000 + 1)  # rounded up
        self.assertEqual(calls[1]["cost_ns"], 2 * 4 * (1 << 20) // 1000 + 1)

        def view_only(rec):
            x.view(1024, 1024).t()

        self.assertEqual(self.calls(view_only), [])

    def test_measured_costs_remain(self):
        calls = self.calls(mm_step(64, 64, 64), cost="measured")
        self.assertEqual(len(calls), 1)
        self.assertGreaterEqual(calls[0]["cost_ns"], 0)

    def test_bad_rates_and_modes_are_refused(self):
        with self.assertRaises(ValueError):
            capture.record(mm_step(2, 2, 2), self.path("x.jsonl"), cost="timed")
        with self.assertRaises(ValueError):
            capture.record(mm_step(2, 2, 2), self.path("x.jsonl"), tflops=0)


@unittest.skipIf(torch is None, NO_TORCH)
class ModelStepTest(unittest.TestCase):
    """The ready-made steps, tiny, through the command line and `remat sim`."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def capture_cli(self, *args):
        path = os.path.join(self.dir.name, "step.jsonl")
        out = subprocess.run([sys.executable, os.path.join(HERE, "capture_torch_trace.py"),
                              *args, "-o", path], capture_output=True, text=True, check=False)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return path

    def test_an_output_that_cannot_be_written_is_refused_before_the_step_runs(self):
        nowhere = os.path.join(self.dir.name, "no", "dir", "step.jsonl")
        out = subprocess.run([sys.executable, os.path.join(HERE, "capture_torch_trace.py"),
                              "--model", "mlp", "--layers", "1", "--hidden", "8", "-o", nowhere],
                             capture_output=True, text=True, check=False)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("--output", out.stderr)
        self.assertIn("cannot create: no directory", out.stderr)
        self.assertNotIn("Traceback", out.stderr)

    def sim(self, path, ratio, *args):
        out = subprocess.run([REMAT, "sim", path, "--budget-ratio", str(ratio),
                              "--accounting", "live", "--json", *args],
                             capture_output=True, text=True, check=False)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return json.loads(out.stdout)

    @unittest.skipIf(torchvision is None, NO_TORCHVISION)
    @needs_remat
    def test_densenet121(self):
        path = self.capture_cli("--model", "densenet121", "--batch", "2", "--image", "32",
                                "--classes", "10")
        records = read(path)
        names = {r["name"] for r in records if r["op"] == "call"}
        self.assertIn("aten::convolution", names)
        self.assertIn("aten::cat", names)  # the dense blocks' concatenations
        self.assertEqual(sum(r["op"] == "phase" for r in records), 1)
        report = self.sim(path, 1, "--verify", "--scale", "16")
        self.assertEqual(report["status"], "ok")
        self.assertEqual(report["records"], len(records))
        self.assertEqual(report["mismatches"], 0)

    @needs_remat
    def test_lstm_unrolled_replays_under_half_its_peak(self):
        path = self.capture_cli("--model", "lstm", "--layers", "2", "--hidden", "32",
                                "--seq", "12", "--batch", "8", "--vocab", "64")
        calls = [r for r in read(path) if r["op"] == "call"]
        names = [c["name"] for c in calls]
        # Each of the 2 x 12 cell steps: its own gate matmuls and nonlinearities.
        self.assertGreaterEqual(names.count("aten::addmm") + names.count("aten::mm"), 2 * 12)
        self.assertGreaterEqual(names.count("aten::sigmoid_"), 3 * 2 * 12)
        report = self.sim(path, 0.5, "--policy", "dtr", "--verify")
        self.assertEqual(report["status"], "ok")
        self.assertGreater(report["evictions"], 0)
        self.assertEqual(report["mismatches"], 0)

    @needs_remat
    def test_lstm_fused(self):
        path = self.capture_cli("--model", "lstm-fused", "--layers", "2", "--hidden", "16",
                                "--seq", "4", "--batch", "2", "--vocab", "32")
        self.assertEqual(self.sim(path, 1, "--verify")["status"], "ok")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        REMAT = sys.argv.pop(1)
    if torch is None:
        print(f"capture_torch_trace_test: {NO_TORCH}; skipped")
        sys.exit(77)
    unittest.main()
