#!/usr/bin/env python3
"""Replays op traces through the DTR simulator (`simrd`, from
github.com/uwsampl/dtr-prototype, imported from the folder --simrd names)
and through `remat sim`, heuristic by heuristic, at the same budgets, and
writes the overheads side by side: a CSV and a Markdown agreement table.

    python3 scripts/dtr_fidelity.py --simrd DIR TRACE.jsonl... \\
        [--ratios 0.3,0.4,...] [--heuristics lru,largest,...] \\
        [--csv OUT.csv] [--md OUT.md] [--jobs N] [--timeout S]
    python3 scripts/dtr_fidelity.py --from-csv OUT.csv [--md OUT.md]
    python3 scripts/dtr_fidelity.py --from-csv OUT.csv --rerun-remat \\
        --csv NEW.csv [--md NEW.md]

--rerun-remat runs remat's side of every cell of the CSV again, at the
budget in bytes the CSV holds (simrd's side is kept as it was: simrd is not
needed), so that a change to remat's runtime is measured against the same
reference. The table ends with the best heuristic on each side for each
trace and ratio (the goal: remat's best at or below simrd's).

The pairs: remat `lru`, `largest`, `dtr`, `dtr-eq`, `dtr-local`, `msps`
against simrd's LRU, LargestStorage, DTR, DTREqClass, DTRLocal and MSPS.

Each trace is converted with scripts/dtr_log.py and parsed by simrd's own
parser. As simrd's experiments do, its baseline is a run of `RuntimeV1`
with no budget: the peak of its memory use (resident storages, constants
included) and its compute. The budget at ratio R is int(R x that peak)
bytes; simrd runs with `RuntimeV2EagerOptimized` (the runtime of the
paper's figures) and remat with `--budget` set to those very bytes,
`--accounting live --no-swap`. The overhead on both sides is the compute
run, recomputes included, over the baseline compute (simrd's clock starts
at 1; the 1 is taken off). A run whose recompute passes (--limit - 1) x
the baseline compute is `thrash` on both sides (simrd's `remat_limit`,
as its experiments set it; remat is given a far limit and its finished
overhead is judged the same way); `oom` where nothing is left to evict.
A pair agrees when both finish within --tolerance (default 0.5%) of each
other, or both end with the same status; a simrd run past --timeout is
`timeout` and not compared (agree `n/a`).
"""
import argparse
import csv
import json
import math
import multiprocessing
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtr_log  # noqa: E402

PAIRS = [
    ("lru", "LRU"),
    ("largest", "LargestStorage"),
    ("dtr", "DTR"),
    ("dtr-eq", "DTREqClass"),
    ("dtr-local", "DTRLocal"),
    ("msps", "MSPS"),
]
DEFAULT_RATIOS = "0.3,0.4,0.5,0.6,0.7,0.8,0.9"
FIELDS = ["trace", "ratio", "heuristic", "simrd_heuristic", "budget_bytes",
          "dtr_status", "dtr_overhead", "remat_status", "remat_overhead",
          "agree"]


def load_simrd(path):
    """Imports simrd from the folder holding its `simrd` package."""
    sys.path.insert(0, os.path.abspath(path))
    from simrd import heuristic, runtime
    from simrd.parse import parse_file
    return heuristic, runtime, parse_file


def with_deep_stack(fn):
    """Runs fn in a thread with a large stack and recursion limit: simrd
    rematerializes a chain of evicted tensors by recursion."""
    sys.setrecursionlimit(1_000_000)
    threading.stack_size(1 << 29)
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: B902 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def simrd_baseline(simrd, graph):
    heuristic, runtime, _ = simrd
    rt = runtime.RuntimeV1(math.inf, heuristic.Heuristic(), stats=False,
                           trace=False)
    with_deep_stack(lambda: graph.get_closure()(rt))
    summary = rt.telemetry.summary
    assert summary["remat_compute"] == 0
    return summary["max_memory"], summary["model_compute"]


