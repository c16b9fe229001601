"""The spine fill (solver/spine_fill.py): hand-derived timelines where the count-first polish's
single moves cannot hide the chain and the slot model does, its memory guard, and its place in
``solve``. Every CP-SAT run is deterministic (seed 0, one worker, deterministic time)."""

from __future__ import annotations

import dataclasses

import pytest
from fxsched.heuristics.concentrate import concentrate_stalls
from fxsched.heuristics.hide import hide_collectives
from fxsched.solver import Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig, Status, solve
from fxsched.solver.cpsat_config import Result
from fxsched.solver.spine_fill import spine_fill, spine_of
from ortools.sat.python import cp_model
from fxsched.solver.cpsat_config import make_solver

from tests.solver.solver_builders import AG, coll, compute, make_problem, storage, wait

FREE = SolveConfig(mode="free")


def _short_fillers(memory: bool = False):
    """A chain c1 (20 ns) -> x (10 ns) -> c2 (30 ns) -> z (5 ns) on one group, and three fillers
    that need neither: a (20 ns), b (10 ns), d (20 ns). The given order runs them all in c1's
    window: c1 0..20, a 0..20, b 20..30, d 30..50, w1 finds c1 done; x 50..60, c2 60..90, w2
    stalls 30 (to 90), z 90..95: 95 ns, 1 of 2 hidden. Each filler is shorter than c2's stall, so
    no single deferral or pull closes it; two together do. Total compute is 65 ns, a lower bound,
    and c1, {d}, w1, x, c2, {a, b}, w2, z (or with a and d swapped) reaches it with both hidden.

    ``memory``: g (0 ns) first allocates G (1000 B), which d reads last, and x allocates X
    (1000 B), which z reads: the given order peaks at 1000 B. Deferring d past w1 would hold G
    and X together (2000 B), so within that budget only a and b may move."""
    ops = [compute("g", 0, allocates=["G"])] if memory else []
    ops += [coll("c1", "A", AG, runtime_ns=20), compute("a", 20), compute("b", 10),
            compute("d", 20, deps=["g"] if memory else [], uses=["G"] if memory else []),
            wait("w1", "c1"), compute("x", 10, deps=["w1"], allocates=["X"] if memory else []),
            coll("c2", "A", AG, runtime_ns=30, deps=["x"]), wait("w2", "c2"),
            compute("z", 5, deps=["w2", "x"], uses=["X"] if memory else [])]
    return make_problem(ops, [storage("G", 1000), storage("X", 1000)] if memory else [], groups=("A",))


def _windows(sched: Schedule) -> tuple[set[str], set[str]]:
    """The fillers between c1's issue and wait, and between c2's."""
    o = sched.order
    return ({n for n in o[o.index("c1"):o.index("w1")] if n in "abd"},
            {n for n in o[o.index("c2"):o.index("w2")] if n in "abd"})


def test_the_chain_is_the_heaviest_run_of_dependent_collectives() -> None:
    p = _short_fillers()
    spine = spine_of(p, Schedule.original(p))
    assert spine is not None and spine.chain == ("c1", "c2") and spine.n_slots == 5


def test_spine_fill_hides_what_single_moves_cannot() -> None:
    p = _short_fillers()
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.n_hidden_hideable, r0.n_hideable) == (95, 1, 2)
    polished = hide_collectives(p, concentrate_stalls(p, base))
    assert simulate(p, polished).n_hidden_hideable == 1  # the polish alone is stuck
    out = spine_fill(p, base, r0.peak_memory_bytes, FREE, 5.0)
    assert out is not None and not check_schedule(p, out)
    r = simulate(p, out)
    assert (r.makespan_ns, r.exposed_ns, r.n_hidden_hideable) == (65, 0, 2)
    first, second = _windows(out)
    assert sum(p.op_by_name[n].runtime_ns for n in first) >= 20 and sum(
        p.op_by_name[n].runtime_ns for n in second) >= 30


