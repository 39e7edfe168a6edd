"""remat.torch.budget's two recorders. Budgets record natively by default
(remat.torch._native: the recorder and the saved-tensor hooks in C++, built
against the installed torch on first use; it needs a C++ compiler and
ninja), so the other modules' tests run there; their exactness and offload
tests run again here on the Python recorder (REMAT_TORCH_NATIVE=0: what a
budget uses where the extension cannot be built, what the allocator's
budgets and copies made ahead use, and offload where a GPU is present), and
the native path's own checks follow."""
import contextlib
import warnings
from typing import List

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
pytest.importorskip("ninja", reason="the native recorder is built with ninja (pip install ninja)")

import remat.torch  # noqa: E402
from remat.torch import _native  # noqa: E402
from remat.torch.testing import models, zoo  # noqa: E402

# The exactness tests, collected again here on the Python recorder (the
# autouse fixture below).
from test_budget import (  # noqa: E402,F401
    TestEdgeCases, test_activation_mutated_after_use, test_backward_after_the_context_is_refused,
    test_budgets_do_not_nest, test_double_backward_gradients_equal_under_a_budget,
    test_dropout_masks_replayed_and_rng_left_as_plain, test_gradients_equal_under_drop,
    test_input_mutated_after_forward_keeps_its_dependents, test_other_policies,
    test_a_calls_saved_outputs_come_back_in_one_run,
    test_a_step_that_raises_leaves_nothing_behind_for_the_next,
    test_saved_tensors_without_strided_storage_are_kept_as_autograd_keeps_them,
    test_torch_func_runs_inside_a_keep_saved_block, test_torch_func_needs_the_keep_saved_block,
    test_keep_saved_outside_the_budget_or_under_other_hooks_is_refused,
    test_leaving_the_budget_inside_a_keep_saved_block_leaves_no_hooks,
    test_garbage_collection_waits_inside_and_is_as_before_after)
from test_budget_exact import (  # noqa: E402,F401
    test_a_custom_op_drawing_random_numbers_replays_its_draws,
    test_a_saved_tensor_modified_in_place_raises_as_in_a_plain_step,
    test_a_write_outside_autograd_reads_as_in_a_plain_step,
    test_an_optimizer_step_between_two_backwards_raises_as_in_a_plain_step,
    test_inference_tensors_are_read_as_constants, test_the_in_place_error_names_anomaly_modes_hint,
    test_what_a_replay_reads_is_what_the_call_read)
# The Python recorder's offload, which a machine with a GPU uses by default.
from test_budget import (  # noqa: E402,F401
    test_offload_only, test_hybrid,
    test_a_replay_that_does_not_fit_comes_back_from_a_copy_and_its_kind_is_offloaded,
    test_a_replay_that_did_not_fit_with_no_copy_has_its_kind_offloaded_next_step,
    test_hybrid_offloads_what_could_not_come_back_within_the_budget)
from test_zoo import test_the_same_step_under_a_budget  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _python_recorder(monkeypatch):
    monkeypatch.setenv("REMAT_TORCH_NATIVE", "0")


def _grads(make, budget=None):
    loss, grads, _ = zoo.run_step(make, budget)
    return loss, grads


def test_the_env_switch_and_the_argument_choose_the_native_path(monkeypatch):
    with remat.torch.budget(1 << 40) as run:  # REMAT_TORCH_NATIVE=0
        models.mlp(0)[1]().backward()
    assert "native" not in run.stats["debug"]
    monkeypatch.delenv("REMAT_TORCH_NATIVE")
    with remat.torch.budget(1 << 40) as run:  # the default
        models.mlp(0)[1]().backward()
    assert run.stats["debug"]["native"]
    with remat.torch.budget(1 << 40, native=False) as run:
        models.mlp(0)[1]().backward()
    assert "native" not in run.stats["debug"]
    # Offload is native too on a machine without a GPU (with one, where
    # asked for); the allocator's pressure and copies made ahead need the
    # Python recorder: the switch leaves those alone, the argument refuses them.
    with remat.torch.budget(1 << 40, offload=True) as run:
        models.mlp(0)[1]().backward()
    assert run.stats["debug"].get("native", False) == (not torch.cuda.is_available())
    with remat.torch.budget(1 << 40, offload=True, copy_ahead=True) as run:
        models.mlp(0)[1]().backward()
    assert "native" not in run.stats["debug"]
    for kw in ({"offload": True, "copy_ahead": True}, {"pressure": "allocator"}):
        with pytest.raises(ValueError, match="native=True"):
            remat.torch.budget(1 << 40, native=True, **kw)


