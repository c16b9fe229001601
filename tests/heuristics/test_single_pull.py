"""Single pulls (heuristics/single_pull.py): a hand-derived case checked against the brute-force
oracle, the candidates' order, and validity on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.single_pull import pull_candidates, pull_single_fillers
from fxsched.solver import Schedule, simulate

from tests.heuristics.checks import assert_valid_never_worse
from tests.solver.oracle import brute_force
from tests.solver.solver_builders import coll, compute, make_problem, wait
from tests.solver.tiny_instances import tiny_problems


def pull_problem(extra: tuple = ()):
    """a (100 ns) -> c (group A, 200 ns) -> wc -> b (100 ns); d (50 ns) and e (300 ns) feed nothing.

    Order a, c, wc, b, d, e: a 0..100, c 100..300, wc stalls 100..300, b 300..400, d 400..450, e
    450..750: 750. Pulling d before wc: d 100..150, the stall 150..300, b, e 300..700: 700.
    Pulling e: e 100..400 covers c, b 400..500, d 500..550: 550, the compute alone, so optimal.
    """
    return make_problem([
        compute("a", 100),
        coll("c", "A", runtime_ns=200, deps=["a"]),
        wait("wc", "c"),
        compute("b", 100, deps=["wc"]),
        compute("d", 50),
        compute("e", 300),
        *extra,
    ])


def test_pulls_the_op_that_covers_the_stall() -> None:
    p = pull_problem()
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 750
    assert simulate(p, Schedule(("a", "c", "d", "wc", "b", "e"))).makespan_ns == 700
    out = pull_single_fillers(p, base)
    assert out.order == ("a", "c", "e", "wc", "b", "d")
    assert simulate(p, out).makespan_ns == 550 == brute_force(p, bucketing=False).best_makespan_ns


def test_max_evals_bounds_the_candidates_tried() -> None:
    """The first candidate (e, which covers the stall) is enough; none tried changes nothing."""
    p = pull_problem()
    base = Schedule.original(p)
    assert pull_single_fillers(p, base, max_evals=0) == base
    assert simulate(p, pull_single_fillers(p, base, max_evals=1)).makespan_ns == 550


def test_candidates_cover_the_stall_shortest_first_then_the_longest() -> None:
    """With f (250 ns, needs b: not before wc) and g (20 ns) added, the stall of 200 ns is covered by
    e (300) only; then d (50) and g (20), longest first."""
    p = pull_problem((compute("f", 250, deps=["b"]), compute("g", 20), compute("h", 250)))
    order = Schedule.original(p).order
    got = [order[j] for j in pull_candidates(p, order, order.index("wc"), 200, limit=10)]
    assert got == ["h", "e", "d", "g"]
    assert [order[j] for j in pull_candidates(p, order, order.index("wc"), 200, limit=2)] == ["h", "e"]


@pytest.mark.parametrize("p", tiny_problems(20, seed=11), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    base = overlap_schedule(p)
    r = assert_valid_never_worse(p, base, pull_single_fillers(p, base))
    oracle = brute_force(p, bucketing=bool(base.buckets), budget_bytes=r.peak_memory_bytes)
    assert r.makespan_ns >= oracle.best_makespan_ns  # no better than every schedule within its peak
