"""overlap_schedule (heuristics/overlap.py) on hand-built problems.

Every timeline and memory number is derived by hand from DESIGN.md's execution model (in the
docstrings): one compute stream in program order, one FIFO comm stream per group, a collective
starts once the compute before it has finished and its group is free, a wait stalls until its
collective ends. Memory: allocated at issue, freed after the last use, a collective's input live
until its wait, params and ``keep`` storages never freed. just_in_time's slack is
int(runtime * 0.05): 7 for a 150 ns collective, 5 for 100 ns, 2 for 50 ns.
"""

from __future__ import annotations

import logging

import pytest
from fxsched.heuristics.classic import sink_waits
from fxsched.heuristics.overlap import OverlapConfig, original_peak, overlap_schedule
from fxsched.solver import (
    Schedule,
    ScheduleProblem,
    SimResult,
    check_schedule,
    simulate,
)

from tests.heuristics.test_classic import cast_problem, rs_output_problem, simple_problem
from tests.solver.solver_builders import RS, coll, compute, make_problem, storage, wait

BIG = 10**9  # a memory budget nothing reaches


def run(p: ScheduleProblem, **config: object) -> tuple[Schedule, SimResult]:
    sched = overlap_schedule(p, config=OverlapConfig(**config))  # type: ignore[arg-type]
    assert check_schedule(p, sched) == []
    return sched, simulate(p, sched)


def before(order: tuple[str, ...], a: str, b: str) -> bool:
    return order.index(a) < order.index(b)


# ---- prefetch hides a collective ---------------------------------------------------------------

def prefetch_problem() -> ScheduleProblem:
    """A (100) -> B (100) -> C (100); c (150) gathers param W (10) into G (100), which C reads.
    Original order A, B, c, w, C."""
    return make_problem([
        compute("A", 100),
        compute("B", 100, deps=["A"]),
        coll("c", runtime_ns=150, uses=["W"], allocates=["G"]),
        wait("w", "c", uses=["G"]),
        compute("C", 100, deps=["B", "w"], uses=["G"]),
    ], [storage("W", 10, param=True), storage("G", 100)])


def test_prefetch_hides_a_collective() -> None:
    """Original: A 0-100, B 100-200, c issued at 200 runs 200-350, w stalls 150, C 350-450:
    exposed 150, makespan 450. Memory: W 10, + G 100 from c on: peak 110.
    Frame: backbone A, B, C; clock (0, 100, 200, 300); c: earliest 0, need 2 (C).
    just_in_time: end by 200 - 7 = 193, start by 43: slot 0 (clock[1] = 100 > 43). Wait at need.
    So c, A, B, w, C: c 0-150, A 0-100, B 100-200, w at 200 (no stall), C 200-300.
    exposed 0, makespan 300 = compute only; peak 110 (G from the first op on; nothing else)."""
    p = prefetch_problem()
    r0 = simulate(p)
    assert (r0.exposed_ns, r0.makespan_ns, r0.peak_memory_bytes) == (150, 450, 110)
    sched, r = run(p)
    assert sched.order == ("c", "A", "B", "w", "C")
    assert (r.exposed_ns, r.makespan_ns, r.peak_memory_bytes) == (0, 300, 110)
    (t,) = r.collectives
    assert (t.start_ns, t.end_ns, t.wait_ns) == (0, 150, 200)


# ---- just_in_time vs early ---------------------------------------------------------------------

def jit_problem() -> ScheduleProblem:
    """A (100, allocates a 1000-byte temp T nobody reads), B, C (100 each), D (100) reads G.
    c (150) gathers param W (10) into G (100). Original order A, B, C, c, w, D."""
    return make_problem([
        compute("A", 100, allocates=["T"]),
        compute("B", 100),
        compute("C", 100),
        coll("c", runtime_ns=150, uses=["W"], allocates=["G"]),
        wait("w", "c", uses=["G"]),
        compute("D", 100, deps=["w"], uses=["G"]),
    ], [storage("W", 10, param=True), storage("T", 1000), storage("G", 100)])


