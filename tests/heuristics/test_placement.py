"""The fixed-compute-order frame (heuristics/placement.py): producer-only chains, the backbone,
earliest/need slots, the compute clock and ``assemble``.

Problems are hand-built with tests/solver/solver_builders.py. Slot k is the gap just before
backbone op k; slot len(backbone) is the end. Every expected number below is derived by hand from
DESIGN.md's execution model, in the test's docstring or comments.
"""

from __future__ import annotations

import pytest
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.placement import Placement, Unit, assemble, producer_only_chain
from fxsched.solver import Schedule, ScheduleProblem, check_schedule, simulate

from tests.heuristics.test_overlap import blocked_first_problem
from tests.solver.solver_builders import (
    coll,
    compute,
    make_problem,
    storage,
    wait,
    zero,
)


def cast_view_problem() -> ScheduleProblem:
    """A (heavy, 100) | cast (10): W -> S | v: view of S | ag (150): S -> G | w | B (heavy, 100) reads G.

    cast feeds only v, v feeds only ag: both are ag's producer-only chain.
    """
    return make_problem([
        compute("A", 100, heavy=True),
        compute("cast", 10, uses=["W"], allocates=["S"]),
        zero("v", deps=["cast"], uses=["S"]),
        coll("ag", runtime_ns=150, deps=["v"], uses=["S"], allocates=["G"], bytes_in=50, bytes_out=100),
        wait("w", "ag", uses=["G"]),
        compute("B", 100, deps=["A", "w"], uses=["G"], heavy=True),
    ], [storage("W", 10, param=True), storage("S", 50), storage("G", 100)])


def test_cast_and_view_feeding_only_the_collective_form_its_chain() -> None:
    """Chain = (cast, v); backbone = (A, B); clock = (0, 100, 200) (the chain's 10 ns is not on it).
    ag reads nothing from the backbone: earliest = 0. Its wait's only user is B (slot 1): need = 1."""
    p = cast_view_problem()
    assert producer_only_chain(p, "ag") == ("cast", "v")
    pl = Placement(p)
    assert pl.backbone == ("A", "B")
    assert pl.clock == (0, 100, 200)
    assert pl.n_slots == 3
    assert pl.units == {"ag": Unit("ag", ("cast", "v"), earliest=0, need=1)}


def test_move_chains_false_keeps_the_cast_in_the_backbone() -> None:
    """Without chains, cast and v are backbone ops 1 and 2: earliest = 2 + 1 = 3, need = slot(B) = 3."""
    pl = Placement(cast_view_problem(), move_chains=False)
    assert pl.backbone == ("A", "cast", "v", "B")
    assert pl.clock == (0, 100, 110, 110, 210)
    assert pl.units["ag"] == Unit("ag", (), earliest=3, need=3)


def chain_problem(second_user: bool) -> ScheduleProblem:
    """A (100) | cast (10): W -> S | ag (150): S -> G | w | B (100) | [norm (10) reads S] | C (100) reads G.

    Memory: W 10 (param), S 50, G 100. Original order is as listed (norm after B when present).
    """
    ops = [
        compute("A", 100),
        compute("cast", 10, uses=["W"], allocates=["S"]),
        coll("ag", runtime_ns=150, deps=["cast"], uses=["S"], allocates=["G"], bytes_in=50, bytes_out=100),
        wait("w", "ag", uses=["G"]),
        compute("B", 100),
    ]
    if second_user:
        ops.append(compute("norm", 10, deps=["cast"], uses=["S"]))
    ops.append(compute("C", 100, deps=["w"], uses=["G"]))
    return make_problem(ops, [storage("W", 10, param=True), storage("S", 50), storage("G", 100)])


def test_cast_feeding_only_the_collective_moves_with_it() -> None:
    """Frame: backbone (A, B, C), clock (0, 100, 200, 300); ag: chain (cast,), earliest 0, need 2.
    just_in_time: ag should end by clock[need] = 200 less the slack int(150 * 0.05) = 7, so start
    by 193 - 150 = 43: the last slot with clock <= 43 is slot 0. cast and ag go there.
      cast 0-10, ag issued at 10 runs 10-160, A 10-110, B 110-210, w at 210: no stall, C 210-310.
      exposed 0, makespan 310.
    Original: A 0-100, cast 100-110, ag 110-260, w stalls 150, B 260-360, C 360-460 (exposed 150).
    Memory (W 10 + S 50 + G 100 = 160 at most) is the same as the original's peak, 160."""
    p = chain_problem(second_user=False)
    r0 = simulate(p)
    assert (r0.exposed_ns, r0.makespan_ns, r0.peak_memory_bytes) == (150, 460, 160)
    sched = overlap_schedule(p)
    assert sched.order == ("cast", "ag", "A", "B", "w", "C")
    r = simulate(p, sched)
    assert (r.exposed_ns, r.makespan_ns, r.peak_memory_bytes) == (0, 310, 160)