def test_memory_keeps_the_filler_that_holds_a_buffer() -> None:
    p = _short_fillers(memory=True)
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.n_hidden_hideable, r0.peak_memory_bytes) == (95, 1, 1000)
    out = spine_fill(p, base, 1000, FREE, 5.0)
    assert out is not None
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable, r.peak_memory_bytes) == (65, 2, 1000)
    assert _windows(out) == ({"d"}, {"a", "b"})
    # with room for both buffers the fill is free to move d as well: still all hidden, within 2000 B
    roomy = spine_fill(p, base, 2000, FREE, 5.0)
    assert roomy is not None and simulate(p, roomy).n_hidden_hideable == 2
    assert simulate(p, roomy).peak_memory_bytes <= 2000


def test_nothing_to_do_gives_none() -> None:
    """No stalled chain collective, fixed mode, or no time: None."""
    p = _short_fillers()
    base = Schedule.original(p)
    out = spine_fill(p, base, 10**9, FREE, 5.0)
    assert out is not None
    assert spine_fill(p, out, 10**9, FREE, 5.0) is None  # both hidden already
    assert spine_fill(p, base, 10**9, SolveConfig(mode="fixed"), 5.0) is None
    assert spine_fill(p, base, 10**9, FREE, 0.0) is None


def test_config_checks_the_share() -> None:
    with pytest.raises(ValueError, match="spine_share"):
        SolveConfig(spine_share=0.5)
    with pytest.raises(ValueError, match="spine_share"):
        SolveConfig(spine_share=True)
    for radius in (0, True, 2.5):
        with pytest.raises(ValueError, match="spine_radius"):
            SolveConfig(spine_radius=radius)


@pytest.mark.parametrize(("share", "hidden", "makespan"), [(0.2, 2, 65), (0.0, 1, 95)])
def test_solve_keeps_the_spine_fill_when_it_hides_more(monkeypatch, share: float, hidden: int,
                                                       makespan: int) -> None:
    """A search that returns the given order (stubbed: on this graph CP-SAT itself finds the
    optimum) is polished to no gain; with ``spine_share`` the spine fill's answer, polished, hides
    both at 65 ns and replaces it."""
    import fxsched.solver.cpsat as cpsat

    p = _short_fillers()

    def searched(problem, *args, **kwargs) -> Result:
        base = Schedule.original(problem)
        return Result(Status.FEASIBLE, 95, 65, 0.0, base, "cpsat", simulate(problem, base).peak_memory_bytes, 0)

    monkeypatch.setattr(cpsat, "_solve", searched)
    r = solve(p, 5, dataclasses.replace(FREE, spine_share=share))
    res = simulate(p, r.schedule)
    assert (res.makespan_ns, res.n_hidden_hideable, r.objective) == (makespan, hidden, makespan)


