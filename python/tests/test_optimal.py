"""remat.optimal: the lower bound, drop-only and with offloads. Needs scipy (skipped without);
the comparison with the simulator needs the remat tool (REMAT_BINARY, or
build/bin/remat)."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
pytest.importorskip("scipy", reason="remat.optimal needs scipy (pip install scipy)")

from remat import op_trace, optimal  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def remat_binary():
    path = os.environ.get("REMAT_BINARY", os.path.join(ROOT, "build", "bin", "remat"))
    if not os.access(path, os.X_OK):
        pytest.skip(f"no remat tool at {path} (set REMAT_BINARY)")
    return path


def write(tmp_path, lines):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return str(path)


def call(name, inputs, out, nbytes, cost):
    return {"op": "call", "name": name, "inputs": inputs,
            "outputs": [{"id": out, "bytes": nbytes}], "cost_ns": cost}


def run_sim(binary, path, policy, budget, link_gbps=None, extra=()):
    """remat sim's JSON under a live budget: ("--budget", "201") or
    ("--budget-ratio", "0.5"); drop-only, or with `link_gbps` offload allowed
    over that link (2 us a copy); `extra`: more of remat sim's flags."""
    mode = ["--no-swap"] if link_gbps is None else ["--link-gbps", str(link_gbps)]
    mode += list(extra)
    out = subprocess.run([binary, "sim", path, "--policy", policy, *budget,
                          "--accounting", "live", *mode, "--json"],
                         capture_output=True, text=True)
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def assert_sweep_cells_above_the_bound(stdout, policies, finished_at_least=1):
    """The sweep's table (two ratios): plan and bound columns after the
    policies', and every finished run's cell, the plan's included, at or
    above the bound."""
    lines = stdout.splitlines()
    assert lines[1].split() == ["ratio", *policies, "plan", "bound"]
    finished = 0
    for line in lines[2:4]:
        cells = line.split()
        bound = float(cells[-1].lstrip("~"))
        for cell in cells[1:-1]:
            if cell[0].isdigit():
                finished += 1
                assert float(cell.rstrip("*")) >= bound - 5e-4, line
    assert finished >= finished_at_least, stdout


def plan_and_replay(binary, path, budget, tmp_path, offload_link=None):
    """remat.optimal's plan for a live budget of `budget` bytes, and remat
    sim's report of its replay (drop-only, or offloading over the link)."""
    plan = str(tmp_path / f"plan_{budget}.jsonl")
    args = [path, "--budget", str(budget), "--plan-out", plan, "--json"]
    if offload_link is not None:
        args += ["--offload", "--link-gbps", str(offload_link)]
    out = subprocess.run([sys.executable, "-m", "remat.optimal", *args], capture_output=True,
                         text=True, cwd=os.path.join(ROOT, "python"))
    assert out.returncode == 0, out.stderr
    solved = json.loads(out.stdout)
    assert solved["plan"] == plan
    run = run_sim(binary, plan, "dtr", ("--budget", str(budget)), link_gbps=offload_link,
                  extra=("--thrash-limit", "100", "--release-regenerated"))
    return solved, run


def test_the_bound_is_the_cheapest_recompute_on_a_hand_made_step(tmp_path):
    # a (cost 10) and b (cost 50) are both read at the end; c needs room for
    # itself while only one of them can stay: dropping a is the cheaper.
    path = write(tmp_path, [
        {"op": "constant", "id": "x", "bytes": 1},
        call("f", ["x"], "a", 100, 10),
        call("g", ["x"], "b", 100, 50),
        call("h", ["x"], "c", 100, 30),
        {"op": "release", "id": "c"},
        {"op": "use", "ids": ["a"]},
        {"op": "use", "ids": ["b"]},
    ])
    trace = optimal.read_trace(path)
    assert trace.peak_live_bytes == 301
    assert trace.compute_ns == 90
    fits = optimal.recompute_bound(trace, 301)
    assert fits["status"] == "ok" and fits["exact"] and fits["recompute_ns"] == 0
    one = optimal.recompute_bound(trace, 201)
    assert one["status"] == "ok" and one["exact"]
    assert one["recompute_ns"] == pytest.approx(10)
    # Below what call h needs with the constant: no run fits.
    none = optimal.recompute_bound(trace, 100)
    assert none["status"] == "infeasible" and none["recompute_ns"] is None


