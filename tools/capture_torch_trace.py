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

An operation that only writes into an existing storage (in-place, `out=`)
becomes a call with one zero-byte output, released at once: its time counts,
and the storage keeps its producer, so remat would recompute it without the
write (an approximation for memory and time, not for bytes).

Costs (--cost, or record()'s `cost`):

  model     (the default) from the operation's FLOPs and the bytes it moves at
            a device's rates, as `remat gen` costs its ops:
              cost_ns = max(launch_ns, FLOPs / tflops, bytes / hbm_gbps),
            rounded up (FLOPs / (tflops * 1e3) and bytes / hbm_gbps are ns).
            FLOPs come from torch.utils.flop_counter's per-op formulas
            (matmuls, convolutions, attention; an op without a formula counts
            0 FLOPs and costs its bytes); bytes are the logical sizes
            (numel * element size) of every tensor the op reads and every
            tensor it returns, an in-place result counted as read and written.
            Defaults: 400 TFLOP/s, 3000 GB/s, a 1000 ns floor per kernel (an
            H100-class GPU; see gen/model_gen.h), whatever device records.
            The costs depend on shapes only, so the same command writes the
            same file, byte for byte, on any machine and under any load.
  measured  timed: with CUDA events around each operation on a GPU, with the
            host clock on the CPU (each timed once: run a warm-up step first,
            as --warmup does). On a GPU that the recording keeps idle, an
            event pair also spans the host's launch of the kernel, so cheap
            kernels come out dearer than they run in a steady stream (an upper
            bound; pass cuda=True to record() for GPU steps of your own). Host
            times on a loaded CPU vary from run to run: two recordings of the
            same step differ.

Views cost 0 in both.

Models (--model):

  mlp          Linear-GELU-Linear blocks (--layers, --hidden), a squared mean.
  gpt2         Hugging Face's GPT2LMHeadModel (needs transformers).
  densenet121  torchvision's DenseNet-121, random weights (weights=None),
               --batch images of 3 x --image x --image (224), cross entropy
               against random labels over --classes (1000); batch norm in
               training mode (needs torchvision).
  lstm         an LSTM language model: nn.Embedding(vocab, hidden), --layers
               nn.LSTMCell(hidden, hidden) stepped over --seq time steps (layer
               by layer, as nn.LSTM computes), nn.Linear(hidden, vocab), cross
               entropy on the next tokens; --vocab defaults to 10000 here.
  lstm-fused   the same model through nn.LSTM.

Why `lstm` unrolls nn.LSTMCell: on the CPU, nn.LSTM dispatches one fused ATen
operation per layer for the whole sequence (aten::mkldnn_rnn_layer, and its
backward), so a trace of it holds a handful of large calls with no FLOP
formula in torch's counter (costed by their bytes only). Stepping the cell
shows each time step's work to the runtime: per step and layer the gate
matmuls, the split into four gates, sigmoids, tanhs, products and sums, each a
small tensor (batch x hidden) that the backward needs; thousands of small calls
and tensors, which is what a framework's LSTM step looks like to a memory
runtime. On the CPU each of those calls returns one tensor (the four gates are
pieces of one storage, split without a copy); PyTorch's CUDA build runs the
cell as one fused kernel with three outputs, aten::_thnn_fused_lstm_cell.

  python3 tools/capture_torch_trace.py --model mlp -o mlp.jsonl
  python3 tools/capture_torch_trace.py --model densenet121 --batch 8 -o densenet.jsonl
  python3 tools/capture_torch_trace.py --model lstm --layers 2 --hidden 512 --seq 64 \\
      --batch 32 -o lstm.jsonl
  python3 tools/capture_torch_trace.py --model gpt2 --layers 12 --seq 1024 --batch 8 \\
      --device cuda --dtype bf16 --cost measured -o gpt2_torch.jsonl
  build/bin/remat sim densenet.jsonl --budget-ratio 0.5 --policy msps

Needs torch (transformers for --model gpt2, torchvision for densenet121). Use
it as a library too: `record(step_fn, path)` records whatever `step_fn()` runs.
"""
import argparse
import json
import math
import sys
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

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

    @staticmethod
    def flops(func, args, kwargs, result):
        """FLOPs of one call by torch.utils.flop_counter's formula for its
        operation; 0 where it has none."""
        formula = flop_registry.get(func.overloadpacket)
        if formula is None:
            return 0
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


def mlp_step(args, device, dtype):
    torch.manual_seed(args.seed)
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
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=dtype)
    model.train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    def step(rec):
        loss = model(input_ids=ids, labels=ids).loss
        if rec is not None:
            rec.phase("backward")
        loss.backward()
    return step, model


def densenet121_step(args, device, dtype):
    import torchvision

    torch.manual_seed(args.seed)
    model = torchvision.models.densenet121(weights=None, num_classes=args.classes)
    model = model.to(device=device, dtype=dtype)
    model.train()
    images = torch.randn(args.batch, 3, args.image, args.image, device=device, dtype=dtype)
    labels = torch.randint(0, args.classes, (args.batch,), device=device)

    def step(rec):
        loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        if rec is not None:
            rec.phase("backward")
        loss.backward()
    return step, model


class LstmLanguageModel(torch.nn.Module):
    """Embedding, `layers` LSTM layers of `hidden` units, a linear head over
    the vocabulary. `unrolled`: each layer an nn.LSTMCell stepped over time
    (one ATen call per gate operation and step); else one nn.LSTM."""

    def __init__(self, vocab, hidden, layers, unrolled):
        super().__init__()
        self.unrolled = unrolled
        self.embedding = torch.nn.Embedding(vocab, hidden)
        if unrolled:
            self.cells = torch.nn.ModuleList(torch.nn.LSTMCell(hidden, hidden)
                                             for _ in range(layers))
        else:
            self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        """Logits (seq, batch, vocab) for time-major `tokens` (seq, batch)."""
        x = self.embedding(tokens)
        if not self.unrolled:
            return self.head(self.lstm(x)[0])
        steps = list(x.unbind(0))
        for cell in self.cells:  # layer by layer over the sequence, as nn.LSTM
            h = x.new_zeros(x.shape[1], cell.hidden_size)
            c = torch.zeros_like(h)
            outputs = []
            for inp in steps:
                h, c = cell(inp, (h, c))
                outputs.append(h)
            steps = outputs
        return self.head(torch.stack(steps))


def lstm_step(args, device, dtype):
    torch.manual_seed(args.seed)
    model = LstmLanguageModel(args.vocab, args.hidden, args.layers,
                              unrolled=args.model == "lstm").to(device=device, dtype=dtype)
    model.train()
    tokens = torch.randint(0, args.vocab, (args.seq + 1, args.batch), device=device)

    def step(rec):
        logits = model(tokens[:-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 tokens[1:].flatten())
        if rec is not None:
            rec.phase("backward")
        loss.backward()
    return step, model


MODELS = {"mlp": mlp_step, "gpt2": gpt2_step, "densenet121": densenet121_step,
          "lstm": lstm_step, "lstm-fused": lstm_step}
# --vocab where it is not given.
DEFAULT_VOCAB = {"lstm": 10000, "lstm-fused": 10000}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="mlp")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int,
                        help="vocabulary (gpt2: 50257, lstm: 10000 unless given)")
    parser.add_argument("--image", type=int, default=224, help="densenet121: image side")
    parser.add_argument("--classes", type=int, default=1000, help="densenet121: classes")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs")
    parser.add_argument("--attn", choices=["eager", "sdpa"], default="eager")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--cost", choices=COSTS, default="model",
                        help="model: from FLOPs and bytes at the rates below; "
                             "measured: timed (default: model)")
    parser.add_argument("--tflops", type=float, default=DEFAULT_TFLOPS,
                        help="--cost model: FLOP rate, TFLOP/s")
    parser.add_argument("--hbm-gbps", type=float, default=DEFAULT_HBM_GBPS,
                        help="--cost model: memory bandwidth, GB/s")
    parser.add_argument("--launch-ns", type=int, default=DEFAULT_LAUNCH_NS,
                        help="--cost model: least cost of a call, ns")
    parser.add_argument("--warmup", type=int,
                        help="untraced steps first (default: 1 with --cost measured, else 0)")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    if args.vocab is None:
        args.vocab = DEFAULT_VOCAB.get(args.model, 50257)
    if args.warmup is None:
        args.warmup = 1 if args.cost == "measured" else 0
    try:
        CostModel(args.tflops, args.hbm_gbps, args.launch_ns)
    except ValueError as e:
        parser.error(str(e))
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda needs a GPU and a CUDA build of PyTorch")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    try:
        step, model = MODELS[args.model](args, args.device, dtype)
    except ImportError as e:
        sys.exit(f"--model {args.model}: {e} (gpt2 needs transformers, densenet121 torchvision)")
    for _ in range(args.warmup):
        step(None)
        # The warm-up's gradients would be constants of the traced step.
        model.zero_grad(set_to_none=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    n = record(step, args.output, cuda=args.device == "cuda", cost=args.cost,
               tflops=args.tflops, hbm_gbps=args.hbm_gbps, launch_ns=args.launch_ns)
    print(f"wrote {n} records to {args.output}")


if __name__ == "__main__":
    main()
