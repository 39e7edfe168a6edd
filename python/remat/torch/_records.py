"""What the recorder keeps: saved storages, references to them in recorded
calls, the calls, and the handles autograd holds (with PyTorch's in-place
check at unpack)."""
import re
import threading
import weakref

import torch

from remat.torch import _interrupts
from remat.torch._common import _below_python_dispatch


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


