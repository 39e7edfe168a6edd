"""The runtime's step planner through the Python wrapper (remat._planner)."""
import pytest

from remat._planner import StepPlanner

PLANS = [("mixed", "dtr", True, True, False), ("drop-first", "dtr", True, True, True)]


def _run(p, outcome, seconds=0.0, message=""):
    step = p.begin()
    p.end(outcome, seconds, message)
    return step


def test_a_trial_learns_then_times_each_plan_and_keeps_the_quickest():
    p = StepPlanner(PLANS, learning_steps=1, timed_steps=2)
    seconds = [9.0, 0.3, 0.2, 9.0, 0.25, 0.15]
    steps = [_run(p, p.FIT, s) for s in seconds]
    assert [(s.plan, s.timed, s.in_trial) for s in steps] == [
        (0, False, True), (0, True, True), (0, True, True),
        (1, False, True), (1, True, True), (1, True, True)]
    state = p.state()
    assert not state.in_trial and state.trial_done and state.kept_plan == 1
    assert p.plan(0)["times"] == [0.3, 0.2] and not p.plan(0)["live"]
    assert p.plan(1)["live"] and p.plan(1)["runtime_steps"] == 3
    assert _run(p, p.FIT).plan == 1


def test_a_plan_reads_back_every_timed_step_beyond_the_kept_buffer():
    p = StepPlanner(PLANS, learning_steps=1, timed_steps=20)
    seconds = [9.0] + [round(0.01 * (i + 1), 2) for i in range(20)]
    for s in seconds:
        _run(p, p.FIT, s)
    assert p.plan(0)["times"] == seconds[1:]  # (more than the 16 a first read takes)
    assert p.plan(0)["refusal"] is None


def test_a_plan_that_did_not_fit_leaves_the_trial_with_its_message():
    p = StepPlanner(PLANS)
    _run(p, p.TOO_SMALL, message="mixed did not fit")
    assert p.plan(0)["refused"] and p.plan(0)["refusal"] == "mixed did not fit"
    assert p.plan(1)["refusal"] is None
    assert [_run(p, p.FIT, 1.0).plan for _ in range(3)] == [1, 1, 1]
    assert p.state().kept_plan == 1


def test_a_step_that_did_not_fit_runs_again_in_one_place_where_asked():
    p = StepPlanner(PLANS, learning_steps=0, timed_steps=1, in_one_place_after_failure=True)
    first = _run(p, p.TOO_SMALL)
    again = _run(p, p.TOO_SMALL, message="no room")
    assert (first.plan, first.in_one_place) == (0, False)
    assert (again.plan, again.in_one_place) == (0, True)
    assert p.plan(0)["refusal"] == "no room"
    slow = StepPlanner(PLANS, learning_steps=0, timed_steps=1, in_one_place_after_failure=True)
    _run(slow, slow.FIT, 1.0)
    assert not _run(slow, slow.TOO_SLOW, message="beaten").in_one_place
    assert _run(slow, slow.TOO_SLOW, message="beaten").in_one_place
    assert slow.plan(1)["refused"] and slow.state().kept_plan == 0


def test_a_step_that_did_not_fit_in_one_place_halves_the_split_limit_where_asked():
    p = StepPlanner(PLANS, learning_steps=0, timed_steps=1, in_one_place_after_failure=True,
                    split_limit_halvings_after_failure=2)
    steps = [_run(p, p.TOO_SMALL, message="no room") for _ in range(4)]
    assert [(s.plan, s.in_one_place, s.split_limit_halvings) for s in steps] == [
        (0, False, 0), (0, True, 0), (0, True, 1), (0, True, 2)]
    assert p.plan(0)["refused"] and not p.plan(1)["refused"]
    assert _run(p, p.FIT, 1.0) == (1, True, True, False, False, 0)
    with pytest.raises(ValueError, match="at most 5"):
        StepPlanner(PLANS, split_limit_halvings_after_failure=6)


def test_bad_plans_and_misuse_are_refused():
    with pytest.raises(ValueError, match="no-such-policy"):
        StepPlanner([("a", "no-such-policy", True, False, False)])
    with pytest.raises(ValueError, match="neither drops nor offloads"):
        StepPlanner([("a", "dtr", False, False, False)])
    with pytest.raises(ValueError, match="at least one plan"):
        StepPlanner([])
    p = StepPlanner(PLANS)
    p.begin()
    with pytest.raises(RuntimeError, match="a step is open"):
        p.begin()
    p.end(p.ABANDONED)
    with pytest.raises(RuntimeError, match="no step is open"):
        p.end(p.FIT)


def test_what_steps_learn_by_kind_reaches_the_next_steps():
    p = StepPlanner([PLANS[0]])
    for i in range(3):
        p.begin()
        assert p.kind_seen(11, 100) == (i == 2, False, 0 if i == 0 else 40)
        p.saw_replay(11, 100, True)
        p.saw_pinned(11, 100, 40)
        p.end(p.FIT)
    p.begin()
    p.saw_replay(11, 80, False)
    p.end(p.FIT)
    p.begin()
    assert p.kind_seen(11, 100) == (False, True, 40)
    assert p.kind_seen(11, 79)[:2] == (False, False)
    p.end(p.FIT)
    with pytest.raises(RuntimeError, match="no step is open"):
        p.kind_seen(11, 100)
