"""python -m remat.torch.bench on a tiny model: every row's gradients equal the
plain step's, and a remat row measures a loop's steady steps under one budget
(after the learning step, and the offload guard's trial where there is one)."""

import io

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch import bench  # noqa: E402
from remat.torch.testing import models  # noqa: E402


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(bench.MODELS, "tiny",
                        (models.mlp, dict(width=64, depth=4, batch=16), "batch"))
    return "tiny"


def table(text):
    """The table's rows as dicts by header."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
            for line in lines[2:]]


def test_a_remat_row_is_measured_after_its_warm_up_under_one_budget(tiny, monkeypatch):
    made = []
    real = bench.row_budget

    def counted(method, ratio, saved_bytes, device_bytes=None):
        b = real(method, ratio, saved_bytes, device_bytes)
        if b is not None:
            made.append(b)
        return b
    monkeypatch.setattr(bench, "row_budget", counted)
    out = io.StringIO()
    bench.rows([tiny], [0.5], 2, "cpu", out)
    rows = {r["method"]: r for r in table(out.getvalue())}
    assert set(rows) >= {"plain", "checkpoint", "save_on_cpu", "remat-drop", "remat-offload",
                         "remat-hybrid"}
    for method, row in rows.items():
        assert row["grads equal"] == "yes", (method, row)
    # The measured steps come after the trial: the plan kept, not "trial".
    assert rows["remat-hybrid"]["plan"] in ("mixed", "drop-first")
    assert rows["remat-drop"]["plan"] == "drop-only"
    assert rows["remat-offload"]["plan"] == "offload-only"
    assert rows["plain"]["plan"] == "-"
    # One budget per row at x1, one per batch the "fits" column tried: each
    # entered for its warm-up and then for every measured step.
    assert len(made) >= 3 * 2
    assert all(b._engine is not None for b in made)


def test_warm_up_covers_the_offload_guards_trial():
    trial = 2 * remat.torch.budget.TRIAL_STEPS
    assert bench.warm_up_steps("remat-hybrid") == trial + 1
    assert bench.warm_up_steps("remat-drop") == 1
    assert bench.warm_up_steps("remat-offload") == 1


def test_size_large_gives_the_gpu_sized_models(monkeypatch):
    for name in bench.LARGE:
        monkeypatch.setitem(bench.MODELS, name, bench.MODELS[name])
    seen = {}
    monkeypatch.setattr(bench, "rows", lambda names, *a, **k: seen.update(
        {n: dict(bench.MODELS[n][1]) for n in names}))
    bench.main(["--size", "large", "--models", "gpt,lstm"])
    assert seen == {"gpt": bench.LARGE["gpt"], "lstm": bench.LARGE["lstm"]}


def test_methods_runs_only_the_rows_named(tiny):
    out = io.StringIO()
    bench.rows([tiny], [0.5], 1, "cpu", out, only=["checkpoint", "remat-drop"])
    rows = table(out.getvalue())
    assert [r["method"] for r in rows] == ["checkpoint", "remat-drop"]
    assert all(r["grads equal"] == "yes" for r in rows)


@pytest.mark.parametrize("argv, says", [
    (["--methods", "remat-dorp"], "unknown remat-dorp"),
    (["--methods", ","], "(none given)"),
    (["--methods", "compile-budget"], "need --compile"),
])
def test_methods_refuses_what_it_cannot_run(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(bench, "rows", lambda *a, **k: pytest.fail("ran rows"))
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert says in capsys.readouterr().err


def _overhead(*args, script="torch_overhead.py"):
    """bench/<script> run with `args`: (exit status, output)."""
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root / "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(root / "bench" / script), *args],
                         env=env, capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


def test_the_overhead_benchmark_runs_its_chain_and_its_models():
    status, text = _overhead("--steps", "2", "--ops", "9")
    assert status == 0, text
    assert "9 forward calls per step" in text and "us per forward call over plain" in text
    status, text = _overhead("--models", "mlp,gpt", "--steps", "2")
    assert status == 0, text
    for name in ("mlp", "gpt"):
        line = next(line for line in text.splitlines() if line.strip().startswith(name))
        assert "saved tensors" in line and "drops 0" in line, line
    status, text = _overhead("--models", "mlp,nope")
    assert status != 0 and "unknown ['nope']" in text
    status, text = _overhead("--steps", "2", "--ops", "9", "--ways", "native")
    assert status == 0, text
    assert "native budget, median:" in text and "  plain " in text
    assert "pass-through" not in text and "budget, gc running" not in text
    status, text = _overhead("--ways", "plain,nope")
    assert status != 0 and "--ways: unknown ['nope']" in text


def test_the_zoo_sweep_prints_a_row_per_model_and_mode():
    status, text = _overhead("--models", "in_place", "--step-ratio", "0.25", script="torch_zoo.py")
    assert status == 0, text
    rows = [line.split() for line in text.splitlines() if line.startswith("in_place")]
    assert [r[1] for r in rows] == ["drop", "offload", "hybrid"]
    for r in rows:
        assert len(r[2]) == 4 and set(r[2]) <= {".", "b"} and r[2][-1] == ".", r
    status, text = _overhead("--models", "nope", script="torch_zoo.py")
    assert status != 0 and "unknown model 'nope'" in text


def test_the_thread_count_is_pinned_and_said_and_the_spread_shown(tiny, capsys):
    before = torch.get_num_threads()
    try:
        bench.main(["--models", tiny, "--ratios", "0.5", "--repeat", "3", "--threads", "1",
                    "--methods", "plain,remat-drop"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    text = capsys.readouterr().out
    assert "1 thread(s)" in text.splitlines()[0]
    for row in table(text):
        low, high = (float(x) for x in row["step ms min-max"].split("-"))
        assert low <= float(row["step ms"]) <= high, row
    with pytest.raises(SystemExit):
        bench.main(["--threads", "0"])