# b is read again by k at the end; a, its input, is released long before.
B_COMES_BACK_THROUGH_A = [
    {"op": "constant", "id": "x", "bytes": 1},
    call("f", ["x"], "a", 100, 10),
    call("g", ["a"], "b", 100, 20),
    call("h", ["b"], "c", 100, 40),
    {"op": "release", "id": "a"},
    call("e", ["x"], "e", 100, 1),
    {"op": "use", "ids": ["c", "e"]},
    {"op": "release", "id": "c"},
    {"op": "release", "id": "e"},
    call("k", ["b"], "d", 100, 5),
]


def test_a_recompute_needs_its_inputs_back_first(tmp_path):
    # b is read again by k at the end, but while e is made, with c kept for
    # the use, there is no room for it: it goes (c would cost 40), and coming
    # back needs a, released long ago, which must come back first: 20 + 10.
    # The simulator's policies pay at least that.
    path = write(tmp_path, B_COMES_BACK_THROUGH_A)
    trace = optimal.read_trace(path)
    bound = optimal.recompute_bound(trace, 201)
    assert bound["status"] == "ok" and bound["exact"]
    assert bound["recompute_ns"] == pytest.approx(30)
    # With room for b as well, nothing comes back.
    assert optimal.recompute_bound(trace, 301)["recompute_ns"] == pytest.approx(0)
    binary = remat_binary()
    for policy in ("lru", "dtr", "belady"):
        sim = run_sim(binary, path, policy, ("--budget", "201"))
        assert sim["status"] == "ok", (policy, sim.get("message"))
        assert sim["recompute_ns"] >= 30, policy
    # The solver's plan, replayed, does just that: b goes, and a and b come
    # back for k; nothing is left to the policy.
    solved, run = plan_and_replay(binary, path, 201, tmp_path)
    assert solved["plan_overhead"] == pytest.approx(solved["overhead_bound"])
    assert run["status"] == "ok", run.get("message")
    assert run["recompute_ns"] == 30
    assert run["pressure_events"] == 0
    assert run["directed_evictions"] >= 1


def test_a_plan_is_written_as_evict_and_prefetch_records_and_never_over_a_file(tmp_path, capsys):
    path = write(tmp_path, B_COMES_BACK_THROUGH_A)
    plan = tmp_path / "plan.jsonl"
    assert optimal.main([path, "--budget", "201", "--plan-out", str(plan), "--json"]) == 0
    original = [json.loads(line) for line in open(path)]
    planned = [json.loads(line) for line in plan.read_text().splitlines()]
    # The trace's own records, in order, with the plan's between them.
    assert [r for r in planned if r["op"] not in ("evict", "prefetch")] == original
    evicts = [r for r in planned if r["op"] == "evict"]
    assert {"op": "evict", "id": "b", "action": "drop"} in evicts
    # b is brought back (recomputed) in k's stage, before k.
    k_at = next(i for i, r in enumerate(planned) if r.get("name") == "k")
    assert {"op": "prefetch", "id": "b"} in planned[:k_at]
    # A planned trace reads as its trace: the same bound.
    again = optimal.recompute_bound(optimal.read_trace(str(plan)), 201)
    assert again["recompute_ns"] == pytest.approx(30)
    # Never over an existing file.
    before = plan.read_text()
    assert optimal.main([path, "--budget", "201", "--plan-out", str(plan)]) == 2
    assert plan.read_text() == before
    # Nor where it cannot be written: refused before the solver runs.
    nowhere = tmp_path / "no" / "dir" / "plan.jsonl"
    capsys.readouterr()
    assert optimal.main([path, "--budget", "201", "--plan-out", str(nowhere)]) == 2
    assert "--plan-out: cannot create: no directory" in capsys.readouterr().err.replace(
        str(nowhere), "--plan-out")
    assert not (tmp_path / "no").exists()
    # No plan where nothing fits: said, and no file.
    missing = tmp_path / "none.jsonl"
    assert optimal.main([path, "--budget", "150", "--plan-out", str(missing)]) == 3
    assert not missing.exists()


@pytest.mark.parametrize("model", ["chain:n=12",
                                   "gpt2:layers=1,hidden=64,heads=2,seq=64,batch=2,vocab=100"])
