"""The simulator's array form (solver/simulator.py over solver/sim_tables.py) against the
op-by-op walk of the execution model (reference_sim.py), on random problems, orders and
buckets, with and without link contention; and the checker's array test of an order against a
plain one."""

from __future__ import annotations

import dataclasses
import random

from fxsched.solver import CollectiveKind, Schedule, check_schedule, simulate
from fxsched.solver.sim_tables import sim_tables
import numpy as np
from fxsched.solver.simulator import makespan_at, makespan_hidden_at, makespan_ns, memory_curve, peak_at, timed_clocks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_sim
from random_dags import Chooser, Draw, random_bucketing, random_problem, random_topological_order

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def bucketed_cases(draw: Draw):  # noqa: ANN201
    """A random problem (few bucket keys, so buckets form), maybe with link contention, a random
    order with late waits and a random valid bucketing of it."""
    ch = Chooser(draw)
    p = random_problem(ch, max_ops=40, kinds=(CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER,
                                              CollectiveKind.ALL_REDUCE), reduce_ops=("sum",), max_groups=2)
    if ch.chance(0.3):
        p = dataclasses.replace(p, link_contention=0.5)
    order = random_topological_order(p, ch, late_waits=True)
    return p, Schedule(order, random_bucketing(p, order, ch))


@SETTINGS
@given(bucketed_cases())
def test_simulate_matches_the_op_by_op_walk(case) -> None:  # noqa: ANN001
    p, s = case
    timings, makespan, compute, exposed, clocks = reference_sim.timeline(p, s)
    initial, curve = reference_sim.memory(p, s)
    r = simulate(p, s)
    assert list(r.collectives) == timings
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (makespan, compute, exposed)
    assert (r.initial_memory_bytes, list(r.memory_curve)) == (initial, curve)
    assert r.peak_memory_bytes == max([initial, *curve])
    assert timed_clocks(p, s) == (timings, clocks)
    assert makespan_ns(p, s) == makespan
    at = np.array([p.index[n] for n in s.order])
    assert makespan_at(p, at, s.buckets) == makespan
    hidden = sum(t.exposed_ns == 0 and t.hideable for t in timings)
    assert makespan_hidden_at(p, at, s.buckets) == (makespan, hidden) == (makespan, r.n_hidden_hideable)
    assert peak_at(p, at, s.buckets) == max([initial, *curve])
    assert memory_curve(p, s) == (initial, curve)


def test_the_random_cases_hold_buckets_of_every_kind() -> None:
    """The comparison above is not vacuous: seeded draws of the same generator bucket all_gathers
    (copy-out), reduce_scatters and all_reduces (one flat output)."""
    seen: set[CollectiveKind] = set()
    for seed in range(200):
        rng = random.Random(seed)
        p = random_problem(rng, max_ops=40, kinds=(CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER,
                                                   CollectiveKind.ALL_REDUCE), reduce_ops=("sum",), max_groups=2)
        order = random_topological_order(p, rng, late_waits=True)
        for b in random_bucketing(p, order, rng):
            seen.add(p.op_by_name[b[0]].collective.kind)  # type: ignore[union-attr]
    assert seen == {CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE}


def _plainly_complete_and_topological(p, order) -> bool:  # noqa: ANN001
    if sorted(order) != sorted(op.name for op in p.ops):
        return False
    pos = {n: i for i, n in enumerate(order)}
    return all(pos[d] < pos[op.name] for op in p.ops for d in op.deps)


@SETTINGS
@given(st.data())
def test_the_array_order_test_agrees_with_a_plain_one(data) -> None:  # noqa: ANN001
    """Orders broken every way the checker names (swapped, dropped, doubled, unknown ops) are
    recognised as not complete-and-topological exactly when a plain check says so, and then
    ``check_schedule`` still names a violation."""
    ch = Chooser(data.draw)
    p = random_problem(ch, max_ops=30)
    order = list(random_topological_order(p, ch))
    how = ch.choice(("keep", "swap", "drop", "double", "unknown"))
    if how == "swap" and len(order) > 1:
        i, j = ch.integer(0, len(order) - 1), ch.integer(0, len(order) - 1)
        order[i], order[j] = order[j], order[i]
    elif how == "drop" and order:
        order.pop(ch.integer(0, len(order) - 1))
    elif how == "double" and order:
        order.insert(ch.integer(0, len(order)), ch.choice(order))
    elif how == "unknown":
        order.insert(ch.integer(0, len(order)), "no_such_op")
    fast = sim_tables(p).is_complete_topological(p, order)
    assert fast == _plainly_complete_and_topological(p, order)
    if not fast:
        assert check_schedule(p, Schedule(tuple(order)))


def test_a_lone_collectives_unread_output_lives_until_its_wait() -> None:
    """The comm stream writes a lone collective's output until its wait, read or not: ``ag``
    (position 1) allocates G (100 bytes) that no op reads; its wait is at position 3. Memory:
    S (50, an input read by ag until its wait) from the start through position 3; G over 1..3.
    Curve: [50, 150, 150, 150, 0]."""
    from solver_builders import coll, compute, make_problem, storage, wait

    p = make_problem([
        compute("A", 10),
        coll("ag", runtime_ns=20, uses=["S"], allocates=["G"], bytes_in=50, bytes_out=100),
        compute("B", 10),
        wait("w", "ag"),
        compute("C", 10),
    ], [storage("S", 50, inp=True), storage("G", 100)])
    assert memory_curve(p, Schedule.original(p)) == (50, [50, 150, 150, 150, 0])
    assert reference_sim.memory(p, Schedule.original(p)) == (50, [50, 150, 150, 150, 0])


def test_unit_tables_are_kept_per_bucketing_and_bounded(monkeypatch) -> None:  # noqa: ANN001
    """A bucketing's units are built once and reused; when more bucketings than the table holds
    have been scored the table starts over, and every answer stays the op-by-op walk's."""
    from fxsched.solver import sim_tables as tables_module

    rng = random.Random(7)
    p = random_problem(rng, max_ops=40, kinds=(CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER),
                       reduce_ops=("sum",), max_groups=2)
    cases = []
    for _ in range(40):
        order = random_topological_order(p, rng, late_waits=True)
        cases.append(Schedule(order, random_bucketing(p, order, rng)))
    assert len({s.buckets for s in cases}) > 4  # several bucketings, so the bound below is reached
    monkeypatch.setattr(tables_module, "MAX_BUCKETINGS", 3)
    monkeypatch.setattr(tables_module, "MAX_UNITS", 5)
    tables = sim_tables(p)
    first = tables.units(p, cases[0].buckets)
    assert tables.units(p, cases[0].buckets) is first
    for s in cases + cases:
        simulate(p, s)
        assert len(tables._unit_tables) <= 3 and len(tables._units) <= 5
        timings, makespan, compute, exposed, _ = reference_sim.timeline(p, s)
        r = simulate(p, s)
        assert list(r.collectives) == timings and r.makespan_ns == makespan
        assert (r.initial_memory_bytes, list(r.memory_curve)) == reference_sim.memory(p, s)
