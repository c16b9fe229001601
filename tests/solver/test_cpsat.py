"""CP-SAT scheduler: optimality against the brute-force oracle, exactness against the simulator,
determinism, memory budgets, fallbacks and manual constraints.

Every solve here is deterministic (seed 0, one worker, deterministic time limit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fxsched.heuristics import HEURISTICS
from fxsched.solver import Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig, Status, solve
from fxsched.solver.serialization import problem_from_dict, schedule_to_dict
from oracle import brute_force, default_budget
from tiny_instances import tiny_problems

EXACT = dict(coarsen=False, bucket_window=8, max_bucket_size=8)  # the whole space of a tiny graph
PROBLEMS = tiny_problems(50, seed=3)


@pytest.mark.parametrize("mode", ["free", "fixed"])
@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
def test_optimal_equals_oracle(idx: int, mode: str) -> None:
    """CP-SAT proves optimal exactly the oracle's optimum; its own objective is the simulator's
    makespan of the schedule it returns; no heuristic beats it within the same budget."""
    p = PROBLEMS[idx]
    oracle = brute_force(p, mode=mode)
    res = solve(p, 20, SolveConfig(mode=mode, **EXACT))
    assert oracle.best_makespan_ns is not None
    assert res.status is Status.OPTIMAL, res
    assert res.objective == oracle.best_makespan_ns
    assert res.model_objective == simulate(p, res.schedule).makespan_ns
    assert not check_schedule(p, res.schedule)
    assert res.peak_memory_bytes <= res.budget_bytes == default_budget(p)
    assert res.lower_bound == res.objective and res.gap == 0.0
    if mode == "free":
        for name, h in HEURISTICS.items():
            r = simulate(p, h(p))
            if r.peak_memory_bytes <= res.budget_bytes:
                assert r.makespan_ns >= res.objective, name


def test_pinned_optima_never_regress() -> None:
    """The committed optima (proven by exhaustive enumeration) are met exactly."""
    data = json.loads((Path(__file__).parent / "data" / "pinned_optima.json").read_text())
    for entry in data["entries"]:
        p = problem_from_dict(entry["problem"])
        for mode in ("free", "fixed"):
            want = entry[f"{mode}_optimum_ns"]
            if want is None:
                continue
            res = solve(p, 20, SolveConfig(mode=mode, **EXACT))
            assert res.objective <= want, (p.name, mode)
            assert res.objective == want  # an optimum below the oracle's would be a simulator bug


def test_identical_inputs_give_byte_identical_schedules() -> None:
    for p in PROBLEMS[:6]:
        a = solve(p, 5, SolveConfig(mode="free", workers=2))
        b = solve(p, 5, SolveConfig(mode="free", workers=2))
        assert json.dumps(schedule_to_dict(a.schedule)) == json.dumps(schedule_to_dict(b.schedule))


def test_progress_callback_sees_objective_and_bound() -> None:
    seen = []
    res = solve(PROBLEMS[0], 5, SolveConfig(mode="free", **EXACT), progress=seen.append)
    assert seen, "no progress reported"
    assert all(s.bound_ns <= s.objective_ns for s in seen)
    assert seen[-1].objective_ns == res.model_objective


def test_progress_on_the_neighbourhood_path_speaks_of_the_whole_graph() -> None:
    """A window model's own objective and bound speak of its window only (a free window's objective
    is a sub-problem's makespan; a fixed window that cannot improve "proves" its incumbent). On the
    neighbourhood path the callback sees the incumbent's makespan, never rising, and the
    structural bound the result reports."""
    for mode in ("fixed", "free"):
        seen = []
        res = solve(PROBLEMS[0], 2, SolveConfig(mode=mode, max_order_literals=0, lns_rounds=3, deterministic=True),
                    progress=seen.append)
        assert seen, "no progress reported"
        makespans = [s.objective_ns for s in seen]
        assert makespans == sorted(makespans, reverse=True)
        assert makespans[-1] >= res.objective
        assert all(s.bound_ns == res.lower_bound <= s.objective_ns for s in seen)


def test_memory_budget_ratio_and_bytes() -> None:
    p = PROBLEMS[1]
    peak = simulate(p).peak_memory_bytes
    a = solve(p, 5, SolveConfig(mode="free", memory_budget=1.0, **EXACT))
    b = solve(p, 5, SolveConfig(mode="free", memory_budget=peak, **EXACT))
    assert a.budget_bytes == b.budget_bytes == peak
    assert a.objective == b.objective
    big = solve(p, 5, SolveConfig(mode="free", memory_budget=10.0, **EXACT))
    assert big.objective == brute_force(p, budget_bytes=big.budget_bytes).best_makespan_ns


def test_infeasible_budget_reports_smallest_feasible() -> None:
    """Below the lowest possible peak: INFEASIBLE, no exception, and the lowest peak found,
    which the brute force confirms is the true minimum here."""
    for p in PROBLEMS[:5]:
        res = solve(p, 5, SolveConfig(mode="free", memory_budget=1, **EXACT))
        assert res.status is Status.INFEASIBLE
        assert res.min_feasible_budget_bytes == simulate(p, res.schedule).peak_memory_bytes
        lo = res.min_feasible_budget_bytes
        assert brute_force(p, budget_bytes=lo).best_makespan_ns is not None
        assert brute_force(p, budget_bytes=lo - 1).best_makespan_ns is None


def test_no_time_returns_the_heuristic_with_status() -> None:
    """With (almost) no search time CP-SAT cannot beat the warm start: the heuristic's own
    schedule comes back, marked as such, never something worse."""
    for p in PROBLEMS[:10]:
        res = solve(p, 1e-9, SolveConfig(mode="free", minimize_peak=False, **EXACT))
        assert res.objective <= simulate(p, HEURISTICS["overlap"](p)).makespan_ns
        if res.method.startswith("heuristic:"):  # optimal only when it meets the proven bound
            assert res.status is (Status.OPTIMAL if res.lower_bound == res.objective else Status.HEURISTIC)
        else:
            assert res.status in (Status.FEASIBLE, Status.OPTIMAL)


def test_plan_and_pins_are_obeyed() -> None:
    p = next(q for q in PROBLEMS if len(q.collectives) >= 2 and _bucketable_pair(q))
    pair = _bucketable_pair(p)
    res = solve(p, 5, SolveConfig(mode="free", plan=(pair,), **EXACT))
    assert pair in res.schedule.buckets
    want = brute_force(p, bucketing=True)  # the plan can only cost time
    assert res.objective >= want.best_makespan_ns
    # pin a later op before an earlier, independent one: the reverse of the original order
    a, b = next((x.name, y.name) for i, y in enumerate(p.ops) for x in p.ops[i + 1:]
                if not p.depends_on(x.name, y.name))
    pinned = solve(p, 5, SolveConfig(mode="free", pinned=((a, b),), **EXACT))
    order = pinned.schedule.order
    assert order.index(a) < order.index(b)
    assert pinned.objective >= want.best_makespan_ns


def _bucketable_pair(p) -> tuple[str, str] | None:
    from oracle import valid_bucketings

    for bk in valid_bucketings(p):
        for b in bk:
            if len(b) == 2:
                return tuple(b)  # type: ignore[return-value]
    return None


def test_solve_is_never_worse_than_its_hint() -> None:
    """Given the original order as the hint, the answer is never worse than that order."""
    for p in PROBLEMS[:5]:
        res = solve(p, 5, SolveConfig(mode="free", **EXACT), hint=Schedule.original(p))
        assert res.objective <= simulate(p).makespan_ns


def test_neighbourhood_frame_holds_the_incumbent_exactly() -> None:
    """Around an incumbent (coarsened slots, a radius), the frame keeps the incumbent's own slots,
    so the hint, fixed, is a model solution with the incumbent's simulated makespan."""
    import dataclasses

    from fxsched.solver.cpsat import centers_of, decode, warm_start
    from fxsched.solver.cpsat_frame import build_frame

    cfg = SolveConfig(coarsen_threshold_ns=10**9)  # coarsen hard: few slots besides the centers
    for p in PROBLEMS[:12]:
        budget = default_budget(p)
        _, inc = warm_start(p, budget, cfg)
        full = build_frame(p, cfg.frame_options())
        opts = dataclasses.replace(cfg.frame_options(), centers=centers_of(p, full, inc), radius=1,
                                   bucketing=False, extra=inc.buckets)
        b, s = _held_at(build_frame(p, opts), budget, inc)
        assert simulate(p, decode(b, s)).makespan_ns == simulate(p, inc).makespan_ns


