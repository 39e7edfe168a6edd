#!/usr/bin/env python3
"""Each policy's gap to the drop-only lower bound (remat.optimal), as a Markdown table.

    PYTHONPATH=python .venv/bin/python scripts/optimal_table.py TRACE [TRACE ...]
        [--ratios 0.5,0.7,0.9] [--time-limit 60] [--remat build/bin/remat]

For each trace and ratio: the bound (the program's optimum, or the solver's
proven bound at its time limit, marked ~), then each policy's overhead under
`remat sim --no-swap --accounting live` and its distance above the bound.
Needs scipy.
"""

import argparse
import json
import os
import subprocess
import sys

from remat import optimal

POLICIES = ["lru", "largest", "dtr", "dtr-eq", "dtr-local", "msps", "megengine", "window",
            "belady"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--ratios", default="0.5,0.7,0.9")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--remat", default=os.path.join(here, "..", "build", "bin", "remat"))
    args = parser.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    print("| trace | ratio | bound | " + " | ".join(POLICIES) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in POLICIES) + " |")
    for path in args.traces:
        trace = optimal.read_trace(path)
        for ratio in ratios:
            cells = []
            budget = None
            for policy in POLICIES:
                run = subprocess.run([args.remat, "sim", path, "--policy", policy,
                                      "--budget-ratio", str(ratio), "--accounting", "live",
                                      "--no-swap", "--json"], capture_output=True, text=True)
                if run.returncode not in (0, 3):
                    cells.append("error")
                    continue
                sim = json.loads(run.stdout)
                budget = sim["budget_bytes"]
                cells.append(sim["overhead"] if sim["status"] == "ok" else sim["status"])
            if budget is None:
                continue
            bound = optimal.recompute_bound(trace, budget, args.time_limit)
            if bound["status"] != "ok":
                shown = bound["status"]
                low = None
            else:
                low = (trace.compute_ns + bound["recompute_ns"]) / trace.compute_ns
                shown = f"{'' if bound['exact'] else '~'}{low:.3f}"
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


if __name__ == "__main__":
    sys.exit(main())
