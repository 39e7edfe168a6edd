"""remat.torch.budget on a GPU (skipped without one): gradients equal to a
plain CUDA step's for the demo models, with drops and with offloads (pinned
host copies on a side stream)."""
import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here", allow_module_level=True)

import remat.torch  # noqa: E402
from remat.torch import models  # noqa: E402


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
@pytest.mark.parametrize("mode", ["drop", "offload", "hybrid"])
def test_cuda_gradients_equal(name, mode):
    make = getattr(models, name)
    torch.use_deterministic_algorithms(True, warn_only=True)
    plain, _ = step_grads(make)
    _, full = step_grads(make, budget=1 << 40)
    kw = {"drop": dict(recompute=True, offload=False, policy="dtr-eq"),
          "offload": dict(recompute=False, offload=True, policy="lru"),
          "hybrid": dict(recompute=True, offload=True, policy="hybrid")}[mode]
    budget = int(full["peak_saved_bytes"] * 0.5)
    grads, stats = step_grads(make, budget=budget, **kw)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] + stats["offloads"] > 0
    for a, b in zip(plain, grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["lstm", "gru", "sdpa", "norms", "tied_lm"])
@pytest.mark.parametrize("mode", ["drop", "hybrid"])
def test_cuda_gradients_equal_on_the_zoo(name, mode):
    # nn.LSTM and nn.GRU run cuDNN's RNN, whose dropout between layers draws
    # from cuDNN's own random state: those calls are never replayed (kept or
    # offloaded), and the rest are, with the gradients of a plain step.
    from remat.torch.zoo import ZOO
    torch.use_deterministic_algorithms(True, warn_only=True)
    make = ZOO[name]
    plain, _ = step_grads(make)
    _, full = step_grads(make, budget=1 << 40)
    kw = {"drop": {}, "hybrid": {"offload": True}}[mode]
    budget = int(full["peak_saved_bytes"] * 0.7)
    grads, stats = step_grads(make, budget=budget, policy="dtr", **kw)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] + stats["offloads"] > 0
    if name in ("lstm", "gru"):
        assert stats["kept_not_replayable"] > 0
    for a, b in zip(plain, grads):
        assert torch.equal(a, b)