def test_just_in_time_issues_late_early_issues_first() -> None:
    """Original: c 300-450, w stalls 150: exposed 150. Memory: A 10 + 1000, then 10 (+ 100 from c):
    peak 1010. Frame: backbone A, B, C, D, clock (0, 100, 200, 300, 400); c: earliest 0, need 3.
    just_in_time: end by 300 - 7 = 293, start by 143: slot 1 (clock 100). A, c, B, C, w, D:
      c 100-250, w at 300 no stall; exposed 0, makespan 400. Memory: A 1010 (G not yet), then 110.
    early: slot 0 (its earliest). c, A, ...: c 0-150, exposed 0, makespan 400; at A: W + G + T = 1110.
    Same exposed time; just_in_time's peak is lower (1010 < 1110)."""
    p = jit_problem()
    r0 = simulate(p)
    assert (r0.exposed_ns, r0.peak_memory_bytes) == (150, 1010)
    jit, rj = run(p, policy="just_in_time", memory_budget_bytes=BIG)
    early, re_ = run(p, policy="early", memory_budget_bytes=BIG)
    assert jit.order.index("c") == 1 and jit.order[:2] == ("A", "c")
    assert early.order[0] == "c"
    assert rj.exposed_ns == re_.exposed_ns == 0
    assert rj.makespan_ns == re_.makespan_ns == 400
    assert (rj.peak_memory_bytes, re_.peak_memory_bytes) == (1010, 1110)
    assert rj.peak_memory_bytes <= re_.peak_memory_bytes


def test_auto_keeps_the_lower_peak_on_equal_makespan() -> None:
    """Both policies reach makespan 400 (above); auto keeps (makespan, peak) smallest: the
    just_in_time schedule with 1010, under a large budget and under the default one (1010)."""
    p = jit_problem()
    jit, _ = run(p, policy="just_in_time", memory_budget_bytes=BIG)
    for budget in (BIG, None):
        sched, r = run(p, memory_budget_bytes=budget)
        assert sched == jit
        assert (r.makespan_ns, r.peak_memory_bytes) == (400, 1010)


def test_early_that_does_not_fit_the_default_budget_keeps_the_original() -> None:
    """policy="early" alone, without the memory repair: every rung issues c at slot 0, peak
    1110 > budget 1010 (the original peak); the original order fits, so it is returned."""
    p = jit_problem()
    sched, r = run(p, policy="early", repair_memory=False)
    assert sched == Schedule.original(p)
    assert r.exposed_ns == 150


def test_early_that_does_not_fit_the_default_budget_is_repaired() -> None:
    """policy="early" with the repair (default): the rung c, A, B, C, w, D is over only at A
    (10 + 100 + 1000 = 1110). c's buffer G spans A, so the repair issues it at the slot after A
    (slot 1), its wait staying at slot 3: A, c, B, C, w, D. c 100-250, w at 300 no stall:
    exposed 0, makespan 400. Memory: A 1010 (G not yet), then T is gone: 110. Peak 1010."""
    p = jit_problem()
    sched, r = run(p, policy="early")
    assert sched.order == ("A", "c", "B", "C", "w", "D")
    assert (r.exposed_ns, r.makespan_ns, r.peak_memory_bytes) == (0, 400, 1010)


@pytest.mark.parametrize(("limit", "slot_op"), [(250, "A"), (0, "C")])
def test_early_prefetch_limit(limit: int, slot_op: str) -> None:
    """early with prefetch_limit_ns: issue at the first slot whose clock is >= clock[need] - limit.
    limit 250: 300 - 250 = 50, first clock >= 50 is slot 1 (after A): exposed 0.
    limit 0: 300, slot 3 (after C): c 300-450, w at 300 stalls 150."""
    p = jit_problem()
    sched, r = run(p, policy="early", prefetch_limit_ns=limit, memory_budget_bytes=BIG)
    k = sched.order.index("c")
    assert sched.order[k - 1] == slot_op
    assert r.exposed_ns == (0 if limit == 250 else 150)


