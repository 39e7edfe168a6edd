"""The native per-call path of remat.torch.budget (budget(..., native=True)).

The forward's ATen calls are recorded by a C++ RecordFunction callback, and
saved tensors go through saved-tensor hooks that are C functions: nothing
per call runs in Python. Dropped tensors are replayed through the
dispatcher. The C++ sources are in csrc/ beside this file; they are built
against the torch that is installed the first time a native budget opens
(about a minute, once per torch version) and cached under
$REMAT_CACHE_DIR (default ~/.cache/remat).

Offloaded tensors are copied to host memory and back by the step itself
(on a GPU on a side stream, into pinned memory), and with both offload and
recompute allowed each drop is admitted by the budget's step planner, which
learns from the step's replays. What it does not do yet (the Python recorder
does; budget(native=True) refuses it): the allocator-driven mode, and copies
made ahead (copy_ahead). Bytes handed outside autograd (numpy, DLPack,
data_ptr) are seen on the thread that records only.
"""
import collections
import contextlib
import hashlib
import os
import pathlib
import random
import re
import sys
import threading
import warnings
import weakref

import torch

from remat import _capi
from remat.torch import _interrupts

_HERE = pathlib.Path(__file__).resolve().parent
_SOURCES = [_HERE / "csrc" / "step.cc", _HERE / "csrc" / "module.cc"]

_lock = threading.Lock()
_module = None


def _header_dir():
    """Where remat.h is: the package's copy, or a checkout's."""
    for d in (_HERE.parent / "include", _HERE.parents[2] / "integrations" / "c_api"):
        if (d / "remat.h").is_file():
            return d
    raise ImportError("remat.h not found beside the package or in a checkout: reinstall remat "
                      "(`pip install .`)")


def _build_dir(name):
    root = pathlib.Path(os.environ.get("REMAT_CACHE_DIR") or
                        pathlib.Path.home() / ".cache" / "remat")
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    return d


_unavailable = []  # why the extension could not be built, once it could not


def available():
    """Whether the extension is here or can be built (a warning says why
    not, once per process)."""
    if _unavailable:
        return False
    try:
        module()
    except (ImportError, OSError) as e:  # (OSError: a cache directory it cannot write)
        _unavailable.append(str(e))
        warnings.warn(f"{e}\nremat.torch.budget records in Python (several times slower per "
                      "call); REMAT_TORCH_NATIVE=0 chooses that without trying", RuntimeWarning,
                      stacklevel=3)
        return False
    return True


