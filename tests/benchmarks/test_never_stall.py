"""The never-stall probe (benchmarks/never_stall.py) on hand-derived problems."""

from __future__ import annotations

import dataclasses

import pytest

from fxsched.benchmarks.never_stall import ProbeConfig, never_stall
from fxsched.solver import Schedule, simulate
from tests.solver.solver_builders import RS, coll, compute, make_problem, wait


def _gather_then_fill():
    """g (a gather, 300 ns) feeds m (100 ns); f (400 ns) needs nothing; m and f feed r (a
    reduce-scatter, 200 ns). In program order (g, m, f, r) m waits 300 ns for g. Running f first
    covers g (done at 300, m starts at 400): the compute stream never stalls, and r, issued after
    all compute, is the one unit left to stall: 200 ns, makespan 500 + 200 = 700 ns."""
    return make_problem([coll("g", runtime_ns=300), wait("vg", "g"), compute("m", 100, deps=["vg"]),
                         compute("f", 400), coll("r", kind=RS, runtime_ns=200, deps=["m", "f"]),
                         wait("wr", "r")])


def test_fill_covers_the_gather_and_only_the_last_reduce_scatter_stalls() -> None:
    p = _gather_then_fill()
    original = simulate(p, Schedule.original(p))
    assert original.exposed_ns == 300 + 200  # vg stalls behind g, wr behind r
    sched, res = never_stall(p)
    assert sched.order.index("f") < sched.order.index("m")
    assert [(c.name, c.exposed_ns) for c in res.collectives if c.exposed_ns] == [("r", 200)]
    assert res.makespan_ns == 700
    assert res.n_hidden_hideable_members == res.n_hideable_members == 1  # g; nothing is independent of r


def test_the_reduce_scatter_issued_last_is_waited_first() -> None:
    """a (100) feeds r1 (400 ns), b (100) feeds r2 (100 ns); r1 and r2 belong to two modules, so
    they are two units. With no gather to keep ahead of, each issues once its input is ready: r1 at
    100, running to 500, r2 at 200, queued behind it, 500..600. r2 is issued last, so it is waited
    first, at 200: it stalls 600 - 200 = 400 ns and leaves r1 done; nothing else stalls."""
    r1 = dataclasses.replace(coll("r1", kind=RS, runtime_ns=400, deps=["a"]), module="l1")
    r2 = dataclasses.replace(coll("r2", kind=RS, runtime_ns=100, deps=["b"]), module="l2")
    p = make_problem([compute("a", 100), r1, wait("w1", "r1"), compute("b", 100), r2, wait("w2", "r2")])
    sched, res = never_stall(p)
    assert sched.order == ("a", "r1", "b", "r2", "w2", "w1")
    assert [(c.name, c.exposed_ns) for c in res.collectives if c.exposed_ns] == [("r2", 400)]
    assert res.makespan_ns == 600


def test_config_rejects_negative_knobs() -> None:
    with pytest.raises(ValueError, match="ProbeConfig.window"):
        ProbeConfig(window=-1)
