"""Tail deferral (heuristics/reorder.py): a hand-derived case, validity on tiny problems, and the
index-array deferrals against an op-by-op walk."""

from __future__ import annotations

import random

import pytest
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.reorder import Deferrals, defer_independent
from fxsched.solver import Schedule, check_schedule, simulate

from tests.heuristics.checks import assert_valid_never_worse
from tests.solver.random_dags import random_problem, random_topological_order
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


def _reference_deferred(p, order, issue_pos, seeds):  # noqa: ANN001, ANN202
    """The deferral walked op by op: a seed, or an op with a moved dependency, moves."""
    first = min(order.index(s) for s in seeds)
    moved, kept, moved_names = [], [], set()
    for op in order[first:issue_pos + 1]:
        if op in seeds or any(d in moved_names for d in p.op_by_name[op].deps):
            moved.append(op)
            moved_names.add(op)
        else:
            kept.append(op)
    return order[:first] + tuple(kept) + tuple(moved) + order[issue_pos + 1:]


def test_deferrals_match_the_op_by_op_walk() -> None:
    """Deferrals built as index arrays (descendant bitsets) equal the op-by-op walk on random
    problems, orders, collectives and seed sets, and are valid orders; the cases are not vacuous
    (most move more than the seeds)."""
    grown = 0
    for seed in range(300):
        rng = random.Random(seed)
        p = random_problem(rng, max_ops=40)
        order = random_topological_order(p, rng, late_waits=True)
        d = Deferrals(p, Schedule(order))
        for c in p.collectives:
            issue = order.index(c.name)
            anc = p.ancestors[p.index[c.name]]
            free = [op for op in order[:issue] if not anc >> p.index[op] & 1]
            if not free:
                continue
            seeds = set(rng.sample(free, rng.randint(1, min(3, len(free)))))
            at, moves_member = d.order(issue, seeds)
            new = d.schedule(at)
            assert not moves_member  # no buckets
            assert new.order == _reference_deferred(p, order, issue, seeds)
            assert check_schedule(p, new) == []
            grown += len(set(new.order[new.order.index(c.name) + 1:]) - set(order[issue + 1:])) > len(seeds)
    assert grown > 100, grown
