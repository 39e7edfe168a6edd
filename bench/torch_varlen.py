"""remat.torch.budget over a training loop whose batches change length from
step to step (as dynamic padding makes them): a Hugging Face causal LM at a
tiny size, one budget object per loop, each step checked against a plain
step (loss and gradients bitwise equal).

For each seed (a draw of ten lengths in 8-63) and each budget (a ratio of
the saved bytes of the longest batch), prints a row of one character per
step: "." ran and matched, "F" ran but differed, "B" raised BudgetTooSmall
where offload alone (its own budget object over the same loop) ran that
step, "b" raised where offload alone did too. Then the totals. Exits 1 on
any "F".

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_varlen.py [--model gpt2|llama] [--policy belady]
        [--mode hybrid] [--seeds 3] [--ratios 0.1,0.15,0.2,0.25]

Needs transformers.
"""
import argparse
import collections
import sys

import torch

import remat.torch

MODES = {"drop": {"offload": False, "recompute": True},
         "offload": {"offload": True, "recompute": False},
         "hybrid": {"offload": True, "recompute": True}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--policy", default="belady")
    parser.add_argument("--mode", default="hybrid", choices=list(MODES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ratios", default="0.1,0.15,0.2,0.25")
    args = parser.parse_args()
    try:
        from remat.torch.testing.zoo_hf import LONGEST, varlen
    except ImportError as e:
        parser.error(f"needs transformers (pip install transformers): {e}")
    torch.set_num_threads(1)
    _, step = varlen(args.model)

    probe = remat.torch.budget(1 << 40)
    step(LONGEST, probe)
    saved = probe.stats["peak_saved_bytes"]
    probe.close()
    ratios = [float(r) for r in args.ratios.split(",")]
    print(f"{args.model}, {args.mode}, policy {args.policy}, {args.steps} steps per loop, "
          f"lengths 8-{LONGEST}; ratios of {saved} saved bytes (length {LONGEST}); "
          f"torch {torch.__version__}")
    totals = collections.Counter()
    for seed in range(args.seeds):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(8, LONGEST + 1, (args.steps,), generator=g).tolist()
        for ratio in ratios:
            nbytes = int(saved * ratio)
            b = remat.torch.budget(nbytes, policy=args.policy, **MODES[args.mode])
            alone = remat.torch.budget(nbytes, policy=args.policy, **MODES["offload"])
            row = ""
            for n in lengths:
                plain = step(n)
                try:
                    step(n, alone)
                    fits = True
                except remat.torch.BudgetTooSmall:
                    fits = False
                try:
                    loss, grads = step(n, b)
                    same = torch.equal(loss, plain[0]) and \
                        all(torch.equal(grads[k], plain[1][k]) for k in grads)
                    row += "." if same and b.stats["peak_saved_bytes"] <= nbytes else "F"
                except remat.torch.BudgetTooSmall:
                    row += "B" if fits else "b"
            b.close()
            alone.close()
            totals.update(row)
            print(f"  seed {seed} ratio {ratio:<5} lengths {lengths}  {row}", flush=True)
    print(f"steps: {dict(sorted(totals.items()))}")
    return 1 if totals["F"] else 0


if __name__ == "__main__":
    sys.exit(main())
