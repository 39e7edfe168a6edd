"""remat.torch.budget on the CPU: gradients bitwise equal to a plain step's,
the saved bytes within the budget, and drops or offloads that happened."""

import contextlib
import ctypes
import types

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat  # noqa: E402
from remat import _capi  # noqa: E402
import remat.torch  # noqa: E402
from remat.torch import BudgetTooSmall  # noqa: E402

from remat.torch.testing import models  # noqa: E402
from _blind import drop_first_drops_blindly  # noqa: E402


def run_step(make, budget=None, seed=0, **kw):
    """Builds the model afresh (same seed), runs one step, returns the
    gradients by name, the loss, the stats and the model."""
    model, step = make(seed)
    torch.manual_seed(seed + 1)
    if budget is None:
        loss = step()
        loss.backward()
        stats = None
    else:
        with remat.torch.budget(budget, **kw) as run:
            loss = step()
            loss.backward()
        stats = run.stats
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, loss.detach(), stats, model


def saved_bytes_of(make):
    """The plain step's saved activations at their peak (what the budget
    ratios are of)."""
    model, step = make(0)
    torch.manual_seed(1)
    with remat.torch.budget(1 << 40) as run:
        step().backward()
    return run.stats["peak_saved_bytes"]


def assert_same_grads(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"gradient of {name} differs"


def steps_under(b, make, n):
    """Runs n steps of make's model under budget b, each checked against a
    plain step (same loss, bitwise same gradients, saved bytes within the
    budget); returns each step's stats."""
    plain, plain_loss, _, _ = run_step(make)
    figures = []
    for _ in range(n):
        model, step = make(0)
        torch.manual_seed(1)
        with b:
            loss = step()
            loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        assert torch.equal(loss.detach(), plain_loss)
        assert_same_grads(plain, grads)
        assert b.stats["peak_saved_bytes"] <= b.stats["budget_bytes"]
        figures.append(b.stats)
    return figures


MODELS = {"mlp": models.mlp, "gpt": models.gpt, "resnet": models.resnet, "lstm": models.lstm}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.7, 0.9])
def test_gradients_equal_under_drop(name, ratio):
    make = MODELS[name]
    plain, plain_loss, _, plain_model = run_step(make)
    full = saved_bytes_of(make)
    budget = int(full * ratio)
    grads, loss, stats, model = run_step(make, budget, policy="dtr")
    assert torch.equal(loss, plain_loss)
    assert_same_grads(plain, grads)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] > 0
    assert stats["recomputes"] > 0
    # Buffers (batch norm's running statistics) saw one step, not a replay.
    for (n, b1), (_, b2) in zip(plain_model.named_buffers(), model.named_buffers()):
        assert torch.equal(b1, b2), f"buffer {n} differs"


def test_stats_show_the_user_figures_and_keep_the_rest_under_debug():
    budget = int(saved_bytes_of(models.mlp) * 0.4)
    _, _, dropped, _ = run_step(models.mlp, budget, policy="dtr")
    assert set(dropped) == {"step", "budget_bytes", "peak_saved_bytes", "drops", "recomputes",
                            "offloads", "restores", "plan", "policy", "recompute_seconds",
                            "copy_seconds", "debug"}
    assert dropped["step"] == 1 and dropped["budget_bytes"] == budget
    assert "saved_tensors" in dropped["debug"] and "pressure_events" in dropped["debug"]
    # Replays took time, copies none; offloading instead, the reverse.
    assert dropped["recomputes"] > 0 and dropped["recompute_seconds"] > 0
    assert dropped["copy_seconds"] == 0
    _, _, offloaded, _ = run_step(models.mlp, budget, offload=True, recompute=False)
    assert offloaded["offloads"] > 0 and offloaded["copy_seconds"] > 0
    assert offloaded["recompute_seconds"] == 0
    # Each read is a new dict: changing one changes nothing kept.
    b = remat.torch.budget(1 << 40)
    model, step = models.mlp(0)
    with b:
        step().backward()
    outside = b.live_stats()
    outside["debug"]["saved_tensors"] = -1
    assert b.live_stats()["debug"]["saved_tensors"] == b.stats["debug"]["saved_tensors"] > 0


@pytest.mark.parametrize("policy", ["lru", "largest", "dtr-eq", "msps"])
def test_other_policies(policy):
    plain, _, _, _ = run_step(models.gpt)
    budget = int(saved_bytes_of(models.gpt) * 0.4)
    grads, _, stats, _ = run_step(models.gpt, budget, policy=policy)
    assert_same_grads(plain, grads)
    assert stats["peak_saved_bytes"] <= budget


def test_offload_only():
    plain, _, _, _ = run_step(models.mlp)
    budget = int(saved_bytes_of(models.mlp) * 0.4)
    grads, _, stats, _ = run_step(models.mlp, budget, offload=True, recompute=False)
    assert_same_grads(plain, grads)
    assert stats["offloads"] > 0 and stats["restores"] > 0
    assert stats["debug"]["prefetches"] > 0  # copied in ahead of the backward node that reads it
    assert stats["drops"] == 0
    assert stats["peak_saved_bytes"] <= budget


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_copies_made_ahead_bring_back_the_same_gradients(policy):
    # Offload only: once the budget binds, what the policy offloads next is
    # copied while still resident, and its eviction uses that copy. (The
    # link must have time for copies between pressure events: the MLP's
    # compute is estimated at a slow device's rate, else the 25 GB/s link
    # is busy with the offloads themselves and nothing is copied ahead.)
    budget = int(saved_bytes_of(models.mlp) * 0.4)
    b = remat.torch.budget(budget, policy=policy, offload=True, recompute=False,
                           copy_ahead=True, tflops=0.01)
    figures = steps_under(b, models.mlp, 3)
    assert sum(f["debug"]["copies_ahead"] for f in figures) > 0
    assert sum(f["debug"]["ahead_offloads"] for f in figures) > 0
    assert all(f["debug"]["ahead_offloads"] <= f["offloads"] for f in figures)
    plain = remat.torch.budget(budget, policy=policy, offload=True, recompute=False,
                               tflops=0.01)
    assert all(f["debug"]["copies_ahead"] == 0 for f in steps_under(plain, models.mlp, 2))


def test_a_write_lets_a_copy_made_ahead_go():
    # A recorded in-place op may write a storage copied ahead through an
    # alias autograd's version check does not cover (`.data`): its copy must
    # not come back. (Multiplying by one writes the same bytes: the step
    # stays valid.)
    budget = int(saved_bytes_of(models.mlp) * 0.4)
    b = remat.torch.budget(budget, policy="lru", offload=True, recompute=False,
                           copy_ahead=True, tflops=0.01)
    steps_under(b, models.mlp, 1)  # the step before, learned from
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    w = torch.randn(256, 256, requires_grad=True)
    written = 0
    with b:
        acts = []
        h = x
        for _ in range(6):
            h = torch.tanh(h @ w)
            acts.append(h)
            # Whatever is copied ahead now (and still resident) is written.
            for s in b._engine.by_index:
                if s.ahead is None or s.tensor is None:
                    continue
                for a in acts:
                    if a.untyped_storage().data_ptr() == s.tensor.untyped_storage().data_ptr():
                        a.data.mul_(1.0)
                        assert s.ahead is None
                        written += 1
                        break
        h.sum().backward()
    assert written > 0, "nothing was copied ahead and written: the test proves nothing"


def test_hybrid():
    plain, _, _, _ = run_step(models.resnet)
    budget = int(saved_bytes_of(models.resnet) * 0.5)
    grads, _, stats, _ = run_step(models.resnet, budget, offload=True, recompute=True,
                                  policy="hybrid")
    assert_same_grads(plain, grads)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] + stats["offloads"] > 0


