"""remat.torch.budget with budgets out of range, and the errors a user
meets: each says the cause and the way out."""

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch import BudgetTooSmall, models  # noqa: E402
from remat.torch import _budget  # noqa: E402

from test_budget import assert_same_grads  # noqa: E402


def _tiny(seed):
    return models.mlp(seed, width=8, depth=2, batch=2)


def _grads_of(make, b=None):
    """One step of make's model (seed 0), under budget b if given: the
    gradients by name."""
    model, step = make(0)
    torch.manual_seed(1)
    if b is None:
        step().backward()
    else:
        with b:
            step().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("size", [1 << 64, (1 << 65) + 30000, "20000000TB", 2.0 ** 70])
def test_a_budget_beyond_64_bits_is_refused(size):
    # (It wrapped: 2**65 + 30000 enforced 30000 bytes.)
    with pytest.raises(ValueError, match=r"2\*\*64|size"):
        remat.torch.budget(size)


@pytest.mark.parametrize("size", [0, "0GiB", -1, "-1GiB", "lots", 1.5])
def test_a_budget_of_nothing_or_less_is_refused(size):
    with pytest.raises(ValueError, match="budget") as info:
        remat.torch.budget(size)
    assert "give" in str(info.value)


def test_the_largest_budget_holds_everything():
    plain = _grads_of(_tiny)
    b = remat.torch.budget(_budget.MAX_BUDGET_BYTES)
    assert_same_grads(plain, _grads_of(_tiny, b))
    assert b.stats["budget_bytes"] == (1 << 64) - 1 and b.stats["drops"] == 0
    b.close()


def test_live_stats_outside_the_with():
    b = remat.torch.budget(160, policy="dtr")
    before = b.live_stats()
    assert before["step"] == 0 and before["budget_bytes"] == 160
    assert all(v == 0 for k, v in before.items()
               if k not in ("step", "budget_bytes") and isinstance(v, int))
    for step in (1, 2):
        _grads_of(_tiny, b)
        assert b.live_stats() == b.stats and b.live_stats()["step"] == step
    assert set(before) == set(b.stats)
    with b:
        assert b.live_stats()["step"] == 3
    b.close()


def _short(message):
    assert len(message.splitlines()) <= 2
    assert "remat_" not in message and "#" not in message


def test_a_budget_too_small_for_what_a_write_pinned_says_why_and_what_to_do():
    # A write into a tensor made before the budget keeps what was computed
    # from it to the step's end: the error names that write and its fix.
    x = torch.randn(32, 64)
    w = torch.randn(64, 64, requires_grad=True)
    with pytest.raises(BudgetTooSmall) as info:
        with remat.torch.budget(32 * 64 * 4 + 100):
            a = (x * 2).sin()
            b = (a @ w).tanh()
            x.add_(1)
            (b @ w).tanh().sum().backward()
    message = str(info.value)
    _short(message)
    assert "kept to the step's end" in message
    assert "made before the budget" in message and "aten.add_" in message
    assert "out of place" in message and "raise the budget to at least" in message


def test_a_budget_too_small_for_what_the_backward_reads_says_so():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    with pytest.raises(BudgetTooSmall) as info:
        with remat.torch.budget(12 * 1024, policy="lru"):
            a = (x @ w).exp()
            b = (x @ w * 0.5).exp()
            (a * b).sum().backward()
    message = str(info.value)
    _short(message)
    assert "the backward is reading now" in message and "at least 16384 bytes" in message