@pytest.mark.parametrize("name", ["gru", "transformer", "norms"])
def test_an_autograd_kernels_own_calls_do_not_hide_its_call(name):
    # A GRU cell's in-place multiply has autograd clone its input before the
    # write, at autograd's level: both calls are recorded (the clone's output
    # is what the node saves; the multiply is a write a replay must run).
    make = getattr(zoo, name)
    loss, grads = _grads(make)
    full = remat.torch.budget(1 << 40, native=True)
    _grads(make, full)
    b = remat.torch.budget(int(full.stats["peak_saved_bytes"] * 0.5), native=True)
    got_loss, got = _grads(make, b)
    assert b.stats["drops"] > 0 and b.stats["recomputes"] > 0
    assert torch.equal(got_loss, loss)
    for n in grads:
        assert torch.equal(got[n], grads[n]), n


@pytest.mark.parametrize("name", ["gru", "transformer", "norms", "lstm"])
@pytest.mark.parametrize("kw", [{"recompute": False}, {"recompute": True, "offload_guard": False}],
                         ids=["offload-only", "mixed"])
def test_offloaded_tensors_come_back_with_the_same_bytes(name, kw):
    # The native step copies what the runtime offloads to host memory and
    # back as the backward reads it (and a few before it, prefetched): the
    # gradients are bitwise a plain step's, over several steps that learn.
    make = getattr(zoo, name)
    loss, grads = _grads(make)
    full = remat.torch.budget(1 << 40, native=True)
    _grads(make, full)
    b = remat.torch.budget(int(full.stats["peak_saved_bytes"] * 0.3), policy="dtr",
                           offload=True, native=True, **kw)
    for _ in range(3):
        got_loss, got = _grads(make, b)
        st = b.stats
        assert st["debug"]["native"] and st["offloads"] > 0, st
        # Each offload came back (copied in, or let go unread), and the saved
        # bytes never passed the budget.
        assert st["restores"] <= st["offloads"] and st["restores"] > 0
        assert st["peak_saved_bytes"] <= b.budget_bytes
        assert torch.equal(got_loss, loss)
        for n in grads:
            assert torch.equal(got[n], grads[n]), n
    if kw["recompute"]:
        assert st["debug"]["offload_not_drop"] + st["drops"] > 0
    b.close()


def test_an_offloaded_tensor_saved_again_after_a_write_comes_back_newer():
    # s is saved, offloaded, then written through `.data` (a write autograd
    # does not see) outside what was saved of it, and saved again: remat's
    # host copy must take the newer content, which the second save reads.
    def model(x, w):
        a = x * w                 # s
        b = a[:4].sin()           # saves a[:4]
        d = (w * 5).sin()         # the budget offloads s
        a.data[4:].mul_(3)        # a write outside what is saved of s
        c = a[4:].sin()           # saves a[4:]: s's newer content
        return b.sum() + c.sum() + d.sum()

    def step(budget=None):
        torch.manual_seed(0)
        x, w = torch.randn(8, 64), torch.randn(8, 64, requires_grad=True)
        with budget if budget is not None else contextlib.nullcontext():
            model(x, w).backward()
        return w.grad

    plain = step()
    b = remat.torch.budget(8 * 64 * 4 * 3 // 2, policy="lru", offload=True, recompute=False,
                           native=True)
    got = step(b)
    assert b.stats["offloads"] > 0
    assert torch.equal(got, plain)


def test_a_drop_the_backward_never_reads_counts_as_one_that_did_no_harm(monkeypatch):
    # Drops are copied first while no replay of their kind has been seen to
    # fit (the estimate made blind, so every drop is admitted). The side
    # branch's tensor is dropped and never read: its graph outlives the step.
    # Its handles go after the step's end, which reports that drop as one
    # that did no harm, so from the step after next its kind is dropped
    # without a copy, as the chain's are once their replays fit.
    from _blind import drop_first_drops_blindly
    drop_first_drops_blindly(monkeypatch, every_plan=True)
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    b = remat.torch.budget(3 * 32 * 64 * 4, policy="dtr", offload=True, offload_guard=False,
                           native=True)
    figures = []
    for _ in range(4):
        with b:
            side = torch.tanh(x @ w).sin()  # noqa: F841 (kept past the step)
            h = x
            for _ in range(6):
                h = torch.tanh(h @ w)
            h.sum().backward()
        figures.append(b.stats)
        del side
    # Each step drops the side tensor beside the chain's, and replays only
    # the chain's.
    assert all(f["drops"] == f["recomputes"] + 1 for f in figures)
    assert figures[0]["debug"]["backups"] > 0
    assert [f["debug"]["backups"] for f in figures[2:]] == [0, 0]
    b.close()


