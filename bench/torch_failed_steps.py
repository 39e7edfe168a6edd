"""What a loop that skips a failed step gets from the budget learning from
it: ten-step loops whose replays are made to miss, with no copies to come
back from, each way.

With no copy of a dropped tensor (drops alone, a copy skipped for want of
host memory, or a drop seen to fit in an earlier step), a replay in the
backward that cannot fit fails the step with BudgetTooSmall. The plan's next
steps then offload that tensor's kind (its op, output and place in the step)
and copy their drops again. To see it on every model, this makes the
estimate of a replay's room blind on every plan (a replay room of 1 PiB: the
runtime may drop whatever it can) and turns the copies off, and runs each
loop (one budget object, BudgetTooSmall caught and the loop going on) with
and without that learning.

Prints a row per model, budget and policy: one character per step ("." ran
with the plain step's loss and gradients, "b" BudgetTooSmall, "F" ran but
differed), without and with the learning.

    PYTHONPATH=python REMAT_LIBRARY=build/lib/libremat.so \\
        .venv/bin/python bench/torch_failed_steps.py [--models transformer,sdpa] [--steps 10]
"""
import argparse

import torch

import remat.torch
from remat.torch import _budget
from remat.torch.testing.zoo import ZOO, run_step


def _blind_without_copies():
    init = _budget.Engine.__init__

    def blind(self, *args, **kw):
        init(self, *args, **kw)
        self.replay_room = 1 << 50
    _budget.Engine.__init__ = blind
    _budget.Engine._wants_backup = lambda self, s: False


def _forget_unfit(self):
    self.unfit = None


def loop(make, budget_bytes, policy, plain, steps, learning, learn):
    # Without the learning: no replay that failed reaches the step planner.
    report_unfit, saw_fail = learn if learning else (_forget_unfit, lambda self, s: None)
    _budget.Engine.report_unfit, _budget.Engine._saw_fail = report_unfit, saw_fail
    b = remat.torch.budget(budget_bytes, policy=policy, offload=True, recompute=True,
                           offload_guard=False)
    cells = ""
    try:
        for _ in range(steps):
            try:
                loss, grads, _ = run_step(make, b)
            except remat.torch.BudgetTooSmall:
                cells += "b"
                continue
            same = torch.equal(loss, plain[0]) and grads.keys() == plain[1].keys() and \
                all(torch.equal(grads[k], plain[1][k]) for k in grads) and \
                b.stats["peak_saved_bytes"] <= b.stats["budget_bytes"]
            cells += "." if same else "F"
    finally:
        b.close()
    return cells


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="transformer,sdpa,gru,norms")
    parser.add_argument("--ratios", default="0.1,0.15,0.2,0.25")
    parser.add_argument("--policies", default="dtr,lru")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    learn = (_budget.Engine.report_unfit, _budget.Engine._saw_fail)
    init, wants_backup = _budget.Engine.__init__, _budget.Engine._wants_backup
    _blind_without_copies()
    print(f"{args.steps}-step loops, replay estimate blind, no copies; torch {torch.__version__}")
    print("| model | budget | policy | without learning | with it |")
    print("|---|---|---|---|---|")
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"--models: unknown {unknown}; known: {','.join(ZOO)}")
    for name in names:
        make = ZOO[name]
        plain_loss, plain_grads, _ = run_step(make)
        probe = remat.torch.budget(1 << 40)
        run_step(make, probe)
        saved = probe.stats["peak_saved_bytes"]
        probe.close()
        for ratio in (float(r) for r in args.ratios.split(",")):
            for policy in args.policies.split(","):
                cells = [loop(make, max(1, int(saved * ratio)), policy, (plain_loss, plain_grads),
                              args.steps, learning, learn) for learning in (False, True)]
                print(f"| {name} | {ratio:g} | {policy} | `{cells[0]}` | `{cells[1]}` |",
                      flush=True)
    _budget.Engine.__init__, _budget.Engine._wants_backup = init, wants_backup
    _budget.Engine.report_unfit, _budget.Engine._saw_fail = learn


if __name__ == "__main__":
    main()
