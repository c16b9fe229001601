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


def test_a_peak_inside_a_slot_sends_the_moved_ops_back(monkeypatch) -> None:
    """x also needs a, so only b (10 ns) and d (20 ns) can fill c2's 30 ns window. d makes the
    temporary T (1000 B) that e (0 ns) frees at once, inside one slot, so no chain op sees it; but
    c2's window holds X (1000 B, from x to z): moved there, d peaks at 2000 B, over the 1000 B of
    the given order. The second solve keeps what moved across that slot (b, d, e) where it was,
    which leaves the given order (1 of 2 hidden, within the budget); with one solve there is none."""
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
    monkeypatch.setattr(sf, "MEMORY_TRIES", 1)
    assert spine_fill(p, base, 1000, FREE, 5.0) is None
    assert spine_fill(p, base, 2000, FREE, 5.0) is not None  # room for both: d moves, both hidden
    assert simulate(p, spine_fill(p, base, 2000, FREE, 5.0)).n_hidden_hideable == 2