def _timed_by_plan(b, seconds):
    """A clock for budget b under which a timed step of each plan takes
    seconds[plan] (the budget reads it as a step starts and as it ends)."""
    now = [0.0]

    def clock():
        now[0] += seconds[b._step_plan] / 2
        return now[0]
    return clock


@pytest.mark.parametrize("faster", ["mixed", "drop-first"])
def test_the_offload_guard_keeps_the_quicker_plan(faster):
    # Drops and offloads both allowed: the first steps try the policy's
    # mixed plans, then drops alone, timing each, and the rest of the steps
    # run with the plan whose timed steps were quicker.
    b = remat.torch.budget(int(saved_bytes_of(models.gpt) * 0.4), policy="lru", offload=True,
                           recompute=True)
    b._clock = _timed_by_plan(b, {"mixed": 2.0, "drop-first": 1.0} if faster == "drop-first"
                              else {"mixed": 1.0, "drop-first": 2.0})
    trial = 2 * remat.torch.budget.TRIAL_STEPS
    figures = steps_under(b, models.gpt, trial + 2)
    assert [f["plan"] for f in figures] == ["trial"] * trial + [faster] * 2
    assert [f["step"] for f in figures] == list(range(1, trial + 3))
    # The trial ran both plans: offloads in its first half, none in its second.
    half = remat.torch.budget.TRIAL_STEPS
    assert all(f["offloads"] > 0 for f in figures[:half])
    assert all(f["offloads"] == 0 and f["drops"] > 0 for f in figures[half:trial])
    kept = figures[trial:]
    assert all((f["offloads"] > 0) == (faster == "mixed") for f in kept)
    times = figures[-1]["debug"]["plan_trial_seconds"]
    assert len(times["mixed"]) == len(times["drop-first"]) == half - 1
    b.close()


@pytest.mark.parametrize("fastest", ["dtr-eq drop-first", "lru mixed", "hybrid mixed"])
def test_a_list_of_policies_is_tried_and_the_quickest_plan_kept(fastest):
    # Each policy's mixed and drop-first plans in turn, TRIAL_STEPS steps
    # each, gradients bitwise equal to a plain step's throughout; the rest
    # run with the plan whose timed steps were quickest.
    policies = ["lru", "dtr-eq", "hybrid"]
    b = remat.torch.budget(int(saved_bytes_of(models.gpt) * 0.4), policy=policies, offload=True,
                           recompute=True)
    plans = [f"{p} {kind}" for p in policies for kind in ("mixed", "drop-first")]
    b._clock = _timed_by_plan(b, {plan: 1.0 if plan == fastest else 2.0 for plan in plans})
    trial = len(plans) * remat.torch.budget.TRIAL_STEPS
    figures = steps_under(b, models.gpt, trial + 2)
    assert [f["plan"] for f in figures] == ["trial"] * trial + [fastest] * 2
    # Each step ran the policy its plan names, offloading only in mixed plans
    # (lru's offload here; a policy that prices copies may choose not to).
    per_plan = remat.torch.budget.TRIAL_STEPS
    for i, plan in enumerate(plans):
        ran = figures[i * per_plan:(i + 1) * per_plan]
        assert all(f["policy"] == plan.split()[0] for f in ran)
        if plan.endswith("drop-first"):
            assert all(f["offloads"] == 0 and f["drops"] > 0 for f in ran)
        elif plan == "lru mixed":
            assert all(f["offloads"] > 0 for f in ran)
    assert all(f["policy"] == fastest.split()[0] for f in figures[trial:])
    assert sorted(figures[-1]["debug"]["plan_trial_seconds"]) == sorted(plans)
    b.close()


def test_a_tie_keeps_the_plan_tried_first():
    b = remat.torch.budget(int(saved_bytes_of(models.mlp) * 0.5), policy=["dtr", "lru"])
    b._clock = _timed_by_plan(b, {"dtr drop-only": 1.0, "lru drop-only": 1.0})
    figures = steps_under(b, models.mlp, 2 * remat.torch.budget.TRIAL_STEPS + 1)
    assert figures[-1]["plan"] == "dtr drop-only" and figures[-1]["policy"] == "dtr"
    b.close()


@pytest.mark.parametrize("policy", ["", [], ["dtr", ""], ["dtr", "dtr"], 3, [None]])
def test_a_bad_list_of_policies_is_refused(policy):
    with pytest.raises(ValueError, match="policy must be"):
        remat.torch.budget("1GiB", policy=policy)


@pytest.mark.parametrize("policy", ["no-such-policy", ["dtr", "no-such-policy"],
                                    ["dtr", "lru:no_such_key=1"]])
def test_an_unknown_policy_is_refused_before_any_step(policy):
    with pytest.raises(ValueError, match="no-such-policy|no_such_key"):
        remat.torch.budget("1GiB", policy=policy)


@pytest.mark.parametrize("policy", ["auto", "auto:sample=sqrt", ["dtr", "auto"]])
def test_auto_is_refused_with_the_list_to_pass_instead(policy):
    # auto's trial replays the step under every policy; a budget's steps are
    # the program's, so it takes the list to try instead, never dtr silently.
    with pytest.raises(ValueError, match="as a list"):
        remat.torch.budget("1GiB", policy=policy)


def test_the_offload_guard_can_be_turned_off_and_a_failed_step_is_not_timed():
    b = remat.torch.budget("1GiB", offload=True, recompute=True, offload_guard=False)
    with b:
        pass
    assert b.stats["plan"] == "mixed"
    b.close()
    b = remat.torch.budget("1GiB", offload=True, recompute=True)
    b._clock = _timed_by_plan(b, {"mixed": 1.0, "drop-first": 2.0})
    for _ in range(remat.torch.budget.TRIAL_STEPS):
        with b:
            pass
    with pytest.raises(ValueError):
        with b:  # the first drop-first step: it raises, so the trial waits for another
            raise ValueError("a step that fails")
    for _ in range(remat.torch.budget.TRIAL_STEPS):
        with b:
            pass
    assert b.stats["plan"] == "trial"  # one step short, for the one that failed
    with b:
        pass
    assert b.stats["plan"] == "mixed"
    assert b.stats["step"] == 2 * remat.torch.budget.TRIAL_STEPS + 2
    b.close()
    with b:  # after close, as new: the trial again
        pass
    assert b.stats["plan"] == "trial" and b.stats["step"] == 1
    b.close()
    for offload, recompute, plan in [(False, True, "drop-only"), (True, False, "offload-only")]:
        with remat.torch.budget("1GiB", offload=offload, recompute=recompute) as run:
            pass
        assert run.stats["plan"] == plan


def test_a_plan_whose_trial_step_does_not_fit_leaves_the_trial():
    # A trial step that raises BudgetTooSmall says its plan cannot run at
    # this budget: the next steps try the other plans, and never that one
    # again, where they used to retry it (and raise) at every step.
    b = remat.torch.budget("1GiB", offload=True, recompute=True)
    for _ in range(remat.torch.budget.TRIAL_STEPS):
        with b:
            pass
    with pytest.raises(BudgetTooSmall):
        with b:  # the first drop-first step
            raise BudgetTooSmall("as if drops alone did not fit")
    assert b.stats["debug"]["plans_refused"] == {"drop-first": "as if drops alone did not fit"}
    with b:  # the trial is over: mixed is the plan left
        pass
    assert b.stats["plan"] == "mixed" and "drop-first" in b.stats["debug"]["plans_refused"]
    b.close()
    # The last plan left is never refused: each step then says what did not fit.
    b = remat.torch.budget("1GiB", offload=True, recompute=False)
    for _ in range(2):
        with pytest.raises(BudgetTooSmall):
            with b:
                raise BudgetTooSmall("too small")
        assert "plans_refused" not in b.stats["debug"] and b.stats["plan"] == "offload-only"
    b.close()


