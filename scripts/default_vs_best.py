#!/usr/bin/env python3
"""How close one policy (by default `auto`) comes to the best policy, cell by
cell, on two sets of cells:

- live: the cells of a DTR reference CSV (scripts/dtr_fidelity.py), each
  trace at each budget in bytes, live accounting, drops only; the best is the
  least of the CSV's six remat heuristics and the policy's own run;
- reserved: a policy grid's cells.csv (scripts/policy_grid.sh) beside one
  made with POLICIES=<policy>; the best is the least of every policy's.

A cell counts where something finishes. Prints each cell where the policy is
not within --within of the best, and the counts.

  scripts/default_vs_best.py --reference bench/results/dtr_reference_2026-12-06.csv \\
      [--grid GRID/cells.csv --grid-policy AUTOGRID/cells.csv] [--policy auto] \\
      [--future known|learned|none] [--binary build/bin/remat]
"""
import argparse
import collections
import concurrent.futures
import csv
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "examples", "traces")


def live_cells(args):
    cells = collections.defaultdict(lambda: {"remat": {}, "dtr": {}, "budget": None})
    with open(args.reference) as f:
        for r in csv.DictReader(f):
            c = cells[(r["trace"], r["ratio"])]
            c["budget"] = r["budget_bytes"]
            if r["remat_status"] == "ok":
                c["remat"][r["heuristic"]] = float(r["remat_overhead"])
            if r["dtr_status"] == "ok":
                c["dtr"][r["simrd_heuristic"]] = float(r["dtr_overhead"])

    def run(key):
        cmd = [args.binary, "sim", os.path.join(TRACES, key[0]), "--budget", cells[key]["budget"],
               "--accounting", "live", "--no-swap", "--policy", args.policy,
               "--thrash-limit", str(args.limit - 1), "--future", args.future, "--json"]
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout)
        ok = out["status"] == "ok" and out["overhead"] <= args.limit
        return key, out["overhead"] if ok else None, out.get("kept_policy", "")

    n = within = at_dtr = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for key, mine, kept in sorted(pool.map(run, list(cells))):
            c = cells[key]
            found = list(c["remat"].values()) + ([mine] if mine is not None else [])
            if not found:
                continue
            n += 1
            best = min(found)
            dtr_best = min(c["dtr"].values()) if c["dtr"] else None
            close = mine is not None and mine <= best * (1 + args.within)
            beats = dtr_best is None or (mine is not None and mine <= dtr_best * (1 + 1e-6))
            within += close
            at_dtr += beats
            if not (close and beats):
                print(f"live {key[0]} {key[1]}: {args.policy} {mine} (kept {kept}), best {best}, "
                      f"DTR's best {dtr_best}")
    print(f"live: {args.policy} (--future {args.future}) within {args.within:.0%} of the best "
          f"in {within} of {n} cells; at or below DTR's best in {at_dtr} of {n}")


def reserved_cells(args):
    cells = collections.defaultdict(dict)
    for path in (args.grid, args.grid_policy):
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["status"] == "ok":
                    cells[(r["trace"], r["ratio"])][r["policy"]] = float(r["overhead"])
    n = within = 0
    others = collections.Counter()
    for key, runs in sorted(cells.items()):
        n += 1
        best = min(runs.values())
        mine = runs.get(args.policy)
        for p, o in runs.items():
            others[p] += o <= best * (1 + args.within)
        if mine is not None and mine <= best * (1 + args.within):
            within += 1
        else:
            print(f"reserved {key[0]} {key[1]}: {args.policy} {mine}, best {best}")
    print(f"reserved: {args.policy} within {args.within:.0%} of the best in {within} of {n} "
          f"cells; each policy: " + ", ".join(f"{p} {k}" for p, k in others.most_common()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", help="a DTR reference CSV (live cells)")
    parser.add_argument("--grid", help="a policy grid's cells.csv (reserved cells)")
    parser.add_argument("--grid-policy", help="the same grid run with POLICIES=<policy>")
    parser.add_argument("--policy", default="auto")
    parser.add_argument("--future", default="known", choices=["known", "learned", "none"])
    parser.add_argument("--within", type=float, default=0.02)
    parser.add_argument("--limit", type=float, default=2.0,
                        help="overhead past which a live run counts as not finished, as dtr_fidelity.py (2.0)")
    parser.add_argument("--binary", default=os.path.join(HERE, "..", "build", "bin", "remat"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if not args.reference and not args.grid:
        parser.error("give --reference, --grid (with --grid-policy), or both")
    if bool(args.grid) != bool(args.grid_policy):
        parser.error("--grid and --grid-policy go together")
    if args.reference:
        live_cells(args)
    if args.grid:
        reserved_cells(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
