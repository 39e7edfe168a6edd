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
import os
import sys

import torch

# Run from a checkout, the package's sources in python/ come first (tools/ holds
# a folder named remat too); else the installed package.
_CHECKOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
if os.path.isfile(os.path.join(_CHECKOUT, "remat", "__init__.py")):
    sys.path.insert(0, _CHECKOUT)
from remat.torch._cost import (COSTS, DEFAULT_HBM_GBPS, DEFAULT_LAUNCH_NS,  # noqa: E402,F401
                               DEFAULT_TFLOPS, CostModel)
from remat.torch._record import Recorder, record  # noqa: E402,F401
from remat._paths import OutputPathError, check_output_paths  # noqa: E402


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
    try:
        # Before the model is built and run: a trace with nowhere to go is known now.
        check_output_paths([], [("--output", args.output)])
    except OutputPathError as e:
        sys.exit(f"capture_torch_trace: {e}")
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