def test_a_replay_that_does_not_fit_comes_back_from_a_copy_and_its_kind_is_offloaded(
        monkeypatch):
    # A drop no replay of its kind and size has been seen to fit (under the
    # step's plan) is copied to host memory first: where its replay then
    # cannot fit beside what the backward holds, the tensor comes back from
    # its copy (room for it alone, as an offload needs), and the step ends
    # with the plain step's gradients within the budget. Its kind is
    # offloaded in the plan's later steps, which copy nothing once their
    # drops have come back by replay. Before, the drop-first plan's first
    # step raised BudgetTooSmall into the training loop here, where offloads
    # fit.
    from remat.torch.testing import zoo
    drop_first_drops_blindly(monkeypatch)
    b = remat.torch.budget(int(saved_bytes_of(zoo.transformer) * 0.15), policy="dtr",
                           offload=True, recompute=True)
    b._clock = _timed_by_plan(b, {"mixed": 2.0, "drop-first": 1.0})
    trial = remat.torch.budget.TRIAL_STEPS
    figures = steps_under(b, zoo.transformer, 2 * trial + 4)
    first = figures[trial]  # the drop-first plan's first step
    assert first["plan"] == "trial" and first["drops"] > 0 and first["offloads"] == 0
    assert first["debug"]["backups"] > 0 and 0 < first["debug"]["backups_used"] <= first["debug"]["backups"]
    assert 0 < first["debug"]["backup_bytes"] <= first["debug"]["backups"] * first["budget_bytes"]
    assert first["debug"]["offload_not_drop_failed"] == 0
    # Its next steps offload those kinds.
    assert all(f["debug"]["offload_not_drop_failed"] > 0 for f in figures[trial + 1:])
    assert "plans_refused" not in figures[-1]["debug"]
    assert figures[-1]["plan"] == "drop-first"
    assert figures[-1]["debug"]["backups"] == 0 and figures[-1]["drops"] > 0
    # The mixed plan's first two steps copied what they dropped (a runtime's
    # first step evicts blind, its second by what it learned); its drops
    # having come back by replay in the second, its third copied nothing.
    assert all(f["debug"]["backups"] > 0 and f["debug"]["backups_used"] == 0 for f in figures[:2])
    assert figures[trial - 1]["debug"]["backups"] == 0
    b.close()


def test_a_copy_with_no_host_memory_is_skipped_not_fatal(monkeypatch):
    # Copies come from pinned host memory, which can run out where the
    # dropped bytes are many: the drop then goes on without its copy.
    from remat.torch import _budget

    def no_memory(self, t):
        raise RuntimeError("CUDA error: out of memory (pinned host memory)")
    monkeypatch.setattr(_budget.Engine, "_copy_backup", no_memory)
    # (The Python step's copies, made to fail here.)
    b = remat.torch.budget(int(saved_bytes_of(models.gpt) * 0.4), policy="dtr", offload=True,
                           recompute=True, native=False)
    figures = steps_under(b, models.gpt, 2)
    assert figures[0]["drops"] > 0 and figures[0]["debug"]["backups_skipped"] > 0
    assert figures[0]["debug"]["backups"] == 0 and figures[0]["debug"]["backup_bytes"] == 0
    b.close()


def test_a_copy_that_cannot_be_brought_in_leaves_its_tensor_dropped(monkeypatch):
    # A replay that does not fit, and its copy cannot come in either (no
    # device memory for the copy): the step raises that error, and the
    # runtime holds the tensor as dropped, with no pin left on it (it was
    # made resident and pinned for the copy).
    from remat.torch import _budget
    from remat.torch.testing import zoo
    drop_first_drops_blindly(monkeypatch, every_plan=True)
    refill = _budget.Engine._refill
    seen = []

    def failing_refill(self, s):
        self.in_refill = True
        try:
            return refill(self, s)
        except RuntimeError:
            state = ctypes.c_int()
            assert self.lib.remat_tensor_get_state(self.runtime, s.id,
                                                   ctypes.byref(state)) == _capi.OK
            seen.append((state.value, self.session.raw_stats().pinned_by_api - len(self.pins),
                         s.tensor))
            raise
        finally:
            self.in_refill = False

    def copy_in(self, host, device):
        if getattr(self, "in_refill", False):
            raise RuntimeError("CUDA out of memory (the copy in, on purpose)")
        return host.clone()
    monkeypatch.setattr(_budget.Engine, "_refill", failing_refill)
    monkeypatch.setattr(_budget.Engine, "_copy_in", copy_in)
    b = remat.torch.budget(int(saved_bytes_of(zoo.transformer) * 0.15), policy="dtr",
                           offload=True, recompute=True, offload_guard=False,
                           native=False)  # (the Python step's copies, made to fail here)
    with pytest.raises(RuntimeError, match="the copy in, on purpose"):
        steps_under(b, zoo.transformer, 1)
    assert seen == [(_capi.TENSOR_DROPPED, 0, None)]
    b.close()


def test_a_copy_of_content_written_over_since_is_not_brought_back(monkeypatch):
    # s is dropped (and copied); a write autograd does not see, outside
    # what is saved of it, moves it to a newer content, which a later save
    # hands to the runtime. Its copy holds the older: where the replay
    # fails, the copy must not stand in for the newer (the gradient would
    # be wrong), and the step says it did not fit.
    from remat.torch import _budget
    init = _budget.Engine.__init__

    def dropping(self, *args, **kw):
        init(self, *args, **kw)
        self.drop_first = True  # drops, not offloads, what may drop
    monkeypatch.setattr(_budget.Engine, "__init__", dropping)
    failing = set()
    call_runtime = _budget.Engine._call_runtime

    def fail_some(self, fn, *args):
        if fn is self.lib.remat_tensor_acquire and args[0] in failing:
            raise BudgetTooSmall("as if its replay did not fit")
        return call_runtime(self, fn, *args)
    monkeypatch.setattr(_budget.Engine, "_call_runtime", fail_some)

    def model(x, w):
        a = x * w                 # s
        b = a[:4].sin()           # saves a[:4]
        d = (w * 5).sin()         # the budget drops s, copying it
        a.data[4:].mul_(3)        # a write outside what is saved of s
        c = a[4:].sin()           # saves a[4:]: s's newer content
        return b.sum() + c.sum() + d.sum()

    torch.manual_seed(0)
    x, w = torch.randn(8, 64), torch.randn(8, 64, requires_grad=True)
    b = remat.torch.budget(8 * 64 * 4 * 3 // 2, policy="lru", offload=True, recompute=True,
                           native=False)  # (the Python step's acquire, made to fail here)
    with pytest.raises(BudgetTooSmall, match="as if"):
        with b:
            loss = model(x, w)
            s = next(t for t in b._engine.registered if t.nbytes == 8 * 64 * 4)
            assert s.reg_version == 1 and s.tensor is None and s.backup is None
            failing.add(s.id)
            loss.backward()
    b.close()


def test_without_the_copies_that_step_raises(monkeypatch):
    # The same step with nothing copied first: the test above would fail.
    from remat.torch.testing import zoo
    drop_first_drops_blindly(monkeypatch, backups=False)
    b = remat.torch.budget(int(saved_bytes_of(zoo.transformer) * 0.15), policy="dtr",
                           offload=True, recompute=True)
    steps_under(b, zoo.transformer, remat.torch.budget.TRIAL_STEPS)
    with pytest.raises(BudgetTooSmall):
        steps_under(b, zoo.transformer, 1)
    assert "drop-first" in b.stats["debug"]["plans_refused"]
    b.close()