def test_a_python_dispatch_mode_around_the_budget_is_seen_through():
    # A mode's handler runs the call again with the outer call's dispatch
    # state: one call, recorded once, so the saved tensors stay remat's.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    loss, grads = _grads(models.mlp)
    with Count():
        b = remat.torch.budget(1 << 40, native=True)
        got_loss, got = _grads(models.mlp, b)
    assert b.stats["debug"]["saved_tensors"] > 0
    assert torch.equal(got_loss, loss)
    assert all(torch.equal(got[n], grads[n]) for n in grads)


def test_the_extension_names_the_torch_it_was_built_for():
    mod = _native.module()
    assert mod.TORCH_VERSION.split("+")[0] == torch.__version__.split("+")[0]


@pytest.mark.parametrize("op, rates, expected", [
    # One 256x256x256 matmul: 2 x 256^3 FLOPs at 1 GFLOPS.
    ("mm", dict(tflops=0.001, hbm_gbps=1e6), 2 * 256 ** 3),
    # An exp moves 2 x 256 KiB at 1 MB/s.
    ("exp", dict(tflops=1e6, hbm_gbps=0.001), 2 * 256 * 256 * 4 * 1000),
])
def test_a_call_costs_what_the_model_says(op, rates, expected):
    # A call's cost is modelled from its FLOPs and bytes at the budget's
    # rates (on a GPU the host's time would say nothing of a kernel's; on the
    # CPU measured times would make a loop's steps choose differently). Each
    # recompute of the dropped call is charged that much.
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    w = [torch.randn(256, 256, requires_grad=True) for _ in range(2)]
    b = remat.torch.budget(256 * 256 * 4 + 1024, native=True, **rates)
    with b:
        hs = [x @ v if op == "mm" else (x + v).exp() for v in w]
        sum(h.sin().sum() for h in hs).backward()
    st = b.stats
    assert st["recomputes"] >= 1
    # (The exp's recompute replays its add too: 3 x 256 KiB at 1 MB/s.)
    per = expected if op == "mm" else expected + 3 * 256 * 256 * 4 * 1000
    assert st["debug"]["recompute_ns_estimate"] == st["recomputes"] * per
    b.close()


def test_remat_allocators_budget_records_in_python(monkeypatch):
    # pressure="auto" with remat's allocator as PyTorch's counts what the
    # GPU holds, which the native path does not: a default budget's step
    # records in Python there; native=True is refused, saying what to pass.
    monkeypatch.delenv("REMAT_TORCH_NATIVE")
    installed = object()  # (what _allocator() returns once use_allocator() was called)
    assert remat.torch.budget(1 << 20)._native_now(None) is True
    assert remat.torch.budget(1 << 20)._native_now(installed) is False
    assert remat.torch.budget(1 << 20, native=False)._native_now(None) is False
    with pytest.raises(RuntimeError, match="pressure='saved'"):
        remat.torch.budget(1 << 20, native=True)._native_now(installed)


def test_a_list_of_policies_runs_natively_and_keeps_the_quickest():
    # Drop-only, each policy's trial steps record in C++ too, timed (the
    # budget's clock), and the quickest policy runs the steps after.
    from test_budget import _timed_by_plan, saved_bytes_of, steps_under
    policies = ["dtr", "lru", "msps"]
    b = remat.torch.budget(int(saved_bytes_of(models.mlp) * 0.5), policy=policies, native=True)
    b._clock = _timed_by_plan(b, {"dtr drop-only": 2.0, "lru drop-only": 1.0,
                                  "msps drop-only": 3.0})
    per_plan = remat.torch.budget.TRIAL_STEPS
    figures = steps_under(b, models.mlp, len(policies) * per_plan + 2)
    assert all(f["debug"]["native"] and f["drops"] > 0 for f in figures)
    assert [f["plan"] for f in figures] == \
        ["trial"] * (len(policies) * per_plan) + ["lru drop-only"] * 2
    for i, policy in enumerate(policies):
        assert all(f["policy"] == policy for f in figures[i * per_plan:(i + 1) * per_plan])
    assert figures[-1]["policy"] == "lru"
    assert sorted(figures[-1]["debug"]["plan_trial_seconds"]) == \
        sorted(f"{p} drop-only" for p in policies)
    b.close()


