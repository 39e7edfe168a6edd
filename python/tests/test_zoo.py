"""remat.torch.budget on models written the ways people write them
(remat.torch.testing.zoo): in each mode, at 0.7 of the plain step's saved bytes, the
same loss and bitwise the same gradients and buffers as a plain step, within
the budget, and something evicted."""

import functools

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch.testing.zoo import PATTERNS, ZOO, norms, run_step  # noqa: E402

MODELS = {**ZOO, **PATTERNS}


MODES = {"drop": {}, "offload": {"offload": True, "recompute": False},
         "hybrid": {"offload": True}}


def _step(make, budget=None):
    return (*run_step(make, budget), budget)


@functools.cache
def _plain(name):
    loss, grads, buffers, _ = _step(MODELS[name])
    _, _, _, run = _step(MODELS[name], remat.torch.budget(1 << 40))
    return loss, grads, buffers, run.stats["peak_saved_bytes"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(MODELS))
def test_the_same_step_under_a_budget(name, mode):
    # Hybrid runs a loop through the offload guard's trial (both plans) and
    # a step of the plan it keeps; the other modes one step.
    torch.set_num_threads(1)
    loss, grads, buffers, saved = _plain(name)
    budget = remat.torch.budget(int(saved * 0.7), policy="dtr", **MODES[mode])
    steps = 2 * remat.torch.budget.TRIAL_STEPS + 1 if mode == "hybrid" else 1
    for _ in range(steps):
        got_loss, got_grads, got_buffers, run = _step(MODELS[name], budget)
        stats = run.stats
        assert torch.equal(got_loss, loss)
        assert got_grads.keys() == grads.keys()
        for n in grads:
            assert torch.equal(got_grads[n], grads[n]), f"gradient of {n} differs"
        for n in buffers:
            assert torch.equal(got_buffers[n], buffers[n]), f"buffer {n} differs"
        assert stats["peak_saved_bytes"] <= stats["budget_bytes"]
        assert stats["drops"] + stats["offloads"] > 0, stats
    assert "plans_refused" not in stats["debug"]
    budget.close()


@pytest.mark.parametrize("ratio", [0.4, 0.5])
def test_running_statistics_written_after_a_recomputed_input_was_read(ratio):
    # InstanceNorm's running statistics are written after the repeat of them
    # that batch norm read and wrote: what reads that repeat's first content
    # cannot be replayed from the statistics any more, and is kept.
    torch.set_num_threads(1)
    loss, grads, buffers, saved = _plain("norms")
    budget = remat.torch.budget(int(saved * ratio), policy="dtr")
    got_loss, got_grads, got_buffers, run = _step(norms, budget)
    assert torch.equal(got_loss, loss)
    assert all(torch.equal(got_grads[n], grads[n]) for n in grads)
    assert all(torch.equal(got_buffers[n], buffers[n]) for n in buffers)
    assert run.stats["drops"] > 0 and run.stats["debug"]["kept_not_replayable"] > 0


def test_a_loop_in_hybrid_runs_both_plans_of_the_trial():
    # nn.LSTM at 0.3 of its saved bytes: some of a call's outputs are
    # offloaded rather than dropped (their replay would not fit), and each
    # output joins its call in the runtime only with outputs dropped alike,
    # so the trial's drop-first plan runs too, where it used to fail.
    torch.set_num_threads(1)
    loss, grads, _, saved = _plain("lstm")
    b = remat.torch.budget(int(saved * 0.3), policy="dtr", offload=True)
    for _ in range(2 * remat.torch.budget.TRIAL_STEPS + 1):
        got_loss, got_grads, _, run = _step(MODELS["lstm"], b)
        assert torch.equal(got_loss, loss)
        assert all(torch.equal(got_grads[n], grads[n]) for n in grads)
    assert "plans_refused" not in b.stats["debug"]
    assert set(b.stats["debug"]["plan_trial_seconds"]) == {"mixed", "drop-first"}
    b.close()