# ---- FIFO per process group --------------------------------------------------------------------

def fifo_problem(group_y: str = "A") -> ScheduleProblem:
    """cx (100) gathers Wx into Gx, read by C; cy (100) gathers Wy into Gy, read by B.
    Original order cx, cy, A (100), wy, B (100), wx, C (100): cx is issued first but needed last."""
    return make_problem([
        coll("cx", "A", runtime_ns=100, uses=["Wx"], allocates=["Gx"]),
        coll("cy", group_y, runtime_ns=100, uses=["Wy"], allocates=["Gy"]),
        compute("A", 100),
        wait("wy", "cy", uses=["Gy"]),
        compute("B", 100, deps=["A", "wy"], uses=["Gy"]),
        wait("wx", "cx", uses=["Gx"]),
        compute("C", 100, deps=["B", "wx"], uses=["Gx"]),
    ], [storage("Wx", 10, param=True), storage("Wy", 10, param=True), storage("Gx", 100),
        storage("Gy", 100)])


def test_fifo_the_collective_needed_first_is_issued_first() -> None:
    """Original (one group): cx 0-100, cy 100-200 behind it; A 0-100, wy at 100 stalls 100,
    B 200-300, wx no stall, C 300-400: exposed 100. Peak: params 20 + Gx + Gy = 220.
    Frame: backbone A, B, C, clock (0, 100, 200, 300); cy need 1, cx need 2: cy goes first.
    just_in_time: cx ends by 200 - 5 = 195, starts by 95: slot 0; cy ends by min(100 - 5, 95) = 95:
    slot 0. Order cy, cx, A, wy, B, wx, C: cy 0-100, cx 100-200, wy at 100 no stall (cx still
    runs until 200: the wait does not drain it), B 100-200, wx at 200 no stall, C 200-300.
    exposed 0, makespan 300, peak 220."""
    p = fifo_problem()
    r0 = simulate(p)
    assert (r0.exposed_ns, r0.makespan_ns, r0.peak_memory_bytes) == (100, 400, 220)
    sched, r = run(p)
    assert sched.order == ("cy", "cx", "A", "wy", "B", "wx", "C")
    assert (r.exposed_ns, r.makespan_ns, r.peak_memory_bytes) == (0, 300, 220)
    t = {c.name: c for c in r.collectives}
    assert (t["cy"].start_ns, t["cy"].end_ns, t["cy"].wait_ns) == (0, 100, 100)
    assert (t["cx"].start_ns, t["cx"].end_ns) == (100, 200)
    assert t["cx"].end_ns > t["cy"].wait_ns


def blocked_first_problem() -> ScheduleProblem:
    """c0 (100, group A) gathers W0 into G0; cy (100, group B) reads w0's output, X (100) reads
    cy's; cx (300, group B) gathers W1, read by Z after Y (100). Original order c0, w0, cy, wy, X,
    cx, Y, wx, Z."""
    return make_problem([
        coll("c0", "A", runtime_ns=100, uses=["W0"], allocates=["G0"]),
        wait("w0", "c0", uses=["G0"]),
        coll("cy", "B", runtime_ns=100, deps=["w0"], uses=["G0"], allocates=["Gy"]),
        wait("wy", "cy", uses=["Gy"]),
        compute("X", 100, deps=["wy"], uses=["Gy"]),
        coll("cx", "B", runtime_ns=300, uses=["W1"], allocates=["Gx"]),
        compute("Y", 100),
        wait("wx", "cx", uses=["Gx"]),
        compute("Z", 100, deps=["wx"], uses=["Gx"]),
    ], [storage("W0", 10, param=True), storage("W1", 10, param=True), storage("G0", 100),
        storage("Gy", 100), storage("Gx", 100)])