def test_no_policy_beats_the_bound(tmp_path, model):
    binary = remat_binary()
    path = str(tmp_path / "m.jsonl")
    subprocess.run([binary, "gen", model, "-o", path], check=True, capture_output=True)
    trace = optimal.read_trace(path)
    ran = 0
    for ratio in (0.5, 0.7, 0.9):
        sims = {p: run_sim(binary, path, p, ("--budget-ratio", str(ratio)))
                for p in ("lru", "largest", "dtr", "dtr-eq", "msps", "window", "belady")}
        any_sim = next(iter(sims.values()))
        # The same budget and the same baseline as the simulator's.
        assert any_sim["baseline_peak_live_bytes"] == trace.peak_live_bytes
        assert any_sim["baseline_ns"] == trace.compute_ns
        bound = optimal.recompute_bound(trace, any_sim["budget_bytes"], time_limit=20)
        for policy, sim in sims.items():
            if sim["status"] != "ok":
                continue
            ran += 1
            assert bound["status"] == "ok", (policy, ratio)
            assert sim["time_ns"] >= trace.compute_ns + bound["recompute_ns"] - 1e-6, \
                (policy, ratio, sim["time_ns"], bound)
        if bound["status"] == "ok":
            # The plan is a real run: it finishes, at or above the bound.
            _, run = plan_and_replay(binary, path, any_sim["budget_bytes"], tmp_path)
            assert run["status"] == "ok", (ratio, run.get("message"))
            assert run["time_ns"] >= trace.compute_ns + bound["recompute_ns"] - 1e-6, ratio
    assert ran > 0


def test_the_plan_of_a_recorded_step_is_the_optimum_where_it_meets_the_bound(tmp_path):
    # The MLP step recorded from PyTorch, at 0.7 of its peak: the plan,
    # replayed, costs what the bound says no run can beat (so it is the
    # optimum), and less than dtr's 1.84 (bench/results).
    binary = remat_binary()
    path = os.path.join(ROOT, "examples", "traces", "mlp_small_l4_h256_t512.jsonl")
    trace = optimal.read_trace(path)
    budget = int(0.7 * trace.peak_live_bytes)
    solved, run = plan_and_replay(binary, path, budget, tmp_path)
    assert solved["exact"]
    assert run["status"] == "ok", run.get("message")
    assert run["overhead"] == pytest.approx(solved["overhead_bound"], rel=1e-3)
    dtr = run_sim(binary, path, "dtr", ("--budget", str(budget)))
    assert dtr["status"] != "ok" or dtr["overhead"] > run["overhead"]


@pytest.mark.parametrize("case", ["use", "released_output", "kept_regenerated"])
def test_steps_where_a_tighter_program_once_excluded_real_runs(tmp_path, case):
    # A use reads its tensors one at a time: a recompute its second read
    # brings on is not there during the first. A recompute regenerates no
    # output released with nothing reading it. A released tensor a
    # regeneration brought back stays while a dropped consumer the program
    # holds needs it (x, for c2: recomputed once, not twice; dropped after
    # c1's regeneration, the run thrashes). Runs pay 10, 5 and 1002 ns, and
    # the bound must not be above that.
    lines, budget, paid = {
        "use": ([call("pa", [], "a", 150, 1000), call("pb", [], "b", 50, 10),
                 call("pd", [], "d", 100, 1000), {"op": "use", "ids": ["a", "b"]},
                 {"op": "release", "id": "a"}, {"op": "use", "ids": ["b", "d"]}], 250, 10),
        "released_output": ([
            {"op": "call", "name": "p", "inputs": [], "cost_ns": 5,
             "outputs": [{"id": "o1", "bytes": 1000}, {"id": "o2", "bytes": 10}]},
            {"op": "release", "id": "o1"}, call("q", [], "x", 500, 1000),
            call("s", [], "z", 595, 1000), {"op": "release", "id": "z"},
            {"op": "use", "ids": ["x", "o2"]}, {"op": "use", "ids": ["x"]}], 1100, 5),
        "kept_regenerated": ([
            {"op": "constant", "id": "i", "bytes": 10}, call("px", ["i"], "x", 10, 1000),
            call("g", ["x"], "c1", 100, 1), call("h", ["x"], "c2", 150, 1),
            {"op": "release", "id": "x"}, call("big", [], "b", 155, 1),
            {"op": "release", "id": "b"},
            {"op": "use", "ids": ["c1"]}, {"op": "use", "ids": ["c2"]}], 170, 1002),
    }[case]
    path = write(tmp_path, lines)
    bound = optimal.recompute_bound(optimal.read_trace(path), budget)
    assert bound["status"] == "ok" and bound["exact"]
    assert bound["recompute_ns"] == pytest.approx(paid)
    binary = remat_binary()
    sim = run_sim(binary, path, "dtr", ("--budget", str(budget)))
    assert sim["status"] == "ok" and sim["recompute_ns"] == paid


