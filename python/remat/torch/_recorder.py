"""Recording the forward: what each ATen op is (random, custom, a view,
replayable), the dispatch mode that records calls, the torch-function mode
that sets the recorder aside for backwards, and the Engine's recording."""
import random
import re
import sys

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode_temporarily
from torch.utils._pytree import tree_flatten

from remat.torch._common import (
    _COLLECTIVES, _FlatSpec, _NOT_REPLAYABLE_TAGS, _WRITES_UNREAD, _flatten_call, _flatten_result,
    _leaf_count, _storage, _tag)
from remat.torch._records import _Call, _Ref, _Storage


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




class _Recording:
    """Engine's recording of the forward's calls (a mixin of Engine)."""

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

