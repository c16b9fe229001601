"""The neighbourhood search's cheap moves (solver/cpsat_lns.py ``_move_round``): a walk of far
deferrals, each gaining less than a move must, is kept when together they gain more."""

from __future__ import annotations

from fxsched.heuristics.far_defer import defer_far_fillers
from fxsched.heuristics.single_pull import pull_single_fillers
from fxsched.solver import Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig
from fxsched.solver.cpsat_lns import _move_round
from fxsched.solver.warm_start import MOVE_MIN_GAIN_NS
from solver_builders import coll, compute, make_problem, wait


def _far_case(k: int, scale: int, a: str, b: str) -> list:
    """One copy of test_far_defer's far_problem, times scaled by ``scale``: deferring the weight
    gradient f past r's issue hides r behind it (700 -> 550 per scale unit, alone)."""
    return [
        compute(f"f{k}", 200 * scale),
        coll(f"rf{k}", a, runtime_ns=50 * scale, deps=[f"f{k}"]),
        coll(f"q{k}", b, runtime_ns=100 * scale),
        compute(f"g{k}", 100 * scale),
        wait(f"wq{k}", f"q{k}"),
        compute(f"e{k}", 100 * scale, deps=[f"wq{k}"]),
        coll(f"r{k}", a, runtime_ns=300 * scale, deps=[f"e{k}"]),
        wait(f"wf{k}", f"rf{k}"),
        wait(f"wr{k}", f"r{k}"),
    ]


def test_a_walk_of_small_gains_is_kept_when_it_gains_enough() -> None:
    """Two far-deferral cases one after the other, each gaining less than MOVE_MIN_GAIN_NS alone:
    no single move of the round qualifies, and the walk takes both."""
    p = make_problem(_far_case(1, 2, "A", "B") + _far_case(2, 3, "C", "D"), groups=("A", "B", "C", "D"))
    base = Schedule.original(p)
    before = simulate(p, base).makespan_ns
    assert defer_far_fillers(p, base, max_moves=1, min_gain_ns=MOVE_MIN_GAIN_NS) is base
    assert pull_single_fillers(p, base, max_moves=1, min_gain_ns=MOVE_MIN_GAIN_NS) is base
    moved = _move_round(p, SolveConfig(mode="free", bucketing=False), simulate(p, base).peak_memory_bytes, base, None)
    assert moved is not None and check_schedule(p, moved) == []
    assert simulate(p, moved).makespan_ns < before - MOVE_MIN_GAIN_NS
    # and a walk that gains too little in all is not kept: one copy alone gains 300 ns
    single = make_problem(_far_case(1, 2, "A", "B"))
    s0 = Schedule.original(single)
    assert simulate(single, defer_far_fillers(single, s0)).makespan_ns < simulate(single, s0).makespan_ns
    assert _move_round(single, SolveConfig(mode="free", bucketing=False), simulate(single, s0).peak_memory_bytes,
                       s0, None) is None
