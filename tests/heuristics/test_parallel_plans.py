"""Stream plan searches from several seeds side by side (heuristics/parallel_plans.py)."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest
from fxsched.heuristics import parallel_plans as pp
from fxsched.heuristics.overlap import original_peak, overlap_schedule
from fxsched.heuristics.stream_plan import plan_search
from fxsched.solver import ScheduleProblem, simulate

from tests.solver.tiny_instances import tiny_problems

EVALS = 8  # few plans, so that the seeds' annealings part ways on some tiny problem


def _key(p: ScheduleProblem, sched) -> tuple[bool, int, int]:
    r = simulate(p, sched)
    return r.peak_memory_bytes > original_peak(p), r.makespan_ns, r.peak_memory_bytes


def _parent_seed_loses():
    """A tiny problem and two seeds whose one-seed searches end at different plans, the first
    seed's slower: the pair that makes a child's answer the pick."""
    for p in tiny_problems(40, seed=29):
        base = overlap_schedule(p)
        runs = {s: plan_search(p, base, max_evals=EVALS, seed=s) for s in range(6)}
        worst = max(runs, key=lambda s: _key(p, runs[s]))
        best = min(runs, key=lambda s: _key(p, runs[s]))
        if _key(p, runs[worst]) != _key(p, runs[best]):
            return p, base, (worst, runs[worst]), (best, runs[best])
    raise AssertionError("no tiny problem where two seeds differ: the pick would not be exercised")


def test_a_childs_better_seed_is_the_answer() -> None:
    """Seeds (slower, faster), the faster searched in a child process: the answer is the child's,
    the faster one-seed search run here, and it is the same answer twice."""
    p, base, (slow, slow_out), (fast, fast_out) = _parent_seed_loses()
    out = pp.plan_search_seeds(p, base, [slow, fast], max_evals=EVALS)
    assert out == fast_out and out != slow_out
    assert pp.plan_search_seeds(p, base, [slow, fast], max_evals=EVALS) == out
    # the parent's seed first and faster: its own answer
    assert pp.plan_search_seeds(p, base, [fast, slow], max_evals=EVALS) == fast_out


def test_one_seed_is_the_plain_search() -> None:
    p = tiny_problems(1, seed=29)[0]
    base = overlap_schedule(p)
    assert pp.plan_search_seeds(p, base, [3], max_evals=EVALS) == plan_search(p, base, max_evals=EVALS, seed=3)
    with pytest.raises(ValueError, match="no seeds"):
        pp.plan_search_seeds(p, base, [], max_evals=EVALS)


class _FailingPool:
    """Stands in for the process pool: every child search fails."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def submit(self, *args, **kwargs) -> Future:
        fut: Future = Future()
        fut.set_exception(RuntimeError("child died"))
        return fut

    def shutdown(self, **kwargs) -> None:
        pass


class _NoPool:
    def __init__(self, *args, **kwargs) -> None:
        raise OSError("no processes here")


@pytest.mark.parametrize(("pool", "message"), [(_FailingPool, "seed 5 failed (child died)"),
                                               (_NoPool, "could not start child searches (no processes here)")],
                         ids=["child fails", "pool fails"])
def test_failed_children_leave_the_parents_seed(monkeypatch, caplog, pool, message) -> None:
    """A child that raises, or a pool that cannot start, is logged and left out: the answer is the
    parent's own seed's search."""
    p = tiny_problems(1, seed=29)[0]
    base = overlap_schedule(p)
    monkeypatch.setattr(pp, "ProcessPoolExecutor", pool)
    with caplog.at_level(logging.WARNING, logger=pp.__name__):
        out = pp.plan_search_seeds(p, base, [2, 5, 6], max_evals=EVALS)
    assert out == plan_search(p, base, max_evals=EVALS, seed=2)
    assert message in caplog.text


class _RecordingPool:
    """Stands in for the process pool: records what each submit hands it and runs the call only
    when its result is asked for, after the parent's own search (a late feeder thread)."""

    submitted: list[tuple] = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    def submit(self, fn, *args) -> Future:
        _RecordingPool.submitted.append(args)
        fut: Future = Future()
        fut.result = lambda timeout=None: fn(*args)  # type: ignore[method-assign]
        return fut

    def shutdown(self, **kwargs) -> None:
        pass


def test_children_get_the_problem_pickled_before_the_parents_search(monkeypatch) -> None:
    """What a child gets is bytes and ints, pickled before the parent's search starts: handed over
    as objects, the pool's feeder thread pickled the problem while the parent's search filled its
    cached properties, and the child's seed was lost. The child's answer is still its seed's
    plain search."""
    p, base, (slow, slow_out), (fast, fast_out) = _parent_seed_loses()
    _RecordingPool.submitted = []
    monkeypatch.setattr(pp, "ProcessPoolExecutor", _RecordingPool)
    out = pp.plan_search_seeds(p, base, [slow, fast], max_evals=EVALS)
    assert len(_RecordingPool.submitted) == 1
    assert all(isinstance(a, (bytes, int)) for a in _RecordingPool.submitted[0])
    assert out == fast_out
