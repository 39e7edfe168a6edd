"""python -m remat.torch.bench: the figures users judge a memory-saving scheme
by, side by side in one run, for a GPT-2-style model (with dropout), a ResNet
(batch norm) and an LSTM:

  plain        a plain step
  checkpoint   torch.utils.checkpoint around every block
  save_on_cpu  torch.autograd.graph.save_on_cpu
  remat-drop   remat.torch.budget(ratio x plain saved bytes), recompute only
               (the native recorder, as such budgets record by default)
  remat-python                                             the same, native=False
  remat-offload                                            offload only
  remat-hybrid                                             both, policy hybrid

Columns: peak activation memory (the most bytes of tensors the step made that
were alive at once on the device, all of them, not only the saved ones, so the
schemes compare on what the device really held; on the CPU the host copies of
save_on_cpu and remat-offload are on the same device and count), step time
(median of --repeat steps without the meter, after the metered one, and their min-max),
samples per second, the largest
batch (x1, x2, x4) whose peak activation memory stays under the plain step's at
x1 (the "does it fit" figure), and whether the gradients equal the plain
step's bit for bit.

A remat row measures a training loop's steady steps, not its first: one budget
serves the row's steps, as in a loop that enters it once per step. It first
runs warm-up steps, unmeasured: one, in which the runtime learns the step's
next uses, or with offload and recompute both allowed, the offload guard's
trial (2 x budget.TRIAL_STEPS steps) and one more. The plan kept is in the
`plan` column. Each batch the "fits" column tries gets a budget of its own
and the same warm-up steps (a budget's first steps copy what they drop to
host memory, which on the CPU is the device's: a batch fits in the steady
steps, as the row's figures are of them).

--compile adds torch.compile rows: plain, and with its activation_memory_budget
at each ratio (its ratio is of what compile's own partitioner would save, not
of the plain step's saved bytes; compiled numerics differ from eager, so its
gradients are not expected to be bitwise equal). On CUDA the peak is the
allocator's (torch.cuda.max_memory_allocated above the start).

--remat-allocator (CUDA) makes remat's allocator PyTorch's for the whole run
(remat.torch.use_allocator()): every row allocates through it, and the remat
rows' budgets count what the GPU holds, their evictions driven by the
allocator's pressure. A remat row's budget is then what the step holds before
it starts (parameters, inputs) plus the ratio times the plain step's peak
activation memory, and its "fits" runs get the plain x1 step's whole peak.

  python -m remat.torch.bench [--device cpu|cuda] [--models gpt,resnet,lstm]
      [--ratios 0.3,0.5,0.7,0.9] [--repeat 3] [--compile] [--remat-allocator]
      [--size small|large] [--methods plain,remat-drop,...]
      [--markdown out.md]

--methods runs only the rows named (the plain step is still run once, as the
reference the gradients and budgets come from).
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import remat.torch
from remat.torch.testing import models


class PeakMeter(TorchDispatchMode):
    """The most bytes of storages made inside it that were alive at once on
    `device`, checked after every ATen call."""

    def __init__(self, device):
        super().__init__()
        self.device = torch.device(device)
        self.alive = {}
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        dead = [k for k, (ref, _) in self.alive.items() if ref.expired()]
        for k in dead:
            self.live -= self.alive.pop(k)[1]
        if getattr(func, "is_view", False):
            # A view's storage is its input's: made before, or seen when made.
            # (Counting it here counted a parameter the first time a view of it
            # passed, as a budget's hooks detach weights: 40 MiB of a GPT-2's.)
            self.peak = max(self.peak, self.live)
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == self.device.type and \
                    t.layout == torch.strided:
                st = t.untyped_storage()
                k = st._cdata
                if k not in self.alive:
                    self.alive[k] = (StorageWeakRef(st), st.nbytes())
                    self.live += st.nbytes()
        self.peak = max(self.peak, self.live)
        return out


class CudaPeak:
    """The CUDA allocator's peak over the step, above what was allocated at
    its start: every tensor the step made, compiled code's buffers too."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.peak = 0

    def __enter__(self):
        torch.cuda.synchronize(self.device)
        if _ALLOCATOR is not None:  # PyTorch keeps no figures for a pluggable allocator
            _ALLOCATOR.reset_peak(self.device.index or 0)
            self.base = _ALLOCATOR.memory_stats(self.device.index or 0)["allocated"]
        else:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.device)
        if _ALLOCATOR is not None:
            top = _ALLOCATOR.memory_stats(self.device.index or 0)["peak_allocated"]
        else:
            top = torch.cuda.max_memory_allocated(self.device)
        self.peak = top - self.base
        return False


