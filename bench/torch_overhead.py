"""What remat.torch.budget costs per ATen call when it evicts nothing.

A chain of small ops (matmul, tanh, scale: the shape of an MLP or an RNN's
step, where per-op costs show most) is run forward and backward four ways,
taking turns, on one thread:

- plain: no remat;
- pass-through mode: a TorchDispatchMode that only calls the op, over the
  forward (the budget sets its recorder aside for the backward): the floor
  of any recorder built on one;
- budget: inside remat.torch.budget(native=False) with a budget nothing
  reaches (the Python recorder: every forward call recorded, every saved
  activation handed to the runtime and brought back, nothing dropped);
- the same budget, entered each step (the steady state of a training loop);
- the same with pause_gc=False: Python's garbage collector left running;
- the same budget native (as drop-only budgets are by default): the
  recorder and the saved-tensor hooks in C++ (remat.torch._native).

Prints the median and the mean step time of each (the mean counts the rare
full collections of the garbage collector, which the median hides) and the
budget's extra microseconds per forward call, over plain and over the
pass-through floor.

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_overhead.py [--steps 100] [--ops 300] \\
        [--ways plain,native]

--offload gives the budgets offload=True, recompute=True (the README's
snippet) instead of drops only.

--ways runs only those of plain, mode, python, python-gc and native (plain
always: the reference): two ways taking turns share the machine's state
more evenly than five.

--models gpt,mlp,lstm,resnet runs the package's models instead (at tiny
sizes, where the per-call cost shows most: a GPT of 4 layers of width 16),
plain and under a budget nothing reaches, taking turns.
"""
import argparse
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import remat.torch
from remat.torch.testing import models


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


# The chain's ways (--ways), as the output names them.
WAYS = {"plain": "plain", "mode": "pass-through mode", "python": "budget",
        "python-gc": "budget, gc running", "native": "native budget"}


# The package's models at sizes where the per-call cost shows most.
TINY = {
    "gpt": lambda: models.gpt(0, batch=1, seq=8, layers=4, d=16, vocab=32),
    "mlp": lambda: models.mlp(0, width=16, depth=12, batch=4),
    "lstm": lambda: models.lstm(0, vocab=16, hidden=16, seq=8, batch=2),
    "resnet": lambda: models.resnet(0, batch=2, channels=4, blocks=2, image=8),
}


# The same models at the package's own sizes (python/remat/torch/testing/models.py).
DEFAULT = {name: (lambda name=name: getattr(models, name)(0)) for name in TINY}


def _saved_bytes(step):
    """The step's peak of saved bytes, measured under a budget nothing reaches."""
    with remat.torch.budget(1 << 40, policy="dtr", native=False) as run:
        step().backward()
    return run.stats["peak_saved_bytes"]