def test_cast_with_a_second_user_is_backbone_and_stays() -> None:
    """cast also feeds norm: it is a backbone op, chain = (). Backbone (A, cast, B, norm, C), clock
    (0, 100, 110, 210, 220, 320). ag: earliest = slot after cast = 2, need = slot(C) = 4.
    just_in_time: start by clock[4] - 7 - 150 = 63; the last slot in [2, 4] with clock <= 63 is none,
    so the lowest, 2 (right behind the cast, which keeps its place after A).
      A 0-100, cast 100-110, ag 110-260, B 110-210, norm 210-220, w at 220 stalls 40, C 260-360."""
    p = chain_problem(second_user=True)
    assert producer_only_chain(p, "ag") == ()
    pl = Placement(p)
    assert pl.backbone == ("A", "cast", "B", "norm", "C")
    assert pl.units["ag"] == Unit("ag", (), earliest=2, need=4)
    sched = overlap_schedule(p)
    assert sched.order == ("A", "cast", "ag", "B", "norm", "w", "C")
    r = simulate(p, sched)
    assert (r.exposed_ns, r.makespan_ns) == (40, 360)


def test_heavy_op_is_never_in_a_chain() -> None:
    """mm (heavy) feeds only cast, cast feeds only ag: the chain stops at mm (cast only).
    A heavy op feeding the collective directly gives an empty chain."""
    p = make_problem([
        compute("mm", 100, uses=["W"], allocates=["M"], heavy=True),
        compute("cast", 10, deps=["mm"], uses=["M"], allocates=["S"]),
        coll("ag", runtime_ns=50, deps=["cast"], uses=["S"], allocates=["G"]),
        wait("w", "ag", uses=["G"]),
        compute("mm2", 100, uses=["W"], allocates=["M2"], heavy=True),
        coll("ag2", runtime_ns=50, deps=["mm2"], uses=["M2"], allocates=["G2"]),
        wait("w2", "ag2", uses=["G2"]),
        compute("out", 1, deps=["w", "w2"], uses=["G", "G2"]),
    ], [storage("W", 10, param=True), storage("M", 10), storage("S", 10), storage("G", 10),
        storage("M2", 10), storage("G2", 10)])
    assert producer_only_chain(p, "ag") == ("cast",)
    assert producer_only_chain(p, "ag2") == ()
    pl = Placement(p)
    assert pl.backbone == ("mm", "mm2", "out")
    assert pl.units["ag"] == Unit("ag", ("cast",), earliest=1, need=2)  # after mm (slot 0)
    assert pl.units["ag2"] == Unit("ag2", (), earliest=2, need=2)  # after mm2 (slot 1)


def test_chain_takes_a_diamond_but_not_a_shared_producer() -> None:
    """x feeds y and z, both feed only c: x, y, z are all in c's chain (x's users are all chain).
    s feeds t (which feeds only c2) and the backbone op u: t is c2's chain, s is backbone."""
    p = make_problem([
        compute("x", 1),
        compute("y", 1, deps=["x"]),
        compute("z", 1, deps=["x"]),
        coll("c", deps=["y", "z"]),
        wait("wc", "c"),
        compute("s", 1),
        compute("t", 1, deps=["s"]),
        compute("u", 1, deps=["s"]),
        coll("c2", deps=["t"]),
        wait("wc2", "c2"),
    ])
    assert producer_only_chain(p, "c") == ("x", "y", "z")
    assert producer_only_chain(p, "c2") == ("t",)
    assert Placement(p).backbone == ("s", "u")


def test_need_before_another_collectives_chain() -> None:
    """c1's wait is read by x, which feeds only c2 (x is c2's chain); x also reads A (slot 0).
    earliest(c2) = 0 + 1 = 1. c2's wait is read by nobody: need(c2) = the end slot =
    len(backbone) = 2. c1's wait must come before c2's issue, which is at most need(c2): the
    static bound need(c1) = 2, and c2 is recorded as its reader, so assemble pulls w1 up to
    wherever c2 is issued (w1 precedes x in every schedule)."""
    p = make_problem([
        compute("A", 100, heavy=True),
        coll("c1", allocates=["G1"]),
        wait("w1", "c1", uses=["G1"]),
        compute("x", 5, deps=["w1", "A"], uses=["G1"], allocates=["X"]),
        coll("c2", deps=["x"], uses=["X"], allocates=["G2"]),
        wait("w2", "c2", uses=["G2"]),
        compute("B", 100),
    ], [storage("G1", 1), storage("X", 1), storage("G2", 1)])
    pl = Placement(p)
    assert pl.backbone == ("A", "B")
    assert pl.units["c1"] == Unit("c1", (), earliest=0, need=2)
    assert pl.units["c2"] == Unit("c2", ("x",), earliest=1, need=2)
    assert pl.readers["c1"] == ("c2",)
    for issue_c2 in (1, 2):  # w1 asked for at the end: reconciled to c2's issue slot
        order = assemble(pl, {"c1": 0, "c2": issue_c2}, {"c1": 2, "c2": 2}).order
        assert order.index("w1") < order.index("x") < order.index("c2")
    assert check_schedule(p, overlap_schedule(p)) == []