def test_a_replay_that_did_not_fit_with_no_copy_has_its_kind_offloaded_next_step(monkeypatch):
    # No copies and a blind estimate: a replay in the step's backward cannot
    # fit, and with no copy to come back from, the step raises. The plan's
    # next steps offload that kind (one kind learned per failed step), and
    # they run (they all raised, each the same way, before).
    from remat.torch.testing import zoo
    drop_first_drops_blindly(monkeypatch, backups=False, every_plan=True)
    b = remat.torch.budget(int(saved_bytes_of(zoo.transformer) * 0.15), policy="dtr",
                           offload=True, recompute=True, offload_guard=False)
    with pytest.raises(BudgetTooSmall, match="cannot make room"):
        steps_under(b, zoo.transformer, 1)
    figures = steps_under(b, zoo.transformer, 2)
    assert all(f["debug"]["offload_not_drop_failed"] > 0 and f["drops"] > 0 for f in figures)
    b.close()


def test_only_a_dropped_tensors_replay_that_fails_the_step_is_learned():
    # What _acquire leaves for the step's end to learn (Engine.unfit): the
    # dropped tensor whose replay failed with no copy to come back from; not
    # an offloaded one with no room for itself (offloading its kind would
    # not help), and nothing once an acquire came back (a replay that failed
    # inside it was rebuilt, or refilled from its copy).
    from remat.torch import _budget

    from remat._planner import StepPlanner

    class Saved:
        id, tensor, host, beside_key, nbytes = 1, None, None, 7, 64

    class Engine:
        listening = False
        callback_errors = set()
        lib = types.SimpleNamespace(remat_tensor_acquire=None)
        report_unfit = _budget.Engine.report_unfit
        _saw_fail = _budget.Engine._saw_fail

        def __init__(self):
            self.fails, self.unfit = True, None
            self.planner = StepPlanner([("mixed", "dtr", True, True, False)])
            self.planner.begin()

        def learned_to_fail(self):
            """Ends the step as too small: whether the next knows 7 fails."""
            self.planner.end(self.planner.TOO_SMALL)
            self.planner.begin()
            return self.planner.kind_seen(7, 64)[1]

        def _call_runtime(self, fn, *args):
            if self.fails:
                raise BudgetTooSmall("no room (on purpose)")

        def _refill(self, s):
            return False

    e, dropped, offloaded = Engine(), Saved(), Saved()
    offloaded.host = object()
    with pytest.raises(BudgetTooSmall):
        _budget.Engine._acquire(e, dropped)
    assert e.unfit is dropped
    with pytest.raises(BudgetTooSmall):
        _budget.Engine._acquire(e, offloaded)
    assert e.unfit is None
    e.unfit, e.fails = dropped, False  # failed inside the next acquire, which came back
    _budget.Engine._acquire(e, Saved())
    assert e.unfit is None
    e.report_unfit()
    assert not e.learned_to_fail()
    e.unfit = dropped
    e.report_unfit()
    assert e.unfit is None and e.learned_to_fail()


@pytest.mark.python_recorder
def test_a_step_that_did_not_fit_with_what_the_runtime_learned_leaves_it_off():
    # Belady reads next uses the runtime learns from the step before. Near
    # this step's floor they lead its second step to evict what a recompute
    # then needs beside the pinned tensors, where the blind first step fit.
    # After such a step each step starts a runtime afresh, and fits again
    # (it used to fail every other step).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    x = torch.randn(8, 16)

    def step():
        torch.manual_seed(1)
        h = model(x)
        keep = torch.sigmoid(h.detach() * 3)
        return ((h * keep + torch.cos(h.detach())).tanh() * h).sum()

    model.zero_grad()
    step().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    with remat.torch.budget(1 << 40) as run:
        step()
    b = remat.torch.budget(int(run.stats["peak_saved_bytes"] * 0.9), policy="belady")
    outcomes = []
    for _ in range(6):
        model.zero_grad()
        try:
            with b:
                step().backward()
            assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters()))
            outcomes.append(".")
        except BudgetTooSmall:
            outcomes.append("b")
    assert "".join(outcomes) == ".b...."
    assert b.stats["debug"]["next_uses_off"] and b.stats["recomputes"] > 0
    b.close()


def _two_backwards(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                torch.nn.Sigmoid(), torch.nn.Linear(32, 1))
    x = torch.randn(8, 16)

    def step():
        loss = model(x).square().mean()
        loss.backward(retain_graph=True)
        return loss * 0.5
    return model, step


def test_hybrid_offloads_what_could_not_come_back_within_the_budget():
    # Two backwards over one graph at 0.6 of its saved bytes: a dropped
    # sigmoid output would need the tanh output it is replayed from resident
    # beside it, more than the budget holds, so drops alone cannot run the
    # step. With offload allowed, such a tensor is offloaded, not dropped.
    budget = int(saved_bytes_of(_two_backwards) * 0.6)
    with pytest.raises(BudgetTooSmall):
        run_step(_two_backwards, budget, policy="dtr")
    plain, plain_loss, _, _ = run_step(_two_backwards)
    for guard in (False, True):
        b = remat.torch.budget(budget, policy="dtr", offload=True, offload_guard=guard)
        for figures in steps_under(b, _two_backwards, 7 if guard else 1):
            assert figures["debug"]["offload_not_drop"] > 0 and figures["offloads"] > 0
        b.close()


def test_dropout_masks_replayed_and_rng_left_as_plain():
    """A recompute replays dropout with the original mask, and the step
    leaves the RNG where a plain step leaves it."""
    _, _, _, _ = run_step(models.gpt)
    plain_state = torch.get_rng_state()
    budget = int(saved_bytes_of(models.gpt) * 0.3)
    run_step(models.gpt, budget)
    assert torch.equal(torch.get_rng_state(), plain_state)


def test_too_small_budget_is_a_clear_error():
    model, step = models.mlp(0)
    with pytest.raises(BudgetTooSmall, match="cannot hold"):
        with remat.torch.budget(4096):
            step().backward()
    # An out-of-memory error as PyTorch's: what catches that catches this.
    with pytest.raises(torch.OutOfMemoryError, match="cannot hold"):
        with remat.torch.budget(4096):
            step().backward()
    assert issubclass(BudgetTooSmall, RuntimeError)


def test_bad_arguments():
    with pytest.raises(ValueError):
        remat.torch.budget("lots")
    with pytest.raises(ValueError):
        remat.torch.budget(0)
    with pytest.raises(ValueError):
        remat.torch.budget("1GiB", offload=False, recompute=False)
    with pytest.raises(ValueError, match="policy"):
        with remat.torch.budget("1GiB", policy="no-such-policy"):
            pass


def test_budgets_do_not_nest():
    with remat.torch.budget("1GiB"):
        with pytest.raises(RuntimeError, match="do not nest"):
            with remat.torch.budget("1GiB"):
                pass
    with remat.torch.budget("1GiB"):  # and the first one left nothing behind
        pass


def test_backward_after_the_context_is_refused():
    model, step = models.mlp(0)
    with remat.torch.budget("1GiB"):
        loss = step()
    with pytest.raises(RuntimeError, match="after the context ended"):
        loss.backward()


