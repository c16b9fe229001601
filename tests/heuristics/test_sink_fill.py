"""Wait sinking (heuristics/sink.py) and stall filling (heuristics/fill.py): hand-derived cases,
and validity on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.fill import fill_stalls
from fxsched.heuristics.overlap import original_peak, overlap_schedule
from fxsched.heuristics.sink import sink_stalled_waits
from fxsched.solver import Schedule, check_schedule, simulate

from tests.solver.solver_builders import AG, AR, RS, coll, compute, make_problem, wait
from tests.solver.tiny_instances import tiny_problems


def test_sinks_a_wait_that_only_feeds_another_collective() -> None:
    """a (100) -> reduce_scatter e on A (size 400: 500 ns) -> its wait -> all_reduce f on B
    (size 0: 100 ns) -> its wait; b (300) independent, last. In order a, e, we, f, wf, b the
    wait stalls 100..600, f runs 600..700 and b 700..1000. Sinking we (with f and wf, which
    depend on it and are not compute) past b: a 0..100, b 100..400, e 100..600, f 600..700:
    700 ns, and no schedule is faster (a, then e and f one after the other)."""
    p = make_problem([
        compute("a", 100, heavy=True),
        coll("e", "A", RS, runtime_ns=500, bytes_in=200, bytes_out=200, deps=["a"]),
        wait("we", "e"),
        coll("f", "B", AR, runtime_ns=100, deps=["we"]),
        wait("wf", "f"),
        compute("b", 300, heavy=True),
    ])
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 1000
    out = sink_stalled_waits(p, base)
    assert out.order == ("a", "e", "b", "we", "f", "wf")
    assert simulate(p, out).makespan_ns == 700


def test_fills_a_stall_with_ready_compute() -> None:
    """a (100) -> all_gather c (size 200: 300 ns) -> wait -> b (100); d (200) independent, last.
    In order a, c, wc, b, d the wait stalls 300 ns: 100 + 300 + 100 + 200 = 700. d fits the
    stall and is ready: a, c, d, wc, b runs d under c: 100 + 300 + 100 = 500, the chain's length."""
    p = make_problem([
        compute("a", 100, heavy=True),
        coll("c", kind=AG, runtime_ns=300, bytes_in=100, bytes_out=100, deps=["a"]),
        wait("wc", "c"),
        compute("b", 100, deps=["wc"], heavy=True),
        compute("d", 200, heavy=True),
    ])
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 700
    out = fill_stalls(p, base)
    assert out.order == ("a", "c", "d", "wc", "b")
    assert simulate(p, out).makespan_ns == 500


@pytest.mark.parametrize("p", tiny_problems(20, seed=13), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    base = overlap_schedule(p)
    r0 = simulate(p, base)
    for out in (sink_stalled_waits(p, base), fill_stalls(p, base), fill_stalls(p, sink_stalled_waits(p, base))):
        assert check_schedule(p, out) == []
        r = simulate(p, out)
        assert r.makespan_ns <= r0.makespan_ns
        assert r.peak_memory_bytes <= max(original_peak(p), r0.peak_memory_bytes)


def test_issues_a_long_reduction_after_the_collective_it_holds_up() -> None:
    """On group A: a (100) -> all_reduce r (size 900: 1000 ns, feeds only the output); b (100)
    -> all_gather g (size 100: 200 ns) -> wait -> c (1000). In order a, r, b, g, wg, c, wr the
    gather queues behind r: r 100..1100, g 1100..1300, c 1300..2300. Issuing r after g
    (a, b, g, r, wg, c, wr): g 200..400, r 400..1400 behind it, c 400..1400: 1400 ns, the
    chain a, b, g, c, with r hidden under c."""
    p = make_problem([
        compute("a", 100, heavy=True),
        coll("r", "A", AR, runtime_ns=1000, bytes_in=450, bytes_out=450, deps=["a"]),
        compute("b", 100, heavy=True),
        coll("g", "A", AG, runtime_ns=200, bytes_in=50, bytes_out=50, deps=["b"]),
        wait("wg", "g"),
        compute("c", 1000, deps=["wg"], heavy=True),
        wait("wr", "r"),
    ])
    base = Schedule.original(p)
    assert simulate(p, base).makespan_ns == 2300
    out = sink_stalled_waits(p, base)
    assert out.order == ("a", "b", "g", "r", "wg", "c", "wr")
    assert simulate(p, out).makespan_ns == 1400
