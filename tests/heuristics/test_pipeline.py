"""Filler pipelining (heuristics/pipeline.py): a hand-derived tensor-parallel chain, the memory
budget, and validity / never-worse on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.overlap import original_peak, overlap_schedule
from fxsched.heuristics.pipeline import pipeline_fillers, pipeline_fillers_of, pipelined_order, widen_keep
from fxsched.solver import Schedule, check_schedule, simulate

from tests.solver.solver_builders import AG, AR, RS, coll, compute, make_problem, storage, wait
from tests.solver.tiny_instances import tiny_problems


def _chain(f1_uses: tuple[str, ...] = (), c2_alloc: tuple[str, ...] = ()):
    """All-gather c1 (100 ns) -> wait -> a (10) -> reduce-scatter c2 (100) -> wait -> b (10): the
    activation-gradient chain. f1 (80) needs c1's result, f2 (80) c2's; nothing waits for them
    (weight gradients). Given order c1, w1, a, f1, c2, w2, b, f2 (each filler right after its
    block): c1 0..100, a 100..110, f1 110..190, c2 190..290, b 290..300, f2 300..380: 380 ns."""
    return make_problem([
        coll("c1", "A", AG, runtime_ns=100),
        wait("w1", "c1"),
        compute("a", 10, deps=["w1"], heavy=True),
        compute("f1", 80, deps=["w1"], heavy=True, uses=f1_uses),
        coll("c2", "A", RS, runtime_ns=100, deps=["a"], allocates=c2_alloc),
        wait("w2", "c2"),
        compute("b", 10, deps=["w2"], heavy=True),
        compute("f2", 80, deps=["w2"], heavy=True),
    ], storages=[storage(s, 100, inp=True) for s in f1_uses] + [storage(s, 50) for s in c2_alloc])


def test_holds_a_weight_gradient_back_for_the_next_collective() -> None:
    """Pipelined: a runs at 100 and c2 is issued at 110 (110..210); f1 (80) fits the 100 ns b
    would stall and runs 110..190; b 210..220, f2 220..300: 300 ns. Optimal: the chain c1, a,
    c2, b takes 220 ns and f2 needs c2 (ends >= 210), so the end is >= 210 + 10 + 80 = 300."""
    p = _chain()
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 380
    fillers = pipeline_fillers_of(p, base)
    assert {"f1", "f2"} <= fillers and "a" not in fillers  # a feeds c2, which b waits for
    out = pipeline_fillers(p, base)
    assert out.order == ("c1", "w1", "a", "c2", "f1", "w2", "b", "f2")
    assert simulate(p, out).makespan_ns == 300


def test_memory_budget_is_kept() -> None:
    """f1 reads a 100-byte input (freed after it) and c2 writes a 50-byte output (live from its
    issue): the original order peaks at 100 (before f1), the pipelined one at 150 (f1's input
    still live when c2 is issued). Under the original peak no rebuild fits (c2 is issued as soon
    as a ends in every one) and the pass returns the given order; with 150 bytes it pipelines
    (300 ns, as above)."""
    p = _chain(f1_uses=("x",), c2_alloc=("y",))
    base = Schedule.original(p)
    assert original_peak(p) == 100
    assert simulate(p, pipelined_order(p, base)).peak_memory_bytes == 150
    kept = pipeline_fillers(p, base)
    assert kept == base
    assert simulate(p, pipeline_fillers(p, base, budget_bytes=150)).makespan_ns == 300


def test_fillers_that_feed_a_long_collective_are_not_held() -> None:
    """f2 feeds an all-reduce r (500 ns) that outlasts every collective compute waits for: held
    back to the end it would run exposed after everything, so it is not a filler to hold."""
    p = make_problem([
        coll("c1", "A", AG, runtime_ns=100),
        wait("w1", "c1"),
        compute("a", 10, deps=["w1"], heavy=True),
        compute("f1", 80, deps=["w1"], heavy=True),
        compute("f2", 80, deps=["w1"], heavy=True),
        coll("r", "B", AR, runtime_ns=500, deps=["f2"]),
        wait("wr", "r"),
    ])
    fillers = pipeline_fillers_of(p, Schedule.original(p))
    assert "f1" in fillers and "f2" not in fillers


@pytest.mark.parametrize("p", tiny_problems(20, seed=29), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    base = overlap_schedule(p)
    r0 = simulate(p, base)
    budget = max(original_peak(p), r0.peak_memory_bytes)
    for backlog in (None, 0):
        assert check_schedule(p, pipelined_order(p, base, backlog_ns=backlog)) == []
    out = pipeline_fillers(p, base, budget_bytes=budget)
    assert check_schedule(p, out) == []
    r = simulate(p, out)
    assert r.makespan_ns <= r0.makespan_ns
    assert r.peak_memory_bytes <= budget


def test_widen_keep_by_hand() -> None:
    """A first overrun at 20 keeps ops 15..20 (window 5); hit again inside that range, the range
    reaches 5 further back (10..20); with ``grow`` a 40-op range reaches half its length back."""
    assert widen_keep((), 20, 5) == ((15, 21),)
    assert widen_keep(((15, 21),), 18, 5) == ((10, 21),)
    assert widen_keep(((15, 21),), 30, 5) == ((15, 21), (25, 31))
    assert widen_keep(((20, 60),), 30, 5) == ((15, 60),)
    assert widen_keep(((20, 60),), 30, 5, grow=True) == ((0, 60),)
    assert widen_keep(((2, 4),), 3, 5, grow=True) == ((0, 4),)