def random_step(rng):
    """A small random step: calls of one or two outputs (now and then a view),
    uses, releases, perhaps a constant."""
    recs, live, n = [], [], 0
    if rng.random() < 0.5:
        recs.append({"op": "constant", "id": "w", "bytes": rng.choice([10, 30])})
        live.append("w")
    for i in range(rng.randint(4, 9)):
        if rng.random() < 0.2 and len(live) >= 2:
            recs.append({"op": "use", "ids": rng.sample(live, min(len(live), 3))})
        else:
            inputs = rng.sample(live, min(len(live), rng.randint(0, 2)))
            outputs = []
            for _ in range(1 if rng.random() < 0.7 else 2):
                n += 1
                outputs.append({"id": f"t{n}", "bytes": rng.choice([0, 10, 20, 50, 100])})
            bases = [x for x in inputs if x != "w"]
            if bases and rng.random() < 0.15:
                n += 1
                outputs.append({"id": f"t{n}", "alias_of": bases[0]})
            recs.append({"op": "call", "name": f"c{i}", "inputs": inputs, "outputs": outputs,
                         "cost_ns": rng.choice([1, 5, 10, 100, 1000])})
            live += [o["id"] for o in outputs]
        if live and rng.random() < 0.4:
            gone = rng.choice(live)
            recs.append({"op": "release", "id": gone})
            live.remove(gone)
    if [x for x in live if x != "w"]:
        recs.append({"op": "use", "ids": [x for x in live if x != "w"][:3]})
    return recs


def test_on_random_steps_no_run_is_below_the_bound_and_every_plan_replays(tmp_path):
    import random
    binary = remat_binary()
    rng = random.Random(17)
    checked = planned = 0
    for case in range(30):
        path = write(tmp_path, random_step(rng))
        trace = optimal.read_trace(path)
        for ratio in (0.5, 0.8):
            budget = max(1, int(ratio * trace.peak_live_bytes))
            bound = optimal.recompute_bound(trace, budget, time_limit=10)
            runs = {p: run_sim(binary, path, p, ("--budget", str(budget)),
                               extra=("--thrash-limit", "100"))
                    for p in ("dtr", "lru", "largest")}
            for policy, run in runs.items():
                if run["status"] != "ok":
                    continue
                assert bound["status"] == "ok", (case, ratio, policy, bound)
                assert run["recompute_ns"] >= bound["recompute_ns"] - 1e-6, \
                    (case, ratio, policy, run["recompute_ns"], bound)
                checked += 1
            if bound["status"] == "ok":
                (tmp_path / f"plan_{budget}.jsonl").unlink(missing_ok=True)
                _, run = plan_and_replay(binary, path, budget, tmp_path)
                assert run["status"] == "ok", (case, ratio, run.get("message"))
                assert run["recompute_ns"] >= bound["recompute_ns"] - 1e-6, (case, ratio)
                planned += 1
    assert checked > 50 and planned > 20, (checked, planned)


def test_a_use_reads_its_tensors_one_at_a_time(tmp_path):
    # As the simulator does: a use of a and b needs room for one of them at a
    # time (each read brings it back), not both.
    path = write(tmp_path, [
        {"op": "constant", "id": "x", "bytes": 1},
        call("f", ["x"], "a", 100, 10),
        call("g", ["x"], "b", 100, 10),
        {"op": "use", "ids": ["a", "b"]},
    ])
    trace = optimal.read_trace(path)
    bound = optimal.recompute_bound(trace, 150)
    assert bound["status"] == "ok" and bound["exact"]
    assert bound["recompute_ns"] == pytest.approx(10)  # a goes while b is made
    binary = remat_binary()
    sim = run_sim(binary, path, "lru", ("--budget", "150"))
    assert sim["status"] == "ok", sim.get("message")
    assert sim["recompute_ns"] >= bound["recompute_ns"]


