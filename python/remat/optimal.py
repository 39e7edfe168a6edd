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
- S[t, s] = 1: storage s is resident when stage t starts; never after the
  release of its last tensor (the runtime drops a released storage's bytes
  then, and again once a recompute that brought it back ends).
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
import contextlib
import json
import math
import os
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
        self.records = []         # (line text, op, record) in file order, blank lines left out
        self.storage_of = {}      # tensor id -> storage (ids are never reused)
        # The first stage after the release of a storage's last tensor (None
        # while live): from then on the runtime never holds it between
        # stages (a closure may still read it: its bytes are dropped at the
        # release, and again after any recompute brings it back).
        self.released_at = []

    def live_at(self, s, t):
        """Whether storage s still has a tensor its program holds at stage t."""
        return self.released_at[s] is None or self.released_at[s] > t


# The longest line a trace may have, as the C++ readers cap it
# (base/line_reader.h): a file with no newline is refused at the cap, not read
# whole into memory first.
MAX_LINE = 16 << 20


def _lines(f, path, cap=None):
    """(number, text) of each line of `f`, refusing one longer than `cap`
    (MAX_LINE by default)."""
    cap = MAX_LINE if cap is None else cap
    line_no = 0
    while True:
        line = f.readline(cap + 1)
        if not line:
            return
        line_no += 1
        if len(line) > cap:
            raise ValueError(f"{path}:{line_no}: the line is longer than {cap} characters "
                             "(a trace's lines are short: is this an op trace?)")
        yield line_no, line


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
        for line_no, line in _lines(f, path):
            if not line.strip():
                continue
            where[0] = f"{path}:{line_no}"
            try:
                rec = json.loads(line)
                op = rec["op"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{where[0]}: not an op record ({e})") from None
            trace.records.append((line.rstrip("\r\n"), op, rec))
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
                elif op != "phase":
                    raise ValueError(f"{where[0]}: unknown op '{op}'")
            except (KeyError, TypeError) as e:
                raise ValueError(f"{where[0]}: a {op} record without a field it needs, or "
                                 f"with one of the wrong type ({e!r})") from None
    if not trace.stages:
        raise ValueError(f"{path}: the trace has no calls")
    return trace


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
        # Resident at a stage's start only while its program holds it.
        last_kept = last_need[s]
        if trace.released_at[s] is not None:
            last_kept = min(last_kept, trace.released_at[s] - 1)
        for t in range(trace.producer[s] + 1, last_kept + 1):
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
                      f"{'' if args.offload else ' --no-swap'})")
        if out["variables"]:
            print(f"  {out['variables']} variables, {out['constraints']} constraints, "
                  f"{out['seconds']:.1f} s")
    return 0 if out["status"] in ("ok", "too_large") else 3


if __name__ == "__main__":
    sys.exit(main())
