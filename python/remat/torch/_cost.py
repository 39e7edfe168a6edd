"""What an ATen call costs on a device, from its FLOPs and the bytes it moves
(as `remat gen` costs its ops): max(launch_ns, FLOPs / tflops, bytes / hbm_gbps)."""
import math

import torch
from torch.utils.flop_counter import flop_registry

try:
    from torch.utils.flop_counter import shape_wrapper as _shape_wrapper
    # The code of the wrapper torch puts around a formula that takes shapes.
    _SHAPES_WRAPPER_CODE = _shape_wrapper(lambda *a, **k: 0).__code__
except (ImportError, AttributeError):  # pragma: no cover: another torch
    _SHAPES_WRAPPER_CODE = None
_ADDMM = torch.ops.aten.addmm
# mm's formula on shapes (addmm's counts as mm's), where torch has it so.
_MM_SHAPES = getattr(flop_registry.get(torch.ops.aten.mm), "__wrapped__", None)

COSTS = ("model", "measured")
# The device `--cost model` describes (as `remat gen`'s defaults).
DEFAULT_TFLOPS = 400.0
DEFAULT_HBM_GBPS = 3000.0
DEFAULT_LAUNCH_NS = 1000

# Operations that only describe a tensor and move no bytes: their cost is 0.
_FREE = {"aten::detach", "aten::view", "aten::_unsafe_view", "aten::alias", "aten::t",
         "aten::transpose", "aten::permute", "aten::expand", "aten::slice", "aten::select",
         "aten::split", "aten::split_with_sizes", "aten::unsqueeze", "aten::squeeze",
         "aten::as_strided", "aten::unbind", "aten::reshape", "aten::lift_fresh",
         # Splits whose pieces share the input's storage without being marked
         # as views (an LSTM cell's gates): nothing is copied.
         "aten::unsafe_split", "aten::unsafe_split_with_sizes", "aten::unsafe_chunk"}


_SIMPLE = (torch.Tensor, int, float, bool)


def _has_storage(t):
    """A tensor with bytes of its own somewhere (not sparse, not a wrapper)."""
    if not isinstance(t, torch.Tensor):
        return False
    try:
        t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _logical_bytes(t):
    return t.numel() * t.element_size()


def _leaf_signature(a):
    """What of one argument a call's cost can depend on: a tensor's shape and
    dtype, a list's items, any other value itself."""
    if isinstance(a, torch.Tensor):
        return (a.shape, a.dtype)
    kind = type(a)
    if kind is list or kind is tuple:
        return (kind, tuple(_leaf_signature(x) for x in a))
    if kind is dict:
        raise TypeError("a dict argument: not memoized")
    return a


def _signature(func, args, kwargs, flat_out):
    """A key for a call's cost (None: a dict argument, not memoized). Two
    calls with one key cost the same: the formulas read the arguments'
    shapes, dtypes and values, never their contents."""
    try:
        return (func, tuple(_leaf_signature(a) for a in args),
                tuple((k, _leaf_signature(v)) for k, v in kwargs.items()),
                tuple((t.shape, t.dtype) for t in flat_out if isinstance(t, torch.Tensor)),
                len(flat_out))
    except TypeError:
        return None


class CostModel:
    """An operation's cost on a device from its FLOPs and the bytes it moves:
    max(launch_ns, FLOPs / tflops, bytes / hbm_gbps) ns, rounded up."""

    def __init__(self, tflops=DEFAULT_TFLOPS, hbm_gbps=DEFAULT_HBM_GBPS,
                 launch_ns=DEFAULT_LAUNCH_NS):
        if not (tflops > 0 and math.isfinite(tflops)):
            raise ValueError("tflops must be a positive number")
        if not (hbm_gbps > 0 and math.isfinite(hbm_gbps)):
            raise ValueError("hbm_gbps must be a positive number")
        if launch_ns < 0:
            raise ValueError("launch_ns must not be negative")
        self.tflops = tflops
        self.hbm_gbps = hbm_gbps
        self.launch_ns = launch_ns
        # A training loop repeats its calls step after step: each one's cost
        # is worked out once (the formulas took a third of the recording's
        # time per call), and kept while there are few enough.
        self._memo = {}

    @staticmethod
    def flops(func, args, kwargs, result):
        """FLOPs of one call by torch.utils.flop_counter's formula for its
        operation; 0 where it has none."""
        formula = flop_registry.get(func.overloadpacket)
        if formula is None:
            return 0
        shapes_formula = getattr(formula, "__wrapped__", None)
        if shapes_formula is not None and _SHAPES_WRAPPER_CODE is not None and \
                getattr(formula, "__code__", None) is _SHAPES_WRAPPER_CODE and \
                isinstance(result, torch.Tensor) and all(isinstance(a, _SIMPLE) for a in args) \
                and all(isinstance(v, _SIMPLE) for v in kwargs.values()):
            if func.overloadpacket is _ADDMM and _MM_SHAPES is not None and len(args) >= 3:
                # torch's addmm formula calls mm's wrapped formula, which
                # walks the shapes with pytree again: mm's on the shapes.
                return _MM_SHAPES(args[1].shape, args[2].shape, out_shape=result.shape)
            # Inside torch's shape wrapper, the formula proper takes shapes:
            # handing it them directly skips the pytree walk the wrapper makes
            # to find them (most of the cost of a matmul's recording, and a
            # reference cycle per call for the garbage collector).
            return shapes_formula(*[a.shape if isinstance(a, torch.Tensor) else a for a in args],
                                  out_shape=result.shape,
                                  **{k: v.shape if isinstance(v, torch.Tensor) else v
                                     for k, v in kwargs.items()})
        return formula(*args, **kwargs, out_val=result)

    @staticmethod
    def moved(in_tensors, out_tensors):
        """Bytes read and written: every tensor argument and every tensor
        returned, at its logical size."""
        return sum(_logical_bytes(t) for t in in_tensors) + \
            sum(_logical_bytes(t) for t in out_tensors)

    def cost_ns(self, flops, moved):
        return int(max(self.launch_ns, math.ceil(flops / (self.tflops * 1e3)),
                       math.ceil(moved / self.hbm_gbps)))

    MEMO_LIMIT = 1 << 16

    def call_ns(self, func, args, kwargs, result, flat_in, flat_out, key=None):
        """What one call costs: cost_ns of its FLOPs and of the bytes of its
        tensor arguments and results. `key`: the call's signature where the
        caller made one (it has walked the arguments already), as _signature's
        (equal for calls that cost the same), but not equal to any of its."""
        if key is None:
            key = _signature(func, args, kwargs, flat_out)
        if key is not None:
            try:
                ns = self._memo.get(key)
            except TypeError:  # an argument that cannot be a key: costed afresh
                key = ns = None
            if ns is not None:
                return ns
        moved = self.moved([t for t in flat_in if isinstance(t, torch.Tensor)],
                           [t for t in flat_out if isinstance(t, torch.Tensor)])
        ns = self.cost_ns(self.flops(func, args, kwargs, result), moved)
        if key is not None:
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()  # shapes that keep changing: start again
            self._memo[key] = ns
        return ns