def _held_at(frame, budget: int, inc: Schedule):
    """The frame's makespan model with every decision fixed to ``inc``'s (its hint), solved:
    ``(builder, solver)``; the fixed hint must be a solution."""
    from fxsched.solver.cpsat_hint import hint_values
    from fxsched.solver.cpsat_model import ModelBuilder
    from ortools.sat.python import cp_model

    b = ModelBuilder(frame, budget)
    b.build()
    b.minimize_makespan()
    for var, val in hint_values(b, inc):
        b.model.AddHint(var, val)
    s = cp_model.CpSolver()
    s.parameters.fix_variables_to_their_hinted_value = True
    s.parameters.num_workers = 1
    assert s.Solve(b.model) == cp_model.OPTIMAL, frame.problem.name
    return b, s


def test_neighbourhood_frame_keeps_a_chain_where_the_incumbent_runs_it() -> None:
    """The incumbent runs ag's cast (its producer-only chain) before the heavy A, far from ag:
    ag0 (200 ns) 0..200; cast 0..50; A 50..150; w0 stalls to 200; ag (150 ns) 200..350; w stalls
    to 350; B 350..450. A frame that moves the chain with its issue runs the cast at ag's issue
    instead: A 0..100, w0 stalls to 200, cast 200..250, ag 250..400, B 400..500. The rounds'
    frames (lns_frame_options: chains as the incumbent runs them) keep the cast in the backbone
    and hold the incumbent exactly: 450."""
    import dataclasses

    from fxsched.solver.cpsat import centers_of, decode, lns_frame_options
    from fxsched.solver.cpsat_frame import build_frame
    from solver_builders import coll, compute, make_problem, storage, wait

    p = make_problem([
        coll("ag0", runtime_ns=200, uses=["P"], allocates=["G0"], bytes_in=10, bytes_out=20),
        compute("cast", 50, uses=["W"], allocates=["S"]),
        compute("A", 100, heavy=True),
        wait("w0", "ag0", uses=["G0"]),
        coll("ag", runtime_ns=150, deps=["cast"], uses=["S"], allocates=["G"], bytes_in=10, bytes_out=20),
        wait("w", "ag", uses=["G"]),
        compute("B", 100, deps=["A", "w0", "w"], uses=["G0", "G"], heavy=True),
    ], [storage("P", 10, param=True), storage("W", 10, param=True), storage("S", 10), storage("G0", 20),
        storage("G", 20)])
    inc = Schedule.original(p)
    assert simulate(p, inc).makespan_ns == 450
    cfg = SolveConfig(mode="fixed")

    def held(opts) -> int:
        full = build_frame(p, opts)
        b, s = _held_at(build_frame(p, dataclasses.replace(opts, centers=centers_of(p, full, inc), radius=0)),
                        default_budget(p), inc)
        assert s.Value(b.v.makespan) == simulate(p, decode(b, s)).makespan_ns
        return s.Value(b.v.makespan)

    assert held(cfg.frame_options()) == 500
    assert held(lns_frame_options(cfg)) == 450