def test_fifo_the_needed_first_goes_first_even_behind_a_wait() -> None:
    """Original: c0 0-100, w0 stalls 100, cy 100-200, wy stalls 100, X 200-300, cx 300-600,
    Y 300-400, wx stalls 200, Z 600-700. Frame: backbone X, Y, Z; c0: [0, 0] (cy reads w0),
    cy: [0, 0], cx: [0, 2]. Lower bound: X starts >= 200 (c0 then cy), X, Y, Z take 300, and if cy
    precedes cx on group B, cx ends >= 500, so Z starts >= 500: 600. Reached by c0, w0, cy, cx,
    wy, X, Y, wx, Z: cy 100-200, cx 200-500, wy stalls to 200, X 200-300, Y 300-400, wx stalls to
    500, Z 500-600. With cx issued first, cx 0-300, cy 300-400, X 400-500, Z ends 700."""
    p = blocked_first_problem()
    assert simulate(p).makespan_ns == 700
    sched, r = run(p, memory_budget_bytes=BIG)
    assert before(sched.order, "cy", "cx")
    assert r.makespan_ns == 600


def two_group_problem(group_b: str) -> ScheduleProblem:
    """ca (150) and cb (150) gather params into Ga, Gb, both read by Z; X (100), Y (100) before Z.
    Original order X, Y, ca, cb, wa, wb, Z."""
    return make_problem([
        compute("X", 100),
        compute("Y", 100),
        coll("ca", "A", runtime_ns=150, uses=["Wa"], allocates=["Ga"]),
        coll("cb", group_b, runtime_ns=150, uses=["Wb"], allocates=["Gb"]),
        wait("wa", "ca", uses=["Ga"]),
        wait("wb", "cb", uses=["Gb"]),
        compute("Z", 100, deps=["wa", "wb"], uses=["Ga", "Gb"]),
    ], [storage("Wa", 10, param=True), storage("Wb", 10, param=True), storage("Ga", 100),
        storage("Gb", 100)])


def test_two_groups_run_in_parallel() -> None:
    """Groups A and B. Original: ca and cb both 200-350 in parallel, wa stalls 150: exposed 150.
    Frame: backbone X, Y, Z; clock (0, 100, 200, 300); both need slot 2. Each group alone:
    end by 200 - 7 = 193, start by 43: slot 0. Both run 0-150 in parallel; waits at 200: exposed 0,
    makespan 300."""
    p = two_group_problem("B")
    assert simulate(p).exposed_ns == 150
    sched, r = run(p)
    assert sched.order[:2] == ("ca", "cb")
    assert (r.exposed_ns, r.makespan_ns) == (0, 300)
    assert [(c.start_ns, c.end_ns) for c in r.collectives] == [(0, 150), (0, 150)]


def test_one_group_serializes_the_same_pair() -> None:
    """Both on group A. Original: ca 200-350, cb 350-500, wa stalls 150, wb 150: exposed 300.
    FIFO plan (need tie, original order): cb ends by 193, starts by 43: slot 0; ca ends by 43:
    slot 0. ca 0-150, cb 150-300; wa at 200 no stall, wb stalls 100: exposed 100, makespan 400."""
    p = two_group_problem("A")
    assert simulate(p).exposed_ns == 300
    sched, r = run(p)
    assert sched.order[:2] == ("ca", "cb")
    assert (r.exposed_ns, r.makespan_ns) == (100, 400)
    assert [(c.start_ns, c.end_ns) for c in r.collectives] == [(0, 150), (150, 300)]


# ---- prefetch limited by memory: the max-in-flight rung ------------------------------------------

def staged_problem() -> ScheduleProblem:
    """Two gathers, each behind a 0 ns cast of its param into a 1000-byte staging buffer:
    cast_i: W_i (param, 10) -> S_i (1000); ag_i (150): S_i -> G_i (100). A (200) allocates a
    1000-byte temp T nobody reads; B (100) reads G1; C (100) reads G2.
    Original order: A, cast1, ag1, w1, B, cast2, ag2, w2, C."""
    ops = [compute("A", 200, allocates=["T"])]
    for i, user in ((1, "B"), (2, "C")):
        ops += [
            compute(f"cast{i}", 0, uses=[f"W{i}"], allocates=[f"S{i}"]),
            coll(f"ag{i}", runtime_ns=150, deps=[f"cast{i}"], uses=[f"S{i}"], allocates=[f"G{i}"]),
            wait(f"w{i}", f"ag{i}", uses=[f"G{i}"]),
            compute(user, 100, deps=[f"w{i}", "A" if i == 1 else "B"], uses=[f"G{i}"]),
        ]
    return make_problem(ops, [
        storage("W1", 10, param=True), storage("W2", 10, param=True), storage("T", 1000),
        storage("S1", 1000), storage("S2", 1000), storage("G1", 100), storage("G2", 100)])


