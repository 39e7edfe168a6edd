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
- S[t, s] = 1: storage s is resident when stage t starts; after the release
  of its last tensor only while a call reading it may still be recomputed
  (the runtime drops a released storage's bytes at the release, but keeps
  one a regeneration brought back while a dropped consumer the program holds
  needs it; a plan, which the replay must carry out as solved, never keeps
  one).
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
import os
import sys

from remat import op_trace
from remat._optimal_program import recompute_bound


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
        self.records = []         # (line text, op, record) in file order, blank lines left out
        self.storage_of = {}      # tensor id -> storage (ids are never reused)
        # The first stage after the release of a storage's last tensor (None
        # while live): its bytes are dropped at the release (a closure may
        # still read it), and a plan never holds it between stages from then
        # on.
        self.released_at = []

    def live_at(self, s, t):
        """Whether storage s still has a tensor its program holds at stage t."""
        return self.released_at[s] is None or self.released_at[s] > t


def read_trace(path):
    """Parses the op trace at `path` (trace/op_trace.h's format). Raises
    ValueError naming the line for what the bound cannot read."""
    trace = Trace()
    root = {}          # tensor id -> storage index
    handles = {}       # storage -> tensors over it not yet released
    released = set()   # tensor ids
    where = [path]     # "path:line" of the record being read, for messages
    live = 0
    constants_live = 0

    def storage_of(tid):
        if tid in released:
            raise ValueError(f"{where[0]}: '{tid}' was released")
        if tid not in root:
            raise ValueError(f"{where[0]}: unknown tensor '{tid}'")
        return root[tid]

    def define(tid, nbytes, producer, constant):
        s = len(trace.storage_bytes)
        root[tid] = s
        trace.storage_of[tid] = s
        handles[s] = 1
        trace.storage_bytes.append(int(nbytes))
        trace.producer.append(producer)
        trace.constant.append(constant)
        trace.released_at.append(None)
        return s

    with open(path, encoding="utf-8") as f:
        for line_no, text, op, rec in op_trace.records(f, path):
            where[0] = f"{path}:{line_no}"
            trace.records.append((text, op, rec))
            try:
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
                            trace.storage_of[out["id"]] = base
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
                        trace.released_at[s] = len(trace.stages)
                        live -= trace.storage_bytes[s]
                        if trace.constant[s]:
                            constants_live -= trace.storage_bytes[s]
                elif op in ("evict", "prefetch"):
                    storage_of(rec["id"])  # a plan's records: they change no stage
            except (KeyError, TypeError) as e:
                raise ValueError(f"{where[0]}: a {op} record without a field it needs, or "
                                 f"with one of the wrong type ({e!r})") from None
    if not trace.stages:
        raise ValueError(f"{path}: the trace has no calls")
    return trace


