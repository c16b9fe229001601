"""The count-first search (heuristics/hide.py) and its place in ``solve``: hand-derived timelines,
a brute-force oracle over every order of the same graphs, and validity / never-worse on tiny
problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.hide import hide_collectives
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.solver import OpKind, Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig, Status, solve

from tests.solver.oracle import raw_orders
from tests.solver.solver_builders import AG, RS, coll, compute, make_problem, storage, wait, zero
from tests.solver.tiny_instances import tiny_problems


def _most_hidden(problem, max_makespan_ns: int, budget_bytes: int | None = None) -> int:
    """Brute force: the most hidden hideable collectives over every order within the caps."""
    best = -1
    for order in raw_orders(problem):
        r = simulate(problem, Schedule(order))
        if r.makespan_ns <= max_makespan_ns and (budget_bytes is None or r.peak_memory_bytes <= budget_bytes):
            best = max(best, r.n_hidden_hideable)
    return best


def _two_groups():
    """c1 (group A, 20 ns) and c2 (group B, 50 ns) issued at 0; x and y (10 ns each) need neither;
    z (5 ns) needs both. Order c1, c2, x, w1, y, w2, z: x 0..10, w1 stalls 10 (to 20), y 20..30,
    w2 stalls 20 (to 50), z 50..55: 55 ns, both exposed."""
    p = make_problem([coll("c1", "A", AG, runtime_ns=20), coll("c2", "B", AG, runtime_ns=50),
                      compute("x", 10), wait("w1", "c1"), compute("y", 10), wait("w2", "c2"),
                      compute("z", 5, deps=["w1", "w2"])])
    return p, Schedule.original(p)


def test_a_stall_moves_where_one_is_left_anyway() -> None:
    """y before w1 (or w1 after y): c1 ends at 20 as y does, w2 stalls 30 instead (to 50), z 50..55.
    Same 55 ns, one exposed instead of two: the most any order hides in 55 ns (c2 runs 50 ns
    and only 20 ns of compute can run beside it)."""
    p, base = _two_groups()
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable, r0.n_hideable) == (55, 30, 0, 2)
    out = hide_collectives(p, base)
    assert not check_schedule(p, out)
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (55, 30, 1)
    assert _most_hidden(p, 55) == 1


def _filler_or_feed(mem: bool = False):
    """c1 (group A, 20 ns) at 0; y (22 ns) needs nothing; z (5 ns) needs w1 and feeds c2 (group B,
    40 ns); q (1 ns) needs w2 and y. With ``mem``, z reads the graph input I (100 B) and y makes Y
    (100 B, read by q).

    c1, w1, z, c2, y, w2, q: w1 stalls 20, z 20..25, c2 25..65 under y (25..47), w2 stalls 18,
    q 65..66: 66 ns, both exposed. Moving y before w1 hides c1 but delays z, so c2 and q:
    c1, y, w1, z, c2, w2, q ends at 68 with c1 hidden."""
    ops = [coll("c1", "A", AG, runtime_ns=20), wait("w1", "c1"),
           compute("z", 5, deps=["w1"], uses=["I"] if mem else []),
           coll("c2", "B", AG, runtime_ns=40, deps=["z"]), compute("y", 22, allocates=["Y"] if mem else []),
           wait("w2", "c2"), compute("q", 1, deps=["w2", "y"], uses=["Y"] if mem else [])]
    storages = [storage("I", 100, inp=True), storage("Y", 100)] if mem else []
    p = make_problem(ops, storages)
    return p, Schedule.original(p)


def test_no_longer_by_default_and_a_slack_buys_a_hidden_collective() -> None:
    p, base = _filler_or_feed()
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.n_hidden_hideable, r0.n_hideable) == (66, 0, 2)
    assert _most_hidden(p, 66) == 0 and _most_hidden(p, 67) == 0 and _most_hidden(p, 68) == 1
    assert hide_collectives(p, base) is base
    assert hide_collectives(p, base, max_makespan_ns=67) is base
    out = hide_collectives(p, base, max_makespan_ns=68)
    assert out.order == ("c1", "y", "w1", "z", "c2", "w2", "q")
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable) == (68, 1)


def test_the_peak_stays_within_the_budget() -> None:
    """With I and Y: the given order holds I until z and Y from y to q, never both (peak 100 B).
    Moving y before w1 holds both from y to z (200 B). Within 150 B the move is not taken, nor
    by default (the input's peak); within 200 B it is, as the oracle agrees."""
    p, base = _filler_or_feed(mem=True)
    assert simulate(p, base).peak_memory_bytes == 100
    assert _most_hidden(p, 68, budget_bytes=150) == 0 and _most_hidden(p, 68, budget_bytes=200) == 1
    assert hide_collectives(p, base, max_makespan_ns=68, budget_bytes=150) is base
    assert hide_collectives(p, base, max_makespan_ns=68) is base
    out = hide_collectives(p, base, max_makespan_ns=68, budget_bytes=200)
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable, r.peak_memory_bytes) == (68, 1, 200)