# remat's allocator, where --remat-allocator made it PyTorch's.
_ALLOCATOR = None


def held_before_step(name, device):
    """What remat's allocator holds once a step's model and inputs exist."""
    maker, kw, _ = MODELS[name]
    torch.cuda.synchronize()
    model, step = maker(0, device=device, **kw)
    torch.cuda.synchronize()
    held = _ALLOCATOR.memory_stats(torch.device(device).index or 0)["allocated"]
    del model, step
    return held


MODELS = {
    # (maker, kwargs at x1, the batch keyword)
    "gpt": (models.gpt, dict(batch=8, seq=128, layers=4, d=128, vocab=512), "batch"),
    "resnet": (models.resnet, dict(batch=16, channels=32, blocks=4, image=32), "batch"),
    "lstm": (models.lstm, dict(batch=16, seq=64, hidden=128, layers=2, vocab=256), "batch"),
}
# --size large: steps whose kernels, not Python, set a GPU's step time (a
# GPT-2-small-wide decoder at seq 512; a ResNet at 64x64; an LSTM of 1024).
LARGE = {
    "gpt": dict(batch=8, seq=512, layers=6, d=768, vocab=8192),
    "resnet": dict(batch=64, channels=64, blocks=4, image=64),
    "lstm": dict(batch=64, seq=128, hidden=1024, layers=2, vocab=8192),
}


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


REMAT_MODES = {"remat-drop": dict(recompute=True, offload=False, policy="dtr-eq"),
               "remat-python": dict(recompute=True, offload=False, policy="dtr-eq",
                                    native=False),
               "remat-offload": dict(recompute=False, offload=True, policy="lru"),
               "remat-hybrid": dict(recompute=True, offload=True, policy="hybrid")}


def row_budget(method, ratio, saved_bytes, device_bytes=None):
    """The budget a remat row's steps share, or None for the other methods:
    ratio x the plain step's saved bytes, or with remat's allocator
    `device_bytes` of the GPU."""
    if method not in REMAT_MODES:
        return None
    if _ALLOCATOR is not None:
        return remat.torch.budget(device_bytes, **REMAT_MODES[method])
    return remat.torch.budget(max(1, int(saved_bytes * ratio)), **REMAT_MODES[method])


def warm_up_steps(method):
    """Unmeasured steps before a remat row's: the learning step, and with
    offload and recompute both allowed the offload guard's trial before it."""
    mode = REMAT_MODES[method]
    trial = 2 * remat.torch.budget.TRIAL_STEPS if mode["offload"] and mode["recompute"] else 0
    return trial + 1


def warm(name, method, ratio, saved_bytes, device, scale=1, device_bytes=None):
    """A remat row's budget after its warm-up steps (None for other methods)."""
    session = row_budget(method, ratio, saved_bytes, device_bytes)
    if session is not None:
        try:
            for _ in range(warm_up_steps(method)):
                one_step(name, method, ratio, saved_bytes, device, scale=scale, metered=False,
                         session=session)
        except BaseException:
            session.close()
            raise
    return session


def one_step(name, method, ratio, saved_bytes, device, scale=1, seed=0, metered=True,
             session=None):
    """(grads, peak activation bytes, seconds, stats, batch) of one step; the
    meter (which looks at every live storage after every call) only where
    `metered`, so that timed steps do not pay for it. A remat method runs
    under `session` (a row's budget, entered once per step), or a fresh one."""
    maker, kw, batch_key = MODELS[name]
    kw = dict(kw)
    kw[batch_key] *= scale
    if method.startswith("compile"):
        model, step = compiled(maker, kw, name, ratio, device, scale, seed)
    else:
        model, step = maker(seed, ckpt=(method == "checkpoint"), device=device, **kw)
    torch.manual_seed(seed + 1)
    _sync(device)
    if not metered:
        meter = contextlib.nullcontext()
    elif torch.device(device).type == "cuda":
        meter = CudaPeak(device)
    else:
        meter = PeakMeter(device)
    stats = None
    t0 = time.perf_counter()
    with meter:
        if method in ("plain", "checkpoint") or method.startswith("compile"):
            step().backward()
        elif method == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=torch.device(device).type == "cuda"):
                loss = step()
            loss.backward()
        else:
            if session is None:
                session = row_budget(method, ratio, saved_bytes)
            with session as run:
                step().backward()
            stats = run.stats
    _sync(device)
    seconds = time.perf_counter() - t0
    # By position: checkpoint's wrappers rename the parameters, not reorder them.
    grads = {i: p.grad.detach().clone() for i, p in enumerate(model.parameters())
             if p.grad is not None}
    return grads, meter.peak if metered else None, seconds, stats, kw[batch_key]