def test_a_program_too_large_is_not_built_and_says_so(tmp_path):
    path = write(tmp_path, [{"op": "constant", "id": "x", "bytes": 1}] +
                 [call(f"f{i}", ["x"] if i == 0 else [f"a{i - 1}"], f"a{i}", 100, 10)
                  for i in range(30)] + [{"op": "use", "ids": [f"a{i}" for i in range(30)]}])
    trace = optimal.read_trace(path)
    big = optimal.recompute_bound(trace, 3001, max_variables=100)
    assert big["status"] == "too_large" and not big["exact"]
    assert big["recompute_ns"] == 0.0
    assert "over 100 variables" in big["message"]


def test_the_sweep_shows_the_bound_beside_the_policies(tmp_path):
    binary = remat_binary()
    env = dict(os.environ, REMAT_PYTHON=sys.executable)
    out = subprocess.run([binary, "sweep", "--model", "chain:n=12", "--ratios", "0.7,0.9",
                          "--policies", "lru,dtr", "--accounting", "live", "--no-swap",
                          "--bound", "--no-plot", "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert_sweep_cells_above_the_bound(out.stdout, ["lru", "dtr"], finished_at_least=4)
    assert "no drop-only run can take less" in out.stdout
    # Not a bound under a reserved budget: refused.
    refused = subprocess.run([binary, "sweep", "--model", "chain:n=12", "--ratios", "0.7",
                              "--bound", "--out", str(tmp_path / "r")],
                             capture_output=True, text=True, env=env)
    assert refused.returncode == 2
    assert "--accounting live" in refused.stderr


def test_a_read_of_a_released_tensor_is_refused(tmp_path):
    path = write(tmp_path, [
        {"op": "constant", "id": "x", "bytes": 1},
        call("f", ["x"], "a", 100, 10),
        {"op": "release", "id": "a"},
        {"op": "use", "ids": ["a"]},
    ])
    with pytest.raises(ValueError, match=r"t.jsonl:4: 'a' was released"):
        optimal.read_trace(path)


def test_a_line_past_the_cap_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    path = write(tmp_path, [{"op": "constant", "id": "x", "bytes": 1}])
    with open(path, "a", encoding="utf-8") as f:
        f.write("x" * 5000)  # no newline
    monkeypatch.setattr(op_trace, "MAX_LINE", 1000)
    with pytest.raises(ValueError, match=r"t.jsonl:2: the line is longer than 1000"):
        optimal.read_trace(path)
    monkeypatch.setattr(op_trace, "MAX_LINE", 10000)
    with pytest.raises(ValueError, match=r"t.jsonl:2"):  # read, and found not JSON
        optimal.read_trace(path)


def test_the_command_line(tmp_path, capsys):
    path = write(tmp_path, [
        {"op": "constant", "id": "x", "bytes": 1},
        call("f", ["x"], "a", 100, 10),
        call("g", ["x"], "b", 100, 50),
        call("h", ["x"], "c", 100, 30),
        {"op": "use", "ids": ["a", "b"]},
    ])
    assert optimal.main([path, "--budget", "401", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["overhead_bound"] == pytest.approx(1.0)
    assert optimal.main([path, "--budget", "50"]) == 3
    assert "no drop-only run fits" in capsys.readouterr().out
    assert optimal.main([path, "--budget-ratio", "0"]) == 2
    assert optimal.main([str(tmp_path / "missing.jsonl"), "--budget-ratio", "0.5"]) == 2


def test_a_copy_back_costs_only_the_wait_it_cannot_hide(tmp_path):
    # One of a (1,000 ns to recompute) and b (5,000 ns) must go while c is
    # made. A copy back holds memory from its start, so it cannot overlap h
    # (no byte to spare then) but can overlap k (2,000 ns, with room for one
    # of them). At 1 GB/s (1,000 ns) it hides behind k: nothing added. At 0.4
    # GB/s (2,500 ns) the run waits 500 ns, less than a recompute. At 0.1
    # GB/s, recomputing a is cheaper.
    path = write(tmp_path, [
        {"op": "constant", "id": "x", "bytes": 1},
        call("f", ["x"], "a", 1000, 1000),
        call("g", ["x"], "b", 1000, 5000),
        call("h", ["x"], "c", 1000, 30),
        {"op": "release", "id": "c"},
        call("k", ["x"], "d", 0, 2000),
        {"op": "release", "id": "d"},
        {"op": "use", "ids": ["a"]},
        {"op": "use", "ids": ["b"]},
    ])
    trace = optimal.read_trace(path)
    drop_only = optimal.recompute_bound(trace, 2001)
    assert drop_only["recompute_ns"] == pytest.approx(1000)

    def added(gbps, latency_ns=0):
        bound = optimal.recompute_bound(trace, 2001, link_gbps=gbps, link_latency_ns=latency_ns)
        assert bound["status"] == "ok" and bound["exact"], bound
        return bound["recompute_ns"]

    assert added(1) == pytest.approx(0)
    assert added(0.4) == pytest.approx(500)
    # (The bound counts a copy's bytes where it holds memory, not its
    # latency: a latency can only raise the wait.)
    assert added(0.4, latency_ns=100) >= 500 - 1e-6
    assert added(0.1) == pytest.approx(1000)
    # Where nothing fits, nothing fits with a link either.
    assert optimal.recompute_bound(trace, 1000, link_gbps=1)["status"] == "infeasible"
    with pytest.raises(ValueError, match="rate above 0"):
        optimal.recompute_bound(trace, 2001, link_gbps=0)


@pytest.mark.parametrize("model", ["chain:n=8",
                                   "gpt2:layers=1,hidden=64,heads=2,seq=64,batch=2,vocab=100"])
def test_no_run_with_offloads_beats_the_offload_bound(tmp_path, model):
    binary = remat_binary()
    path = str(tmp_path / "m.jsonl")
    subprocess.run([binary, "gen", model, "-o", path], check=True, capture_output=True)
    trace = optimal.read_trace(path)
    ran = offloaded = 0
    for gbps in (25, 2):
        for ratio in (0.5, 0.8):
            # Mixed runs (the cheaper of mixed and drop-only, as remat sim
            # keeps), mixed runs as planned, and runs that only offload.
            sims = {}
            for extra in ((), ("--no-offload-guard",), ("--no-recompute",)):
                for p in ("lru", "dtr", "msps", "hybrid"):
                    sims[(p,) + extra] = run_sim(binary, path, p, ("--budget-ratio", str(ratio)),
                                                 link_gbps=gbps, extra=extra)
            budget = next(iter(sims.values()))["budget_bytes"]
            # (At the time limit, the solver's proven bound: still a bound.)
            bound = optimal.recompute_bound(trace, budget, time_limit=4, link_gbps=gbps,
                                            link_latency_ns=2000)
            drop_only = optimal.recompute_bound(trace, budget, time_limit=4)
            if drop_only["status"] == "ok" and drop_only["exact"]:
                # More plans: never a higher bound than drop-only's.
                assert bound["status"] == "ok"
                assert bound["recompute_ns"] <= drop_only["recompute_ns"] + 1e-6
            for policy, sim in sims.items():
                if sim["status"] != "ok":
                    continue
                ran += 1
                offloaded += sim["offloaded_bytes"] > 0
                assert bound["status"] == "ok", (policy, ratio, gbps)
                assert sim["time_ns"] >= trace.compute_ns + bound["recompute_ns"] - 1e-6, \
                    (policy, ratio, gbps, sim["time_ns"], bound)
    assert ran > 0 and offloaded > 0


def test_the_sweep_shows_the_offload_bound_where_runs_may_offload(tmp_path):
    binary = remat_binary()
    env = dict(os.environ, REMAT_PYTHON=sys.executable)
    out = subprocess.run([binary, "sweep", "--model", "chain:n=8", "--ratios", "0.6,0.8",
                          "--policies", "dtr,hybrid", "--accounting", "live", "--link-gbps", "2",
                          "--bound", "--bound-time-limit", "5", "--no-plot",
                          "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert_sweep_cells_above_the_bound(out.stdout, ["dtr", "hybrid"])
    assert "no run, dropping or offloading, can take less" in out.stdout
    assert "--offload" in out.stdout


def test_the_command_line_with_offloads(tmp_path, capsys):
    path = write(tmp_path, [
        {"op": "constant", "id": "x", "bytes": 1},
        call("f", ["x"], "a", 100, 10),
        call("g", ["x"], "b", 100, 50),
        call("h", ["x"], "c", 100, 30),
        {"op": "use", "ids": ["a", "b"]},
    ])
    assert optimal.main([path, "--budget", "301", "--offload", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["offload"] is True and out["status"] == "ok"
    assert optimal.main([path, "--budget", "301", "--offload", "--link-gbps", "0"]) == 2
    assert "--link-gbps" in capsys.readouterr().err
    assert optimal.main([path, "--budget", "301", "--offload"]) == 0
    assert "runs that may offload at 25 GB/s" in capsys.readouterr().out