def module():
    """The extension, built on first use against the installed torch."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        from torch.utils import cpp_extension
        library = pathlib.Path(_capi.find_library())
        version = re.sub(r"[^0-9A-Za-z]+", "_", torch.__version__)
        name = f"remat_native_torch_{version}"
        flags = ["-O2", "-DNDEBUG"]
        if os.environ.get("REMAT_NATIVE_DEBUG") == "1":
            # (remat's own debugging: symbols, no optimisation; NDEBUG stays,
            # as torch's headers were built with it.)
            name += "_debug"
            flags = ["-O0", "-g", "-DNDEBUG"]
        # One build per torch version, libremat.so (checkouts and installs
        # side by side do not rebuild each other's) and sources with remat.h
        # (a build against another C ABI's structs is never loaded).
        key = hashlib.sha1(str(library).encode())
        for source in list(_SOURCES) + [_HERE / "csrc" / "step.h", _header_dir() / "remat.h"]:
            key.update(pathlib.Path(source).read_bytes())
        where = key.hexdigest()[:10]
        build = _build_dir(f"{name}/{where}")
        if not any(build.glob(f"{name}*.so")):
            print(f"remat: building the native recorder for torch {torch.__version__} "
                  f"(once; about a minute) in {build}", file=sys.stderr, flush=True)
        try:
            mod = cpp_extension.load(
                name=name, sources=[str(s) for s in _SOURCES],
                extra_include_paths=[str(_header_dir())],
                extra_cflags=flags,
                extra_ldflags=[str(library), f"-Wl,-rpath,{library.parent}"],
                build_directory=str(build), verbose=False)
        except (RuntimeError, OSError, ImportError) as e:
            raise ImportError(
                f"remat could not build its native recorder for torch {torch.__version__}: "
                f"{e}\n(it needs a C++ compiler and ninja: `pip install ninja`; or use "
                "remat.torch.budget without native=True)") from e
        if mod.TORCH_VERSION.split("+")[0] != torch.__version__.split("+")[0]:
            raise ImportError(f"remat's native recorder in {build} was built for torch "
                              f"{mod.TORCH_VERSION}, and torch {torch.__version__} is installed: "
                              f"remove {build} to rebuild it")
        from remat.torch._common import BudgetTooSmall
        mod.set_python_hooks(_python_body, _foreign_rng, _set_foreign_rng)
        mod.set_budget_too_small(BudgetTooSmall)
        mod.set_inplace_error(_inplace_error)
        _module = mod
        return mod


# What hands a tensor's bytes outside autograd, where they may be written
# with no ATen call to record: wrapped while a native step is open, so that
# its step hears of it (Step.exported). Wrapping the few methods costs
# nothing per ATen call, where a torch-function mode costs every call.
_OUTSIDE = ("numpy", "__array__", "__dlpack__", "data_ptr")
_patch_lock = threading.Lock()
_patch_count = 0
_steps = {}  # thread id -> the native step open there


def _exporting(name, original):
    def wrapper(self, *args, **kwargs):
        step = _steps.get(threading.get_ident())
        if step is not None and isinstance(self, torch.Tensor):
            step.exported(self)
        return original(self, *args, **kwargs)
    wrapper.__name__ = name
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


# thread id -> (the step's saved-tensor hooks, a weak reference to the
# backward's _Owner that set them aside)
_aside = {}
# Threads running a backward through a wrapper (_backward).
_running = set()


class _Owner:
    """A backward that may set the hooks aside (its wrapper's frame holds it:
    once it is gone, so is the backward)."""
    __slots__ = ("__weakref__",)


@_interrupts.critical
def _set_aside(step, create_graph, owner):
    """Takes the step's saved-tensor hooks off the stack for a backward that
    builds no graph, where they are innermost (and not aside already, for an
    outer backward), for `owner` to put back."""
    ident = threading.get_ident()
    entry = _aside.get(ident)
    if entry is not None and entry[1]() is None:
        # Left aside by a backward that has ended: an interrupt came between
        # its end and its putting them back (and the program went on).
        put_back_hooks()
    if create_graph or ident in _aside:
        return
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if top is None or top[0] is not step.pack:
        return
    torch._C._autograd._pop_saved_tensors_default_hooks()
    _aside[ident] = (top, weakref.ref(owner))


@_interrupts.critical
def put_back_hooks(owner=None):
    """The hooks _set_aside took for `owner`, back on the stack (None: for
    whichever backward took them; the budget's exit, where an interrupt left
    a backward before it put them back)."""
    ident = threading.get_ident()
    if owner is None:
        _running.discard(ident)  # (a backward an interrupt cut short)
    entry = _aside.get(ident)
    if entry is not None and (owner is None or entry[1]() is owner):
        del _aside[ident]
        torch._C._autograd._push_saved_tensors_default_hooks(*entry[0])


def hooks_aside():
    """Whether a backward on this thread has the step's hooks set aside."""
    return threading.get_ident() in _aside


@_interrupts.critical
def _after_backward(step, owner):
    step.resume()
    put_back_hooks(owner)


def _backward(original, create_graph_at):
    """A backward with the recorder off on this thread: it records
    nothing there, and each call through RecordFunction costs its boxing.

    One that builds no graph (create_graph false: argument `create_graph_at`
    of `original`, or the keyword) runs with the step's saved-tensor hooks
    set aside too: it saves nothing, and autograd copies the hooks' stack
    into and out of every node it runs, each copy of a Python hook taking
    the GIL."""
    def wrapper(*args, **kwargs):
        ident = threading.get_ident()
        step = _steps.get(ident)
        if step is None or ident in _running:
            # No step here, or inside a backward a wrapper runs already
            # (Tensor.backward calls autograd.backward; a node may run another
            # backward): the recorder is paused, and the hooks aside where
            # that outer backward builds no graph (as an inner one would leave them).
            return original(*args, **kwargs)
        create_graph = kwargs.get("create_graph", args[create_graph_at]
                                  if len(args) > create_graph_at else False)
        owner = _Owner()  # (what an interrupt here leaves, the next backward puts back)
        _running.add(ident)
        try:
            _set_aside(step, create_graph, owner)
            step.pause()
            return original(*args, **kwargs)
        finally:
            _running.discard(ident)
            _after_backward(step, owner)
    wrapper.__name__ = original.__name__
    wrapper.__doc__ = original.__doc__
    return wrapper


