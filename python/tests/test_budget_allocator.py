"""remat.torch.budget with remat's allocator's pressure driving its evictions
(pressure="allocator").

On the CPU the allocator (libremat_torch.so) runs on a simulated GPU, and
the test plays the part of PyTorch's CUDA allocations: a request that does
not fit under the budget must make the budget's runtime evict saved
activations, which are then recomputed or copied back with the same bytes.
On a GPU (test_allocator_pressure_on_cuda) it is PyTorch's allocator, and
the budget caps what the step really holds.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / "python")


def _torch_library():
    from remat.torch import _allocator
    try:
        return _allocator.find_library()
    except ImportError as e:
        pytest.skip(str(e))


def _run(script, **env):
    """Runs `script` in a fresh interpreter (the allocator is process-wide,
    configured from the environment when first used)."""
    full = dict(os.environ, PYTHONPATH=PYTHON + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=full,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# What the scripts below begin with: remat's allocator attached, and its
# malloc and free, with which a script plays PyTorch's allocations.
ATTACHED = """
import ctypes
import torch
import remat.torch
from remat.torch import _allocator, _budget
from remat.torch.testing import models

a = _allocator.attach(_allocator.find_library())
malloc = a.so.remat_try_malloc  # (remat_malloc raises, for PyTorch)
malloc.restype = ctypes.c_void_p
malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
free = a.so.remat_free
free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
MIB = 1 << 20
"""

SIM = ATTACHED + """


def grads(make, budget=None, request=0, **kw):
    model, step = make(0)
    torch.manual_seed(1)
    if budget is None:
        step().backward()
        return [p.grad.clone() for p in model.parameters()], None
    with remat.torch.budget(budget, **kw) as run:
        hold = malloc(40 * MIB, 0, None)  # what the rest of the step holds
        assert hold
        loss = step()
        # A request that does not fit: the runtime evicts what it can (here
        # freeing them frees nothing on the simulated GPU, so all that can
        # go goes, and the request still fails).
        got = malloc(request, 0, None) if request else None
        assert got is None
        inside = run.live_stats()
        if request:
            # The next call would raise BudgetTooSmall for it (below); this
            # request was the test's own, not the step's, so the step goes on
            # (its failure counted as seen).
            assert run._engine.last_pressure[0] == request
            run._engine.ooms = a.num_ooms(0)
        loss.backward()
        free(hold, 40 * MIB, 0, None)
    return [p.grad.clone() for p in model.parameters()], (run.stats, inside)


for name, kw in (("mlp", dict(policy="dtr")), ("gpt", dict(policy="dtr-eq")),
                 ("lstm", dict(policy="hybrid", offload=True))):
    make = getattr(models, name)
    plain, _ = grads(make)
    got, (stats, inside) = grads(make, "64MiB", request=30 * MIB, pressure="allocator", **kw)
    assert stats["debug"]["pressure"] == "allocator", stats
    assert stats["debug"]["allocator_pressure_events"] >= 1, stats
    assert inside["drops"] + inside["offloads"] > 0, inside
    assert stats["device_peak_bytes"] <= 64 * MIB, stats
    assert all(torch.equal(x, y) for x, y in zip(plain, got)), name
    # Left: the budget and the callback are the allocator's own again.
    assert a.budget(0) == 1 << 30
    assert not _allocator._listening
    print(name, "ok", stats["drops"], stats["offloads"], stats["recomputes"])

# One budget kept across steps (the runtime learns each step's next uses for
# the next), pressure in every step: the gradients stay right each time.
model, step = models.gpt(0)
plain, _ = grads(models.gpt)
kept = remat.torch.budget("64MiB", policy="dtr-eq", pressure="allocator")
for i in range(3):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with kept as run:
        hold = malloc(40 * MIB, 0, None)
        loss = step()
        assert malloc(30 * MIB, 0, None) is None
        run._engine.ooms = a.num_ooms(0)  # the test's own request
        loss.backward()
        free(hold, 40 * MIB, 0, None)
    assert run.stats["drops"] > 0, run.stats
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), plain)), i
assert run.stats["debug"]["learned_next_uses"] > 0, run.stats
kept.close()