def test_prefetch_limited_by_memory() -> None:
    """Original: A 0-200, ag1 200-350 (w1 stalls 150), B 350-450, ag2 450-600 (w2 stalls 150),
    C 600-700: exposed 300. Memory (params 20): A 1020, cast1 1020, ag1 1120, w1 1120, B 120,
    cast2 1020, ag2 1120, w2 1120, C 120: peak 1120.
    Frame: backbone A, B, C, clock (0, 200, 300, 400); ag1 need 1, ag2 need 2, both earliest 0.
    ag2 starts by 300 - 7 - 150 = 143 and ag1 by min(200 - 7, 143) - 150 < 0: both slot 0.
    Large budget: cast1, ag1, cast2, ag2, A, w1, B, w2, C: ag1 0-150, ag2 150-300, A 0-200,
      w1 at 200 and w2 at 300 stall 0: exposed 0. Peak at A: 20 + 2 * (1000 + 100) + 1000 = 3220.
    Budget 2120: every rung but max-in-flight 1 holds both staging buffers over A (3220). In-flight
      1 waits the oldest (w1) before issuing ag2 in slot 1: cast1, ag1, A, w1, cast2, ag2, B, w2, C.
      Memory: A 20 + 1100 + 1000 = 2120; w1 frees S1 (T is gone too); cast2 + ag2: 20 + 100 + 1100
      = 1220: peak 2120 <= 2120. Timeline: ag1 0-150, A 0-200, w1 at 200 no stall, ag2 issued at
      200 runs 200-350, B 200-300, w2 at 300 stalls 50: exposed 50 > 0, makespan 450 (better than
      the original's 700, so it is kept). (At commit e5ca129 ag2 was emitted before w1 in that
      slot: peak 2220, so the original order came back.)"""
    p = staged_problem()
    r0 = simulate(p)
    assert (r0.exposed_ns, r0.makespan_ns, r0.peak_memory_bytes) == (300, 700, 1120)

    big, rb = run(p, memory_budget_bytes=BIG)
    assert big.order[:4] == ("cast1", "ag1", "cast2", "ag2")
    assert (rb.exposed_ns, rb.peak_memory_bytes) == (0, 3220)

    tight, rt = run(p, memory_budget_bytes=2120)
    assert (rt.exposed_ns, rt.makespan_ns, rt.peak_memory_bytes) == (50, 450, 2120)
    assert tight.order == ("cast1", "ag1", "A", "w1", "cast2", "ag2", "B", "w2", "C")
    assert rb.exposed_ns < rt.exposed_ns


# ---- reduce_scatter into a graph output: the on_completion rung ---------------------------------

def test_sunk_wait_keeps_the_reduce_scatter_input_live() -> None:
    """Original: g 1000, rs 1500, w 1500 (X freed after), E 500, D 1500: peak 1500; rs 100-150,
    w at 100 stalls 50: exposed 50. sink_waits: w has no user, so it goes to the end:
    g, rs, E, D, w: X lives to the last op: 1000, 1500, 1500, 2500, 1500; exposed 0."""
    p = rs_output_problem()
    r0 = simulate(p)
    assert (r0.peak_memory_bytes, r0.exposed_ns) == (1500, 50)
    sched = sink_waits(p)
    assert sched.order == ("g", "rs", "E", "D", "w")
    r = simulate(p, sched)
    assert r.memory_curve == (1000, 1500, 1500, 2500, 1500)
    assert r.exposed_ns == 0