@pytest.mark.parametrize("deterministic", [True, False])
def test_large_graph_path_without_collectives(deterministic: bool) -> None:
    """The neighbourhood path on a graph with no collectives returns its (optimal) order."""
    from solver_builders import compute, make_problem

    p = make_problem([compute("a", 100, heavy=True), compute("b", 50, deps=["a"], heavy=True)])
    res = solve(p, 1, SolveConfig(max_order_literals=-1, deterministic=deterministic))
    assert res.objective == 150 and res.status is Status.OPTIMAL


@pytest.mark.parametrize("mode", ["fixed", "free"])
def test_large_graph_path_is_valid_and_never_worse(mode: str) -> None:
    """Forcing the neighbourhood path (tiny max_order_literals), in both modes: a valid schedule
    within the budget, never worse than the warm start, with a bound no higher than the oracle's."""
    for p in PROBLEMS[:6]:
        cfg = SolveConfig(mode=mode, max_order_literals=0, lns_rounds=2)
        res = solve(p, 2, cfg)
        assert check_schedule(p, res.schedule) == []
        assert res.peak_memory_bytes <= res.budget_bytes
        assert res.objective <= simulate(p, HEURISTICS["overlap"](p)).makespan_ns
        assert res.lower_bound <= brute_force(p, mode="free").best_makespan_ns


