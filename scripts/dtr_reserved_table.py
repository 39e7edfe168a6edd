#!/usr/bin/env python3
"""remat under DTR's budgets enforced on reserved bytes, against simrd's best.

For each trace and ratio of a reference CSV written by scripts/dtr_fidelity.py
(simrd's figures: its heuristics under a budget of live bytes), runs
`remat sim --policy auto` at the same budget in bytes counted as the
allocator's reserved bytes (what a GPU must really hold, fragmentation
included) and prints a Markdown table: simrd's best live-only overhead,
remat's, and how many cells remat's is at or below simrd's (within
--tolerance).

    python3 scripts/dtr_reserved_table.py bench/results/dtr_reference_2026-12-06.csv \\
        [--remat build/bin/remat] [--jobs 2] [--sim-args '--alloc-conf expandable_segments:True']
"""
import argparse
import concurrent.futures
import csv
import json
import os
import subprocess
import sys


def run_remat(remat, trace, budget, extra):
    cmd = [remat, "sim", trace, "--budget", str(budget), "--accounting", "reserved",
           "--policy", "auto", "--json"] + extra
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    report = json.loads(done.stdout)
    if report.get("status") != "ok":
        return None, report.get("status", "?"), ""
    return report["overhead"], "ok", report.get("kept_policy") or report.get("policy", "")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="a CSV scripts/dtr_fidelity.py wrote")
    parser.add_argument("--remat", default=os.path.join(root, "build", "bin", "remat"))
    parser.add_argument("--traces", default=os.path.join(root, "examples", "traces"),
                        help="where the reference's traces are")
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--sim-args", default="",
                        help="more `remat sim` arguments, e.g. "
                             "'--alloc-conf expandable_segments:True'")
    args = parser.parse_args()

    cells = {}  # (trace, ratio) -> [budget, simrd's best or None]
    with open(args.reference) as f:
        for row in csv.DictReader(f):
            key = (row["trace"], float(row["ratio"]))
            cell = cells.setdefault(key, [int(row["budget_bytes"]), None])
            if row["dtr_status"] == "ok" and row["dtr_overhead"]:
                best = float(row["dtr_overhead"])
                cell[1] = best if cell[1] is None else min(cell[1], best)
    keys = sorted(cells)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {k: pool.submit(run_remat, args.remat, os.path.join(args.traces, k[0]),
                                  cells[k][0], args.sim_args.split()) for k in keys}
        results = {k: f.result() for k, f in futures.items()}

    print("| trace | ratio | budget (MiB) | simrd best, live | remat auto, reserved | kept |")
    print("|---|---|---|---|---|---|")
    compared = met = 0
    for k in keys:
        budget, simrd = cells[k]
        overhead, status, kept = results[k]
        mine = f"{overhead:.4f}" if overhead is not None else status
        theirs = f"{simrd:.4f}" if simrd is not None else "-"
        if simrd is not None:
            compared += 1
            if overhead is not None and overhead <= simrd * (1 + args.tolerance):
                met += 1
        print(f"| {k[0].removesuffix('.jsonl')} | {k[1]:g} | {budget / 2**20:.1f} | {theirs} | "
              f"{mine} | {kept} |")
    print(f"\nremat at or below simrd's best (within {args.tolerance:.1%}) in {met} of {compared} "
          "cells where simrd finishes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