# The compiled step of the compile row being measured: (key, model, step).
_COMPILED = []


def compiled(maker, kw, name, ratio, device, scale, seed):
    """The row's model and compiled step, compiled once per row and batch:
    its first run (forward and backward) compiles, unmeasured, so that the
    row meters and times steady steps, as for the other methods."""
    import torch._functorch.config as functorch_config
    key = (name, ratio, device, scale, seed)
    if not _COMPILED or _COMPILED[0][0] != key:
        _COMPILED.clear()
        torch._dynamo.reset()
        functorch_config.activation_memory_budget = ratio if ratio is not None else 1.0
        model, step = maker(seed, device=device, **kw)
        step = torch.compile(step)
        torch.manual_seed(seed + 1)
        step().backward()
        _COMPILED.append((key, model, step))
    _, model, step = _COMPILED[0]
    model.zero_grad(set_to_none=True)
    return model, step


def plain_saved_bytes(name, device):
    maker, kw, _ = MODELS[name]
    model, step = maker(0, device=device, **kw)
    torch.manual_seed(1)
    with remat.torch.budget(1 << 40) as run:
        step().backward()
    return run.stats["peak_saved_bytes"]


METHODS = ("plain", "checkpoint", "save_on_cpu", "compile", "remat-drop", "remat-python",
           "remat-offload", "remat-hybrid", "compile-budget")