def test_model_keeps_fifo_between_items_with_disjoint_slots() -> None:
    """Held at the slots of the order c1, x0, c2, h1, w2, d2, h2, w1, d1 (radius 0, so the two
    issues have disjoint slots): c1 (1000 ns) runs 0..1000, c2 (100 ns) waits behind it in the
    group's FIFO, 1000..1100, w2 stalls to 1100, and the makespan is 1170 ns. A model that only
    kept the two off each other's stream (NoOverlap) would run c2 first and claim 1120."""
    import dataclasses

    from fxsched.solver.cpsat import centers_of, decode
    from fxsched.solver.cpsat_frame import build_frame
    from fxsched.solver.cpsat_model import ModelBuilder
    from ortools.sat.python import cp_model
    from solver_builders import coll, compute, make_problem, wait

    p = make_problem([
        coll("c1", runtime_ns=1000, bytes_in=450, bytes_out=450),
        compute("x0", 10, heavy=True),
        coll("c2", runtime_ns=100, bytes_in=0, bytes_out=0),
        compute("h1", 100, heavy=True),
        wait("w2", "c2"),
        compute("d2", 10, deps=["w2"], heavy=True),
        compute("h2", 50, heavy=True),
        wait("w1", "c1"),
        compute("d1", 10, deps=["w1"], heavy=True),
    ])
    inc = Schedule(order=("c1", "x0", "c2", "h1", "w2", "d2", "h2", "w1", "d1"))
    assert simulate(p, inc).makespan_ns == 1170
    cfg = SolveConfig(coarsen=False, bucketing=False)
    full = build_frame(p, cfg.frame_options())
    opts = dataclasses.replace(cfg.frame_options(), centers=centers_of(p, full, inc), radius=0)
    b = ModelBuilder(build_frame(p, opts), None)
    b.build()
    b.minimize_makespan()
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.Solve(b.model) == cp_model.OPTIMAL
    assert s.Value(b.v.makespan) == 1170
    assert simulate(p, decode(b, s)).makespan_ns == 1170


def test_a_run_of_stalled_waits_shows_one_exposed_collective() -> None:
    """Two 30 ns gathers on one group (0..30, 30..60) and 10 ns of independent compute: every
    optimal schedule stalls from 10 to 60 (makespan 65). solve() waits on the later one first, so
    only it is exposed (tests/heuristics/test_concentrate.py derives the problem)."""
    from tests.heuristics.test_concentrate import _two_gathers

    p = _two_gathers()
    for mode in ("fixed", "free"):
        r = solve(p, 2, SolveConfig(mode=mode, **EXACT))
        res = simulate(p, r.schedule)
        assert (r.objective, res.makespan_ns, res.n_hidden_hideable, res.n_hideable) == (65, 65, 1, 2)


def test_deterministic_rounds_fit_the_budget() -> None:
    """A round costs max(MIN_ROUND_S, ROUND_S_PER_ITEM per frame item): 0.003 s x 15,410 items =
    46.2 s (the 80-layer backward) does not fit 30 s, so no round; 1,656 items (4.97 s) fit 12
    times in 60 s, capped at 8 rounds of 7.5 s; a 100-item graph gets one round even on 2 s. Past
    2,000 items a round's seconds shrink in proportion: 46.2 s fits once in 60 s, with
    60 x 2000 / 15410 = 7.79 s of deterministic budget."""
    from fxsched.solver.cpsat import deterministic_rounds

    assert deterministic_rounds(8, 30.0, 15_410) == (0, 0.0)
    assert deterministic_rounds(8, 60.0, 1_656) == (8, 7.5)
    assert deterministic_rounds(8, 2.0, 100) == (1, 2.0)
    rounds, round_s = deterministic_rounds(8, 60.0, 15_410)
    assert rounds == 1 and round_s == pytest.approx(60 * 2000 / 15_410)


