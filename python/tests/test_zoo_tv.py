"""remat.torch.budget on torchvision's image classifiers (small, randomly
initialised: remat.torch.testing.zoo_tv): in each mode at half the plain step's
saved bytes, and in hybrid over the offload guard's trial at a fifth of
them or the smallest budget, in steps of a tenth, at which offload alone
runs (bench/torch_zoo.py --tv), the same loss, bitwise the same gradients
and the same batch-norm statistics as a plain step."""

import functools

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
pytest.importorskip("torchvision", reason="these models need torchvision "
                                          "(pip install torchvision)")

import remat.torch  # noqa: E402
from remat.torch.testing.zoo import run_step  # noqa: E402
from remat.torch.testing.zoo_tv import TV  # noqa: E402

MODES = {"drop": {}, "offload": {"offload": True, "recompute": False},
         "hybrid": {"offload": True}}


@functools.cache
def _plain(name):
    torch.set_num_threads(1)
    plain = run_step(TV[name])
    b = remat.torch.budget(1 << 40)
    run_step(TV[name], b)
    return plain, b.stats["peak_saved_bytes"]


def _check(name, budget, steps):
    (loss, grads, buffers), _ = _plain(name)
    for _ in range(steps):
        got_loss, got_grads, got_buffers = run_step(TV[name], budget)
        assert torch.equal(got_loss, loss)
        assert got_grads.keys() == grads.keys()
        for n in grads:
            assert torch.equal(got_grads[n], grads[n]), f"gradient of {n} differs"
        for n in buffers:
            assert torch.equal(got_buffers[n], buffers[n]), f"buffer {n} differs"
        assert budget.stats["peak_saved_bytes"] <= budget.stats["budget_bytes"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(TV))
def test_the_same_step_under_a_budget(name, mode):
    torch.set_num_threads(1)
    saved = _plain(name)[1]
    b = remat.torch.budget(int(saved * 0.5), policy="dtr", **MODES[mode])
    _check(name, b, 1)
    assert b.stats["drops"] + b.stats["offloads"] > 0
    b.close()


# Offload alone's smallest budget where it is above a fifth.
FLOOR = {"resnet18": 0.3, "squeezenet": 0.3, "densenet": 0.3}


@pytest.mark.parametrize("name", list(TV))
def test_a_hybrid_loop_near_the_floor(name):
    torch.set_num_threads(1)
    saved = _plain(name)[1]
    b = remat.torch.budget(int(saved * FLOOR.get(name, 0.2)), policy="dtr", offload=True)
    _check(name, b, 2 * remat.torch.budget.TRIAL_STEPS + 1)
    assert "plans_refused" not in b.stats["debug"]
    b.close()
