"""Stream plan search (heuristics/stream_plan.py): hand-derived plans checked against the
brute-force oracle and the memory budget, the plan of a schedule, determinism, and validity on
tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.overlap import overlap_schedule
from fxsched.heuristics.stream_plan import _Frame, coarse_plan, plan_of, plan_search, realize
from fxsched.solver import Schedule, ScheduleProblem, check_schedule, simulate

from tests.heuristics.checks import assert_valid_never_worse
from tests.heuristics.test_bucket_shift import _problem, two_gathers, two_gradients
from tests.solver.oracle import brute_force
from tests.solver.solver_builders import RS, coll, compute, storage, wait
from tests.solver.tiny_instances import tiny_problems


def test_merges_two_reduce_scatters() -> None:
    """two_gradients (test_bucket_shift.py): apart 2140 ns at a 40-byte peak; one bucket 1241 ns at
    80 bytes (its docstring derives both)."""
    p = two_gradients()
    base = Schedule.original(p)
    out = plan_search(p, base, budget_bytes=80, max_evals=50)
    assert [set(b) for b in out.buckets] == [{"r1", "r2"}]
    assert simulate(p, out).makespan_ns == 1241 == brute_force(p, budget_bytes=80).best_makespan_ns
    # below the bucket's 80 bytes no plan but the lone ones fits: nothing faster than the start
    assert simulate(p, plan_search(p, base, budget_bytes=79, max_evals=50)).makespan_ns == 2140
    # the cap counts each member's larger side (20 input bytes each): the bucket holds 40
    assert plan_search(p, base, budget_bytes=80, cap_bytes=39, max_evals=50).buckets == ()
    assert plan_search(p, base, budget_bytes=80, cap_bytes=40, max_evals=50).buckets


def test_splits_a_bucket_whose_first_member_is_needed_early() -> None:
    """two_gathers: bucketed 6141 ns, apart 6120 (the second gather hidden under c1)."""
    p = two_gathers()
    base = Schedule(Schedule.original(p).order, (("x1", "x2"),))
    out = plan_search(p, base, budget_bytes=1 << 20, max_evals=50)
    assert out.buckets == ()
    assert simulate(p, out).makespan_ns == 6120 == brute_force(p, budget_bytes=1 << 20).best_makespan_ns


def prefetch_blocked() -> ScheduleProblem:
    """two_gathers, with c1 freeing o1: at a 20-byte budget x2's output cannot live beside x1's.

    The plan of two lone gathers issues x2 at the start (clock 0, where the draft started it):
    a 40-byte peak. The memory repair moves its issue after c1, which frees o1: x1 0..120, c1
    120..3120, x2 3120..3240 exposed, c2 3240..6240. The one bucket holds 40 bytes and cannot fit.
    """
    gathers = two_gathers()
    ops = [op for op in gathers.ops if op.name not in ("c1", "c2", "w2")]
    return _problem([
        *ops,
        compute("c1", 3000, deps=["w1"], uses=["o1"], allocates=["h"]),
        wait("w2", "x2"),
        compute("c2", 3000, deps=["w2", "c1"], uses=["o2", "h"]),
    ], [storage("o1", 20), storage("o2", 20), storage("h", 0)], points=((0, 100), (1000, 1100)))


def test_repairs_a_plan_over_the_budget() -> None:
    p = prefetch_blocked()
    frame = _Frame(p, multi_dtype=False, cap_bytes=None)
    apart = plan_of(frame, Schedule.original(p))
    assert apart == (((0, 0, 1), (0, 1, 2)),)
    real = realize(frame, apart)
    assert real is not None
    r = simulate(p, real.schedule)
    assert (r.makespan_ns, r.peak_memory_bytes) == (6120, 40)
    fixed = real.repaired(frame, 20)
    assert fixed is not None and fixed[1].makespan_ns == 6240 and fixed[1].peak_memory_bytes == 20
    assert brute_force(p, mode="fixed", budget_bytes=20).best_makespan_ns == 6240


def test_plan_of_keeps_runs_and_fifo_order() -> None:
    """A bucket of consecutive list members stays one run; the lone ones are runs of one."""
    p = two_gradients()
    frame = _Frame(p, multi_dtype=False, cap_bytes=None)
    assert frame.lists == [("r1", "r2")]
    assert plan_of(frame, Schedule.original(p)) == (((0, 0, 1), (0, 1, 2)),)
    bucketed = Schedule(Schedule.original(p).order, (("r1", "r2"),))
    assert plan_of(frame, bucketed) == (((0, 0, 2),),)


def test_deterministic_for_a_seed() -> None:
    for p in tiny_problems(6, seed=23):
        base = overlap_schedule(p)
        assert plan_search(p, base, max_evals=80, seed=5) == plan_search(p, base, max_evals=80, seed=5)


def test_max_evals_zero_returns_the_start() -> None:
    p = two_gradients()
    base = Schedule.original(p)
    assert plan_search(p, base, budget_bytes=80, max_evals=0) is base


@pytest.mark.parametrize("p", tiny_problems(16, seed=29), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    """From the unbucketed overlap schedule: valid, no worse, within the original peak, and no
    better than the oracle (fixed compute order: the frame the plans are placed in)."""
    base = overlap_schedule(p)
    out = plan_search(p, base, max_evals=120)
    r = assert_valid_never_worse(p, base, out)
    assert check_schedule(p, out) == []
    assert r.makespan_ns >= brute_force(p, mode="fixed", budget_bytes=r.peak_memory_bytes).best_makespan_ns


def test_improves_somewhere() -> None:
    """The property test above is not vacuous: on some of its tiny problems a plan pays."""
    gains = 0
    for p in tiny_problems(16, seed=29):
        base = overlap_schedule(p)
        gains += simulate(p, plan_search(p, base, max_evals=120)).makespan_ns < simulate(p, base).makespan_ns
    assert gains >= 1


@pytest.mark.parametrize("max_evals", [200, 1000, 10_000])
def test_gives_up_when_nothing_beats_the_start(monkeypatch, max_evals) -> None:
    """From two_gathers' optimum (6120 ns apart, the oracle's), no plan is faster: the annealing
    (ANNEAL_SHARE of the plans) stops after GIVE_UP_EVALS scored plans, or GIVE_UP_SHARE of its
    share when that is more (after its fall back to the given plan had its turn), and no polish
    follows: with 200 plans its 100 end first."""
    import fxsched.heuristics.stream_plan as sp

    p = two_gathers()
    base = plan_search(p, Schedule(Schedule.original(p).order, (("x1", "x2"),)), budget_bytes=1 << 20, max_evals=50)
    assert simulate(p, base).makespan_ns == 6120
    moves: list[object] = []
    real = sp._neighbour

    def counted(*args):
        move = real(*args)
        if move is not None:
            moves.append(move)
        return move

    monkeypatch.setattr(sp, "_neighbour", counted)
    assert plan_search(p, base, budget_bytes=1 << 20, max_evals=max_evals) is base
    scored = {200: 100, 1000: 250, 10_000: 2500}[max_evals]
    anneal = sp.ANNEAL_SHARE * max_evals
    assert scored == min(anneal, max(sp.GIVE_UP_EVALS, sp.GIVE_UP_SHARE * anneal))
    assert len(moves) == scored - len(sp.COARSE_PIECES)  # the coarse plans count as scored


def four_gradients(sizes: tuple[int, ...] = (10, 10, 20, 20)) -> ScheduleProblem:
    """a_i (100 ns) makes g_i, reduce-scattered by r_i (``sizes[i]`` input bytes); waits at the end."""
    n = len(sizes)
    ops = []
    for i, size in enumerate(sizes, 1):
        ops += [compute(f"a{i}", 100, allocates=[f"g{i}"]),
                coll(f"r{i}", kind=RS, runtime_ns=1000, bytes_in=size, deps=[f"a{i}"], uses=[f"g{i}"])]
    ops += [wait(f"w{i}", f"r{i}") for i in range(1, n + 1)]
    return _problem(ops, [storage(f"g{i}", s) for i, s in enumerate(sizes, 1)])


def test_coarse_plan_cuts_equal_bytes() -> None:
    """60 bytes in r1..r4 (10, 10, 20, 20); a run closes once it holds the target. Two pieces (30):
    r1 r2 r3 (40), r4. Three (20): r1 r2, r3, r4. One: all four."""
    frame = _Frame(four_gradients(), multi_dtype=False, cap_bytes=None)
    assert frame.lists == [("r1", "r2", "r3", "r4")]
    assert coarse_plan(frame, 2) == (((0, 0, 3), (0, 3, 4)),)
    assert coarse_plan(frame, 3) == (((0, 0, 2), (0, 2, 3), (0, 3, 4)),)
    assert coarse_plan(frame, 1) == (((0, 0, 4),),)


def test_coarse_plan_closes_a_run_the_cap_refuses() -> None:
    """A 30-byte cap: r1 r2 (20) fits, r1 r2 r3 (40) does not, nor r3 r4 (40): r1 r2, r3, r4."""
    frame = _Frame(four_gradients(), multi_dtype=False, cap_bytes=30)
    assert coarse_plan(frame, 1) == (((0, 0, 2), (0, 2, 3), (0, 3, 4)),)


def test_anneals_from_the_coarse_plan_and_falls_back(monkeypatch) -> None:
    """two_gradients at a 79-byte budget: the one bucket (1241 ns, 80 bytes) is a byte over, priced
    below the lone reduce-scatters (2140 ns), so the annealing starts there. Nothing within the
    budget beats the start, so after COARSE_SHARE of its plans (of its 40: the 12 coarse plans
    are fewer) it goes back to the given plan, and it returns the given schedule."""
    import fxsched.heuristics.stream_plan as sp

    p = two_gradients()
    base = Schedule.original(p)
    seen: list[object] = []
    real = sp._neighbour
    monkeypatch.setattr(sp, "_neighbour", lambda frame, plan, *a: seen.append(plan) or real(frame, plan, *a))
    assert plan_search(p, base, budget_bytes=79, max_evals=80) is base
    assert seen[0] == (((0, 0, 2),),)
    assert (((0, 0, 1), (0, 1, 2)),) in seen[1:]
