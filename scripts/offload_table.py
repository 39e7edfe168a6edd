#!/usr/bin/env python3
"""Drop or offload: the best policy with offload allowed against the best with drops only.

    python3 scripts/offload_table.py [--remat build/bin/remat] [--work DIR] [--no-guard-too]

For each step (the shipped op traces and four generated models), each accounting
(live, reserved), each budget ratio 0.3 to 0.7 and a host link of 25 and 55 GB/s
each way, it runs `remat sweep` over lru, dtr, dtr-eq, msps, window and hybrid:
with `--no-swap` (drops only), with offload allowed and `--no-offload-guard`
(each policy's mixed plan as it is), and with offload allowed (the default: the
offload guard keeps the cheaper of the mixed and the drop-only run). It prints a
Markdown table of the best of each, and counts the cells where the best with
offload is better than, equal to (within 0.5%) or worse than the best without.

Sweeps already in --work are reused. Standard library only.
"""

import argparse
import collections
import csv
import math
import os
import subprocess
import sys

POLICIES = "lru,dtr,dtr-eq,msps,window,hybrid"
GENERATED = ["gpt2:layers=4", "unet", "resnet", "vit"]
SHIPPED = ["densenet121_b8.jsonl", "lstm_l2_h512_s128_b32_v256.jsonl",
           "transformer_small.jsonl", "chain_100.jsonl"]


def sweep(remat, work, trace, accounting, extra, tag, policies=POLICIES):
    """The best overhead at each ratio, with its policy and plan (None and
    the error where the sweep failed)."""
    out = os.path.join(work, f"{os.path.basename(trace)}_{accounting}_{tag}")
    csv_path = os.path.join(out, "results.csv")
    if not os.path.exists(csv_path):
        run = subprocess.run([remat, "sweep", trace, "--ratios", "0.3:0.7:0.1",
                              "--policies", policies, "--accounting", accounting,
                              "--jobs", "1", "--out", out] + extra,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0 or not os.path.exists(csv_path):
            return None, run.stderr.strip().splitlines()[-1:]
    best = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            ratio = round(float(row["ratio"]), 2)
            overhead = float(row["overhead"]) if row["overhead"] else math.inf
            best.setdefault(ratio, (math.inf, "-", ""))
            if overhead < best[ratio][0]:
                best[ratio] = (overhead, row["policy"], row.get("plan", ""))
    return best, None


def verdict(x, reference):
    if math.isinf(x) and math.isinf(reference):
        return "equal"
    if x > reference * 1.005:
        return "worse"
    if x < reference * 0.995:
        return "better"
    return "equal"


def show(cell):
    if math.isinf(cell[0]):
        return "none finished"
    plan = f", {cell[2]}" if cell[2] else ""
    return f"{cell[0]:.3f} ({cell[1]}{plan})"


def steps(remat, work):
    """The shipped op traces, and the generated ones written into `work`
    (made once)."""
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(work, exist_ok=True)
    traces = [os.path.join(here, "..", "examples", "traces", t) for t in SHIPPED]
    for spec in GENERATED:
        path = os.path.join(work, spec.replace(":", "_").replace("=", "") + ".jsonl")
        if not os.path.exists(path):
            subprocess.run([remat, "gen", spec, "-o", path], check=True,
                           stdout=subprocess.DEVNULL)
        traces.append(path)
    return traces


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remat", default=os.path.join(here, "..", "build", "bin", "remat"))
    parser.add_argument("--work", default="offload_table")
    args = parser.parse_args()
    traces = steps(args.remat, args.work)

    counts = collections.Counter()
    print("| step | accounting | link GB/s | ratio | best, drops only (`--no-swap`) "
          "| best with offload, mixed plans | best with offload, offload guard |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for trace in traces:
        for accounting in ["live", "reserved"]:
            drops, why = sweep(args.remat, args.work, trace, accounting, ["--no-swap"], "noswap")
            if drops is None:
                print(f"| {os.path.basename(trace)} | {accounting} | | | refused: "
                      f"{' '.join(why)} | | |")
                continue
            for link in ["25", "55"]:
                mixed, _ = sweep(args.remat, args.work, trace, accounting,
                                 ["--link-gbps", link, "--no-offload-guard"], "mixed" + link)
                guarded, _ = sweep(args.remat, args.work, trace, accounting,
                                   ["--link-gbps", link], "guard" + link)
                for ratio in sorted(drops):
                    d, m, g = drops[ratio], mixed[ratio], guarded[ratio]
                    counts[("mixed", link, verdict(m[0], d[0]))] += 1
                    counts[("guard", link, verdict(g[0], d[0]))] += 1
                    print(f"| {os.path.basename(trace)} | {accounting} | {link} | {ratio} "
                          f"| {show(d)} | {show(m)} | {show(g)} |")
    print()
    for link in ["25", "55"]:
        for which, name in [("mixed", "mixed plans"), ("guard", "offload guard")]:
            print(f"- link {link} GB/s, {name}: " + ", ".join(
                f"{v} {counts[(which, link, v)]}" for v in ["better", "equal", "worse"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
