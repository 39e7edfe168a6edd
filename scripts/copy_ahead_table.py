#!/usr/bin/env python3
"""Copies made ahead against copies made at the eviction, on every step.

    python3 scripts/copy_ahead_table.py [--remat build/bin/remat] [--work DIR]

For the steps of scripts/offload_table.py (the shipped op traces and four
generated models), both accountings, budget ratios 0.3 to 0.7 and a host link
of 25 and 55 GB/s each way, it runs `remat sweep` over the same six policies
with offload allowed, by default (copies ahead) and with `--no-copy-ahead`,
each with the offload guard (the default) and without it (each policy's mixed
plan as it is). It prints a Markdown table of the cells where the best policy
differs, and counts, per link, the cells where copying ahead is better than,
equal to (within 0.5%) or worse than copying at the eviction: for the best
policy (guarded) and for each policy's mixed plan. Sweeps already in --work
are reused. Standard library only.
"""

import argparse
import collections
import csv
import math
import os
import sys

import offload_table as ot


def per_policy(work, trace, accounting, tag):
    """{(policy, ratio): overhead} of a sweep sweep() made."""
    path = os.path.join(work, f"{os.path.basename(trace)}_{accounting}_{tag}", "results.csv")
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            overhead = float(row["overhead"]) if row["overhead"] else math.inf
            out[(row["policy"], round(float(row["ratio"]), 2))] = overhead
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remat", default=os.path.join(here, "..", "build", "bin", "remat"))
    parser.add_argument("--work", default="copy_ahead_table")
    args = parser.parse_args()
    traces = ot.steps(args.remat, args.work)

    counts = collections.Counter()
    print("| step | accounting | link GB/s | ratio | best, drops only | best, copies at the "
          "eviction | best, copies ahead |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for trace in traces:
        for accounting in ["live", "reserved"]:
            drops, why = ot.sweep(args.remat, args.work, trace, accounting, ["--no-swap"],
                                  "noswap")
            if drops is None:
                print(f"| {os.path.basename(trace)} | {accounting} | | | refused: "
                      f"{' '.join(why)} | | |")
                continue
            for link in ["25", "55"]:
                runs = {}
                for tag, extra in [("evict", ["--no-copy-ahead"]), ("ahead", []),
                                   ("evictmixed", ["--no-copy-ahead", "--no-offload-guard"]),
                                   ("aheadmixed", ["--no-offload-guard"])]:
                    best, why = ot.sweep(args.remat, args.work, trace, accounting,
                                         ["--link-gbps", link] + extra, tag + link)
                    if best is None:
                        sys.exit(f"{trace} {accounting} {tag}{link}: {' '.join(why)}")
                    runs[tag] = best
                for ratio in sorted(drops):
                    e, a = runs["evict"][ratio], runs["ahead"][ratio]
                    v = ot.verdict(a[0], e[0])
                    counts[("best", link, v)] += 1
                    if v != "equal":
                        print(f"| {os.path.basename(trace)} | {accounting} | {link} | {ratio} "
                              f"| {ot.show(drops[ratio])} | {ot.show(e)} | {ot.show(a)} |")
                evict = per_policy(args.work, trace, accounting, "evictmixed" + link)
                ahead = per_policy(args.work, trace, accounting, "aheadmixed" + link)
                for key, before in evict.items():
                    counts[("policy", link, ot.verdict(ahead[key], before))] += 1
    print()
    for link in ["25", "55"]:
        for which, name in [("best", "best policy, offload guard"),
                            ("policy", "each policy's mixed plan")]:
            print(f"- link {link} GB/s, {name}: copies ahead " + ", ".join(
                f"{v} {counts[(which, link, v)]}" for v in ["better", "equal", "worse"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