# A budget below what the GPU holds before the step: refused, naming it.
hold = malloc(40 * MIB, 0, None)
try:
    with remat.torch.budget("32MiB", pressure="allocator"):
        pass
except remat.torch.BudgetTooSmall as e:
    assert "holds 41943040 bytes before the step" in str(e), e
else:
    raise AssertionError("no BudgetTooSmall")
assert a.budget(0) == 1 << 30
free(hold, 40 * MIB, 0, None)

# A request nothing can make room for (asked here through remat_try_malloc,
# so nothing raises at the request): the next call raises BudgetTooSmall, as
# the budget watches the allocator's failure count, and the allocator is
# left as it was.
model, step = models.mlp(0)
# A request larger than the whole budget (no callback: nothing could help)
# fails too, and raises the same way.
for request, said in ((30 * MIB, "asked remat's allocator for 31457280 bytes"),
                      (100 * MIB, "nothing left to evict")):
    hold = malloc(40 * MIB, 0, None)
    try:
        with remat.torch.budget("64MiB", pressure="allocator") as run:
            loss = step()
            assert malloc(request, 0, None) is None
            loss.backward()
    except remat.torch.BudgetTooSmall as e:
        assert said in str(e) and "nothing left to evict" in str(e), e
        # Two lines: what did not fit, then the way out (with the least budget
        # where the request asked for room: 40 MiB held beside 30 MiB asked).
        lines = str(e).split("\\n")
        assert len(lines) == 2 and lines[1].startswith("Raise the budget"), e
        if request == 30 * MIB:
            least = int(lines[1].split("at least ")[1].split(" ")[0])
            assert least >= 70 * MIB, e
    else:
        raise AssertionError(f"no BudgetTooSmall for {request}")
    free(hold, 40 * MIB, 0, None)
# An error inside the pressure callback reaches the step, and the allocator
# is left as it was.
hold = malloc(40 * MIB, 0, None)
try:
    with remat.torch.budget("64MiB", pressure="allocator") as run:
        loss = step()
        def broken(*args):
            raise KeyError("broken on purpose")
        run._engine._drain = broken  # runs in the callback, after the evictions
        assert malloc(30 * MIB, 0, None) is None
        torch.ones(1).add_(1)
except KeyError as e:
    assert "broken on purpose" in str(e), e
else:
    raise AssertionError("the callback's error was lost")
free(hold, 40 * MIB, 0, None)
assert a.budget(0) == 1 << 30 and not _allocator._listening
# Attached but not PyTorch's allocator: "auto" keeps the saved-bytes budget.
_, (stats, _) = grads(models.mlp, 1 << 40)
assert stats["debug"]["pressure"] == "saved", stats
assert a.budget(0) == 1 << 30 and not _allocator._listening
# A budget beyond the device caps nothing (the device's capacity).
_, (stats, _) = grads(models.mlp, 1 << 50, pressure="allocator")
assert stats["debug"]["pressure"] == "allocator" and stats["drops"] == 0, stats
assert a.budget(0) == 1 << 30
# pressure="saved": the allocator is left alone.
_, (stats, _) = grads(models.mlp, 1 << 40, pressure="saved")
assert stats["debug"]["pressure"] == "saved" and "device_peak_bytes" not in stats
print("done")
"""


def test_allocator_pressure_makes_the_runtime_evict(tmp_path):
    out = _run(SIM, REMAT_TORCH_LIB=_torch_library(), REMAT_DEVICE="sim",
               REMAT_SIM_CAPACITY="1GiB")
    assert "done" in out, out


def test_steps_end_in_the_allocator_which_places_the_next_by_them():
    # With expandable segments, a block gone by the step's peak is placed
    # apart in the next step (remat_torch_end_step): L1 and T share a page,
    # L2 takes a second, T goes, and the 2 MiB block at the peak needs a
    # third page, where after a step two do. A budget's `with` ends a step.
    out = _run(ATTACHED + """
