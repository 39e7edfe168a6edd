"""remat.torch.budget under Ctrl-C, threads, budgets out of range, and the
errors a user meets: each leaves the budget usable, says the cause and the
way out."""

import gc
import os
import signal
import sys
import threading
import warnings

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

import remat.torch  # noqa: E402
from remat.torch import BudgetTooSmall  # noqa: E402
from remat.torch.testing import models  # noqa: E402
from remat.torch import _budget  # noqa: E402

from test_budget import assert_same_grads  # noqa: E402

_REMAT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(_budget.__file__)))


def _tiny(seed):
    return models.mlp(seed, width=8, depth=2, batch=2)


def _grads_of(make, b=None):
    """One step of make's model (seed 0), under budget b if given: the
    gradients by name."""
    model, step = make(0)
    torch.manual_seed(1)
    if b is None:
        step().backward()
    else:
        with b:
            step().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_clean():
    """Nothing a budget sets up is left behind in the process."""
    assert gc.isenabled()
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert not _budget._active
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _InterruptAt:
    """Raises SIGINT (as Ctrl-C does) at the k-th line remat's modules run
    (those of `code`, where given) while the block runs; `reached`: whether
    it got there."""

    def __init__(self, k, code=None):
        self.k = k
        self.code = code
        self.lines = 0
        self.reached = False

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.k:
                self.reached = True
                signal.raise_signal(signal.SIGINT)
        return self._line

    def _call(self, frame, event, arg):
        code = frame.f_code
        if (code is self.code) if self.code is not None else \
                code.co_filename.startswith(_REMAT_DIR):
            return self._line(frame, event, arg)
        return None

    def __enter__(self):
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        return False