def test_a_wall_clock_fill_stops_at_its_time(monkeypatch) -> None:
    """On a wall clock the model builds count: a clock that jumps past the budget during the
    first build (faked, so the test does not depend on the machine) leaves no time to solve."""
    import fxsched.solver.spine_fill as sf

    p = _short_fillers()
    clock = [0.0]
    monkeypatch.setattr(sf, "time", type("FakeTime", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    real = sf.SpineModel.build

    def slow_build(self):
        clock[0] += 10.0
        return real(self)

    monkeypatch.setattr(sf.SpineModel, "build", slow_build)
    wall = dataclasses.replace(FREE, deterministic=False)
    assert spine_fill(p, Schedule.original(p), 10**9, wall, 5.0) is None
    clock[0] = 0.0
    assert spine_fill(p, Schedule.original(p), 10**9, wall, 50.0) is not None  # 10 s of 50: time left to solve


def test_a_peak_inside_a_slot_is_cut_where_it_happened(monkeypatch) -> None:
    """x also needs a, so only b (10 ns) and d (20 ns) can fill c2's 30 ns window. d makes the
    temporary T (1000 B) that e (0 ns) frees at once, inside one slot, so no chain op sees it; but
    c2's window holds X (1000 B, from x to z): moved there, d peaks at 2000 B, over the 1000 B of
    the given order. The second round cuts the bytes live at d in that slot, so d stays out of it;
    b alone cannot cover c2, and the fewest moves leave the given order (1 of 2 hidden, within
    the budget). With one round there is no order within the budget."""
    import fxsched.solver.spine_fill as sf

    p = make_problem([
        coll("c1", "A", AG, runtime_ns=20), compute("a", 20), compute("b", 10), compute("d", 20, allocates=["T"]),
        compute("e", 0, deps=["d"], uses=["T"]), wait("w1", "c1"),
        compute("x", 10, deps=["w1", "a"], allocates=["X"]), coll("c2", "A", AG, runtime_ns=30, deps=["x"]),
        wait("w2", "c2"), compute("z", 5, deps=["w2", "x"], uses=["X"]),
    ], [storage("T", 1000), storage("X", 1000)], groups=("A",))
    base = Schedule.original(p)
    assert (simulate(p, base).peak_memory_bytes, simulate(p, base).n_hidden_hideable) == (1000, 1)
    out = spine_fill(p, base, 1000, FREE, 5.0)
    assert out is not None and out.order == base.order
    monkeypatch.setattr(sf, "CUT_ROUNDS", 1)
    assert spine_fill(p, base, 1000, FREE, 5.0) is None
    roomy = spine_fill(p, base, 2000, FREE, 5.0)  # room for both: d moves, both hidden
    assert roomy is not None and simulate(p, roomy).n_hidden_hideable == 2


def _lifetimes_problem():
    """Every kind of lifetime the memory cuts count: a parameter (never freed) and an input read
    by two ops, a collective's input and output (live to its wait), a temporary freed inside a
    slot, a graph output, and a chain c1 -> x -> c2 for the slots."""
    ops = [
        coll("c1", "A", AG, runtime_ns=20, uses=["P"], allocates=["G1"]), compute("a", 20, uses=["I"], allocates=["A1"]),
        compute("b", 10, deps=["a"], uses=["A1"], allocates=["B1"]), compute("d", 20, allocates=["D1"]),
        compute("e", 0, deps=["d"], uses=["D1"]), wait("w1", "c1"),
        compute("x", 10, deps=["w1"], uses=["G1", "I"], allocates=["X"]),
        coll("c2", "A", AG, runtime_ns=30, deps=["x"], uses=["X"], allocates=["G2"]), wait("w2", "c2"),
        compute("z", 5, deps=["w2", "b"], uses=["G2", "B1"], allocates=["Z"]),
    ]
    return make_problem(ops, [storage("P", 100, param=True), storage("I", 50, inp=True), storage("G1", 64),
                              storage("A1", 30), storage("B1", 40), storage("D1", 25), storage("X", 70),
                              storage("G2", 80), storage("Z", 10, keep=True)], groups=("A",))


def _random_order(p, rng) -> Schedule:
    """A uniformly drawn ready op at each step: a valid order."""
    deps = {op.name: set(op.deps) for op in p.ops}
    done: list[str] = []
    while len(done) < len(p.ops):
        ready = sorted(n for n, d in deps.items() if n not in done and d <= set(done))
        done.append(ready[rng.randrange(len(ready))])
    return Schedule(order=tuple(done))


def test_the_memory_cut_counts_what_the_simulator_counts() -> None:
    """At every op of 30 random valid orders, the bytes a cut counts (``live_bytes`` with each op
    in its own slot) equal the simulator's memory curve there."""
    import random

    from fxsched.solver.simulator import memory_curve
    from fxsched.solver.spine_fill import SpineModel

    p, rng = _lifetimes_problem(), random.Random(0)
    for _ in range(30):
        order = _random_order(p, rng)
        spine = spine_of(p, order)
        assert spine is not None and spine.chain == ("c1", "c2")
        model = SpineModel(p, order, spine, 10**9, 4)
        model.build()
        curve = memory_curve(p, order)[1]
        slots = [int(s) for s in model.inc]
        assert [model.live_bytes(p.index[n], slots) for n in order.order] == curve
        assert max(curve) > 0


def _queued(group: str):
    """A chain c1 (20 ns) -> x (10 ns) -> c2 (30 ns) on group A; L (40 ns, on ``group``) off the
    chain, issued after x; the filler f (30 ns) in c1's window."""
    return make_problem([
        coll("c1", "A", AG, runtime_ns=20), compute("f", 30), wait("w1", "c1"), compute("x", 10, deps=["w1"]),
        coll("L", group, AG, runtime_ns=40), coll("c2", "A", AG, runtime_ns=30, deps=["x"]), wait("w2", "c2"),
        wait("wL", "L"), compute("z", 5, deps=["w2"]),
    ], groups=("A", "B"))


@pytest.mark.parametrize(("group", "queued"), [("A", True), ("B", False)])
def test_a_window_behind_a_held_collective_must_cover_its_queue(group: str, queued: bool) -> None:
    """Move f into c2's window (c1, w1, x, L, c2, f, w2, wL, z). On group B, L does not delay c2:
    c2 runs 20..50 beside f (20..50), and w2 at 50 finds it done. On group A (L is 40 ns, at least
    half the chain's longest, so it is held), c2 queues behind L (20..60) and runs 60..90, and w2
    at 50 stalls 40 ns: f (30 ns) covers c2's runtime but not L's too. The model's cover for c2,
    with f forced there, agrees with the simulator in both cases."""
    from fxsched.solver.spine_fill import SpineModel

    p = _queued(group)
    base = Schedule.original(p)
    moved = Schedule(order=("c1", "w1", "x", "L", "c2", "f", "w2", "wL", "z"))
    assert not check_schedule(p, moved)
    c2 = next(t for t in simulate(p, moved).collectives if t.members == ("c2",))
    assert c2.exposed_ns == (40 if queued else 0)
    spine = spine_of(p, base)
    assert spine is not None and spine.chain == ("c1", "c2")
    model = SpineModel(p, base, spine, 10**9, 4)
    assert (model.held == (p.index["L"],)) is queued
    model.build()
    model.model.Add(model.slot[p.index["f"]] == 3)  # type: ignore[arg-type]  # c2's window
    model.model.Maximize(model.cover[1])
    solver = make_solver(FREE, 5.0)
    assert solver.Solve(model.model) == cp_model.OPTIMAL
    assert solver.Value(model.cover[1]) == (0 if queued else 1)


def test_the_fill_does_not_trade_one_stall_for_a_longer_one() -> None:
    """A chain c1 (20 ns) -> x (0 ns) -> c2 (40 ns); b1 and b2 (5 ns each) run in c1's window, a
    (30 ns) in c2's: c1 0..20 beside b1, b2 (0..10), w1 stalls 10; c2 20..60 beside a (20..50),
    w2 stalls 10: 60 ns, neither hidden, the windows 10 + 10 ns short. Moving a to c1's window
    (two slots) covers c1 but leaves c2's window empty, 40 ns short: c2 runs 40..80, 80 ns.
    Moving b1 and b2 to c2's window (four slots) covers c2 and leaves c1's 20 ns short, as much
    in all as before: c2 20..60 beside b1, b2, a (20..60), 60 ns with c2 hidden. Both hide one;
    the fewest slots moved would take the first, the cap on the windows' deficits the second."""
    p = make_problem([
        coll("c1", "A", AG, runtime_ns=20), compute("b1", 5), compute("b2", 5), wait("w1", "c1"),
        compute("x", 0, deps=["w1"]), coll("c2", "A", AG, runtime_ns=40, deps=["x"]), compute("a", 30),
        wait("w2", "c2"),
    ], groups=("A",))
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.n_hidden_hideable) == (60, 0)
    worse = simulate(p, Schedule(order=("c1", "b1", "b2", "a", "w1", "x", "c2", "w2")))
    assert (worse.makespan_ns, worse.n_hidden_hideable) == (80, 1)
    out = spine_fill(p, base, r0.peak_memory_bytes, FREE, 5.0)
    assert out is not None and out.order == ("c1", "w1", "x", "c2", "b1", "b2", "a", "w2")
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable) == (60, 1)


