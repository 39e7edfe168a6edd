"""The host link offloads are priced at: given, or measured on this machine."""
import math

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch import _budget, _link  # noqa: E402
from remat.torch.testing import models  # noqa: E402


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


def test_without_rates_the_cpu_prices_at_the_runtimes_defaults():
    # (Measured, a host copy's rate would make CPU runs decide differently
    # from machine to machine and run to run.)
    b = remat.torch.budget(1 << 30, offload=True)
    stats = _step(b)
    assert (stats["debug"]["link_gbps"], stats["debug"]["link_latency_ns"]) == (25.0, 2000)
    assert _link.defaults() == (25.0, 2000)
    b.close()
    # Drops alone copy nothing: no link is shown.
    b = remat.torch.budget(1 << 30)
    assert "link_gbps" not in _step(b)["debug"]
    b.close()


def test_a_measured_link_is_measured_once_and_rounded():
    gbps, latency_ns = _link.measure("cpu")
    assert gbps > 0 and latency_ns >= 0 and latency_ns % 100 == 0
    assert _link.measure("cpu") == (gbps, latency_ns)
    assert _link._rounded(12.345, 3456) == (12.0, 3500)
    assert _link._rounded(0.1234, 49) == (0.12, 0)


def test_the_runtime_refuses_a_link_it_cannot_price():
    with pytest.raises(ValueError, match="finite positive bandwidth"):
        _budget._Session(1 << 20, "dtr", True, True, link=(math.nan, 0))
