#!/usr/bin/env python3
"""Records a PyTorch training step as an op trace that `remat sim` replays.

Every ATen operation of the forward and the backward is seen through a
TorchDispatchMode and written as one JSON Lines record:

  constant  a tensor that existed before the step (a parameter, an input),
            at its first use
  call      the operation: its inputs and its outputs, each named by the
            storage under it (an output is a new storage with its bytes; a
            view's or an in-place result's storage is already named), and its cost
  release   a storage freed (its last reference gone, checked after each op)
  phase     "backward" where the backward starts

Costs are measured: with CUDA events around each operation on a GPU, with the
host clock on the CPU (each timed once: run a warm-up step first, as --warmup
does); views cost 0. On a GPU that the recording keeps idle, an event pair
also spans the host's launch of the kernel, so cheap kernels come out dearer
than they run in a steady stream (an upper bound; pass cuda=True to record()
for GPU steps of your own). An operation that only writes into an existing storage
(in-place, `out=`) becomes a call with one zero-byte output, released at once:
its time counts, and the storage keeps its producer, so remat would recompute
it without the write (an approximation for memory and time, not for bytes).

  python3 tools/capture_torch_trace.py --model mlp -o mlp.jsonl
  python3 tools/capture_torch_trace.py --model gpt2 --layers 12 --seq 1024 --batch 8 \\
      --device cuda --dtype bf16 -o gpt2_torch.jsonl
  build/bin/remat sim gpt2_torch.jsonl --budget-ratio 0.5 --policy msps

Needs torch (and transformers for --model gpt2). Use it as a library too:
`record(step_fn, path)` records whatever `step_fn()` runs.
"""
import argparse
import json
import sys
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Operations that only describe a tensor and move no bytes: their cost is 0.
_FREE = {"aten::detach", "aten::view", "aten::_unsafe_view", "aten::alias", "aten::t",
         "aten::transpose", "aten::permute", "aten::expand", "aten::slice", "aten::select",
         "aten::split", "aten::split_with_sizes", "aten::unsqueeze", "aten::squeeze",
         "aten::as_strided", "aten::unbind", "aten::reshape", "aten::lift_fresh"}


def _has_storage(t):
    """A tensor with bytes of its own somewhere (not sparse, not a wrapper)."""
    if not isinstance(t, torch.Tensor):
        return False
    try:
        t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return False
    return True


class Recorder(TorchDispatchMode):
    """Writes each operation it sees as op-trace records."""

    def __init__(self, out, cuda):
        super().__init__()
        self.out = out
        self.cuda = cuda
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
        if timed and self.cuda:
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


def record(step_fn, path, cuda=False):
    """Runs `step_fn(recorder)` under the recorder and writes its op trace to
    `path`; step_fn may call recorder.phase("backward"). Returns the number of
    records written."""
    with open(path, "w") as out:
        recorder = Recorder(out, cuda)
        with recorder:
            step_fn(recorder)
        recorder._collect()
        recorder.flush()
        return recorder.records


def mlp_step(args, device, dtype):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, 4 * args.hidden), torch.nn.GELU(),
                   torch.nn.Linear(4 * args.hidden, args.hidden)]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=dtype)
    x = torch.randn(args.batch * args.seq, args.hidden, device=device, dtype=dtype)

    def step(rec):
        loss = model(x).float().square().mean()
        if rec is not None:
            rec.phase("backward")
        loss.backward()
    return step, model


def gpt2_step(args, device, dtype):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                     n_positions=args.seq, vocab_size=args.vocab, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = args.attn
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=dtype)
    model.train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    def step(rec):
        loss = model(input_ids=ids, labels=ids).loss
        if rec is not None:
            rec.phase("backward")
        loss.backward()
    return step, model


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--attn", choices=["eager", "sdpa"], default="eager")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--warmup", type=int, default=1, help="untraced steps first")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda needs a GPU and a CUDA build of PyTorch")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    make = mlp_step if args.model == "mlp" else gpt2_step
    step, model = make(args, args.device, dtype)
    for _ in range(args.warmup):
        step(None)
        # The warm-up's gradients would be constants of the traced step.
        model.zero_grad(set_to_none=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    n = record(step, args.output, cuda=args.device == "cuda")
    print(f"wrote {n} records to {args.output}")


if __name__ == "__main__":
    main()
