#!/usr/bin/env python3
"""hybrid against the best policy with drops only, before and after its trials.

    python3 scripts/hybrid_table.py [--remat build/bin/remat] [--work DIR]

For the steps of offload_table.py, both accountings, budget ratios 0.3 to 0.7
and a host link of 25 and 55 GB/s each way, it sweeps:
- every policy with `--no-swap` (hybrid ranking by its own score), the best
  of which is the reference;
- `hybrid:rank=own` with offload allowed (under the offload guard): hybrid
  as a runtime that sees the step once runs it, and as it ran before it could
  try other rankings;
- `hybrid` (rank=auto): the simulator replays it over every policy's ranking,
  mixed and drop-only, and keeps the cheapest.
It prints a Markdown table and counts the cells where each hybrid is better
than, equal to (within 0.5%) or worse than the reference.

Sweeps already in --work are reused. Standard library only.
"""

import argparse
import collections
import csv
import math
import os
import sys

from offload_table import show, steps, sweep, verdict

DROP_POLICIES = ("lru,largest,dtr,dtr-eq,dtr-local,msps,megengine,window,belady,"
                 "hybrid:rank=own")


def kept(work, trace, accounting, tag):
    """What hybrid's trials kept at each ratio, from the sweep's CSV."""
    path = os.path.join(work, f"{os.path.basename(trace)}_{accounting}_{tag}", "results.csv")
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            spec = row.get("kept_policy", "")
            if spec.startswith("hybrid:"):
                spec = "over " + spec.split("rank=")[1].split(",")[0]
            out[round(float(row["ratio"]), 2)] = spec
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remat", default=os.path.join(here, "..", "build", "bin", "remat"))
    parser.add_argument("--work", default="hybrid_table")
    args = parser.parse_args()
    traces = steps(args.remat, args.work)

    counts = collections.Counter()
    rankings = collections.Counter()
    print("| step | accounting | link GB/s | ratio | best, drops only (`--no-swap`) "
          "| hybrid:rank=own | hybrid (trials) | run kept |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for trace in traces:
        for accounting in ["live", "reserved"]:
            drops, why = sweep(args.remat, args.work, trace, accounting, ["--no-swap"],
                               "noswap_all", DROP_POLICIES)
            if drops is None:
                print(f"| {os.path.basename(trace)} | {accounting} | | | refused: "
                      f"{' '.join(why)} | | | |")
                continue
            for link in ["25", "55"]:
                own, _ = sweep(args.remat, args.work, trace, accounting,
                               ["--link-gbps", link], "own" + link, "hybrid:rank=own")
                auto, _ = sweep(args.remat, args.work, trace, accounting,
                                ["--link-gbps", link], "auto" + link, "hybrid")
                ranks = kept(args.work, trace, accounting, "auto" + link)
                for ratio in sorted(drops):
                    d, o, a = drops[ratio], own[ratio], auto[ratio]
                    counts[("own", link, verdict(o[0], d[0]))] += 1
                    counts[("auto", link, verdict(a[0], d[0]))] += 1
                    if not math.isinf(a[0]):
                        rankings[ranks.get(ratio, "")] += 1
                    print(f"| {os.path.basename(trace)} | {accounting} | {link} | {ratio} "
                          f"| {show(d)} | {show(o)} | {show(a)} | {ranks.get(ratio, '')} |")
    print()
    for link in ["25", "55"]:
        for which, name in [("own", "hybrid:rank=own"), ("auto", "hybrid (trials)")]:
            print(f"- link {link} GB/s, {name}: " + ", ".join(
                f"{v} {counts[(which, link, v)]}" for v in ["better", "equal", "worse"]))
    print("- runs kept (`over X`: hybrid over X's ranking; `X`: X's own plan): "
          + ", ".join(f"{k} {v}" for k, v in rankings.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