# Where a backward starts from Python (Tensor.backward calls autograd.backward),
# and where each takes create_graph among its arguments.
_BACKWARDS = ((torch.Tensor, "backward", 3), (torch.autograd, "backward", 3),
              (torch.autograd, "grad", 4))


# (owner, name, what to put back (None: delete it, inherited), what was
# found, its wrapper), made at a step and kept while what they wrap stays:
# each step sets them, and making them anew would cost as much again.
_wrappers = []


def _make_wrappers():
    made = []
    for owner, name, create_graph_at in _BACKWARDS:
        found = getattr(owner, name)
        made.append((owner, name, found, found, _backward(found, create_graph_at)))
    for name in _OUTSIDE:
        found = getattr(torch.Tensor, name)
        made.append((torch.Tensor, name, torch.Tensor.__dict__.get(name), found,
                     _exporting(name, found)))
    prop = torch.Tensor.__cuda_array_interface__
    made.append((torch.Tensor, "__cuda_array_interface__", prop, prop,
                 property(_exporting("__cuda_array_interface__", prop.__get__))))
    _wrappers[:] = made


def _patch():
    global _patch_count
    with _patch_lock:
        if _patch_count == 0:
            if not _wrappers or any(getattr(owner, name) is not found
                                    for owner, name, _, found, _ in _wrappers[:-1]) or \
                    torch.Tensor.__dict__["__cuda_array_interface__"] is not _wrappers[-1][3]:
                _make_wrappers()  # (first, or the program replaced one since)
            for owner, name, _, _, wrapper in _wrappers:
                setattr(owner, name, wrapper)
        _patch_count += 1


def _unpatch():
    global _patch_count
    with _patch_lock:
        _patch_count -= 1
        if _patch_count == 0:
            for owner, name, original, _, wrapper in reversed(_wrappers):
                if vars(owner).get(name) is not wrapper:
                    continue  # (the program set its own inside the step: it stays)
                if original is not None:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)


def _inplace_error(is_output, is_leaf, output_nr, grad_fn, like, size, current, expected):
    """The in-place error for the C++ unpack hook (which found the versions
    differ): `like`, an empty tensor of the saved one's type."""
    from remat.torch._records import _inplace_error as error
    return error(is_output, is_leaf, output_nr, grad_fn, like.type(), size, current, expected)


def _python_body(name, overload):
    """Whether an operator ("ns::op", "overload") has a kernel of its own
    written in Python (the Python recorder's rule, _recorder._python_body)."""
    from remat.torch._recorder import _python_body as python_body
    ns, op = name.split("::", 1)
    packet = getattr(getattr(torch.ops, ns), op)
    return python_body(getattr(packet, overload or "default"))


def _foreign_rng():
    """numpy's global RNG state (where numpy is loaded) and Python's."""
    np = sys.modules.get("numpy")
    return (np.random.get_state() if np is not None else None, random.getstate())


def _set_foreign_rng(state):
    if state[0] is not None:
        sys.modules["numpy"].random.set_state(state[0])
    random.setstate(state[1])


def choice(native, offload, copy_ahead, pressure):
    """A budget's `native`, as its steps read it: True, False, or None
    (native where the step may be). Raises where native=True cannot be."""
    allows = pressure != "allocator" and not (offload and copy_ahead)
    if native and not allows:
        raise ValueError("native=True records in C++ under the saved-bytes budget, without "
                         "copies made ahead: pressure='allocator' and copy_ahead need the "
                         "Python recorder (native=False)")
    if native is not None:
        return native
    # Offload's copies on a GPU are native where asked for (native=True)
    # until a GPU run has checked them; on a machine without one, by default.
    by_default = allows and not (offload and torch.cuda.is_available())
    return None if by_default and os.environ.get("REMAT_TORCH_NATIVE") != "0" else False