def test_reduce_scatter_wait_placed_at_completion_under_the_default_budget() -> None:
    """Frame: backbone g, E, D; clock (0, 100, 200, 300); rs: earliest 1, need 3 (the end).
    Sunk waits (need) put D between rs and w: X + O + Y = 2500 > 1500 for every issue slot
    (just_in_time: start by 300 - 2 - 50 = 248, slot 2; early: slot 1).
    on_completion, early: issued at slot 1 (t = 100), ends at 150: the first slot with clock >= 150
    is 2: g, rs, E, w, D. Memory 1000, 1500, 1500, 1500, 1500 (X freed at w, before Y): peak
    1500 <= 1500. rs 100-150, E 100-200, w at 200 no stall, D 200-300: exposed 0, makespan 300.
    (just_in_time + on_completion: issued at slot 2 ends at 250 -> slot 3: 2500, does not fit.)"""
    p = rs_output_problem()
    sched, r = run(p)
    assert sched.order == ("g", "rs", "E", "w", "D")
    assert (r.peak_memory_bytes, r.exposed_ns, r.makespan_ns) == (1500, 0, 300)
    assert r.peak_memory_bytes <= original_peak(p) == 1500


def test_budget_below_everything_returns_the_lowest_peak_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """Budget 1000 < 1500: at rs, X (1000, its input) and O (500, allocated at issue) are both live
    in any order, so nothing fits. The lowest peak is 1500 (the original, and g, rs, E, w, D above;
    which of the two comes back is a tie-break)."""
    p = rs_output_problem()
    with caplog.at_level(logging.WARNING, logger="fxsched.heuristics.overlap"):
        sched, r = run(p, memory_budget_bytes=1000)
    assert r.peak_memory_bytes == 1500
    assert sched.order in (("g", "rs", "w", "E", "D"), ("g", "rs", "E", "w", "D"))
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1000 bytes is below every schedule tried" in warnings[0].getMessage()


def rs_consumed_problem() -> ScheduleProblem:
    """g (100) makes X (1000); rs (50): X -> O (500); D (100) makes Y (1000); F (100) reads O and Y.
    Original order g, rs, w, D, F."""
    return make_problem([
        compute("g", 100, allocates=["X"]),
        coll("rs", kind=RS, runtime_ns=50, deps=["g"], uses=["X"], allocates=["O"]),
        wait("w", "rs", uses=["O"]),
        compute("D", 100, allocates=["Y"]),
        compute("F", 100, deps=["w", "D"], uses=["O", "Y"]),
    ], [storage("X", 1000), storage("O", 500), storage("Y", 1000)])


def test_nothing_fits_the_default_budget_keeps_the_original(caplog: pytest.LogCaptureFixture) -> None:
    """Original: g 1000, rs 1500, w 1500 (X freed), D 1500, F 1500: peak 1500.
    Frame: backbone g, D, F; clock (0, 100, 200, 300); rs earliest 1, need 2. Every rung issues rs
    at slot 1 (just_in_time: start by 200 - 2 - 50 = 148 -> slot 1) and waits at slot 2 (need, or
    completion at 150 -> first clock >= 150 is slot 2): X is live over D: 2500 > 1500.
    So the original order comes back, without a warning."""
    p = rs_consumed_problem()
    with caplog.at_level(logging.WARNING, logger="fxsched.heuristics.overlap"):
        sched, _ = run(p)
    assert sched == Schedule.original(p)
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def test_budget_below_everything_never_returns_more_than_the_original_peak() -> None:
    """Budget 1000: every rung peaks at 2500 (above), the original at 1500: the lowest peak is the
    original's, and the original order comes back. (At commit e5ca129 the fallback ignored the
    original order and returned a 2500 rung.)"""
    p = rs_consumed_problem()
    sched, r = run(p, memory_budget_bytes=1000)
    assert sched == Schedule.original(p)
    assert r.peak_memory_bytes == 1500


