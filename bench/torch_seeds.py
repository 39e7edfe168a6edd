#!/usr/bin/env python3
"""The three figures users judge a memory-saving scheme by, side by side, on
real models: a GPT-2 from transformers' configs, torchvision's ResNet-50 and
a ViT (random weights: nothing is downloaded).

    PYTHONPATH=python python3 bench/torch_seeds.py [--device cpu|cuda]
        [--size tiny|cpu|real] [--models gpt2,resnet50,vit] [--repeat 5]
        [--threads 1] [--compile] [--longest] [--markdown out.md]

Methods (rows):

  plain        a plain step
  checkpoint   torch.utils.checkpoint around every block (non-reentrant)
  sac          selective checkpointing around every block: matmul and
               convolution outputs saved, the rest recomputed
  compile      torch.compile with activation_memory_budget 0.5 (--compile;
               compile time apart, gradients not expected bitwise)
  remat-*      remat.torch.budget at half the plain step's saved bytes:
               drop (native recorder), offload, hybrid
  remat-drop @ckpt   drops, at the largest budget whose peak is at most
               checkpoint's (found by bisection, measured steps); where no
               budget gets there, "@least": the least budget seen to run

Columns: peak (the most bytes of tensors the step made alive at once on the
device, one meter for every row: every tensor, not only saved ones; on CUDA the
allocator's peak above the step's start), step ms (median of --repeat timed
steps after warm-up, with min-max; the rows take turns, one timed step each
per round, so that a machine's drift shifts them alike), samples per second (tokens for the GPT-2),
whether the gradients equal the plain step's bit for bit, and for remat its
drops. --longest adds, for the GPT-2, the longest sequence (in steps of a
quarter of the base length) each method fits under a cap of the plain step's
peak at the base length; remat fits where some budget (found by bisection)
keeps its measured peak under the cap.

--size tiny runs in seconds on any CPU (CI runs it, through
scripts/gpu_check.sh's step, so that it cannot rot); cpu is the CPU table;
real is GPT-2 small (12 layers, 768, sequence 1024), ResNet-50 at 224 and
ViT-B/16 at 224, batch 64 for the images, for one GPU run of a few minutes.
"""
import argparse
import contextlib
import functools
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

import remat.torch
from remat.torch.bench import CudaPeak, PeakMeter

SIZES = {
    "tiny": {"gpt2": dict(layers=2, d=64, heads=4, seq=32, batch=2, vocab=512),
             "resnet50": dict(batch=2, image=32),
             "vit": dict(layers=2, d=64, heads=4, image=32, patch=8, batch=2)},
    "cpu": {"gpt2": dict(layers=6, d=384, heads=6, seq=256, batch=4, vocab=50257),
            "resnet50": dict(batch=8, image=112),
            "vit": dict(layers=6, d=384, heads=6, image=224, patch=16, batch=8)},
    "real": {"gpt2": dict(layers=12, d=768, heads=12, seq=1024, batch=8, vocab=50257),
             "resnet50": dict(batch=64, image=224),
             "vit": dict(layers=12, d=768, heads=12, image=224, patch=16, batch=64)},
}


def _saved_by_sac(ctx, func, *args, **kwargs):
    keep = func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                    torch.ops.aten.bmm.default, torch.ops.aten.convolution.default,
                    torch.ops.aten._scaled_dot_product_flash_attention.default,
                    torch.ops.aten._scaled_dot_product_efficient_attention.default)
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


class _Checkpointed(torch.nn.Module):
    """A block run under torch.utils.checkpoint (selective with `sac`)."""

    def __init__(self, inner, sac):
        super().__init__()
        self.inner = inner
        self.context = functools.partial(create_selective_checkpoint_contexts,
                                         _saved_by_sac) if sac else None

    def forward(self, *args, **kwargs):
        if self.context is None:
            return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self.context,
                          **kwargs)


def _wrap_blocks(blocks, how):
    if how in ("checkpoint", "sac"):
        for i in range(len(blocks)):
            blocks[i] = _Checkpointed(blocks[i], sac=how == "sac")


def gpt2(seed, device, how, layers, d, heads, seq, batch, vocab):
    import transformers
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=seq,
                                     vocab_size=vocab)
    model = transformers.GPT2LMHeadModel(config).to(device).train()
    _wrap_blocks(model.transformer.h, how)
    g = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)

    def step():
        return model(input_ids=ids, labels=ids, use_cache=False).loss
    return model, step, batch * seq


def _classifying(model, seed, device, batch, image):
    """(model, step, samples) of an image classifier's step on a fixed batch."""
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(batch, 3, image, image, generator=g).to(device)
    y = torch.randint(0, 1000, (batch,), generator=g).to(device)

    def step():
        return F.cross_entropy(model(x), y)
    return model, step, batch


def resnet50(seed, device, how, batch, image):
    from torchvision import models as tvm
    torch.manual_seed(seed)
    model = tvm.resnet50(num_classes=1000).to(device).train()
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        _wrap_blocks(layer, how)
    return _classifying(model, seed, device, batch, image)