def test_slot_lookups_on_the_compute_clock() -> None:
    """Backbone A, B, C of 100 each: clock (0, 100, 200, 300)."""
    p = make_problem([compute("A", 100), compute("B", 100), compute("C", 100)])
    pl = Placement(p)
    assert pl.clock == (0, 100, 200, 300)
    assert pl.slot_at_or_before(150, 0, 3) == 1
    assert pl.slot_at_or_before(200, 0, 3) == 2
    assert pl.slot_at_or_before(-5, 0, 3) == 0  # none: lo
    assert pl.slot_at_or_before(250, 0, 1) == 1  # clamped to hi
    assert pl.slot_at_or_before(50, 2, 3) == 2  # none in [2, 3]: lo
    assert pl.slot_at_or_after(150, 0, 3) == 2
    assert pl.slot_at_or_after(100, 0, 3) == 1
    assert pl.slot_at_or_after(1000, 0, 3) == 3  # none: hi
    assert pl.slot_at_or_after(0, 2, 3) == 2  # clamped to lo


def test_original_slots_reproduce_the_original_order() -> None:
    """Original A, cast, v, ag, w, B: cast/v/ag/w all sit between A and B, so issue = wait = slot 1,
    and assembling those slots gives back the original order."""
    p = cast_view_problem()
    pl = Placement(p)
    issue, wait_slots = pl.original_slots
    assert (issue, wait_slots) == ({"ag": 1}, {"ag": 1})
    assert assemble(pl, issue, wait_slots) == Schedule.original(p)


def test_assemble_places_chain_issue_and_wait() -> None:
    """Issue at slot 0, wait at slot 1: cast, v, ag before A; w between A and B."""
    p = cast_view_problem()
    sched = assemble(Placement(p), {"ag": 0}, {"ag": 1})
    assert sched.order == ("cast", "v", "ag", "A", "w", "B")
    assert check_schedule(p, sched) == []


def test_assemble_puts_issues_before_waits_in_priority_order() -> None:
    """Two collectives and their waits all in slot 0 (before B). Issues go first, in priority order
    (default: original order), then the waits in the same priority order."""
    p = make_problem([
        coll("c1"), coll("c2"), wait("w1", "c1"), wait("w2", "c2"), compute("B", 1, deps=["w1", "w2"]),
    ])
    pl = Placement(p)
    slots = {"c1": 0, "c2": 0}
    assert assemble(pl, slots, slots).order == ("c1", "c2", "w1", "w2", "B")
    assert assemble(pl, slots, slots, priority={"c1": 1, "c2": 0}).order == ("c2", "c1", "w2", "w1", "B")


@pytest.mark.parametrize(("issue", "wait_slot"), [(2, 2), (0, 2), (1, 0)])
def test_assemble_rejects_slots_outside_earliest_need(issue: int, wait_slot: int) -> None:
    """ag: earliest 0, need 1 (cast_view_problem). Slot 2 is past need, and a wait before its
    issue (1 > 0) is outside [issue, need]: each raises ValueError naming the collective."""
    pl = Placement(cast_view_problem())
    with pytest.raises(ValueError, match="'ag'"):
        assemble(pl, {"ag": issue}, {"ag": wait_slot})


def test_assemble_rejects_an_issue_before_earliest() -> None:
    """chain_problem(second_user=True): ag's earliest is 2 (after the cast); slot 1 is too early."""
    pl = Placement(chain_problem(second_user=True))
    with pytest.raises(ValueError, match="collective 'ag'.*outside \\[2, 4\\]"):
        assemble(pl, {"ag": 1}, {"ag": 4})


