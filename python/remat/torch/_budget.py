"""remat.torch.budget: a PyTorch step whose saved activations are kept,
dropped (to be recomputed) or offloaded, under a budget of bytes.

How it works. Inside the context two things watch the step:

- A TorchDispatchMode records every ATen call of the forward: the function,
  its arguments (each tensor described by the storage under it, its view
  (size, stride, offset) and the storage's content version at the call), the
  RNG state before a random call, and what it costs (FLOPs and bytes at a
  device's rates). Each new storage a call returns is known by the call and
  output index that made it; a call that writes into an argument (in place,
  `out=`) moves that storage's content to its next version. Views, and calls
  that neither write nor make a storage, pass through unrecorded (a replay
  rebuilds views from the storage), and the backward runs with the recorder
  set aside (_Backward).
- saved_tensors_hooks see each tensor autograd saves for the backward. One
  whose storage a recorded call made is handed to remat's runtime (the C
  library, through its C ABI) as a tensor of that storage's bytes, and only a
  handle goes into the graph. Tensors made before the context (parameters,
  inputs, buffers) are left to autograd: never dropped, never counted.

The runtime keeps the resident saved bytes within the budget (its live
budget) by choosing, with its policy, what to drop or offload; its events say
which. A dropped storage's tensor is let go; an offloaded one is copied to
host memory and let go. When the backward unpacks a handle the runtime
brings the storage back: a restore copies it in; a recompute re-runs the
recorded calls that made that content (with their recorded RNG state), from
their recorded inputs, recursively through storages nobody saved, taking
saved ones from the runtime (which brings them back first).

A storage is droppable only when every call its recompute would run can be
replayed exactly: a random call with its RNG state captured, no call with
data-dependent output shapes, no call that wrote a tensor made before the
context unless its outputs do not read it (batch norm's running statistics),
and on CUDA no kernel PyTorch marks nondeterministic unless the user allows
it, and none that reads bytes handed outside autograd (Engine.exported).
Other storages may still be offloaded.

What a plain step would check or read, the budget does too: a saved tensor
modified in place raises at its unpack as autograd raises (_check_version:
PyTorch skips its check under saved-tensor hooks), a custom op's replay draws
what it drew (_rng_states), and a tensor moved by `.data =` is read as
autograd reads it (Engine.data_set).
"""
import contextlib
import ctypes
import gc
import math
import os
import random
import re
import sys
import threading
import time
import types
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode_temporarily
from torch.utils._pytree import tree_flatten, tree_unflatten

from remat import _capi, parse_size
from remat._planner import StepPlanner
from remat.torch import _allocator, _interrupts, _link, _native
from remat.torch._cost import CostModel

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


class _Storage:
    """A storage seen in the step: made by a recorded call (`producer`), or a
    leaf (made before the context, or by something unrecorded)."""
    __slots__ = ("index", "leaf", "producer", "writers", "version", "dtype", "nbytes",
                 "weak", "tensor_ref", "id", "reg_version", "tensor", "host", "handles",
                 "droppable", "why_kept", "pinned_forever", "freed", "device", "readers", "regions",
                 "order", "ahead", "gen", "key", "tensor_version", "host_version", "allow_drop",
                 "beside_key", "group", "backup", "backup_version",
                 "want_backup", "copy_first", "exported", "counter", "__weakref__")

    def __init__(self, index, leaf, key, weak, producer=None, dtype=None, nbytes=0,
                 tensor=None):
        self.index = index
        self.leaf = leaf
        self.producer = producer      # (call, output index)
        self.writers = []             # calls that wrote it, in order: version i+1 = writers[i]
        self.version = 0
        self.dtype = dtype
        self.nbytes = nbytes
        self.weak = weak              # StorageWeakRef: keeps the key unique, says if alive
        self.tensor_ref = weakref.ref(tensor) if tensor is not None else None
        self.id = None                # the runtime's tensor id once saved
        self.reg_version = None       # the content version the runtime holds
        self.tensor = None            # a tensor over it while resident (held by remat)
        self.key = key                # the storage's key (Engine.storages)
        # The content version `tensor` holds: the program's own storage
        # follows every write (`version`); a copy (a recompute, a copy back
        # from host memory) holds the version it was made of.
        self.tensor_version = 0
        self.host_version = 0         # the content version `host` holds
        self.host = None              # its copy while offloaded
        self.ahead = None             # its copy made ahead while resident (copy_ahead)
        self.gen = 0                  # its evictions so far (a copy in checks none came)
        self.handles = 0
        self.droppable = False
        self.allow_drop = 0           # whether the runtime may drop it (its call has a closure)
        self.why_kept = ""
        self.pinned_forever = False
        self.freed = False
        self.device = None
        self.readers = None           # weakrefs to saved storages whose recompute reads it
        self.regions = []             # (size, stride, offset) of each saved view of it
        self.order = -1               # its place in Engine.registered
        self.beside_key = None        # its key in what steps saw beside it (Engine._beside_key)
        self.group = None             # its runtime call: an index into Engine.groups
        # Whether a drop of it is copied to host memory first (no replay of
        # its kind and size has been seen to fit: Engine._wants_backup), and
        # that copy of its registered content, for a replay that cannot fit.
        self.want_backup = False
        self.copy_first = False       # a drop of it is copied first (the planner's admit_drop)
        self.backup = None
        self.backup_version = 0       # the content version `backup` holds
        # Its bytes were handed outside autograd (Engine.exported): written
        # there, for all remat knows, at any time from then on.
        self.exported = False
        # (weakref to a tensor, _counter_of it): its saves' version counter
        # once made (_Handle), for the next save of that tensor or a view.
        self.counter = None


def _leaf_version(t):
    """t's version counter, or None for a tensor made under
    torch.inference_mode(), which has none: a constant (PyTorch allows no
    write to it outside inference mode)."""
    try:
        return t._version
    except RuntimeError:
        return None


class _Ref:
    """A tensor argument of a recorded call: its storage (or, for a leaf, the
    tensor itself), its view and the content version it had."""
    __slots__ = ("storage", "leaf_tensor", "size", "stride", "offset", "version", "dtype",
                 "conj_or_neg", "storage_writes")

    def __init__(self, storage, t):
        self.storage = storage
        self.leaf_tensor = t if storage.leaf else None
        self.size = tuple(t.size())
        self.stride = tuple(t.stride())
        self.offset = t.storage_offset()
        self.version = _leaf_version(t) if storage.leaf else storage.version
        # A leaf's writes the recorder saw into its storage before the call
        # (through `.data`, an alias, or a kernel that moves no counter).
        self.storage_writes = storage.version
        self.dtype = t.dtype
        self.conj_or_neg = t.is_conj() or t.is_neg()


class _Call:
    __slots__ = ("func", "spec", "leaves", "rng", "cost_ns", "why_not", "written", "outputs",
                 "group", "grad")

    def __init__(self, func, spec, leaves, rng, cost_ns, why_not, written, grad):
        self.func = func
        self.spec = spec          # pytree spec of (args, kwargs)
        self.leaves = leaves      # flattened (args, kwargs), tensors as _Ref
        self.rng = rng            # _rng_states() before a random call
        self.cost_ns = cost_ns
        self.why_not = why_not    # why it cannot be replayed exactly ("" if it can)
        self.written = written    # indices into leaves of the arguments it writes
        self.outputs = None       # output index -> _Storage it made
        self.group = None         # its runtime call: an index into Engine.groups
        # Grad mode when it ran: some kernels' outputs depend on it (an LSTM
        # layer's workspace is made only with grad on).
        self.grad = grad


_sequence_nr = torch._C._autograd._get_sequence_nr
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_set_versions = torch._C._autograd._unsafe_set_version_counter


class _Facts:
    """What autograd's own saved-tensor check needs of a saved tensor. With
    saved-tensor hooks set, PyTorch skips its check that a saved tensor was
    not modified in place since it was saved (the hooks own the content):
    remat does it at unpack, and raises as PyTorch would (_check_version).

    version: the tensor's version counter at the save. is_output: saved as
    an output of the node that saves it (autograd saves a copy of its
    TensorImpl, which a later `.data =` does not move) rather than as an
    input (autograd holds the tensor itself). An output's grad_fn is the node
    autograd made just before the save, the newest by sequence number."""
    __slots__ = ("version", "is_output", "is_leaf", "output_nr")

    def __init__(self, t):
        self.version = t._version
        now = _sequence_nr()
        fn = t.grad_fn
        self.is_output = fn is not None and fn._sequence_nr() == now - 1
        self.is_leaf = t.is_leaf
        self.output_nr = t.output_nr


class _Kept(_Facts):
    """What autograd holds for a saved tensor left to it (made before the
    context, a parameter, one remat cannot hold): the tensor itself."""
    __slots__ = ("tensor",)

    def __init__(self, t):
        super().__init__(t)
        # Saved as an output, autograd holds a copy of the TensorImpl: a
        # later `.data =` on the tensor leaves what it saved as it was.
        self.tensor = _alias(t) if self.is_output else t


def _alias(t):
    """A tensor over t's bytes and version counter, not moved by a later
    `t.data = ...`."""
    if type(t) is not torch.Tensor:
        return t.detach()  # (a subclass keeps its own dispatch; the recorder passes views)
    with _below_python_dispatch():
        return t.detach()


def _counter_of(t):
    """A tensor holding no bytes that shares t's version counter: it reads
    the version of every tensor autograd counts as t (views, detached
    aliases) once t itself is gone, without keeping t's storage alive."""
    if type(t) is not torch.Tensor:
        return None
    version = t._version
    with _below_python_dispatch():
        alias = t.detach()
        alias.set_()  # no storage (a write: the shared counter moves on ...)
    _set_versions((alias,), (version,))  # (... and is put back)
    return alias


class _Handle(_Facts):
    """What autograd holds for a saved tensor that remat manages."""
    __slots__ = ("engine", "storage", "size", "stride", "offset", "counter", "source",
                 "grad_fn", "__weakref__")

    def __init__(self, engine, storage, t):
        super().__init__(t)
        self.engine = engine
        self.storage = storage
        self.size = tuple(t.size())
        self.stride = tuple(t.stride())
        self.offset = t.storage_offset()
        # A tensor and its views share one counter: the alias made at the
        # last save of the storage serves a save of the same tensor or its
        # views (an activation is saved as one node's output and the next
        # one's input), and the alias costs microseconds to make.
        owner = t._base if t._is_view() else t
        made = storage.counter
        if made is not None and made[0]() is owner:
            self.counter = made[1]
        else:
            self.counter = _counter_of(t)
            storage.counter = (weakref.ref(owner), self.counter)
        # Saved as an input: the tensor itself, weakly (autograd would read
        # what it holds after a `.data =`), and its grad_fn for the message.
        self.source = None if self.is_output else weakref.ref(t)
        self.grad_fn = None if self.is_output else t.grad_fn

    @_interrupts.critical
    def __del__(self):
        # (None: its __init__ did not finish.)
        engine, storage = getattr(self, "engine", None), getattr(self, "storage", None)
        if engine is not None and storage is not None:
            # Never into the runtime from here (a finalizer may run anywhere,
            # even inside one of its callbacks): counted at the next safe point.
            engine.dead_handles.append(storage)


_NOT_OUTPUT = re.compile(r"Backward\d*$")
_inplace_hints = {}