def _interrupt_at_every_line(native):
    # A step with drops and replays, interrupted at each line of remat's
    # code it runs in turn (its entry, recording, saving, the replays the
    # library calls back for, its exit), until one runs through without
    # getting to that line. Each time the step raises KeyboardInterrupt (or
    # ends: an interrupt in a finalizer is Python's to drop), nothing is left
    # behind, and the same budget object, and another, run the next step with
    # the plain step's gradients. Returns the lines interrupted at, and how
    # many steps raised.
    plain = _grads_of(_tiny)
    full = 256
    b = remat.torch.budget(full * 5 // 8, policy="dtr", native=native)
    other = remat.torch.budget(full * 5 // 8, policy="dtr", native=native)
    assert_same_grads(plain, _grads_of(_tiny, b))
    assert b.stats["drops"] > 0 and b.stats["recomputes"] > 0
    assert bool(b.stats["debug"].get("native")) == native
    interrupted = 0
    k = 0
    while True:
        k += 1
        with _InterruptAt(k) as at:
            try:
                grads = _grads_of(_tiny, b)
            except KeyboardInterrupt:
                interrupted += 1
            else:
                assert_same_grads(plain, grads)
        _assert_clean()
        if not at.reached:
            break
        assert_same_grads(plain, _grads_of(_tiny, b))
        assert b.stats["peak_saved_bytes"] <= b.budget_bytes
        assert b.stats["drops"] > 0
        assert_same_grads(plain, _grads_of(_tiny, other))
    b.close()
    other.close()
    return k, interrupted


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals reach the main thread only")
@pytest.mark.python_recorder
def test_an_interrupt_at_any_point_of_a_step_leaves_the_budget_usable():
    k, interrupted = _interrupt_at_every_line(native=False)
    assert k > 1000 and interrupted > k // 2


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals reach the main thread only")
def test_an_interrupt_at_any_point_of_a_native_step_leaves_the_budget_usable():
    # The same on the native recorder: the lines are the step's entry and
    # exit in Python (the recording, saving and replays run in C++, where a
    # signal waits for the next Python line: the interrupt then comes out of
    # the step's own code, the budget already left or still to leave).
    pytest.importorskip("ninja", reason="the native recorder is built with ninja "
                        "(pip install ninja)")
    from remat.torch import _native
    if not _native.available():
        pytest.skip("the native recorder cannot be built here")
    k, interrupted = _interrupt_at_every_line(native=True)
    assert k > 300 and interrupted > k // 2


@pytest.mark.python_recorder
def test_an_interrupt_inside_a_replay_comes_out_as_keyboard_interrupt():
    # Ctrl-C as the library calls back for a replay, at each of the
    # callback's first lines (before its own error handling, too): an
    # exception cannot cross the library, so it is held and carried across,
    # and comes out of the backward as itself.
    plain = _grads_of(_tiny)
    b = remat.torch.budget(160, policy="dtr")
    for k in range(1, 4):
        with _InterruptAt(k, code=_budget._Session._on_recompute.__code__) as at:
            with pytest.raises(KeyboardInterrupt):
                _grads_of(_tiny, b)
        assert at.reached
        _assert_clean()
        assert_same_grads(plain, _grads_of(_tiny, b))
        assert b.stats["recomputes"] > 0
    b.close()


class _Escape(BaseException):
    pass


@pytest.mark.python_recorder
def test_any_exception_of_a_replay_is_carried_across_the_library(monkeypatch):
    plain = _grads_of(_tiny)
    b = remat.torch.budget(160, policy="dtr")

    def escape(*args):
        raise _Escape("from the replay")
    with monkeypatch.context() as m:
        m.setattr(_budget.Engine, "_on_recompute", escape)
        with pytest.raises(_Escape, match="from the replay"):
            _grads_of(_tiny, b)
    _assert_clean()
    assert_same_grads(plain, _grads_of(_tiny, b))
    b.close()


def test_one_budget_entered_from_two_threads_lets_one_in():
    # Two threads enter one budget object at once, round after round: one
    # runs its step, the other is refused at once with a clear error (and
    # nothing of the winner's step is touched), and the collector is on
    # after each round.
    b = remat.torch.budget(1 << 20)
    w = torch.randn(8, 8, requires_grad=True)
    rounds = 60
    for r in range(rounds):
        barrier = threading.Barrier(2)
        refused = threading.Event()
        won, errors = [], []

        def enter(i):
            barrier.wait()
            try:
                with b:
                    won.append(i)
                    refused.wait(10)  # open until the other was refused
                    (torch.randn(4, 8) @ w).tanh().sum().backward()
            except RuntimeError as e:
                errors.append(str(e))
                refused.set()
        threads = [threading.Thread(target=enter, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, f"round {r}: {len(won)} threads in"
        assert len(errors) == 1 and "open on another thread" in errors[0], errors
        assert gc.isenabled()
        assert b.stats["step"] == r + 1
    with pytest.raises(RuntimeError, match="open on another thread"):
        entered = threading.Event()
        leave = threading.Event()

        def hold():
            with b:
                entered.set()
                leave.wait(10)
        t = threading.Thread(target=hold)
        t.start()
        entered.wait(10)
        try:
            b.close()
        finally:
            leave.set()
            t.join()
    b.close()
    assert gc.isenabled()


@pytest.mark.parametrize("size", [1 << 64, (1 << 65) + 30000, "20000000TB", 2.0 ** 70])
def test_a_budget_beyond_64_bits_is_refused(size):
    # (It wrapped: 2**65 + 30000 enforced 30000 bytes.)
    with pytest.raises(ValueError, match=r"2\*\*64|size"):
        remat.torch.budget(size)


@pytest.mark.parametrize("size", [0, "0GiB", -1, "-1GiB", "lots", 1.5])
def test_a_budget_of_nothing_or_less_is_refused(size):
    with pytest.raises(ValueError, match="budget") as info:
        remat.torch.budget(size)
    assert "give" in str(info.value)


def test_the_largest_budget_holds_everything():
    plain = _grads_of(_tiny)
    b = remat.torch.budget(remat.torch._common.MAX_BUDGET_BYTES)
    assert_same_grads(plain, _grads_of(_tiny, b))
    assert b.stats["budget_bytes"] == (1 << 64) - 1 and b.stats["drops"] == 0
    b.close()


def test_live_stats_outside_the_with():
    b = remat.torch.budget(160, policy="dtr")
    before = b.live_stats()
    assert before["step"] == 0 and before["budget_bytes"] == 160
    assert all(v == 0 for k, v in before.items()
               if k not in ("step", "budget_bytes") and isinstance(v, int))
    for step in (1, 2):
        _grads_of(_tiny, b)
        assert b.live_stats() == b.stats and b.live_stats()["step"] == step
    assert set(before) == set(b.stats)
    with b:
        assert b.live_stats()["step"] == 3
    b.close()


def test_budget_too_small_survives_torchscript():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.tanh(self.lin(x)).exp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.jit.script is deprecated)
        net = torch.jit.script(Net())
    x = torch.randn(32, 64, requires_grad=True)
    with pytest.raises(BudgetTooSmall, match="cannot hold a saved tensor"):
        with remat.torch.budget(4096):
            net(x).sum().backward()
    # A RuntimeError of the user's own inside the budget stays as it was.
    with pytest.raises(RuntimeError, match="^mine$"):
        with remat.torch.budget(4096):
            try:
                net(x)
            except RuntimeError:
                raise RuntimeError("mine") from None


def _short(message):
    assert len(message.splitlines()) <= 2
    assert "remat_" not in message and "#" not in message


def test_a_budget_too_small_for_what_a_write_pinned_says_why_and_what_to_do():
    # A write into a tensor made before the budget keeps what was computed
    # from it to the step's end: the error names that write and its fix.
    x = torch.randn(32, 64)
    w = torch.randn(64, 64, requires_grad=True)
    with pytest.raises(BudgetTooSmall) as info:
        with remat.torch.budget(32 * 64 * 4 + 100):
            a = (x * 2).sin()
            b = (a @ w).tanh()
            x.add_(1)
            (b @ w).tanh().sum().backward()
    message = str(info.value)
    _short(message)
    assert "kept to the step's end" in message
    assert "made before the budget" in message and "aten.add_" in message
    assert "out of place" in message and "raise the budget to at least" in message


def test_a_budget_too_small_for_what_the_backward_reads_says_so():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    with pytest.raises(BudgetTooSmall) as info:
        with remat.torch.budget(12 * 1024, policy="lru"):
            a = (x @ w).exp()
            b = (x @ w * 0.5).exp()
            (a * b).sum().backward()
    message = str(info.value)
    _short(message)
    assert "the backward is reading now" in message and "at least 16384 bytes" in message


def test_saved_tensor_hooks_refused_inside_a_budget_point_at_keep_saved():
    with pytest.raises(RuntimeError, match="keep_saved") as info:
        with remat.torch.budget(1 << 20):
            with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here, please"):
                pass
    assert "no hooks here, please" in str(info.value)
    _short(str(info.value))
    w = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="keep_saved"):
        with remat.torch.budget(1 << 20):
            torch.func.grad(lambda r: (r @ w).sum())(torch.randn(4))
    _assert_clean()


def test_an_interrupt_held_for_the_main_thread_is_not_raised_on_another():
    # Only the main thread gets signals: a step on another thread (its
    # replays, its entry and exit) leaves an interrupt held for the main
    # thread where it is.
    from remat.torch import _interrupts
    plain = _grads_of(_tiny)
    b = remat.torch.budget(160, policy="dtr")
    out = []

    def step():
        try:
            out.append(_grads_of(_tiny, b))
        except BaseException as e:  # noqa: BLE001: the test reads it
            out.append(e)
    _interrupts._State.pending = signal.SIGINT
    try:
        t = threading.Thread(target=step)
        t.start()
        t.join()
        assert _interrupts._State.pending == signal.SIGINT
    finally:
        _interrupts._State.pending = None
    assert isinstance(out[0], dict), out[0]
    assert_same_grads(plain, out[0])
    assert b.stats["recomputes"] > 0
    b.close()


def test_a_step_interrupted_as_it_enters_is_not_taken_for_one_that_ran():
    # Ctrl-C inside the entry: the step is undone and raises, and the plan
    # trial neither times it nor moves on past it.
    b = remat.torch.budget(160, policy="dtr", offload=True, recompute=True)
    with _InterruptAt(1, code=_budget.budget._enter_step.__code__) as at:
        with pytest.raises(KeyboardInterrupt):
            _grads_of(_tiny, b)
    assert at.reached
    _assert_clean()
    # The planner has the step as abandoned: its trial has not moved on.
    assert b._planner.state().steps_ended == 1
    assert b._planner.plan(0)["runtime_steps"] == 0 and not b._planner.plan(0)["times"]
    assert_same_grads(_grads_of(_tiny), _grads_of(_tiny, b))
    assert b._planner.plan(0)["runtime_steps"] == 1 and not b._planner.plan(0)["times"]
    step = b._planner.begin()  # the trial's second step: mixed's first timed one
    assert (step.plan, step.timed, step.in_trial) == (0, True, True)
    b._planner.end(b._planner.ABANDONED)
    b.close()


def test_an_interrupt_inside_keep_saved_leaves_no_hooks_behind():
    # Ctrl-C at each line of keep_saved() (as it takes remat's hooks off the
    # stack, as it puts them back): the step raises, the hooks stack is as
    # before it, and the next step runs.
    def keep_saved_step(b):
        model, step = _tiny(0)
        torch.manual_seed(1)
        with b as run:
            with run.keep_saved():
                loss = step()
            loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}
    plain = _grads_of(_tiny)
    b = remat.torch.budget(160, policy="dtr")
    code = _budget.budget.keep_saved.__wrapped__.__code__
    k = 0
    while True:
        k += 1
        with _InterruptAt(k, code=code) as at:
            try:
                keep_saved_step(b)
            except KeyboardInterrupt:
                pass
        _assert_clean()
        if not at.reached:
            break
        assert_same_grads(plain, keep_saved_step(b))
        assert_same_grads(plain, _grads_of(_tiny, b))
    assert k > 5
    b.close()


def test_a_step_whose_end_fails_leaves_the_planner_ready_for_the_next():
    # The step's end raises before it tells the planner (a CUDA error in the
    # timing's synchronize, say): the planner's step is still ended, so the
    # next step begins.
    b = remat.torch.budget(1 << 30, offload=True)
    _grads_of(_tiny, b)  # the trial's learning step (untimed)
    calls = []
    clock = b._time

    def failing_clock():
        calls.append(1)
        if len(calls) == 2:  # the timed step's end
            raise RuntimeError("the clock failed (on purpose)")
        return clock()
    b._time = failing_clock
    with pytest.raises(RuntimeError, match="on purpose"):
        _grads_of(_tiny, b)
    b._time = clock
    assert_same_grads(_grads_of(_tiny), _grads_of(_tiny, b))
    b.close()


def test_a_sigint_handler_set_outside_python_is_left_alone(monkeypatch):
    # Where SIGINT's handler was set from C (an embedding program), Python
    # reports None, and no handler can be set back to None: the budget runs
    # without remat's handler and never touches SIGINT's.
    from remat.torch import _interrupts
    calls = []

    class FromC:
        SIGINT = signal.SIGINT

        @staticmethod
        def getsignal(signum):
            return None

        @staticmethod
        def signal(signum, handler):
            calls.append(handler)
            if handler is None:
                raise TypeError("signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a "
                                "callable object")
            return None

    monkeypatch.setattr(_interrupts, "_signal", FromC)
    plain = _grads_of(_tiny)
    b = remat.torch.budget(1 << 30, policy="dtr")
    assert_same_grads(plain, _grads_of(_tiny, b))
    b.close()
    assert calls == []
