"""Far filler deferral (heuristics/far_defer.py): a hand-derived case checked against the
brute-force oracle, the queue head, and validity on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.far_defer import defer_far_fillers, queue_head
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.reorder import deferred
from fxsched.solver import Schedule, simulate

from tests.heuristics.checks import assert_valid_never_worse
from tests.solver.oracle import brute_force
from tests.solver.solver_builders import coll, compute, make_problem, wait
from tests.solver.tiny_instances import tiny_problems


def far_problem():
    """f (200 ns, a weight gradient) -> rf (group A, 50 ns); q (group B, 100 ns) is waited by e
    (100 ns) -> r (group A, 300 ns); g (100 ns) feeds nothing. Only q's wait feeds compute, so f,
    g (and e) are fillers.

    Order f, rf, q, g, wq, e, r, wf, wr: f 0..200, rf 200..250, q and g 200..300, e 300..400, r
    400..700 with nothing left to hide it: 700. Deferring the latest filler g past r's issue
    uncovers q (wq stalls 200..300) and gains nothing: 700. Deferring f, far back, instead: q and
    g 0..100, e 100..200, r 200..500, f 200..400, rf queued behind r 500..550, wf stalls to 550: 550,
    the optimum (r cannot start before q and e, 200; rf before r would need f and e before r's
    issue, 300, and r would end at 600).
    """
    return make_problem([
        compute("f", 200),
        coll("rf", "A", runtime_ns=50, deps=["f"]),
        coll("q", "B", runtime_ns=100),
        compute("g", 100),
        wait("wq", "q"),
        compute("e", 100, deps=["wq"]),
        coll("r", "A", runtime_ns=300, deps=["e"]),
        wait("wf", "rf"),
        wait("wr", "r"),
    ])


def test_defers_a_filler_from_far_back_past_the_queue_head() -> None:
    p = far_problem()
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 700
    pos = {op: i for i, op in enumerate(base.order)}
    alone = {f: simulate(p, deferred(p, base, pos["r"], {f})).makespan_ns for f in ("f", "g")}
    assert alone == {"f": 550, "g": 700}
    out = defer_far_fillers(p, base)
    assert out.order == ("q", "g", "wq", "e", "r", "f", "rf", "wf", "wr")
    assert simulate(p, out).makespan_ns == 550 == brute_force(p, bucketing=False).best_makespan_ns


def test_queue_head_walks_back_over_queued_collectives() -> None:
    """In the deferred order rf is issued at 400 and queued behind r (500..550): its queue's head
    is r, which started at its issue; r's own head is r."""
    p = far_problem()
    res = simulate(p, Schedule(("q", "g", "wq", "e", "r", "f", "rf", "wf", "wr")))
    by = {t.members: t for t in res.collectives}
    assert queue_head(res, by[("rf",)]).members == ("r",)
    assert queue_head(res, by[("r",)]).members == ("r",)


@pytest.mark.parametrize("p", tiny_problems(20, seed=9), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    base = overlap_schedule(p)
    assert_valid_never_worse(p, base, defer_far_fillers(p, base))


def test_max_evals_bounds_the_fillers_tried_in_all() -> None:
    """far_problem with g first (the fillers are tried in problem order: g, then f). Order g, q, f,
    rf, wq, e, r, wf, wr: g 0..100, q 100..200, f 100..300, rf 300..350, e 300..400, r 400..700: 700.
    Past r, g alone: q 0..100, f 0..200, rf 200..250, e 200..300, r 300..600, g 300..400: 600; f
    alone: r 300..600, rf queued to 650: 650. So the first move defers g (2 fillers tried); then
    only f is left before r: q 0..100, e 100..200, r 200..500, f 200..400, g 400..500, rf queued
    500..550: 550. One filler in all stops after g (600); three reach 550, as without a bound."""
    ops = far_problem().ops
    by = {op.name: op for op in ops}
    p = make_problem([by[n] for n in ("g", "q", "f", "rf", "wq", "e", "r", "wf", "wr")])
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 700
    assert simulate(p, defer_far_fillers(p, base)).makespan_ns == 550
    assert simulate(p, defer_far_fillers(p, base, max_evals=1)).makespan_ns == 600
    assert simulate(p, defer_far_fillers(p, base, max_evals=3)).makespan_ns == 550
    assert defer_far_fillers(p, base, max_evals=0) is base
