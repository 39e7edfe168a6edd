"""What the copies of dropped tensors buy: hybrid loops whose replays are made
to miss, with and without the copies.

remat.torch.budget offloads, rather than drops, a tensor whose replay it
estimates could not fit; the estimate can fall short on a model it has not
met. To see what happens then on every model, this makes the drop-first
plan's estimate blind (a replay room of 1 PiB: it drops whatever the runtime
may) and runs seven-step hybrid loops (the offload guard's trial and one step
more), once with the copies (a drop no replay of its kind and size has been
seen to fit is copied to host memory first, and a replay that cannot fit
comes back from its copy) and once without. Each step that runs is checked
against a plain step (loss and gradients bitwise equal, saved bytes within
the budget).

Prints a markdown row per model and budget: the steps that raised
BudgetTooSmall each way, the steps that made copies, the copies brought back,
the bytes copied over the seven steps, and whether every step that ran gave
the plain step's figures.

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_copies.py [--models transformer,gru] [--ratios 0.1,0.2]
"""
import argparse

import torch

import remat.torch
from remat.torch import _budget
from remat.torch.testing.zoo import PATTERNS, ZOO, run_step


def _blind_drop_first():
    init = _budget.Engine.__init__

    def blind(self, *args, **kw):
        init(self, *args, **kw)
        if self.drop_first:
            self.replay_room = 1 << 50
    _budget.Engine.__init__ = blind


def loop(make, budget_bytes, plain, steps, copies, wants_backup):
    """(steps raised, steps that copied, copies used, bytes copied, all equal)."""
    _budget.Engine._wants_backup = wants_backup if copies else (lambda self, s: False)
    b = remat.torch.budget(budget_bytes, policy="dtr", offload=True, recompute=True)
    raised = copied = used = nbytes = 0
    equal = True
    for _ in range(steps):
        try:
            loss, grads, _ = run_step(make, b)
        except remat.torch.BudgetTooSmall:
            raised += 1
            continue
        st = b.stats
        equal = equal and torch.equal(loss, plain[0]) and grads.keys() == plain[1].keys() and \
            all(torch.equal(grads[k], plain[1][k]) for k in grads) and \
            st["peak_saved_bytes"] <= st["budget_bytes"]
        copied += st["debug"]["backups"] > 0
        used += st["debug"]["backups_used"]
        nbytes += st["debug"]["backup_bytes"]
    b.close()
    return raised, copied, used, nbytes, equal


def main():
    models = {**ZOO, **PATTERNS}
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="transformer,sdpa,norms,gru,rnn_cell,lstm,"
                        "checkpointed,tied_lm")
    parser.add_argument("--ratios", default="0.1,0.15,0.2,0.3")
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in models]
    if unknown:
        parser.error(f"--models: unknown {unknown}; known: {','.join(models)}")
    ratios = [float(r) for r in args.ratios.split(",")]
    torch.set_num_threads(1)
    wants_backup = _budget.Engine._wants_backup
    _blind_drop_first()
    print(f"{args.steps}-step hybrid loops (dtr), the drop-first plan's estimate blind; "
          f"torch {torch.__version__}\n")
    print("| model | ratio | raised, no copies | raised, copies | steps that copied | "
          "copies brought back | KiB copied | as plain |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        make = models[name]
        loss, grads, _ = run_step(make)
        probe = remat.torch.budget(1 << 40)
        run_step(make, probe)
        saved = probe.stats["peak_saved_bytes"]
        probe.close()
        for ratio in ratios:
            budget_bytes = max(1, int(saved * ratio))
            r0, _, _, _, e0 = loop(make, budget_bytes, (loss, grads), args.steps, False,
                                   wants_backup)
            r1, c1, u1, n1, e1 = loop(make, budget_bytes, (loss, grads), args.steps, True,
                                      wants_backup)
            print(f"| {name} | {ratio} | {r0} | {r1} | {c1} | {u1} | {n1 >> 10} | "
                  f"{'yes' if e0 and e1 else 'NO'} |", flush=True)
    _budget.Engine._wants_backup = wants_backup


if __name__ == "__main__":
    main()