@pytest.mark.python_recorder
def test_the_drop_first_plan_does_what_drops_alone_do_where_they_fit():
    # The offload guard's second plan stands for drops alone in its trial:
    # where they fit (nn.LSTM at 0.5), it offloads nothing and drops what
    # drops alone drop, while the mixed plan offloads what its replay could
    # hardly bring back beside the rest.
    torch.set_num_threads(1)
    _, _, _, saved = _plain("lstm")
    alone = remat.torch.budget(int(saved * 0.5), policy="dtr")
    _step(MODELS["lstm"], alone)
    b = remat.torch.budget(int(saved * 0.5), policy="dtr", offload=True)
    steps = 2 * remat.torch.budget.TRIAL_STEPS
    figures = [_step(MODELS["lstm"], b)[3].stats for _ in range(steps)]
    mixed, drop_first = figures[:steps // 2], figures[steps // 2:]
    assert all(f["debug"]["offload_not_drop"] > 0 and f["offloads"] > 0 for f in mixed)
    assert all(f["offloads"] == 0 and f["drops"] == alone.stats["drops"] for f in drop_first)
    b.close()
    alone.close()


@pytest.mark.parametrize("name,ratio", [("rnn_cell", 0.1), ("parametrized", 0.25),
                                        ("parametrized", 0.35), ("transformer", 0.1),
                                        ("norms", 0.25), ("gru", 0.1)])
def test_a_hybrid_loop_runs_where_offload_alone_does(name, ratio):
    # Budgets near the floor, where offload alone runs every step. The
    # trial's drop-first plan used to drop tensors whose replay could not
    # come back: beside the inputs its dropped inputs' own replays pin
    # (rnn_cell, parametrized), or beside what the backward node reading it
    # had pinned (transformer, rnn_cell: learned from the steps before), and
    # the tensors the step keeps to its end (norms: the running statistics'
    # readers). Its first step raised BudgetTooSmall. The GRU's replays ran
    # beside resident inputs pinned ahead of a dropped one (the runtime now
    # brings dropped inputs back first); the LSTMCell's read, inside the
    # replay, a storage handed to the runtime after the tensor they rebuild,
    # with no room for it beside the replay's outputs (now rebuilt there as
    # a temporary of the replay).
    torch.set_num_threads(1)
    loss, grads, _, saved = _plain(name)
    b = remat.torch.budget(int(saved * ratio), policy="dtr", offload=True)
    figures = []
    for _ in range(2 * remat.torch.budget.TRIAL_STEPS + 1):
        got_loss, got_grads, _, run = _step(MODELS[name], b)
        assert torch.equal(got_loss, loss)
        assert all(torch.equal(got_grads[n], grads[n]) for n in grads)
        assert run.stats["peak_saved_bytes"] <= run.stats["budget_bytes"]
        figures.append(run.stats)
    assert "plans_refused" not in b.stats["debug"]
    drop_first = figures[remat.torch.budget.TRIAL_STEPS:2 * remat.torch.budget.TRIAL_STEPS]
    assert all(f["drops"] > 0 for f in drop_first)
    if name == "transformer":
        assert all(f["debug"]["offload_not_drop_seen"] > 0 for f in drop_first)
    if name == "rnn_cell":
        assert all(f["debug"]["rebuilt_in_replay"] > 0 for f in drop_first)
    b.close()


def test_what_a_backward_pinned_beside_each_saved_tensor_is_learned():
    # The runtime's step planner keeps it by kind (the Python recorder's
    # keys: an op, which output, how many such before it).
    from remat._planner import StepPlanner
    p = StepPlanner([("mixed", "dtr", True, True, False)])
    mm, mm_1, add, add_1 = 1, 2, 3, 4

    def step(*seen):
        """A step whose backward read `seen` (kind, bytes, pinned beside);
        then the next one opens."""
        for kind, nbytes, pinned in seen:
            p.saw_pinned(kind, nbytes, pinned)
        p.end(p.FIT)
        p.begin()

    def beside(kind, nbytes):
        return p.kind_seen(kind, nbytes)[2]
    p.begin()
    step((mm, 8, 16), (add, 4, 0), (mm, 8, 4))  # mm read by a second node, with less beside it
    assert beside(mm, 8) == 16
    assert beside(mm_1, 8) == 0  # no second one seen
    # Of another size (a batch of other lengths): larger, scaled up from the
    # largest seen; smaller, the most seen.
    assert beside(mm, 16) == 32
    assert beside(mm, 2) == 16
    # A shorter step seen later scales nothing: 1 byte pinned beside a tensor
    # of 2 does not make 64 beside one of 128 (the most seen, 1, does).
    step((add, 2, 1))
    assert beside(add, 128) == 1
    step((add, 64, 3))
    assert (beside(add, 128), beside(add, 4)) == (6, 3)
    step((add, 4, 12), (mm, 8, 0))
    assert (beside(add, 4), beside(mm, 8)) == (12, 16)
    # A step with other keys (a loop over fewer time steps): what each saw is kept.
    step((add_1, 4, 2))
    assert (beside(add_1, 4), beside(mm, 8)) == (2, 16)
    step()  # a step whose backward read nothing (evaluation) changes nothing
    assert (beside(add_1, 4), beside(mm, 8), beside(add, 128)) == (2, 16, 12)
    p.end(p.ABANDONED)


def _kinds_handed(make, native):
    """Each saved tensor's op and key, in the order a step of `make` handed
    them to the runtime (hybrid, so keys are made), on the native step or
    the Python one."""
    b = remat.torch.budget(1 << 40, policy="dtr", offload=True, offload_guard=False,
                           native=native)
    with b:
        loss = make()
        if native:
            keys = b._engine.step.kinds()
        else:
            keys = [(str(s.producer[0].func), s.beside_key) for s in b._engine.registered]
        loss.backward()
    b.close()
    return keys


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_tensor_saved_more_in_one_step_moves_only_keys_of_its_kind(native):
    # A step that saves one more tensor early (a branch taken: an extra
    # exp) keeps the keys of every other kind as they were; by its place
    # among all, each later tensor would have been read as the one before it.
    torch.manual_seed(0)
    w, v = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)

    def step(extra):
        loss = torch.exp(x @ v).sum() if extra else 0
        h = x
        for _ in range(3):
            h = torch.sigmoid(h @ w)
        return loss + h.sum()

    plain = _kinds_handed(lambda: step(False), native)
    more = _kinds_handed(lambda: step(True), native)
    assert len(plain) == 3 and len(set(k for _, k in plain)) == 3
    assert len(more) == len(plain) + 1 and more[0][0] == "aten.exp.default"
    assert more[1:] == plain  # (each op's keys the same)


def test_views_of_one_storage_a_node_reads_count_once():
    # q * k over the two halves of one tensor: the node reading them pins one
    # storage, not two. Counted twice, the drop-first plan offloaded what
    # drops alone bring back within the budget.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ws = [torch.randn(64, 64, requires_grad=True) for _ in range(3)]
    x = torch.randn(16, 64)

    def step(b):
        with b:
            total = 0
            for w in ws:
                q, k = torch.tanh(x @ w).chunk(2, dim=1)
                total = total + (q * k).sum()
            total.backward()

    alone = remat.torch.budget(6000, policy="dtr")
    step(alone)
    assert alone.stats["drops"] > 0 and alone.stats["offloads"] == 0
    b = remat.torch.budget(6000, policy="dtr", offload=True)
    figures = []
    for _ in range(2 * remat.torch.budget.TRIAL_STEPS):
        step(b)
        figures.append(b.stats)
    drop_first = figures[remat.torch.budget.TRIAL_STEPS:]
    assert all(f["offloads"] == 0 and f["drops"] == alone.stats["drops"] for f in drop_first)
    b.close()
    alone.close()
