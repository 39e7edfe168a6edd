#!/usr/bin/env python3
"""Offloading budgets on the two recorders: the native step (C++, the
default on a machine without a GPU) against the Python recorder, at the
same budget, on the seeds' models (bench/torch_seeds.py's builders).

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so OMP_NUM_THREADS=1 \\
        .venv/bin/python bench/torch_offload_recorders.py [--models resnet50,vit] \\
        [--size cpu] [--ratio 0.5] [--repeat 5]

Rows: plain; offload only (recompute=False) and offload with recompute (the
plan trial, then the plan it keeps), each native and Python, under a budget of
--ratio of the plain step's saved bytes. Each budget first runs its trial's
steps and one more (not timed); then the rows take turns, one timed step each
per round, so that a machine's drift shifts them alike. Prints the median step
time (min-max), the ratio to plain, whether the gradients equal the plain
step's bit for bit, and the step's offloads and drops.
"""
import argparse
import statistics
import sys
import time

import torch

import remat.torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch_seeds  # noqa: E402


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit")
    parser.add_argument("--size", choices=list(torch_seeds.SIZES), default="cpu")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if not 0 < args.ratio <= 1 or args.repeat < 1:
        parser.error("--ratio must be in (0, 1] and --repeat at least 1")
    torch.set_num_threads(1)
    print(f"one thread, torch {torch.__version__}, budget {args.ratio} of the plain step's "
          f"saved bytes, {args.repeat} timed steps per row")
    for name in args.models.split(","):
        build = getattr(torch_seeds, name)
        sizes = torch_seeds.SIZES[args.size][name]
        model, step, _ = build(0, "cpu", "plain", **sizes)

        def run(budget=None):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            start = time.perf_counter()
            if budget is None:
                step().backward()
            else:
                with budget:
                    step().backward()
            return time.perf_counter() - start

        run()
        plain_grads = _grads(model)
        full = remat.torch.budget(1 << 40, policy="dtr-eq")
        run(full)
        saved = full.stats["peak_saved_bytes"]
        full.close()
        budget = int(saved * args.ratio)
        rows = {"plain": None}
        for label, kw in (("offload", {"recompute": False}), ("offload+recompute", {})):
            for recorder, native in (("native", True), ("python", False)):
                rows[f"{label}, {recorder}"] = remat.torch.budget(
                    budget, policy="dtr-eq", offload=True, native=native, **kw)
        equal = {}
        for row, b in rows.items():
            if b is None:
                continue
            for _ in range(2 * remat.torch.budget.TRIAL_STEPS + 1):
                run(b)
            equal[row] = all(torch.equal(a, g) for a, g in zip(_grads(model), plain_grads))
        times = {row: [] for row in rows}
        for _ in range(args.repeat):
            for row, b in rows.items():
                times[row].append(run(b))
                if b is not None:
                    same = all(torch.equal(a, g) for a, g in zip(_grads(model), plain_grads))
                    equal[row] = equal[row] and same
        base = statistics.median(times["plain"])
        print(f"\n{name} {sizes}, saved bytes {saved}, budget {budget}\n")
        print("| row | step ms | min-max | x plain | grads equal | plan | offloads | drops |")
        print("|---|---|---|---|---|---|---|---|")
        for row, b in rows.items():
            t = times[row]
            med = statistics.median(t)
            st = b.stats if b is not None else None
            print(f"| {row} | {med * 1e3:.1f} | {min(t) * 1e3:.1f}-{max(t) * 1e3:.1f} | "
                  f"{med / base:.2f} | {'-' if b is None else 'yes' if equal[row] else 'NO'} | "
                  f"{st['plan'] if st else '-'} | {st['offloads'] if st else '-'} | "
                  f"{st['drops'] if st else '-'} |")
        for b in rows.values():
            if b is not None:
                b.close()


if __name__ == "__main__":
    main()