def test_solve_runs_the_fill_again_from_each_order_it_keeps(monkeypatch) -> None:
    """The search (stubbed) returns the given order (95 ns, 1 hidden) and the spine fill (stubbed)
    the optimum (65 ns, 2 hidden): the first round starts from the answer's polish and is kept,
    the others start from the kept order (a plateau: searched again with the next seed) until
    the SPINE_ROUNDS rounds are done. Deterministic time: each round gets a quarter of the spine
    time (0.2 of 5 s: 0.25 s); round k's seed is the config's plus k."""
    import fxsched.solver.cpsat as cpsat

    p = _short_fillers()
    base = Schedule.original(p)
    best = spine_fill(p, base, 10**9, FREE, 5.0)
    assert best is not None and simulate(p, best).n_hidden_hideable == 2
    calls: list[tuple[tuple[str, ...], float]] = []

    def searched(problem, *args, **kwargs) -> Result:
        return Result(Status.FEASIBLE, 95, 65, 0.0, base, "cpsat", simulate(problem, base).peak_memory_bytes, 0)

    def filled(problem, start, budget_bytes, config, time_s, radius):
        calls.append((start.order, time_s, radius, config.seed))
        return best

    monkeypatch.setattr(cpsat, "_solve", searched)
    polished = solve(p, 5, FREE).schedule  # the answer's polish: where the rounds start
    monkeypatch.setattr(cpsat, "spine_fill", filled)
    r = solve(p, 5, dataclasses.replace(FREE, spine_share=0.2, spine_radius=7, seed=3))
    assert cpsat.SPINE_ROUNDS == 4
    assert [c[0] for c in calls] == [polished.order] + [best.order] * 3
    assert [c[1] for c in calls] == pytest.approx([0.25] * 4)
    assert [c[2] for c in calls] == [7] * 4  # SolveConfig.spine_radius reaches the fill
    assert [c[3] for c in calls] == [3, 4, 5, 6]
    res = simulate(p, r.schedule)
    assert (res.makespan_ns, res.n_hidden_hideable) == (65, 2)


