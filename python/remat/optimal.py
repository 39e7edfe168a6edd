"""A lower bound on what any drop-and-recompute run of an op trace must pay
under a live memory budget, from an integer program (solved with HiGHS
through scipy).

    python -m remat.optimal TRACE --budget-ratio 0.5 [--time-limit 60] [--json]

No policy, online or offline, that only drops and recomputes (`remat sim
--no-swap --accounting live`) can finish the step in less simulated time than
the bound: it is the optimum of a relaxation of the problem the simulator
solves. The program is the one Checkmate writes for rematerialization, in
stages: stage t runs the trace's t-th call (or use) and may first recompute
any earlier call.

- R[t, k] = 1: call k is recomputed in stage t (all its outputs, its cost once).
- S[t, s] = 1: storage s is resident when stage t starts.
- A call (run or recomputed) needs each input resident at the start of its
  stage or recomputed earlier in it; a storage resident at the end of a stage
  was resident at its start or made in it.
- Memory: when stage t's call runs, its inputs and outputs, the constants live
  then and every storage resident through the whole stage (at its start and
  at its end, and not recomputed in it) fit in the budget. A `use` reads its
  tensors one at a time (the simulator lets each go before the next): each
  of them, with the constants and what is resident through the stage.

Every run of the simulator maps onto a feasible point of this program (a
recompute done twice in a stage counts once; memory is counted at fewer
moments and for fewer storages than the simulator counts), so its optimum is a
lower bound on every run's recompute time. When the solver stops at its time
limit, the bound is its proven dual bound, still a lower bound; `exact` says
whether the optimum of the program was reached. The bound is not a plan: the
program drops memory the simulator would count (temporaries inside a stage),
so no run may reach it.

With `--offload` (a link of `--link-gbps` each way and `--link-latency-ns`
per copy, as `remat sim`'s), the bound is for runs that may also offload
(`remat sim --accounting live`, offload allowed): a storage may instead be
copied back in a stage (I[t, s] = 1), which makes it there as a recompute
would, and counts it through the stage's call if it is still there after.

- One engine copies host to device, one copy at a time: every copy back the
  program makes for stages up to t (latency + bytes / rate each) has run by
  the time stage t's call starts. Stage t's call starts after the calls
  before it, the recomputes up to it, and the waits W[u] (u <= t) the program
  adds where the copies need the time; the waits count in the bound.
- A copy back holds its memory from its start. The bytes copied back for
  stages t and later that the link could not have carried since stage t-1's
  call ended were on the device during that call (H[t]), and count in its
  memory (for a use, which reads its tensors one at a time, beside what it
  keeps rather than beside each read).
- One engine copies device to host: every storage copied back was copied out
  once before, within the run.

Every run with offloads maps onto this program: a copy back (on access or a
prefetch) is counted in the first stage after it that needs the storage.
Pinned host memory, the copy out's memory, the latency of the copies that
hold memory early, and the order of the copies out on their engine are left
out, and a copy's bytes count as if they could be split: it stays a lower
bound, a looser one where those matter.
"""

import argparse
import json
import math
import sys
import time


class Trace:
    """An op trace reduced to what the bound needs: storages and stages."""

    def __init__(self):
        self.storage_bytes = []   # by storage
        self.producer = []        # the stage of the call that makes it; -1 for a constant
        self.constant = []        # a constant: always there until released
        self.stages = []          # (record kind, cost_ns, input storages, output storages)
        self.constant_live = []   # constant bytes live at each stage
        self.peak_live_bytes = 0
        self.compute_ns = 0