def _inplace_hint():
    """The hint PyTorch ends its in-place error with (it names the anomaly
    mode's switch, and differs with the mode and by release): taken from
    PyTorch's own error, raised on a thread of its own, where no saved-tensor
    hooks or dispatch modes of this one are set."""
    anomaly = torch.is_anomaly_enabled()
    hint = _inplace_hints.get(anomaly)
    if hint is None:
        said = []

        def probe():
            try:
                a = torch.ones(1, requires_grad=True)
                b = a * 1
                c = b.sin()
                b.add_(1)
                c.backward()
            except RuntimeError as e:
                said.append(str(e))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (anomaly mode's traceback of the probe)
            thread = threading.Thread(target=probe)
            thread.start()
            thread.join()
        end = " instead."
        hint = said[0][said[0].find(end) + len(end):] if said and end in said[0] else ""
        _inplace_hints[anomaly] = hint
    return hint


def _check_version(facts, tensor, storage=None):
    """Raises as autograd's SavedVariable::unpack does where a saved tensor
    was modified in place since it was saved. `tensor`: the tensor as saved
    (None where it is gone: the message is made of what the save recorded)."""
    if tensor is not None:
        current = tensor._version  # (an input's own tensor: its counter now)
    elif facts.counter is not None:
        current = facts.counter._version
    else:
        return  # (a tensor subclass, gone: nothing left to read)
    if current == facts.version:
        return
    grad_fn = tensor.grad_fn if tensor is not None else facts.grad_fn
    if tensor is not None:
        kind = tensor.type()
        size = list(tensor.size())
    else:
        with _below_python_dispatch():
            kind = torch.empty(0, dtype=storage.dtype, device=storage.device).type()
        size = list(facts.size)
    raise _inplace_error(facts.is_output, facts.is_leaf, facts.output_nr, grad_fn, kind, size,
                         current, facts.version)


def _inplace_error(is_output, is_leaf, output_nr, grad_fn, kind, size, current, expected):
    """The RuntimeError autograd's unpack raises for a saved tensor modified
    in place since its save (current != expected versions). `kind`: its type
    as `Tensor.type()` says it; `grad_fn`: an input's node (as it is now)."""
    if is_output and not is_leaf:
        node = torch._C._current_autograd_node()
    else:
        node = grad_fn
        if node is None and not is_leaf:
            node = torch._C._current_autograd_node()
    message = ("one of the variables needed for gradient computation has been modified by an "
               f"inplace operation: [{kind} [{', '.join(map(str, size))}]]")
    if node is not None:
        message += f", which is output {output_nr} of {_NOT_OUTPUT.sub('', node.name())},"
    message += f" is at version {current}; expected version {expected} instead."
    return RuntimeError(message + _inplace_hint())


class _OpInfo:
    """What recording needs of an operator, read once from its schema and tags
    (reading them on every call was a fifth of the recording's time)."""
    __slots__ = ("random", "custom", "python_body", "why_not", "nondeterministic", "is_view",
                 "writes", "writes_unread")

    def __init__(self, func):
        tags = getattr(func, "tags", ())
        # An operator outside PyTorch's own (a torch.library custom op, a
        # library's kernel) may draw random numbers untagged, from any
        # generator its body reaches: it runs, and is replayed, under the
        # states of every generator remat can see (_rng_states).
        self.custom = func.namespace not in _BUILTIN_NAMESPACES
        self.random = self.custom or _tag("nondeterministic_seeded") in tags
        # A body written in Python may draw from numpy's or Python's RNG too.
        self.python_body = self.custom and _python_body(func)
        self.why_not = ""
        if func.namespace in _COLLECTIVES:
            self.why_not = f"{func} is a collective (a replay on one rank alone would hang)"
        elif any(_tag(n) in tags for n in _NOT_REPLAYABLE_TAGS if _tag(n) is not None):
            self.why_not = f"{func} has a data-dependent output"
        self.nondeterministic = _tag("nondeterministic_bitwise") in tags
        self.is_view = bool(getattr(func, "is_view", False))
        self.writes_unread = func._schema.name.split("::")[-1] in _WRITES_UNREAD
        self.writes = self.writes_unread or any(
            a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


_op_infos = {}

# Namespaces of PyTorch's own operators, whose random ones say so with the
# nondeterministic_seeded tag.
_BUILTIN_NAMESPACES = {"aten", "prims", "rngprims", "prim"}


# Dispatch keys whose kernels are not an operator's body (its fake/meta
# kernel, autograd's wrapper, ...): one of them registered from Python says
# nothing of where the body draws from.
_NOT_A_BODY = ("debug", "Meta", "Autograd", "ADInplaceOrView", "Functionalize", "Python",
               "PreDispatch", "FuncTorch", "Autocast", "Batched", "Tracer", "Fake")
_PYTHON_PLACE = re.compile(r"(^<.*>|\.py):\d+$")


def _python_body(func):
    """Whether a kernel of func's own was registered from Python (a
    torch.library custom op's, a `Library.impl`): its body may then draw from
    numpy's global RNG or Python's `random` too. Read once per operator from
    the dispatcher's table (where each kernel was registered)."""
    try:
        table = torch._C._dispatch_dump(func.name())
    except (RuntimeError, AttributeError):
        return True
    for line in table.splitlines():
        key, found, rest = line.partition(": registered at ")
        if found and not key.startswith(_NOT_A_BODY) and \
                _PYTHON_PLACE.search(rest.split(" :: ")[0]):
            return True
    return False


def _rng_states(custom, cuda_devices, gens, python_body=False):
    """What a random call draws from, as it is before the call: the CPU
    default generator, each CUDA device's in `cuda_devices`, the generator
    arguments (`gens`); for a custom op (`custom`) the current CUDA device's
    too, and where its body is Python (`python_body`), numpy's global RNG
    (where numpy is loaded) and Python's `random` (together some tens of
    microseconds: numpy's state is 2.5 KB built into Python objects)."""
    py = None
    if custom and torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_devices = set(cuda_devices)
        cuda_devices.add(torch.device("cuda", torch.cuda.current_device()))
    if python_body:
        np = sys.modules.get("numpy")
        py = (np.random.get_state() if np is not None else None, random.getstate())
    return (torch.get_rng_state(),
            {d: torch.cuda.get_rng_state(d) for d in cuda_devices},
            [(g, g.get_state()) for g in gens], py)


def _set_rng_states(rng):
    cpu, cuda, gens, py = rng
    torch.set_rng_state(cpu)
    for d, st in cuda.items():
        torch.cuda.set_rng_state(st, d)
    for g, st in gens:
        g.set_state(st)
    if py is not None:
        if py[0] is not None:
            sys.modules["numpy"].random.set_state(py[0])
        random.setstate(py[1])


_CUDNN_RNN = torch.ops.aten._cudnn_rnn.default


def _op_info(func):
    info = _op_infos.get(func)
    if info is None:
        info = _op_infos[func] = _OpInfo(func)
    return info


def _written_indices(func, args, kwargs, flat_len, spec):
    """Positions, in the flattened (args, kwargs) (flattened as `spec` says),
    of tensors the call writes."""
    schema = func._schema
    written_names = set()
    written_pos = set()
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is not None and info.is_write:
            if arg.kwarg_only:
                written_names.add(arg.name)
            else:
                written_pos.add(i)
    if schema.name.split("::")[-1] in _WRITES_UNREAD and \
            not (len(args) > 5 and isinstance(args[5], bool) and not args[5]):
        # native_batch_norm writes its running statistics without saying so,
        # in training (in evaluation it reads them).
        written_pos.update((3, 4))
    if not written_names and not written_pos:
        return []
    # Flatten each argument alone to find where it lands.
    out = []
    pos = 0
    count = (lambda a: len(tree_flatten(a)[0])) if spec is not None and \
        type(spec) is not _FlatSpec else _leaf_count
    for i, a in enumerate(args):
        n = count(a)
        if i in written_pos:
            out.extend(range(pos, pos + n))
        pos += n
    for name, v in kwargs.items():
        n = count(v)
        if name in written_names:
            out.extend(range(pos, pos + n))
        pos += n
    return [i for i in out if i < flat_len]


def _code_skipper():
    """A function that marks a code object for torch.compile to skip, with
    every frame called from it (what a dynamo-disabling wrapper does, at no
    cost per call), or None where this PyTorch has no such mark."""
    try:
        ef = torch._C._dynamo.eval_frame
        skip = ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.SKIP)
        mark = ef.set_code_exec_strategy
    except (AttributeError, TypeError):
        return None
    return lambda code: mark(code, skip)


_SKIP_CODE = _code_skipper()


class _Mode(TorchDispatchMode):
    def __init__(self, engine):
        super().__init__()
        self.engine = engine

    @classmethod
    def _should_skip_dynamo(cls):
        # PyTorch wraps a mode's __torch_dispatch__ in a dynamo-disabling
        # wrapper, some microseconds per call; where the code object can be
        # marked instead (below), no wrapper.
        return not _SKIP_CODE

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        engine = self.engine
        try:
            if engine.internal or torch._C._current_graph_task_id() != -1:
                # remat's own work, or the backward (which saves nothing new).
                out = func(*args, **kwargs)
            else:
                out = engine.record(func, args, kwargs)
        except BaseException as e:
            if engine.listening:
                engine.check_allocator(func, e)
            raise
        if engine.listening:
            engine.check_allocator(func)
        return out


if _SKIP_CODE:
    _SKIP_CODE(_Mode.__torch_dispatch__.__code__)


# What runs a backward from Python (Tensor.backward calls torch.autograd.backward).
_SET_DATA = torch.Tensor.data.__set__
# What hands a tensor's bytes outside autograd, where they may be written
# with no ATen call to record (Engine.exported), and `.data =`, which moves a
# tensor onto other bytes (Engine.data_set).
_OUTSIDE = {torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.__dlpack__,
            torch.Tensor.data_ptr, torch.Tensor.__cuda_array_interface__.__get__, _SET_DATA}
_BACKWARDS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


class _Backward(TorchFunctionMode):
    """Runs a backward with the recorder set aside: a backward is not
    recorded, and each of its calls through the recorder (a Python dispatch
    mode) costs microseconds, a fifth of a small model's step. Set aside only
    where the recorder is the innermost dispatch mode, and not while remat's
    allocator drives the budget (the recorder watches each call for its
    failed requests). Its price: every torch-level call inside the context
    comes through here, a tensor's metadata reads included (about 1 us
    each)."""

    def __init__(self, engine, mode):
        super().__init__()
        self.engine = engine
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if func in _OUTSIDE:
            if func == _SET_DATA:
                self.engine.data_set(args[0])
            elif self._recording():
                # (Not a custom op's body, run by the recorder, nor a backward.)
                self.engine.exported(args[0])
        if func in _BACKWARDS and not self.engine.listening:
            depth = torch._C._len_torch_dispatch_stack()
            if depth and torch._C._get_dispatch_stack_at(depth - 1) is self.mode:
                self.engine.counts["backwards_outside_recorder"] += 1
                with _pop_mode_temporarily():
                    return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _recording(self):
        """Whether the recorder is on this thread's dispatch-mode stack."""
        return any(torch._C._get_dispatch_stack_at(i) is self.mode
                   for i in range(torch._C._len_torch_dispatch_stack()))


class _Session:
    """The runtime a budget keeps across its steps (each `with`): it learns
    from each step what the next will do. Its callbacks go to the step now
    running."""

    def __init__(self, budget_bytes, policy, offload, recompute, copy_ahead=False,
                 live_budget=True, link=None):
        self.lib = _capi.lib()
        self.engine = None
        self.allocator = None
        self.runtime = None
        self._event_fn = _capi.EVENT_FN(self._on_event)
        self.recompute_fn = _capi.CALL_RECOMPUTE_FN(self._on_recompute)
        lib = self.lib
        ao = _capi.AllocatorOptions()
        _capi.check(lib.remat_allocator_options_init(ctypes.byref(ao)), "allocator options")
        ao.device = _capi.DEVICE_SIM
        ao.sim_backed = 0
        # Addresses only: the runtime's bookkeeping of the saved bytes. The
        # budget that matters is the live budget below.
        ao.sim_capacity_bytes = 16 << 40  # the most SimDevice models
        allocator = ctypes.c_void_p()
        _capi.check(lib.remat_allocator_create(ctypes.byref(ao), ctypes.byref(allocator)),
                    "remat_allocator_create")
        self.allocator = allocator
        ro = _capi.RuntimeOptions()
        _capi.check(lib.remat_runtime_options_init(ctypes.byref(ro)), "runtime options")
        ro.policy = policy.encode()
        ro.enable_drop = 1 if recompute else 0
        ro.enable_offload = 1 if offload else 0
        # With the allocator's pressure driving evictions, the runtime keeps
        # no budget of its own: it evicts when the allocator asks.
        ro.live_budget = budget_bytes if live_budget else 0
        self.live_budget = live_budget
        ro.host_pool_bytes = 16 << 40
        ro.learn_next_use = 1
        ro.copy_ahead = 1 if (offload and copy_ahead) else 0
        if link is not None:  # (GB/s, ns): what offloads are priced at
            ro.link_gbps, ro.link_latency_ns = link
        # A drop is admitted by what its replay needs, as the runtime estimates it.
        ro.estimate_replays = 1 if (offload and recompute) else 0
        runtime = ctypes.c_void_p()
        status = lib.remat_runtime_create_observed(allocator, ctypes.byref(ro), self._event_fn,
                                                   None, ctypes.byref(runtime))
        if status != _capi.OK:
            message = lib.remat_last_error().decode()
            lib.remat_allocator_destroy(allocator)
            self.allocator = None
            raise ValueError(message)
        self.runtime = runtime

    # The library's callbacks: an exception cannot cross it, and an
    # interrupt that lands in them waits (_interrupts).
    @_interrupts.critical
    def _on_event(self, user, event_p):
        if self.engine is not None:
            self.engine._on_event(user, event_p)

    @_interrupts.critical
    def _on_recompute(self, *args):
        engine = self.engine
        try:
            if engine is None:  # cannot happen: a step frees all it made
                self.lib.remat_recompute_set_error(b"remat: a recompute outside a step")
                return 1
            return engine._on_recompute(*args)
        except BaseException as e:  # noqa: BLE001: carried across the library
            if engine is not None:
                engine.error = e
            self.lib.remat_recompute_set_error(str(e).encode("utf-8", "replace")[:1000])
            return 1

    def raw_stats(self):
        st = _capi.RuntimeStats()
        _capi.check(self.lib.remat_runtime_get_stats(self.runtime, ctypes.byref(st)), "stats")
        return st

    def close(self):
        lib = self.lib
        if self.runtime is not None:
            lib.remat_runtime_destroy(self.runtime)
            self.runtime = None
        if self.allocator is not None:
            lib.remat_allocator_destroy(self.allocator)
            self.allocator = None


# A pending event of remat's own (Engine.pending): copy a tensor the runtime
# dropped to host memory (_Storage.want_backup).
_BACKUP = -1
_EVICT_DROP = 0  # REMAT_EVICT_DROP

# Runtime counters reported per step (the difference over the step).
_STEP_COUNTERS = ("drops", "recomputes", "offloads", "prefetches", "offloaded_bytes",
                  "restored_bytes", "recompute_ns", "pressure_events", "learned_next_uses",
                  "copies_ahead", "ahead_offloads")




class _Internal:
    """`with _Internal(engine):` marks the calls inside as remat's own (its
    copies, views and replays), which the recorder passes through, and
    restores the mark as it was on the way out (such blocks nest)."""

    __slots__ = ("engine", "was")

    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        self.was = self.engine.internal
        self.engine.internal = True

    def __exit__(self, *exc):
        self.engine.internal = self.was
        return False


class Engine:
    """The state of one step under a budget (one `with`)."""

    def __init__(self, budget_bytes, policy, offload, recompute, allow_nondeterministic,
                 cost_model, copy_ahead=False, allocator=None, device=0, drop_first=False,
                 planner=None):
        self.budget_bytes = budget_bytes
        # What a replay must fit in: the budget, less (where it counts what
        # the GPU holds) what the device held as the step began.
        self.replay_room = budget_bytes
        # The budget's step planner (remat._planner): what earlier steps
        # learned by tensor kind (replays that fit or failed, what a backward
        # pinned beside each), and where this step's observations go.
        self.planner = planner
        self.kinds_handed = {}        # (op, output) -> how many handed over (_beside_key)
        # Only a step that may both drop and offload weighs each replay (a
        # tensor it could not bring back is offloaded instead).
        self.weigh_replays = bool(offload and recompute)
        self._estimate = (ctypes.c_uint64 * (_capi.REPLAY_DEPTH + 1))()
        self.pin_bytes = 0            # the bytes of the pins below
        self.forever_bytes = 0        # and of the storages pinned to the step's end
        # Offload only what cannot be dropped (the offload guard's plan that
        # drops wherever a drop can come back).
        self.drop_first = drop_first
        # The dropped tensor whose replay failed the step (no copy to come
        # back from): the outermost such acquire, as the error left it.
        self.unfit = None
        self.backward_read = False    # a backward has read a saved tensor of the step
        # remat's allocator (libremat_torch.so) whose pressure drives the
        # evictions, capped at the budget on `device` while the step runs;
        # None: the runtime's live budget over the saved bytes does.
        self.allocator = allocator
        self.device = device
        self.listening = False
        self.pressure_fn = None
        self.pressure_error = None    # an exception raised inside the pressure callback
        self.callback_errors = set()  # ids of such exceptions raised since
        self.device_stats = None
        self.allocator_pressure = 0
        # The allocator's failed requests so far (remat_torch_num_ooms), and
        # the last pressure it reported: (bytes, allocated, budget). The call
        # whose request failed (remat_malloc raised in it) raises
        # BudgetTooSmall instead.
        self.ooms = 0
        self.last_pressure = None
        self.thread = None
        self.policy = policy
        self.offload = offload
        self.copy_ahead = copy_ahead
        self.recompute = recompute
        self.allow_nondeterministic = allow_nondeterministic
        self.cost_model = cost_model
        self.storages = {}            # storage key -> _Storage
        self.by_index = []            # index -> _Storage (the callback's user_data)
        self.by_id = {}               # runtime id -> _Storage
        self.internal = False
        self.registered = []          # saved storages in the order they were saved
        self.pins = []                # ids pinned for the backward node being run
        self.pin_node = None          # that node
        self.pin_task = -1            # and its backward (autograd's graph task)
        self.pending = []             # (kind, storage, tensor) events to act on outside the lock
        self.dead_handles = []
        self.error = None             # an exception raised inside a callback
        self.too_small = None         # the last BudgetTooSmall the step raised
        self.why_pinned = {}          # storage index -> why it is kept to the step's end
        self.counts = {"saved_tensors": 0, "saved_unmanaged": 0, "kept_not_replayable": 0,
                       "recomputed_calls": 0, "backwards_outside_recorder": 0,
                       "offload_not_drop": 0, "offload_not_drop_seen": 0,
                       "offload_not_drop_failed": 0, "keep_saved_blocks": 0,
                       "rebuilt_in_replay": 0, "backups": 0, "backup_bytes": 0,
                       "backups_used": 0, "backups_skipped": 0}
        self.lib = _capi.lib()
        self.session = None
        self.runtime = None
        self.start = None             # the runtime's counters when the step began
        # A runtime call per recorded call whose outputs are saved: its saved
        # storages, in the runtime's output order (autograd saves a call's
        # outputs one by one: layer norm's mean and rstd as it returns, its
        # output when the next op runs; each joins the call's runtime call, so
        # one run brings back all it lost).
        self.groups = []
        self.side_stream = None
        self.closed = False
        self.restores = 0
        # Host seconds in replays (the copies they make included) and in
        # copies out and in.
        self.recompute_seconds = 0.0
        self.copy_seconds = 0.0
        self.in_replay = False
        # Tensors moved onto other bytes by `.data =` (data_set), by id: held
        # to the step's end, as autograd holds a tensor it saved as an input.
        self.moved = {}

    # --- the runtime ------------------------------------------------------------------

    def open(self, session):
        self.session = session
        self.runtime = session.runtime
        self.start = session.raw_stats()
        session.engine = self
        if self.allocator is not None:
            try:
                self._listen()
            except BaseException:
                session.engine = None
                raise

    def _listen(self):
        """Caps remat's allocator at the budget and takes its pressure."""
        a, d = self.allocator, self.device
        other = _allocator._listening.get(d)
        if other is not None and not other.closed:
            raise RuntimeError(f"another remat.torch.budget takes device {d}'s memory pressure "
                               "now: one budget per device at a time")
        held = a.memory_stats(d)["allocated"]
        if held >= self.budget_bytes:
            raise self._budget_too_small(
                f"remat.torch.budget({self.budget_bytes} bytes) counts what the GPU holds "
                f"(remat's allocator serves PyTorch), and device {d} holds {held} bytes "
                "before the step begins (parameters, gradients, optimizer state, inputs): "
                "nothing would be left for the step")
        self.old_budget = a.budget(d)
        # A budget beyond the device caps nothing: the device's capacity.
        a.set_budget(d, 0)
        try:
            a.set_budget(d, min(self.budget_bytes, a.budget(d)))
            # Parameters, gradients, optimizer state and inputs stay through
            # the step: a replay has the rest.
            self.replay_room = max(0, a.budget(d) - held)
            a.reset_peak(d)
            self.ooms = a.num_ooms(d)
            self.thread = threading.get_ident()
            self.pressure_fn = _allocator.PRESSURE_FN(self._on_pressure)
            a.set_pressure_fn(d, self.pressure_fn)
        except BaseException:
            a.set_budget(d, self.old_budget)
            raise
        _allocator._listening[d] = self
        self.listening = True

    def _stop_listening(self):
        if not self.listening:
            return
        self.listening = False
        a, d = self.allocator, self.device
        try:
            a.set_pressure_fn(d, None)
            if _allocator._listening.get(d) is self:
                del _allocator._listening[d]
            self.device_stats = a.memory_stats(d)
            self.device_stats["ooms"] = a.num_ooms(d)
        finally:
            a.set_budget(d, self.old_budget)

    def check_allocator(self, func, exc=None):
        """After a call (`exc`: what it raised): raises what went wrong in
        the allocator's pressure callback, or BudgetTooSmall where a request
        failed (the call raised it: remat_malloc throws). Another error the
        call raised (a CUDA error, say) is not hidden behind BudgetTooSmall:
        the caller raises it as it was."""
        if self.pressure_error is not None:
            error, self.pressure_error = self.pressure_error, None
            self.callback_errors.add(id(error))  # not a replay's want of room (_acquire)
            raise error from exc
        ooms = self.allocator.num_ooms(self.device)
        if ooms != self.ooms:
            self.ooms = ooms
            if exc is None or _out_of_memory(exc):
                raise self._too_small(func) from exc

    def _too_small(self, func):
        """BudgetTooSmall for a request remat's allocator could not meet:
        two lines, what did not fit and the least budget that would have
        held it beside what could not be evicted (where the request is
        known: a request larger than the whole budget asks no pressure)."""
        st = self.read_stats()
        asked, fix = "", "Raise the budget."
        if self.last_pressure is not None:
            nbytes, allocated, _ = self.last_pressure
            asked = f" for {nbytes} bytes with {allocated} allocated"
            if allocated + nbytes > self.budget_bytes:
                fix = f"Raise the budget to at least {allocated + nbytes} bytes."
        return self._budget_too_small(
            f"remat.torch.budget({self.budget_bytes} bytes) on device {self.device}: {func} "
            f"asked remat's allocator{asked}, and the runtime had nothing left to evict "
            f"({st['drops']} drops and {st['offloads']} offloads in this step; what the "
            "backward reads now, the parameters, gradients and optimizer state stay).\n" + fix)

    def exit_error(self):
        """What the step's end must raise, if anything: an error of the
        pressure callback, or BudgetTooSmall for a request that failed
        where no call after it saw."""
        if self.pressure_error is not None:
            return self.pressure_error
        if self.device_stats is not None and self.device_stats["ooms"] != self.ooms:
            return self._too_small("the step")
        return None

    def _budget_too_small(self, message):
        """A BudgetTooSmall for the step to raise, kept so that the
        budget's exit can raise it again where something wrapped it
        (TorchScript's interpreter)."""
        self.too_small = BudgetTooSmall(message)
        return self.too_small

    @_interrupts.critical
    def _on_pressure(self, _user, pressure):
        """remat's allocator cannot serve a request within the budget, its
        cache released: the runtime evicts saved activations by its policy,
        the bytes the request lacks (all of it, where the budget has room
        that is not in one place). Nonzero: something went."""
        try:
            _interrupts.deliver()  # raised by the call that asked, as its error
            if self.closed or self.runtime is None:
                return 0
            if threading.get_ident() != self.thread and \
                    torch._C._current_graph_task_id() == -1:
                return 0  # another thread's request, not this step's (nor its backward's)
            p = pressure.contents
            self.last_pressure = (p.bytes, p.allocated, p.budget)
            over = p.allocated + p.bytes - p.budget
            need = over if p.allocated + p.bytes > p.budget else p.bytes
            self.allocator_pressure += 1
            freed = ctypes.c_uint64()
            status = self.lib.remat_runtime_evict_bytes(self.runtime, max(1, need), 0,
                                                        ctypes.byref(freed))
            if status != _capi.OK:
                raise _capi.RematError(status, self.lib.remat_last_error().decode())
            self._drain()  # the offloads' copies out; a drop let its tensor go already
            return 1 if freed.value else 0
        except BaseException as e:  # noqa: BLE001: the step raises it on its way out
            if self.pressure_error is None:
                self.pressure_error = e
            return 0

    def close(self):
        """Ends the step: everything it holds goes, and the runtime learns
        from it what the next step will do."""
        if self.closed:
            return
        self.closed = True
        lib = self.lib
        error = None
        try:
            # Whatever fails (a copy out of host memory, say), every tensor of
            # the step still goes and the step still ends: the runtime is
            # kept for the next one.
            for release in (self._release_pins, self._free_dead):
                try:
                    release()
                except BaseException as e:  # noqa: BLE001: raised below
                    error = error or e
            self.pending.clear()  # copies the step no longer needs
            for s in self.registered:
                if s.pinned_forever and not s.freed:
                    s.pinned_forever = False
                    lib.remat_tensor_release(self.runtime, s.id)
                self._free(s)
            self.pending.clear()
            _capi.check(lib.remat_runtime_end_step(self.runtime), "remat_runtime_end_step")
            self.stats = self.read_stats()
            if error is not None:
                raise error
        finally:
            self._stop_listening()
            self.session.engine = None
            # The step's records go by reference counting as the step ends:
            # a call and the storages it made refer to each other, so the
            # links go first (else each step would leave thousands of
            # objects in cycles for the garbage collector to find).
            for s in self.by_index:
                s.tensor = None
                s.host = None
                s.ahead = None
                s.backup = None
                s.producer = None
                s.writers = None
                s.readers = None
            self.by_index = []
            self.registered = []
            self.groups = []
            self.moved = {}
            self.storages.clear()
            self.by_id.clear()
            self.runtime = None

    def read_stats(self):
        st = self.session.raw_stats()
        step = {name: getattr(st, name) - getattr(self.start, name) for name in _STEP_COUNTERS}
        return {
            "budget_bytes": self.budget_bytes,
            # The runtime's peak over the budget's steps so far.
            "peak_saved_bytes": st.peak_resident_bytes,
            "saved_bytes": st.resident_bytes,
            "drops": step["drops"],
            "recomputes": step["recomputes"],
            "offloads": step["offloads"],
            "restores": self.restores,
            "recompute_seconds": self.recompute_seconds,
            "copy_seconds": self.copy_seconds,
            "prefetches": step["prefetches"],
            "offloaded_bytes": step["offloaded_bytes"],
            "restored_bytes": step["restored_bytes"],
            "recompute_ns_estimate": step["recompute_ns"],
            "pressure_events": step["pressure_events"],
            # Next uses estimated from the step before (the second step on).
            "learned_next_uses": step["learned_next_uses"],
            # Copies out made ahead (copy_ahead), and the offloads that used one.
            "copies_ahead": step["copies_ahead"],
            "ahead_offloads": step["ahead_offloads"],
            "step": st.steps_ended + (0 if self.closed else 1),
            **self.counts,
            **self._device_figures(),
        }

    def _device_figures(self):
        if self.allocator is None:
            return {"pressure": "saved"}
        figures = self.device_stats if self.device_stats is not None else \
            self.allocator.memory_stats(self.device)
        return {
            "pressure": "allocator",
            # What remat's allocator held on the device over the step: all
            # of the process's memory there, not the saved bytes alone.
            "device_peak_bytes": figures["peak_reserved"],
            "device_peak_allocated_bytes": figures["peak_allocated"],
            "allocator_pressure_events": self.allocator_pressure,
        }

    def _on_event(self, _user, event_p):
        # Under the runtime's lock: let go of a dropped tensor, queue the rest.
        e = event_p.contents
        s = self.by_id.get(e.tensor)
        if s is None:
            return
        if e.kind == _capi.EVENT_DROPPED or e.kind == _capi.EVENT_COLLECTED:
            if s.want_backup and e.kind == _capi.EVENT_DROPPED and e.pressure and \
                    s.tensor is not None and s.tensor_version == s.reg_version and \
                    (s.backup is None or s.backup_version != s.reg_version):
                # (A copy made at an earlier drop still serves.)
                self.pending.append((_BACKUP, s, (s.tensor, s.reg_version)))  # out of the lock
            s.tensor = None
            s.ahead = None
            s.host = None
            s.gen += 1
        elif e.kind == _capi.EVENT_OFFLOADED or e.kind == _capi.EVENT_COPIED_AHEAD:
            if e.kind == _capi.EVENT_OFFLOADED:
                s.gen += 1
            self.pending.append((e.kind, s, None))
        elif e.kind == _capi.EVENT_RESTORED:
            if e.refill:
                return  # from the copy made as it was dropped: _refill copies it in
            self.restores += 1
            self.pending.append((e.kind, s, None))

    def _drain(self):
        """Acts on the queued offloads and restores: the copies themselves."""
        while self.pending:
            kind, s, t = self.pending.pop(0)
            with _Internal(self):
                if kind == _BACKUP:
                    t, version = t
                    # Still dropped, and saved at the content copied.
                    if not s.freed and s.tensor is None and s.reg_version == version:
                        try:
                            s.backup = self._copy_backup(t)
                        except (RuntimeError, MemoryError) as e:
                            if not (isinstance(e, MemoryError) or _out_of_memory(e)):
                                raise
                            # No host memory for it (pinned memory runs out
                            # first): the drop goes on without a copy, as
                            # before there were any.
                            self.counts["backups_skipped"] += 1
                            continue
                        s.backup_version = version
                        self.counts["backups"] += 1
                        self.counts["backup_bytes"] += s.nbytes
                elif kind == _capi.EVENT_COPIED_AHEAD and s.tensor is not None:
                    s.ahead = self._copy_out(s.tensor)  # it stays resident
                    s.host_version = s.tensor_version
                elif kind == _capi.EVENT_OFFLOADED and s.tensor is not None:
                    # The copy made ahead, if no write came since (record()
                    # lets it go on a write), else a copy now.
                    if s.ahead is None:
                        s.host = self._copy_out(s.tensor)
                        s.host_version = s.tensor_version
                    else:
                        s.host = s.ahead  # (host_version: set when it was made)
                    s.ahead = None
                    s.tensor = None
                elif kind == _capi.EVENT_RESTORED and s.host is not None:
                    gen = s.gen
                    t = self._copy_in(s.host, s.device)
                    # Evicted again while the copy in asked for memory (the
                    # allocator's pressure): the runtime's later events rule.
                    if s.gen == gen:
                        s.tensor = t
                        s.tensor_version = s.host_version
                        s.host = None

    def _copy_backup(self, t):
        """A copy of a tensor being dropped (_Storage.want_backup)."""
        return self._copy_out(t)

    def _copy_out(self, t):
        start = time.perf_counter()
        try:
            return self._copy_out_timed(t)
        finally:
            self.copy_seconds += time.perf_counter() - start

    def _copy_out_timed(self, t):
        # The whole storage, flat (no allocation: it may run inside the
        # allocator's pressure callback).
        base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
        if t.device.type != "cuda":
            return base.clone()
        host = torch.empty(base.shape, dtype=t.dtype, pin_memory=True)
        if self.allocator is not None and not self.allocator.records_streams:
            # This PyTorch cannot tell remat's allocator of a use on another
            # stream: the copy runs on the step's own, and is waited for.
            host.copy_(base)
            return host
        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream(t.device)
        self.side_stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(self.side_stream):
            host.copy_(base, non_blocking=True)
        base.record_stream(self.side_stream)
        return host

    def _copy_in(self, host, device):
        start = time.perf_counter()
        try:
            return self._copy_in_timed(host, device)
        finally:
            self.copy_seconds += time.perf_counter() - start

    def _copy_in_timed(self, host, device):
        if device.type == "cuda":
            if self.side_stream is not None:
                torch.cuda.current_stream(device).wait_stream(self.side_stream)
            return host.to(device, non_blocking=True)
        return host.clone()

    def _free_dead(self):
        while self.dead_handles:
            s = self.dead_handles.pop()
            s.handles -= 1
            if s.handles == 0 and s.id is not None and self.runtime is not None:
                if s.id in self.pins:
                    continue  # freed when its pin goes
                self._free(s)

    def _free(self, s):
        if not s.freed and not s.pinned_forever:
            s.freed = True
            if s.backup is not None:
                if s.tensor is None and self.backward_read:
                    # Dropped, and not needed again by the step's backward:
                    # such a drop did no harm. (A step with no backward says
                    # nothing of what one would need.)
                    self._saw_fit(s)
                s.backup = None
            self.lib.remat_tensor_free(self.runtime, s.id)

    def _release_pins(self):
        self.pin_node = None
        pins, self.pins = self.pins, []
        self.pin_bytes = 0
        for id_ in pins:
            self.lib.remat_tensor_release(self.runtime, id_)
        self._drain()
        for id_ in pins:
            s = self.by_id.get(id_)
            if s is not None and s.handles == 0 and id_ not in self.pins:
                self._free(s)

    # --- recording the forward --------------------------------------------------------

    def _refs(self, func, flat):
        """A call's flattened arguments with each tensor as a _Ref (an unseen
        storage becomes a leaf: made before the context, or by something
        unrecorded); what its cost depends on (see CostModel.call_ns: each
        tensor's shape and dtype, every other argument's value); and why it
        cannot be replayed, as far as its arguments say ("" if it can)."""
        storages = self.storages
        refs = []
        sig = []
        why_not = ""
        for a in flat:
            st = _storage(a)
            if st is None:
                refs.append(a)
                sig.append((a.shape, a.dtype) if isinstance(a, torch.Tensor) else a)
                continue
            s = storages.get(st._cdata)
            if s is None:
                s = _Storage(len(self.by_index), True, st._cdata, StorageWeakRef(st))
                storages[st._cdata] = s
                self.by_index.append(s)
            r = _Ref(s, a)
            refs.append(r)
            sig.append((r.size, r.dtype))
            if r.conj_or_neg or (not s.leaf and r.dtype != s.dtype):
                why_not = f"{func} reads a view a replay would not rebuild (conj, neg or dtype)"
        return refs, sig, why_not

    def record(self, func, args, kwargs):
        info = _op_info(func)
        if not info.writes and (info.is_view or torch.is_inference_mode_enabled()):
            # A view's outputs share its argument's storage: a replay
            # rebuilds views with as_strided, so there is nothing to keep.
            # Under torch.inference_mode() the outputs are inference
            # tensors, which autograd never saves: what reads them later
            # reads them as constants (leaves), never replayed.
            return func(*args, **kwargs)
        flat = spec = rng = None
        random_why = ""
        if info.random:
            if func is _CUDNN_RNN and len(args) > 12 and args[12] and args[11] > 0:
                # Its dropout draws from the state cuDNN keeps in dropout_state,
                # which it advances itself: a replay would draw other masks.
                random_why = f"{func} draws its dropout from cuDNN's own random state"
            flat, spec = _flatten_call(args, kwargs)
            cuda_devices = {t.device for t in flat if isinstance(t, torch.Tensor)
                            and t.device.type == "cuda"}
            dev = kwargs.get("device")
            if dev is not None and torch.device(dev).type == "cuda":
                cuda_devices.add(torch.device(dev))
            gens = [g for g in flat if isinstance(g, torch.Generator)]
            rng = _rng_states(info.custom, cuda_devices, gens, info.python_body)
        storages = self.storages
        if not info.writes:
            # It writes nothing, so its arguments are as they were before it:
            # they are read after it, and only where it made a storage (many
            # calls that make none are views under another name:
            # _unsafe_view, an LSTM cell's unsafe_split).
            result = func(*args, **kwargs)
            flat_out = _flatten_result(result)
            for t in flat_out:
                st = _storage(t)
                if st is not None and st._cdata not in storages:
                    break
            else:
                return result
        if flat is None:
            flat, spec = _flatten_call(args, kwargs)
        refs, sig, why_not = self._refs(func, flat)
        written = []
        if info.writes:
            written = _written_indices(func, args, kwargs, len(flat), spec)
            for i in written:
                r = refs[i]
                if not isinstance(r, _Ref):
                    continue
                # A copy made ahead holds the bytes before this write: an
                # offload copies them afresh. (Autograd's saved-tensor
                # version check does not run with saved-tensor hooks: a write
                # can come.)
                r.storage.ahead = None
                if r.storage.leaf and r.storage.readers:
                    self._keep_readers(r.storage, f"computed from a tensor made before the "
                                                  f"budget that {func} then wrote into")
                elif r.storage.id is not None and not r.storage.pinned_forever and \
                        self._overlaps(r.storage, r):
                    # A write into what a saved view reads: autograd will read
                    # the new bytes, so the live storage stays as it is.
                    self._pin_forever(r.storage, f"{func} wrote into it after it was saved")
                    r.storage.tensor = flat[i]
                    r.storage.tensor_version = r.storage.version
            result = func(*args, **kwargs)
            flat_out = _flatten_result(result)

        if info.why_not or random_why:
            why_not = info.why_not or random_why
        elif (not self.allow_nondeterministic and info.nondeterministic and
              any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in flat)):
            why_not = f"{func} is not bitwise deterministic on CUDA"
        for i in written:
            r = refs[i]
            if isinstance(r, _Ref) and r.storage.leaf and not info.writes_unread:
                why_not = why_not or f"{func} writes into a tensor made before the context"
        cost = 0
        if not info.is_view:
            key = None
            if spec is None or type(spec) is _FlatSpec:
                key = (func, None if spec is None else (spec.args, spec.keys), tuple(sig),
                       tuple((t.shape, t.dtype) if isinstance(t, torch.Tensor) else None
                             for t in flat_out))
            cost = self.cost_model.call_ns(func, args, kwargs, result, flat, flat_out, key=key)
        call = _Call(func, spec, refs, rng, cost, why_not, written, torch.is_grad_enabled())
        call.outputs = {}
        # Writes move the written storages to their next version.
        for i in written:
            r = refs[i]
            if isinstance(r, _Ref) and r.storage.leaf:
                r.storage.version += 1  # (what read its bytes cannot be replayed from them now)
            elif isinstance(r, _Ref):
                s = r.storage
                s.writers.append(call)
                s.version += 1
                if s.tensor is not None and s.tensor.untyped_storage()._cdata == s.key:
                    s.tensor_version = s.version  # remat holds the program's own storage
        for j, t in enumerate(flat_out):
            st = _storage(t)
            if st is None or st._cdata in storages:
                continue  # no bytes of its own, or a view of (or written into) a known storage
            s = _Storage(len(self.by_index), False, st._cdata, StorageWeakRef(st),
                         producer=(call, j), dtype=t.dtype, nbytes=st.nbytes(), tensor=t)
            storages[st._cdata] = s
            self.by_index.append(s)
            call.outputs[j] = s
        return result

    # --- saving -----------------------------------------------------------------------

    def pack(self, t):
        # Without the budget's torch-function mode (_Backward): else each
        # metadata read below goes through it, about a microsecond each.
        with _NO_TORCH_FUNCTION():
            return self._pack(t)

    def _pack(self, t):
        if self.closed or self.internal:
            return t
        st = _storage(t)
        if st is None:
            # No strided storage of its own (sparse, nested): kept as
            # autograd keeps it.
            self.counts["saved_unmanaged"] += 1
            return _Kept(t)
        if self.dead_handles:
            self._free_dead()
        if self.pins:
            self._release_pins()  # a forward again: the last backward node has run
        s = self.storages.get(st._cdata)
        if s is None or s.leaf or s.exported or t.dtype != s.dtype or s.nbytes == 0 or \
                (t.is_leaf and t.requires_grad) or t.is_conj() or t.is_neg():
            # Made before the context, a parameter (wherever it was made), one
            # whose bytes were handed outside autograd (exported), a view of
            # another dtype, or one whose conj/neg bit a view would lose.
            self.counts["saved_unmanaged"] += 1
            return _Kept(t)
        if s.id is not None and s.freed and not s.pinned_forever:
            # Saved again after the runtime let it go: a new runtime tensor.
            self.by_id.pop(s.id, None)
            s.id = None
            s.freed = False
            s.regions = []
        if s.id is None:
            self._register(s, t)
        elif s.reg_version != s.version and not s.pinned_forever:
            # Saved again after in-place writes that left the views saved so
            # far alone (else it would be pinned): the newer content serves all.
            _, _, why_not = self._frontier(s, s.version)
            if why_not:
                self._pin_forever(s, "written in place after it was saved, then saved again")
            else:
                s.reg_version = s.version
                self._hold_newest(s, t)
        if not s.pinned_forever:
            s.regions.append((tuple(t.size()), tuple(t.stride()), t.storage_offset()))
        if s.pinned_forever:
            self.counts["saved_unmanaged"] += 1
            return _Kept(t)
        s.handles += 1
        self.counts["saved_tensors"] += 1
        return _Handle(self, s, t)

    def _hold_newest(self, s, t):
        """s is saved again with newer content than remat holds for it (a
        write autograd does not see, beside its saved views). A tensor remat
        recomputed or copied back, or its host copy, holds the content it
        was made of: the program's own storage (t's) holds the newer, which
        every saved view of s now reads."""
        if s.tensor is not None and s.tensor_version != s.version:
            s.tensor = t
            s.tensor_version = s.version
        if s.ahead is not None and s.host_version != s.version:
            s.ahead = None  # made of the older content: an offload copies afresh
        if s.host is not None and s.host_version != s.version:
            with _Internal(self):
                s.host = self._copy_out(t)
            s.host_version = s.version
        if s.backup is not None and s.backup_version != s.version:
            s.backup = None  # of the older content: a replay of the newer must do

    def _overlaps(self, s, r):
        """Whether view r of storage s touches an element a saved view of s
        reads (True when unsure: a storage too large to map cheaply)."""
        if not s.regions:
            return False
        itemsize = torch.empty((), dtype=s.dtype).element_size()
        if r.dtype != s.dtype or s.nbytes // itemsize > (1 << 24):
            return True
        with _Internal(self):
            mask = torch.zeros(s.nbytes // itemsize, dtype=torch.bool)
            for size, stride, offset in s.regions:
                mask.as_strided(size, stride, offset).fill_(True)
            return bool(mask.as_strided(r.size, r.stride, r.offset).any())

    def _pin_forever(self, s, why):
        """Brings s back (recomputed from what its inputs are now) and keeps
        it resident to the end (`why`: for the error if the budget cannot
        hold what is kept)."""
        if s.pinned_forever or s.freed:
            return
        self.why_pinned[s.index] = why
        self._acquire(s)
        s.pinned_forever = True
        self.forever_bytes += s.nbytes
        self._drain()

    def _keep_readers(self, leaf, why):
        """A tensor made before the context is about to be written (or its
        bytes handed outside autograd): what a recompute would read from it
        must be brought back now, while it still holds what they read, and
        kept (`why`: for the error if the budget cannot hold what is kept)."""
        if self.pins:
            self._release_pins()
        self._free_dead()
        readers, leaf.readers = leaf.readers, None
        for ref in readers:
            s = ref()
            if s is not None and s.id is not None:
                self._pin_forever(s, why)

    def exported(self, t):
        """t's bytes are handed outside autograd (numpy, DLPack, data_ptr):
        from now on they may be written with no ATen call to record (a
        numpy ufunc's out=, a kernel of another library), so remat cannot
        know what they hold. Its rule: such a storage is never dropped and
        never offloaded (its copy would miss a later write): saved before,
        it stays resident from now on, as the program's own bytes, to the
        step's end; saved after, it is left to autograd. And no replay reads
        it: what was saved before and would is brought back now (while the
        bytes still hold what it read) and kept; what is saved after and
        would is not droppable (offloaded, if at all, as its own bytes)."""
        if self.closed or self.internal:
            return
        st = _storage(t)
        if st is None:
            return
        s = self.storages.get(st._cdata)
        if s is None:
            s = _Storage(len(self.by_index), True, st._cdata, StorageWeakRef(st))
            self.storages[st._cdata] = s
            self.by_index.append(s)
        if s.exported:
            return
        s.exported = True
        if s.readers:
            self._keep_readers(s, "computed from bytes handed outside autograd (numpy, DLPack, "
                                  "data_ptr), which may be written there")
        if not s.leaf and s.id is not None and not s.freed:
            self._pin_forever(s, "its bytes were handed outside autograd (numpy, DLPack, "
                                 "data_ptr)")
            if s.tensor is None or s.tensor.untyped_storage()._cdata != s.key:
                with _below_python_dispatch():
                    whole = torch.empty(0, dtype=s.dtype, device=t.device)
                    s.tensor = whole.set_(st, 0, (s.nbytes // whole.element_size(),), (1,))
            s.tensor_version = s.version

    def data_set(self, t):
        """`t.data = ...` is about to move t onto other bytes. Autograd reads
        what t holds then where it saved t as an input (it holds t itself),
        and the bytes it saved where it saved t as an output (a copy of its
        TensorImpl): remat's own hold of t's present bytes must not follow
        t, and the handles of t saved as an input read t (unpack)."""
        if self.closed:
            return
        st = _storage(t)
        s = self.storages.get(st._cdata) if st is not None else None
        if s is not None and not s.leaf:
            if s.tensor is t:
                s.tensor = _alias(t)
            if s.tensor_ref is not None and s.tensor_ref() is t:
                s.tensor_ref = None  # (no longer a tensor over s)
        self.moved[id(t)] = t

    def _register(self, s, t):
        inputs, cost, why_not = self._frontier(s, s.version)
        s.droppable = not why_not
        s.why_kept = why_not
        if why_not:
            self.counts["kept_not_replayable"] += 1
        allow_drop = 1 if (self.recompute and s.droppable) else 0
        allow_offload = 1 if self.offload else 0
        if self.weigh_replays:
            # (Keyed in the order tensors are handed over, as in every step.)
            self._beside_key(s)
        if allow_drop and allow_offload:
            # Dropped only where its replay can fit: the runtime estimates what
            # the replay holds at once, from its call graph; the planner admits
            # it by that, and by what earlier steps learned of its kind.
            verdict, s.copy_first = self.planner.admit_drop(
                s.beside_key, s.nbytes, self._replay_estimate(inputs, s.nbytes),
                self.replay_room)
            if verdict == _capi.OFFLOAD_OVER_SHARE:
                allow_drop = 0
                self.counts["offload_not_drop"] += 1
            elif verdict == _capi.OFFLOAD_BESIDE_PINNED:
                allow_drop = 0
                self.counts["offload_not_drop_seen"] += 1
            elif verdict == _capi.OFFLOAD_SEEN_TO_FAIL:
                allow_drop = 0
                self.counts["offload_not_drop_failed"] += 1
        s.want_backup = bool(allow_drop and allow_offload) and self._wants_backup(s)
        if allow_drop and self.drop_first:
            allow_offload = 0
        tid = ctypes.c_uint64()
        s.tensor = t
        s.tensor_version = s.version
        s.device = t.device
        s.reg_version = s.version
        call = s.producer[0]
        s.allow_drop = allow_drop
        sibling = self._sibling(s)
        if sibling is not None:
            # One more output of a call the runtime knows: its content is the
            # call's alone (no write since), so the call's run regenerates it.
            status = self.lib.remat_call_add_output(self.runtime, sibling.id, s.nbytes,
                                                    allow_drop, allow_offload, 0,
                                                    ctypes.byref(tid), None)
        else:
            opts = _capi.CallOptions()
            ids = _id_array(max(1, len(inputs)))(*[i.id for i in inputs])
            opts.inputs = ids
            opts.num_inputs = len(inputs)
            opts.compute_ns = max(1, cost)
            opts.allow_drop = allow_drop
            opts.allow_offload = allow_offload
            # A copy made ahead is let go where record() sees a write to the
            # storage, so the runtime may copy ahead what it saved.
            opts.read_only = 1 if self.copy_ahead else 0
            opts.recompute = self.session.recompute_fn if allow_drop else \
                _capi.CALL_RECOMPUTE_FN()
            opts.user_data = len(self.groups)
            size = ctypes.c_size_t(s.nbytes)
            status = self.lib.remat_call_create(self.runtime, 1, ctypes.byref(size),
                                                ctypes.byref(opts), 0, ctypes.byref(tid), None)
        if status != _capi.OK:
            s.tensor = None
            message = self.lib.remat_last_error().decode("utf-8", "replace")
            if status == _capi.OUT_OF_MEMORY:
                raise self._cannot_hold(s, t, call.func)
            raise _capi.RematError(status, message)
        if sibling is not None:
            self.groups[call.group].append(s)
            s.group = call.group
        else:
            self.groups.append([s])
            s.group = len(self.groups) - 1
            if s.reg_version == 0:
                call.group = len(self.groups) - 1  # later outputs may join it
        s.id = tid.value
        self.by_id[s.id] = s
        s.order = len(self.registered)
        self.registered.append(s)
        self.lib.remat_tensor_release(self.runtime, s.id)
        self._drain()

    def _cannot_hold(self, s, t, func):
        """BudgetTooSmall for saved storage s (tensor t, made by func) that
        the runtime could not make room for as it was saved."""
        return self._budget_too_small(self._beside_what(
            s, f"cannot hold a saved tensor of {s.nbytes} bytes ({tuple(t.shape)} {t.dtype}, "
            f"made by {func})"))

    def _beside_what(self, s, what):
        """An error's two lines: the budget `what` (for storage s) beside
        what it held that it could not let go, and why; the ways out."""
        live = [k for k in self.registered if not k.freed and k is not s]
        kept = [k for k in live if k.pinned_forever]
        read_ids = set(self.pins)
        read = [k for k in live if k.id in read_ids and not k.pinned_forever]
        stuck = [k for k in live if not k.pinned_forever and k.id not in read_ids and
                 not k.allow_drop and not self.offload and k.tensor is not None]
        held = []
        fixes = []
        if kept:
            whys = "; ".join(sorted({self.why_pinned.get(k.index, "") for k in kept} - {""}))
            held.append(f"{_count(kept)} ({sum(k.nbytes for k in kept)} bytes) kept to "
                        f"the step's end ({whys})")
            fixes.append("make that write out of place (y = x + 1, not x.add_(1)) or do it "
                         "after the backward")
        if stuck:
            whys = "; ".join(sorted({k.why_kept for k in stuck} - {""}))
            held.append(f"{_count(stuck)} ({sum(k.nbytes for k in stuck)} bytes) that "
                        f"cannot be replayed ({whys}) with offload off")
            fixes.append("pass offload=True")
        if read:
            held.append(f"{_count(read)} ({sum(k.nbytes for k in read)} bytes) the "
                        "backward is reading now")
        need = s.nbytes + sum(k.nbytes for k in kept + stuck + read)
        fixes.append(f"raise the budget to at least {need} bytes" if need > self.budget_bytes
                     else "raise the budget")
        beside = ", ".join(held) if held else "nothing it must keep"
        fix = "; or ".join(fixes)
        return (f"remat.torch.budget({self.budget_bytes} bytes) {what} beside {beside}.\n"
                f"{fix[0].upper()}{fix[1:]}.")

    def _saw_fit(self, s):
        """A drop of s came back by replay, or was never needed again."""
        if s.beside_key is not None:
            self.planner.saw_replay(s.beside_key, s.nbytes, True)

    def _saw_fail(self, s):
        """A replay of dropped s could not fit."""
        if s.beside_key is not None:
            self.planner.saw_replay(s.beside_key, s.nbytes, False)

    def report_unfit(self):
        """The step raised BudgetTooSmall: the replay that failed it (no
        copy to come back from) is one its plan's next steps offload."""
        if self.unfit is not None:
            self._saw_fail(self.unfit)
            self.unfit = None

    def _wants_backup(self, s):
        """Whether a drop of s (its drop and offload both allowed) is copied
        to host memory first: no replay of its kind and size was seen to
        fit in the steps before (the planner's books)."""
        return s.copy_first

    def _beside_key(self, s):
        """s's kind in what steps learn (the planner's books, a 64-bit key):
        its producing op, which output, and how many such this step handed
        to the runtime before it (made once, as s is registered). The same
        tensor of every step of a program gets the same key."""
        if s.beside_key is None:
            call, j = s.producer
            kind = (str(call.func), j)
            n = self.kinds_handed.get(kind, 0)
            self.kinds_handed[kind] = n + 1
            s.beside_key = hash(kind + (n,)) & 0xFFFFFFFFFFFFFFFF
        return s.beside_key

    def _replay_estimate(self, inputs, nbytes):
        """The runtime's estimate of what a replay of a call reading the
        saved storages `inputs` and making `nbytes` holds at once."""
        ids = _id_array(max(1, len(inputs)))(*[i.id for i in inputs])
        out = self._estimate
        _capi.check(self.lib.remat_runtime_estimate_replay(self.runtime, ids, len(inputs), nbytes,
                                                           out),
                    "remat_runtime_estimate_replay")
        return out

    def _sibling(self, s):
        """A live saved output of s's call that s may join in the runtime
        (same content version 0, dropped alike: the runtime's call has a
        recompute closure or not), or None."""
        call = s.producer[0]
        if s.reg_version != 0 or call.group is None:
            return None
        for m in self.groups[call.group]:
            if m.id is not None and not m.freed and m.reg_version == 0 and \
                    m.allow_drop == s.allow_drop:
                return m
        return None

    @staticmethod
    def _brings_back(s, version):
        """Whether what the runtime brings back of saved storage s holds
        its content `version`: the tensor remat holds, its host copy, or a
        recompute (of its registered version). The program's own storage,
        written since it was saved, holds a later one."""
        if s.tensor is not None:
            return s.tensor_version == version
        if s.host is not None:
            return s.host_version == version
        return True

    def _frontier(self, s, version):
        """The saved storages a recompute of (s, version) reads (the runtime
        brings them back first), its cost, and why it cannot be replayed ("")."""
        inputs = []
        seen_inputs = set()
        cost = 0
        visited = set()
        read = set()  # the storages its recompute reads (Engine.exported)
        stack = [(s, version, True)]
        while stack:
            st, ver, top = stack.pop()
            if (st.index, ver) in visited:
                continue
            visited.add((st.index, ver))
            if st.exported:
                return [], 0, "its recompute reads bytes handed outside autograd (numpy, ...)"
            if not top:
                read.add(st)
            if not top and st.id is not None and not st.freed and st.reg_version == ver and \
                    self._brings_back(st, ver):
                if st.id not in seen_inputs:
                    seen_inputs.add(st.id)
                    inputs.append(st)
                continue
            if st.leaf:
                continue
            calls = [st.producer[0]] + st.writers[:ver]
            for call in calls:
                if call.why_not:
                    return [], 0, call.why_not
                cost += call.cost_ns
                for i, r in enumerate(call.leaves):
                    if not isinstance(r, _Ref):
                        continue
                    if r.storage.leaf:
                        if i in call.written:
                            continue  # replayed onto a scratch copy
                        if (r.version is not None and r.leaf_tensor._version != r.version) or \
                                r.storage.version != r.storage_writes:
                            return [], 0, (f"{call.func} read a tensor made before the context "
                                           "that was modified in place since")
                        if r.storage.exported:
                            return [], 0, ("its recompute reads bytes handed outside autograd "
                                           "(numpy, ...)")
                        read.add(r.storage)
                    elif r.storage is not st:  # (st itself: the content being rebuilt)
                        stack.append((r.storage, r.version, False))
        me = weakref.ref(s)
        for st in read:
            if st.readers is None:
                st.readers = []
            st.readers.append(me)
        return inputs, cost, ""

    # --- bringing back ----------------------------------------------------------------

    def unpack(self, h):
        with _NO_TORCH_FUNCTION():  # (as pack)
            return self._unpack(h)

    def _unpack(self, h):
        if type(h) is _Kept:
            _check_version(h, h.tensor)
            return h.tensor  # left to autograd at pack time
        if not isinstance(h, _Handle):
            return h
        if self.closed:
            raise RuntimeError("a tensor saved under remat.torch.budget was used after the "
                               "context ended: run the backward inside the `with`")
        s = h.storage
        # Before anything moves: a tensor modified in place since it was
        # saved is an error, as in a plain step.
        source = h.source() if h.source is not None else None
        _check_version(h, source, s)
        if source is not None and self.moved.get(id(source)) is source:
            # Saved as an input and moved by `.data =` since: autograd
            # reads what it holds now.
            return _alias(source)
        # Pins last while the autograd node that unpacked them runs: the
        # engine unpacks a node's saved tensors just before applying it, and
        # they all stay until another node (or another backward: autograd's
        # graph task) unpacks. The node's own calls between its unpacks (the
        # detach after each) do not end them: the node still holds them.
        self.backward_read = True
        node = torch._C._current_autograd_node()
        task = torch._C._current_graph_task_id()
        if node is None or node is not self.pin_node or task != self.pin_task:
            self._release_pins()  # the previous backward node has run
            self.pin_node = node  # held: a wrapper's id() could be reused
            self.pin_task = task
        self._free_dead()
        # A storage counts once beside another, however many of its views
        # the node reads (a chunk's halves, q and k of one projection).
        again = s.id in self.pins or s.pinned_forever
        if self.weigh_replays and not again:
            self.planner.saw_pinned(self._beside_key(s), s.nbytes,
                                    self.pin_bytes + self.forever_bytes)
        self._acquire(s)
        self.pins.append(s.id)
        if not again:
            self.pin_bytes += s.nbytes
        self._drain()
        if self.offload:
            self._prefetch_before(s)
        base = s.tensor
        if base is None:
            raise RuntimeError(f"remat: saved storage {s.index} is resident in the runtime but "
                               "has no tensor (a bug)")
        # The view of a plain tensor is remat's own: built below the Python
        # dispatch key, so no mode (this recorder's, or another's) handles it
        # (through the recorder it cost some fifty microseconds on the CPU).
        # A tensor subclass keeps its own dispatch.
        if type(base) is torch.Tensor:
            with _below_python_dispatch():
                return torch.as_strided(base, h.size, h.stride, h.offset)
        with _Internal(self):
            return torch.as_strided(base, h.size, h.stride, h.offset)

    # The backward reads saved tensors about in the reverse order of saving:
    # the next few offloaded ones before this are copied in now, so that the
    # copy (on a side stream, on CUDA) runs behind this node's compute.
    PREFETCH_AHEAD = 2
    PREFETCH_SCAN = 64

    def _prefetch_before(self, s):
        found = 0
        for i in range(s.order - 1, max(-1, s.order - 1 - self.PREFETCH_SCAN), -1):
            t = self.registered[i]
            if t.freed or t.pinned_forever or t.host is None or t.tensor is not None:
                continue
            status = self.lib.remat_tensor_prefetch(self.runtime, t.id, 0)
            if status != _capi.OK:
                break  # no room now: it comes back on access
            found += 1
            if found == self.PREFETCH_AHEAD:
                break
        self._drain()

    def _acquire(self, s):
        """The runtime brings s back and pins it (one release each); where
        its replay cannot fit and a backup of it was made as it was dropped,
        from the backup."""
        p = ctypes.c_void_p()
        # The allocator's failed requests so far, and those the step has seen
        # (a replay's own, seen by check_allocator inside it, are answered below).
        ooms, seen = (self.allocator.num_ooms(self.device), self.ooms) if self.listening else (0, 0)
        replayed = s.tensor is None and s.host is None  # dropped: its acquire replays it
        try:
            self._call_runtime(self.lib.remat_tensor_acquire, s.id, 0, ctypes.byref(p))
        except (BudgetTooSmall, RuntimeError) as e:
            if id(e) in self.callback_errors or \
                    not (isinstance(e, BudgetTooSmall) or _out_of_memory(e)):
                raise
            if not self._refill(s):
                # No copy to come back from: unless a replay this one runs
                # inside comes back from its own copy, the step fails, and
                # where s was dropped (not offloaded: no room for it alone),
                # the next steps of its plan offload its kind (failed_replays).
                self.unfit = s if replayed else None
                raise
            if self.listening:
                # The replay's failed requests are answered: not the step's
                # error (others before it still are).
                self.ooms = seen + self.allocator.num_ooms(self.device) - ooms
        # Back: a replay that failed inside this one (rebuilt, or refilled)
        # is not the step's failure.
        self.unfit = None

    def _refill(self, s):
        """Brings dropped s back, pinned, from the copy made as it was
        dropped (_Storage.want_backup): room for s alone, no replay. False
        where there is no such copy, or no room even for s."""
        if s.backup is None or s.backup_version != s.reg_version or s.tensor is not None or \
                s.freed:
            return False
        self._drain()
        p = ctypes.c_void_p()
        if self.lib.remat_tensor_refill(self.runtime, s.id, 0, ctypes.byref(p)) != _capi.OK:
            return False
        try:
            with _Internal(self):
                s.tensor = self._copy_in(s.backup, s.device)
        except BaseException:
            # Dropped again, as Python has it (the block was never written).
            self.lib.remat_tensor_release(self.runtime, s.id)
            self.lib.remat_tensor_evict(self.runtime, s.id, _EVICT_DROP, 0, None)
            self._drain()
            raise
        s.tensor_version = s.reg_version
        self.counts["backups_used"] += 1  # (the copy is kept for a later drop of it)
        self._saw_fail(s)
        return True

    def _call_runtime(self, fn, *args):
        self.error = None
        status = fn(self.runtime, *args)
        if self.error is not None:
            error, self.error = self.error, None
            try:
                raise error
            finally:
                del error  # no cycle through this frame: the collector waits out the step
        _interrupts.deliver()  # one that landed in a callback the call made
        if status != _capi.OK:
            message = self.lib.remat_last_error().decode("utf-8", "replace")
            if status == _capi.OUT_OF_MEMORY:
                s = self.by_id.get(args[0]) if fn is self.lib.remat_tensor_acquire else None
                if s is None:
                    raise self._budget_too_small(
                        f"remat.torch.budget({self.budget_bytes} bytes): {message}")
                raise self._budget_too_small(self._beside_what(
                    s, f"cannot make room to bring back a saved tensor of {s.nbytes} bytes "
                    f"(made by {s.producer[0].func})"))
            raise _capi.RematError(status, message)

    def _on_recompute(self, user_data, _inputs, _n, _outs, _bytes, regenerate, num_outputs,
                      _stream):
        group = self.groups[user_data or 0]
        done = []
        start = time.perf_counter()
        outer = not self.in_replay  # (a replay may ask for another: counted once)
        self.in_replay = True
        with _Internal(self):
            try:
                _interrupts.deliver()  # one that landed in the library: the replay stops
                self._drain()
                memo = {}  # one run of the call serves every output it regenerates
                # Below autograd (no graph, outputs that need no grad), each call
                # in the grad mode it was recorded in.
                with torch._C._AutoDispatchBelowAutograd():
                    for i in range(num_outputs):
                        if regenerate[i]:
                            s = group[i]
                            done.append(s)
                            s.tensor = self._materialize(s, s.reg_version, memo, top=True)
                            s.tensor_version = s.reg_version
                self._drain()
                for s in done:
                    self._saw_fit(s)  # (its copy is kept for a later drop of it)
                return 0
            except BaseException as e:  # noqa: BLE001: carried to the caller
                for s in done:
                    # The runtime gives their blocks back: still dropped.
                    s.tensor = None
                self.error = e
                self.lib.remat_recompute_set_error(str(e).encode("utf-8", "replace")[:1000])
                return 1
            finally:
                if outer:
                    self.in_replay = False
                    self.recompute_seconds += time.perf_counter() - start

    def _materialize(self, s, version, memo, top=False):
        """A tensor over a storage holding (s, version)'s content, recomputed
        where nothing holds it. `top`: the storage the runtime is
        recomputing now (not to be asked of the runtime)."""
        k = (s.index, version)
        if k in memo:
            return memo[k]
        managed = not top and s.id is not None and s.reg_version == version
        rebuilt = False
        if managed and s.tensor is not None and s.tensor_version == version:
            return s.tensor
        if managed and s.tensor is None and not s.freed:
            # Saved since this recompute's inputs were listed: the runtime
            # brings it (or its backup does).
            try:
                self._acquire(s)
            except BudgetTooSmall:
                # No room for it beside the outputs the runtime is
                # regenerating now. Where the runtime may drop it (its
                # replay was judged to fit), it is rebuilt below from its
                # own call, a temporary of this replay as the replay's
                # unsaved intermediates are; the runtime keeps it as it was.
                # (Under the allocator's pressure a request that does not
                # fit raises out of memory, not this.)
                self._drain()
                if not (s.droppable and s.allow_drop):
                    raise
                rebuilt = True
            else:
                try:
                    self._drain()
                    if s.tensor is not None and s.tensor_version == version:
                        return s.tensor
                finally:
                    self.lib.remat_tensor_release(self.runtime, s.id)
        if managed and not s.droppable:
            # What remat holds was written since it was saved (through an
            # alias autograd does not track, else it would be pinned), and
            # what it held before cannot be replayed.
            raise RuntimeError(
                f"remat cannot recompute what storage {s.index} held when it was saved (made by "
                f"{s.producer[0].func}): it was written since, and its content cannot be "
                f"replayed ({s.why_kept})")
        t0 = s.tensor_ref() if s.tensor_ref is not None else None
        if t0 is not None and s.version == version:
            return t0  # still alive (the user holds it): nothing to run
        call, j = s.producer
        if version == 0:
            # Its call's content: one run serves all its outputs (a call's
            # outputs regenerated together, or read by one replay).
            out = memo.get(call)
            if out is None:
                out = memo[call] = _flatten_result(self._run(call, memo, rebuild=None))
        else:
            # Written over below: a run of its own, so that no one else
            # sees the writes.
            out = _flatten_result(self._run(call, memo, rebuild=None))
        base = out[j]
        for w in s.writers[:version]:
            self._run(w, memo, rebuild=(s, base))
        memo[k] = base
        if rebuilt:
            self.counts["rebuilt_in_replay"] += 1
        return base

    def _run(self, call, memo, rebuild):
        """Runs a recorded call again. `rebuild` = (storage, tensor): that
        storage's arguments become views of `tensor` (an in-place call
        replayed onto fresh content); other written arguments are scratch
        copies, so a replay changes nothing outside what it rebuilds."""
        args = []
        for i, r in enumerate(call.leaves):
            if not isinstance(r, _Ref):
                args.append(r)
                continue
            if rebuild is not None and r.storage is rebuild[0]:
                base = rebuild[1]
            elif r.storage.leaf:
                if ((r.version is not None and r.leaf_tensor._version != r.version) or
                        r.storage.version != r.storage_writes) and i not in call.written:
                    raise RuntimeError(
                        f"remat cannot recompute {call.func}: an input made before the context "
                        f"({tuple(r.leaf_tensor.shape)} {r.leaf_tensor.dtype}) was modified "
                        "in place after the forward used it")
                base = r.leaf_tensor
            else:
                base = self._materialize(r.storage, r.version, memo)
            v = torch.as_strided(base, r.size, r.stride, r.offset)
            if i in call.written and (rebuild is None or r.storage is not rebuild[0]):
                v = v.clone()
            args.append(v)
        a, kw = _unflatten_call(args, call.spec)
        self.counts["recomputed_calls"] += 1
        with torch.set_grad_enabled(call.grad):
            return self._run_in_rng(call, a, kw)

    @staticmethod
    def _run_in_rng(call, a, kw):
        """call.func(*a, **kw) in the random-number state it first ran in."""
        if call.rng is None:
            return call.func(*a, **kw)
        # The live states, as the recorded ones cover (a generator= of the
        # user's own included), are put back after the replay.
        live = _rng_states(False, call.rng[1], [g for g, _ in call.rng[2]],
                           call.rng[3] is not None)
        _set_rng_states(call.rng)
        try:
            return call.func(*a, **kw)
        finally:
            _set_rng_states(live)


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


class budget:
    """Runs what is inside the `with` under a budget of resident saved
    activations. See docs/torch_budget.md for the whole story. Enter it
    once per step: it keeps its runtime between steps, which learns each
    step's next uses for the next; close() (or the object's end) lets it go.

        with remat.torch.budget("2GiB", policy="dtr-eq") as run:
            loss = model(batch).sum()
            loss.backward()
        print(run.stats)

    budget: bytes (int) or a size string ("2GiB", "512MiB").
    policy: a remat eviction-policy spec ("dtr", "dtr-eq", "lru", "largest",
        "dtr:staleness_exp=2", ...), or a list of them to try: the first
        steps are then a trial of each (as the offload guard's below, for
        each policy in turn), and the budget keeps the policy, and plan,
        whose quickest timed step was quickest (`stats["policy"]`). A
        policy's best plan depends on the model, the budget and the link
        (`remat sweep` shows it offline); the trial finds it online, at
        TRIAL_STEPS steps per plan tried.
    offload / recompute: allow offloading to host memory / dropping for
        recompute (at least one).
    offload_guard: with both allowed, allowing offload must not make the
        steps slower than drops alone. The budget's first steps are a trial:
        TRIAL_STEPS steps with the policy's mixed plans (drops and
        offloads), then as many dropping first (offloading only what cannot
        be dropped; the first of each learns, the others are timed), and it
        keeps the plan whose quickest timed step was quicker
        (`stats["plan"]`: "trial", then "mixed" or "drop-first"; with
        several policies, the policy's spec and the plan, as "dtr-eq
        drop-first"). A plan whose trial step raised BudgetTooSmall leaves
        the trial (`stats["debug"]["plans_refused"]`). False: mixed plans throughout.
        With both allowed, a drop of a tensor whose kind and size no replay
        has yet been seen to fit is copied to host memory first; where its
        replay then cannot fit, it comes back from that copy
        (`stats["debug"]["backups_used"]`) and its kind is offloaded from then on.
    copy_ahead: with offload allowed, once the budget has bound the runtime
        copies the next tensor its policy would offload to host memory
        while it is still resident (on CUDA on a side stream), so that its
        eviction later frees it at once (`stats["debug"]["copies_ahead"]`,
        `stats["debug"]["ahead_offloads"]`). Off by default: its effect on a GPU
        step is not measured yet (the simulator's is: docs/torch_budget.md).
    allow_nondeterministic: on CUDA, let kernels PyTorch marks as not
        bitwise deterministic be recomputed too.
    pressure: what the budget counts, and so what drives the evictions.
        "saved": the resident saved activations (the runtime's own budget,
        with any allocator). "allocator": everything remat's allocator holds
        on the GPU for the process (parameters, gradients, optimizer state,
        temporaries and saved activations): libremat_torch.so must be
        PyTorch's CUDA allocator (remat.torch.use_allocator()); it is capped
        at the budget while the `with` is open, and when a request does not
        fit, its pressure makes the runtime evict, by its policy, what the
        request lacks. "auto" (default): "allocator" where use_allocator()
        was called, else "saved". stats then add device_peak_bytes (what the
        allocator reserved at most over the step; under "debug",
        allocator_pressure_events).
    tflops, hbm_gbps: the device rates recompute costs are estimated at.
    link_gbps, link_latency_us: with offload allowed, the host link's rate
        each way and its latency per copy, at which offloads are priced
        against recomputes. None: measured once per device and process (a
        pinned copy to and from the GPU; a host copy on the CPU), shown in
        stats["debug"]["link_gbps"] and ["link_latency_ns"].
    pause_gc: Python's automatic garbage collection waits while the context
        is open (on any thread; as it was once no budget is open). The
        recording makes a few objects per ATen call that live for the step:
        collections in the middle of a step find them all alive, and move
        them to the generation whose full collections cost a tenth of a
        second or more in a process with torch loaded (a fifth of the
        budget's own time per step, bench/torch_overhead.py). The step's
        records go by reference counting when it ends; a cycle the step's
        own code makes waits for the first collection after it. A context
        never left (a generator suspended inside it and dropped) leaves the
        collector paused: leave every budget you enter, or pass False.
    native: True records the calls and saves the tensors in C++
        (remat.torch._native: a torch extension built on first use), several
        times less per call; drops only, one policy, the saved-bytes budget
        (other options are refused). None: native where REMAT_TORCH_NATIVE=1
        and the options allow it, else the Python recorder.
    """

    # Steps of each plan in the offload guard's trial: one that learns the
    # step's next uses, then timed ones.
    TRIAL_STEPS = 3

    def __init__(self, budget, policy="dtr", offload=False, recompute=True,
                 allow_nondeterministic=False, tflops=None, hbm_gbps=None,
                 offload_guard=True, copy_ahead=False, pause_gc=True, pressure="auto",
                 native=None, link_gbps=None, link_latency_us=None):
        self.budget_bytes = _budget_bytes(budget)
        for name, value in (("link_gbps", link_gbps), ("link_latency_us", link_latency_us)):
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, (int, float)) or
                                      not math.isfinite(value) or value < 0 or
                                      (name == "link_gbps" and value == 0)):
                raise ValueError(f"{name} must be a finite number above 0 (at least 0 for the "
                                 f"latency), or None to measure it, not {value!r}")
        self._link_given = (link_gbps, link_latency_us)
        self._link_rates = None  # what the last runtime made was given
        if native is None:
            # REMAT_TORCH_NATIVE=1: the native recorder wherever the options allow it.
            native = os.environ.get("REMAT_TORCH_NATIVE") == "1" and not offload and \
                pressure != "allocator" and isinstance(policy, str)
        self._native = bool(native)
        if self._native and (offload or pressure == "allocator" or not isinstance(policy, str)):
            raise ValueError("native=True records in C++ and drops only, under the saved-bytes "
                             "budget, with one policy: offload, pressure='allocator' and a list "
                             "of policies need the Python recorder (native=False)")
        if pressure not in ("auto", "saved", "allocator"):
            raise ValueError(f"pressure must be 'auto', 'saved' or 'allocator', not {pressure!r}")
        self._pressure = pressure
        policies = [policy] if isinstance(policy, str) else list(policy) \
            if isinstance(policy, (list, tuple)) else None
        if not policies or not all(isinstance(p, str) and p for p in policies) or \
                len(set(policies)) != len(policies):
            raise ValueError(f"policy must be a policy spec such as 'dtr', or a list of "
                             f"different ones to try, not {policy!r}")
        if not offload and not recompute:
            raise ValueError("with neither offload nor recompute allowed, nothing could leave "
                             "the budget: allow at least one")
        kw = {}
        if tflops is not None:
            kw["tflops"] = tflops
        if hbm_gbps is not None:
            kw["hbm_gbps"] = hbm_gbps
        self._recompute = bool(recompute)
        self._copy_ahead = bool(copy_ahead)
        self._pause_gc = bool(pause_gc)
        self._gc_paused = False
        self._allow_nondeterministic = bool(allow_nondeterministic)
        self._cost_model = CostModel(**kw)
        # A plan's kind: (name, offload allowed, drops first).
        if offload and recompute:
            kinds = [("mixed", True, False), ("drop-first", True, True)] if offload_guard \
                else [("mixed", True, False)]
        else:
            kinds = [("drop-only", False, False)] if recompute else \
                [("offload-only", True, False)]
        # The plans: name -> (policy spec, offload allowed, drops first), in
        # the order tried (a tie keeps the earlier: the first policy's own
        # choice).
        self._plans = {}
        for p in policies:
            for kind, with_offload, drop_first in kinds:
                name = kind if len(policies) == 1 else f"{p} {kind}"
                self._plans[name] = (p, with_offload, drop_first)
        self._plan_names = list(self._plans)
        # A spec the runtime refuses is an error now, not steps later when
        # its turn in the trial comes.
        for p in policies:
            _Session(self.budget_bytes, p, offload, recompute).close()
        self._planner = None
        self._clock = time.perf_counter
        self._sessions = {}           # plan -> _Session
        self._start_over()
        self._engine = None
        self._mode = None
        self._backward = None
        self._hooks = None
        self._keep_saved_block = None  # [remat's hooks] while a keep_saved() block is open
        self.stats = None
        # Held by the thread whose step is open (one at a time), and who that is.
        self._open = threading.Lock()
        self._owner = None
        self._interrupt_token = False
        self._interrupts_at_start = 0

    def _start_over(self):
        """As new: no step run, no runtime, the trial (if any) to come."""
        if self._planner is not None:
            self._planner.close()
        # Which plan each step runs, and which the trial keeps: the runtime's
        # step planner (TRIAL_STEPS per plan: one learning, then timed ones).
        self._planner = StepPlanner(
            [(name, policy, self._recompute, offload, drop_first)
             for name, (policy, offload, drop_first) in self._plans.items()],
            learning_steps=1, timed_steps=self.TRIAL_STEPS - 1)
        self._step_plan = None
        self._step_index = None
        self._step_timed = False
        self._step_in_trial = False
        self._step_start = None
        self._steps = 0

    def _plan_shown(self):
        """What stats["plan"] says of the step running or just run."""
        return "trial" if self._step_in_trial else self._step_plan

    @_interrupts.critical
    def __enter__(self):
        # First remat's SIGINT handler: an interrupt from here to the end of
        # the entry waits for it, then the step is undone and it is raised.
        token = _interrupts.install()
        try:
            self._claim()
            try:
                if _active.get(threading.get_ident()) is not None:
                    raise RuntimeError("remat.torch.budget contexts do not nest: one budget "
                                       "covers the whole step")
                if self._pause_gc:
                    _pause_gc()
                    self._gc_paused = True
                try:
                    self._enter()
                except BaseException:
                    self._resume_gc()
                    raise
            except BaseException:
                self._release()
                raise
        except BaseException:
            _interrupts.uninstall(token)
            raise
        self._interrupt_token = token
        self._interrupts_at_start = _interrupts.delivered()
        if _interrupts.pending():
            # Interrupted while entering: the step never begins (nor counts
            # as one that ran through: the plan trial does not time it).
            self.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)
            _interrupts.deliver()
        return self

    def _claim(self):
        """This thread's hold on the object for one step: refused (and the
        object left as it is) while it is open, on this thread or another."""
        if not self._open.acquire(blocking=False):
            if self._owner == threading.get_ident():
                raise RuntimeError("this remat.torch.budget is already open: leave it before "
                                   "entering it for the next step")
            raise RuntimeError("this remat.torch.budget is open on another thread: give each "
                               "thread a remat.torch.budget of its own")
        self._owner = threading.get_ident()

    def _release(self):
        self._owner = None
        self._open.release()

    def _resume_gc(self):
        if self._gc_paused:
            self._gc_paused = False
            _resume_gc()

    def _link(self, offload, allocator):
        """(GB/s, ns) of the host link offloads are priced at: as given, or
        measured on the device the step's copies go to (None: no offload)."""
        if not offload:
            return None
        gbps, latency_us = self._link_given
        if gbps is None or latency_us is None:
            on_gpu = allocator is not None or (torch.cuda.is_available() and
                                               torch.cuda.is_initialized())
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu"
            measured = _link.measure(device)
            gbps = measured[0] if gbps is None else gbps
            latency_ns = measured[1] if latency_us is None else int(latency_us * 1000)
        else:
            latency_ns = int(latency_us * 1000)
        self._link_rates = (float(gbps), latency_ns)
        return self._link_rates

    def _allocator(self):
        """remat's allocator whose pressure drives this step, or None."""
        allocator = _allocator.current()
        if self._pressure == "allocator":
            if allocator is None:
                raise RuntimeError("pressure='allocator' needs remat's allocator as PyTorch's: "
                                   "call remat.torch.use_allocator() before the first CUDA "
                                   "allocation")
            return allocator
        if self._pressure == "auto" and allocator is not None and allocator.installed:
            return allocator
        return None

    def _enter(self):
        step = self._planner.begin()
        try:
            self._enter_step(step)
        except BaseException:
            self._planner.end(StepPlanner.ABANDONED)
            raise
        return self

    def _enter_step(self, step):
        plan = self._plan_names[step.plan]
        timed = step.timed
        policy, offload, drop_first = self._plans[plan]
        allocator = self._allocator()
        session = self._sessions.get(plan)
        if session is not None and (session.live_budget != (allocator is None) or
                                    step.fresh_runtime):
            # use_allocator() came since, or what the runtime learns from one
            # step led the next into a budget it did not fit (the planner's
            # blind plans): start afresh (each such step as blind as the
            # last: what its replays did still holds for the next).
            if not step.fresh_runtime:
                self._planner.restarted(step.plan)
            self._sessions.pop(plan).close()
            session = None
        if session is None and self._native:
            session = self._sessions[plan] = _native.NativeSession(self.budget_bytes, policy,
                                                                   self._recompute)
        if session is None:
            session = self._sessions[plan] = _Session(self.budget_bytes, policy, offload,
                                                      self._recompute, self._copy_ahead,
                                                      live_budget=allocator is None,
                                                      link=self._link(offload, allocator))
        device = 0
        if allocator is not None and torch.cuda.is_available():
            device = torch.cuda.current_device()
        self._step_index = step.plan
        self._step_timed = step.timed
        self._step_in_trial = step.in_trial
        if self._native:
            _native.enter(self, plan, policy, session)
            return
        engine = Engine(self.budget_bytes, policy, offload, self._recompute,
                        self._allow_nondeterministic, self._cost_model, self._copy_ahead,
                        allocator=allocator, device=device, drop_first=drop_first,
                        planner=self._planner)
        engine.open(session)
        self._engine = engine
        self._step_plan = plan
        _active[threading.get_ident()] = self
        self._mode = _Mode(engine)
        self._backward = _Backward(engine, self._mode)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(engine.pack, engine.unpack)
        self._step_start = self._time() if timed else None
        self._mode.__enter__()
        try:
            self._backward.__enter__()
            try:
                self._hooks.__enter__()
            except BaseException:
                self._backward.__exit__(None, None, None)
                raise
        except BaseException:
            self._mode.__exit__(None, None, None)
            _active.pop(threading.get_ident(), None)
            engine.close()  # the allocator gets its budget back
            raise

    @_interrupts.critical
    def __exit__(self, exc_type, exc, tb):
        # (An interrupt that lands in here waits for its end: remat's handler.)
        engine = self._engine
        # A step an interrupt went through may have stopped anywhere in
        # remat's bookkeeping: its runtime is let go with it (the next step
        # starts a fresh one, as the first did).
        interrupted = (self._interrupt_token and
                       _interrupts.delivered() != self._interrupts_at_start) or \
            (exc is not None and not isinstance(exc, Exception))
        late = None  # what the step's end raises (remat's allocator: a request that failed)
        try:
            block, self._keep_saved_block = self._keep_saved_block, None
            if block is not None:
                # Left inside a keep_saved() block (a generator dropped there):
                # remat's hooks go back on the stack, for the exit below to take off.
                torch._C._autograd._push_saved_tensors_default_hooks(*block[0])
            try:
                try:
                    self._hooks.__exit__(exc_type, exc, tb)
                finally:
                    self._backward.__exit__(exc_type, exc, tb)
            finally:
                try:
                    self._mode.__exit__(exc_type, exc, tb)
                finally:
                    _active.pop(threading.get_ident(), None)
                    try:
                        self._close_engine(interrupted)
                    finally:
                        try:
                            if engine.allocator is not None and \
                                    not isinstance(exc, BudgetTooSmall):
                                late = engine.exit_error()
                            # A step that raises here has failed: the plan trial
                            # must not time it (nor keep a plan it did not fit).
                            self._end_step(exc_type is None and late is None,
                                           exc if exc is not None else late)
                            if interrupted:
                                session = self._sessions.pop(self._step_plan, None)
                                if session is not None:
                                    session.close()
                                    self._planner.restarted(self._step_index)
                        finally:
                            self._resume_gc()
            if late is None:
                late = _translated(exc, engine)
        finally:
            self._release()
            _interrupts.uninstall(self._interrupt_token)  # last: raises one held
        if late is not None:
            raise late from exc
        return False

    def _close_engine(self, interrupted):
        """Ends the step's engine. An interrupted step's records may be half
        made: what its end says of them is not raised (its runtime goes)."""
        engine = self._engine
        try:
            engine.close()
        except BaseException:  # noqa: BLE001: raised unless interrupted
            if not interrupted:
                raise
        if not hasattr(engine, "stats"):
            engine.stats = engine.read_stats()

    def _time(self):
        # A GPU's work runs behind the host's: a timed step waits for it.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return self._clock()

    def _end_step(self, ok, exc=None):
        """Tells the planner how the step went, and keeps what it learned."""
        self._steps += 1
        stats = dict(self._engine.stats)
        stats["step"] = self._steps
        stats["plan"] = self._plan_shown()
        stats["policy"] = self._plans[self._step_plan][0]
        index = self._step_index
        too_small = isinstance(exc, BudgetTooSmall)
        if ok:
            outcome = StepPlanner.FIT
        else:
            outcome = StepPlanner.TOO_SMALL if too_small else StepPlanner.ABANDONED
        seconds = self._time() - self._step_start if ok and self._step_timed else 0.0
        if too_small:
            self._engine.report_unfit()
        # (What the step saw by tensor kind joins the planner's books here.)
        self._planner.end(outcome, seconds, str(exc) if too_small else "")
        state = self._planner.plan(index)
        # The runtimes of plans the planner will not run again (refused, or
        # not kept by the trial) go.
        plans = [self._planner.plan(i) for i in range(len(self._plan_names))]
        for i, name in enumerate(self._plan_names):
            if not plans[i]["live"] and name in self._sessions:
                self._sessions.pop(name).close()
        refused = {name: plans[i]["refusal"] for i, name in enumerate(self._plan_names)
                   if plans[i]["refused"]}
        if refused:
            stats["plans_refused"] = refused
        if state["blind"]:
            stats["next_uses_off"] = True
        if self._link_rates is not None:
            stats["link_gbps"], stats["link_latency_ns"] = self._link_rates
        if self._planner.state().trial_done:
            stats["plan_trial_seconds"] = {name: plans[i]["times"]
                                           for i, name in enumerate(self._plan_names)
                                           if not plans[i]["refused"]}
        self.stats = _user_stats(stats)

    @_interrupts.critical
    @contextlib.contextmanager
    def keep_saved(self):
        """Inside the budget's `with`: what autograd saves for backward in
        this block is kept as autograd keeps it without remat (resident, not
        counted against the budget, never dropped or offloaded). The ATen
        calls are still recorded, so the tensors the block makes can still
        be dropped where something after it saves them. For what refuses
        saved-tensor hooks: torch.func's grad, vjp, jacrev and hessian.

            with remat.torch.budget("2GiB") as run:
                h = encoder(x)
                with run.keep_saved():
                    g = torch.func.grad(inner_loss)(h)
                loss = head(h, g).sum()
                loss.backward()
        """
        engine = self._engine
        if engine is None or engine.closed or _active.get(threading.get_ident()) is not self:
            raise RuntimeError("keep_saved() is for inside this budget's `with`, on the thread "
                               "that entered it")
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is None or top[0] != engine.pack:
            raise RuntimeError("keep_saved(): other saved-tensor hooks (checkpoint, "
                               "save_on_cpu, your own) are innermost here; enter keep_saved() "
                               "outside them")
        torch._C._autograd._pop_saved_tensors_default_hooks()
        engine.counts["keep_saved_blocks"] += 1
        block = self._keep_saved_block = [top]
        try:
            yield self
        finally:
            if self._keep_saved_block is block:
                # (Left with the budget still open: else __exit__ has put them back.)
                self._keep_saved_block = None
                torch._C._autograd._push_saved_tensors_default_hooks(*top)

    def live_stats(self):
        """The runtime's figures now: inside the context, the step's so far
        (its number the step running); outside, the last step's (`stats`),
        or before any step zeros and step 0."""
        engine = self._engine
        if engine is None or engine.closed:
            if self.stats is not None:
                return _user_stats(self.stats)
            return self._no_step_stats()
        stats = engine.read_stats()
        stats["step"] = self._steps + 1
        stats["plan"] = self._plan_shown()
        stats["policy"] = self._plans[self._step_plan][0]
        return _user_stats(stats)

    def _no_step_stats(self):
        """live_stats() before any step: every figure 0, step 0 (of the plan
        the first step runs)."""
        plan = self._plan_names[0]
        policy, offload, drop_first = self._plans[plan]
        engine = Engine(self.budget_bytes, policy, offload, self._recompute,
                        self._allow_nondeterministic, self._cost_model, drop_first=drop_first)
        zero = _capi.RuntimeStats()
        engine.start = zero
        engine.session = types.SimpleNamespace(raw_stats=lambda: zero)
        engine.closed = True
        stats = engine.read_stats()
        stats["step"] = 0
        stats["plan"] = "trial" if len(self._plans) > 1 else plan
        stats["policy"] = policy
        return _user_stats(stats)

    @_interrupts.critical
    def close(self):
        """Lets the runtime go (it is kept between steps to learn from them;
        the object's end lets it go too)."""
        token = _interrupts.install()
        try:
            self._claim_to_close()
            try:
                sessions, self._sessions = self._sessions, {}
                for session in sessions.values():
                    session.close()
                self._start_over()
            finally:
                self._release()
        finally:
            _interrupts.uninstall(token)

    def _claim_to_close(self):
        if not self._open.acquire(blocking=False):
            if self._owner == threading.get_ident():
                raise RuntimeError("close the budget after leaving its `with`")
            raise RuntimeError("this remat.torch.budget is open on another thread: close it "
                               "after that thread leaves its `with`")
        self._owner = threading.get_ident()

    @_interrupts.critical
    def __del__(self):
        sessions = getattr(self, "_sessions", None)
        engine = getattr(self, "_engine", None)
        if sessions and (engine is None or engine.closed):
            for session in sessions.values():
                session.close()
