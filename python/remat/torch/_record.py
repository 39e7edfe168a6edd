"""remat.torch.record: a PyTorch step written as the op trace `remat sim` replays.

Every ATen operation of the forward and the backward is seen through a
TorchDispatchMode and written as one JSON Lines record (see
tools/capture_torch_trace.py for the format and the costs).
"""
import json
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from remat.torch._cost import (COSTS, DEFAULT_HBM_GBPS, DEFAULT_LAUNCH_NS, DEFAULT_TFLOPS,
                               CostModel, _FREE, _has_storage)


class Recorder(TorchDispatchMode):
    """Writes each operation it sees as op-trace records, costed by
    `cost_model` (a CostModel), or timed where it is None."""

    def __init__(self, out, cuda, cost_model=None):
        super().__init__()
        self.out = out
        self.cost_model = cost_model
        # Only measured GPU times wait for their events.
        self.cuda = cuda and cost_model is None
        self.names = {}    # storage key -> the id of its first tensor
        self.alive = {}    # storage key -> StorageWeakRef, for the releases
        self.pending = []  # (record, start event, end event) while timing on a GPU
        self.count = 0
        self.records = 0

    @staticmethod
    def _key(t):
        return t.untyped_storage()._cdata

    def _emit(self, record):
        self.records += 1
        if self.cuda:
            # Held, in order, until flush() reads the calls' events.
            self.pending.append(record)
        else:
            self._write(record)

    def _write(self, record):
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _name_of(self, t):
        """The id of the storage under `t`, declaring it a constant if unseen."""
        key = self._key(t)
        name = self.names.get(key)
        if name is None:
            name = self._new_name(key)
            self._emit({"op": "constant", "id": name, "bytes": t.untyped_storage().nbytes()})
        return name

    def _new_name(self, key):
        self.count += 1
        name = f"t{self.count}"
        self.names[key] = name
        return name

    def _watch(self, t):
        # A weak reference to the storage itself: it expires when the last
        # tensor over it goes, wherever that reference was held (autograd's
        # saved tensors too), and while we hold it the storage's address is
        # not reused, so keys stay unique.
        key = self._key(t)
        if key not in self.alive:
            self.alive[key] = StorageWeakRef(t.untyped_storage())

    def _collect(self):
        dead = [key for key, ref in self.alive.items() if ref.expired()]
        for key in dead:
            self._emit({"op": "release", "id": self.names.pop(key)})
            del self.alive[key]

    def phase(self, name):
        self._emit({"op": "phase", "name": name})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat_in, _ = tree_flatten((args, kwargs))
        in_tensors = [t for t in flat_in if _has_storage(t)]
        inputs = []
        for t in in_tensors:
            name = self._name_of(t)
            self._watch(t)
            if name not in inputs:
                inputs.append(name)
        op_name = func._schema.name
        timed = not (getattr(func, "is_view", False) or op_name in _FREE)
        if timed and self.cost_model is not None:
            result = func(*args, **kwargs)
            flat_result, _ = tree_flatten(result)
            moved = self.cost_model.moved(
                [t for t in flat_in if isinstance(t, torch.Tensor)],
                [t for t in flat_result if isinstance(t, torch.Tensor)])
            cost = self.cost_model.cost_ns(self.cost_model.flops(func, args, kwargs, result),
                                           moved)
        elif timed and self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = func(*args, **kwargs)
            end.record()
        elif timed:
            t0 = time.perf_counter_ns()
            result = func(*args, **kwargs)
            cost = time.perf_counter_ns() - t0
        else:
            result = func(*args, **kwargs)
        self._collect()  # what the operation freed goes before what it made
        flat_out, _ = tree_flatten(result)
        outputs = []
        for t in flat_out:
            if not _has_storage(t):
                continue
            key = self._key(t)
            if key in self.names:
                continue  # written in place, or a view: the storage it shares
            name = self._new_name(key)
            outputs.append({"id": name, "bytes": t.untyped_storage().nbytes()})
            self._watch(t)
        scratch = None
        if not outputs:
            if not timed:
                return result  # a view of what is known: nothing to record
            # A call defines at least one tensor: a zero-byte one, released at
            # once, carries the time of an operation that only writes in place.
            self.count += 1
            scratch = f"t{self.count}"
            outputs.append({"id": scratch, "bytes": 0})
        record = {"op": "call", "name": op_name, "inputs": inputs, "outputs": outputs}
        if not timed:
            record["cost_ns"] = 0
        elif not self.cuda:
            record["cost_ns"] = int(cost)
        else:
            record["_events"] = (start, end)
        self._emit(record)
        if scratch is not None:
            self._emit({"op": "release", "id": scratch})
        return result

    def flush(self):
        """Writes the records held for their GPU timings, in order."""
        if self.cuda:
            torch.cuda.synchronize()
        for record in self.pending:
            events = record.pop("_events", None)
            if events is not None:
                record["cost_ns"] = int(events[0].elapsed_time(events[1]) * 1e6)
            self._write(record)
        self.pending = []


def record(step_fn, path, cuda=False, cost="model", tflops=DEFAULT_TFLOPS,
           hbm_gbps=DEFAULT_HBM_GBPS, launch_ns=DEFAULT_LAUNCH_NS):
    """Runs `step_fn(recorder)` under the recorder and writes its op trace to
    `path`; step_fn may call recorder.phase("backward"). `cost` is "model"
    (from FLOPs and bytes at tflops, hbm_gbps and launch_ns) or "measured"
    (CUDA events if `cuda`, else the host clock). Returns the number of
    records written."""
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {', '.join(COSTS)}, not {cost!r}")
    cost_model = CostModel(tflops, hbm_gbps, launch_ns) if cost == "model" else None
    with open(path, "w") as out:
        recorder = Recorder(out, cuda, cost_model)
        with recorder:
            step_fn(recorder)
        recorder._collect()
        recorder.flush()
        return recorder.records
