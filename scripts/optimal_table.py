#!/usr/bin/env python3
"""Each policy's gap to the lower bound (remat.optimal), beside the solver's plan, as a
Markdown table.

    PYTHONPATH=python .venv/bin/python scripts/optimal_table.py TRACE [TRACE ...]
        [--ratios 0.5,0.7,0.9] [--time-limit 60] [--remat build/bin/remat]
        [--offload --link-gbps 25]

For each trace and ratio: the bound (the program's optimum, or the solver's
proven bound at its time limit, marked ~), the solver's plan replayed (`remat
sim` of `remat.optimal --plan-out`'s trace: a real run, so the optimum lies
between it and the bound), then each policy's overhead under `remat sim
--no-swap --accounting live` and its distance above the bound.
With --offload: the bound of runs that may also offload, and each policy's
`remat sim --accounting live` run with offload allowed over that link (hybrid
among them). Needs scipy.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from remat import optimal

POLICIES = ["lru", "largest", "dtr", "dtr-eq", "dtr-local", "msps", "megengine", "window",
            "belady"]
OFFLOAD_POLICIES = ["lru", "dtr", "dtr-eq", "msps", "megengine", "window", "hybrid"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--ratios", default="0.5,0.7,0.9")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--remat", default=os.path.join(here, "..", "build", "bin", "remat"))
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--link-gbps", type=float, default=25.0)
    parser.add_argument("--link-latency-ns", type=int, default=2000)
    args = parser.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    if args.offload:
        policies = OFFLOAD_POLICIES
        mode = ["--link-gbps", str(args.link_gbps),
                "--link-latency-us", str(args.link_latency_ns / 1000)]
        link = {"link_gbps": args.link_gbps, "link_latency_ns": args.link_latency_ns}
    else:
        policies = POLICIES
        mode = ["--no-swap"]
        link = {}
    print("| trace | ratio | bound | plan | " + " | ".join(policies) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in policies) + " |")
    for path in args.traces:
        trace = optimal.read_trace(path)
        for ratio in ratios:
            cells = []
            budget = None
            for policy in policies:
                run = subprocess.run([args.remat, "sim", path, "--policy", policy,
                                      "--budget-ratio", str(ratio), "--accounting", "live",
                                      *mode, "--json"], capture_output=True, text=True)
                if run.returncode not in (0, 3):
                    cells.append("error")
                    continue
                sim = json.loads(run.stdout)
                budget = sim["budget_bytes"]
                cells.append(sim["overhead"] if sim["status"] == "ok" else sim["status"])
            if budget is None:
                continue
            bound = optimal.recompute_bound(trace, budget, args.time_limit, **link)
            if bound["status"] != "ok":
                shown = bound["status"]
                low = None
            else:
                low = (trace.compute_ns + bound["recompute_ns"]) / trace.compute_ns
                shown = f"{'' if bound['exact'] else '~'}{low:.3f}"
            plan = "-"
            if bound["status"] == "ok":
                plan = replay_plan(args, trace, budget, link, mode)
            cells.insert(0, plan)
            row = []
            for c in cells:
                if isinstance(c, float):
                    gap = f" ({round(100 * (c / low - 1), 1) + 0.0:+.1f}%)" if low else ""
                    row.append(f"{c:.3f}{gap}")
                else:
                    row.append(c)
            print(f"| {os.path.basename(path)} | {ratio} | {shown} | " + " | ".join(row) + " |",
                  flush=True)
    return 0


def replay_plan(args, trace, budget, link, mode):
    """The solver's plan at `budget`, replayed by remat sim: its overhead, or
    its status ("-" where the solver gave no plan)."""
    planned = optimal.recompute_bound(trace, budget, args.time_limit, want_plan=True,
                                      realizable=True, **link)
    if planned.get("solution") is None:
        return "-"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.jsonl")
        with open(path, "x", encoding="utf-8") as f:
            optimal.write_plan(trace, planned["solution"], f, offload=bool(link))
        run = subprocess.run([args.remat, "sim", path, "--policy", "dtr", "--budget", str(budget),
                              "--accounting", "live", "--thrash-limit", "100", *mode, "--json"],
                             capture_output=True, text=True)
    if run.returncode not in (0, 3):
        return "error"
    sim = json.loads(run.stdout)
    return sim["overhead"] if sim["status"] == "ok" else sim["status"]


if __name__ == "__main__":
    sys.exit(main())
