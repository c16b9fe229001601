"""Memory cuts (solver/memory_cuts.py) and the budget-aware makespan bound built on them.

Hand-derived values, and never above the brute-force optimum within the same budget.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from fxsched.solver import stream_bound
from fxsched.solver.bounds import _weights, makespan_lower_bound
from fxsched.solver.memory_cuts import CutGraph, bucket_size_caps, spike_bytes
from fxsched.solver.problem import OpKind, bit_mask
from fxsched.solver.simulator import simulate
from fxsched.solver.schedule import Schedule
from oracle import brute_force, default_budget
from solver_builders import RS, coll, compute, curves_for, make_problem, storage, wait
from tiny_instances import latency_dominated, tiny_problems

LATENCY_CURVE = ((0, 5_000), (1_000, 5_100))  # 5000 ns + 0.1 ns per byte: bucketing pays


def two_gathers():
    """c1, c2 gather params p1, p2 (100 B each, never freed) into g1, g2 (1000 B); b1 reads g1,
    b2 reads g2 and the input activation x (1000 B) after b1. Alone a gather of 1100 B takes
    5110 ns; a bucket of both (2200 B) 5220 ns."""
    p = make_problem([
        coll("c1", runtime_ns=5_110, uses=["p1"], allocates=["g1"], bytes_in=100, bytes_out=1_000),
        wait("w1", "c1", uses=["g1"]),
        coll("c2", runtime_ns=5_110, uses=["p2"], allocates=["g2"], bytes_in=100, bytes_out=1_000),
        wait("w2", "c2", uses=["g2"]),
        compute("b1", 10, deps=["w1"], uses=["g1"], heavy=True),
        compute("b2", 10, deps=["b1", "w2"], uses=["g2", "x"], heavy=True),
    ], [storage("p1", 100, param=True), storage("p2", 100, param=True), storage("x", 1_000, inp=True),
        storage("g1", 1_000), storage("g2", 1_000)], groups=("A",))
    return dataclasses.replace(p, comm_curves=curves_for(("A",), LATENCY_CURVE))


def _live(p, name: str) -> int:
    """The cut of collective ``name``: its ancestors and itself before, its wait and after."""
    i, w, n = p.index[name], p.index[p.wait_of[name]], len(p.ops)
    anc = np.append(np.flatnonzero(bit_mask(p.ancestors[i], n)), i)
    desc = np.append(np.flatnonzero(bit_mask(p.descendants[w], n)), w)
    return CutGraph(p).live_bytes(anc, desc)


def test_cut_counts_what_every_order_keeps_live() -> None:
    """At c1's bucket wait, b1 and b2 are still to run: x (1000, read by b2) and the params
    (200, never freed) are live in every order; g2 need not be (c2 may come later)."""
    p = two_gathers()
    assert _live(p, "c1") == 1_200
    assert _live(p, "c2") == 1_200


def test_cut_takes_the_cheaper_side_of_a_recompute() -> None:
    """t (1000 B, input) feeds z, which makes y (300 B) for b after c's wait. z may run before
    or after the wait: either t or y is live then, so at least 300 B; nothing forces t alone."""
    p = make_problem([
        coll("c", runtime_ns=500, bytes_in=100, bytes_out=100),
        wait("w", "c"),
        compute("z", 10, uses=["t"], allocates=["y"]),
        compute("b", 10, deps=["w", "z"], uses=["y"], heavy=True),
    ], [storage("t", 1_000, inp=True), storage("y", 300)])
    assert _live(p, "c") == 300


def test_spike_is_what_the_simulator_peaks_at() -> None:
    """An all_gather member adds its flat input and output buffers and its copied-out output:
    100 + 1000 + 1000 = 2100 B; both in one bucket peak at 1200 + 4200 = 5400 B in the simulator."""
    p = two_gathers()
    assert spike_bytes(p, p.op_by_name["c1"]) == 2_100
    s = Schedule(("c1", "c2", "w1", "w2", "b1", "b2"), (("c1", "c2"),))
    assert simulate(p, s).peak_memory_bytes == 1_200 + 2 * 2_100


def test_budget_below_the_bucket_proves_the_lone_optimum() -> None:
    """With 3300 B the bucket (5400 B at its wait) cannot fit, while both gathers alone can
    (200 + 1000 + 2000 = 3200 B). Each bucket holding c1 is at most (3300 - 1200) * 1100 / 2100
    = 1100 B, i.e. c1 alone: each gather pays its lone 5110 ns, back to back, and b2 (10 ns)
    follows the second: 10230 ns, the optimum. Without the budget one bucket of both is possible:
    the stream term (time reversed: b2 needs c2's bytes after 10 ns, b1 needs c1's after 20) knows
    that a bucket of more than 1100 B holds both and copies its 2000 output bytes out (100 + 2000
    ns) before b1: 20 + 2100 + 5220 = 7340 ns (a first part of s <= 1100 B, which may run alone
    without a copy, costs its 5000 ns latency before the rest: 10,230), less a grid cell of bytes
    in the copy (2200 / 512 B, under 10 ns). The head/tail terms alone give 5220 + 10."""
    p = two_gathers()
    caps = bucket_size_caps(p, 3_300)
    assert caps["c1"] == pytest.approx(1_100)
    assert makespan_lower_bound(p, 3_300).makespan_ns == 10_230
    assert brute_force(p, budget_bytes=3_300).best_makespan_ns == 10_230
    assert 7_330 <= makespan_lower_bound(p).makespan_ns <= 7_340
    loose = brute_force(p, budget_bytes=5_400).best_makespan_ns
    assert makespan_lower_bound(p, 5_400).makespan_ns <= loose < 10_230


def test_reduce_scatter_bucket_needs_its_flat_input() -> None:
    """Two reduce_scatters (200 B in, 100 B out, 5030 ns alone, 5060 ns as a bucket of 600 B);
    a bucket's flat input is 400 B. Within 200 B they run alone, 5030 + 5030, then b (1000):
    11060 ns, which the bound proves; within 400 B the bucket fits and the bound stays below."""
    p = make_problem([
        coll("c1", "A", RS, runtime_ns=5_030, bytes_in=200, bytes_out=100), wait("w1", "c1"),
        coll("c2", "A", RS, runtime_ns=5_030, bytes_in=200, bytes_out=100), wait("w2", "c2"),
        compute("b", 1_000, deps=["w1", "w2"]),
    ], groups=("A",))
    p = dataclasses.replace(p, comm_curves=curves_for(("A",), LATENCY_CURVE))
    assert makespan_lower_bound(p, 200).makespan_ns == 11_060 == brute_force(p, budget_bytes=200).best_makespan_ns
    assert makespan_lower_bound(p, 400).makespan_ns <= brute_force(p, budget_bytes=400).best_makespan_ns == 6_560


PROBLEMS = tiny_problems(20, seed=7)
PROBLEMS += [latency_dominated(p, random.Random(i)) for i, p in enumerate(PROBLEMS)]


@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_budget_bound_never_exceeds_the_optimum_within_the_budget(idx: int, scale: float) -> None:
    p = PROBLEMS[idx]
    budget = int(default_budget(p) * scale)
    opt = brute_force(p, budget_bytes=budget).best_makespan_ns
    assert opt is not None  # the original order fits
    assert makespan_lower_bound(p).makespan_ns <= makespan_lower_bound(p, budget).makespan_ns <= opt


def test_budget_bound_is_stronger_somewhere() -> None:
    """Not vacuous: on some tiny problems the budget proves more than the bound without one."""
    ps = tiny_problems(60, seed=40)
    ps += [latency_dominated(p, random.Random(i)) for i, p in enumerate(ps)]
    stronger = sum(makespan_lower_bound(p, int(default_budget(p) * 1.1)).makespan_ns > makespan_lower_bound(p).makespan_ns
                   for p in ps)
    assert stronger >= 3


def _live_by_definition(p, done: set[str]) -> int:
    """The memory live once exactly the ops ``done`` have run, by the cut's definition: a storage
    counts when it exists (made by a done op, a graph input, or a collective's output that a
    done consumer or wait has seen) and is still to be read (or never freed)."""
    makers = {s: op for op in p.ops for s in op.allocates}
    live = 0
    for st in p.storages:
        users = {op.name for op in p.ops if st.name in op.uses}
        maker = makers.get(st.name)
        if maker is not None and maker.kind is OpKind.COLLECTIVE:
            exists = bool((users - {maker.name}) & done)
            users -= {maker.name}
        else:
            exists = st.is_input or maker is None or maker.name in done
        if st.size_bytes and exists and (users - done or st.never_freed):
            live += st.size_bytes
    return live


@pytest.mark.parametrize("idx", range(6))
def test_least_priced_is_the_least_over_closed_sets(idx: int) -> None:
    """One cut gives the least of ``scale * live + per_ns * compute - m * bytes`` over every set of
    ops closed under dependencies, enumerated here (the stream bound's memory prices)."""
    p = two_gathers() if idx == 0 else tiny_problems(6, seed=3)[idx]
    names = [op.name for op in p.ops]
    weights = _weights(p)
    sizes = np.array([op.collective.size_bytes if op.collective else 0 for op in p.ops], dtype=np.int64)
    graph = CutGraph(p)
    for scale, per_ns, m in ((1, 0, 0), (4, 3, 1), (2, 1, 5)):
        best = None
        for mask in range(1 << len(names)):
            done = {n for k, n in enumerate(names) if mask >> k & 1}
            if any(d not in done for n in done for d in p.op_by_name[n].deps):
                continue  # not closed
            val = (scale * _live_by_definition(p, done) + per_ns * int(weights[[p.index[n] for n in done]].sum())
                   - m * int(sizes[[p.index[n] for n in done]].sum()))
            best = val if best is None else min(best, val)
        assert graph.least_priced(weights, sizes, scale, per_ns, m) == best


def test_memory_prices_bind_somewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous, and sound where it binds: within the original order's peak, the memory a
    bucket of reductions needs at its issue raises the stream bound on a few tiny problems (4 of
    120 at this writing), never lowers it, and stays at most the brute-force optimum there."""
    ps = tiny_problems(60, seed=40)
    ps += [latency_dominated(p, random.Random(i)) for i, p in enumerate(ps)]
    with_memory = [makespan_lower_bound(p, default_budget(p)).makespan_ns for p in ps]
    monkeypatch.setattr(stream_bound, "_memory_late", lambda *args: None)
    without = [makespan_lower_bound(p, default_budget(p)).makespan_ns for p in ps]
    assert all(a >= b for a, b in zip(with_memory, without))
    raised = [(p, a) for p, a, b in zip(ps, with_memory, without) if a > b]
    assert len(raised) >= 2
    for p, a in raised:
        assert a <= brute_force(p, budget_bytes=default_budget(p)).best_makespan_ns
