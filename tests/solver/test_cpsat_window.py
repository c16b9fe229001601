"""Free-order windows of the neighbourhood search (solver/cpsat_window.py).

Oracles: the incumbent's own simulated makespan (a window model must hold it exactly), brute force
over every reordering of the window's positions (the window's optimum is never worse than the
best of them), the brute-force optimum over all schedules (never better than it), and a
hand-derived case. Every solve is deterministic (seed 0, one worker, deterministic time).
"""

from __future__ import annotations

import itertools

import pytest
from fxsched.heuristics import HEURISTICS
from fxsched.solver import Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig, decode, solve
from fxsched.solver.cpsat_hint import chosen_candidates, hint_values, item_anchors
from fxsched.solver.cpsat_model import ModelBuilder
from fxsched.solver.cpsat_window import free_window, window_frame
from fxsched.solver.problem import ScheduleProblem
from oracle import brute_force, default_budget
from ortools.sat.python import cp_model
from solver_builders import coll, compute, loss_then_gather, make_problem, storage, wait, zero
from tiny_instances import tiny_problems

PROBLEMS = tiny_problems(50, seed=3)[:16]


def _incumbent(p: ScheduleProblem) -> Schedule:
    """A bucketed heuristic schedule within the budget (else the original order)."""
    sched = HEURISTICS["bucket+overlap"](p)
    return sched if simulate(p, sched).peak_memory_bytes <= default_budget(p) else Schedule.original(p)


