"""remat.torch.budget on models written the ways people write them
(remat.torch.zoo): in each mode, at 0.7 of the plain step's saved bytes, the
same loss and bitwise the same gradients and buffers as a plain step, within
the budget, and something evicted."""

import functools

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch.zoo import ZOO as MODELS, norms  # noqa: E402


MODES = {"drop": {}, "offload": {"offload": True, "recompute": False},
         "hybrid": {"offload": True}}


def _step(make, budget=None):
    model, step = make(0)
    model.train()
    torch.manual_seed(1)
    with budget if budget is not None else _nothing() as run:
        loss = step()
        loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b for n, b in model.named_buffers()}
    return loss.detach(), grads, buffers, run


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@functools.cache
def _plain(name):
    loss, grads, buffers, _ = _step(MODELS[name])
    _, _, _, run = _step(MODELS[name], remat.torch.budget(1 << 40))
    return loss, grads, buffers, run.stats["peak_saved_bytes"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(MODELS))
def test_the_same_step_under_a_budget(name, mode):
    # Hybrid runs a loop through the offload guard's trial (both plans) and
    # a step of the plan it keeps; the other modes one step.
    torch.set_num_threads(1)
    loss, grads, buffers, saved = _plain(name)
    budget = remat.torch.budget(int(saved * 0.7), policy="dtr", **MODES[mode])
    steps = 2 * remat.torch.budget.TRIAL_STEPS + 1 if mode == "hybrid" else 1
    for _ in range(steps):
        got_loss, got_grads, got_buffers, run = _step(MODELS[name], budget)
        stats = run.stats
        assert torch.equal(got_loss, loss)
        assert got_grads.keys() == grads.keys()
        for n in grads:
            assert torch.equal(got_grads[n], grads[n]), f"gradient of {n} differs"
        for n in buffers:
            assert torch.equal(got_buffers[n], buffers[n]), f"buffer {n} differs"
        assert stats["peak_saved_bytes"] <= stats["budget_bytes"]
        assert stats["drops"] + stats["offloads"] > 0, stats
    assert "plans_refused" not in stats
    budget.close()


@pytest.mark.parametrize("ratio", [0.4, 0.5])
def test_running_statistics_written_after_a_recomputed_input_was_read(ratio):
    # InstanceNorm's running statistics are written after the repeat of them
    # that batch norm read and wrote: what reads that repeat's first content
    # cannot be replayed from the statistics any more, and is kept.
    torch.set_num_threads(1)
    loss, grads, buffers, saved = _plain("norms")
    budget = remat.torch.budget(int(saved * ratio), policy="dtr")
    got_loss, got_grads, got_buffers, run = _step(norms, budget)
    assert torch.equal(got_loss, loss)
    assert all(torch.equal(got_grads[n], grads[n]) for n in grads)
    assert all(torch.equal(got_buffers[n], buffers[n]) for n in buffers)
    assert run.stats["drops"] > 0 and run.stats["kept_not_replayable"] > 0


def test_a_loop_in_hybrid_runs_both_plans_of_the_trial():
    # nn.LSTM at 0.3 of its saved bytes: some of a call's outputs are
    # offloaded rather than dropped (their replay would not fit), and each
    # output joins its call in the runtime only with outputs dropped alike,
    # so the trial's drop-first plan runs too, where it used to fail.
    torch.set_num_threads(1)
    loss, grads, _, saved = _plain("lstm")
    b = remat.torch.budget(int(saved * 0.3), policy="dtr", offload=True)
    for _ in range(2 * remat.torch.budget.TRIAL_STEPS + 1):
        got_loss, got_grads, _, run = _step(MODELS["lstm"], b)
        assert torch.equal(got_loss, loss)
        assert all(torch.equal(got_grads[n], grads[n]) for n in grads)
    assert "plans_refused" not in b.stats
    assert set(b.stats["plan_trial_seconds"]) == {"mixed", "drop-first"}
    b.close()


def test_the_drop_first_plan_does_what_drops_alone_do_where_they_fit():
    # The offload guard's second plan stands for drops alone in its trial:
    # where they fit (nn.LSTM at 0.5), it offloads nothing and drops what
    # drops alone drop, while the mixed plan offloads what its replay could
    # hardly bring back beside the rest.
    torch.set_num_threads(1)
    _, _, _, saved = _plain("lstm")
    alone = remat.torch.budget(int(saved * 0.5), policy="dtr")
    _step(MODELS["lstm"], alone)
    b = remat.torch.budget(int(saved * 0.5), policy="dtr", offload=True)
    steps = 2 * remat.torch.budget.TRIAL_STEPS
    figures = [_step(MODELS["lstm"], b)[3].stats for _ in range(steps)]
    mixed, drop_first = figures[:steps // 2], figures[steps // 2:]
    assert all(f["offload_not_drop"] > 0 and f["offloads"] > 0 for f in mixed)
    assert all(f["offloads"] == 0 and f["drops"] == alone.stats["drops"] for f in drop_first)
    b.close()
    alone.close()