class NativeSession:
    """One runtime across a budget's steps (what _session._Session is for
    the Python recorder)."""

    def __init__(self, budget_bytes, policy, recompute, offload=False, link=None):
        gbps, latency_ns = link if link is not None else (0.0, -1)
        self.native = module().Session(budget_bytes, policy, recompute, offload, gbps,
                                       latency_ns)
        self.live_budget = True
        self.engine = None

    def raw_stats(self):
        return self.native.stats()

    def close(self):
        self.native = None


class NativeEngine:
    """A step on the native path, with what budget's exit reads of an
    Engine."""

    allocator = None
    too_small = None
    closed = False
    listening = False

    def __init__(self, budget_bytes, policy, recompute, allow_nondeterministic, cost_model,
                 offload=False, drop_first=False, planner=None):
        self.budget_bytes = budget_bytes
        self.offload = offload
        self.drop_first = drop_first
        self.planner = planner
        # What a replay must fit in, and whether a drop no replay of its kind
        # was seen to fit is copied first (the planner's admission).
        self.replay_room = budget_bytes
        self.backups = True
        self.policy = policy
        self.recompute = recompute
        self.allow_nondeterministic = allow_nondeterministic
        self.cost_model = cost_model
        self.session = None
        self.step = None
        # What the Python side counts (keep_saved blocks), beside the step's own.
        self.counts = collections.Counter()

    def open(self, session):
        self.session = session
        # Costs: modelled at the budget's rates, as the Python recorder's are,
        # so that a loop's steps choose alike; REMAT_NATIVE_COSTS=measured
        # takes the host's time of each call on the CPU instead (a GPU's
        # calls are modelled whatever it says: their launches are
        # asynchronous).
        # With offload and recompute, the planner admits each drop (its
        # handle, as the C ABI has it) and learns from the step's replays.
        planner = self.planner.handle() if self.offload and self.recompute and \
            self.planner is not None else 0
        self.step = module().Step(session.native, self.recompute, self.allow_nondeterministic,
                                  self.cost_model.tflops, self.cost_model.hbm_gbps,
                                  os.environ.get("REMAT_NATIVE_COSTS") != "measured",
                                  self.offload, self.drop_first, planner, self.replay_room,
                                  self.backups)
        session.engine = self
        self.pack = self.step.pack
        self.unpack = self.step.unpack

    def start_recording(self):
        _patch()
        try:
            self.step.start()
        except BaseException:
            _unpatch()
            raise
        _steps[threading.get_ident()] = self.step

    def stop_recording(self):
        _steps.pop(threading.get_ident(), None)
        try:
            self.step.stop()
        finally:
            _unpatch()

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.step.close()
        finally:
            self.stats = self.read_stats()
            self.session.engine = None

    def exit_error(self):
        return None

    def report_unfit(self):
        self.step.report_unfit()

    def read_stats(self):
        # (The step's figures, its runtime's counters over the step among
        # them, made in one call.)
        figures = self.step.figures()
        figures["budget_bytes"] = self.budget_bytes
        figures["step"] += 0 if self.closed else 1
        figures["pressure"] = "saved"
        figures["native"] = True
        figures.update(self.counts)
        return figures


class _Recording:
    """The native recorder on this thread while the step is open."""

    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        self.engine.start_recording()

    def __exit__(self, *exc):
        self.engine.stop_recording()
        return False


def enter(b, plan, policy, session, offload=False, drop_first=False, planner=None):
    """Opens budget `b`'s step on the native path: the recorder is a C++
    callback and the hooks are C functions."""
    from remat.torch import _common
    engine = NativeEngine(b.budget_bytes, policy, b._recompute, b._allow_nondeterministic,
                          b._cost_model, offload, drop_first, planner)
    engine.open(session)
    b._engine = engine
    b._step_plan = plan
    _common._active[threading.get_ident()] = b
    b._mode = contextlib.nullcontext()
    b._backward = _Recording(engine)
    b._hooks = torch.autograd.graph.saved_tensors_hooks(engine.pack, engine.unpack)
    b._step_start = None
    entered = []
    try:
        b._hooks.__enter__()
        entered.append(b._hooks)
        b._backward.__enter__()
        entered.append(b._backward)
        # (Last: a list of policies times its trial's steps.)
        b._step_start = b._time() if b._step_timed else None
    except BaseException:
        for context in reversed(entered):
            context.__exit__(None, None, None)
        _common._active.pop(threading.get_ident(), None)
        engine.close()
        raise