def _windows(n: int) -> list[tuple[int, int]]:
    return [(0, n), (0, n // 2), (n // 3, n - n // 3), (n // 2, n)]


def _model(p: ScheduleProblem, sched: Schedule, lo: int, hi: int, truncate: bool = False) -> ModelBuilder | None:
    frame = window_frame(p, sched, lo, hi, truncate=truncate)
    if frame is None:
        return None
    b = ModelBuilder(frame, default_budget(p))
    b.build()
    if truncate:
        b.minimize_window_end()
    else:
        b.minimize_makespan()
    for var, val in hint_values(b, sched):
        b.model.AddHint(var, val)
    return b


def _solver(fix: bool = False) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.random_seed = 0
    s.parameters.max_deterministic_time = 20.0
    s.parameters.fix_variables_to_their_hinted_value = fix
    return s


@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
def test_window_model_holds_the_incumbent_exactly(idx: int) -> None:
    """With every decision fixed to the incumbent's (the hint, times included), each window's
    model is feasible and its makespan is the incumbent's simulated one."""
    p = PROBLEMS[idx]
    inc = _incumbent(p)
    want = simulate(p, inc).makespan_ns
    for lo, hi in _windows(len(inc.order)):
        b = _model(p, inc, lo, hi)
        if b is None:
            continue
        s = _solver(fix=True)
        assert s.Solve(b.model) == cp_model.OPTIMAL, (p.name, lo, hi)
        assert s.Value(b.v.makespan) == want
        assert simulate(p, decode(b, s)).makespan_ns == want


def _best_reordering(p: ScheduleProblem, sched: Schedule, lo: int, hi: int, budget: int) -> int:
    """Brute force: the least simulated makespan over every valid order of positions [lo, hi)
    within the budget, the rest of ``sched`` as it is."""
    best = simulate(p, sched).makespan_ns
    head, mid, tail = sched.order[:lo], sched.order[lo:hi], sched.order[hi:]
    for perm in itertools.permutations(mid):
        cand = Schedule(head + perm + tail, sched.buckets, sched.multi_dtype)
        if check_schedule(p, cand):
            continue
        r = simulate(p, cand)
        if r.peak_memory_bytes <= budget:
            best = min(best, r.makespan_ns)
    return best


@pytest.mark.parametrize("original", [True, False])
@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
def test_window_optimum_against_brute_force(idx: int, original: bool) -> None:
    """A window of up to 7 positions around the most exposed collective of the original order or
    of a bucketed heuristic schedule, solved to optimality: no worse than the best reordering of
    those positions (brute force), no better than the best schedule there is (the oracle), and
    the model's makespan is the simulator's for the order it returns."""
    p = PROBLEMS[idx]
    budget = default_budget(p)
    inc = Schedule.original(p) if original else _incumbent(p)
    res = simulate(p, inc)
    window = free_window(p, inc, res, 5, set())
    n = len(inc.order)
    lo, hi = (window[1], window[2]) if window else (max(0, n - 7), n)
    hi = min(hi, lo + 7)
    b = _model(p, inc, lo, hi)
    assert b is not None
    s = _solver()
    assert s.Solve(b.model) == cp_model.OPTIMAL, p.name
    got = decode(b, s)
    r = simulate(p, got)
    assert not check_schedule(p, got)
    assert r.makespan_ns == s.Value(b.v.makespan)
    assert r.peak_memory_bytes <= budget
    assert r.makespan_ns <= _best_reordering(p, inc, lo, hi, budget)
    assert r.makespan_ns >= brute_force(p, mode="free").best_makespan_ns


def _tail_problem() -> ScheduleProblem:
    """a (100 ns) feeds collective c (100 ns), whose wait d (10 ns) reads; b (100 ns) is independent."""
    return make_problem(
        [compute("a", 100, allocates=["A"], heavy=True),
         coll("c", runtime_ns=100, bytes_in=8, bytes_out=8, deps=["a"], uses=["A"], allocates=["C"]),
         compute("b", 100, allocates=["B"], heavy=True),
         wait("w", "c"),
         compute("d", 10, deps=["w", "b"], uses=["C", "B"], allocates=["D"], heavy=True)],
        [storage("A", 8), storage("C", 8), storage("B", 8), storage("D", 8, keep=True)])


@pytest.mark.parametrize("free_window", [0, 120])
def test_free_window_moves_compute_that_fixed_rounds_cannot(free_window: int) -> None:
    """From the hint b, a, c, w, d the collective can only be issued after both computes in fixed
    order: a 0..200 (b first), c 200..300, w stalls to 300, d ends at 310. Reordering a before b
    hides c behind b: a 0..100, c 100..200, b 100..200, d ends at 210 = all compute, the optimum.
    The neighbourhood path (forced) reaches it only with free windows (the polish is off: the
    answer's count-first search would reach it too, by deferring b past c's issue)."""
    p = _tail_problem()
    hint = Schedule(("b", "a", "c", "w", "d"))
    assert simulate(p, hint).makespan_ns == 310
    cfg = SolveConfig(mode="free", max_order_literals=0, lns_rounds=4, free_window=free_window,
                      memory_budget=1.0e3, polish=False)
    res = solve(p, 2, cfg, hint=hint)
    assert not check_schedule(p, res.schedule)
    assert res.objective == (210 if free_window else 310)


def test_free_window_sits_around_the_most_exposed_wait() -> None:
    """c1, c2 (30 ns each, one group) issued at 0, x 0..10, w1 stalls 20, v1 (a view), w2 stalls
    30, z. c2 is the most exposed, but it queued behind c1 (started at 30, issued at 0), so c1
    comes first: two timed ops around its wait (position 3), x (position 2) and the wait, so
    positions [2, 5). Once c1 is tried (with its 20 ns stall), c2's wait (position 5) is next:
    the one timed op before it (w1, position 3; v1 takes no time) and the wait itself, [3, 6). A
    placement is tried again once its stall is another."""
    p = make_problem([
        coll("c1", "A", runtime_ns=30), coll("c2", "A", runtime_ns=30), compute("x", 10),
        wait("w1", "c1"), zero("v1", deps=["w1"]), wait("w2", "c2"), compute("z", 5, deps=["v1", "w2"]),
    ])
    s = Schedule.original(p)
    res = simulate(p, s)
    assert free_window(p, s, res, 2, set()) == (("c1",), 2, 5)
    assert free_window(p, s, res, 2, {(("c1",), 20)}) == (("c2",), 3, 6)
    assert free_window(p, s, res, 2, {(("c1",), 20), (("c2",), 30)}) is None
    assert free_window(p, s, res, 2, {(("c1",), 19), (("c2",), 30)}) == (("c1",), 2, 5)


@pytest.mark.parametrize("bucketed", [False, True])
def test_first_round_kind_follows_the_incumbents_buckets(bucketed: bool) -> None:
    """One neighbourhood round from the hint: a free window when the hint has no buckets; a fixed
    round (which may split or merge buckets; a free window keeps them) when it has one."""
    p = make_problem([
        coll("c1", "A", runtime_ns=30), coll("c2", "A", runtime_ns=30), compute("x", 10, heavy=True),
        wait("w1", "c1"), zero("v1", deps=["w1"]), wait("w2", "c2"), compute("z", 5, deps=["v1", "w2"], heavy=True),
    ])
    hint = Schedule(tuple(op.name for op in p.ops), (("c1", "c2"),) if bucketed else ())
    res = solve(p, 1, SolveConfig(mode="free", max_order_literals=0, lns_rounds=1), hint=hint)
    assert not check_schedule(p, res.schedule)
    assert (res.stats["rounds"], res.stats.get("free_rounds", 0)) == ((1, 0) if bucketed else (0, 1))


@pytest.mark.parametrize("idx", range(8))
def test_window_rounds_solver_without_presolve_proves_the_same_optimum(idx: int) -> None:
    """Free rounds solve without presolve (make_solver(presolve=False): on the tp backward it
    looped for seconds before the search): on a window of up to 7 positions the optimum it proves
    is the one the default solver proves."""
    from fxsched.solver.cpsat_config import make_solver

    p = PROBLEMS[idx]
    inc = _incumbent(p)
    window = free_window(p, inc, simulate(p, inc), 5, set())
    n = len(inc.order)
    lo, hi = (window[1], window[2]) if window else (max(0, n - 7), n)
    b = _model(p, inc, lo, min(hi, lo + 7))
    assert b is not None
    bare = make_solver(SolveConfig(deterministic=True), 20.0, lns=True, presolve=False)
    assert not bare.parameters.cp_model_presolve
    assert bare.Solve(b.model) == cp_model.OPTIMAL
    s = _solver()
    assert s.Solve(b.model) == cp_model.OPTIMAL
    assert bare.ObjectiveValue() == s.ObjectiveValue()


def test_paid_rate_weighs_time_gained_not_gains() -> None:
    """A kind that gained 100 us in 10 s rates (100,000 + 50,000) / (10 + 10) = 7,500 per second; one
    that gained three times 2 us in 3 s rates (6,000 + 50,000) / (3 + 10) = 4,307.7: the free
    windows' one large gain wins over the fixed rounds' many small ones. Before either has gained,
    the cheaper one so far rates higher."""
    from fxsched.solver.cpsat_window import paid_rate

    assert paid_rate([10.0, 100_000]) == 7_500
    assert paid_rate([3.0, 6_000]) == pytest.approx(56_000 / 13)
    assert paid_rate([4.0, 0]) > paid_rate([4.5, 0])


@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
def test_truncated_window_is_never_slower_than_the_incumbent(idx: int) -> None:
    """Truncated windows hold everything after the window at the incumbent's times. With the
    hint fixed, each window's model is feasible and its end is where the incumbent's last window
    item ends (its simulated clock there); solved to optimality, the schedule it returns is valid,
    within the budget, never slower than the incumbent (the simulator is monotone) and never
    faster than the brute-force optimum."""
    p = PROBLEMS[idx]
    inc = _incumbent(p)
    want = simulate(p, inc).makespan_ns
    optimum = brute_force(p, mode="free").best_makespan_ns
    for lo, hi in _windows(len(inc.order)):
        b = _model(p, inc, lo, hi, truncate=True)
        if b is None:
            continue
        fixed = _solver(fix=True)
        assert fixed.Solve(b.model) == cp_model.OPTIMAL, (p.name, lo, hi)
        last = max(pos for pos, i in item_anchors(b.frame, inc, chosen_candidates(b.frame, inc))
                   if lo <= pos < hi)
        assert fixed.Value(b.window_end) == b.frame.clocks[last]
        s = _solver()
        assert s.Solve(b.model) == cp_model.OPTIMAL, (p.name, lo, hi)
        got = decode(b, s)
        r = simulate(p, got)
        assert not check_schedule(p, got)
        assert r.peak_memory_bytes <= default_budget(p)
        assert optimum <= r.makespan_ns <= want


def test_truncated_window_hides_the_collective_behind_the_other_compute() -> None:
    """_tail_problem from b, a, c, w, d (makespan 310) with the window over b, a, c and w, d held at
    their times (w 200..300, d 300..310): the window ends at 200 in either order of a and b, and
    c ending first decides: a 0..100, c 100..200, b 100..200; the simulator gives all compute, 210."""
    p = _tail_problem()
    inc = Schedule(("b", "a", "c", "w", "d"))
    b = _model(p, inc, 0, 3, truncate=True)
    assert b is not None
    s = _solver()
    assert s.Solve(b.model) == cp_model.OPTIMAL
    assert s.Value(b.window_end) == 200
    assert simulate(p, decode(b, s)).makespan_ns == 210


def test_a_hint_over_the_memory_budget_gives_way_to_the_warm_start(caplog: pytest.LogCaptureFixture) -> None:
    """loss_then_gather: issuing g before a (g, a, b, wg, y) keeps G (500 B) live beside T and U,
    a peak of 100 + 500 + 1000 + 1 = 1601 B against the original order's 1101 B (the budget). A
    search started there may never get back within the budget; the solve warns and starts from
    its warm start, so it answers exactly as it does with no hint."""
    p = loss_then_gather()
    hint = Schedule(("g", "a", "b", "wg", "y"))
    assert simulate(p, hint).peak_memory_bytes == 1601 and simulate(p).peak_memory_bytes == 1101
    cfg = SolveConfig(mode="free", max_order_literals=0, lns_rounds=2, deterministic=True, seed=0, workers=1)
    with caplog.at_level("WARNING", logger="fxsched.solver.cpsat"):
        hinted = solve(p, 2, cfg, hint=hint)
    assert "exceeds the memory budget" in caplog.text
    plain = solve(p, 2, cfg)
    assert hinted.status == plain.status and hinted.status.name != "INFEASIBLE"
    assert hinted.peak_memory_bytes <= 1101
    assert hinted.schedule == plain.schedule


def test_a_truncated_window_at_the_end_ends_no_later_than_the_incumbent() -> None:
    """a (100 ns) and b (200 ns), independent, in one truncated window that reaches the order's
    end: nothing frozen follows to bound them, so the frame carries the incumbent's end, 300 ns,
    and the latest a may end is 300 (after b), not the model's horizon. An untruncated window
    bounds nothing this way."""
    p = make_problem([compute("a", 100), compute("b", 200)])
    sched = Schedule.original(p)
    frame = window_frame(p, sched, 0, 2, truncate=True)
    assert frame is not None and frame.window_end_ns == 300
    assert window_frame(p, sched, 0, 2).window_end_ns is None  # type: ignore[union-attr]
    b = ModelBuilder(frame, None)
    b.build()
    (item, _), = frame.op_items["a"]
    b.model.Maximize(b.v.end[item])
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.Solve(b.model) == cp_model.OPTIMAL
    assert s.Value(b.v.end[item]) == 300