def rows(names, ratios, repeat, device, out, compile_too=False, only=None):
    """The table's rows; `only`: the methods to run (default all; the
    compile ones with `compile_too`)."""
    methods = [("plain", None), ("checkpoint", None), ("save_on_cpu", None)]
    if compile_too:
        methods.append(("compile", None))
    for r in ratios:
        methods += [("remat-drop", r), ("remat-python", r), ("remat-offload", r),
                    ("remat-hybrid", r)]
        if compile_too:
            methods.append(("compile-budget", r))
    if only is not None:
        methods = [(m, r) for m, r in methods if m in only]
    if _ALLOCATOR is not None:
        # (The allocator's budgets record in Python: remat-drop is remat-python there.)
        methods = [(m, r) for m, r in methods if m != "remat-python"]
    header = ("| model | method | budget | peak activation MiB | step ms | step ms min-max | "
              "samples/s | fits (batch) | plan | drops | recomputes | offloads | grads equal |")
    out.write(header + "\n" + "|---" * 13 + "|\n")
    for name in names:
        saved = plain_saved_bytes(name, device)
        ref, cap, _, _, _ = one_step(name, "plain", None, saved, device)
        held = held_before_step(name, device) if _ALLOCATOR is not None else 0
        for method, ratio in methods:
            session = None
            device_bytes = held + int(cap * ratio) if ratio else None
            try:
                session = warm(name, method, ratio, saved, device, device_bytes=device_bytes)
                grads, peak, _, stats, batch = one_step(name, method, ratio, saved, device,
                                                        session=session)
                times = []
                for _ in range(repeat):
                    _, _, sec, _, _ = one_step(name, method, ratio, saved, device,
                                               metered=False, session=session)
                    times.append(sec)
                fits = "-"
                for scale in (4, 2, 1):
                    scaled = None
                    try:
                        scaled = warm(name, method, ratio, saved, device, scale=scale,
                                      device_bytes=held + cap)
                        _, p, _, _, b = one_step(name, method, ratio, saved, device, scale=scale,
                                                 session=scaled)
                    except remat.torch.BudgetTooSmall:
                        continue
                    finally:
                        if scaled is not None:
                            scaled.close()
                    if p <= cap:
                        fits = str(b)
                        break
                equal = grads.keys() == ref.keys() and all(torch.equal(grads[k], ref[k])
                                                           for k in ref)
                ms = statistics.median(times) * 1e3
                kib = (device_bytes if _ALLOCATOR is not None else int(saved * ratio)) >> 10 \
                    if ratio else 0
                budget = f"{ratio:.1f} ({kib} KiB)" if ratio else "-"
                s = stats or {}
                spread = f"{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}"
                out.write(f"| {name} | {method} | {budget} | {peak / (1 << 20):.2f} | {ms:.1f} | "
                          f"{spread} | {batch / (ms / 1e3):.0f} | {fits} | {s.get('plan', '-')} | "
                          f"{s.get('drops', '-')} | {s.get('recomputes', '-')} | "
                          f"{s.get('offloads', '-')} | {'yes' if equal else 'NO'} |\n")
            except remat.torch.BudgetTooSmall as e:
                out.write(f"| {name} | {method} | {ratio} | too small: {str(e)[:60]} |"
                          + " |" * 9 + "\n")
            except Exception as e:  # noqa: BLE001: a compile that fails is a row, not the end
                if not method.startswith("compile"):
                    raise
                out.write(f"| {name} | {method} | {ratio} | failed: {type(e).__name__}: "
                          f"{str(e)[:80]} |" + " |" * 9 + "\n")
            finally:
                if session is not None:
                    session.close()
                _COMPILED.clear()
            out.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", default="gpt,resnet,lstm")
    parser.add_argument("--ratios", default="0.3,0.5,0.7,0.9")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads, pinned for every row (default 1: "
                             "timings that other work on the machine disturbs least)")
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile, plain and with activation_memory_budget at "
                             "each ratio (slow: one compile per row)")
    parser.add_argument("--size", choices=["small", "large"], default="small",
                        help="the models' size: small (the CPU's, default) or large (a GPU's)")
    parser.add_argument("--remat-allocator", action="store_true",
                        help="(CUDA) remat's allocator as PyTorch's: budgets count what the GPU "
                             "holds, and its pressure drives the evictions")
    parser.add_argument("--methods", help="only these rows, comma-separated: " + ",".join(METHODS))
    parser.add_argument("--markdown", help="also write the table here (must not exist)")
    args = parser.parse_args(argv)
    only = None
    if args.methods is not None:
        only = [m for m in args.methods.split(",") if m]
        unknown = [m for m in only if m not in METHODS]
        if unknown or not only:
            parser.error(f"--methods: unknown {', '.join(unknown) or '(none given)'}; known: "
                         f"{', '.join(METHODS)}")
        if not args.compile and any(m.startswith("compile") for m in only):
            parser.error("--methods: the compile rows need --compile")
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in MODELS:
            parser.error(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    try:
        ratios = [float(r) for r in args.ratios.split(",") if r]
    except ValueError:
        parser.error(f"--ratios: numbers between 0 and 1, not {args.ratios!r}")
    if not ratios or any(not 0 < r <= 1 for r in ratios):
        parser.error("--ratios: numbers in (0, 1]")
    if args.threads < 1:
        parser.error(f"--threads: at least 1, not {args.threads}")
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here")
    if args.size == "large":
        for name, kw in LARGE.items():
            MODELS[name] = (MODELS[name][0], dict(kw), MODELS[name][2])
    if args.remat_allocator:
        if args.device != "cuda":
            parser.error("--remat-allocator: with --device cuda (it is PyTorch's CUDA allocator)")
        global _ALLOCATOR
        _ALLOCATOR = remat.torch.use_allocator()
    if args.markdown and os.path.exists(args.markdown):
        parser.error(f"--markdown {args.markdown} exists; nothing is overwritten")

    class Tee:
        def __init__(self, *files):
            self.files = files

        def write(self, s):
            for f in self.files:
                f.write(s)

        def flush(self):
            for f in self.files:
                f.flush()
    files = [sys.stdout]
    md = open(args.markdown, "x") if args.markdown else None
    if md:
        files.append(md)
    torch.set_num_threads(args.threads)
    Tee(*files).write(
        f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} thread(s) "
        f"(torch.set_num_threads; --threads), step ms: median of {args.repeat} timed steps, "
        "with their min-max\n\n")
    try:
        rows(names, ratios, args.repeat, args.device, Tee(*files), compile_too=args.compile,
             only=only)
    finally:
        if md:
            md.close()


if __name__ == "__main__":
    main()