def test_keep_policy_moves_only_the_wait() -> None:
    """policy="keep": each collective stays where the original issued it, only its wait moves.
    A (100) | c (150): W -> G | w | B (100) | C (100) reads G. Original A, c, w, B, C: c 100-250,
    w stalls 150, B 250-350, C 350-450. keep: A, c, B, w, C: B 100-200, w at 200 stalls 50,
    C 250-350: exposed 50, makespan 350. (auto prefetches c before A: c 0-150, w at 200: 0.)"""
    p = simple_problem()
    sched, r = run(p, policy="keep")
    assert sched.order == ("A", "c", "B", "w", "C")
    assert (r.exposed_ns, r.makespan_ns) == (50, 350)
    _, ra = run(p)
    assert ra.exposed_ns == 0


# ---- config ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"policy": "latest"}, {"slack": -0.1}, {"prefetch_limit_ns": -1},
])
def test_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="OverlapConfig"):
        OverlapConfig(**kwargs)  # type: ignore[arg-type]


def test_move_chains_false_leaves_the_cast_behind() -> None:
    """cast (10) feeds only ag (150); A (100), B (100) independent; C reads G. Original A, cast, ag,
    w, B, C. With chains: cast, ag issued before A: cast 0-10, ag 10-160, A 10-110, B 110-210,
    w at 210 no stall: exposed 0. Without: cast is backbone (clock 0, 100, 110, 210, 310), ag's
    earliest is slot 2; start by 210 - 7 - 150 = 53 < clock[2]: slot 2. A 0-100, cast 100-110,
    ag 110-260, B 110-210, w at 210 stalls 50: exposed 50."""
    p = cast_problem()
    with_chain, r1 = run(p)
    without, r2 = run(p, move_chains=False)
    assert with_chain.order == ("cast", "ag", "A", "B", "w", "C")
    assert without.order == ("A", "cast", "ag", "B", "w", "C")
    assert (r1.exposed_ns, r2.exposed_ns) == (0, 50)


def test_assume_bucketed_shortens_a_same_key_successor_by_its_latency() -> None:
    """Backbone X0..X4, 100 each (clock 0, 100, ..., 500). c1, c2: all_gathers on A (same key),
    150 each, inputs ready at the start; X3 reads c1 (need slot 3), X4 reads c2 (need slot 4).
    The comm curve's latency is runtime(0) = 100. just_in_time, slack 0, plans backwards:
      plain:   c2 ends by 400, starts 250 -> slot 2; c1 ends by min(300, 250), starts 100 -> slot 1.
      assumed: c2 counts 150 - 100 = 50: ends by 400, starts 350 -> slot 3; c1 ends by 300,
               starts 150 -> slot 1.
    Simulated without a bucket the assumption costs: c2 issued at 300 runs 300-450, so X4 waits
    50 (exposed 50, makespan 550) where the plain plan hides both (makespan 500)."""
    p = make_problem([
        compute("X0", 100), compute("X1", 100), compute("X2", 100),
        coll("c1", runtime_ns=150), wait("w1", "c1"), compute("X3", 100, deps=["w1"]),
        coll("c2", runtime_ns=150), wait("w2", "c2"), compute("X4", 100, deps=["w2"]),
    ])
    plain, r_plain = run(p, policy="just_in_time", slack=0.0, memory_budget_bytes=BIG)
    assumed, r_assumed = run(p, policy="just_in_time", slack=0.0, memory_budget_bytes=BIG, assume_bucketed=True)
    assert before(plain.order, "X0", "c1") and before(plain.order, "c1", "X1")
    assert before(plain.order, "X1", "c2") and before(plain.order, "c2", "X2")
    assert before(assumed.order, "X0", "c1") and before(assumed.order, "c1", "X1")
    assert before(assumed.order, "X2", "c2") and before(assumed.order, "c2", "X3")
    assert (r_plain.makespan_ns, r_plain.exposed_ns) == (500, 0)
    assert (r_assumed.makespan_ns, r_assumed.exposed_ns) == (550, 50)
