"""The classic passes (heuristics/classic.py): sink_waits, raise_collectives, raise_and_sink.

They work in the fixed-order frame without chains: every op but collectives and waits is backbone.
Timelines are derived by hand from DESIGN.md's execution model in each docstring.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fxsched.heuristics.classic import raise_and_sink, raise_collectives, sink_waits
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.solver import OpKind, Schedule, ScheduleProblem, simulate

from tests.solver.solver_builders import (
    AR,
    RS,
    coll,
    compute,
    make_problem,
    storage,
    wait,
)

Pass = Callable[[ScheduleProblem], Schedule]


def without(p: ScheduleProblem, order: tuple[str, ...], kind: OpKind) -> tuple[str, ...]:
    return tuple(n for n in order if p.op_by_name[n].kind is not kind)


def simple_problem() -> ScheduleProblem:
    """A (100) | c (150): param W (10) -> G (100) | w | B (100, independent) | C (100) reads G.
    Original order A, c, w, B, C."""
    return make_problem([
        compute("A", 100),
        coll("c", runtime_ns=150, uses=["W"], allocates=["G"]),
        wait("w", "c", uses=["G"]),
        compute("B", 100),
        compute("C", 100, deps=["w"], uses=["G"]),
    ], [storage("W", 10, param=True), storage("G", 100)])


def test_original_timeline() -> None:
    """A 0-100, c 100-250, w at 100 stalls 150, B 250-350, C 350-450: exposed 150."""
    r = simulate(simple_problem())
    assert (r.exposed_ns, r.makespan_ns) == (150, 450)


def test_sink_waits_moves_only_the_wait() -> None:
    """c stays after A; w moves to just before C (its first use): A, c, B, w, C.
    A 0-100, c 100-250, B 100-200, w at 200 stalls 50, C 250-350: exposed 50."""
    p = simple_problem()
    sched = sink_waits(p)
    assert sched.order == ("A", "c", "B", "w", "C")
    assert without(p, sched.order, OpKind.WAIT) == without(p, Schedule.original(p).order, OpKind.WAIT)
    r = simulate(p, sched)
    assert (r.exposed_ns, r.makespan_ns) == (50, 350)


def test_raise_collectives_moves_only_the_collective() -> None:
    """c reads only a param: issued at slot 0; w stays between A and B: c, A, w, B, C.
    c 0-150, A 0-100, w at 100 stalls 50, B 150-250, C 250-350: exposed 50."""
    p = simple_problem()
    sched = raise_collectives(p)
    assert sched.order == ("c", "A", "w", "B", "C")
    assert without(p, sched.order, OpKind.COLLECTIVE) == without(p, Schedule.original(p).order,
                                                                  OpKind.COLLECTIVE)
    r = simulate(p, sched)
    assert (r.exposed_ns, r.makespan_ns) == (50, 350)


def test_raise_and_sink_does_both() -> None:
    """c, A, B, w, C: c 0-150, A 0-100, B 100-200, w at 200 no stall, C 200-300: exposed 0."""
    p = simple_problem()
    sched = raise_and_sink(p)
    assert sched.order == ("c", "A", "B", "w", "C")
    r = simulate(p, sched)
    assert (r.exposed_ns, r.makespan_ns) == (0, 300)


def cast_problem() -> ScheduleProblem:
    """A (100) | cast (10): W -> S (50) | ag (150): S -> G (100) | w | B (100) | C (100) reads G.
    Original order A, cast, ag, w, B, C."""
    return make_problem([
        compute("A", 100),
        compute("cast", 10, uses=["W"], allocates=["S"]),
        coll("ag", runtime_ns=150, deps=["cast"], uses=["S"], allocates=["G"]),
        wait("w", "ag", uses=["G"]),
        compute("B", 100),
        compute("C", 100, deps=["w"], uses=["G"]),
    ], [storage("W", 10, param=True), storage("S", 50), storage("G", 100)])


def test_raise_collectives_does_not_move_the_chain() -> None:
    """The cast stays after A, so ag cannot rise above it: raise_collectives keeps the original
    order (A 0-100, cast 100-110, ag 110-260, w stalls 150, B 260-360, C 360-460: exposed 150).
    raise_and_sink: A, cast, ag, B, w, C: ag 110-260, B 110-210, w at 210 stalls 50, C 260-360:
    exposed 50. overlap_schedule moves the cast with ag: cast, ag, A, B, w, C: ag 10-160, w at 210:
    exposed 0."""
    p = cast_problem()
    rc = raise_collectives(p)
    assert rc == Schedule.original(p)
    assert simulate(p, rc).exposed_ns == 150
    rs = raise_and_sink(p)
    assert rs.order == ("A", "cast", "ag", "B", "w", "C")
    assert simulate(p, rs).exposed_ns == 50
    ov = overlap_schedule(p)
    assert ov.order == ("cast", "ag", "A", "B", "w", "C")
    assert simulate(p, ov).exposed_ns == 0


def test_raise_collectives_raises_only_to_just_after_its_inputs() -> None:
    """cast, A, B, ag, w, C (ag reads cast's output): raise_collectives puts ag right after cast,
    cast stays first; w stays before C: cast, ag, A, B, w, C.
    cast 0-10, ag 10-160, A 10-110, B 110-210, w at 210 no stall: exposed 0 (original: ag 210-360,
    stall 150)."""
    p = make_problem([
        compute("cast", 10, uses=["W"], allocates=["S"]),
        compute("A", 100),
        compute("B", 100),
        coll("ag", runtime_ns=150, deps=["cast"], uses=["S"], allocates=["G"]),
        wait("w", "ag", uses=["G"]),
        compute("C", 100, deps=["w"], uses=["G"]),
    ], [storage("W", 10, param=True), storage("S", 50), storage("G", 100)])
    assert simulate(p).exposed_ns == 150
    sched = raise_collectives(p)
    assert sched.order == ("cast", "ag", "A", "B", "w", "C")
    assert simulate(p, sched).exposed_ns == 0


def test_sink_waits_keeps_the_collective_issue_order() -> None:
    """Original c2, c1, w1, w2, A, B (reads both): sink_waits moves both waits to just before B and
    keeps c2 before c1 (same group: FIFO c2 0-100, c1 100-200). A 0-100, w1 at 100 stalls 100,
    w2 no stall, B 200-300: exposed 100 (the original: w1 at 0 stalls 200, exposed 200)."""
    p = make_problem([
        coll("c2", runtime_ns=100, allocates=["G2"]),
        coll("c1", runtime_ns=100, allocates=["G1"]),
        wait("w1", "c1", uses=["G1"]),
        wait("w2", "c2", uses=["G2"]),
        compute("A", 100),
        compute("B", 100, deps=["w1", "w2"], uses=["G1", "G2"]),
    ], [storage("G1", 1), storage("G2", 1)])
    assert simulate(p).exposed_ns == 200
    sched = sink_waits(p)
    assert sched.order[:3] == ("c2", "c1", "A")
    assert set(sched.order[3:5]) == {"w1", "w2"} and sched.order[5] == "B"
    assert simulate(p, sched).exposed_ns == 100


def rs_output_problem() -> ScheduleProblem:
    """g (100) makes the gradient X (1000); rs (50) reduce-scatters X into O (500, a graph output,
    never freed); nothing reads O after the wait. E (100) and D (100, allocates Y 1000 nobody reads)
    are independent. Original order g, rs, w, E, D."""
    return make_problem([
        compute("g", 100, allocates=["X"]),
        coll("rs", kind=RS, runtime_ns=50, deps=["g"], uses=["X"], allocates=["O"]),
        wait("w", "rs", uses=["O"]),
        compute("E", 100),
        compute("D", 100, allocates=["Y"]),
    ], [storage("X", 1000), storage("O", 500, keep=True), storage("Y", 1000)])


def test_classic_passes_ignore_memory() -> None:
    """On :func:`rs_output_problem` the original order peaks at 1500 (X is freed at w, before Y).
    sink_waits has no user to sink w before, so it goes last: X is live over D: 1000 + 500 + 1000 = 2500."""
    p = rs_output_problem()
    assert simulate(p).peak_memory_bytes == 1500
    for f in (sink_waits, raise_and_sink):
        assert simulate(p, f(p)).peak_memory_bytes == 2500


def hsdp_problem() -> ScheduleProblem:
    """HSDP-style: g (heavy, 100) makes X; rs (50, group A) reduce-scatters X to O within a node;
    ar (50, group B) all-reduces O across nodes, reading the rs wait's output directly; F (100)
    reads ar's result. Original g, rs, w_rs, ar, w_ar, F."""
    return make_problem([
        compute("g", 100, allocates=["X"], heavy=True),
        coll("rs", kind=RS, runtime_ns=50, deps=["g"], uses=["X"], allocates=["O"]),
        wait("w_rs", "rs", uses=["O"]),
        coll("ar", "B", kind=AR, runtime_ns=50, deps=["w_rs"], uses=["O"], allocates=["R"]),
        wait("w_ar", "ar", uses=["R"]),
        compute("F", 100, deps=["w_ar"], uses=["R"]),
    ], [storage("X", 100), storage("O", 50), storage("R", 50)])


@pytest.mark.parametrize("f", [sink_waits, raise_collectives, raise_and_sink, overlap_schedule],
                         ids=lambda f: f.__name__)
def test_collective_reading_another_collectives_wait(f: Pass) -> None:
    """Backbone g, F. rs: earliest 1 (after g). ar reads no backbone op but reads w_rs, so it can go
    no earlier than rs: earliest 1; need(rs) = earliest(ar) = 1; need(ar) = slot(F) = 1. Every
    pass puts everything in slot 1, in dependency order: the original order. g 0-100, rs 100-150,
    w_rs stalls 50, ar 150-200 on group B, w_ar stalls 50, F 200-300: exposed 100.
    (At commit e5ca129 ar got earliest 0, so need(rs) = 0 < earliest(rs) = 1 and every pass raised
    ValueError.)"""
    p = hsdp_problem()
    sched = f(p)
    assert sched == Schedule.original(p)
    assert simulate(p, sched).exposed_ns == 100


def hidden_hsdp_problem() -> ScheduleProblem:
    """g (heavy, 100) makes X; rs (50, group A) reduce-scatters X into O; E (heavy, 100); w_rs;
    ar (50, group B) all-reduces O (reads w_rs's output); H (heavy, 100); w_ar; F (100) reads R.
    Original g, rs, E, w_rs, ar, H, w_ar, F: g 0-100, rs 100-150 under E 100-200, w_rs at 200
    no stall, ar 200-250 under H 200-300, w_ar at 300 no stall, F 300-400: exposed 0."""
    return make_problem([
        compute("g", 100, allocates=["X"], heavy=True),
        coll("rs", kind=RS, runtime_ns=50, deps=["g"], uses=["X"], allocates=["O"]),
        compute("E", 100, heavy=True),
        wait("w_rs", "rs", uses=["O"]),
        coll("ar", "B", kind=AR, runtime_ns=50, deps=["w_rs"], uses=["O"], allocates=["R"]),
        compute("H", 100, heavy=True),
        wait("w_ar", "ar", uses=["R"]),
        compute("F", 100, deps=["w_ar"], uses=["R"]),
    ], [storage("X", 100), storage("O", 50), storage("R", 50)])


def test_wait_read_by_a_collective_is_not_hoisted_by_sink_waits() -> None:
    """sink_waits moves each wait to just before its first use and nothing else: w_rs's first use
    is ar, which stays after E, and w_ar is already right before F: the order is unchanged,
    exposed 0."""
    p = hidden_hsdp_problem()
    assert simulate(p).exposed_ns == 0
    sched = sink_waits(p)
    assert sched == Schedule.original(p)
    assert simulate(p, sched).exposed_ns == 0


def test_wait_read_by_a_collective_stays_under_raise_collectives() -> None:
    """raise_collectives keeps waits where they were (w_rs after E) and raises each collective to
    just after its inputs: rs is already right after g, ar right after w_rs: unchanged, exposed 0."""
    p = hidden_hsdp_problem()
    sched = raise_collectives(p)
    assert sched == Schedule.original(p)
    assert simulate(p, sched).exposed_ns == 0


def test_wait_read_by_a_collective_overlap_falls_back_to_the_original() -> None:
    """Whatever the frame allows, overlap_schedule never returns a slower schedule than the
    original (exposed 0 here), so it is no worse than 400."""
    p = hidden_hsdp_problem()
    r = simulate(p, overlap_schedule(p))
    assert (r.exposed_ns, r.makespan_ns) == (0, 400)
