"""What the budget's modules share: which calls are special, the garbage
collector's pause, the error type and its messages, and how a call's
arguments are flattened."""
import ctypes
import gc
import threading

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from remat import parse_size


# Calls whose outputs do not read the arguments they write into when they run
# in training mode (the running statistics): replayed, those arguments are
# scratch copies, so a recompute leaves the statistics alone.
_WRITES_UNREAD = {"native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm",
                  "miopen_batch_norm", "_batch_norm_with_update",
                  "_native_batch_norm_legit_functional"}
_NOT_REPLAYABLE_TAGS = ("data_dependent_output", "dynamic_output_shape")
# Operators that talk to other ranks: never run again by one rank alone.
_COLLECTIVES = {"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
                "_dtensor"}


# The budget open on each thread (they do not nest).
_active = {}

# Automatic garbage collection, paused while any budget with pause_gc is open
# (on any thread), and as it was before once none is.
_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


def _pause_gc():
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1


def _resume_gc():
    global _gc_pauses
    with _gc_lock:
        _gc_pauses -= 1
        if _gc_pauses == 0 and _gc_was_enabled:
            gc.enable()


# torch.OutOfMemoryError where this torch has it (2.1 on), a RuntimeError.
_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", RuntimeError)


# The figures `run.stats` shows (python/README.md says what each means);
# every other figure is under stats["debug"], for remat's own tests and
# benchmarks, and may change between versions.
USER_STATS = ("step", "budget_bytes", "peak_saved_bytes", "drops", "recomputes", "offloads",
              "restores", "plan", "policy", "recompute_seconds", "copy_seconds",
              "device_peak_bytes")


def _user_stats(figures):
    """`figures` (flat, or already shaped) as run.stats shows them: the
    user's figures, the rest under "debug". A new dict each time."""
    if "debug" in figures:
        return {**figures, "debug": dict(figures["debug"])}
    shown = {k: figures[k] for k in USER_STATS if k in figures}
    shown["debug"] = {k: v for k, v in figures.items() if k not in shown}
    return shown


class BudgetTooSmall(_OUT_OF_MEMORY):
    """The budget cannot hold what must be resident at once. A
    torch.OutOfMemoryError: code that catches PyTorch's out-of-memory (to
    shrink the batch, say) catches this too."""


_PYTHON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)


def _below_python_dispatch():
    """A context in which ATen calls skip the Python dispatch key (every
    TorchDispatchMode): for remat's own calls on plain tensors."""
    return torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY)


_id_arrays = {}


def _id_array(n):
    """ctypes' array type of n tensor ids, made once (each new array type is
    a reference cycle for the garbage collector)."""
    kind = _id_arrays.get(n)
    if kind is None:
        kind = _id_arrays[n] = ctypes.c_uint64 * n
    return kind


def _tag(name):
    return getattr(torch.Tag, name, None)


def _out_of_memory(exc):
    """Whether `exc` is an allocator's out-of-memory error: remat_malloc's
    ("CUDA out of memory. ..."), or torch.OutOfMemoryError."""
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc)


def _storage(t):
    """The untyped storage under t where t is a strided tensor with bytes of
    its own (what remat can hold), else None."""
    if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


_SIMPLE = (torch.Tensor, int, float, bool)


def _is_flat(seq):
    """A list or tuple holding no list, tuple or dict (its items are leaves)."""
    return all(type(x) not in (list, tuple, dict) for x in seq)


class _FlatSpec:
    """How to rebuild (args, kwargs) of the usual shape from their leaves:
    each positional argument a leaf (-1) or a list or tuple of leaves
    (type, count); each keyword argument a leaf."""
    __slots__ = ("args", "keys")

    def __init__(self, args, keys):
        self.args = args
        self.keys = keys

    def unflatten(self, leaves):
        args = []
        i = 0
        for shape in self.args:
            if shape == -1:
                args.append(leaves[i])
                i += 1
            else:
                kind, n = shape
                args.append(kind(leaves[i:i + n]))
                i += n
        return args, dict(zip(self.keys, leaves[i:]))