def test_warm_start_logs_each_step_with_its_makespan(caplog) -> None:
    """At DEBUG the warm start says each step's time and the makespan of its result; the last
    step's is the returned schedule's. c (500 ns) beside x (100 ns), y (10 ns) needs both: y
    starts no earlier than c ends, so the makespan is at least 500 + 10 = 510 ns, which issuing c
    first reaches (the start already does); no step makes it worse."""
    import logging

    from fxsched.solver.cpsat import warm_start
    from solver_builders import AG, coll, compute, make_problem, wait

    p = make_problem([coll("c", "A", AG, runtime_ns=500), compute("x", 100, heavy=True),
                      wait("w", "c"), compute("y", 10, deps=["w", "x"], heavy=True)])
    with caplog.at_level(logging.DEBUG, logger="fxsched.solver.warm_start"):
        _, sched = warm_start(p, 10**12, SolveConfig(mode="free"))
    steps = [m for m in (r.getMessage() for r in caplog.records) if m.startswith(f"warm start {p.name}: ")
             and "makespan" in m]
    assert len(steps) >= 10  # sink, shift, fill, defer, ... in free mode
    assert all(m.endswith(": makespan 510 ns") for m in steps)
    assert simulate(p, sched).makespan_ns == 510


def test_warm_start_skips_bucketing_when_little_is_exposed(monkeypatch) -> None:
    """c (100 ns) beside x (1,000 ns of independent compute): the unbucketed overlap schedule
    hides it (0 exposed), and buckets can save no more than the exposed time, so the bucketed
    tries are not run. With c at 500 ns and x at 100 ns, 400 ns stay exposed (far over 0.25% of
    the 110 ns of compute), so all run (one per WARM_START_CAPS, one per HEADROOM_TRIES)."""
    import fxsched.solver.warm_start as ws
    from fxsched.solver.cpsat import warm_start
    from solver_builders import AG, coll, compute, make_problem, wait

    calls: list[int] = []
    real = ws.bucketed_overlap
    monkeypatch.setattr(ws, "bucketed_overlap", lambda *a, **k: calls.append(1) or real(*a, **k))
    hidden = make_problem([coll("c", "A", AG, runtime_ns=100), compute("x", 1_000, heavy=True),
                           wait("w", "c"), compute("y", 10, deps=["w", "x"], heavy=True)])
    assert simulate(hidden, warm_start(hidden, 10**12, SolveConfig())[1]).exposed_ns == 0
    assert calls == []
    exposed = make_problem([coll("c", "A", AG, runtime_ns=500), compute("x", 100, heavy=True),
                            wait("w", "c"), compute("y", 10, deps=["w", "x"], heavy=True)])
    assert simulate(exposed, warm_start(exposed, 10**12, SolveConfig())[1]).exposed_ns == 400
    assert len(calls) == 2 + 2  # WARM_START_CAPS, HEADROOM_TRIES


def _spy_on(monkeypatch, module, name: str, key: str) -> list:
    """Replace ``module.name`` by a pass-through that records each call's keyword ``key``."""
    seen: list = []
    real = getattr(module, name)

    def spy(problem, schedule, **kw):
        seen.append(kw[key])
        return real(problem, schedule, **kw)

    monkeypatch.setattr(module, name, spy)
    return seen


def _filler_feeder():
    """Filler f (100) first, then x (10) feeding c (100) that y (10) waits for."""
    from solver_builders import AG, coll, compute, make_problem, wait

    return make_problem([compute("f", 100, heavy=True), compute("x", 10, heavy=True),
                         coll("c", "A", AG, runtime_ns=100, deps=["x"]), wait("w", "c"),
                         compute("y", 10, deps=["w"], heavy=True)])


def test_warm_start_runs_critical_path_in_free_mode_only(monkeypatch) -> None:
    """The warm start calls heuristics.critical_path in free mode with the rebuild count it is
    given; solve() gives a deterministic solve max(8, int(CRITICAL_BUILDS_PER_S (30) * budget))
    rebuilds on a graph under DEFER_REF_OPS ops, at most the pass's default (MAX_BUILDS, 400, on
    so small a graph): 60 for 2 s, 400 for 30 s, and None (the pass's default, under a deadline)
    on a wall clock. Fixed mode keeps the heavy-compute order and never calls it.
    Filler f (100) first, then x (10) feeding c (100) that y (10) waits for: longest path first
    runs x, c, f, y: 120 ns, the total compute (the given order takes 220)."""
    import fxsched.solver.warm_start as ws

    seen = _spy_on(monkeypatch, ws, "critical_path_schedule", "max_builds")
    p = _filler_feeder()
    assert simulate(p, ws.warm_start(p, 10**12, SolveConfig(mode="free"), critical_builds=7)[1]).makespan_ns == 120
    assert seen == [7]
    ws.warm_start(p, 10**12, SolveConfig(mode="fixed"))
    assert seen == [7]
    solve(p, 2.0, SolveConfig(mode="free", workers=1))
    solve(p, 30.0, SolveConfig(mode="free", workers=1))
    assert seen == [7, 60, 400]
    solve(p, 2.0, SolveConfig(mode="free", workers=1, deterministic=False))
    assert seen == [7, 60, 400, None]