def run_models(names, steps, sizes=TINY, ratio=None):
    what = "a budget nothing reaches" if ratio is None else \
        f"a budget of {ratio} of the step's saved bytes"
    print(f"{steps} steps each, plain and under {what}, taking turns; "
          f"one thread, torch {torch.__version__}")
    for name in names:
        _, step = sizes[name]()
        nbytes = 1 << 40 if ratio is None else max(1, int(_saved_bytes(step) * ratio))
        budget = remat.torch.budget(nbytes, policy="dtr", native=False)
        native = remat.torch.budget(nbytes, policy="dtr", native=True)

        def plain():
            step().backward()

        def budgeted():
            with budget:
                step().backward()

        def native_step():
            with native:
                step().backward()
        ways = {"plain": plain, "budget": budgeted, "native": native_step}
        times = {way: [] for way in ways}
        for f in ways.values():
            for _ in range(3):
                f()
        for _ in range(steps):
            for way, f in ways.items():
                start = time.perf_counter()
                f()
                times[way].append(time.perf_counter() - start)
        p = statistics.median(times["plain"]) * 1e3
        b = statistics.median(times["budget"]) * 1e3
        n = statistics.median(times["native"]) * 1e3
        print(f"  {name:7s} plain {p:6.2f} ms, budget {b:6.2f} ms ({b / p:.2f}x), native "
              f"{n:6.2f} ms ({n / p:.2f}x) (medians); saved tensors "
              f"{budget.stats['debug']['saved_tensors']} / "
              f"{native.stats['debug']['saved_tensors']}, drops {budget.stats['drops']} / "
              f"{native.stats['drops']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per way")
    parser.add_argument("--ops", type=int, default=300, help="forward ATen calls per step")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--offload", action="store_true",
                        help="the budgets allow offload as well as recompute")
    parser.add_argument("--ways", default=",".join(WAYS),
                        help=f"the chain's ways to run, of {','.join(WAYS)} (plain always)")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, of {','.join(TINY)}: those models instead")
    parser.add_argument("--ratio", type=float, default=None,
                        help="--models under a budget of this share of the step's saved bytes "
                             "(default: one nothing reaches)")
    parser.add_argument("--sizes", choices=("tiny", "default"), default="tiny",
                        help="--models at tiny sizes (where per-call costs show most) or at "
                             "the package's own")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.models is not None:
        names = [n for n in args.models.split(",") if n]
        unknown = [n for n in names if n not in TINY]
        if unknown or not names:
            parser.error(f"--models: unknown {unknown or args.models!r}; known: {','.join(TINY)}")
        if args.ratio is not None and not 0 < args.ratio <= 1:
            parser.error(f"--ratio must be in (0, 1], not {args.ratio}")
        return run_models(names, args.steps, TINY if args.sizes == "tiny" else DEFAULT,
                          args.ratio)
    asked = [w for w in args.ways.split(",") if w]
    unknown = [w for w in asked if w not in WAYS]
    if unknown or not asked:
        parser.error(f"--ways: unknown {unknown or args.ways!r}; known: {','.join(WAYS)}")
    torch.manual_seed(0)
    w = torch.randn(args.width, args.width, requires_grad=True)
    x0 = torch.randn(16, args.width)
    layers = max(1, args.ops // 3)

    def forward():
        x = x0
        for _ in range(layers):
            x = torch.tanh(x @ w) * 1.01
        return x.sum()

    def step():
        forward().backward()

    # --offload: the budgets may offload too (the README's snippet), so each
    # runs its plan trial over the first steps.
    kw = {"offload": True, "recompute": True} if args.offload else {}
    budget = remat.torch.budget(1 << 40, policy="dtr-eq", native=False, **kw)
    budget_gc = remat.torch.budget(1 << 40, policy="dtr-eq", pause_gc=False, native=False, **kw)
    native = remat.torch.budget(1 << 40, policy="dtr-eq", native=True, **kw)

    def mode_step():
        with PassThrough():
            loss = forward()
        loss.backward()

    def budget_step():
        with budget:
            step()

    def budget_gc_step():
        with budget_gc:
            step()

    def native_step():
        with native:
            step()

    every = {"plain": step, "mode": mode_step, "python": budget_step,
             "python-gc": budget_gc_step, "native": native_step}
    ways = {WAYS[key]: f for key, f in every.items() if key == "plain" or key in asked}
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
    for name in ways:
        print(f"  {name:20s} {median[name] / median['plain']:.2f}x plain (medians)")
    for name in ("budget", "budget, gc running", "native budget"):
        if name not in ways:
            continue
        for what, t in (("median", median), ("mean", mean)):
            extra = (t[name] - t["plain"]) / calls * 1e6
            floor = ""
            if "pass-through mode" in ways:
                floor = f", {(t[name] - t['pass-through mode']) / calls * 1e6:.1f} us over " \
                    "the pass-through mode"
            print(f"  {name}, {what}: {extra:.1f} us per forward call over plain{floor}")
    ran = budget if "budget" in ways else native
    if ran.stats is not None:
        print(f"  saved tensors per step: {ran.stats['debug']['saved_tensors']}, "
              f"drops: {ran.stats['drops']}")


if __name__ == "__main__":
    main()