def wait_fed_chain_problem() -> ScheduleProblem:
    """A (heavy, 100) | c1 (50) reads A's output | w1 | x (10) reads c1's output, feeds only c2 |
    c2 (50, group B) | w2 | B (100) reads c2's output. (HSDP-like: the second collective consumes
    the first one's result.)"""
    return make_problem([
        compute("A", 100, allocates=["a"], heavy=True),
        coll("c1", runtime_ns=50, deps=["A"], uses=["a"], allocates=["g1"]),
        wait("w1", "c1", uses=["g1"]),
        compute("x", 10, deps=["w1"], uses=["g1"], allocates=["xs"]),
        coll("c2", "B", runtime_ns=50, deps=["x"], uses=["xs"], allocates=["g2"]),
        wait("w2", "c2", uses=["g2"]),
        compute("B", 100, deps=["w2"], uses=["g2"]),
    ], [storage("a", 1), storage("g1", 1), storage("xs", 1), storage("g2", 1)])


def test_collective_fed_by_another_collectives_wait() -> None:
    """x (c2's chain) reads only w1, no backbone op; c2 still cannot go before c1 is issued, so
    earliest(c2) = earliest(c1) = 1 (after A), and need(c1) = earliest(c2) = 1, need(c2) = slot(B)
    = 1. (At commit e5ca129 the frame counted only direct backbone deps: earliest(c2) = 0, so
    need(c1) = 0 < earliest(c1) = 1 and overlap_schedule raised ValueError.)
    Everything sits in slot 1, in dependency order: the original order. A 0-100, c1 100-150,
    w1 stalls 50, x 150-160, c2 160-210, w2 stalls 50, B 210-310: exposed 100."""
    p = wait_fed_chain_problem()
    pl = Placement(p)
    assert pl.backbone == ("A", "B")
    assert pl.units == {"c1": Unit("c1", (), earliest=1, need=1), "c2": Unit("c2", ("x",), earliest=1, need=1)}
    sched = overlap_schedule(p)
    assert sched == Schedule.original(p)
    assert simulate(p, sched).exposed_ns == 100


def test_chain_stays_contiguous_when_it_reads_a_wait() -> None:
    """c2's chain is y (no deps) and x (reads y and c1's output). Everything lands in slot 0
    (before D, the only backbone op): earliest(c1) = earliest(c2) = 0, need(c1) = earliest(c2) = 0,
    need(c2) = slot(D) = 0. The chain (y, x) sits right before c2, with w1 ahead of the whole
    block: c1, w1, y, x, c2, w2, D. (At commit e5ca129 w1 was emitted between y and x.)
    The original lists y first; both orders run c1 0-10, w1 stalls 10, c2 10-20, w2 stalls 10,
    D 20-120, and a tie keeps the assembled schedule."""
    p = make_problem([
        compute("y", 0, allocates=["ys"]),
        coll("c1", runtime_ns=10, allocates=["g1"]),
        wait("w1", "c1", uses=["g1"]),
        compute("x", 0, deps=["w1", "y"], uses=["g1", "ys"], allocates=["xs"]),
        coll("c2", runtime_ns=10, deps=["x"], uses=["xs"], allocates=["g2"]),
        wait("w2", "c2", uses=["g2"]),
        compute("D", 100, deps=["w2"], uses=["g2"], heavy=True),
    ], [storage("g1", 1), storage("ys", 1), storage("xs", 1), storage("g2", 1)])
    assert producer_only_chain(p, "c2") == ("y", "x")
    sched = overlap_schedule(p)
    assert sched.order == ("c1", "w1", "y", "x", "c2", "w2", "D")
    assert simulate(p, sched).makespan_ns == 120


def test_assemble_keeps_group_order_when_the_first_is_blocked_by_a_wait() -> None:
    """c0 (100, group A) gathers W0 into G0; cy (100, group B) reads w0's output, and X (100) reads
    cy's; cx (300, group B) gathers W1, read by Z after Y (100). Backbone X, Y, Z; c0, cy, cx all
    issued in slot 0, w0 and wy in slot 0, wx in slot 2; priority c0 < cy < cx (need order).
    Group B's FIFO must run cy before cx: c0, w0, cy, cx, wy, X, Y, wx, Z:
      c0 0-100, w0 stalls 100, cy 100-200, cx 200-500 (B busy), wy stalls 100, X 200-300,
      Y 300-400, wx stalls 100, Z 500-600: makespan 600.
    With cx first (c0, cx, w0, cy, ...): cx 0-300, cy 300-400, wy stalls until 400, Z ends 700."""
    p = blocked_first_problem()
    pl = Placement(p)
    assert pl.backbone == ("X", "Y", "Z")
    sched = assemble(pl, {"c0": 0, "cy": 0, "cx": 0}, {"c0": 0, "cy": 0, "cx": 2},
                     priority={"c0": 0, "cy": 1, "cx": 2})
    assert sched.order == ("c0", "w0", "cy", "cx", "wy", "X", "Y", "wx", "Z")
    assert simulate(p, sched).makespan_ns == 600
