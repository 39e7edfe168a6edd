"""Whether a long training loop under remat.torch.budget stays as quick, and
as small, as its first steps: the step time and the process's peak resident
memory every so many steps, with offloads alone and with the hybrid
policy's mixed plan (offload guard off, so that it goes on offloading): the
runtime's pinned host pool turns over every step.

A budget is kept across a loop's steps (its runtime learns each step's next
uses for the next): anything it keeps per step and never lets go shows here
as steps that grow slower or a process that grows. The pinned host pool did:
every allocation scanned every buffer ever handed back, none of which came
back on the budget's bookkeeping device (nothing synchronizes it), and the
MLP's offloading step went from 6.4 to 20.0 ms over 2000 steps.

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_long_loop.py [--steps 2000] [--every 500]
"""
import argparse
import resource
import statistics
import time

import torch

import remat.torch
from remat.torch.testing import models

MODES = {"offload": dict(offload=True, recompute=False, policy="lru"),
         "hybrid": dict(offload=True, recompute=True, policy="hybrid", offload_guard=False)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--ratio", type=float, default=0.3)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, step = models.mlp(0)
    probe = remat.torch.budget(1 << 40)
    with probe:
        step().backward()
    saved = probe.stats["peak_saved_bytes"]
    probe.close()
    print(f"MLP step, budget {args.ratio:g} of its saved bytes, one thread, "
          f"torch {torch.__version__}")
    print("| mode | steps | median step ms (last 50) | peak RSS MiB | offloads | drops |")
    print("|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        b = remat.torch.budget(int(saved * args.ratio), **MODES[mode])
        times = []
        for i in range(1, args.steps + 1):
            start = time.perf_counter()
            with b:
                step().backward()
            times.append(time.perf_counter() - start)
            if i % args.every == 0 or i == 1:
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
                print(f"| {mode} | {i} | {statistics.median(times[-50:]) * 1e3:.2f} | {rss} | "
                      f"{b.stats['offloads']} | {b.stats['drops']} |", flush=True)
        b.close()


if __name__ == "__main__":
    main()
