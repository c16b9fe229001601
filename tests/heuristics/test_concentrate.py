"""Concentrating stalls (heuristics/concentrate.py): hand-derived runs of waits, a sink that joins
a run, compute pulled into a stall, and validity / never-worse on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.concentrate import concentrate_stalls, jumped, pulled, reordered_runs
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.sink import sunk
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


def test_a_stalled_wait_sinks_just_past_its_stall() -> None:
    """c1 (group A, 30 ns) at 0, x 0..10, w1 stalls 20 (to 30); c3 (group B, 20 ns) needs w1: 30..50;
    y1 and y2 (20 ns each, independent) 30..70; w3 at 70, z (5 ns, needs w3) 70..75.
    Sunk to z, the first compute that needs it, w1 takes c3 along: x, y1, y2 to 50, c3 50..70, w3
    stalls 20 and z ends at 75 again. Sunk just past 20 ns of compute (y1): w1 at 30 without a
    stall, c3 30..50 under y2, z 50..55, which the concentrating pass keeps."""
    p = make_problem([coll("c1", "A", AG, runtime_ns=30), compute("x", 10), wait("w1", "c1"),
                      coll("c3", "B", AG, runtime_ns=20, deps=["w1"]), compute("y1", 20), compute("y2", 20),
                      wait("w3", "c3"), compute("z", 5, deps=["w3"])])
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 75
    full, partial = sunk(p, base, 2), sunk(p, base, 2, cover_ns=20)
    assert full.order == ("c1", "x", "y1", "y2", "w1", "c3", "w3", "z")
    assert partial.order == ("c1", "x", "y1", "w1", "c3", "y2", "w3", "z")
    assert (simulate(p, full).makespan_ns, simulate(p, partial).makespan_ns) == (75, 55)
    assert simulate(p, concentrate_stalls(p, base)).makespan_ns == 55


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


def _pull_case(heavy: bool):
    """c (30 ns) issued at 0; a (20 ns) 0..20; w stalls 10 (to 30); d (10 ns, needs w) 30..40;
    b (15 ns, needs nothing) 40..55: makespan 55, c exposed. Sinking w cannot help (d needs it
    next). Pulling b before w: a 0..20, b 20..35, w finds c ended at 30, d 35..45: makespan 45,
    c hidden."""
    return make_problem([coll("c", "A", AG, runtime_ns=30), compute("a", 20, heavy=heavy), wait("w", "c"),
                         compute("d", 10, deps=["w"], heavy=heavy), compute("b", 15, heavy=heavy)])


def test_compute_is_pulled_into_a_stall() -> None:
    p = _pull_case(heavy=False)
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable, r0.n_hideable) == (55, 10, 0, 1)
    # d needs the wait; b is the first that does not, and it covers the 10 ns stall
    assert pulled(p, base, 2, 10).order == ("c", "a", "b", "w", "d")
    assert pulled(p, base, 2, 16) is None  # nothing after the wait lasts 16 ns
    out = concentrate_stalls(p, base)
    assert out.order == ("c", "a", "b", "w", "d")
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (45, 0, 1)


def test_a_passed_deadline_changes_nothing() -> None:
    """The pull case would gain 10 ns, but its deadline has passed: the same object comes back."""
    import time

    p = _pull_case(heavy=False)
    base = Schedule.original(p)
    assert concentrate_stalls(p, base, deadline=time.perf_counter() - 1.0) is base


def test_several_ops_are_pulled_when_none_covers_the_stall() -> None:
    """As the pull case with b split in b1 (6 ns) and b2 (6 ns, needs b1): no single op covers
    the 10 ns stall; accumulating pulls both (12 ns): a 0..20, b1, b2 20..32, c ended at 30, d
    32..42: makespan 42 instead of 20 + 10 stall + 10 + 12 = 52."""
    p = make_problem([coll("c", "A", AG, runtime_ns=30), compute("a", 20), wait("w", "c"),
                      compute("d", 10, deps=["w"]), compute("b1", 6), compute("b2", 6, deps=["b1"])])
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 52
    assert pulled(p, base, 2, 10) is None
    assert pulled(p, base, 2, 10, accumulate=True).order == ("c", "a", "b1", "b2", "w", "d")
    # b1 and b2 would pass d, which needs the wait and stays: not when no compute op may pass another
    assert pulled(p, base, 2, 10, accumulate=True, keep_compute_order=True) is None
    out = concentrate_stalls(p, base)
    r = simulate(p, out)
    assert (out.order, r.makespan_ns, r.n_hidden_hideable) == (("c", "a", "b1", "b2", "w", "d"), 42, 1)


def test_a_pull_keeps_the_heavy_order_when_asked() -> None:
    """With d and b heavy, pulling b passes d: allowed in free order, not with keep_heavy_order."""
    p = _pull_case(heavy=True)
    base = Schedule.original(p)
    assert pulled(p, base, 2, 10).order == ("c", "a", "b", "w", "d")
    assert pulled(p, base, 2, 10, keep_heavy_order=True) is None
    assert concentrate_stalls(p, base, keep_heavy_order=True) is base


def test_hidden_runs_are_left_alone() -> None:
    """Nothing stalls twice: the schedule comes back unchanged (the same object)."""
    p = _two_gathers()
    order = ("c1", "c2", "x", "w2", "w1", "v1", "z")
    s = Schedule(order)
    assert concentrate_stalls(p, s) is s


def test_a_short_collective_jumps_its_groups_backlog() -> None:
    """c0 (10 ns) and c1 (100 ns) are issued at 0 (c1 queued 10..110); x (10 ns) makes c2's input;
    c2 (5 ns, same group) is issued at 10 but waits behind c1 (110..115); y (20 ns) runs 10..30,
    then w2 stalls 85 ns (to 115); u (5 ns, needs w2) 115..120, z (200 ns, independent)
    120..320; the other waits end it: 320 ns, c2 exposed. Sinking w2 cannot help (u needs it
    right after), but issuing the queued c1 just after c2 runs c2 at once (10..15) and c1
    15..115, under y, u and z: no stall, 235 ns, all three hidden. c0, already running, stays."""
    p = make_problem([coll("c0", "A", AG, runtime_ns=10), coll("c1", "A", AG, runtime_ns=100),
                      compute("x", 10, heavy=True), coll("c2", "A", AG, runtime_ns=5, deps=["x"]),
                      compute("y", 20, heavy=True), wait("w2", "c2"), compute("u", 5, deps=["w2"], heavy=True),
                      compute("z", 200), wait("w0", "c0"), wait("w1", "c1")])
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable, r0.n_hideable) == (320, 85, 2, 3)
    stalled = next(t for t in r0.collectives if t.exposed_ns)
    assert stalled.members == ("c2",)
    out = jumped(base, r0, stalled)
    assert out is not None and out.order == ("c0", "x", "c2", "c1", "y", "w2", "u", "z", "w0", "w1")
    assert concentrate_stalls(p, base) == out
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (235, 0, 3)
    assert "c1" not in concentrate_stalls(p, base, jump=False).order[2:]  # without jumps the FIFO stays
    assert jumped(base, r0, next(t for t in r0.collectives if t.members == ("c0",))) is None  # issued first


@pytest.mark.parametrize("p", tiny_problems(20, seed=31), ids=lambda p: p.name)
def test_valid_never_worse(p) -> None:
    base = overlap_schedule(p)
    r0 = simulate(p, base)
    out = concentrate_stalls(p, base)
    assert check_schedule(p, out) == []
    r = simulate(p, out)
    assert r.makespan_ns <= r0.makespan_ns
    assert r.peak_memory_bytes <= r0.peak_memory_bytes
    if r.makespan_ns == r0.makespan_ns:
        assert r.n_hidden_hideable >= r0.n_hidden_hideable
        assert out == base or r.n_hidden_hideable > r0.n_hidden_hideable
