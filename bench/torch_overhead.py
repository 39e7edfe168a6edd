"""What remat.torch.budget costs per ATen call when it evicts nothing.

A chain of small ops (matmul, tanh, scale: the shape of an MLP or an RNN's
step, where per-op costs show most) is run forward and backward four ways,
taking turns, on one thread:

- plain: no remat;
- pass-through mode: a TorchDispatchMode that only calls the op, the floor
  of any recorder built on one (it also sees every backward op);
- budget: inside remat.torch.budget with a budget nothing reaches (every
  forward call recorded, every saved activation handed to the runtime and
  brought back, nothing dropped);
- the same budget, entered each step (the steady state of a training loop);
- the same with pause_gc=False: Python's garbage collector left running.

Prints the median and the mean step time of each (the mean counts the rare
full collections of the garbage collector, which the median hides) and the
budget's extra microseconds per forward call, over plain and over the
pass-through floor.

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_overhead.py [--steps 100] [--ops 300]
"""
import argparse
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import remat.torch


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per way")
    parser.add_argument("--ops", type=int, default=300, help="forward ATen calls per step")
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = torch.randn(args.width, args.width, requires_grad=True)
    x0 = torch.randn(16, args.width)
    layers = max(1, args.ops // 3)

    def step():
        x = x0
        for _ in range(layers):
            x = torch.tanh(x @ w) * 1.01
        x.sum().backward()

    budget = remat.torch.budget(1 << 40, policy="dtr-eq")
    budget_gc = remat.torch.budget(1 << 40, policy="dtr-eq", pause_gc=False)

    def mode_step():
        with PassThrough():
            step()

    def budget_step():
        with budget:
            step()

    def budget_gc_step():
        with budget_gc:
            step()

    ways = {"plain": step, "pass-through mode": mode_step, "budget": budget_step,
            "budget, gc running": budget_gc_step}
    times = {name: [] for name in ways}
    for f in ways.values():  # warm up: first dispatches import and cache
        for _ in range(3):
            f()
    for _ in range(args.steps):
        for name, f in ways.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    mean = {name: statistics.fmean(ts) for name, ts in times.items()}
    calls = 3 * layers
    print(f"{calls} forward calls per step, {args.steps} steps each, one thread, "
          f"torch {torch.__version__}")
    for name in ways:
        print(f"  {name:20s} {median[name] * 1e3:8.2f} ms per step (median), "
              f"{mean[name] * 1e3:8.2f} ms (mean)")
    for name in ("budget", "budget, gc running"):
        for what, t in (("median", median), ("mean", mean)):
            extra = (t[name] - t["plain"]) / calls * 1e6
            over_floor = (t[name] - t["pass-through mode"]) / calls * 1e6
            print(f"  {name}, {what}: {extra:.1f} us per forward call over plain, "
                  f"{over_floor:.1f} us over the pass-through mode")
    print(f"  saved tensors per step: {budget.stats['saved_tensors']}, "
          f"drops: {budget.stats['drops']}")


if __name__ == "__main__":
    main()