def test_the_candidate_bound_stops_the_search() -> None:
    p, base = _filler_or_feed()
    assert hide_collectives(p, base, max_makespan_ns=68, max_evals=0) is base


def _back_to_back(bucket: bool):
    """Two units on group A whose waits stall back to back, with only a view between them, so
    that the first wait cannot sink past the second.

    Lone (``bucket`` False): c1 (30 ns), c2 (20 ns), x (10 ns, needs neither), w1, v (a view of
    w1), w2, z (5 ns, needs v and w2). c1 runs 0..30 and c2 30..50 (FIFO); x 0..10, w1 stalls
    20 (to 30), w2 stalls 20 (to 50), z 50..55: 55 ns, neither hidden.

    Bucket: r1 and r2 (reduce-scatters, 100 B in and 50 B out each) in one bucket issued at r2,
    then a lone r3 (50 ns); w1 (r1's wait, the bucket's) stalls. The bucket's copy-in runs
    100 + 200 = 300 ns and its collective 100 + 300 = 400 ns (300..700), r3 700..750 behind it;
    x 300..310, w1 stalls 390 (to 700), w2 finds it done, w3 stalls 50 (to 750), z 750..755."""
    if not bucket:
        ops = [coll("c1", "A", AG, runtime_ns=30), coll("c2", "A", AG, runtime_ns=20), compute("x", 10),
               wait("w1", "c1"), zero("v", deps=["w1"]), wait("w2", "c2"), compute("z", 5, deps=["v", "w2"])]
        return make_problem(ops), ()
    ops = [coll("r1", "A", RS, runtime_ns=250, bytes_in=100, bytes_out=50),
           coll("r2", "A", RS, runtime_ns=250, bytes_in=100, bytes_out=50), coll("r3", "A", RS, runtime_ns=50),
           compute("x", 10), wait("w1", "r1"), zero("v", deps=["w1"]), wait("w2", "r2"), wait("w3", "r3"),
           compute("z", 5, deps=["v", "w2", "w3"])]
    return make_problem(ops), (("r1", "r2"),)


@pytest.mark.parametrize("bucket", [False, True])
def test_back_to_back_stalls_merge_at_the_same_makespan(bucket: bool) -> None:
    """The later unit's wait moves before the earlier one's: it stalls until its collective ends,
    which FIFO puts after the earlier one's end, so the earlier wait finds its collective done and
    the compute stream resumes when it did. Lone: w2 stalls 40 (10..50), w1 none, z 50..55 (c2
    issued first, the jump, ties with it and comes later in the search). Bucket: w3 stalls 440
    (310..750), the bucket's waits none, z 750..755 (no jump passes a bucket: r3 issued first
    would end at 705 hiding r3 alone, 1 member where the merge hides 2). One hidden at the same
    makespan, the most any order hides (with those buckets) within it: the first unit's wait
    always stalls, since x is the only compute beside it and is shorter than its collective."""
    p, buckets = _back_to_back(bucket)
    base = Schedule(tuple(op.name for op in p.ops), buckets)
    r0 = simulate(p, base)
    makespan = 755 if bucket else 55
    assert (r0.makespan_ns, r0.n_hidden_hideable, r0.n_hideable) == (makespan, 0, 2)
    most = max(simulate(p, s).n_hidden_hideable for s in (Schedule(o, buckets) for o in raw_orders(p))
               if not check_schedule(p, s) and simulate(p, s).makespan_ns <= makespan)
    assert most == 1
    out = hide_collectives(p, base)
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable, r.peak_memory_bytes) == (makespan, 1, r0.peak_memory_bytes)
    later, earlier = ("w3", "w1") if bucket else ("w2", "w1")
    assert out.order.index(later) + 1 == out.order.index(earlier)
    assert r.n_hidden_hideable_members == (2 if bucket else 1)


def _two_short_fillers():
    """c1 (group A, 30 ns) waited at once, v a view of its wait (so the wait cannot sink), u
    (10 ns) needs v; x and y (15 ns each) need nothing; z (5 ns) needs u, x and y. Order c1, w1,
    v, u, x, y, z: w1 stalls 30, u 30..40, x 40..55, y 55..70, z 70..75: 75 ns, c1 exposed."""
    ops = [coll("c1", "A", AG, runtime_ns=30), wait("w1", "c1"), zero("v", deps=["w1"]),
           compute("u", 10, deps=["v"]), compute("x", 15), compute("y", 15), compute("z", 5, deps=["u", "x", "y"])]
    p = make_problem(ops)
    return p, Schedule.original(p)


def test_ops_that_cover_a_stall_together_move_before_it() -> None:
    """Neither x nor y alone covers the 30 ns stall; together they do: x 0..15, y 15..30, w1 finds
    c1 done at 30, u 30..40, z 40..45: 45 ns with c1 hidden, the least makespan of any order (the
    45 ns of compute run back to back) and the most hidden."""
    p, base = _two_short_fillers()
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.n_hidden_hideable, r0.n_hideable) == (75, 0, 1)
    out = hide_collectives(p, base)
    assert out.order == ("c1", "x", "y", "w1", "v", "u", "z")
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable) == (45, 1)
    assert _most_hidden(p, 45) == 1