def test_polish_may_leave_the_fixed_model_and_reports_a_valid_bound() -> None:
    """c (30 ns) issued first; a (20 ns); d (10 ns) needs c's wait; b (15 ns) needs nothing. The
    fixed-order model keeps a, d, b in order: the wait stalls 10 ns before d, makespan 55 (proven
    optimal in that space). The final polish pulls b in front of the wait (no heavy op passes
    another): a, b run 0..35, c ended at 30, d 35..45: makespan 45, the total compute, so the
    structural bound proves it optimal; the model's 55 ns bound is not reported for it."""
    from solver_builders import AG, coll, compute, make_problem, wait

    p = make_problem([coll("c", "A", AG, runtime_ns=30), compute("a", 20), wait("w", "c"),
                      compute("d", 10, deps=["w"]), compute("b", 15)])
    plain = solve(p, 5, SolveConfig(mode="fixed", polish=False, **EXACT))
    assert (plain.status, plain.objective, plain.lower_bound) == (Status.OPTIMAL, 55, 55)
    res = solve(p, 5, SolveConfig(mode="fixed", **EXACT))
    assert res.schedule.order.index("b") < res.schedule.order.index("w")
    assert res.objective == simulate(p, res.schedule).makespan_ns == 45
    assert (res.status, res.lower_bound) == (Status.OPTIMAL, 45)


def test_a_passed_deadline_leaves_the_warm_start_its_overlap_schedule(monkeypatch) -> None:
    """Past its deadline (a wall-clock solve whose budget went on the overlap ladder) the warm start
    runs no later step: on the problem above (filler f first) it returns the overlap schedule, the
    given order at 220 ns, without calling the critical-path rebuild that reaches 120 ns."""
    import fxsched.solver.warm_start as ws
    from solver_builders import AG, coll, compute, make_problem, wait

    calls: list[int] = []
    real = ws.critical_path_schedule
    monkeypatch.setattr(ws, "critical_path_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = make_problem([compute("f", 100, heavy=True), compute("x", 10, heavy=True),
                      coll("c", "A", AG, runtime_ns=100, deps=["x"]), wait("w", "c"),
                      compute("y", 10, deps=["w"], heavy=True)])
    name, sched = ws.warm_start(p, 10**12, SolveConfig(mode="free"), deadline=0.0)
    assert (name, simulate(p, sched).makespan_ns, calls) == ("overlap", 220, [])
    assert simulate(p, ws.warm_start(p, 10**12, SolveConfig(mode="free"))[1]).makespan_ns == 120
    assert calls == [1]


def test_bucket_tries_follow_the_budget_past_the_reference_size() -> None:
    """Up to DEFER_REF_OPS (2,500) ops every bucketed try runs (None); past it one per BUCKET_TRY_S
    (4) seconds of budget scaled by DEFER_REF_OPS / ops: 10,000 ops (scale 1/4) get
    int(10 * 0.25 / 4) = 0 tries for 10 s, int(30 * 0.25 / 4) = 1 for 30 s, 15 for 240 s."""
    from types import SimpleNamespace

    from fxsched.solver.warm_start import bucket_tries

    small, large = SimpleNamespace(ops=[None] * 2_500), SimpleNamespace(ops=[None] * 10_000)
    assert bucket_tries(small, 1.0) is None
    assert [bucket_tries(large, t) for t in (10.0, 30.0, 240.0)] == [0, 1, 15]


