"""libremat_torch.so as PyTorch's CUDA allocator, and its pressure as the
source of remat.torch.budget's evictions.

With remat's allocator serving PyTorch, a budget can count what the GPU
really holds (every allocation of the process on that device: parameters,
gradients, optimizer state, the saved activations and the temporaries of
the step) rather than the saved bytes alone. The allocator is capped at the
budget while the `with` is open; when a request does not fit it first
releases its cache, then calls back into the budget, whose runtime evicts
saved activations by its policy until the request fits or nothing more can
go. The request then fails: remat_malloc raises, PyTorch raises that at the
call that asked (before any kernel could use a tensor without memory), and
the budget, which watches the allocator's count of failures, raises
BudgetTooSmall from it.
"""
import ctypes
import os

import torch

from remat import _capi


class Pressure(ctypes.Structure):
    """remat_torch_pressure: the request that did not fit, and the device's
    budget, reserved and allocated bytes."""
    _fields_ = [("bytes", ctypes.c_uint64), ("budget", ctypes.c_uint64),
                ("reserved", ctypes.c_uint64), ("allocated", ctypes.c_uint64),
                ("device", ctypes.c_int)]


PRESSURE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Pressure))


def find_library():
    """The path of libremat_torch.so: $REMAT_TORCH_LIB, the package's own
    copy, or a checkout's build/lib."""
    return _capi.find_library("libremat_torch.so", "REMAT_TORCH_LIB")


class Allocator:
    """libremat_torch.so, loaded, with the calls a budget makes on it."""

    def __init__(self, path):
        self.path = path
        so = ctypes.CDLL(path)
        u64, i = ctypes.c_uint64, ctypes.c_int
        sigs = {
            "remat_torch_last_error": (ctypes.c_char_p, []),
            "remat_torch_memory_stats": (i, [i, ctypes.POINTER(u64)]),
            "remat_torch_set_budget": (i, [i, u64]),
            "remat_torch_get_budget": (i, [i, ctypes.POINTER(u64)]),
            "remat_torch_reset_peak_stats": (i, [i]),
            "remat_torch_end_step": (i, [i]),
            "remat_torch_num_ooms": (i, [i, ctypes.POINTER(u64)]),
            "remat_torch_set_pressure_fn": (i, [i, PRESSURE_FN, ctypes.c_void_p]),
        }
        for name, (restype, argtypes) in sigs.items():
            fn = getattr(so, name, None)
            if fn is None:
                raise ImportError(f"{path} has no {name}: it is older than this package; "
                                  "install the package and its libraries together")
            fn.restype = restype
            fn.argtypes = argtypes
        self.so = so
        # Whether PyTorch tells it of a tensor's use on another stream
        # (record_stream); without that, copies run on the step's stream.
        self.records_streams = False
        self.installed = False  # PyTorch's allocator (use_allocator), not only attached

    def _check(self, result, what):
        if result != 0:
            raise RuntimeError(f"{what}: {self.so.remat_torch_last_error().decode()}")

    def memory_stats(self, device):
        """allocated, peak allocated, reserved, peak reserved (bytes)."""
        out = (ctypes.c_uint64 * 4)()
        self._check(self.so.remat_torch_memory_stats(device, out), "remat_torch_memory_stats")
        return {"allocated": out[0], "peak_allocated": out[1], "reserved": out[2],
                "peak_reserved": out[3]}

    def _u64(self, name, device):
        out = ctypes.c_uint64()
        self._check(getattr(self.so, name)(device, ctypes.byref(out)), name)
        return out.value

    def budget(self, device):
        return self._u64("remat_torch_get_budget", device)

    def set_budget(self, device, nbytes):
        self._check(self.so.remat_torch_set_budget(device, nbytes), "remat_torch_set_budget")

    def reset_peak(self, device):
        self._check(self.so.remat_torch_reset_peak_stats(device), "remat_torch_reset_peak_stats")

    def end_step(self, device):
        """A step ended: with expandable segments the next places its small
        blocks by what this one did (kept only where that held fewer pages)."""
        self._check(self.so.remat_torch_end_step(device), "remat_torch_end_step")

    def num_ooms(self, device):
        """Requests the allocator could not serve, since the process began."""
        return self._u64("remat_torch_num_ooms", device)

    def set_pressure_fn(self, device, fn):
        """fn: a PRESSURE_FN (kept alive by the caller), or None to remove."""
        self._check(self.so.remat_torch_set_pressure_fn(device, fn or PRESSURE_FN(), None),
                    "remat_torch_set_pressure_fn")


# The allocator use_allocator() installed (or a test attached), if any.
_current = None
# Devices whose pressure a budget is taking now: device -> that budget's engine.
_listening = {}


def current():
    return _current


def attach(path):
    """Loads libremat_torch.so at `path` as the allocator budgets talk to,
    without making it PyTorch's (the test suite's way in, on a simulated
    device)."""
    global _current
    _current = Allocator(path)
    return _current


def use_allocator(path=None):
    """Makes libremat_torch.so PyTorch's CUDA allocator, for the whole
    process; call it before the first CUDA allocation. Budgets entered
    afterwards (pressure="auto") count what the GPU holds, and remat's
    allocator's pressure drives their evictions. Returns the Allocator (its
    memory_stats(device) are remat's view of the GPU). Configured from the
    environment as libremat_torch.so always is (REMAT_BUDGET and the others,
    PYTORCH_CUDA_ALLOC_CONF's settings)."""
    global _current
    path = path or find_library()
    if _current is not None and _current.installed:
        if os.path.samefile(_current.path, path):
            return _current
        raise RuntimeError(f"remat's allocator is already installed from {_current.path}")
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, "remat_malloc", "remat_free")
    allocator = Allocator(path)
    # The optional hooks, where this PyTorch lets them be set: a tensor's use
    # on another stream (copies out on a side stream need it), and
    # torch.cuda.empty_cache().
    hooks = pluggable.allocator()
    for setter, symbol in (("set_record_stream_fn", "remat_record_stream"),
                           ("set_reset_fn", "remat_reset")):
        if hasattr(hooks, setter):
            getattr(hooks, setter)(ctypes.cast(getattr(allocator.so, symbol),
                                               ctypes.c_void_p).value)
            if symbol == "remat_record_stream":
                allocator.records_streams = True
    try:
        torch.cuda.memory.change_current_allocator(pluggable)
    except RuntimeError as e:
        raise RuntimeError("remat.torch.use_allocator() must come before the first CUDA "
                           f"allocation of the process: {e}") from e
    allocator.installed = True
    allocator.pluggable = pluggable
    _current = allocator
    return allocator
