#!/usr/bin/env python3
"""Host time of one budgeted replay, remat's simulator against DTR's (simrd),
on the same op trace, heuristic and budget in bytes (live accounting, drops
only, as scripts/dtr_fidelity.py pairs them). Prints, per run, both wall
times, records per second of each and the ratio (simrd's time / remat's).
remat's time is its whole process (`remat sim`, parsing and its unlimited
reference run included), and its record loop alone (records_per_second, the
budgeted run's loop); simrd's is its budgeted run alone, parsing not
counted. The best of --repeat runs each.

  python3 scripts/sim_speed_vs_dtr.py --simrd DIR --remat build-rel/bin/remat \\
      examples/traces/densenet121_b8.jsonl --ratio 0.5 --heuristic dtr-eq
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtr_fidelity  # noqa: E402
import dtr_log  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--simrd", required=True, help="folder holding the simrd package")
    parser.add_argument("--remat", default="build/bin/remat")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--heuristic", default="dtr-eq", choices=[p for p, _ in dtr_fidelity.PAIRS])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    simrd = dtr_fidelity.load_simrd(args.simrd)
    with open(args.trace) as f:
        records = sum(1 for line in f if line.strip())
    with open(args.trace) as f:
        graph = simrd[2](list(dtr_log.convert(f)))
    peak, compute = dtr_fidelity.simrd_baseline(simrd, graph)
    budget = int(peak * args.ratio)
    name = dict(dtr_fidelity.PAIRS)[args.heuristic]
    simrd_best = remat_best = loop_best = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        status = dtr_fidelity.simrd_cell(simrd, graph, name, budget, compute, 1000)
        took = time.perf_counter() - start
        simrd_best = took if simrd_best is None else min(simrd_best, took)
        cmd = [args.remat, "sim", args.trace, "--budget", str(budget), "--accounting", "live",
               "--no-swap", "--policy", args.heuristic, "--thrash-limit", "999", "--json"]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, check=False, text=True).stdout
        took = time.perf_counter() - start
        remat_best = took if remat_best is None else min(remat_best, took)
        report = json.loads(out)
        if report["status"] != "ok" or status[0] != "ok":
            sys.exit(f"a run did not finish (remat {report['status']}, simrd {status[0]}): "
                     "its speed would say nothing")
        loop = report["records_per_second"]
        loop_best = loop if loop_best is None else max(loop_best, loop)
    print(f"{os.path.basename(args.trace)} at {args.ratio} ({budget} bytes), {args.heuristic} / "
          f"{name}: simrd {status[0]} {simrd_best:.3f} s ({records / simrd_best / 1e3:.1f} k "
          f"records/s), remat {remat_best:.4f} s ({records / remat_best / 1e6:.2f} M records/s): "
          f"{simrd_best / remat_best:.0f}x; remat's record loop {loop_best / 1e6:.2f} M records/s: "
          f"{loop_best * simrd_best / records:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