def test_max_bucketed_bounds_the_warm_starts_bucketed_tries(monkeypatch) -> None:
    """The exposed problem of test_warm_start_skips_bucketing_when_little_is_exposed runs all four
    bucketed tries with no bound, and the first max_bucketed of them with one."""
    import fxsched.solver.warm_start as ws
    from solver_builders import AG, coll, compute, make_problem, wait

    caps: list[object] = []
    real = ws.bucketed_overlap
    monkeypatch.setattr(ws, "bucketed_overlap", lambda *a, **k: caps.append((k["cap_bytes"], k["headroom_share"]))
                        or real(*a, **k))
    p = make_problem([coll("c", "A", AG, runtime_ns=500), compute("x", 100, heavy=True),
                      wait("w", "c"), compute("y", 10, deps=["w", "x"], heavy=True)])
    ws.warm_start(p, 10**12, SolveConfig(), max_bucketed=2)
    assert caps == [(ws.WARM_START_CAPS[0], None), (ws.WARM_START_CAPS[1], None)]
    caps.clear()
    ws.warm_start(p, 10**12, SolveConfig(), max_bucketed=0)
    assert caps == []


def test_plan_evals_scale_with_budget_and_size() -> None:
    """PLAN_EVALS_PER_S (40) plans per second of budget, scaled by DEFER_REF_OPS / ops past 2,500
    ops: 400 for 10 s on 2,500 ops, int(40 * 10 * 0.25) = 100 on 10,000."""
    from types import SimpleNamespace

    from fxsched.solver.warm_start import plan_evals

    small, large = SimpleNamespace(ops=[None] * 2_500), SimpleNamespace(ops=[None] * 10_000)
    assert (plan_evals(small, 10.0), plan_evals(large, 10.0), plan_evals(large, 0.0)) == (400, 100, 0)


def test_max_plans_bounds_the_warm_starts_plan_search(monkeypatch) -> None:
    """The exposed problem of test_max_bucketed_bounds_the_warm_starts_bucketed_tries (stream-bound:
    its gather takes 500 ns beside 110 ns of compute): the plan search gets max_plans plans, and
    none with max_plans=0, with bucketing off, or on a graph that is not stream-bound. Its seeds
    are the config's seed and one more per further process."""
    import fxsched.solver.warm_start as ws
    from solver_builders import AG, coll, compute, make_problem, wait

    calls: list[object] = []
    seeds: list[list[int]] = []
    real = ws.plan_search_seeds

    def spy(problem, schedule, s, **k):
        calls.append(k["max_evals"])
        seeds.append(list(s))
        return real(problem, schedule, s[:1], **k)  # one seed: no child processes in this test

    monkeypatch.setattr(ws, "plan_search_seeds", spy)
    p = make_problem([coll("c", "A", AG, runtime_ns=500), compute("x", 100, heavy=True),
                      wait("w", "c"), compute("y", 10, deps=["w", "x"], heavy=True)])
    ws.warm_start(p, 10**12, SolveConfig(), max_plans=7)
    assert calls == [7] and seeds == [[0]]
    ws.warm_start(p, 10**12, SolveConfig(seed=4, processes=3), max_plans=7)
    assert calls == [7, 7] and seeds == [[0], [4, 5, 6]]
    ws.warm_start(p, 10**12, SolveConfig(), max_plans=0)
    ws.warm_start(p, 10**12, SolveConfig(bucketing=False), max_plans=7)
    assert calls == [7, 7]
    # a gather of 100 ns beside 210 ns of compute, needed by the first heavy op: it exposes 100 ns
    # in the kept heavy order, but is not stream-bound: no plan search
    q = make_problem([coll("c", "A", AG, runtime_ns=100), wait("w", "c"), compute("y", 10, deps=["w"], heavy=True),
                      compute("x", 200, heavy=True)])
    assert simulate(q, ws.overlap_schedule(q)).exposed_ns == 100 and not ws.stream_bound(q)
    ws.warm_start(q, 10**12, SolveConfig(), max_plans=7)
    assert calls == [7, 7]


