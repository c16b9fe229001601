"""The local memory repair (heuristics/memory_repair.py) and its use by overlap_schedule.

Hand-built problems: every timeline and memory number is derived by hand from DESIGN.md's
execution model (one compute stream in program order, one FIFO comm stream per group, a wait
stalls until its collective ends; memory allocated at issue, freed after the last use, a
collective's input live until its wait, params never freed). Frame (heuristics/placement.py):
slot k is the gap before backbone op k; just_in_time's slack is int(0.05 * runtime).

Properties, over the random problems of tests/solver/random_dags.py (hypothesis and seeded):
- overlap_schedule with the repair is valid, and never worse than without it for the same
  budget, for every policy and with greedy buckets: when the unrepaired result fits, the
  repaired one fits and is no slower; otherwise it fits, or it is the unrepaired result itself
  (the repair only adds fitting candidates);
- repair_memory from the most aggressive slots (every collective issued at its earliest slot,
  waited at its need) returns a valid schedule whose simulation is the one it reports, within
  the budget whenever it says it fits, and the same schedule on a second call.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from fxsched.heuristics.bucketing import bucket_greedy
from fxsched.heuristics.memory_repair import repair_memory
from fxsched.heuristics.overlap import OverlapConfig, overlap_schedule
from fxsched.heuristics.placement import Placement
from fxsched.solver import Schedule, ScheduleProblem, check_schedule, simulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.solver.random_dags import problems, random_problem
from tests.solver.solver_builders import RS, coll, compute, make_problem, storage, wait

SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICIES = ("auto", "just_in_time", "early", "keep")


# ---- one prefetch over the loss gradient's temporaries ------------------------------------------

def loss_problem() -> ScheduleProblem:
    """The start of a backward pass in miniature. L (100) allocates the loss temporary T (1000),
    M (100) reads it last; X (200) is independent; c (200, group A) gathers param W (10) into G
    (100), read by Y (100); c2 (150, group B) gathers param W2 (10) into G2 (5), read by Z (100).
    Original order L, M, X, c, w, Y, c2, w2, Z."""
    return make_problem([
        compute("L", 100, allocates=["T"]),
        compute("M", 100, uses=["T"]),
        compute("X", 200),
        coll("c", runtime_ns=200, uses=["W"], allocates=["G"]),
        wait("w", "c", uses=["G"]),
        compute("Y", 100, deps=["w"], uses=["G"]),
        coll("c2", "B", runtime_ns=150, uses=["W2"], allocates=["G2"]),
        wait("w2", "c2", uses=["G2"]),
        compute("Z", 100, deps=["w2", "Y"], uses=["G2"]),
    ], [storage("W", 10, param=True), storage("W2", 10, param=True), storage("T", 1000),
        storage("G", 100), storage("G2", 5)])


def test_the_prefetch_over_the_peak_is_issued_after_it() -> None:
    """Original: c 400-600, w stalls 200, Y 600-700, c2 700-850, w2 stalls 150, Z 850-950:
    exposed 350, makespan 950. Memory: params 20 + T over L and M: 1020 (the budget); later at
    most 20 + 100 + 5.
    Frame: backbone L, M, X, Y, Z, clock (0, 100, 200, 400, 500, 600); c needs slot 3, c2 slot 4.
    just_in_time: c ends by 400 - 10, starts by 190: slot 1 (clock 100), so G is live over M:
    1120 > 1020; c2 starts by 500 - 7 - 150 = 343: slot 2 (after M). early issues c at slot 0
    (over at L and M), keep at its original slot 3 (the original order, 950), and no other rung
    moves c, so without the repair the original order comes back.
    Repair: only c's buffer spans the over-budget position M. Issued at the slot after it
    (slot 2, wait kept at 3): c 200-400 beside X, w at 400 no stall; c2 (group B) 200-350, w2 at
    500 no stall: exposed 0, makespan 600 = compute alone; memory L, M 1020, then 120, 125.
    Issuing c at its original slot 3 instead frees the same bytes at the cost of a 200 stall."""
    p = loss_problem()
    r0 = simulate(p)
    assert (r0.exposed_ns, r0.makespan_ns, r0.peak_memory_bytes) == (350, 950, 1020)

    old = overlap_schedule(p, config=OverlapConfig(repair_memory=False))
    assert simulate(p, old).makespan_ns == 950

    sched = overlap_schedule(p)
    assert check_schedule(p, sched) == []
    r = simulate(p, sched)
    assert sched.order == ("L", "M", "c", "c2", "X", "w", "Y", "w2", "Z")
    assert (r.exposed_ns, r.makespan_ns, r.peak_memory_bytes) == (0, 600, 1020)
    assert r.memory_curve == (1020, 1020, 120, 125, 125, 125, 125, 25, 25)
    t = {c.name: c for c in r.collectives}
    assert (t["c"].start_ns, t["c"].end_ns, t["c"].wait_ns) == (200, 400, 400)
    assert (t["c2"].start_ns, t["c2"].end_ns, t["c2"].wait_ns) == (200, 350, 500)


def test_the_repair_is_free_when_the_unlimited_rung_had_slack() -> None:
    """With an unlimited budget the same heuristic keeps c at slot 1 (peak 1120) and also reaches
    600: the repair cost nothing here, and the repaired schedule fits the original peak."""
    p = loss_problem()
    big = simulate(p, overlap_schedule(p, config=OverlapConfig(memory_budget_bytes=10**9)))
    assert (big.makespan_ns, big.peak_memory_bytes) == (600, 1120)


# ---- a sunk wait holds a reduce_scatter input over the peak --------------------------------------

def rs_problem() -> ScheduleProblem:
    """g (100, heavy) makes X (1000); rs (50): X -> O (500); E (100); D (100) makes Y (1000);
    F (100) reads O and Y. Original order g, rs, w, E, D, F.
    Frame: backbone g, E, D, F, clock (0, 100, 200, 300, 400); rs: earliest 1, need 3."""
    return make_problem([
        compute("g", 100, allocates=["X"], heavy=True),
        coll("rs", kind=RS, runtime_ns=50, deps=["g"], uses=["X"], allocates=["O"]),
        wait("w", "rs", uses=["O"]),
        compute("E", 100),
        compute("D", 100, allocates=["Y"]),
        compute("F", 100, deps=["w", "D"], uses=["O", "Y"]),
    ], [storage("X", 1000), storage("O", 500), storage("Y", 1000)])


def test_a_wait_pulled_before_the_peak_frees_the_input() -> None:
    """Slots issue 2, wait 3: g, E, rs, D, w, F. rs 200-250, w at 300 no stall: makespan 400.
    Memory 1000, 1000, 1500, 2500 (D: X + O + Y), 2500 (w: X freed after it), 1500: over at D
    and w. Moves: the wait before D (slot 2): g, E, rs, w, D, F: w stalls 50, makespan 450,
    memory 1000, 1000, 1500, 1500, 1500, 1500: fits. Issuing later (slot 3, after D) keeps X
    live over D anyway (its last reader is rs) and adds O there: more excess, rejected."""
    p = rs_problem()
    out = repair_memory(Placement(p), {"rs": 2}, {"rs": 3}, 1500)
    assert out is not None and out.fits
    assert out.schedule.order == ("g", "E", "rs", "w", "D", "F")
    assert (out.result.makespan_ns, out.result.peak_memory_bytes) == (450, 1500)
    assert out.result.memory_curve == (1000, 1000, 1500, 1500, 1500, 1500)
    assert out.moves == 1
    assert check_schedule(p, out.schedule) == []


def test_an_unreachable_budget_is_reported() -> None:
    """Budget 1000: at rs, X (its input) and O (its output) are both live in any order (1500),
    so no move fits; the repair says so and returns the lowest state it reached (peak 1500)."""
    p = rs_problem()
    out = repair_memory(Placement(p), {"rs": 2}, {"rs": 3}, 1000)
    assert out is not None and not out.fits
    assert out.result.peak_memory_bytes == 1500
    assert check_schedule(p, out.schedule) == []


def test_a_passed_deadline_stops_the_repair_before_its_first_move() -> None:
    """loss_problem's just_in_time slots (c at slot 1, over the budget at M: 1120 > 1020): with
    no deadline the repair moves c past M and fits (the test above); with a deadline already
    passed it simulates the given slots once, moves nothing and says it does not fit."""
    p = loss_problem()
    slots = ({"c": 1, "c2": 2}, {"c": 3, "c2": 4})
    assert repair_memory(Placement(p), *slots, 1020).fits
    out = repair_memory(Placement(p), *slots, 1020, deadline=0.0)
    assert out is not None and not out.fits
    assert (out.moves, out.simulations, out.result.peak_memory_bytes) == (0, 1, 1120)


def test_a_passed_deadline_leaves_overlap_schedule_its_first_rung() -> None:
    """overlap_schedule past its deadline scores one rung and stops: the first (just_in_time, no
    in-flight limit) puts c at slot 1, over the budget, and is neither repaired nor followed by
    another rung; nothing fits, so the original order (950, which fits) comes back where no
    deadline gives 600 (test_the_prefetch_over_the_peak_is_issued_after_it)."""
    p = loss_problem()
    sched = overlap_schedule(p, deadline=0.0)
    assert sched == Schedule.original(p)
    assert simulate(p, sched).makespan_ns == 950


def test_slots_outside_the_frame_give_none() -> None:
    """rs may be waited no later than slot 3 (F reads it): slot 4 does not assemble."""
    assert repair_memory(Placement(rs_problem()), {"rs": 2}, {"rs": 4}, 1500) is None


# ---- properties -----------------------------------------------------------------------------------

def check_never_worse(p: ScheduleProblem, permille: int) -> None:
    budget = simulate(p).peak_memory_bytes * permille // 1000
    for policy in POLICIES:
        new = overlap_schedule(p, config=OverlapConfig(policy=policy, memory_budget_bytes=budget))
        old = overlap_schedule(p, config=OverlapConfig(policy=policy, memory_budget_bytes=budget,
                                                       repair_memory=False))
        assert check_schedule(p, new) == [], policy
        r_new, r_old = simulate(p, new), simulate(p, old)
        if r_old.peak_memory_bytes <= budget:
            assert r_new.peak_memory_bytes <= budget, policy
            assert r_new.makespan_ns <= r_old.makespan_ns, policy
        else:
            assert r_new.peak_memory_bytes <= budget or new == old, policy
    buckets = bucket_greedy(p, cap_bytes=1 << 40)
    if buckets:  # a bucket moves as one unit
        new = overlap_schedule(p, buckets, config=OverlapConfig(memory_budget_bytes=budget))
        old = overlap_schedule(p, buckets, config=OverlapConfig(memory_budget_bytes=budget, repair_memory=False))
        assert check_schedule(p, new) == []
        r_new, r_old = simulate(p, new), simulate(p, old)
        if r_old.peak_memory_bytes <= budget:
            assert r_new.peak_memory_bytes <= budget
            assert r_new.makespan_ns <= r_old.makespan_ns
        else:
            assert r_new.peak_memory_bytes <= budget or new == old


def aggressive_slots(p: ScheduleProblem) -> tuple[Placement, dict[str, int], dict[str, int]]:
    """Every collective issued at its earliest slot and waited at its need."""
    pl = Placement(p)
    return pl, {c: u.earliest for c, u in pl.units.items()}, {c: u.need for c, u in pl.units.items()}


def check_direct_repair(p: ScheduleProblem, permille: int) -> None:
    budget = simulate(p).peak_memory_bytes * permille // 1000
    pl, issue, wait_ = aggressive_slots(p)
    out = repair_memory(pl, issue, wait_, budget)
    if out is None:  # a reader of a wait pushed past a need: nothing to repair
        return
    assert check_schedule(p, out.schedule) == []
    r = simulate(p, out.schedule)
    assert (r.makespan_ns, r.peak_memory_bytes) == (out.result.makespan_ns, out.result.peak_memory_bytes)
    assert out.fits == (r.peak_memory_bytes <= budget)
    again = repair_memory(pl, issue, wait_, budget)
    assert again is not None and again.schedule == out.schedule


@SETTINGS
@given(problems(), st.integers(500, 1500))
def test_repair_is_never_worse(p: ScheduleProblem, permille: int) -> None:
    check_never_worse(p, permille)


@SETTINGS
@given(problems(), st.integers(500, 1500))
def test_direct_repair_is_valid_and_within_budget(p: ScheduleProblem, permille: int) -> None:
    check_direct_repair(p, permille)


@pytest.mark.parametrize("check", [check_never_worse, check_direct_repair])
def test_repair_properties_on_seeded_problems(check: Callable[[ScheduleProblem, int], None]) -> None:
    for seed in range(100):
        rng = random.Random(seed)
        check(random_problem(rng, name=f"seed{seed}"), rng.randint(500, 1500))