def test_activation_mutated_after_use():
    """An activation written in place after a saved tensor was computed from
    it: the recompute rebuilds the old content, not the new one."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64)

    def step():
        h = lin(x)
        g = h.sigmoid()          # saves g, computed from h as it was
        h.mul_(3)                # nobody saved h: autograd allows it
        big = (g @ lin.weight).tanh()
        return (big.sum() + h.sum())

    lin.zero_grad()
    step().backward()
    plain = lin.weight.grad.clone()
    lin.zero_grad()
    with remat.torch.budget(32 * 64 * 4 + 100) as run:
        step().backward()
    assert torch.equal(plain, lin.weight.grad)
    assert run.stats["recomputes"] > 0


def test_input_mutated_after_forward_keeps_its_dependents():
    """An input made before the context, written in place after the forward
    read it: what was computed from it is brought back before the write and
    kept, never recomputed from the new values."""
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)

    def step():
        a = (x * 2).sin()        # saves x*2 (made here, read from x)
        b = (a @ w).tanh()
        c = (b @ w).tanh()
        with torch.no_grad():
            x.add_(1)            # x is not saved by anyone: autograd allows it
        return c.sum()

    x0 = x.clone()
    step().backward()
    plain = w.grad.clone()
    w.grad = None
    x.copy_(x0)
    with remat.torch.budget(32 * 64 * 4 * 2) as run:
        step().backward()
    assert torch.equal(plain, w.grad)
    assert run.stats["peak_saved_bytes"] <= 32 * 64 * 4 * 2


def test_import_without_torch_needs_no_torch():
    assert remat.parse_size("2GiB") == 2 << 30
    assert remat.parse_size("1.5 KiB") == 1536
    assert remat.parse_size(4096) == 4096
    for bad in ["", "GiB", "-1MiB", "nan", "1.3B", "3 parsecs", -5, True, 1.5]:
        with pytest.raises(ValueError):
            remat.parse_size(bad)


def test_record_writes_a_trace(tmp_path):
    model, step = models.mlp(0)
    path = tmp_path / "mlp.jsonl"
    n = remat.torch.record(lambda: step().backward(), str(path))
    assert n > 10 and path.stat().st_size > 0
    with pytest.raises(FileExistsError):
        remat.torch.record(lambda: step().backward(), str(path))


def test_costs_count_the_flops_of_torchs_own_formulas():
    from torch.utils.flop_counter import flop_registry
    from remat.torch._cost import CostModel
    aten = torch.ops.aten
    a, b, c = torch.randn(8, 16), torch.randn(16, 32), torch.randn(8, 32)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    calls = [(aten.mm.default, (a, b), {}),
             (aten.addmm.default, (c, a, b), {}),
             (aten.addmm.default, (c, a, b), {"beta": 0.5}),  # keywords: the formula as it is
             (aten.bmm.default, (a[None], b[None]), {}),
             (aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
              {})]
    for func, args, kwargs in calls:
        result = func(*args, **kwargs)
        want = flop_registry[func.overloadpacket](*args, **kwargs, out_val=result)
        assert want > 0
        assert CostModel.flops(func, args, kwargs, result) == want, func
    assert CostModel.flops(aten.tanh.default, (a,), {}, a.tanh()) == 0


def test_a_calls_cost_is_worked_out_once_per_shape_and_argument():
    from remat.torch._cost import CostModel
    aten = torch.ops.aten
    slow = dict(tflops=1e-6, hbm_gbps=1e-9, launch_ns=0)  # every byte shows
    model = CostModel(**slow)
    a, b = torch.randn(64, 128), torch.randn(128, 256)
    x, w = torch.randn(2, 3, 16, 16), torch.randn(4, 3, 3, 3)
    calls = [(aten.mm.default, (a, b), {}),
             (aten.mm.default, (a[:8], b), {}),  # another shape
             (aten.mm.default, (a.double(), b.double()), {}),  # another dtype: other bytes
             (aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
              {}),
             (aten.convolution.default, (x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1),
              {}),  # another stride: other FLOPs
             (aten.sum.dim_IntList, (a, [0]), {}),
             (aten.sum.dim_IntList, (a, [1]), {"keepdim": True})]
    want = []
    for func, args, kwargs in calls:
        result = func(*args, **kwargs)
        out = [result]
        flat = list(args) + list(kwargs.values())
        fresh = CostModel(**slow).call_ns(func, args, kwargs, result, flat, out)
        want.append(fresh)
        assert model.call_ns(func, args, kwargs, result, list(args), out) == fresh, func
    assert len(set(want[:3])) == 3 and want[3] != want[4]
    assert len(model._memo) == len(calls)
    # Again, from the memo: the same answers, nothing new kept.
    for (func, args, kwargs), fresh in zip(calls, want):
        result = func(*args, **kwargs)
        assert model.call_ns(func, args, kwargs, result, list(args), [result]) == fresh
    assert len(model._memo) == len(calls)
    # A dict argument is not a key: costed afresh each time.
    assert model.call_ns(aten.mm.default, (a, b), {"x": {}}, a @ b, [a, b], [a @ b]) > 0
    assert len(model._memo) == len(calls)
    # So is one whose value cannot be hashed (a list inside is a key; a set is not).
    assert model.call_ns(aten.mm.default, (a, b), {"x": {1}}, a @ b, [a, b], [a @ b]) > 0
    assert len(model._memo) == len(calls)


def _grads_match(f, params, budget):
    for p in params:
        p.grad = None
    torch.manual_seed(0)
    f().backward()
    ref = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    torch.manual_seed(0)
    with remat.torch.budget(budget, policy="lru") as run:
        f().backward()
    return all(torch.equal(a, p.grad) for a, p in zip(ref, params)), run.stats


class TestEdgeCases:
    """Patterns a recompute must not get wrong."""

    torch.manual_seed(0)
    W = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)

    def tail(self, a):
        for _ in range(4):
            a = (a @ self.W).tanh()
        return a.sum()

    def test_conj_view(self):
        def f():
            z = torch.complex(self.x @ self.W, self.x @ self.W.t())
            return self.tail((z.conj() * z[0]).real)
        same, _ = _grads_match(f, [self.W], 5 * 8192)
        assert same

    def test_generator_of_the_users_own(self):
        g = torch.Generator()

        def f():
            g.manual_seed(5)
            h = self.x @ self.W
            return self.tail(h * torch.bernoulli(torch.full_like(h, 0.5), generator=g))
        same, stats = _grads_match(f, [self.W], 3 * 8192)
        assert same and stats["recomputes"] > 0

    def test_detached_leaf_over_an_activation(self):
        def f():
            h = self.x @ self.W
            a = h * 2
            h2 = h.detach().requires_grad_()
            return self.tail(a) + h2.sin().sum()
        same, _ = _grads_match(f, [self.W], 3 * 8192)
        assert same

    def test_dtype_view(self):
        def f():
            r = torch.view_as_real(torch.fft.fft(self.x @ self.W))
            return self.tail((r * 2).sum(-1)[:, :64])
        same, _ = _grads_match(f, [self.W], 5 * 8192)
        assert same

    def test_an_alias_the_schema_does_not_mark_keeps_a_parameter_a_leaf(self):
        # _unsafe_view's output shares its argument's storage without being
        # marked a view. Seen first through it, the parameter's storage is
        # still one made before the context: never dropped, never replayed.
        def f():
            w = torch.ops.aten._unsafe_view(self.W, (64, 64))
            h = self.x @ w
            return self.tail(h.sin() * w.sum())
        same, stats = _grads_match(f, [self.W], 3 * 8192)
        assert same and stats["drops"] > 0 and stats["debug"]["saved_unmanaged"] > 0

    def test_an_alias_of_an_activation_is_recomputed_through_it(self):
        def f():
            h = (self.x @ self.W).exp()
            v = torch.ops.aten._unsafe_view(h, (32 * 64,))
            return self.tail((v.sin() * 3).view(32, 64))
        same, stats = _grads_match(f, [self.W], 3 * 8192)
        assert same and stats["recomputes"] > 0

    # Writes autograd does not see (through an alias its version counter
    # does not cover): a plain step reads the new bytes where a saved
    # tensor is read, and a recompute must still rebuild what each call read.
    @pytest.mark.parametrize("budget", [1 << 30, 6 * 8192, 4 * 8192, 3 * 8192])
    def test_a_write_autograd_does_not_see_into_what_is_saved(self, budget):
        def f():
            h = (self.x @ self.W) + 1
            s = h.sin()                                       # saves all of h
            torch.ops.aten._unsafe_view(h, (32 * 64,)).mul_(2)
            return self.tail(s + h)                           # s read h before the write
        same, _ = _grads_match(f, [self.W], budget)
        assert same

    @pytest.mark.parametrize("budget", [1 << 30, 6 * 8192, 4 * 8192, 3 * 8192])
    def test_a_write_autograd_does_not_see_beside_what_is_saved(self, budget):
        def f():
            h = (self.x @ self.W) + 1
            s = h.sin()                                       # reads all of h
            top = h[:16].exp()                                # saves h's first half only
            torch.ops.aten._unsafe_view(h, (32 * 64,))[16 * 64:].mul_(2)
            return self.tail(s + h) + top.sum()
        same, stats = _grads_match(f, [self.W], budget)
        assert same

    def test_what_reads_a_written_storage_whose_content_cannot_be_replayed_is_kept(self):
        # masked_select's output shape depends on the data: never replayed.
        # Written since it was read, it no longer holds what its readers
        # read, so they cannot be recomputed either: they are kept.
        mask = self.x > -10  # all of it

        def f():
            h = (self.x @ self.W).masked_select(mask).view(32, 64)
            s = h.sin()
            torch.ops.aten._unsafe_view(h, (32 * 64,)).mul_(2)
            return self.tail(s * 2)                           # s * 2 read the old h
        same, stats = _grads_match(f, [self.W], 4 * 8192)
        assert same and stats["debug"]["kept_not_replayable"] >= 2

    def test_a_write_after_its_readers_were_saved_into_what_cannot_be_replayed_is_an_error(self):
        # The same write after s * 2 was saved: what h held when s * 2 was
        # made is gone, and a recompute that needs it says so (a plain step
        # reads the saved s * 2 it still has).
        mask = self.x > -10

        def f():
            h = (self.x @ self.W).masked_select(mask).view(32, 64)
            a = h.sin() * 2
            y = (a @ self.W).tanh()                           # saves a
            torch.ops.aten._unsafe_view(h, (32 * 64,)).mul_(2)
            return self.tail(y) + h.sum()
        f().backward()  # plain
        with pytest.raises(RuntimeError, match="was written since, and its content cannot be "
                                               "replayed"):
            with remat.torch.budget(3 * 8192, policy="lru"):
                f().backward()

    def test_saved_again_after_being_let_go(self):
        def f():
            h = self.x @ self.W
            d = h.sin()
            del d                          # h's only saved use goes: freed
            q = (self.x @ self.W).exp()
            y = h.cos()                    # h saved again
            return self.tail(y) + q.sum()
        same, _ = _grads_match(f, [self.W], 1 << 30)
        assert same

    # A storage saved again after a write autograd does not see, while what
    # remat holds of it is a copy of its older content: recomputed (or copied
    # back) for a backward inside the forward, and, in some cases, offloaded
    # or copied ahead before or after the second save. The new view must read
    # the newer content.
    @staticmethod
    def _saved_again_grad(n, before, after, budget=None):
        """x's gradient, and the budget's stats, of a step that saves half
        of a storage, brings it back by a backward inside the forward,
        writes its other half through an alias autograd does not track and
        saves that half; `before` and `after` are multipliers of more saved
        tensors made just before and just after the second save."""
        def f(x):
            fill = [(x * (i + 3)).cos() for i in range(2)]
            a = x * 2 + 1
            w = a.data[n:]                       # an alias autograd does not track
            y1 = a[:n].sin()                     # saves a's first half
            del a
            fill += [(x * (i + 7)).cos() for i in range(3)]
            g, = torch.autograd.grad(y1.sum(), x, create_graph=True)  # brings a back
            w.mul_(3)                            # beside what y1 saved
            fill += [(x * k).cos() for k in before]
            y2 = (w * x[n:]).sum()               # saves a's second half, written
            fill += [(x * k).cos() for k in after]
            return y1.sum() + y2 + (g * g).sum() + sum(t.sum() for t in fill)

        torch.manual_seed(0)
        x = torch.randn(2 * n, requires_grad=True)
        if budget is None:
            f(x).backward()
            return x.grad, None
        with budget as run:
            f(x).backward()
        return x.grad, run.stats

    @pytest.mark.parametrize("mode", ["drop", "offload", "hybrid"])
    @pytest.mark.parametrize("offloaded_again", [False, True])
    @pytest.mark.parametrize("kib", [8, 16, 24])
    def test_saved_again_after_a_write_while_remat_holds_an_older_copy(
            self, mode, offloaded_again, kib):
        before = [11, 12, 13, 14] if offloaded_again else []
        plain, _ = self._saved_again_grad(1024, before, [])
        kw = {"drop": {}, "offload": {"offload": True, "recompute": False},
              "hybrid": {"offload": True}}[mode]
        got, stats = self._saved_again_grad(1024, before, [],
                                            remat.torch.budget(kib * 1024, **kw))
        assert torch.equal(got, plain)
        assert stats["drops"] + stats["offloads"] > 0

    def test_saved_again_after_a_write_while_a_copy_made_ahead_holds_the_older_content(self):
        # The older copy is copied ahead to host memory (slow rates give the
        # link time for it) before the second save, and offloaded after it:
        # the backward must not read the copy made ahead.
        n, before, after = 16384, [11], list(range(31, 37))
        plain, _ = self._saved_again_grad(n, before, after)
        got, stats = self._saved_again_grad(
            n, before, after, remat.torch.budget("256KiB", offload=True, recompute=False,
                                                 copy_ahead=True, tflops=0.01, hbm_gbps=0.5))
        assert stats["debug"]["copies_ahead"] > 0 and stats["debug"]["ahead_offloads"] > 0
        assert torch.equal(got, plain)

    def test_several_steps_with_an_optimizer_inside(self):
        model, step = models.mlp(0, depth=3)
        plain_model, plain_step = models.mlp(0, depth=3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.1)
        for _ in range(3):
            plain_opt.zero_grad()
            plain_step().backward()
            plain_opt.step()
        full = saved_bytes_of(lambda seed: models.mlp(seed, depth=3))
        with remat.torch.budget(full // 2) as run:
            for _ in range(3):
                opt.zero_grad()
                step().backward()
                opt.step()
        for a, b in zip(plain_model.parameters(), model.parameters()):
            assert torch.equal(a, b)
        assert run.stats["drops"] > 0


def test_record_on_meta_tensors_needs_no_memory(tmp_path):
    """A step far larger than this machine's memory, recorded on meta
    tensors: shapes and costs, no bytes."""
    import json
    model, step = models.gpt(0, batch=256, seq=512, layers=2, d=512, vocab=50000,
                             device="meta")
    path = tmp_path / "big.jsonl"
    remat.torch.record(lambda: step().backward(), str(path))
    made = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["op"] == "call":
            made += sum(o.get("bytes", 0) for o in rec["outputs"])
    assert made > 100 << 30  # over 100 GiB made over the step, none of it allocated


class _CountCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen calls run, by name (remat's replays included)."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_a_calls_saved_outputs_come_back_in_one_run():
    # Layer norm's mean and rstd are saved as it returns, its output later
    # (by the sin after it). A chain on another input then pushes all three
    # out (lru: they are the oldest). The backward needs them again: one
    # replay of layer norm must bring all three back.
    def make(seed):
        torch.manual_seed(seed)
        x = torch.randn(64, 256)
        w = torch.randn(256, requires_grad=True)
        b = torch.randn(256, requires_grad=True)
        u = torch.randn(64, 256, requires_grad=True)
        model = torch.nn.Module()
        model.w, model.b, model.u = (torch.nn.Parameter(t.detach()) for t in (w, b, u))

        def step():
            y = torch.nn.functional.layer_norm(x, (256,), model.w, model.b)
            z = y.sin()
            h = model.u
            for _ in range(8):
                h = h.sin()
            return z.sum() + h.sum()
        return model, step

    plain, plain_loss, _, _ = run_step(make)
    chain_tensor = 64 * 256 * 4
    counter = _CountCalls()
    with counter:
        grads, loss, stats, _ = run_step(make, 3 * chain_tensor + 4096, policy="lru")
    assert torch.equal(loss, plain_loss)
    assert_same_grads(plain, grads)
    assert stats["drops"] >= 3
    # Once in the forward and once for the three outputs (one run per output
    # would make four).
    assert counter.counts["native_layer_norm"] == 2, counter.counts


def _small_net(compiled):
    def make(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 1))
        x = torch.randn(64, 128)
        run = torch.compile(model) if compiled else model
        return model, lambda: run(x).square().mean()
    return make


@pytest.mark.python_recorder
def test_a_compiled_module_runs_as_eager_inside_the_budget():
    # PyTorch does not compile under an active Python dispatch mode (the
    # recorder is one): a compiled module called inside the context runs
    # eagerly, remat manages its activations as an eager model's, and its
    # gradients are the eager model's, bit for bit.
    # Nor does it trace remat's recorder, called from the module's calls.
    from torch._dynamo.utils import counters
    eager, eager_loss, _, _ = run_step(_small_net(False))
    budget = int(saved_bytes_of(_small_net(False)) * 0.5)
    counters.clear()
    grads, loss, stats, _ = run_step(_small_net(True), budget, policy="dtr")
    assert not counters["frames"], dict(counters["frames"])
    assert torch.equal(loss, eager_loss)
    assert_same_grads(eager, grads)
    assert stats["debug"]["saved_tensors"] > 0 and stats["drops"] > 0
    assert stats["peak_saved_bytes"] <= budget


def test_a_budget_entered_each_step_learns_from_the_step_before():
    # One budget object, entered once per step: its runtime stays, and from
    # the second step on each saved tensor's next use is estimated from the
    # step before, which belady (the policy that goes by next uses) needs.
    # Blind, belady is lru; the LSTM's steps of cells are where that loses.
    b = remat.torch.budget(int(saved_bytes_of(models.lstm) * 0.5), policy="belady")
    figures = steps_under(b, models.lstm, 3)
    assert [f["step"] for f in figures] == [1, 2, 3]
    assert figures[0]["debug"]["learned_next_uses"] == 0
    assert figures[1]["debug"]["learned_next_uses"] > 0
    assert figures[1]["debug"]["recomputed_calls"] < figures[0]["debug"]["recomputed_calls"]
    assert figures[2]["debug"]["recomputed_calls"] == figures[1]["debug"]["recomputed_calls"]
    b.close()


def test_a_budget_is_entered_by_one_step_at_a_time():
    b = remat.torch.budget("1GiB")
    with b:
        with pytest.raises(RuntimeError, match="already open|do not nest"):
            with b:
                pass
        with pytest.raises(RuntimeError, match="after leaving"):
            b.close()
    b.close()
    with b:  # after close, a fresh runtime
        pass
    assert b.stats["step"] == 1


def test_a_step_that_raises_leaves_nothing_behind_for_the_next():
    full = saved_bytes_of(models.mlp)
    b = remat.torch.budget(int(full * 0.5), policy="dtr")
    model, step = models.mlp(0)
    with pytest.raises(ValueError, match="the user's own"):
        with b:
            step()  # the forward saved activations; no backward
            raise ValueError("the user's own error")
    assert b.stats["debug"]["saved_bytes"] == 0  # every tensor of the failed step went
    plain, _, _, _ = run_step(models.mlp)
    model, step = models.mlp(0)
    torch.manual_seed(1)
    with b:
        step().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert_same_grads(plain, grads)
    assert b.stats["step"] == 2 and b.stats["drops"] > 0
    b.close()


def _gradient_penalty_step(seed):
    """A double backward, as a gradient penalty (WGAN-GP) or a Hessian-vector
    product takes: the first backward builds a graph (create_graph=True)
    whose own saved tensors the second backward reads."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(64, 256)]
    for _ in range(8):
        layers += [torch.nn.Tanh(), torch.nn.Linear(256, 256)]
    model = torch.nn.Sequential(*layers, torch.nn.Tanh(), torch.nn.Linear(256, 1))
    x = torch.randn(32, 64, requires_grad=True)

    def step():
        y = model(x).sum()
        g, = torch.autograd.grad(y, x, create_graph=True)
        return g.pow(2).sum()
    return model, step


