"""remat.torch.budget on a GPU (skipped without one): gradients equal to a
plain CUDA step's for the demo models, with drops and with offloads (pinned
host copies on a side stream), the offloads' copies made by the Python
recorder (the default with a GPU) and by the native step (native=True)."""
import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here", allow_module_level=True)

import remat.torch  # noqa: E402
from _blind import drop_first_drops_blindly  # noqa: E402
from remat.torch.testing import models  # noqa: E402


def step_grads(make, **budget):
    model, step = make(0, device="cuda")
    torch.manual_seed(1)
    torch.cuda.manual_seed(1)
    stats = None
    if budget:
        with remat.torch.budget(**budget) as run:
            step().backward()
        stats = run.stats
    else:
        step().backward()
    torch.cuda.synchronize()
    return [p.grad.clone() for p in model.parameters()], stats


@pytest.mark.parametrize("name", ["mlp", "gpt", "resnet", "lstm"])
@pytest.mark.parametrize("mode", ["drop", "offload", "hybrid", "offload-native",
                                  "hybrid-native"])
def test_cuda_gradients_equal(name, mode):
    make = getattr(models, name)
    torch.use_deterministic_algorithms(True, warn_only=True)
    plain, _ = step_grads(make)
    _, full = step_grads(make, budget=1 << 40)
    kw = {"drop": dict(recompute=True, offload=False, policy="dtr-eq"),
          "offload": dict(recompute=False, offload=True, policy="lru"),
          "hybrid": dict(recompute=True, offload=True, policy="hybrid"),
          "offload-native": dict(recompute=False, offload=True, policy="lru", native=True),
          "hybrid-native": dict(recompute=True, offload=True, policy="hybrid", native=True)}[mode]
    budget = int(full["peak_saved_bytes"] * 0.5)
    grads, stats = step_grads(make, budget=budget, **kw)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] + stats["offloads"] > 0
    for a, b in zip(plain, grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["lstm", "gru", "sdpa", "norms", "tied_lm"])
@pytest.mark.parametrize("mode", ["drop", "hybrid", "hybrid-native"])
def test_cuda_gradients_equal_on_the_zoo(name, mode):
    # nn.LSTM and nn.GRU run cuDNN's RNN, whose dropout between layers draws
    # from cuDNN's own random state: those calls are never replayed (kept or
    # offloaded), and the rest are, with the gradients of a plain step.
    from remat.torch.testing.zoo import ZOO
    torch.use_deterministic_algorithms(True, warn_only=True)
    make = ZOO[name]
    plain, _ = step_grads(make)
    _, full = step_grads(make, budget=1 << 40)
    kw = {"drop": {}, "hybrid": {"offload": True},
          "hybrid-native": {"offload": True, "native": True}}[mode]
    budget = int(full["peak_saved_bytes"] * 0.7)
    grads, stats = step_grads(make, budget=budget, policy="dtr", **kw)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] + stats["offloads"] > 0
    if name in ("lstm", "gru"):
        assert stats["debug"]["kept_not_replayable"] > 0
    for a, b in zip(plain, grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("native", [None, True], ids=["default", "native"])
def test_cuda_a_replay_that_does_not_fit_comes_back_from_its_pinned_copy(monkeypatch, native):
    # The drop-first plan's estimate made blind (it drops whatever the
    # runtime may): the drops no replay has been seen to fit are copied to
    # pinned host memory on the side stream, and a replay that cannot fit
    # comes back from its copy, with the plain CUDA step's gradients.
    from remat.torch.testing.zoo import ZOO
    drop_first_drops_blindly(monkeypatch)
    torch.use_deterministic_algorithms(True, warn_only=True)
    make = ZOO["transformer"]
    plain, _ = step_grads(make)
    _, full = step_grads(make, budget=1 << 40)
    b = remat.torch.budget(int(full["peak_saved_bytes"] * 0.15), policy="dtr", offload=True,
                           recompute=True, native=native)
    used = 0
    for _ in range(2 * remat.torch.budget.TRIAL_STEPS + 1):
        model, step = make(0, device="cuda")
        torch.manual_seed(1)
        torch.cuda.manual_seed(1)
        with b:
            step().backward()
        torch.cuda.synchronize()
        assert b.stats["peak_saved_bytes"] <= b.stats["budget_bytes"]
        for p, g in zip(model.parameters(), plain):
            assert torch.equal(p.grad, g)
        used += b.stats["debug"]["backups_used"]
    assert used > 0, "no replay failed: the test proves nothing"
    b.close()