def _flatten_call(args, kwargs):
    """(leaves, spec) of a call's (args, kwargs): spec None for positional
    tensors and numbers only, a _FlatSpec for the usual shapes (a list of
    tensors, keyword arguments), else pytree's. The first two are flattened
    without pytree: it took a third of the recording's time, and its
    flatten leaves a reference cycle per call for the garbage collector."""
    if not kwargs and all(isinstance(a, _SIMPLE) for a in args):
        return list(args), None
    leaves = []
    shapes = []
    for a in args:
        kind = type(a)
        if kind is list or kind is tuple:
            if not _is_flat(a):
                return tree_flatten((args, kwargs))
            leaves.extend(a)
            shapes.append((kind, len(a)))
        elif kind is dict:
            return tree_flatten((args, kwargs))
        else:
            leaves.append(a)
            shapes.append(-1)
    for v in kwargs.values():
        if type(v) in (list, tuple, dict):
            return tree_flatten((args, kwargs))
        leaves.append(v)
    return leaves, _FlatSpec(tuple(shapes), tuple(kwargs))


def _leaf_count(a):
    """How many leaves one argument flattens to (as _flatten_call counts)."""
    kind = type(a)
    if kind is list or kind is tuple:
        if _is_flat(a):
            return len(a)
    elif kind is not dict:
        return 1
    return len(tree_flatten(a)[0])


def _unflatten_call(leaves, spec):
    if spec is None:
        return leaves, {}
    if type(spec) is _FlatSpec:
        return spec.unflatten(leaves)
    return tree_unflatten(leaves, spec)


def _flatten_result(result):
    kind = type(result)
    if isinstance(result, torch.Tensor):
        return [result]
    if (kind is tuple or kind is list) and _is_flat(result):
        return list(result)
    return tree_flatten(result)[0]




def _count(items):
    return f"{len(items)} tensor" + ("" if len(items) == 1 else "s")


def _hooks_disabled_code():
    fn = getattr(torch.autograd.graph, "disable_saved_tensors_hooks", None)
    fn = getattr(fn, "__wrapped__", None)
    return getattr(fn, "__code__", None)


_HOOKS_DISABLED_CODE = _hooks_disabled_code()


def _raised_in(exc, code):
    """Whether exc's traceback passes through a frame running `code`."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _chain(exc):
    """exc and the exceptions it was raised from or during."""
    seen = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _translated(exc, engine):
    """What a step's error should be where it leaves the budget, or None
    for itself. TorchScript's interpreter turns an exception raised inside
    a scripted module into a RuntimeError without it (not even its
    message): a BudgetTooSmall the step raised there is raised again as
    itself. A library that refuses saved-tensor hooks (torch.func, say)
    raises its own message: the budget's hooks are why, keep_saved() the
    way out."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, BudgetTooSmall):
        return None
    too_small = engine.too_small
    if too_small is not None and "TorchScript interpreter" in str(exc) and \
            all(e is not too_small for e in _chain(exc)):
        return too_small
    if _HOOKS_DISABLED_CODE is not None and _raised_in(exc, _HOOKS_DISABLED_CODE):
        return RuntimeError(
            f"{exc}\n(remat.torch.budget saves the step's tensors with saved-tensor hooks, "
            "which this code refuses: run it inside `with run.keep_saved():`)")
    return None


# The largest budget: what a 64-bit address space holds (the runtime counts
# bytes in 64 bits; a larger number would wrap).
MAX_BUDGET_BYTES = (1 << 64) - 1


def _budget_bytes(budget):
    """A budget's bytes: 1 to MAX_BUDGET_BYTES, an int or a size string
    (the same bound for both)."""
    try:
        nbytes = parse_size(budget)
    except ValueError as e:
        raise ValueError(f"remat.torch.budget: {e}; give bytes (an int) or a size such as "
                         "'2GiB'") from None
    if nbytes == 0:
        raise ValueError("a budget of 0 bytes holds nothing; give bytes or a size like '2GiB'")
    if nbytes > MAX_BUDGET_BYTES:
        raise ValueError(f"a budget of {budget!r} is more bytes than any device addresses "
                         f"(2**64); give at most {MAX_BUDGET_BYTES} bytes")
    return nbytes