def simrd_cell(simrd, graph, name, budget, compute, limit):
    """One simrd run: (status, overhead or None)."""
    heuristic, runtime, _ = simrd
    h = heuristic.HEURISTICS[name]()
    rt = runtime.RuntimeV2EagerOptimized(
        budget, h, stats=False, trace=False,
        remat_limit=compute * (limit - 1))
    try:
        with_deep_stack(lambda: graph.get_closure()(rt))
    except MemoryError:
        return "oom", None
    except runtime.RematExceededError:
        return "thrash", None
    return "ok", (rt.clock - 1) / compute


def remat_cell(binary, trace, policy, budget, limit, extra=(), stop=1000):
    """One `remat sim` run: (status, overhead or None); `stop`: its
    --thrash-limit."""
    cmd = [binary, "sim", trace, "--budget", str(budget),
           "--accounting", "live", "--no-swap", "--policy", policy,
           "--thrash-limit", str(stop), "--json", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        return "error", None
    if out["status"] != "ok":
        return out["status"], None
    if out["overhead"] > limit:
        return "thrash", None
    return "ok", out["overhead"]


def agree(dtr, remat, tolerance):
    (ds, do), (rs, ro) = dtr, remat
    if ds != "ok" or rs != "ok":
        return ds == rs
    return abs(ro - do) <= tolerance * do


def _child(conn, fn):
    try:
        conn.send(fn())
    except BaseException as e:  # noqa: B902 - reported as the cell's status
        conn.send(("error: %s" % type(e).__name__, None))
    conn.close()


def run_parallel(tasks, jobs, timeout):
    """Runs (key, fn) tasks in forked processes, `jobs` at a time; yields
    (key, result) as each ends; a task past `timeout` seconds is
    ('timeout', None)."""
    ctx = multiprocessing.get_context("fork")
    pending = list(tasks)
    running = []
    while pending or running:
        while pending and len(running) < jobs:
            key, fn = pending.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(child, fn))
            proc.start()
            child.close()
            running.append((key, proc, parent, time.time()))
        time.sleep(0.05)
        still = []
        for key, proc, conn, start in running:
            if conn.poll():
                result = conn.recv()
                proc.join()
                yield key, result
            elif not proc.is_alive():
                yield key, ("error: exit %s" % proc.exitcode, None)
            elif timeout and time.time() - start > timeout:
                proc.terminate()
                proc.join()
                yield key, ("timeout", None)
            else:
                still.append((key, proc, conn, start))
        running = still


def fmt(status, overhead):
    return "%.4f" % overhead if status == "ok" else status


def best_table(rows, ratios, also=None):
    """Per trace and ratio, the best finished overhead of each side (at or
    under the limit), and whether remat's best is at or below simrd's.
    also: {(trace, ratio): [overhead or None]} of more remat policies."""
    also = also or {}
    lines = ["", "Best heuristic per trace and ratio: simrd's best / remat's "
             "best%s; `ok` where remat's is at or below simrd's (within "
             "0.0005%%, the CSV's rounding), or simrd finishes nothing."
             % (" (its other policies too, their next uses learned)" if also
                else ""), "",
             "| trace | " + " | ".join(ratios) + " |",
             "| --- |" + " --- |" * len(ratios)]
    traces = []
    for r in rows:
        if r["trace"] not in traces:
            traces.append(r["trace"])
    met = total = 0
    for trace in traces:
        cells = []
        for ratio in ratios:
            here = [r for r in rows if r["trace"] == trace
                    and r["ratio"] == ratio]
            if not here:
                cells.append("")
                continue
            d = [float(r["dtr_overhead"]) for r in here if r["dtr_overhead"]]
            m = [float(r["remat_overhead"]) for r in here
                 if r["remat_overhead"]]
            m += [o for o in also.get((trace, ratio), []) if o is not None]
            bd = min(d) if d else None
            bm = min(m) if m else None
            ok = bd is None or (bm is not None and bm <= bd * 1.000005)
            total += 1
            met += ok
            cells.append("%s / %s %s" % ("-" if bd is None else "%.4f" % bd,
                                         "-" if bm is None else "%.4f" % bm,
                                         "ok" if ok else "**x**"))
        lines.append("| %s | %s |" % (trace, " | ".join(cells)))
    lines.insert(3, "remat's best at or below simrd's best in %d of %d cells."
                 % (met, total))
    lines.insert(4, "")
    return lines