def test_fixed_mode_gathers_no_compute_past_compute() -> None:
    """In the fixed mode x and y would pass u, which stays after the wait: no move is taken."""
    p, base = _two_short_fillers()
    assert hide_collectives(p, base, keep_compute_order=True) is base


def _small_behind_big(ancestor: bool):
    """Group A: c1 (50 ns) issued first, then c2 (5 ns; with ``ancestor``, fed by a, 2 ns, between
    the two issues); x (30 ns) needs neither, y (30 ns) needs w2, z (5 ns) needs w1 and y. Order
    c1, [a,] c2, x, w2, y, w1, z: c2 queues behind c1 (50..55) and w2 stalls to its end, y runs
    55..85 and z 85..90: 90 ns either way, c1 hidden, c2 exposed. No pull (y
    needs c2), defer (nothing runs before c2's issue but its own input), sink (y is w2's first
    user) or merge (one stalled unit) changes that."""
    ops = [coll("c1", "A", AG, runtime_ns=50)] + ([compute("a", 2)] if ancestor else [])
    ops += [coll("c2", "A", AG, runtime_ns=5, deps=["a"] if ancestor else []), compute("x", 30),
            wait("w2", "c2"), compute("y", 30, deps=["w2"]), wait("w1", "c1"), compute("z", 5, deps=["w1", "y"])]
    p = make_problem(ops)
    return p, Schedule.original(p)


@pytest.mark.parametrize("keep_compute_order", [False, True])
@pytest.mark.parametrize("ancestor", [False, True])
def test_a_small_collective_jumps_the_queue(ancestor: bool, keep_compute_order: bool) -> None:
    """c2 (with a) issued before c1: c2 runs first ([a 0..2,] c2 0..5 or 2..7), c1 after it (to 55
    or 57), x then y run to 60 (62) with w2 found done, w1 finds c1 done, z ends at 65 (67): both
    hidden, and 65 ns is the compute alone, the least makespan (67 with a: a, x, y, z run back to
    back and a must precede c2's issue). The oracle agrees. Only c2's issue and its input move, so
    the fixed mode takes the move too."""
    p, base = _small_behind_big(ancestor)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.n_hidden_hideable, r0.n_hideable) == (90, 1, 2)
    out = hide_collectives(p, base, keep_compute_order=keep_compute_order)
    assert not check_schedule(p, out)
    r = simulate(p, out)
    best = 67 if ancestor else 65
    assert (r.makespan_ns, r.n_hidden_hideable) == (best, 2)
    assert out.order.index("c2") < out.order.index("c1")
    assert _most_hidden(p, best) == 2
    assert min(simulate(p, Schedule(o)).makespan_ns for o in raw_orders(p)) == best


TINY = tiny_problems(24, seed=11)


@pytest.mark.parametrize("keep_compute_order", [False, True])
@pytest.mark.parametrize("idx", range(len(TINY)))
def test_valid_never_worse_never_above_the_oracle(idx: int, keep_compute_order: bool) -> None:
    """From the overlap heuristic's schedule: a valid schedule, no longer, no higher in peak, hiding
    no fewer, and no more than the most any order hides within that makespan and peak; in the
    fixed mode the compute ops keep their order."""
    p = TINY[idx]
    base = overlap_schedule(p)
    r0 = simulate(p, base)
    out = hide_collectives(p, base, keep_compute_order=keep_compute_order)
    assert not check_schedule(p, out)
    r = simulate(p, out)
    assert r.makespan_ns <= r0.makespan_ns and r.peak_memory_bytes <= r0.peak_memory_bytes
    assert r0.n_hidden_hideable <= r.n_hidden_hideable
    if keep_compute_order:
        def computes(s: Schedule) -> list[str]:
            return [n for n in s.order if p.op_by_name[n].kind is OpKind.COMPUTE]
        assert computes(out) == computes(base)
    if not base.buckets:
        assert r.n_hidden_hideable <= _most_hidden(p, r0.makespan_ns, r0.peak_memory_bytes)


def test_solve_trades_makespan_only_when_asked() -> None:
    """CP-SAT proves 66 ns optimal (the oracle's best order, both exposed); with a 5% slack the
    final polish takes the 68 ns order that hides c1, and the answer is no longer proven optimal."""
    p, _ = _filler_or_feed()
    exact = dict(seed=0, workers=1, coarsen=False)
    res = solve(p, 5, SolveConfig(mode="free", **exact))
    assert (res.objective, res.status, simulate(p, res.schedule).n_hidden_hideable) == (66, Status.OPTIMAL, 0)
    res = solve(p, 5, SolveConfig(mode="free", hide_slack=0.05, **exact))
    r = simulate(p, res.schedule)
    assert (res.objective, r.makespan_ns, r.n_hidden_hideable, res.status) == (68, 68, 1, Status.FEASIBLE)
    assert res.lower_bound == 66


@pytest.mark.parametrize("slack", [-0.01, 1.5, True])
def test_the_slack_is_a_share(slack) -> None:
    with pytest.raises(ValueError, match="hide_slack"):
        SolveConfig(hide_slack=slack)
