"""remat.torch.budget: a PyTorch step whose saved activations are kept,
dropped (to be recomputed) or offloaded, under a budget of bytes.

This module is the context manager and its steps: which plan each runs
(the runtime's step planner, through remat._planner), what a step's end
learns and says. A step itself is _engine.Engine's; how it works is told
there and in docs/torch_budget.md.
"""
import contextlib
import threading
import time
import types

import torch

from remat import _capi
from remat._planner import StepPlanner
from remat.torch import _allocator, _interrupts, _link, _native
from remat.torch._cost import CostModel
from remat.torch._common import (
    BudgetTooSmall, _active, _budget_bytes, _pause_gc, _resume_gc, _translated, _user_stats)
from remat.torch._recorder import _Backward, _Mode
from remat.torch._session import _Session
from remat.torch._engine import Engine


class budget:
    """Runs what is inside the `with` under a budget of resident saved
    activations. See docs/torch_budget.md for the whole story. Enter it
    once per step: it keeps its runtime between steps, which learns each
    step's next uses for the next; close() (or the object's end) lets it go.

        with remat.torch.budget("2GiB", policy="dtr-eq") as run:
            loss = model(batch).sum()
            loss.backward()
        print(run.stats)

    budget: bytes (int) or a size string ("2GiB", "512MiB").
    policy: a remat eviction-policy spec ("dtr", "dtr-eq", "lru", "largest",
        "dtr:staleness_exp=2", ...), or a list of them to try: the first
        steps are then a trial of each (as the offload guard's below, for
        each policy in turn), and the budget keeps the policy, and plan,
        whose quickest timed step was quickest (`stats["policy"]`). A
        policy's best plan depends on the model, the budget and the link
        (`remat sweep` shows it offline); the trial finds it online, at
        TRIAL_STEPS steps per plan tried.
    offload / recompute: allow offloading to host memory / dropping for
        recompute (at least one).
    offload_guard: with both allowed, allowing offload must not make the
        steps slower than drops alone. The budget's first steps are a trial:
        TRIAL_STEPS steps with the policy's mixed plans (drops and
        offloads), then as many dropping first (offloading only what cannot
        be dropped; the first of each learns, the others are timed), and it
        keeps the plan whose quickest timed step was quicker
        (`stats["plan"]`: "trial", then "mixed" or "drop-first"; with
        several policies, the policy's spec and the plan, as "dtr-eq
        drop-first"). A plan whose trial step raised BudgetTooSmall leaves
        the trial (`stats["debug"]["plans_refused"]`). False: mixed plans throughout.
        With both allowed, a drop of a tensor whose kind and size no replay
        has yet been seen to fit is copied to host memory first; where its
        replay then cannot fit, it comes back from that copy
        (`stats["debug"]["backups_used"]`) and its kind is offloaded from then on.
    copy_ahead: with offload allowed, once the budget has bound the runtime
        copies the next tensor its policy would offload to host memory
        while it is still resident (on CUDA on a side stream), so that its
        eviction later frees it at once (`stats["debug"]["copies_ahead"]`,
        `stats["debug"]["ahead_offloads"]`). Off by default: its effect on a GPU
        step is not measured yet (the simulator's is: docs/torch_budget.md).
    allow_nondeterministic: on CUDA, let kernels PyTorch marks as not
        bitwise deterministic be recomputed too.
    pressure: what the budget counts, and so what drives the evictions.
        "saved": the resident saved activations (the runtime's own budget,
        with any allocator). "allocator": everything remat's allocator holds
        on the GPU for the process (parameters, gradients, optimizer state,
        temporaries and saved activations): libremat_torch.so must be
        PyTorch's CUDA allocator (remat.torch.use_allocator()); it is capped
        at the budget while the `with` is open, and when a request does not
        fit, its pressure makes the runtime evict, by its policy, what the
        request lacks. "auto" (default): "allocator" where use_allocator()
        was called, else "saved". stats then add device_peak_bytes (what the
        allocator reserved at most over the step; under "debug",
        allocator_pressure_events).
    tflops, hbm_gbps: the device rates recompute costs are estimated at.
    link_gbps, link_latency_us: with offload allowed, the host link's rate
        each way and its latency per copy, at which offloads are priced
        against recomputes. None: where the process uses CUDA, measured once
        per device and process (pinned copies to and from it); else the
        runtime's defaults (25 GB/s, 2 us), so that CPU runs decide alike
        everywhere.
        Shown in stats["debug"]["link_gbps"] and ["link_latency_ns"].
    pause_gc: Python's automatic garbage collection waits while the context
        is open (on any thread; as it was once no budget is open). The
        recording makes a few objects per ATen call that live for the step:
        collections in the middle of a step find them all alive, and move
        them to the generation whose full collections cost a tenth of a
        second or more in a process with torch loaded (a fifth of the
        budget's own time per step, bench/torch_overhead.py). The step's
        records go by reference counting when it ends; a cycle the step's
        own code makes waits for the first collection after it. A context
        never left (a generator suspended inside it and dropped) leaves the
        collector paused: leave every budget you enter, or pass False.
    native: where the calls are recorded and the tensors saved. None (the
        default): in C++ (remat.torch._native, a torch extension built
        against the installed torch on first use) wherever the options allow
        it (the saved-bytes budget; with offload, where no GPU is present),
        several times less per call; else, or where the extension cannot be
        built (a warning says why), or with REMAT_TORCH_NATIVE=0, the Python
        recorder. True: native, refusing pressure='allocator'; False: the
        Python recorder.
    """

    # Steps of each plan in the offload guard's trial: one that learns the
    # step's next uses, then timed ones.
    TRIAL_STEPS = 3

    def __init__(self, budget, policy="dtr", offload=False, recompute=True,
                 allow_nondeterministic=False, tflops=None, hbm_gbps=None,
                 offload_guard=True, copy_ahead=False, pause_gc=True, pressure="auto",
                 native=None, link_gbps=None, link_latency_us=None):
        self.budget_bytes = _budget_bytes(budget)
        _link.check(link_gbps, link_latency_us)
        self._link_given = (link_gbps, link_latency_us)
        self._link_rates = None  # what the last runtime made was given
        # True, False, or None: native where it may be (per step: not while
        # remat's allocator is the budget's).
        self._native = _native.choice(native, offload, copy_ahead, pressure)
        if pressure not in ("auto", "saved", "allocator"):
            raise ValueError(f"pressure must be 'auto', 'saved' or 'allocator', not {pressure!r}")
        self._pressure = pressure
        policies = [policy] if isinstance(policy, str) else list(policy) \
            if isinstance(policy, (list, tuple)) else None
        if not policies or not all(isinstance(p, str) and p for p in policies) or \
                len(set(policies)) != len(policies):
            raise ValueError(f"policy must be a policy spec such as 'dtr', or a list of "
                             f"different ones to try, not {policy!r}")
        if any(p.split(":", 1)[0].strip() == "auto" for p in policies):
            raise ValueError("policy 'auto' tries every policy over whole replays of the step "
                             "(remat sim); here, pass the policies to try as a list, such as "
                             "['dtr', 'msps', 'dtr-local', 'lru']")
        if not offload and not recompute:
            raise ValueError("with neither offload nor recompute allowed, nothing could leave "
                             "the budget: allow at least one")
        kw = {}
        if tflops is not None:
            kw["tflops"] = tflops
        if hbm_gbps is not None:
            kw["hbm_gbps"] = hbm_gbps
        self._recompute = bool(recompute)
        self._copy_ahead = bool(copy_ahead)
        self._pause_gc = bool(pause_gc)
        self._gc_paused = False
        self._allow_nondeterministic = bool(allow_nondeterministic)
        self._cost_model = CostModel(**kw)
        # A plan's kind: (name, offload allowed, drops first).
        if offload and recompute:
            kinds = [("mixed", True, False), ("drop-first", True, True)] if offload_guard \
                else [("mixed", True, False)]
        else:
            kinds = [("drop-only", False, False)] if recompute else \
                [("offload-only", True, False)]
        # The plans: name -> (policy spec, offload allowed, drops first), in
        # the order tried (a tie keeps the earlier: the first policy's own
        # choice).
        self._plans = {}
        for p in policies:
            for kind, with_offload, drop_first in kinds:
                name = kind if len(policies) == 1 else f"{p} {kind}"
                self._plans[name] = (p, with_offload, drop_first)
        self._plan_names = list(self._plans)
        # A spec the runtime refuses is an error now, not steps later when
        # its turn in the trial comes.
        for p in policies:
            _Session(self.budget_bytes, p, offload, recompute).close()
        self._planner = None
        self._clock = time.perf_counter
        self._sessions = {}           # plan -> _Session
        self._start_over()
        self._engine = None
        self._mode = None
        self._backward = None
        self._hooks = None
        self._keep_saved_block = None  # [remat's hooks] while a keep_saved() block is open
        self.stats = None
        # Held by the thread whose step is open (one at a time), and who that is.
        self._open = threading.Lock()
        self._owner = None
        self._interrupt_token = False
        self._interrupts_at_start = 0

    def _start_over(self):
        """As new: no step run, no runtime, the trial (if any) to come."""
        if self._planner is not None:
            self._planner.close()
        # Which plan each step runs, and which the trial keeps: the runtime's
        # step planner (TRIAL_STEPS per plan: one learning, then timed ones).
        self._planner = StepPlanner(
            [(name, policy, self._recompute, offload, drop_first)
             for name, (policy, offload, drop_first) in self._plans.items()],
            learning_steps=1, timed_steps=self.TRIAL_STEPS - 1)
        self._step_plan = None
        self._step_index = None
        self._step_timed = False
        self._step_in_trial = False
        self._step_start = None
        self._steps = 0
        self._plans_seen = None  # (planner.plan of each plan, the trial done) at a step's end

    def _plan_shown(self):
        """What stats["plan"] says of the step running or just run."""
        return "trial" if self._step_in_trial else self._step_plan

    @_interrupts.critical
    def __enter__(self):
        # First remat's SIGINT handler: an interrupt from here to the end of
        # the entry waits for it, then the step is undone and it is raised.
        token = _interrupts.install()
        try:
            self._claim()
            try:
                if _active.get(threading.get_ident()) is not None:
                    raise RuntimeError("remat.torch.budget contexts do not nest: one budget "
                                       "covers the whole step")
                if self._pause_gc:
                    _pause_gc()
                    self._gc_paused = True
                try:
                    self._enter()
                except BaseException:
                    self._resume_gc()
                    raise
            except BaseException:
                self._release()
                raise
        except BaseException:
            _interrupts.uninstall(token)
            raise
        self._interrupt_token = token
        self._interrupts_at_start = _interrupts.delivered()
        if _interrupts.pending():
            # Interrupted while entering: the step never begins (nor counts
            # as one that ran through: the plan trial does not time it).
            self.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)
            _interrupts.deliver()
        return self

    def _claim(self):
        """This thread's hold on the object for one step: refused (and the
        object left as it is) while it is open, on this thread or another."""
        if not self._open.acquire(blocking=False):
            if self._owner == threading.get_ident():
                raise RuntimeError("this remat.torch.budget is already open: leave it before "
                                   "entering it for the next step")
            raise RuntimeError("this remat.torch.budget is open on another thread: give each "
                               "thread a remat.torch.budget of its own")
        self._owner = threading.get_ident()

    def _release(self):
        self._owner = None
        self._open.release()

    def _resume_gc(self):
        if self._gc_paused:
            self._gc_paused = False
            _resume_gc()

    def _link(self, offload, allocator):
        """(GB/s, ns) of the link offloads are priced at (_link.rates), or
        None without offload; kept for the step's statistics."""
        if not offload:
            return None
        self._link_rates = _link.rates(*self._link_given, allocator is not None)
        return self._link_rates

    def _native_now(self, allocator):
        """Whether this step records natively (see `native`)."""
        if self._native is False:
            return False
        if allocator is not None:
            if self._native:
                raise RuntimeError(
                    "native=True counts saved bytes, and remat's allocator is PyTorch's here "
                    "(pressure='auto' then counts what the GPU holds): pass pressure='saved', "
                    "or native=False")
            return False
        return True if self._native else _native.available()

    def _allocator(self):
        """remat's allocator whose pressure drives this step, or None."""
        allocator = _allocator.current()
        if self._pressure == "allocator":
            if allocator is None:
                raise RuntimeError("pressure='allocator' needs remat's allocator as PyTorch's: "
                                   "call remat.torch.use_allocator() before the first CUDA "
                                   "allocation")
            return allocator
        if self._pressure == "auto" and allocator is not None and allocator.installed:
            return allocator
        return None

    def _enter(self):
        step = self._planner.begin()
        try:
            self._enter_step(step)
        except BaseException:
            self._planner.end(StepPlanner.ABANDONED)
            raise
        return self

    def _enter_step(self, step):
        plan = self._plan_names[step.plan]
        timed = step.timed
        policy, offload, drop_first = self._plans[plan]
        allocator = self._allocator()
        session = self._sessions.get(plan)
        if session is not None and (session.live_budget != (allocator is None) or
                                    step.fresh_runtime):
            # use_allocator() came since, or what the runtime learns from one
            # step led the next into a budget it did not fit (the planner's
            # blind plans): start afresh (each such step as blind as the
            # last: what its replays did still holds for the next).
            if session.live_budget != (allocator is None):
                self._planner.restarted(step.plan)  # (what it learned was of the other kind)
            self._sessions.pop(plan).close()
            session = None
        native = self._native_now(allocator)
        if session is not None and isinstance(session, _native.NativeSession) != native:
            self._sessions.pop(plan).close()  # (remat's allocator came or went since)
            self._planner.restarted(step.plan)
            session = None
        self._plans_seen = None if session is None else self._plans_seen  # (books move)
        if session is None and native:
            session = self._sessions[plan] = _native.NativeSession(
                self.budget_bytes, policy, self._recompute, offload, self._link(offload, None))
        if session is None:
            session = self._sessions[plan] = _Session(self.budget_bytes, policy, offload,
                                                      self._recompute, self._copy_ahead,
                                                      live_budget=allocator is None,
                                                      link=self._link(offload, allocator))
        device = 0
        if allocator is not None and torch.cuda.is_available():
            device = torch.cuda.current_device()
        self._step_index = step.plan
        self._step_timed = step.timed
        self._step_in_trial = step.in_trial
        if native:
            _native.enter(self, plan, policy, session, offload, drop_first, self._planner)
            return
        engine = Engine(self.budget_bytes, policy, offload, self._recompute,
                        self._allow_nondeterministic, self._cost_model, self._copy_ahead,
                        allocator=allocator, device=device, drop_first=drop_first,
                        planner=self._planner)
        engine.open(session)
        self._engine = engine
        self._step_plan = plan
        _active[threading.get_ident()] = self
        self._mode = _Mode(engine)
        self._backward = _Backward(engine, self._mode)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(engine.pack, engine.unpack)
        self._step_start = self._time() if timed else None
        self._mode.__enter__()
        try:
            self._backward.__enter__()
            try:
                self._hooks.__enter__()
            except BaseException:
                self._backward.__exit__(None, None, None)
                raise
        except BaseException:
            self._mode.__exit__(None, None, None)
            _active.pop(threading.get_ident(), None)
            engine.close()  # the allocator gets its budget back
            raise

    @_interrupts.critical
    def __exit__(self, exc_type, exc, tb):
        # (An interrupt that lands in here waits for its end: remat's handler.)
        engine = self._engine
        # A step an interrupt went through may have stopped anywhere in
        # remat's bookkeeping: its runtime is let go with it (the next step
        # starts a fresh one, as the first did).
        interrupted = (self._interrupt_token and
                       _interrupts.delivered() != self._interrupts_at_start) or \
            (exc is not None and not isinstance(exc, Exception))
        late = None  # what the step's end raises (remat's allocator: a request that failed)
        try:
            block, self._keep_saved_block = self._keep_saved_block, None
            if block is not None:
                # Left inside a keep_saved() block (a generator dropped there):
                # remat's hooks go back on the stack, for the exit below to take off.
                torch._C._autograd._push_saved_tensors_default_hooks(*block[0])
            _native.put_back_hooks()  # (those a backward an interrupt cut short left aside)
            try:
                try:
                    self._hooks.__exit__(exc_type, exc, tb)
                finally:
                    self._backward.__exit__(exc_type, exc, tb)
            finally:
                try:
                    self._mode.__exit__(exc_type, exc, tb)
                finally:
                    _active.pop(threading.get_ident(), None)
                    try:
                        self._close_engine(interrupted)
                    finally:
                        try:
                            if engine.allocator is not None and \
                                    not isinstance(exc, BudgetTooSmall):
                                late = engine.exit_error()
                            # A step that raises here has failed: the plan trial
                            # must not time it (nor keep a plan it did not fit).
                            self._end_step(exc_type is None and late is None,
                                           exc if exc is not None else late)
                            if interrupted:
                                session = self._sessions.pop(self._step_plan, None)
                                if session is not None:
                                    session.close()
                                    self._planner.restarted(self._step_index)
                                    self._plans_seen = None
                        finally:
                            self._resume_gc()
            if late is None:
                late = _translated(exc, engine)
        finally:
            self._release()
            _interrupts.uninstall(self._interrupt_token)  # last: raises one held
        if late is not None:
            raise late from exc
        return False

    def _close_engine(self, interrupted):
        """Ends the step's engine. An interrupted step's records may be half
        made: what its end says of them is not raised (its runtime goes)."""
        engine = self._engine
        try:
            engine.close()
        except BaseException:  # noqa: BLE001: raised unless interrupted
            if not interrupted:
                raise
        if not hasattr(engine, "stats"):
            engine.stats = engine.read_stats()

    def _time(self):
        # A GPU's work runs behind the host's: a timed step waits for it.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return self._clock()

    def _end_step(self, ok, exc=None):
        """Tells the planner how the step went, and keeps what it learned."""
        self._steps += 1
        stats = dict(self._engine.stats)
        stats["step"] = self._steps
        stats["plan"] = self._plan_shown()
        stats["policy"] = self._plans[self._step_plan][0]
        index = self._step_index
        too_small = isinstance(exc, BudgetTooSmall)
        if ok:
            outcome = StepPlanner.FIT
        else:
            outcome = StepPlanner.TOO_SMALL if too_small else StepPlanner.ABANDONED
        ended = False
        try:
            seconds = self._time() - self._step_start if ok and self._step_timed else 0.0
            if too_small:
                self._engine.report_unfit()
            # (What the step saw by tensor kind joins the planner's books here.)
            self._planner.end(outcome, seconds, str(exc) if too_small else "")
            ended = True
        finally:
            if not ended:  # (whatever failed above, the next step can begin)
                self._planner.end(StepPlanner.ABANDONED)
        # The runtimes of plans the planner will not run again (refused, or not kept by the
        # trial) go. (Its plans change only in the trial and after a step that did not fit.)
        plans, trial_done = self._plans_seen or (None, False)
        if plans is None or not ok or self._step_in_trial or (len(plans) > 1 and not trial_done):
            plans = [self._planner.plan(i) for i in range(len(self._plan_names))]
            trial_done = self._planner.state().trial_done
            self._plans_seen = (plans, trial_done)
        for i, name in enumerate(self._plan_names):
            if not plans[i]["live"] and name in self._sessions:
                self._sessions.pop(name).close()
        refused = {name: plans[i]["refusal"] for i, name in enumerate(self._plan_names)
                   if plans[i]["refused"]}
        if refused:
            stats["plans_refused"] = refused
        if plans[index]["blind"]:
            stats["next_uses_off"] = True
        if self._link_rates is not None:
            stats["link_gbps"], stats["link_latency_ns"] = self._link_rates
        if trial_done:
            stats["plan_trial_seconds"] = {name: plans[i]["times"]
                                           for i, name in enumerate(self._plan_names)
                                           if not plans[i]["refused"]}
        self.stats = _user_stats(stats)

    @_interrupts.critical
    @contextlib.contextmanager
    def keep_saved(self):
        """Inside the budget's `with`: what autograd saves for backward in
        this block is kept as autograd keeps it without remat (resident, not
        counted against the budget, never dropped or offloaded). The ATen
        calls are still recorded, so the tensors the block makes can still
        be dropped where something after it saves them. For what refuses
        saved-tensor hooks: torch.func's grad, vjp, jacrev and hessian.

            with remat.torch.budget("2GiB") as run:
                h = encoder(x)
                with run.keep_saved():
                    g = torch.func.grad(inner_loss)(h)
                loss = head(h, g).sum()
                loss.backward()
        """
        engine = self._engine
        if engine is None or engine.closed or _active.get(threading.get_ident()) is not self:
            raise RuntimeError("keep_saved() is for inside this budget's `with`, on the thread "
                               "that entered it")
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if _native.hooks_aside():  # (a backward that builds no graph: they are off already)
            top = None
        elif top is None or top[0] != engine.pack:
            raise RuntimeError("keep_saved(): other saved-tensor hooks (checkpoint, "
                               "save_on_cpu, your own) are innermost here; enter keep_saved() "
                               "outside them")
        block = None
        if top is not None:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            block = self._keep_saved_block = [top]
        engine.counts["keep_saved_blocks"] += 1
        try:
            yield self
        finally:
            if block is not None and self._keep_saved_block is block:
                # (Left with the budget still open: else __exit__ has put them back.)
                self._keep_saved_block = None
                torch._C._autograd._push_saved_tensors_default_hooks(*top)

    def live_stats(self):
        """The runtime's figures now: inside the context, the step's so far
        (its number the step running); outside, the last step's (`stats`),
        or before any step zeros and step 0."""
        engine = self._engine
        if engine is None or engine.closed:
            if self.stats is not None:
                return _user_stats(self.stats)
            return self._no_step_stats()
        stats = engine.read_stats()
        stats["step"] = self._steps + 1
        stats["plan"] = self._plan_shown()
        stats["policy"] = self._plans[self._step_plan][0]
        return _user_stats(stats)

    def _no_step_stats(self):
        """live_stats() before any step: every figure 0, step 0 (of the plan
        the first step runs)."""
        plan = self._plan_names[0]
        policy, offload, drop_first = self._plans[plan]
        engine = Engine(self.budget_bytes, policy, offload, self._recompute,
                        self._allow_nondeterministic, self._cost_model, drop_first=drop_first)
        zero = _capi.RuntimeStats()
        engine.start = zero
        engine.session = types.SimpleNamespace(raw_stats=lambda: zero)
        engine.closed = True
        stats = engine.read_stats()
        stats["step"] = 0
        stats["plan"] = "trial" if len(self._plans) > 1 else plan
        stats["policy"] = policy
        return _user_stats(stats)

    @_interrupts.critical
    def close(self):
        """Lets the runtime go (it is kept between steps to learn from them;
        the object's end lets it go too)."""
        token = _interrupts.install()
        try:
            self._claim_to_close()
            try:
                sessions, self._sessions = self._sessions, {}
                for session in sessions.values():
                    session.close()
                self._start_over()
            finally:
                self._release()
        finally:
            _interrupts.uninstall(token)

    def _claim_to_close(self):
        if not self._open.acquire(blocking=False):
            if self._owner == threading.get_ident():
                raise RuntimeError("close the budget after leaving its `with`")
            raise RuntimeError("this remat.torch.budget is open on another thread: close it "
                               "after that thread leaves its `with`")
        self._owner = threading.get_ident()

    @_interrupts.critical
    def __del__(self):
        sessions = getattr(self, "_sessions", None)
        engine = getattr(self, "_engine", None)
        if sessions and (engine is None or engine.closed):
            for session in sessions.values():
                session.close()