def test_the_rounds_go_on_from_an_order_that_hides_more_even_if_longer(monkeypatch) -> None:
    """c1 (group A) and c2 (group B), 30 ns each, a (20 ns) and b (25 ns) independent of both.
    The answer (its polish stubbed to the same order) c1, a, w1, c2, b, w2: w1 stalls 10 ns, c2 runs 30..60 beside b (30..55), w2 stalls
    5: 60 ns, none hidden. The first round (stubbed, the polish too) gives c1, a, b, w1, c2, w2:
    c1 hidden, c2 30 ns exposed, 75 ns: more hidden but longer, so not kept, but the next round
    starts from it and gives c1, c2, a, b, w1, w2: both hidden, 45 ns, kept; the third and the
    fourth start from that (a plateau, searched again with the next seeds) and find no more."""
    import fxsched.solver.cpsat as cpsat

    p = make_problem([coll("c1", "A", AG, runtime_ns=30), coll("c2", "B", AG, runtime_ns=30), compute("a", 20),
                      compute("b", 25), wait("w1", "c1"), wait("w2", "c2"), compute("z", 0, deps=["w1", "w2"])])
    answer = Schedule(order=("c1", "a", "w1", "c2", "b", "w2", "z"))
    longer = Schedule(order=("c1", "a", "b", "w1", "c2", "w2", "z"))
    best = Schedule(order=("c1", "c2", "a", "b", "w1", "w2", "z"))
    metrics = [(simulate(p, s).makespan_ns, simulate(p, s).n_hidden_hideable) for s in (answer, longer, best)]
    assert metrics == [(60, 0), (75, 1), (45, 2)]
    starts: list[Schedule] = []
    polished: list[Schedule] = []

    def searched(problem, *args, **kwargs) -> Result:
        return Result(Status.FEASIBLE, 60, 45, 0.0, answer, "cpsat", simulate(problem, answer).peak_memory_bytes, 0)

    def filled(problem, start, budget_bytes, config, time_s, radius):
        starts.append(start)
        return longer if len(starts) == 1 else best

    def polish(problem, sched, *args):  # the same order as a new object: where the rounds start shows
        polished.append(dataclasses.replace(sched))
        return polished[-1]

    monkeypatch.setattr(cpsat, "_solve", searched)
    monkeypatch.setattr(cpsat, "_polished", polish)
    monkeypatch.setattr(cpsat, "spine_fill", filled)
    r = solve(p, 5, dataclasses.replace(FREE, spine_share=0.2))
    assert [s.order for s in starts] == [answer.order, longer.order, best.order, best.order]
    assert starts[0] is polished[0] and starts[0] is not answer  # the answer's polish, not the answer
    assert r.schedule.order == best.order and r.objective == 45


