"""The host link offloads are priced at: given, or measured on this machine."""
import math

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch import _budget, _link, models  # noqa: E402


def _step(b):
    model, step = models.mlp(0, width=8, depth=2, batch=2)
    with b:
        step().backward()
    return b.stats


@pytest.mark.parametrize("kw", [{"link_gbps": 0}, {"link_gbps": -1.0}, {"link_gbps": math.inf},
                                {"link_gbps": math.nan}, {"link_gbps": True},
                                {"link_gbps": "25"}, {"link_latency_us": -1}])
def test_a_link_that_cannot_be_is_refused(kw):
    with pytest.raises(ValueError, match="link_"):
        remat.torch.budget(1 << 20, offload=True, **kw)


def test_the_rates_given_are_what_the_runtime_prices_offloads_at():
    b = remat.torch.budget(1 << 30, offload=True, link_gbps=12.5, link_latency_us=3)
    stats = _step(b)
    assert (stats["debug"]["link_gbps"], stats["debug"]["link_latency_ns"]) == (12.5, 3000)
    b.close()


def test_without_rates_the_link_is_measured_once():
    gbps, latency_ns = _link.measure("cpu")
    assert gbps > 0 and latency_ns >= 0
    assert _link.measure("cpu") == (gbps, latency_ns)  # measured once per process
    b = remat.torch.budget(1 << 30, offload=True)
    stats = _step(b)
    assert (stats["debug"]["link_gbps"], stats["debug"]["link_latency_ns"]) == (gbps, latency_ns)
    b.close()
    # Drops alone copy nothing: no link is measured or shown.
    b = remat.torch.budget(1 << 30)
    assert "link_gbps" not in _step(b)["debug"]
    b.close()


def test_the_runtime_refuses_a_link_it_cannot_price():
    with pytest.raises(ValueError, match="finite positive bandwidth"):
        _budget._Session(1 << 20, "dtr", True, True, link=(math.nan, 0))
