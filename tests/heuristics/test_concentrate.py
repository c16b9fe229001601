"""Concentrating stalls (heuristics/concentrate.py): hand-derived runs of waits, a sink that joins
a run, and validity / never-worse on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.concentrate import concentrate_stalls, reordered_runs
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.solver import Schedule, check_schedule, simulate

from tests.solver.solver_builders import AG, coll, compute, make_problem, wait, zero
from tests.solver.tiny_instances import tiny_problems


def _two_gathers(between: int = 0):
    """c1 and c2 (30 ns each, one group: c1 0..30, c2 30..60) issued first; x (10 ns) depends on
    neither; ``between`` ns of compute y, independent of both, sits between the two waits; z
    (5 ns) needs both. Both collectives are hideable (x could run during them)."""
    ops = [coll("c1", "A", AG, runtime_ns=30), coll("c2", "A", AG, runtime_ns=30),
           compute("x", 10, heavy=True), wait("w1", "c1"), zero("v1", deps=["w1"])]
    if between:
        ops.append(compute("y", between, deps=["x"], heavy=True))
    ops += [wait("w2", "c2"), compute("z", 5, deps=["v1", "w2"], heavy=True)]
    return make_problem(ops)


def test_a_run_of_waits_stalls_once() -> None:
    """Given order: x ends at 10; w1 stalls 20 (to 30), w2 stalls 30 (to 60); z 60..65. Both
    exposed. Waiting on c2 first stalls 50 (to 60) and c1 has ended by then: one exposed, the
    same 65 ns makespan and 50 ns exposed in all."""
    p = _two_gathers()
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable, r0.n_hideable) == (65, 50, 0, 2)
    out = concentrate_stalls(p, base)
    assert out.order == ("c1", "c2", "x", "w2", "w1", "v1", "z")
    assert reordered_runs(p, base, r0) == out
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (65, 50, 1)


def test_a_stalled_wait_sinks_into_the_next_run() -> None:
    """With y (5 ns) between the waits: w1 stalls 20 (to 30), y 30..35, w2 stalls 25 (to 60), z
    60..65. Sinking w1 (and v1) to z makes x, y, w2, w1: y runs 10..15, w2 stalls 45 and w1 0.
    The makespan stays 65 ns and the exposed time 45 (so the makespan-driven sink pass would
    not move it); one exposed collective instead of two."""
    p = _two_gathers(between=5)
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable, r0.n_hideable) == (65, 45, 0, 2)
    out = concentrate_stalls(p, base)
    assert out.order == ("c1", "c2", "x", "y", "w2", "w1", "v1", "z")
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (65, 45, 1)


def test_a_collective_issued_inside_a_run_goes_first() -> None:
    """c1 (30 ns) issued at 0, x 0..10, w1 stalls 20 (to 30), then c2 (30 ns, independent) issued
    at 30 runs 30..60 and w2 stalls 30: makespan 60, both exposed. Issuing c2 before the waits
    (at 10, it queues behind c1: 30..60) and waiting on it first stalls 50 once; c1 has ended by
    then. Same makespan and exposed time, one exposed collective instead of two."""
    p = make_problem([coll("c1", "A", AG, runtime_ns=30), compute("x", 10, heavy=True), wait("w1", "c1"),
                      coll("c2", "A", AG, runtime_ns=30), wait("w2", "c2")])
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable, r0.n_hideable) == (60, 50, 0, 2)
    out = concentrate_stalls(p, base)
    assert out.order == ("c1", "x", "c2", "w2", "w1")
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (60, 50, 1)


def test_hidden_runs_are_left_alone() -> None:
    """Nothing stalls twice: the schedule comes back unchanged (the same object)."""
    p = _two_gathers()
    order = ("c1", "c2", "x", "w2", "w1", "v1", "z")
    s = Schedule(order)
    assert concentrate_stalls(p, s) is s


@pytest.mark.parametrize("p", tiny_problems(20, seed=31), ids=lambda p: p.name)
def test_valid_never_worse(p) -> None:
    base = overlap_schedule(p)
    r0 = simulate(p, base)
    out = concentrate_stalls(p, base)
    assert check_schedule(p, out) == []
    r = simulate(p, out)
    assert r.makespan_ns <= r0.makespan_ns
    assert r.peak_memory_bytes <= r0.peak_memory_bytes
    assert r.n_hidden_hideable >= r0.n_hidden_hideable
    assert out == base or r.n_hidden_hideable > r0.n_hidden_hideable