MIB = 1 << 20
peaks = []
a.end_step(0)  # (what came before the loop: the first step is recorded)
for _ in range(3):
    a.reset_peak(0)
    l1, t, l2 = malloc(MIB // 2, 0, None), malloc(MIB, 0, None), malloc(MIB, 0, None)
    free(t, MIB, 0, None)
    big = malloc(2 * MIB, 0, None)
    peaks.append(a.memory_stats(0)["peak_reserved"] // MIB)
    for p, n in ((l1, MIB // 2), (l2, MIB), (big, 2 * MIB)):
        free(p, n, 0, None)
    a.end_step(0)
    a.so.remat_reset()  # (empty_cache: each step starts from nothing)
print("peaks", *peaks)
ended = []
real = a.end_step
a.end_step = lambda d: (ended.append(d), real(d))
model, step = models.mlp(0)
for _ in range(2):
    with remat.torch.budget(1 << 40, pressure="allocator"):
        step().backward()
print("ended", len(ended))
""", REMAT_TORCH_LIB=_torch_library(), REMAT_DEVICE="sim", REMAT_SIM_CAPACITY="1GiB",
               REMAT_ALLOC_CONF="expandable_segments:True")
    assert "peaks 6 4 4" in out, out
    assert "ended 2" in out, out


def test_a_replay_must_fit_beside_what_the_device_held_as_the_step_began():
    # Counting what the GPU holds, the room a replay has is the budget less
    # what was there before the step (parameters, optimizer state): with
    # most of the budget held, hybrid offloads what it could not bring back
    # in the rest; with nothing held, the same budget lets it drop them.
    out = _run(ATTACHED + """
model, step = models.mlp(0)
torch.manual_seed(1)
step().backward()
plain = [p.grad.clone() for p in model.parameters()]
probe = remat.torch.budget(1 << 40)
with probe:
    step().backward()
budget = 60 * MIB + probe.stats["peak_saved_bytes"] // 4
for held in (60 * MIB, 0):
    hold = malloc(held, 0, None) if held else None
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with remat.torch.budget(budget, offload=True, offload_guard=False,
                            pressure="allocator") as run:
        step().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), plain))
    print(held, run.stats["debug"]["offload_not_drop"])
    if hold:
        free(hold, held, 0, None)
""", REMAT_TORCH_LIB=_torch_library(), REMAT_DEVICE="sim", REMAT_SIM_CAPACITY="1GiB")
    lines = dict(line.split() for line in out.splitlines() if line.strip())
    assert int(lines[str(60 << 20)]) > 0, out
    assert int(lines["0"]) == 0, out


def test_a_replay_that_does_not_fit_under_the_allocators_pressure_comes_back_from_its_copy():
    # Under the allocator's pressure a replay that does not fit is a request
    # the allocator refuses inside the replay (out of memory, seen by the
    # call's check as BudgetTooSmall): the tensor comes back from the copy
    # made as it was dropped, and the step ends with the plain step's
    # gradients, the replay's failed request answered (no error at its end).
    out = _run(ATTACHED + '''
model, step = models.gpt(0)
torch.manual_seed(1)
step().backward()
plain = [p.grad.clone() for p in model.parameters()]
# The first replay's first call asks the allocator for more than the budget
# leaves (the failed request the call's check sees after it, as a CUDA
# call's own request that raised out of memory).
run_call = _budget.Engine._run
failed = []


def run_failing(self, call, memo, rebuild):
    if not failed:
        failed.append(malloc(512 * MIB, 0, None))
    return run_call(self, call, memo, rebuild)


_budget.Engine._run = run_failing
model.zero_grad(set_to_none=True)
torch.manual_seed(1)
with remat.torch.budget("64MiB", policy="dtr", offload=True, offload_guard=False,
                        pressure="allocator") as run:
    hold = malloc(40 * MIB, 0, None)
    loss = step()
    assert malloc(30 * MIB, 0, None) is None  # the evictions
    run._engine.ooms = a.num_ooms(0)  # (the test's own request)
    loss.backward()
    free(hold, 40 * MIB, 0, None)
assert failed == [None], failed
assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), plain))
print(run.stats["drops"], run.stats["offloads"], run.stats["debug"]["backups"], run.stats["debug"]["backups_used"])
assert run.stats["debug"]["backups_used"] == 1, run.stats
print("done")
''', REMAT_TORCH_LIB=_torch_library(), REMAT_DEVICE="sim", REMAT_SIM_CAPACITY="1GiB")
    assert "done" in out, out


def test_a_traced_allocator_refuses_the_pressure_callback(tmp_path):
    # REMAT_TRACE holds its lock across an allocation: a callback freeing
    # through the allocator would wait on it, so the budget is refused.
    out = _run("""
import remat.torch
from remat.torch import _allocator
from remat.torch.testing import models
a = _allocator.attach(_allocator.find_library())
was = a.budget(0)
model, step = models.mlp(0)
try:
    with remat.torch.budget("64MiB", pressure="allocator"):
        step().backward()
except RuntimeError as e:
    assert "REMAT_TRACE" in str(e), e
else:
    raise AssertionError("not refused")
assert a.budget(0) == was and not _allocator._listening
print("done")
""", REMAT_TORCH_LIB=_torch_library(), REMAT_DEVICE="sim", REMAT_SIM_CAPACITY="1GiB",
               REMAT_TRACE=str(tmp_path / "trace.csv"))
    assert "done" in out, out


def test_allocator_pressure_needs_remats_allocator():
    import remat.torch
    from remat.torch import _allocator
    if _allocator.current() is not None:
        pytest.skip("remat's allocator is attached in this process")
    from remat.torch.testing import models
    model, step = models.mlp(0)
    with pytest.raises(RuntimeError, match="use_allocator"):
        with remat.torch.budget("1MiB", pressure="allocator"):
            step().backward()
    with pytest.raises(ValueError, match="pressure must be"):
        remat.torch.budget("1MiB", pressure="gpu")


CUDA = """
import torch
import remat.torch
from remat.torch.testing import models

a = remat.torch.use_allocator()
torch.use_deterministic_algorithms(True, warn_only=True)


def grads(make, ratio=None, need=None, **kw):
    model, step = make(0, device="cuda", **SIZE[make.__name__])
    torch.manual_seed(1)
    torch.cuda.manual_seed(1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # remat_reset: what is reserved is what is allocated
    a.reset_peak(0)
    base = a.memory_stats(0)["allocated"]
    stats = None
    if kw:
        # What is held now (the model, its input, the plain step's gradients
        # kept for the comparison) and `ratio` of what the plain step needed
        # beyond that.
        kw["budget"] = base + int(ratio * need)
        with remat.torch.budget(**kw) as run:
            step().backward()
        stats = run.stats
    else:
        step().backward()
    torch.cuda.synchronize()
    peak = a.memory_stats(0)["peak_allocated"]
    g = [p.grad.clone() for p in model.parameters()]
    del model, step
    return g, stats, base, peak, kw.get("budget")


SIZE = {"mlp": dict(width=2048, depth=8, batch=2048),
        "gpt": dict(batch=8, seq=256, layers=4, d=256, vocab=1024)}
for name, kw in (("mlp", dict(policy="dtr-eq")), ("gpt", dict(policy="dtr-eq")),
                 ("mlp", dict(policy="hybrid", offload=True))):
    make = getattr(models, name)
    plain, _, base, plain_peak, _ = grads(make)
    got, stats, _, _, budget = grads(make, ratio=0.7, need=plain_peak - base, **kw)
    assert stats["debug"]["pressure"] == "allocator", stats
    assert stats["drops"] + stats["offloads"] > 0, stats
    # The budget caps what the allocator reserves: the step ran in 70% of
    # what the plain step needed beyond its parameters and inputs.
    assert stats["device_peak_bytes"] <= budget, (stats, budget)
    same = all(torch.equal(x, y) for x, y in zip(plain, got))
    print(f"{name} {kw['policy']}: plain peak {plain_peak} budget {budget} "
          f"remat peak {stats['device_peak_bytes']} drops {stats['drops']} "
          f"offloads {stats['offloads']} pressure {stats['debug']['allocator_pressure_events']} "
          f"equal {same}")
    assert same, name

# A budget too small for the step: BudgetTooSmall at the call that asked,
# and the GPU still works (remat_malloc raises; a NULL would have become a
# tensor without memory, and the kernel writing it an illegal memory access
# that ends the process's use of the GPU).
make = models.gpt
plain, _, base, plain_peak, _ = grads(make)
try:
    grads(make, ratio=0.02, need=plain_peak - base, policy="dtr-eq")
    raise AssertionError("a 2% budget was enough")
except remat.torch.BudgetTooSmall as e:
    print("too small:", str(e)[:120])
    assert isinstance(e.__cause__, RuntimeError) and "CUDA out of memory." in str(e.__cause__), \
        repr(e.__cause__)
torch.cuda.synchronize()
again, _, _, _, _ = grads(make)
assert all(torch.equal(x, y) for x, y in zip(plain, again)), "the GPU after the failure"
# Outside any budget, PyTorch raises it too, as with its own allocator.
try:
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    raise AssertionError("a petabyte was allocated")
except RuntimeError as e:
    assert "CUDA out of memory." in str(e) or "remat" in str(e), str(e)
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_allocator_pressure_on_cuda():
    out = _run(CUDA, REMAT_TORCH_LIB=_torch_library())
    print(out)
    assert "done" in out, out


class _Counting:
    """An allocator whose failure count the test sets."""

    def __init__(self):
        self.ooms = 0

    def num_ooms(self, device):
        return self.ooms


def _engine_after_a_failed_request():
    from types import SimpleNamespace
    from remat.torch import _budget
    allocator = _Counting()
    engine = SimpleNamespace(pressure_error=None, allocator=allocator, device=0, ooms=0,
                             _too_small=lambda func: _budget.BudgetTooSmall(f"{func}: small"))
    allocator.ooms = 1  # a request failed during the call
    return engine, _budget.Engine.check_allocator


def test_an_out_of_memory_in_a_call_becomes_budget_too_small():
    engine, check = _engine_after_a_failed_request()
    oom = RuntimeError("CUDA out of memory. cannot allocate 8 MiB")
    from remat.torch import BudgetTooSmall
    with pytest.raises(BudgetTooSmall) as e:
        check(engine, "aten.gelu", oom)
    assert e.value.__cause__ is oom
    assert engine.ooms == 1


def test_another_error_in_the_call_is_not_hidden_behind_budget_too_small():
    # A CUDA error (an illegal memory access, say) raised by a call during
    # which a request also failed is the caller's to raise as it was.
    engine, check = _engine_after_a_failed_request()
    check(engine, "aten.gelu", RuntimeError("CUDA error: an illegal memory access"))
    assert engine.ooms == 1  # counted as seen
    check(engine, "aten.add", None)  # and not raised again at the next call


class _StandIn:
    """Stands in for remat's allocator: what a budget reads of it, and its
    count of failed requests."""
    installed = True
    records_streams = False

    def __init__(self):
        self.ooms = 0
        self.cap = 1 << 40

    def memory_stats(self, _device):
        return {"allocated": 0, "peak_reserved": 0, "peak_allocated": 0}

    def budget(self, _device):
        return self.cap

    def set_budget(self, _device, nbytes):
        self.cap = nbytes or (1 << 40)

    def reset_peak(self, _device):
        pass

    def end_step(self, _device):
        pass

    def num_ooms(self, _device):
        return self.ooms

    def set_pressure_fn(self, _device, _fn):
        pass


def test_a_step_that_raises_at_its_end_leaves_the_plan_trial(monkeypatch):
    # A request that failed with no call after it to see it raises
    # BudgetTooSmall as the `with` ends: the plan trial counts that step as
    # failed (its plan leaves the trial), not as a timed step.
    import remat.torch
    from remat.torch import BudgetTooSmall, _allocator
    stand_in = _StandIn()
    monkeypatch.setattr(_allocator, "current", lambda: stand_in)
    b = remat.torch.budget("1GiB", offload=True, recompute=True, pressure="allocator")
    for _ in range(remat.torch.budget.TRIAL_STEPS):
        with b:
            pass
    with pytest.raises(BudgetTooSmall):
        with b:  # the first drop-first step
            stand_in.ooms += 1
    assert list(b.stats["debug"]["plans_refused"]) == ["drop-first"]
    with b:
        pass
    assert b.stats["plan"] == "mixed"
    b.close()
