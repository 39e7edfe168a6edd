"""remat.torch.testing.models.tree_lstm: the step of many small tensors."""
import pytest

torch = pytest.importorskip("torch")

from remat.torch.testing import models  # noqa: E402


def test_tree_lstm_step_reaches_every_parameter():
    model, step = models.tree_lstm(0, hidden=8, leaves=8, batch=2, vocab=16)
    loss = step()
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_tree_lstm_is_seeded():
    losses = [models.tree_lstm(3, hidden=8, leaves=4, batch=2, vocab=16)[1]().item()
              for _ in range(2)]
    assert losses[0] == losses[1]


def test_tree_lstm_wants_a_complete_tree():
    with pytest.raises(ValueError, match="power of two"):
        models.tree_lstm(0, leaves=6)