@pytest.mark.parametrize("mode", [dict(policy="dtr"),
                                  dict(policy="hybrid", offload=True, recompute=True)])
def test_double_backward_gradients_equal_under_a_budget(mode):
    plain, plain_loss, _, _ = run_step(_gradient_penalty_step)
    budget = int(saved_bytes_of(_gradient_penalty_step) * 0.5)
    grads, loss, stats, _ = run_step(_gradient_penalty_step, budget, **mode)
    assert torch.equal(loss, plain_loss)
    assert_same_grads(plain, grads)
    assert stats["peak_saved_bytes"] <= budget
    assert stats["drops"] > 0 and stats["recomputes"] > 0


BACKWARDS = {
    "Tensor.backward": lambda loss, params: loss.backward(),
    "autograd.backward": lambda loss, params: torch.autograd.backward([loss]),
    "autograd.grad": lambda loss, params: [
        setattr(p, "grad", g) for p, g in zip(params, torch.autograd.grad(loss, params))],
}


@pytest.mark.python_recorder
@pytest.mark.parametrize("how", list(BACKWARDS))
def test_the_backward_runs_outside_the_recorder(how):
    # The recorder (a dispatch mode) is set aside while the backward runs,
    # whichever way it is started: it records nothing there.
    plain, _, _, _ = run_step(models.gpt)
    budget = int(saved_bytes_of(models.gpt) * 0.5)
    model, step = models.gpt(0)
    params = [p for p in model.parameters() if p.requires_grad]
    torch.manual_seed(1)
    with remat.torch.budget(budget) as run:
        BACKWARDS[how](step(), params)
    assert run.stats["debug"]["backwards_outside_recorder"] == 1
    assert run.stats["drops"] > 0 and run.stats["recomputes"] > 0
    assert_same_grads(plain, {n: p.grad for n, p in model.named_parameters()})