def vit(seed, device, how, layers, d, heads, image, patch, batch):
    from torchvision.models import VisionTransformer
    torch.manual_seed(seed)
    model = VisionTransformer(image_size=image, patch_size=patch, num_layers=layers,
                              num_heads=heads, hidden_dim=d, mlp_dim=4 * d,
                              dropout=0.1, num_classes=1000).to(device).train()
    _wrap_blocks(model.encoder.layers, how)
    return _classifying(model, seed, device, batch, image)


MODELS = {"gpt2": gpt2, "resnet50": resnet50, "vit": vit}
REMAT = {"remat-drop": dict(policy="dtr-eq", native=True),
         "remat-offload": dict(policy="lru", offload=True, recompute=False),
         "remat-hybrid": dict(policy="hybrid", offload=True)}


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Runner:
    """Steps of one model at one size: metered or timed, per method."""

    def __init__(self, name, kw, device):
        self.name, self.kw, self.device = name, kw, device
        self._compiled = None

    def make(self, how, **override):
        kw = dict(self.kw, **override)
        return MODELS[self.name](0, self.device, "plain" if how.startswith("remat") or
                                 how == "compile" else how, **kw)

    def step(self, how, budget=None, metered=False, **override):
        """(gradients by position, peak bytes or None, seconds, samples)."""
        if how == "compile":
            model, step, samples = self._compiled_step()
        else:
            model, step, samples = self.make(how, **override)
        torch.manual_seed(1)
        meter = contextlib.nullcontext()
        if metered:
            meter = CudaPeak(self.device) if torch.device(self.device).type == "cuda" \
                else PeakMeter(self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        with meter:
            with budget if budget is not None else contextlib.nullcontext():
                step().backward()
        _sync(self.device)
        seconds = time.perf_counter() - t0
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        return grads, meter.peak if metered else None, seconds, samples

    def _compiled_step(self):
        if self._compiled is None:
            import torch._functorch.config as functorch_config
            functorch_config.activation_memory_budget = 0.5
            model, step, samples = self.make("plain")
            step = torch.compile(step)
            start = time.perf_counter()
            torch.manual_seed(1)
            step().backward()
            self.compile_seconds = time.perf_counter() - start
            self._compiled = (model, step, samples)
        model, step, samples = self._compiled
        model.zero_grad(set_to_none=True)
        return model, step, samples

    def saved_bytes(self, **override):
        with remat.torch.budget(1 << 60) as run:
            model, step, _ = self.make("plain", **override)
            torch.manual_seed(1)
            step().backward()
        return run.stats["peak_saved_bytes"]

    def budget(self, how, nbytes, **override):
        """A budget for `how`, after its warm-up steps (the learning step;
        hybrid's plan trial first)."""
        b = remat.torch.budget(max(1, int(nbytes)), **REMAT[how])
        warm = 2 * remat.torch.budget.TRIAL_STEPS + 1 if how == "remat-hybrid" else 1
        try:
            for _ in range(warm):
                self.step(how, b, **override)
        except BaseException:
            b.close()
            raise
        return b


class _Row:
    """One method's row: its budget (remat's, warmed) and its figures."""

    def __init__(self, runner, how, plain_grads, budget=None, label=None):
        self.how, self.budget, self.label = how, budget, label or how
        grads, self.peak, _, self.samples = runner.step(how, budget, metered=True)
        self.same = len(grads) == len(plain_grads) and \
            all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
        self.drops = budget.stats["drops"] if budget is not None else None
        self.times = []

    def figures(self):
        median = statistics.median(self.times)
        return {"method": self.label, "peak": self.peak, "ms": median * 1e3,
                "min": min(self.times) * 1e3, "max": max(self.times) * 1e3,
                "per_s": self.samples / median, "same": self.same, "drops": self.drops,
                "budget": self.budget.budget_bytes if self.budget is not None else None}


def table(runner, repeat, plain_grads, saved, methods):
    """The rows' figures: each row's metered step first, then `repeat`
    rounds of one timed step per row in turn (a drifting machine shifts
    every row alike)."""
    rows = []
    try:
        for how in methods:
            rows.append(_Row(runner, how, plain_grads))
        for how in REMAT:
            rows.append(_Row(runner, how, plain_grads, runner.budget(how, saved // 2)))
        ckpt = next(r for r in rows if r.how == "checkpoint")
        best, least = _largest_budget(runner, "remat-drop", ckpt.peak, saved)
        if best is not None or least is not None:
            b = runner.budget("remat-drop", best if best is not None else least)
            rows.append(_Row(runner, "remat-drop", plain_grads, b,
                             label="remat-drop @ckpt" if best is not None else
                             "remat-drop @least"))
        for _ in range(repeat):
            for r in rows:
                r.times.append(runner.step(r.how, r.budget)[2])
        return [r.figures() for r in rows]
    finally:
        for r in rows:
            if r.budget is not None:
                r.budget.close()


def _largest_budget(runner, how, target, saved, rounds=7, **override):
    """(the largest budget, by bisection over [1, saved], under which a
    warmed step's metered peak is at most `target`, or None; the least
    budget seen to run, or None)."""
    lo, hi, best, least = 1, saved, None, None
    for _ in range(rounds):
        if lo > hi:
            break
        mid = (lo + hi) // 2
        b = None
        try:
            b = runner.budget(how, mid, **override)
            peak = runner.step(how, b, metered=True, **override)[1]
        except remat.torch.BudgetTooSmall:
            peak = None  # too small for the step at all
        finally:
            if b is not None:
                b.close()
        if peak is not None:
            least = mid if least is None else min(least, mid)
        if peak is not None and peak <= target:
            best, lo = mid, mid + 1
        elif peak is None:
            lo = mid + 1
        else:
            hi = mid - 1
    return best, least


def longest(runner, methods, out, step=0):
    """The longest GPT-2 sequence each method fits under the plain step's
    peak at the base length (remat: under some budget, by bisection)."""
    base = runner.kw["seq"]
    step = step or base // 4
    _, cap, _, _ = runner.step("plain", metered=True)
    out.write(f"\nLongest sequence under a cap of {cap / 2**20:.2f} MiB (the plain step's peak "
              f"at {base}), in steps of {step}:\n\n| method | longest sequence |\n"
              "|---|---|\n")
    for how in methods:
        fits, seq = 0, base
        while seq <= 16 * base:
            override = dict(seq=seq)
            if how.startswith("remat"):
                ok = _largest_budget(runner, how, cap, runner.saved_bytes(**override),
                                     rounds=6, **override)[0] is not None
            else:
                ok = runner.step(how, metered=True, **override)[1] <= cap
            if not ok:
                break
            fits, seq = seq, seq + step
        out.write(f"| {how} | {fits if fits else 'none'} |\n")
        out.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=list(SIZES), default="cpu")
    parser.add_argument("--models", default="gpt2,resnet50,vit")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--longest", action="store_true")
    parser.add_argument("--longest-step", type=int, default=0,
                        help="--longest's step in tokens (0: a quarter of the base length; "
                             "half at --size real)")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    if not names or any(n not in MODELS for n in names):
        parser.error(f"--models: some of {','.join(MODELS)}")
    if args.longest_step < 0:
        parser.error("--longest-step: 0 or more tokens")
    if args.repeat < 1 or args.threads < 1:
        parser.error("--repeat and --threads: at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here")
    if args.markdown and os.path.exists(args.markdown):
        parser.error(f"--markdown {args.markdown} exists; nothing is overwritten")
    torch.set_num_threads(args.threads)
    md = open(args.markdown, "x") if args.markdown else None

    class Out:
        def write(self, s):
            sys.stdout.write(s)
            if md:
                md.write(s)

        def flush(self):
            sys.stdout.flush()
            if md:
                md.flush()
    out = Out()
    out.write(f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} thread(s) "
              f"(--threads), size {args.size}; step ms: median of {args.repeat} timed steps "
              "(min-max)\n")
    try:
        for name in names:
            runner = Runner(name, SIZES[args.size][name], args.device)
            unit = "tokens/s" if name == "gpt2" else "samples/s"
            out.write(f"\n{name} {runner.kw}\n\n| method | budget MiB | peak MiB | step ms | "
                      f"min-max | {unit} | x plain | x checkpoint | grads equal | drops |\n"
                      + "|---" * 10 + "|\n")
            plain_grads = runner.step("plain")[0]
            saved = runner.saved_bytes()
            rows = table(runner, args.repeat, plain_grads, saved,
                         ["plain", "checkpoint", "sac"] + (["compile"] if args.compile else []))
            plain = rows[0]
            ckpt = next(r for r in rows if r["method"] == "checkpoint")
            for r in rows:
                budget = f"{r['budget'] / 2**20:.2f}" if r["budget"] else "-"
                out.write(f"| {r['method']} | {budget} | {r['peak'] / 2**20:.2f} | {r['ms']:.1f} | "
                          f"{r['min']:.1f}-{r['max']:.1f} | {r['per_s']:.0f} | "
                          f"{r['ms'] / plain['ms']:.2f} | {r['ms'] / ckpt['ms']:.2f} | "
                          f"{'yes' if r['same'] else 'no'} | "
                          f"{'-' if r['drops'] is None else r['drops']} |\n")
                out.flush()
            if args.compile:
                out.write(f"\n(compile: {runner.compile_seconds:.1f} s to compile, apart)\n")
            if args.longest and name == "gpt2":
                step = args.longest_step or (runner.kw["seq"] // 2 if args.size == "real" else 0)
                longest(runner, ["plain", "checkpoint", "sac", "remat-drop"], out, step)
    finally:
        if md:
            md.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
