"""Where remat.torch.budget runs, and right, on models written the ways people
write them (remat.torch.testing.zoo): each model's step at budgets of 0.05 to 1.0 of
its plain step's saved bytes, in each mode (drop, offload, hybrid), checked
against a plain step (loss, gradients and buffers bitwise equal, saved bytes
within the budget).

Prints a row per model and mode: one character per budget ("." ran and
matched, "b" BudgetTooSmall, "F" ran but differed, "E" another error), and
the smallest budget from which every larger one ran. Exits 1 if any cell is
"F" or "E".

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_zoo.py [--models lstm,norms] [--policy dtr] [--steps 1]

--steps N runs N steps per budget object, each checked (a budget with
offload and recompute runs its offload guard's trial over its first steps).
--device cuda runs them on the GPU, with PyTorch's deterministic algorithms
(bitwise equal gradients need deterministic kernels in the plain step too).
--patterns adds training steps that do more than a forward and a backward
(an optimizer step, a gradient penalty, two backwards, hooks, a GAN) or
reach for less common parts of PyTorch (remat.torch.testing.zoo.PATTERNS).
--hf adds Hugging Face transformers models (remat.torch.testing.zoo_hf: GPT-2,
Llama, Mixtral, BERT, T5, ViT, at tiny sizes; needs transformers).
--tv adds torchvision's image classifiers (remat.torch.testing.zoo_tv: ResNet-18,
MobileNetV3, EfficientNet, ShuffleNet, SqueezeNet, DenseNet, ConvNeXt,
ViT, Swin, MaxViT, at small sizes; needs torchvision).
"""
import argparse
import os
import sys

import torch

import remat.torch
from remat.torch.testing.zoo import PATTERNS, ZOO, run_step as one_step

MODES = {"drop": {"offload": False, "recompute": True},
         "offload": {"offload": True, "recompute": False},
         "hybrid": {"offload": True, "recompute": True}}


def same(a, b):
    return (torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and
            all(torch.equal(a[1][n], b[1][n]) for n in a[1]) and
            all(torch.equal(a[2][n], b[2][n]) for n in a[2]))


def cell(make, plain, nbytes, policy, kw, steps, device):
    b = remat.torch.budget(nbytes, policy=policy, **kw)
    try:
        for _ in range(steps):
            got = one_step(make, b, device)
            if not same(plain, got) or b.stats["peak_saved_bytes"] > nbytes:
                return "F"
        return "."
    except remat.torch.BudgetTooSmall:
        return "b"
    except Exception as e:  # noqa: BLE001: reported as a cell
        print(f"  error: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        return "E"
    finally:
        if b._engine is None or b._engine.closed:
            b.close()


def smallest(row, ratios):
    for i in range(len(row)):
        if all(c == "." for c in row[i:]):
            return ratios[i]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=None,
                        help="comma-separated (default: all, with --patterns', --hf's and --tv's)")
    parser.add_argument("--policy", default="dtr")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--step-ratio", type=float, default=0.05)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--patterns", action="store_true",
                        help="add remat.torch.testing.zoo.PATTERNS (training steps that do more)")
    parser.add_argument("--hf", action="store_true",
                        help="add remat.torch.testing.zoo_hf's transformers models "
                             "(needs transformers)")
    parser.add_argument("--tv", action="store_true",
                        help="add remat.torch.testing.zoo_tv's torchvision models "
                             "(needs torchvision)")
    args = parser.parse_args()
    models = dict(ZOO)
    if args.patterns:
        models.update(PATTERNS)
    if args.hf:
        try:
            from remat.torch.testing.zoo_hf import HF
        except ImportError as e:
            parser.error(f"--hf needs transformers (pip install transformers): {e}")
        models.update(HF)
    if args.tv:
        try:
            from remat.torch.testing.zoo_tv import TV
        except ImportError as e:
            parser.error(f"--tv needs torchvision (pip install torchvision): {e}")
        models.update(TV)
    torch.set_num_threads(1)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    names = args.models.split(",") if args.models else list(models)
    for name in names:
        if name not in models:
            parser.error(f"unknown model {name!r}: one of {', '.join(models)}")
    ratios = [round(args.step_ratio * i, 4) for i in range(1, int(1 / args.step_ratio) + 1)]
    print(f"{args.device}, policy {args.policy}, {args.steps} step(s) per budget, ratios "
          f"{ratios[0]}-{ratios[-1]} of the plain step's saved bytes; torch {torch.__version__}")
    bad = False
    for name in names:
        make = models[name]
        plain = one_step(make, device=args.device)
        # The model is made outside the budget, as in every cell (made
        # inside, its parameters would count as saved).
        unlimited = remat.torch.budget(1 << 40)
        one_step(make, unlimited, args.device)
        saved = unlimited.stats["peak_saved_bytes"]
        unlimited.close()
        for mode in args.modes.split(","):
            row = "".join(cell(make, plain, max(1, int(saved * r)), args.policy, MODES[mode],
                               args.steps, args.device) for r in ratios)
            bad = bad or "F" in row or "E" in row
            print(f"{name:16s} {mode:8s} {row}  smallest {smallest(row, ratios)}  "
                  f"(saved {saved} B)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