@pytest.mark.parametrize("which", ["lifetimes", "queued", "memory"])
def test_the_hint_is_a_whole_solution(which: str) -> None:
    """Every variable of the model is hinted with its value under the incumbent's slots, and those
    values together satisfy it (CP-SAT with every variable fixed to its hint finds it feasible),
    with a cut at every op in its own slot too: the rounds start from a solution."""
    from fxsched.solver.spine_fill import SpineModel

    p = {"lifetimes": _lifetimes_problem, "queued": lambda: _queued("A"),
         "memory": lambda: _short_fillers(memory=True)}[which]()
    base = Schedule.original(p)
    model = SpineModel(p, base, spine_of(p, base), simulate(p, base).peak_memory_bytes, 4)
    model.build()
    for j in range(len(p.ops)):
        model.cut(j, int(model.inc[j]))
    model.hint([int(s) for s in model.inc])
    proto = model.model.Proto()
    assert len(proto.solution_hint.vars) == len(proto.variables) > 0
    solver = make_solver(FREE, 5.0)
    solver.parameters.fix_variables_to_their_hinted_value = True
    assert solver.Solve(model.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def test_the_rounds_go_on_from_a_tie_and_go_back_from_fewer(monkeypatch) -> None:
    """``_short_fillers``: the answer (95 ns, 1 of 2 hidden, its polish stubbed to the same order).
    The first round (stubbed) gives c1, w1, a, b, d, x, c2, w2, z: both stall (115 ns, none
    hidden), fewer, so the second starts from the answer again (with the next seed) and gives a
    and b swapped: the same 95 ns and 1 hidden, another order; the rounds go on from it, and the
    third gives c1, d, w1, x, c2, a, b, w2, z: d fills c1's window (0..20), a and b c2's (30..60),
    65 ns with both hidden, kept; the fourth starts from it."""
    import fxsched.solver.cpsat as cpsat

    p = _short_fillers()
    answer = Schedule.original(p)
    worse = Schedule(("c1", "w1", "a", "b", "d", "x", "c2", "w2", "z"))
    tie = Schedule(("c1", "b", "a", "d", "w1", "x", "c2", "w2", "z"))
    best = Schedule(("c1", "d", "w1", "x", "c2", "a", "b", "w2", "z"))
    assert [(simulate(p, s).makespan_ns, simulate(p, s).n_hidden_hideable) for s in (answer, worse, tie, best)] == [
        (95, 1), (115, 0), (95, 1), (65, 2)]
    starts: list[Schedule] = []
    fills = iter([worse, tie, best, best])

    def searched(problem, *args, **kwargs) -> Result:
        return Result(Status.FEASIBLE, 95, 65, 0.0, answer, "cpsat", simulate(problem, answer).peak_memory_bytes, 0)

    def filled(problem, start, budget_bytes, config, time_s, radius):
        starts.append(start)
        return next(fills)

    monkeypatch.setattr(cpsat, "_solve", searched)
    monkeypatch.setattr(cpsat, "_polished", lambda problem, sched, *args: dataclasses.replace(sched))
    monkeypatch.setattr(cpsat, "spine_fill", filled)
    r = solve(p, 5, dataclasses.replace(FREE, spine_share=0.2))
    assert [s.order for s in starts] == [answer.order, answer.order, tie.order, best.order]
    assert r.schedule.order == best.order and r.objective == 65


class _HintSolver:
    """A CP-SAT solver that, for its first ``hinted`` solves, answers the model's hint (the given
    order: a feasible solution with no gain) and then solves for real; it records each solve's
    seed. What a wall-clock solve that finds nothing better in its time returns."""

    def __init__(self, real: cp_model.CpSolver, log: list[int], hinted: int) -> None:
        self.real, self.log, self.hinted, self.hint = real, log, hinted, None
        self.deterministic_time = 0.0

    def Solve(self, model: cp_model.CpModel):  # noqa: N802 (CP-SAT's name)
        self.log.append(self.real.parameters.random_seed)
        if len(self.log) <= self.hinted:
            h = model.Proto().solution_hint
            self.hint = dict(zip(h.vars, h.values))
            return cp_model.FEASIBLE
        status = self.real.Solve(model)
        self.deterministic_time = self.real.deterministic_time
        return status

    def Value(self, var):  # noqa: N802
        return self.hint[var.Index()] if self.hint is not None else self.real.Value(var)


def _hinted_solvers(monkeypatch, hinted: int) -> tuple[list[int], list[int]]:
    """Patch the fill's solvers (:class:`_HintSolver`); the seeds solved with, and the builds."""
    import fxsched.solver.spine_fill as sf

    seeds: list[int] = []
    builds: list[int] = []
    monkeypatch.setattr(sf, "make_solver", lambda *a, **k: _HintSolver(make_solver(*a, **k), seeds, hinted))
    real = sf.SpineModel.build

    def counted(self):
        builds.append(1)
        return real(self)

    monkeypatch.setattr(sf.SpineModel, "build", counted)
    return seeds, builds


def test_the_fill_solves_again_with_the_next_seed_until_a_window_is_covered(monkeypatch) -> None:
    """Solves that give the given order back (no window covered that it left uncovered: c2's, on
    _short_fillers) do not end the fill: the same model is solved again with the next seed until
    one covers c2's window (both hidden in 65 ns, the hand-derived optimum), and that is returned."""
    p = _short_fillers()
    base = Schedule.original(p)
    seeds, builds = _hinted_solvers(monkeypatch, hinted=2)
    out = spine_fill(p, base, 10**9, dataclasses.replace(FREE, seed=7), 5.0)
    assert seeds == [7, 8, 9] and builds == [1]  # one model, three solves, a new seed each
    assert out is not None and not check_schedule(p, out)
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable) == (65, 2)


def test_a_fill_with_no_gain_returns_the_best_order_it_decoded(monkeypatch) -> None:
    """Where no solve covers more (every one answers the hint), the fill stops after MAX_SOLVES
    and returns the best order within the budget it decoded: the given one."""
    import fxsched.solver.spine_fill as sf

    p = _short_fillers()
    base = Schedule.original(p)
    monkeypatch.setattr(sf, "MAX_SOLVES", 4)
    seeds, _ = _hinted_solvers(monkeypatch, hinted=10**6)
    out = spine_fill(p, base, 10**9, FREE, 5.0)
    assert seeds == [0, 1, 2, 3]
    assert out is not None and out.order == base.order

