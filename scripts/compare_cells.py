#!/usr/bin/env python3
"""Compares two policy grids (scripts/policy_grid.sh's cells.csv): the cells that
finished in the reference and fail in the other, the reverse, and, where both
finished, how many cost less or more (past 0.5%). Exit 1 when a cell that
finished in the reference fails in the other, unless --known lists it (a
file of "trace policy ratio" lines; # starts a comment).

    python3 scripts/compare_cells.py REFERENCE.csv OTHER.csv [--from RATIO] [--known FILE]
"""
import argparse
import csv
import sys


def load(path):
    cells = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            overhead = float(row["overhead"]) if row["overhead"] else None
            cells[(row["trace"], row["policy"], row["ratio"])] = (row["status"], overhead)
    return cells


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference")
    parser.add_argument("other")
    parser.add_argument("--from", dest="lowest", type=float, default=0.0,
                        help="only ratios from this one up")
    parser.add_argument("--known", help="cells known to fail: not counted against OTHER")
    args = parser.parse_args()
    known = set()
    if args.known:
        with open(args.known) as f:
            for number, line in enumerate(f, 1):
                fields = line.split("#")[0].split()
                if not fields:
                    continue
                if len(fields) != 3:
                    parser.error(f"{args.known}:{number}: want 'trace policy ratio', "
                                 f"not {line.strip()!r}")
                known.add(tuple(fields))
    ref, other = load(args.reference), load(args.other)
    shared = sorted(k for k in set(ref) & set(other) if float(k[2]) >= args.lowest)
    failed, finished = [], []
    better = worse = same = 0
    for key in shared:
        (s_ref, o_ref), (s_other, o_other) = ref[key], other[key]
        if s_ref == "ok" and s_other != "ok":
            failed.append((key, o_ref, s_other))
        elif s_ref != "ok" and s_other == "ok":
            finished.append((key, s_ref, o_other))
        elif s_ref == "ok":
            if o_other < o_ref * 0.995:
                better += 1
            elif o_other > o_ref * 1.005:
                worse += 1
            else:
                same += 1
    print(f"{len(shared)} cells in both; both finished: {better} cost less, {worse} more, "
          f"{same} the same; {len(failed)} newly fail, {len(finished)} newly finish")
    for (trace, policy, ratio), overhead, status in failed:
        tag = " (known)" if (trace, policy, ratio) in known else ""
        print(f"  newly fails:   {trace} {policy} at {ratio}: {overhead:.3f} -> {status}{tag}")
    for (trace, policy, ratio), status, overhead in finished:
        print(f"  newly finishes: {trace} {policy} at {ratio}: {status} -> {overhead:.3f}")
    return 1 if any(key not in known for key, _, _ in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
