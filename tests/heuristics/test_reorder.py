"""Tail deferral (heuristics/reorder.py): a hand-derived case, and validity on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.reorder import defer_independent
from fxsched.solver import Schedule, simulate

from tests.heuristics.checks import assert_valid_never_worse
from tests.solver.solver_builders import RS, coll, compute, make_problem, wait
from tests.solver.tiny_instances import tiny_problems


def tail_problem():
    """b (600 ns, independent), a (100 ns) -> reduce_scatter c (size 400: 500 ns) -> its wait at the end.

    Original order b, a, c, w: c runs 700..1200 with nothing left to hide it: makespan 1200.
    Fixed heavy order cannot help (b and a are heavy). Deferring b after c's issue: a 0..100,
    c 100..600, b 100..700, w at 700: makespan 700, nothing exposed.
    """
    return make_problem([
        compute("b", 600, heavy=True),
        compute("a", 100, heavy=True),
        coll("c", kind=RS, runtime_ns=500, bytes_in=200, bytes_out=200, deps=["a"]),
        wait("w", "c"),
    ])


def test_defers_independent_compute_past_the_last_collective() -> None:
    p = tail_problem()
    base = overlap_schedule(p)
    assert simulate(p, base).makespan_ns == 1200
    out = defer_independent(p, base)
    assert out.order == ("a", "c", "b", "w")
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns) == (700, 0)


def test_no_move_when_nothing_is_exposed() -> None:
    p = tail_problem()
    hidden = Schedule(order=("a", "c", "b", "w"))
    assert defer_independent(p, hidden) == hidden


@pytest.mark.parametrize("p", tiny_problems(20, seed=9), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    base = overlap_schedule(p)
    assert_valid_never_worse(p, base, defer_independent(p, base))