@pytest.mark.python_recorder
def test_a_dispatch_mode_inside_the_budget_keeps_the_backward_in_the_recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    plain, _, _, _ = run_step(models.gpt)
    budget = int(saved_bytes_of(models.gpt) * 0.5)
    model, step = models.gpt(0)
    torch.manual_seed(1)
    with remat.torch.budget(budget) as run:
        with Counting():
            step().backward()
    # The user's mode sits above the recorder: it stays where it is, and it
    # sees the backward's calls.
    assert run.stats["debug"]["backwards_outside_recorder"] == 0
    assert Counting.calls > 0 and run.stats["recomputes"] > 0
    assert_same_grads(plain, {n: p.grad for n, p in model.named_parameters()})


@pytest.mark.python_recorder
@pytest.mark.parametrize("user_mode", [False, True])
def test_a_nodes_saved_tensors_stay_pinned_together(user_mode):
    # MulBackward unpacks a and b (8 KiB each), with autograd's own calls in
    # between: both stay resident while it runs, whether the backward runs
    # outside the recorder or (a user's mode above it) through it.
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)

    def step():
        a = (x @ w).exp()
        b = (x @ w * 0.5).exp()
        (a * b).sum().backward()

    step()
    plain, w.grad = w.grad, None
    inside = PassThrough if user_mode else contextlib.nullcontext
    with pytest.raises(BudgetTooSmall, match="the backward is reading now"):
        with remat.torch.budget(12 * 1024, policy="lru"):
            with inside():
                step()
    w.grad = None
    with remat.torch.budget(16 * 1024, policy="lru") as run:
        with inside():
            step()
    assert torch.equal(plain, w.grad)
    assert run.stats["peak_saved_bytes"] <= 16 * 1024
    assert run.stats["debug"]["backwards_outside_recorder"] == (0 if user_mode else 1)