def read_trace(path):
    """Parses the op trace at `path` (trace/op_trace.h's format). Raises
    ValueError naming the line for what the bound cannot read."""
    trace = Trace()
    root = {}          # tensor id -> storage index
    handles = {}       # storage -> tensors over it not yet released
    released = set()   # tensor ids
    live = 0
    constants_live = 0
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                op = rec["op"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not an op record ({e})") from None

            def storage_of(tid):
                if tid in released:
                    raise ValueError(f"{path}:{line_no}: '{tid}' was released")
                if tid not in root:
                    raise ValueError(f"{path}:{line_no}: unknown tensor '{tid}'")
                return root[tid]

            def define(tid, nbytes, producer, constant):
                s = len(trace.storage_bytes)
                root[tid] = s
                handles[s] = 1
                trace.storage_bytes.append(int(nbytes))
                trace.producer.append(producer)
                trace.constant.append(constant)
                return s

            if op == "constant":
                s = define(rec["id"], rec["bytes"], -1, True)
                live += trace.storage_bytes[s]
                constants_live += trace.storage_bytes[s]
                trace.peak_live_bytes = max(trace.peak_live_bytes, live)
            elif op == "call":
                stage = len(trace.stages)
                inputs = sorted({storage_of(t) for t in rec["inputs"]})
                outputs = []
                for out in rec["outputs"]:
                    if "alias_of" in out:
                        base = storage_of(out["alias_of"])
                        root[out["id"]] = base
                        handles[base] += 1
                    else:
                        s = define(out["id"], out["bytes"], stage, False)
                        outputs.append(s)
                        live += trace.storage_bytes[s]
                trace.peak_live_bytes = max(trace.peak_live_bytes, live)
                cost = int(rec["cost_ns"])
                trace.compute_ns += cost
                trace.stages.append(("call", cost, inputs, outputs))
                trace.constant_live.append(constants_live)
            elif op == "use":
                inputs = sorted({storage_of(t) for t in rec["ids"]})
                trace.stages.append(("use", 0, inputs, []))
                trace.constant_live.append(constants_live)
            elif op == "release":
                s = storage_of(rec["id"])
                released.add(rec["id"])
                handles[s] -= 1
                if handles[s] == 0:
                    live -= trace.storage_bytes[s]
                    if trace.constant[s]:
                        constants_live -= trace.storage_bytes[s]
            elif op != "phase":
                raise ValueError(f"{path}:{line_no}: unknown op '{op}'")
    if not trace.stages:
        raise ValueError(f"{path}: the trace has no calls")
    return trace


MAX_VARIABLES = 400_000


def recompute_bound(trace, budget_bytes, time_limit=60.0, max_variables=MAX_VARIABLES,
                    link_gbps=None, link_latency_ns=0):
    """The least time (ns) any drop-only run under a live budget of
    `budget_bytes` must add to the trace's compute (`recompute_ns`); a dict
    with the figures. With `link_gbps` (each way, 1e9 bytes/s) the runs may
    also offload, over a link with `link_latency_ns` per copy: the added time
    is then recomputes and waits for copies. A program of more than
    `max_variables` is not built: status "too_large", with the trivial bound
    (nothing added)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    started = time.monotonic()
    offload = link_gbps is not None
    if offload and not (link_gbps > 0 and link_latency_ns >= 0):
        raise ValueError("the link needs a rate above 0 and a latency of 0 or more")
    kind_of_run = "run" if offload else "drop-only run"
    n_stages = len(trace.stages)
    n_storages = len(trace.storage_bytes)
    sizes = trace.storage_bytes

    # The last stage at which each storage can be needed: read then, or read
    # by a call whose outputs are needed later (and so may be recomputed).
    last_need = [-1] * n_storages
    for t, (_, _, inputs, _) in enumerate(trace.stages):
        for s in inputs:
            last_need[s] = max(last_need[s], t)
    for t in range(n_stages - 1, -1, -1):
        _, _, inputs, outputs = trace.stages[t]
        need = max((last_need[o] for o in outputs), default=-1)
        for s in inputs:
            last_need[s] = max(last_need[s], need)

    def at_once(t):
        """The storage sets stage t holds at once: a call's inputs and
        outputs together, a use's inputs one at a time."""
        kind, _, inputs, outputs = trace.stages[t]
        if kind == "use":
            return [{s} for s in inputs if not trace.constant[s]] or [set()]
        return [{s for s in set(inputs) | set(outputs) if not trace.constant[s]}]

    # Where the budget cannot hold a stage's own call, nothing fits.
    for t in range(n_stages):
        own = max(sum(sizes[s] for s in group) for group in at_once(t))
        floor = own + trace.constant_live[t]
        if floor > budget_bytes:
            return {"status": "infeasible", "exact": True, "recompute_ns": None,
                    "message": f"no {kind_of_run} fits: stage {t} (a {trace.stages[t][0]}) "
                               f"needs {floor} bytes at once with the constants live then",
                    "variables": 0, "constraints": 0, "seconds": time.monotonic() - started}

    # Its size, before building it: one S and (nearly) one K per storage and
    # stage it may be needed in, one R per stage and earlier call.
    estimate = (3 if offload else 2) * sum(max(0, last_need[s] - trace.producer[s])
                                           for s in range(n_storages) if not trace.constant[s])
    if offload:
        estimate += n_storages + 4 * n_stages
    for t in range(n_stages):
        for k in range(t):
            kind, _, _, outputs = trace.stages[k]
            if kind == "call" and outputs and max(last_need[o] for o in outputs) >= t:
                estimate += 1
                if estimate > max_variables:
                    break
        if estimate > max_variables:
            break
    if estimate > max_variables:
        return {"status": "too_large", "exact": False, "recompute_ns": 0.0,
                "message": f"the program would have over {max_variables} variables "
                           f"({n_stages} stages, {n_storages} storages): not built; the bound "
                           "given is the trivial one (nothing recomputed)",
                "variables": 0, "constraints": 0, "seconds": time.monotonic() - started}

    columns = []  # kinds: S, R, K (as above); I, O, W, Z, Q, H (with offload)
    cost = []
    col_s, col_r, col_k, col_i = {}, {}, {}, {}

    def add(kind, key, c):
        columns.append(kind)
        cost.append(c)
        return len(columns) - 1

    droppable = [s for s in range(n_storages) if not trace.constant[s] and sizes[s] > 0]
    for s in droppable:
        for t in range(trace.producer[s] + 1, last_need[s] + 1):
            col_s[(t, s)] = add("S", (t, s), 0.0)
    for t in range(n_stages):
        for k in range(t):
            kind, kcost, _, outputs = trace.stages[k]
            if kind != "call" or not outputs:
                continue
            if max(last_need[o] for o in outputs) >= t:
                col_r[(t, k)] = add("R", (t, k), float(kcost))
    for (t, s) in list(col_s):
        if (t + 1, s) in col_s:
            col_k[(t, s)] = add("K", (t, s), 0.0)
    if offload:
        # I[t, s]: s copied back for stage t. O[s]: s copied out once. W[t]:
        # the wait before stage t's call; Z[t]: when that call starts; Q[t]:
        # the host-to-device engine's work for stages up to t; H[t]: bytes
        # copied back for stages t and later that are on the device during
        # stage t-1's call (see below).
        for s in droppable:
            for t in range(trace.producer[s] + 1, last_need[s] + 1):
                col_i[(t, s)] = add("I", (t, s), 0.0)
        col_o = {s: add("O", s, 0.0) for s in droppable}
        col_w = [add("W", t, 1.0) for t in range(n_stages)]
        col_z = [add("Z", t, 0.0) for t in range(n_stages)]
        col_q = [add("Q", t, 0.0) for t in range(n_stages)]
        col_h = [add("H", t, 0.0) for t in range(n_stages)]

    def copy_ns(s):
        return link_latency_ns + math.floor(sizes[s] / link_gbps)

    rows, cols, vals, lo, hi = [], [], [], [], []

    def constraint(terms, lower, upper):
        r = len(lo)
        for c, v in terms:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lower)
        hi.append(upper)

    def available(t, s):
        """Terms that are >= 1 when storage s is there for stage t's calls."""
        terms = []
        if (t, s) in col_s:
            terms.append((col_s[(t, s)], 1.0))
        if (t, trace.producer[s]) in col_r:
            terms.append((col_r[(t, trace.producer[s])], 1.0))
        if (t, s) in col_i:
            terms.append((col_i[(t, s)], 1.0))
        return terms

    for t, (_, _, inputs, outputs) in enumerate(trace.stages):
        for s in inputs:
            if trace.constant[s] or sizes[s] == 0:
                continue
            terms = available(t, s)
            constraint(terms, 1.0, math.inf)  # (no terms: the trace reads a freed storage)
        for group in at_once(t):
            kept = []
            for s in droppable:
                c = col_k.get((t, s))
                if c is not None and s not in group:
                    kept.append((c, float(sizes[s])))
            # A call holds its group while copies for later stages run; a
            # use reads its tensors one at a time, so those copies are
            # counted once, beside what is kept (below), not with each read.
            if offload and t + 1 < n_stages and trace.stages[t][0] == "call":
                kept.append((col_h[t + 1], 1.0))
            own = sum(sizes[s] for s in group)
            constraint(kept, -math.inf, float(budget_bytes - own - trace.constant_live[t]))
        if offload and t + 1 < n_stages and trace.stages[t][0] == "use":
            kept = [(c, float(sizes[s])) for s in droppable
                    if (c := col_k.get((t, s))) is not None]
            constraint(kept + [(col_h[t + 1], 1.0)], -math.inf,
                       float(budget_bytes - trace.constant_live[t]))
    for (t, k), c in col_r.items():
        for s in trace.stages[k][2]:
            if trace.constant[s] or sizes[s] == 0:
                continue
            constraint([(c, 1.0)] + [(x, -1.0) for x, _ in available(t, s)], -math.inf, 0.0)
    for (t, s), c in col_s.items():
        if t - 1 == trace.producer[s]:
            continue  # made in the stage before: free to keep
        prev = [(x, -1.0) for x, _ in available(t - 1, s)]
        constraint([(c, 1.0)] + prev, -math.inf, 0.0)
    for (t, s), c in col_k.items():
        terms = [(c, 1.0), (col_s[(t, s)], -1.0), (col_s[(t + 1, s)], -1.0)]
        if (t, trace.producer[s]) in col_r:
            terms.append((col_r[(t, trace.producer[s])], 1.0))
        if (t, s) in col_i:
            terms.append((col_i[(t, s)], 1.0))
            # Copied back for stage t and still there at stage t+1: there
            # through stage t's call too.
            constraint([(c, 1.0), (col_i[(t, s)], -1.0), (col_s[(t + 1, s)], -1.0)],
                       -1.0, math.inf)
        constraint(terms, -1.0, math.inf)

    if offload:
        copies_in = [[] for _ in range(n_stages)]
        copies_for = {}
        for key in col_i:
            copies_for.setdefault(key[0], []).append(key)
        recomputes_in = [[] for _ in range(n_stages)]
        for (t, k), c in col_r.items():
            recomputes_in[t].append((c, -float(trace.stages[k][1])))
        for (t, s), c in col_i.items():
            copies_in[t].append((c, -float(copy_ns(s))))
            constraint([(col_o[s], 1.0), (c, -1.0)], 0.0, math.inf)  # out before back
        for t in range(n_stages):
            # Z[t] = Z[t-1] + cost of call t-1 + recomputes in t + W[t]
            terms = [(col_z[t], 1.0), (col_w[t], -1.0)]
            terms += recomputes_in[t]
            if t > 0:
                terms.append((col_z[t - 1], -1.0))
            before = float(trace.stages[t - 1][1]) if t > 0 else 0.0
            constraint(terms, before, before)
            # Q[t] >= Q[t-1] + the copies back for stage t; Q[t] <= Z[t]
            terms = [(col_q[t], 1.0)] + copies_in[t]
            if t > 0:
                terms.append((col_q[t - 1], -1.0))
            constraint(terms, 0.0, math.inf)
            constraint([(col_q[t], 1.0), (col_z[t], -1.0)], -math.inf, 0.0)
        # A copy back takes memory from when it starts. Those for stages t..u
        # that start after stage t-1's call ends (at E[t-1] = Z[t-1] + c[t-1])
        # run one at a time and end by Z[u], so at most link_gbps * (Z[u] -
        # E[t-1]) of their bytes do; the rest started earlier, and are on the
        # device (copying or copied, not yet read) during stage t-1's call:
        # H[t] >= bytes[t] - rate (Z[t] - E[t-1]), and
        # H[t] >= bytes[t] + H[t+1] - rate (E[t] - E[t-1]).
        rate = float(link_gbps)
        for t in range(n_stages):
            ends_before = float(trace.stages[t - 1][1]) if t > 0 else 0.0  # c[t-1]
            copied = [(c, -float(sizes[s])) for c, s in
                      ((col_i[key], key[1]) for key in copies_for.get(t, ()))]
            here = [(col_h[t], 1.0), (col_z[t], rate)] + copied
            if t > 0:
                here.append((col_z[t - 1], -rate))
            constraint(here, rate * ends_before, math.inf)
            if t + 1 < n_stages:
                constraint(here + [(col_h[t + 1], -1.0)],
                           rate * (ends_before - float(trace.stages[t][1])), math.inf)
        # Every storage copied back was copied out before its last copy back
        # ended, on the other engine, within the run.
        constraint([(c, float(copy_ns(s))) for s, c in col_o.items()] + [(col_z[-1], -1.0)],
                   -math.inf, 0.0)

    n = len(columns)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    continuous = ("K", "W", "Z", "Q", "H")
    integrality = np.array([0 if kind in continuous else 1 for kind in columns])
    upper = np.array([math.inf if kind in ("W", "Z", "Q", "H") else 1.0 for kind in columns])
    result = milp(c=np.array(cost), integrality=integrality, bounds=Bounds(0, upper),
                  constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
                  options={"time_limit": float(time_limit), "disp": False, "mip_rel_gap": 0.0})
    seconds = time.monotonic() - started
    figures = {"variables": n, "constraints": len(lo), "seconds": seconds}
    if result.status == 2:
        return dict(figures, status="infeasible", exact=True, recompute_ns=None,
                    message=f"no {'' if offload else 'drop-only '}plan fits the budget")
    bound = getattr(result, "mip_dual_bound", None)
    if result.status == 0:
        # Optimal within the solver's tolerances: the proven (dual) bound is
        # the figure that cannot be above the true optimum.
        proven = float(result.fun)
        if bound is not None and math.isfinite(bound):
            proven = min(proven, float(bound))
        return dict(figures, status="ok", exact=True, recompute_ns=max(0.0, proven))
    if bound is None or not math.isfinite(bound):
        bound = 0.0
    return dict(figures, status="ok", exact=False, recompute_ns=max(0.0, float(bound)),
                message=f"solver stopped: {result.message}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m remat.optimal",
        description="A lower bound on the time of any drop-only run of an op trace under a "
                    "live budget (remat sim --no-swap --accounting live), or with --offload of "
                    "any run that may also offload (remat sim --accounting live).")
    parser.add_argument("trace")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--budget-ratio", type=float,
                       help="the budget as a fraction of the trace's peak live bytes (remat sim's "
                            "ratio is of its unlimited run's peak, which can be higher where a "
                            "released constant is still read by a recompute: for the same budget, "
                            "give --budget the budget_bytes remat sim --json prints)")
    group.add_argument("--budget", type=str, help="the budget in bytes (or 2GiB, ...)")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds for the solver (then its proven bound is reported)")
    parser.add_argument("--offload", action="store_true",
                        help="bound runs that may also offload, over the link below")
    parser.add_argument("--link-gbps", type=float, default=25.0,
                        help="with --offload: each direction's rate, 1e9 bytes/s (as remat sim's)")
    parser.add_argument("--link-latency-ns", type=int, default=2000,
                        help="with --offload: the time each copy adds (as remat sim's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.offload and not (args.link_gbps > 0 and args.link_latency_ns >= 0):
        print("remat.optimal: --link-gbps must be above 0 and --link-latency-ns 0 or more",
              file=sys.stderr)
        return 2
    try:
        trace = read_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"remat.optimal: {e}", file=sys.stderr)
        return 2
    if args.budget_ratio is not None:
        if not 0 < args.budget_ratio <= 100:
            print("remat.optimal: --budget-ratio must be in (0, 100]", file=sys.stderr)
            return 2
        budget = int(args.budget_ratio * trace.peak_live_bytes)
    else:
        from remat import parse_size
        try:
            budget = parse_size(args.budget)
        except ValueError as e:
            print(f"remat.optimal: {e}", file=sys.stderr)
            return 2
    try:
        figures = recompute_bound(trace, budget, args.time_limit,
                                  link_gbps=args.link_gbps if args.offload else None,
                                  link_latency_ns=args.link_latency_ns)
    except ImportError:
        print("remat.optimal: needs scipy (pip install scipy)", file=sys.stderr)
        return 2
    out = {"trace": args.trace, "budget_bytes": budget, "offload": args.offload,
           "peak_live_bytes": trace.peak_live_bytes, "compute_ns": trace.compute_ns}
    out.update(figures)
    if figures["recompute_ns"] is not None and trace.compute_ns > 0:  # (too_large: 1.0)
        out["overhead_bound"] = (trace.compute_ns + figures["recompute_ns"]) / trace.compute_ns
    else:
        out["overhead_bound"] = None
    if args.json:
        print(json.dumps(out))
    else:
        runs = (f"runs that may offload at {args.link_gbps:g} GB/s each way" if args.offload
                else "drop-only runs")
        print(f"bound of {args.trace} under {budget} bytes live, {runs} ({out['status']})")
        if out["overhead_bound"] is not None:
            kind = ("the program's optimum" if out["exact"]
                    else "the trivial bound" if out["status"] == "too_large"
                    else "the solver's proven bound")
            added = "recompute and waits" if args.offload else "recompute"
            print(f"  overhead >= {out['overhead_bound']:.4f} ({kind}; "
                  f"{added} >= {out['recompute_ns'] / 1e6:.3f} ms of "
                  f"{trace.compute_ns / 1e6:.3f} ms compute)")
        if out.get("message"):
            print(f"  {out['message']}")
        if out["variables"]:
            print(f"  {out['variables']} variables, {out['constraints']} constraints, "
                  f"{out['seconds']:.1f} s")
    return 0 if out["status"] in ("ok", "too_large") else 3


if __name__ == "__main__":
    sys.exit(main())
