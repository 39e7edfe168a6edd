"""python -m remat.torch.bench on a tiny model: every row's gradients equal the
plain step's, and a remat row measures a loop's steady steps under one budget
(after the learning step, and the offload guard's trial where there is one)."""

import io

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch import bench, models  # noqa: E402


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
    assert rows["remat-hybrid"]["plan"] in ("mixed", "drop-only")
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