@pytest.mark.python_recorder
def test_two_backwards_over_one_graph():
    # retain_graph: the second backward unpacks the same saved tensors again,
    # the first of them in the node that unpacked last in the first backward.
    def both(make):
        def step_twice(seed):
            model, step = make(seed)

            def twice():
                loss = step()
                loss.backward(retain_graph=True)
                return loss
            return model, twice
        return step_twice
    plain, _, _, _ = run_step(both(models.mlp))
    budget = int(saved_bytes_of(models.mlp) * 0.4)
    grads, _, stats, _ = run_step(both(models.mlp), budget)
    assert_same_grads(plain, grads)
    assert stats["debug"]["backwards_outside_recorder"] == 2
    assert stats["recomputes"] > 0 and stats["peak_saved_bytes"] <= budget


def test_garbage_collection_waits_inside_and_is_as_before_after():
    import gc
    model, step = models.mlp(0)
    assert gc.isenabled()
    b = remat.torch.budget(1 << 40)
    with b:
        assert not gc.isenabled()
        step().backward()
    assert gc.isenabled()
    # Left as the user had it: off stays off.
    gc.disable()
    try:
        with b:
            step().backward()
        assert not gc.isenabled()
    finally:
        gc.enable()
    # Refused on entry (a nested budget): as before too.
    with b:
        with pytest.raises(RuntimeError, match="do not nest"):
            with remat.torch.budget(1 << 40):
                pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with remat.torch.budget(1 << 40, pause_gc=False):
        assert gc.isenabled()


@pytest.mark.parametrize("offload", [False, True])
def test_a_step_leaves_nothing_for_the_garbage_collector(offload):
    # A plain step leaves no reference cycles. The budget's records (a call
    # and the storages it made refer to each other) must not either, or
    # every step would leave thousands of objects for a full collection.
    # (With offload too, every replay is weighed.)
    import gc
    model, step = models.gpt(0)
    b = remat.torch.budget(1 << 40, offload=offload, offload_guard=False)
    with b:
        step().backward()
    gc.collect()
    gc.disable()
    try:
        step().backward()
        plain = gc.collect()
        with b:
            step().backward()
        left = gc.collect()
    finally:
        gc.enable()
    assert b.stats["debug"]["saved_tensors"] >= 40
    assert left <= plain + 10, (left, plain)


def _func_step(seed, budget=None):
    # An encoder, then torch.func inside the step (per-sample gradients of an
    # inner loss with respect to the encoding, and a Jacobian), then a head:
    # the outer loss reads both.
    torch.manual_seed(seed)
    enc = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 32), torch.nn.GELU(),
                              torch.nn.Linear(32, 32), torch.nn.Tanh())
    head = torch.nn.Linear(32, 4)
    x = torch.randn(8, 16)
    params = [*enc.parameters(), *head.parameters()]
    ctx = budget if budget is not None else contextlib.nullcontext()
    with ctx as run:
        h = enc(x)
        inner = (lambda r: (r.sin() * r).sum())
        with run.keep_saved() if run is not None else contextlib.nullcontext():
            g = torch.func.vmap(torch.func.grad(inner))(h)
            j = torch.func.jacrev(lambda r: torch.tanh(r @ head.weight.T))(h[0])
        loss = (head(h * g) ** 2).mean() + j.square().sum()
        loss.backward()
    return loss.detach(), [p.grad for p in params]


@pytest.mark.parametrize("offload", [False, True])
def test_torch_func_runs_inside_a_keep_saved_block(offload):
    plain_loss, plain_grads = _func_step(0)
    probe = remat.torch.budget(1 << 40)
    _func_step(0, probe)
    saved = probe.stats["peak_saved_bytes"]
    b = remat.torch.budget(int(saved * 0.5), offload=offload, recompute=not offload)
    loss, grads = _func_step(0, b)
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, c) for a, c in zip(grads, plain_grads))
    # The hooks were back after the block: what came after it was saved in remat.
    assert b.stats["debug"]["keep_saved_blocks"] == 1
    assert b.stats["debug"]["saved_tensors"] > 0
    assert b.stats["offloads" if offload else "drops"] > 0
    assert b.stats["peak_saved_bytes"] <= b.stats["budget_bytes"]
    b.close()


def test_torch_func_needs_the_keep_saved_block():
    w = torch.randn(4, 4, requires_grad=True)
    with remat.torch.budget(1 << 30):
        with pytest.raises(RuntimeError, match="saved tensor hooks"):
            torch.func.grad(lambda r: (r @ w).sum())(torch.randn(4))


def test_keep_saved_outside_the_budget_or_under_other_hooks_is_refused():
    b = remat.torch.budget(1 << 30)
    with pytest.raises(RuntimeError, match="inside this budget"):
        with b.keep_saved():
            pass
    with b as run:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            with pytest.raises(RuntimeError, match="innermost"):
                with run.keep_saved():
                    pass
        # Refused, it changed nothing: remat's hooks are still the innermost.
        assert torch._C._autograd._top_saved_tensors_default_hooks(False)[0] == \
            run._engine.pack
        with pytest.raises(ValueError):
            with run.keep_saved():
                raise ValueError("inside")
        assert torch._C._autograd._top_saved_tensors_default_hooks(False)[0] == \
            run._engine.pack
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    with pytest.raises(RuntimeError, match="inside this budget"):
        with b.keep_saved():
            pass
    b.close()


@pytest.mark.parametrize("kind", ["nested", "sparse"])
def test_saved_tensors_without_strided_storage_are_kept_as_autograd_keeps_them(kind):
    # A nested (jagged) tensor's saved tensors and a sparse matrix a product
    # saves: remat holds only strided storages; the rest stay with autograd,
    # counted as unmanaged, and the step is as plain.
    def make():
        torch.manual_seed(0)
        if kind == "nested":
            m = torch.nn.Linear(8, 8)
            seqs = [torch.randn(n, 8) for n in (3, 5, 2)]

            def step():
                h = torch.nn.functional.gelu(m(torch.nested.nested_tensor(
                    seqs, layout=torch.jagged)))
                return torch.cat([t.sum(0) for t in h.unbind()]).square().sum()
        else:
            m = torch.nn.Linear(16, 4)
            x = torch.randn(8, 16)

            def step():
                sparse = torch.relu(x - 0.5).to_sparse()
                return torch.tanh(torch.sparse.mm(sparse, m.weight.T)).square().mean()
        return m, step

    def grads(budget=None):
        m, step = make()
        with budget if budget is not None else contextlib.nullcontext():
            loss = step()
            loss.backward()
        return loss.detach(), [p.grad for p in m.parameters() if p.grad is not None]

    plain_loss, plain = grads()
    saves = []
    grads(torch.autograd.graph.saved_tensors_hooks(lambda t: saves.append(t) or t, lambda t: t))
    b = remat.torch.budget(1 << 30)
    loss, got = grads(b)
    assert torch.equal(loss, plain_loss) and all(torch.equal(a, c) for a, c in zip(got, plain))
    # Every tensor autograd saved is counted, as held by remat or not.
    assert b.stats["debug"]["saved_tensors"] + b.stats["debug"]["saved_unmanaged"] == len(saves)
    assert any(t.layout is not torch.strided for t in saves)
    b.close()


def test_leaving_the_budget_inside_a_keep_saved_block_leaves_no_hooks():
    # The budget left while a keep_saved() block is still open (contexts
    # entered by hand, or by an ExitStack in the wrong order): its exit takes
    # its hooks off the stack, and the block's end does not put them back
    # (torch.func would refuse to run anywhere after).
    b = remat.torch.budget(1 << 30)
    run = b.__enter__()
    block = run.keep_saved()
    block.__enter__()
    b.__exit__(None, None, None)
    block.__exit__(None, None, None)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    w = torch.randn(4, 4, requires_grad=True)
    torch.func.grad(lambda r: (r @ w).sum())(torch.randn(4))
    b.close()