def _chain(w, x, layers=6):
    for _ in range(layers):
        x = torch.tanh(x @ w) * 1.01
    return x.sum()


def _chain_and_plain_grad():
    # A weight and an input for _chain, and the weight's gradient in a plain step.
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16)
    _chain(w, x).backward()
    plain, w.grad = w.grad, None
    return w, x, plain


def test_each_saved_tensor_goes_through_the_cpp_hooks_unless_others_are_innermost():
    # Autograd asks its default engine for a saved tensor's hooks; remat's
    # engine answers with C++ hooks where the step's own are innermost (no
    # Python per saved tensor), and with the program's where those are.
    w, x, plain = _chain_and_plain_grad()
    with remat.torch.budget(1 << 30, policy="dtr", native=True) as run:
        _chain(w, x).backward()
    assert torch.equal(w.grad, plain)
    debug = run.stats["debug"]
    assert debug["saved_tensors"] > 0
    assert debug["saved_by_cpp_hooks"] == debug["saved_tensors"] + debug["saved_unmanaged"]
    w.grad = None
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t
    with remat.torch.budget(1 << 30, policy="dtr", native=True) as run:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = _chain(w, x)
        loss.backward()
    assert torch.equal(w.grad, plain)
    assert len(packed) > 0 and run.stats["debug"]["saved_by_cpp_hooks"] == 0


class _SeesHooks(torch.autograd.Function):
    # Its backward notes the saved-tensor hooks innermost as it runs.
    seen = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        _SeesHooks.seen.append(torch._C._autograd._top_saved_tensors_default_hooks(False))
        return g * 2


def test_a_backward_that_builds_no_graph_runs_without_the_steps_hooks():
    # Autograd copies the hooks' stack into and out of each node it runs (a
    # Python hook's copy takes the GIL): a backward that saves nothing runs
    # with the step's hooks set aside, and they are back once it returns. A
    # backward that builds a graph (create_graph) keeps them, for what it saves.
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16)
    _SeesHooks.seen.clear()
    with remat.torch.budget(1 << 30, policy="dtr", native=True):
        own = torch._C._autograd._top_saved_tensors_default_hooks(False)
        assert own is not None
        _SeesHooks.apply(_chain(w, x)).backward()
        assert _SeesHooks.seen[-1] is None
        assert torch._C._autograd._top_saved_tensors_default_hooks(False)[0] is own[0]
        (g,) = torch.autograd.grad(_SeesHooks.apply(_chain(w, x)), w, create_graph=True)
        assert _SeesHooks.seen[-1][0] is own[0]
        g.sum().backward()
        assert _SeesHooks.seen == [None, _SeesHooks.seen[1]]
        # create_graph given by position: Tensor.backward's fourth argument
        # (self first), autograd.grad's fifth
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # (create_graph's reference cycle)
            _SeesHooks.apply(_chain(w, x)).backward(None, None, True)
        assert _SeesHooks.seen[-1][0] is own[0]
        torch.autograd.grad(_SeesHooks.apply(_chain(w, x)), w, None, None, False)
        assert _SeesHooks.seen[-1] is None
        w.grad = None
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def _tanh_chain(x, w):
    for _ in range(100):
        x = torch.tanh(x * w)
    return x


def _forked(x, w) -> List[torch.Tensor]:
    futures = [torch.jit.fork(_tanh_chain, x, w) for _ in range(8)]
    return [torch.jit.wait(f) for f in futures]


def test_tasks_saving_on_several_threads_at_once_keep_the_steps_books_whole():
    # jit.fork's tasks inherit the hooks and save side by side on other
    # threads (as autograd's device threads unpack): each saved tensor is
    # counted once, as the Python hooks, serialised by the GIL, counted them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (torch.jit.script's deprecation)
        forked = torch.jit.script(_forked)
    threads = torch.get_num_interop_threads()
    torch.manual_seed(0)
    w = torch.randn(8, requires_grad=True)
    x = torch.randn(8)
    plain = torch.autograd.grad(sum(y.sum() for y in forked(x, w)), w)[0]
    for _ in range(3):
        with remat.torch.budget(1 << 30, policy="dtr", native=True) as run:
            (g,) = torch.autograd.grad(sum(y.sum() for y in forked(x, w)), w)
        debug = run.stats["debug"]
        assert debug["saved_by_cpp_hooks"] == debug["saved_tensors"] + debug["saved_unmanaged"]
        assert debug["saved_by_cpp_hooks"] >= 8 * 100 * 2
        # (the branches' gradients add up in the order the tasks ran)
        assert torch.allclose(g, plain)
    assert torch.get_num_interop_threads() == threads


