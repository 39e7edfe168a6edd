"""The runtime's step planner (runtime/step_planner.h) through the C ABI.

Which plan each step of a budget runs, which steps are timed, and which plan
is kept once the trial has timed them all: the decisions are the runtime's
(remat_planner_*), shared with the simulator and any C or C++ framework;
this wrapper only carries them across.
"""
import collections
import ctypes

from remat import _capi

Step = collections.namedtuple(
    "Step", "plan timed in_trial fresh_runtime in_one_place split_limit_halvings")


class StepPlanner:
    """plans: (name, policy spec, allow_drop, allow_offload, drop_first)
    tuples, in the order tried (a tie keeps the earlier). A bad plan is a
    ValueError with the runtime's message."""

    FIT = _capi.STEP_FIT
    TOO_SMALL = _capi.STEP_TOO_SMALL
    ABANDONED = _capi.STEP_ABANDONED
    TOO_SLOW = _capi.STEP_TOO_SLOW

    def __init__(self, plans, learning_steps=1, timed_steps=2, in_one_place_after_failure=False,
                 split_limit_halvings_after_failure=0):
        self._p = None
        self._lib = _capi.lib()
        self._seen = _capi.KindSeen()
        self._times = (ctypes.c_int64 * 16)()
        self._admission = _capi.DropAdmission()
        self.names = [p[0] for p in plans]
        raw = (_capi.Plan * max(1, len(plans)))()
        for c, (name, policy, drop, offload, drop_first) in zip(raw, plans):
            c.name = name.encode()
            c.policy_spec = policy.encode()
            c.allow_drop, c.allow_offload, c.drop_first = int(drop), int(offload), \
                int(drop_first)
        options = _capi.PlannerOptions(learning_steps, timed_steps,
                                       int(in_one_place_after_failure),
                                       split_limit_halvings_after_failure)
        out = ctypes.c_void_p()
        status = self._lib.remat_planner_create(raw, len(plans), ctypes.byref(options),
                                                ctypes.byref(out))
        if status == _capi.INVALID_ARGUMENT:
            raise ValueError(self._lib.remat_last_error().decode("utf-8", "replace"))
        _capi.check(status, "remat_planner_create")
        self._p = out

    def handle(self):
        """The planner as the C ABI has it (a remat_planner*, as an int),
        for native code in this process that drives it."""
        return self._p.value

    def begin(self):
        """The step about to run (Step)."""
        s = _capi.PlannerStep()
        _capi.check(self._lib.remat_planner_step_begin(self._p, ctypes.byref(s)),
                    "remat_planner_step_begin")
        return Step(s.plan, bool(s.timed), bool(s.in_trial), bool(s.fresh_runtime),
                    bool(s.in_one_place), s.split_limit_halvings)

    def end(self, outcome, seconds=0.0, message=""):
        """Ends the step begin() opened: FIT, TOO_SMALL (message: the
        refusal, should the plan leave the trial), TOO_SLOW or ABANDONED."""
        ns = max(0, int(round(seconds * 1e9)))
        _capi.check(self._lib.remat_planner_step_end(self._p, outcome, ns,
                                                     message.encode("utf-8", "replace")),
                    "remat_planner_step_end")

    def restarted(self, plan):
        """The plan's runtime was started afresh: it has learned nothing."""
        _capi.check(self._lib.remat_planner_runtime_restarted(self._p, plan),
                    "remat_planner_runtime_restarted")

    # What steps learn by tensor kind (a 64-bit key the caller makes: the
    # same tensor in every step has the same kind); each needs a step open.

    def saw_replay(self, kind, nbytes, fit):
        """The open step brought a dropped tensor back by replay (fit), or
        its replay could not fit."""
        _capi.check(self._lib.remat_planner_saw_replay(self._p, kind, nbytes, int(fit)),
                    "remat_planner_saw_replay")

    def saw_pinned(self, kind, nbytes, pinned):
        """The open step's backward read a tensor with `pinned` bytes pinned
        beside it."""
        _capi.check(self._lib.remat_planner_saw_pinned(self._p, kind, nbytes, pinned),
                    "remat_planner_saw_pinned")

    def kind_seen(self, kind, nbytes):
        """(seen to fit, seen to fail, bytes pinned beside) for a tensor of
        this kind and size, by the steps before the open one."""
        out = self._seen
        _capi.check(self._lib.remat_planner_kind_seen(self._p, kind, nbytes, ctypes.byref(out)),
                    "remat_planner_kind_seen")
        return bool(out.seen_to_fit), bool(out.seen_to_fail), out.pinned_beside

    def admit_drop(self, kind, nbytes, replay, room):
        """(verdict, copy_first) for a tensor that may be dropped and
        offloaded, under the open step's plan: verdict is _capi.DROP or why
        it is offloaded instead (_capi.OFFLOAD_*); `replay` the runtime's
        estimate (a ctypes array of REPLAY_DEPTH + 1, as
        remat_runtime_estimate_replay fills), `room` what a replay must fit
        in."""
        out = self._admission
        _capi.check(self._lib.remat_planner_admit_drop(self._p, kind, nbytes, replay, len(replay),
                                                       room, ctypes.byref(out)),
                    "remat_planner_admit_drop")
        return out.verdict, bool(out.copy_first)

    def state(self):
        s = _capi.PlannerState()
        _capi.check(self._lib.remat_planner_get_state(self._p, ctypes.byref(s)),
                    "remat_planner_get_state")
        return s

    def plan(self, i):
        """Plan i's state: live, refused, blind, learns_fits,
        runtime_steps, times (seconds) and refusal (str or None)."""
        # (One call where its times fit the buffer kept for them: each step
        # reads every plan.)
        s = _capi.PlanState()
        times = self._times
        refusal = ctypes.c_void_p()
        _capi.check(self._lib.remat_planner_get_plan(self._p, i, ctypes.byref(s), times,
                                                     len(times), ctypes.byref(refusal)),
                    "remat_planner_get_plan")
        n = s.num_times
        if n > len(times):
            times = self._times = (ctypes.c_int64 * n)()
            _capi.check(self._lib.remat_planner_get_plan(self._p, i, ctypes.byref(s), times, n,
                                                         None),
                        "remat_planner_get_plan")
        text = None
        if refusal.value:
            text = ctypes.string_at(refusal).decode("utf-8", "replace")
            self._lib.remat_string_free(refusal)
        return {"live": bool(s.live), "refused": bool(s.refused), "blind": bool(s.blind),
                "learns_fits": bool(s.learns_fits), "runtime_steps": s.runtime_steps,
                "times": [t / 1e9 for t in times[:min(s.num_times, n)]], "refusal": text}

    def close(self):
        if self._p is not None:
            self._lib.remat_planner_destroy(self._p)
            self._p = None

    def __del__(self):
        self.close()
