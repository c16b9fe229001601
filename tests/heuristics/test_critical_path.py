"""Critical-path list scheduling (heuristics/critical_path.py): hand-derived bottom levels and
optima, the memory budget, and validity / never-worse on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.critical_path import bottom_levels, critical_path_order, critical_path_schedule
from fxsched.heuristics.overlap import original_peak, overlap_schedule
from fxsched.solver import Schedule, check_schedule, simulate

from tests.solver.solver_builders import AG, AR, RS, coll, compute, make_problem, storage, wait, zero
from tests.solver.tiny_instances import tiny_problems


def test_bottom_levels_by_hand() -> None:
    """c1 (100) -> w1 -> a (10) -> c2 (100) -> w2 -> b (10), with f1 (80) after w1 and f2 (80)
    after w2: b 10, f2 80, w2 max(10, 80) = 80, c2 100 + 80 = 180, a 10 + 180 = 190, f1 80,
    w1 max(190, 80) = 190, c1 100 + 190 = 290."""
    p = make_problem([
        coll("c1", "A", AG, runtime_ns=100),
        wait("w1", "c1"),
        compute("a", 10, deps=["w1"]),
        compute("f1", 80, deps=["w1"]),
        coll("c2", "A", RS, runtime_ns=100, deps=["a"]),
        wait("w2", "c2"),
        compute("b", 10, deps=["w2"]),
        compute("f2", 80, deps=["w2"]),
    ])
    assert bottom_levels(p) == {"b": 10, "f2": 80, "w2": 80, "c2": 180, "a": 190, "f1": 80, "w1": 190, "c1": 290}


def _feeder(f_uses: tuple[str, ...] = (), x_alloc: tuple[str, ...] = ()):
    """Filler f (100) first, then x (10) feeding a collective c (100) that y (10) waits for.
    Given order f, x, c, w, y: f 0..100, x 100..110, c 110..210, y 210..220: 220 ns."""
    return make_problem([
        compute("f", 100, heavy=True, uses=f_uses),
        compute("x", 10, heavy=True, allocates=x_alloc),
        coll("c", "A", AG, runtime_ns=100, deps=["x"], uses=x_alloc),
        wait("w", "c"),
        compute("y", 10, deps=["w"], heavy=True),
    ], storages=[storage(s, 100, inp=True) for s in f_uses] + [storage(s, 50) for s in x_alloc])


def test_runs_the_longest_path_first() -> None:
    """bl(x) = 10 + 100 + 10 = 120 > bl(f) = 100: x 0..10, c issued at 10 (10..110); then f
    (bl 100 > bl(y) = 10, ready) runs 10..110 and y 110..120. 120 ns is optimal: the total compute."""
    p = _feeder()
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 220
    out = critical_path_schedule(p, base)
    assert out.order == ("x", "c", "f", "w", "y")
    assert simulate(p, out).makespan_ns == 120


def test_tail_collective_is_issued_first() -> None:
    """An all-reduce r (100) of x's result that nothing waits for but the end: given order
    f (100), x (10), r: r runs 110..210. Longest path first: x 0..10, r 10..110 under f (10..110):
    110 ns, the total compute, so optimal."""
    p = make_problem([
        compute("f", 100, heavy=True),
        compute("x", 10, heavy=True),
        coll("r", "A", AR, runtime_ns=100, deps=["x"]),
        wait("wr", "r"),
    ])
    assert simulate(p, Schedule.original(p)).makespan_ns == 210
    assert simulate(p, critical_path_schedule(p, Schedule.original(p))).makespan_ns == 110


def test_memory_budget_is_kept() -> None:
    """f reads a 100-byte input (freed after it); x writes a 50-byte buffer that c reads. The
    given order peaks at 100 (the input alone); x first peaks at 150 (both). Under the original
    peak the rebuild keeps the given order and nothing beats it: the input comes back; with 150
    bytes the longest path goes first (120 ns)."""
    p = _feeder(f_uses=("in",), x_alloc=("buf",))
    base = Schedule.original(p)
    assert original_peak(p) == 100
    assert simulate(p, critical_path_order(p, base)).peak_memory_bytes == 150
    assert critical_path_schedule(p, base) == base
    out = critical_path_schedule(p, base, budget_bytes=150)
    assert simulate(p, out).makespan_ns == 120


@pytest.mark.parametrize(("g_ns", "before_b", "makespan"), [(60, True, 340), (130, False, 370)])
def test_a_stall_is_filled_only_within_the_slack(g_ns: int, before_b: bool, makespan: int) -> None:
    """Chain a (10) -> c1 (100) -> b (10) -> c2 (100) -> d (10) -> c3 (100) -> e (10), 340 ns, the
    bound; filler g. After a (0..10), b stalls until 110 and its slack is 340 - 110 - bl(b) (230) = 0.
    g = 60 fits (10..70) and runs there: 340 ns. g = 130 would overshoot by 30 > 0: the stream
    stalls for b (110..120), and g (bl 130 > bl(d) = 120) runs at 120..250, d 250..260, c3 260..360,
    e 360..370: 370 ns, optimal too (g overshoots a 100 ns gap wherever it runs, or runs after e)."""
    p = make_problem([
        compute("a", 10, heavy=True),
        coll("c1", "A", RS, runtime_ns=100, deps=["a"]),
        wait("w1", "c1"),
        compute("b", 10, deps=["w1"], heavy=True),
        coll("c2", "A", RS, runtime_ns=100, deps=["b"]),
        wait("w2", "c2"),
        compute("d", 10, deps=["w2"], heavy=True),
        coll("c3", "A", RS, runtime_ns=100, deps=["d"]),
        wait("w3", "c3"),
        compute("e", 10, deps=["w3"], heavy=True),
        compute("g", g_ns, heavy=True),
    ])
    out = critical_path_order(p, Schedule.original(p))
    assert (out.order.index("g") < out.order.index("b")) is before_b
    assert simulate(p, out).makespan_ns == makespan


@pytest.mark.parametrize("p", tiny_problems(20, seed=31), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    base = overlap_schedule(p)
    r0 = simulate(p, base)
    budget = max(original_peak(p), r0.peak_memory_bytes)
    for backlog in (None, 0):
        assert check_schedule(p, critical_path_order(p, base, backlog_ns=backlog)) == []
    out = critical_path_schedule(p, base, budget_bytes=budget)
    assert check_schedule(p, out) == []
    r = simulate(p, out)
    assert r.makespan_ns <= r0.makespan_ns
    assert r.peak_memory_bytes <= budget



def test_a_view_behind_a_wait_counts_once_for_its_users() -> None:
    """x reads z (a view behind w1) and y (a view behind w2, whose collective c2 needs v). z is
    counted off for x when w1's collective is issued; placing z (for u) must not count it off
    again, or x looks ready before y exists and runs ahead of it. c3 (100) holds v back to 100,
    so u and x (10 each) both fit in its stall: the order is valid only if x waits for y."""
    p = make_problem([
        coll("c3", "B", AG, runtime_ns=100),
        wait("w3", "c3"),
        compute("v", 10, deps=["w3"]),
        coll("c1", "A", AG, runtime_ns=0),
        wait("w1", "c1"),
        zero("z", deps=["w1"]),
        compute("u", 10, deps=["z"]),
        coll("c2", "A", AG, runtime_ns=5, deps=["v"]),
        wait("w2", "c2"),
        zero("y", deps=["w2"]),
        compute("x", 10, deps=["z", "y"]),
    ])
    out = critical_path_order(p, Schedule.original(p))
    assert check_schedule(p, out) == []
    assert out.order.index("x") > out.order.index("y")