def write_plan(trace, solution, out, offload=False):
    """Writes the trace with the solution's choices as evict and prefetch
    records (trace/op_trace.h) to the open text file `out`; returns how many
    of each it wrote. Replayed under the same live budget (`remat sim
    --accounting live`), the runtime carries them out: what the plan does not
    keep for the next stage leaves the device once the stage no longer needs
    it (with `offload`, offloaded where the plan copies it back later; else
    dropped); what the plan recomputes in a stage is recomputed there, in the
    trace's order, and what it no longer needs goes as soon as it has been
    read; what it copies back for a stage is prefetched as the stage before
    starts. The run's policy meets whatever pressure the plan did not
    foresee, so a replay may cost more than the solution (a released storage
    that several of a stage's recomputes read is regenerated for each, for
    one): it is a real run, and so an upper bound on the optimum."""
    n_stages = len(trace.stages)
    keep = solution.keep

    def kept(t, s):
        return (t, s) in keep

    recomputed_at = [[] for _ in range(n_stages)]
    for (t, k) in solution.recompute:
        recomputed_at[t].append(k)
    # The stages at which each storage comes back, and how.
    returns = {}
    for (t, k) in solution.recompute:
        for s in trace.stages[k][3]:
            returns.setdefault(s, []).append((t, "drop"))
    for (t, s) in solution.copy_in:
        returns.setdefault(s, []).append((t, "offload"))
    for s in returns:
        returns[s].sort()

    def leaves(s, t):
        """How s leaves after stage t: as it comes back next."""
        for u, how in returns.get(s, ()):
            if u > t:
                return how, u
        return "drop", None

    prefetch_before = [[] for _ in range(n_stages + 1)]

    def plan_prefetch(s, t, u):
        """s leaves after stage t and is copied back for stage u: the copy
        starts before stage u-1 (the stage before, as the program counts it),
        or right away when that is stage t."""
        prefetch_before[max(t + 1, u - 1)].append((s, u))

    coming = {}  # storage -> the stage a prefetch started for it is for
    live_ids = {}  # storage -> its tensor ids not yet released, in order
    on_device = set()  # what the plan may have on the device
    counts = {"evict": 0, "prefetch": 0}

    def emit(op, s, action=None):
        ids = live_ids.get(s)
        if not ids:
            return
        rec = {"op": op, "id": ids[0]}
        if action is not None:
            rec["action"] = action
        out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        counts[op] += 1

    def evict(s, t):
        how, u = leaves(s, t)
        if how == "offload" and offload:
            emit("evict", s, "offload")
            plan_prefetch(s, t, u)
        else:
            emit("evict", s, "drop")
        on_device.discard(s)

    def goes(s, t):
        """Whether s, on the device after stage t, leaves before t + 1."""
        return not kept(t + 1, s) and coming.get(s, -1) <= t

    def touched(t):
        _, _, inputs, outputs = trace.stages[t]
        return {s for s in list(inputs) + list(outputs)
                if not trace.constant[s] and trace.storage_bytes[s] > 0}

    # The storages whose last tensor the trace releases between stage t and
    # stage t + 1.
    released_after = [set() for _ in range(n_stages)]
    for s, at in enumerate(trace.released_at):
        if at is not None and 0 < at <= n_stages:
            released_after[at - 1].add(s)

    t = -1
    for text, op, rec in trace.records:
        if op in ("evict", "prefetch"):
            continue  # a plan already in the trace gives way to this one
        if op in ("call", "use"):
            t += 1
            group = touched(t)
            ks = sorted(recomputed_at[t])
            read_by_recomputes = {s for k in ks for s in trace.stages[k][2]}
            for s in sorted(on_device):
                if s not in group and s not in read_by_recomputes and goes(s, t):
                    evict(s, t - 1)
            for s, u in prefetch_before[t]:
                emit("prefetch", s)
                on_device.add(s)
                coming[s] = u
            # The stage's recomputes, ancestors first, each by a prefetch of
            # one of its live outputs (dropped: recomputed then). A call with
            # no live output, or with a released one that a later recompute
            # reads, is left to a later regeneration that needs it (the
            # runtime lets a released storage go again after each): its
            # inputs stay until the stage ends. What the rest of the stage
            # no longer reads, and the next does not keep, goes as soon as
            # it has been read.
            waiting = set()  # inputs of recomputes left to a later regeneration
            for i, k in enumerate(ks):
                outputs = [s for s in trace.stages[k][3] if trace.storage_bytes[s] > 0]
                later = {s for k2 in ks[i + 1:] for s in trace.stages[k2][2]}
                named = [s for s in outputs if live_ids.get(s)]
                if named and not any(not live_ids.get(s) and s in later for s in outputs):
                    emit("prefetch", named[0])
                else:
                    waiting.update(trace.stages[k][2])
                on_device.update(outputs)
                for s in sorted(on_device & (set(outputs) | set(trace.stages[k][2]))):
                    if s not in later and s not in group and s not in waiting and goes(s, t):
                        evict(s, t)
        out.write(text + "\n")
        if op == "constant":
            live_ids[trace.storage_of[rec["id"]]] = [rec["id"]]
        elif op == "call":
            for o in rec["outputs"]:
                live_ids.setdefault(trace.storage_of[o["id"]], []).append(o["id"])
        elif op == "release":
            s = trace.storage_of[rec["id"]]
            live_ids[s].remove(rec["id"])
            if not live_ids[s]:
                on_device.discard(s)
        if op in ("call", "use"):
            on_device |= touched(t)
            if t + 1 < n_stages:
                for s in sorted(on_device):
                    # (What the trace releases before the next stage goes then.)
                    if goes(s, t) and s not in released_after[t]:
                        evict(s, t)
    return counts


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
    parser.add_argument("--plan-out", metavar="PATH",
                        help="also write the solver's plan: the trace with evict and prefetch "
                             "records that carry it out (remat sim PATH --accounting live "
                             "--budget BYTES replays it); PATH must not exist")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.plan_out is not None and os.path.lexists(args.plan_out):
        print(f"remat.optimal: {args.plan_out} exists: give --plan-out a new path (nothing is "
              "overwritten)", file=sys.stderr)
        return 2
    if args.plan_out is not None:
        # Before the solver runs: a plan with nowhere to go is known now, not
        # after a minute of solving.
        from remat._paths import OutputPathError, check_output_paths
        try:
            check_output_paths([("the trace", args.trace)], [("--plan-out", args.plan_out)])
        except OutputPathError as e:
            print(f"remat.optimal: {e}", file=sys.stderr)
            return 2
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
        link = args.link_gbps if args.offload else None
        figures = recompute_bound(trace, budget, args.time_limit, link_gbps=link,
                                  link_latency_ns=args.link_latency_ns)
        planned = None
        if args.plan_out is not None and figures["status"] == "ok":
            planned = recompute_bound(trace, budget, args.time_limit, link_gbps=link,
                                      link_latency_ns=args.link_latency_ns, want_plan=True,
                                      realizable=True)
    except ImportError:
        print("remat.optimal: needs scipy (pip install scipy)", file=sys.stderr)
        return 2
    out = {"trace": args.trace, "budget_bytes": budget, "offload": args.offload,
           "peak_live_bytes": trace.peak_live_bytes, "compute_ns": trace.compute_ns}
    solution = planned.get("solution") if planned is not None else None
    out.update(figures)
    if args.plan_out is not None:
        out["plan"] = None
        if solution is None:
            if planned is None:
                why = "the bound's program was not solved"
            else:
                why = planned.get("message", "the solver found no integer point")
            out["plan_message"] = "no plan: " + why
        else:
            try:
                with open(args.plan_out, "x", encoding="utf-8") as f:
                    counts = write_plan(trace, solution, f, offload=args.offload)
            except OSError as e:
                print(f"remat.optimal: {e}", file=sys.stderr)
                return 2
            out["plan"] = args.plan_out
            out["plan_evicts"] = counts["evict"]
            out["plan_prefetches"] = counts["prefetch"]
            out["plan_exact"] = planned["exact"]
            if trace.compute_ns > 0:
                out["plan_overhead"] = (trace.compute_ns + solution.time_ns) / trace.compute_ns
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
        if args.plan_out is not None:
            if out["plan"] is None:
                print(f"  {out['plan_message']}")
            else:
                print(f"  plan: {out['plan']} ({out['plan_evicts']} evicts, "
                      f"{out['plan_prefetches']} prefetches; planned overhead "
                      f"{out.get('plan_overhead', 1.0):.4f}; replay it with remat sim "
                      f"{out['plan']} --accounting live --budget {budget} --thrash-limit 100"
                      f" --release-regenerated{'' if args.offload else ' --no-swap'})")
        if out["variables"]:
            print(f"  {out['variables']} variables, {out['constraints']} constraints, "
                  f"{out['seconds']:.1f} s")
    return 0 if out["status"] in ("ok", "too_large") else 3


if __name__ == "__main__":
    sys.exit(main())