def test_stream_bound_graphs_give_the_warm_start_more_time() -> None:
    """A gather of 500 ns beside 110 ns of compute is stream-bound (500 >= 110): the warm start may
    take STREAM_BOUND_SHARE of a wall-clock budget; at 100 ns beside 110 it is not, and takes
    WARM_START_SHARE, except in free mode, where it keeps FREE_WARM_START_MIN_S (7.5 s): 0.75 of
    10 s, 0.6 of 60 s (7.5 s is less), and of 5 s no more than STREAM_BOUND_SHARE."""
    import fxsched.solver.warm_start as ws
    from solver_builders import AG, coll, compute, make_problem, wait

    def problem(rt: int):
        return make_problem([coll("c", "A", AG, runtime_ns=rt), compute("x", 100, heavy=True),
                             wait("w", "c"), compute("y", 10, deps=["w", "x"], heavy=True)])

    assert ws.stream_bound(problem(500)) and not ws.stream_bound(problem(100))
    assert ws.stream_bound(problem(110))
    assert ws.warm_start_share(problem(500)) == ws.STREAM_BOUND_SHARE == 0.85
    assert ws.warm_start_share(problem(100)) == ws.WARM_START_SHARE == 0.6
    assert ws.FREE_WARM_START_MIN_S == 7.5
    assert ws.warm_start_share(problem(100), 10.0, "free") == 0.75
    assert ws.warm_start_share(problem(100), 60.0, "free") == 0.6
    assert ws.warm_start_share(problem(100), 5.0, "free") == 0.85
    assert ws.warm_start_share(problem(100), 10.0, "fixed") == 0.6
    assert ws.warm_start_share(problem(500), 10.0, "free") == 0.85


def test_deterministic_warm_start_pulls_in_proportion_to_the_budget(monkeypatch) -> None:
    """A deterministic solve's single pulls try PULL_EVALS_PER_S (50) candidates per second of
    budget, at most PULL_EVALS (2000), on a graph under DEFER_REF_OPS ops: 100 for 2 s, 1500 for
    30 s, 2000 for 60 s; a wall-clock solve tries up to PULL_EVALS under its deadline."""
    import fxsched.solver.warm_start as ws

    seen = _spy_on(monkeypatch, ws, "pull_single_fillers", "max_evals")
    p = _filler_feeder()
    solve(p, 2.0, SolveConfig(mode="free", workers=1))
    solve(p, 30.0, SolveConfig(mode="free", workers=1))
    solve(p, 60.0, SolveConfig(mode="free", workers=1))
    solve(p, 2.0, SolveConfig(mode="free", workers=1, deterministic=False))
    assert seen == [100, 1500, 2000, 2000]


def test_config_needs_a_process() -> None:
    with pytest.raises(ValueError, match="SolveConfig.processes must be >= 1"):
        SolveConfig(processes=0)


@pytest.mark.parametrize(("done_at", "hidden"), [(10.2, 1), (10.5, 0)])
def test_a_search_past_its_budget_still_reorders_the_runs(monkeypatch, done_at: float, hidden: int) -> None:
    """A wall-clock solve of 10 s whose search returns at ``done_at`` s (a busy machine) on the
    given order of the two-gather problem (both waits stall: 0 of 2 hidden, 65 ns): within another
    4% of the budget (10.4 s) the runs' reorder still waits on c2 first, so c1 is hidden at the
    same 65 ns (tests/heuristics/test_concentrate.py derives it); past that the answer stays as
    the search left it. The clock is faked, so the test does not depend on the machine."""
    import dataclasses

    import fxsched.solver.cpsat as cpsat
    from fxsched.solver.cpsat_config import Result
    from tests.heuristics.test_concentrate import _two_gathers

    p = _two_gathers()
    clock = [0.0]
    monkeypatch.setattr(cpsat, "time", type("FakeTime", (), {"perf_counter": staticmethod(lambda: clock[0])}))

    def searched(problem, *args, **kwargs) -> Result:
        clock[0] = done_at
        base = Schedule.original(problem)
        return Result(Status.FEASIBLE, 65, 65, done_at, base, "cpsat", simulate(problem, base).peak_memory_bytes, 0)

    monkeypatch.setattr(cpsat, "_solve", searched)
    r = solve(p, 10, dataclasses.replace(SolveConfig(mode="free", **EXACT), deterministic=False))
    res = simulate(p, r.schedule)
    assert (res.makespan_ns, res.n_hidden_hideable, res.n_hideable) == (65, hidden, 2)
    assert r.schedule.order.index("w2") < r.schedule.order.index("w1") if hidden else r.schedule == Schedule.original(p)