def markdown(rows, ratios, tolerance, also=None):
    lines = []
    heuristics = [p for p, _ in PAIRS if any(r["heuristic"] == p
                                             for r in rows)]
    lines.append("| heuristic | cells compared | agree (within %.1f%% or "
                 "same status) | simrd timed out |" % (tolerance * 100))
    lines.append("| --- | ---: | ---: | ---: |")
    for h in heuristics + [None]:
        cells = [r for r in rows if h is None or r["heuristic"] == h]
        good = sum(1 for r in cells if r["agree"] == "yes")
        late = sum(1 for r in cells if r["agree"] == "n/a")
        lines.append("| %s | %d | %d | %d |" % (h or "all", len(cells) - late,
                                                good, late))
    traces = []
    for r in rows:
        if r["trace"] not in traces:
            traces.append(r["trace"])
    for trace in traces:
        lines.append("")
        lines.append("`%s`: simrd / remat overhead; = where they agree"
                     % trace)
        lines.append("")
        lines.append("| heuristic | " + " | ".join(ratios) + " |")
        lines.append("| --- |" + " --- |" * len(ratios))
        for h in heuristics:
            cells = []
            for ratio in ratios:
                row = [r for r in rows if r["trace"] == trace
                       and r["heuristic"] == h and r["ratio"] == ratio]
                if not row:
                    cells.append("")
                    continue
                r = row[0]
                d = ("%.4f" % float(r["dtr_overhead"])
                     if r["dtr_overhead"] else r["dtr_status"])
                m = ("%.4f" % float(r["remat_overhead"])
                     if r["remat_overhead"] else r["remat_status"])
                mark = {"yes": "=", "n/a": "?"}.get(r["agree"], "**x**")
                cells.append("%s / %s %s" % (d, m, mark))
            lines.append("| %s | %s |" % (h, " | ".join(cells)))
    lines.extend(best_table(rows, ratios, also))
    return "\n".join(lines) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", help="remat op traces")
    parser.add_argument("--simrd",
                        help="folder holding simrd's `simrd` package")
    parser.add_argument("--from-csv", metavar="CSV",
                        help="run nothing: write the table of a CSV this "
                             "script wrote (a run cut short included)")
    parser.add_argument("--rerun-remat", action="store_true",
                        help="with --from-csv: run remat's side of each cell "
                             "again (simrd's kept), and write --csv anew")
    parser.add_argument("--also", default="",
                        help="with --rerun-remat: more remat policies (say "
                             "hybrid,belady) for the best-against-best table, "
                             "run with their next uses learned from a first "
                             "step (--future learned), as a training loop "
                             "would, and stopped at --limit; not in the CSV")
    parser.add_argument("--remat", default=os.path.join(root, "build", "bin",
                                                        "remat"),
                        help="the remat binary (default build/bin/remat)")
    parser.add_argument("--ratios", default=DEFAULT_RATIOS)
    parser.add_argument("--heuristics", default=",".join(p for p, _ in PAIRS),
                        help="remat policy names, of: "
                             + ", ".join(p for p, _ in PAIRS))
    parser.add_argument("--limit", type=float, default=2.0,
                        help="overhead past which a run is thrash (2.0)")
    parser.add_argument("--tolerance", type=float, default=0.005)
    parser.add_argument("--csv", help="write the cells here")
    parser.add_argument("--md", help="write the agreement table here")
    parser.add_argument("--jobs", type=int, default=1,
                        help="simrd runs at once")
    parser.add_argument("--timeout", type=float, default=0,
                        help="seconds per simrd run (0: none)")
    args = parser.parse_args()
    for path in (args.csv, args.md):
        if path and os.path.exists(path):
            parser.error(f"{path} exists; nothing is overwritten")
    if args.rerun_remat and not args.from_csv:
        parser.error("--rerun-remat reruns the cells of --from-csv: give it")
    if args.from_csv:
        with open(args.from_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        ratios = sorted({r["ratio"] for r in rows}, key=float)
        if args.rerun_remat:
            traces = os.path.join(root, "examples", "traces")
            for r in rows:
                remat = remat_cell(args.remat, os.path.join(traces, r["trace"]),
                                   r["heuristic"], int(r["budget_bytes"]),
                                   args.limit)
                r["remat_status"] = remat[0]
                r["remat_overhead"] = ("%.6f" % remat[1]
                                       if remat[0] == "ok" else "")
                if r["agree"] != "n/a":
                    dtr = (r["dtr_status"], float(r["dtr_overhead"])
                           if r["dtr_overhead"] else None)
                    r["agree"] = "yes" if agree(dtr, remat, args.tolerance) \
                        else "no"
            if args.csv:
                with open(args.csv, "w", newline="") as f:
                    w = csv.DictWriter(f, FIELDS)
                    w.writeheader()
                    w.writerows(rows)
        elif args.csv or args.also:
            parser.error("--csv and --also with --from-csv need --rerun-remat")
        also = {}
        if args.also:
            traces = os.path.join(root, "examples", "traces")
            cells = {(r["trace"], r["ratio"]): int(r["budget_bytes"]) for r in rows}
            for (trace, ratio), budget in cells.items():
                also[(trace, ratio)] = [
                    remat_cell(args.remat, os.path.join(traces, trace), p, budget,
                               args.limit, ("--future", "learned"), args.limit)[1]
                    for p in args.also.split(",")]
        write_table(markdown(rows, ratios, args.tolerance, also), args.md)
        return
    if not args.simrd or not args.traces:
        parser.error("give --simrd and at least one trace (or --from-csv)")

    simrd = load_simrd(args.simrd)
    pairs = dict(PAIRS)
    policies = args.heuristics.split(",")
    for p in policies:
        if p not in pairs:
            parser.error("unknown heuristic %r" % p)
    ratios = args.ratios.split(",")
    rows = []
    out = open(args.csv, "x", newline="") if args.csv else None
    writer = csv.DictWriter(out, FIELDS) if out else None
    if writer:
        writer.writeheader()
    for trace in args.traces:
        with open(trace) as f:
            log = list(dtr_log.convert(f))
        graph = simrd[2](log)
        peak, compute = simrd_baseline(simrd, graph)
        print("%s: simrd baseline peak %d bytes, compute %d ns"
              % (trace, peak, compute), file=sys.stderr, flush=True)
        budgets = {r: int(peak * float(r)) for r in ratios}
        tasks = []
        for p in policies:
            for r in ratios:
                tasks.append(((p, r), (lambda p=p, r=r: simrd_cell(
                    simrd, graph, pairs[p], budgets[r], compute,
                    args.limit))))
        results = {}
        for key, result in run_parallel(tasks, args.jobs, args.timeout):
            results[key] = result
            p, r = key
            remat = remat_cell(args.remat, trace, p, budgets[r], args.limit)
            ok = agree(result, remat, args.tolerance)
            if result[0] == "timeout":
                ok = None
            row = {
                "trace": os.path.basename(trace), "ratio": r,
                "heuristic": p, "simrd_heuristic": pairs[p],
                "budget_bytes": budgets[r],
                "dtr_status": result[0],
                "dtr_overhead": ("%.6f" % result[1]
                                 if result[0] == "ok" else ""),
                "remat_status": remat[0],
                "remat_overhead": ("%.6f" % remat[1]
                                   if remat[0] == "ok" else ""),
                "agree": "n/a" if ok is None else "yes" if ok else "no",
            }
            rows.append(row)
            if writer:
                writer.writerow(row)
                out.flush()
            print("  %-10s %s  simrd %-8s remat %-8s %s"
                  % (p, r, fmt(*result), fmt(*remat),
                     "?" if ok is None else "agree" if ok else "DIFFER"),
                  file=sys.stderr, flush=True)
    if out:
        out.close()
    order = {p: i for i, p in enumerate(policies)}
    rows.sort(key=lambda r: (args.traces.index(
        next(t for t in args.traces if os.path.basename(t) == r["trace"])),
        order[r["heuristic"]], float(r["ratio"])))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)
    write_table(markdown(rows, ratios, args.tolerance), args.md)


def write_table(table, path):
    """The agreement table to `path` (a new file), or to stdout."""
    if path:
        with open(path, "x") as f:
            f.write(table)
    else:
        sys.stdout.write(table)


if __name__ == "__main__":
    main()
