"""The integer program behind remat.optimal's bound: its variables, its
constraints stage by stage, and its solution (see remat.optimal's docstring
for what the program is and why it is a lower bound)."""
import contextlib
import math
import os
import sys
import time


MAX_VARIABLES = 400_000


@contextlib.contextmanager
def _solver_prints_to_stderr():
    """The solver's own prints (HiGHS writes some to the process's standard
    output whatever its options say) go to standard error: standard output
    carries the --json report alone."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield  # no file descriptor 1 to guard (an embedding host)
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class Solution:
    """An integer point of the program: which storages are resident at the
    start of each stage, which calls are recomputed in which stage, which
    storages are copied back for which stage, and what it adds (ns)."""

    def __init__(self, keep, recompute, copy_in, time_ns):
        self.keep = keep            # {(t, s)}: S[t, s] = 1
        self.recompute = recompute  # {(t, k)}: R[t, k] = 1
        self.copy_in = copy_in      # {(t, s)}: I[t, s] = 1
        self.time_ns = time_ns


def recompute_bound(trace, budget_bytes, time_limit=60.0, max_variables=MAX_VARIABLES,
                    link_gbps=None, link_latency_ns=0, want_plan=False, realizable=False):
    """The least time (ns) any drop-only run under a live budget of
    `budget_bytes` must add to the trace's compute (`recompute_ns`); a dict
    with the figures. With `link_gbps` (each way, 1e9 bytes/s) the runs may
    also offload, over a link with `link_latency_ns` per copy: the added time
    is then recomputes and waits for copies. A program of more than
    `max_variables` is not built: status "too_large", with the trivial bound
    (nothing added). With `want_plan`, where the solver found an integer
    point, the dict's "solution" holds it (a Solution: write_plan turns it
    into a trace a replay carries out). With `realizable`, the program also
    counts what a plan's replay holds while it recomputes a stage's calls in
    the trace's order: no longer a relaxation of every run (its optimum is
    no bound), but a program whose plans replay as solved more often."""
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

    # The constants on the device at each stage. For a plan, also those
    # released but still read by a call whose outputs may be recomputed (the
    # runtime keeps a constant a closure reads).
    const_live = list(trace.constant_live)
    if realizable:
        for c in range(n_storages):
            if not trace.constant[c] or trace.released_at[c] is None:
                continue
            until = max((last_need[o] for _, _, inputs, outputs in trace.stages
                         if c in inputs for o in outputs), default=-1)
            for t in range(trace.released_at[c], min(until, n_stages - 1) + 1):
                const_live[t] += sizes[c]

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

    def copy_ns(s):
        return link_latency_ns + math.floor(sizes[s] / link_gbps)

    # What stage t's call reads (a use reads its tensors one at a time, so
    # none of them is there for the whole stage).
    call_reads = [set(inputs) if kind == "call" else set()
                  for kind, _, inputs, _ in trace.stages]

    columns = []  # kinds: S, R, K (as above); I, O, W, Z, Q, H (with offload)
    cost = []
    col_s, col_r, col_k, col_i = {}, {}, {}, {}

    def add(kind, key, c):
        columns.append(kind)
        cost.append(c)
        return len(columns) - 1

    droppable = [s for s in range(n_storages) if not trace.constant[s] and sizes[s] > 0]
    for s in droppable:
        # Resident at a stage's start only while its program holds it. For the
        # bound, also after its release while a call reading it may be
        # recomputed, once a recompute brought it back: the runtime keeps a
        # released storage a regeneration brought back while a dropped
        # consumer the program holds needs it (RuntimeOptions::keep_regenerated),
        # and a bound must allow whatever a run can do. A plan keeps to the
        # program's hold (what it can say).
        # (Not at the stage its release comes before: the runtime drops it
        # there, so it is back after only by a recompute.)
        last_kept = last_need[s]
        released = trace.released_at[s]
        if released is not None and realizable:
            last_kept = min(last_kept, released - 1)
        for t in range(trace.producer[s] + 1, last_kept + 1):
            if t != released:
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
    # J[t, s]: s recomputed in stage t and kept for stage t+1 (there during
    # stage t's call). A[t, s]: s, read by stage t's call, resident from the
    # stage's start to its call (neither recomputed nor copied back in it).
    # M[t]: the most bytes a recompute in stage t holds beyond those.
    col_j, col_a, col_m = {}, {}, {}
    for (t, k) in col_r:
        for s in trace.stages[k][3]:
            if (t + 1, s) in col_s:
                col_j[(t, s)] = add("J", (t, s), 0.0)
        if t not in col_m:
            col_m[t] = add("M", t, 0.0)
            if trace.stages[t][0] == "call":
                for s in trace.stages[t][2]:
                    if (t, s) in col_s:
                        col_a[(t, s)] = add("A", (t, s), 0.0)
    if offload:
        # I[t, s]: s copied back for stage t. O[s]: s copied out once. W[t]:
        # the wait before stage t's call; Z[t]: when that call starts; Q[t]:
        # the host-to-device engine's work for stages up to t; H[t]: bytes
        # copied back for stages t and later that are on the device during
        # stage t-1's call (see below).
        for s in droppable:
            # (A plan's replay waits for the copy out that a copy back
            # implies: the compute stream reuses the block only after it.)
            out_ns = float(copy_ns(s)) if realizable else 0.0
            for t in range(trace.producer[s] + 1, last_need[s] + 1):
                col_i[(t, s)] = add("I", (t, s), out_ns)
        col_o = {s: add("O", s, 0.0) for s in droppable}
        col_w = [add("W", t, 1.0) for t in range(n_stages)]
        col_z = [add("Z", t, 0.0) for t in range(n_stages)]
        col_q = [add("Q", t, 0.0) for t in range(n_stages)]
        col_h = [add("H", t, 0.0) for t in range(n_stages)]

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
            # (A recompute that a use's later read brings on comes after its
            # earlier reads: J counts at a call only.)
            is_call = trace.stages[t][0] == "call"
            for s in droppable:
                if s in group:
                    continue
                for c in (col_k.get((t, s)), col_j.get((t, s)) if is_call else None):
                    if c is not None:
                        kept.append((c, float(sizes[s])))
            # A call holds its group while copies for later stages run; a
            # use reads its tensors one at a time, so those copies are
            # counted once, beside what is kept (below), not with each read.
            if offload and t + 1 < n_stages and trace.stages[t][0] == "call":
                kept.append((col_h[t + 1], 1.0))
                if realizable:
                    kept += [(c, float(sizes[s])) for s in droppable if s not in group
                             and (c := col_i.get((t + 1, s))) is not None]
            own = sum(sizes[s] for s in group)
            constraint(kept, -math.inf, float(budget_bytes - own - const_live[t]))
        if offload and t + 1 < n_stages and trace.stages[t][0] == "use":
            kept = [(c, float(sizes[s])) for s in droppable
                    if (c := col_k.get((t, s))) is not None]
            constraint(kept + [(col_h[t + 1], 1.0)], -math.inf,
                       float(budget_bytes - const_live[t]))
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
    for (t, s), c in col_j.items():
        # Recomputed in stage t (before its call: a run recomputes what a
        # call reads while it gathers its inputs) and still there at stage
        # t+1: there through stage t's call too.
        constraint([(c, 1.0), (col_r[(t, trace.producer[s])], -1.0),
                    (col_s[(t + 1, s)], -1.0)], -1.0, math.inf)
    for (t, s), c in col_a.items():
        terms = [(c, 1.0), (col_s[(t, s)], -1.0)]
        if (t, trace.producer[s]) in col_r:
            terms.append((col_r[(t, trace.producer[s])], 1.0))
        if (t, s) in col_i:
            terms.append((col_i[(t, s)], 1.0))
        constraint(terms, 0.0, math.inf)
    # A recompute in stage t holds its call's inputs and outputs while what is
    # resident through the stage is there, and (before a call) the call's
    # inputs that were there from the stage's start: M[t] is at least what a
    # recompute adds to those, for each recompute in the stage.
    if realizable:
        j_at, r_at = {}, {}
        for (t, s2), c in col_j.items():
            j_at.setdefault(t, []).append((s2, c))
        for (t, k) in col_r:
            r_at.setdefault(t, []).append(k)
    for (t, k), c in col_r.items():
        read = call_reads[t]
        own = set(trace.stages[k][2]) | set(trace.stages[k][3])
        # A run regenerates a call's lost outputs, but not one released that
        # nothing reads (collected): of outputs all released, at least the
        # one a reader needs.
        outputs = trace.stages[k][3]
        live_outputs = [sizes[s] for s in outputs if trace.live_at(s, t)]
        held = sum(live_outputs) if live_outputs else min((sizes[s] for s in outputs), default=0)
        terms = [(col_m[t], 1.0)]
        for s in trace.stages[k][2]:
            if trace.constant[s] or sizes[s] == 0:
                continue
            held += sizes[s]
            there = col_a.get((t, s)) if s in read else col_k.get((t, s))
            if there is not None:
                terms.append((there, float(sizes[s])))  # counted below already
        terms.append((c, -float(held)))
        lower = 0.0
        if realizable:
            # A plan's replay recomputes a stage's calls in the order of the
            # trace, and keeps what an earlier one made while the stage keeps
            # it or its call reads it: counted here, where recompute k runs
            # (M[t] >= ... + those - their bytes * (1 - R[t, k])).
            extra = 0.0
            counted = set()
            for s2, cj in j_at.get(t, ()):
                if trace.producer[s2] < k and s2 not in own:
                    terms.append((cj, -float(sizes[s2])))
                    extra += sizes[s2]
                    counted.add(s2)
            for k2 in r_at.get(t, ()):
                if k2 >= k:
                    continue
                for s2 in trace.stages[k2][3]:
                    if s2 in read and s2 not in own and s2 not in counted:
                        terms.append((col_r[(t, k2)], -float(sizes[s2])))
                        extra += sizes[s2]
            if extra:
                terms.append((c, -extra))
                lower = -extra
        constraint(terms, lower, math.inf)
    if realizable:
        # A plan's replay brings back each recompute of a stage that makes a
        # live tensor by a regeneration of its own, and the runtime lets a
        # released storage go again after each: read by n of them, it is
        # recomputed n times (X[t, s] >= n - 1 more).
        readers = {}
        for (t, k), c in col_r.items():
            if not any(trace.live_at(o, t) for o in trace.stages[k][3]):
                continue  # regenerated inside another's regeneration
            for s in trace.stages[k][2]:
                if trace.constant[s] or sizes[s] == 0:
                    continue
                if not trace.live_at(s, t):
                    readers.setdefault((t, s), []).append(c)
        for (t, s), cs in readers.items():
            if len(cs) > 1:
                x = add("X", (t, s), float(trace.stages[trace.producer[s]][1]))
                constraint([(x, 1.0)] + [(c, -1.0) for c in cs], -1.0, math.inf)
    for t, m in col_m.items():
        read = call_reads[t]
        terms = [(m, 1.0)]
        for s in droppable:
            if s in read:
                if (t, s) in col_a:
                    terms.append((col_a[(t, s)], float(sizes[s])))
            elif (t, s) in col_k:
                terms.append((col_k[(t, s)], float(sizes[s])))
        constraint(terms, -math.inf, float(budget_bytes - const_live[t]))

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
            if realizable and t > 0 and copies_in[t]:
                # A plan's replay starts stage t's copies back as stage t-1
                # starts, not earlier (they are on the device from then).
                constraint([(col_z[t], 1.0), (col_z[t - 1], -1.0)] + copies_in[t], 0.0,
                           math.inf)
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
    continuous = ("K", "J", "A", "M", "X", "W", "Z", "Q", "H")
    integrality = np.array([0 if kind in continuous else 1 for kind in columns])
    upper = np.array([math.inf if kind in ("M", "X", "W", "Z", "Q", "H") else 1.0
                      for kind in columns])
    with _solver_prints_to_stderr():
        result = milp(c=np.array(cost), integrality=integrality, bounds=Bounds(0, upper),
                      constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
                      options={"time_limit": float(time_limit), "disp": False,
                               "mip_rel_gap": 0.0})
    seconds = time.monotonic() - started
    figures = {"variables": n, "constraints": len(lo), "seconds": seconds}
    if want_plan and getattr(result, "x", None) is not None:
        x = result.x
        figures["solution"] = Solution(
            keep={key for key, c in col_s.items() if x[c] > 0.5},
            recompute={key for key, c in col_r.items() if x[c] > 0.5},
            copy_in={key for key, c in col_i.items() if x[c] > 0.5},
            time_ns=float(result.fun))
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