def test_keep_saved_inside_a_backward_that_builds_no_graph():
    # The step's hooks are off already there: the block runs, as it did
    # when they were on and it took them off.
    runs = []

    class VjpInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with runs[0].keep_saved() if runs else contextlib.nullcontext():
                _, vjp = torch.func.vjp(torch.sin, x)
            return vjp(g)[0] + g * 2
    torch.manual_seed(0)
    w = torch.randn(8, requires_grad=True)
    VjpInBackward.apply(torch.tanh(w)).sum().backward()
    plain, w.grad = w.grad, None
    with remat.torch.budget(1 << 30, policy="dtr", native=True) as run:
        runs.append(run)
        VjpInBackward.apply(torch.tanh(w)).sum().backward()
    assert torch.equal(w.grad, plain)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_compiled_autograd_reads_the_cpp_hooks_saved_tensors():
    # Compiled autograd calls a saved tensor's unpack hook from Python: the
    # C++ hooks hand it the Python hook over a handle of their own.
    ca = pytest.importorskip("torch._dynamo.compiled_autograd")
    w, x, plain = _chain_and_plain_grad()
    with remat.torch.budget(1 << 30, policy="dtr", native=True) as run:
        loss = _chain(w, x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (dynamo cannot trace the C hook: a graph break)
            with ca._enable(torch.compile(backend="eager")):
                loss.backward()
    assert torch.allclose(w.grad, plain)
    assert run.stats["debug"]["saved_by_cpp_hooks"] > 0


def test_the_recorder_is_back_after_a_backward_with_backwards_inside_its_nodes():
    # A reentrant checkpoint runs a backward inside a backward's node; the
    # calls after the outer backward are recorded again.
    import torch.utils.checkpoint as checkpoint
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16, requires_grad=True)

    def block(h):
        return torch.tanh(h @ w)
    with remat.torch.budget(1 << 30, policy="dtr", native=True) as run:
        h = x
        for _ in range(3):
            h = checkpoint.checkpoint(block, h, use_reentrant=True)
        h.sum().backward()
        before = run._engine.step.counts()["recorded_calls"]
        torch.tanh(x @ w).sum().backward()
        assert run._engine.step.counts()["recorded_calls"] > before


def test_methods_are_wrapped_inside_each_step_and_what_the_program_set_comes_back():
    # The wrappers are made once and set at each step; a method the program
    # replaced between steps is the one wrapped, and put back, from then on.
    plain = (torch.Tensor.numpy, torch.Tensor.backward, torch.autograd.grad)
    w = torch.randn(8, 8, requires_grad=True)
    b = remat.torch.budget(1 << 30, policy="dtr", native=True)
    seen = []

    def step():
        with b:
            seen.append((torch.Tensor.numpy, torch.Tensor.backward, torch.autograd.grad))
            (w * 2).tanh().sum().backward()
            (w * 3).detach().numpy()

    step()
    step()
    assert (torch.Tensor.numpy, torch.Tensor.backward, torch.autograd.grad) == plain
    assert seen[0] == seen[1] and not set(seen[0]) & set(plain)
    calls = []

    def own_numpy(self, *args, **kwargs):
        calls.append(self.shape)
        return plain[0](self, *args, **kwargs)

    torch.Tensor.numpy = own_numpy
    try:
        step()
        assert calls == [(8, 8)] and seen[2][0] is not own_numpy
        assert torch.Tensor.numpy is own_numpy
    finally:
        del torch.Tensor.numpy
    step()
    assert torch.Tensor.numpy is plain[0] and calls == [(8, 8)]
    # One the program sets inside a step stays after it.
    with b:
        torch.Tensor.numpy = own_numpy
    try:
        assert torch.Tensor.numpy is own_numpy and torch.Tensor.backward is plain[1]
    finally:
        del torch.Tensor.numpy
