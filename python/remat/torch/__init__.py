"""remat for PyTorch.

- `budget(bytes, policy=..., offload=..., recompute=...)`: a context manager
  under which a training step's saved activations are kept, dropped (to be
  recomputed by re-running the recorded ATen calls) or offloaded, so that no
  more than `bytes` of them are resident at once; gradients are unchanged.
- `use_allocator()`: makes remat's caching allocator (libremat_torch.so)
  PyTorch's CUDA allocator; budgets then count what the GPU holds, and the
  allocator's pressure drives their evictions.
- `record(step_fn, path)`: writes the op trace of `step_fn()` that
  `remat sim` replays (costs from FLOPs and bytes at a device's rates by
  default, measured with cost="measured").
"""
try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover: said plainly
    raise ImportError("remat.torch needs PyTorch: pip install 'remat[torch]' "
                      "(or pip install torch)") from e

from remat.torch._allocator import use_allocator
from remat.torch._budget import BudgetTooSmall, budget
from remat.torch._record import Recorder


def record(step_fn, path, cuda=False, cost="model", **rates):
    """Runs `step_fn()` under a recorder and writes its op trace to `path`
    (which must not exist: nothing is overwritten unless overwrite=True is
    given in `rates`). cost: "model" (FLOPs and bytes at tflops=, hbm_gbps=,
    launch_ns=) or "measured". Returns the number of records written."""
    import os

    from remat.torch import _record
    overwrite = rates.pop("overwrite", False)
    if not overwrite and os.path.exists(path):
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    return _record.record(lambda _rec: step_fn(), path, cuda=cuda, cost=cost, **rates)


__all__ = ["BudgetTooSmall", "Recorder", "budget", "record", "use_allocator"]
