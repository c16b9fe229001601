"""Property tests on random valid problems (tests/solver/random_dags.py).

Invariants of the execution model checked on every simulated schedule: makespan = compute +
exposed; exposed >= 0; a collective starts no earlier than it is issued and runs for its priced
runtime; per group, collectives run one at a time in issue order; the peak bounds the curve.
Unbucketed schedules are also compared with a small independent re-derivation of the model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fxsched.solver import (
    CollectiveKind,
    CollectiveTiming,
    OpKind,
    Schedule,
    ScheduleError,
    ScheduleProblem,
    SimResult,
    check_schedule,
    simulate,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from random_dags import (
    Chooser,
    Draw,
    problems,
    problems_with_order,
    random_bucketing,
    random_problem,
    random_topological_order,
)

SETTINGS = settings(
    max_examples=300, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def bucketable_problem(src: Chooser | random.Random) -> ScheduleProblem:
    """Fewer bucket keys, so that random bucketings find compatible collectives more often."""
    return random_problem(src, kinds=(CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER),
                          reduce_ops=("sum",), max_groups=2)


def base_compute(p: ScheduleProblem) -> int:
    return sum(op.runtime_ns for op in p.ops if op.kind in (OpKind.COMPUTE, OpKind.ZERO))


def bucket_copy_ns(p: ScheduleProblem, buckets: Sequence[Sequence[str]]) -> int:
    total = 0
    for b in buckets:
        infos = [p.op_by_name[m].collective for m in b]
        assert all(i is not None for i in infos)
        total += p.bucket_costs.copy_ns(sum(i.bytes_in for i in infos))  # type: ignore[union-attr]
        if infos[0].kind.bucket_copies_out:  # type: ignore[union-attr]
            total += p.bucket_costs.copy_ns(sum(i.bytes_out for i in infos))  # type: ignore[union-attr]
    return total


def check_invariants(p: ScheduleProblem, sched: Schedule, r: SimResult) -> None:
    assert r.makespan_ns == r.compute_ns + r.exposed_ns
    assert r.exposed_ns >= 0 and r.exposed_ns == sum(c.exposed_ns for c in r.collectives)
    assert r.compute_ns == base_compute(p) + bucket_copy_ns(p, sched.buckets)
    assert r.n_collectives == len(p.collectives) - sum(len(b) - 1 for b in sched.buckets)
    members = sorted(m for c in r.collectives for m in c.members)
    assert members == sorted(c.name for c in p.collectives)
    pos = {n: i for i, n in enumerate(sched.order)}
    by_group: dict[str, list[CollectiveTiming]] = {}
    for c in r.collectives:
        assert c.issue_pos == max(pos[m] for m in c.members)
        assert c.wait_pos == min(pos[p.wait_of[m]] for m in c.members) > c.issue_pos
        assert c.start_ns >= c.issue_ns and c.wait_ns >= c.issue_ns
        assert c.end_ns - c.start_ns == p.bucket_runtime_ns(c.members)
        assert c.exposed_ns == max(0, c.end_ns - c.wait_ns)
        assert c.wait_ns + c.exposed_ns <= r.makespan_ns
        by_group.setdefault(c.group, []).append(c)
    assert r.comm_ns == sum(c.runtime_ns for c in r.collectives)
    for timings in by_group.values():
        timings.sort(key=lambda c: c.issue_pos)
        for prev, nxt in zip(timings, timings[1:], strict=False):
            assert nxt.issue_ns >= prev.issue_ns
            assert nxt.start_ns >= prev.end_ns  # FIFO: one at a time, in issue order
    assert len(r.memory_curve) == len(sched.order)
    assert all(v >= 0 for v in r.memory_curve)
    assert r.peak_memory_bytes >= max([r.initial_memory_bytes, *r.memory_curve])
    assert r.peak_memory_bytes in (r.initial_memory_bytes, *r.memory_curve)
    assert r.initial_memory_bytes == sum(s.size_bytes for s in p.storages if s.is_input)


def reference(p: ScheduleProblem, order: Sequence[str]) -> tuple[int, int, dict[str, tuple[int, int]], list[int]]:
    """Independent re-derivation for unbucketed schedules: (makespan, exposed, {coll: (start, end)},
    memory curve)."""
    ops = p.op_by_name
    t = exposed = 0
    group_end: dict[str, int] = {}
    span: dict[str, tuple[int, int]] = {}
    for name in order:
        op = ops[name]
        if op.kind is OpKind.COLLECTIVE:
            assert op.collective is not None
            start = max(t, group_end.get(op.collective.group, 0))
            span[name] = (start, start + op.runtime_ns)
            group_end[op.collective.group] = start + op.runtime_ns
        elif op.kind is OpKind.WAIT:
            assert op.waits_on is not None
            stall = max(0, span[op.waits_on][1] - t)
            t, exposed = t + stall, exposed + stall
        else:
            t += op.runtime_ns
    pos = {n: i for i, n in enumerate(order)}
    born = {s.name: -1 for s in p.storages if s.is_input}
    last: dict[str, int] = {}
    for op in p.ops:
        for s in op.allocates:
            born[s] = pos[op.name]
        at = pos[p.wait_of[op.name]] if op.kind is OpKind.COLLECTIVE else pos[op.name]
        for s in op.uses:
            last[s] = max(last.get(s, -1), at)
    curve = []
    for i in range(len(order)):
        live = 0
        for s in p.storages:
            dies = max(born[s.name], last.get(s.name, born[s.name]))
            if born[s.name] <= i and (s.never_freed or i <= dies):
                live += s.size_bytes
        curve.append(live)
    return t, exposed, span, curve


def check_against_reference(p: ScheduleProblem, sched: Schedule, r: SimResult) -> None:
    makespan, exposed, span, curve = reference(p, sched.order)
    assert (r.makespan_ns, r.exposed_ns) == (makespan, exposed)
    assert {c.name: (c.start_ns, c.end_ns) for c in r.collectives} == span
    assert list(r.memory_curve) == curve


@SETTINGS
@given(problems())
def test_original_order_is_valid_and_consistent(p: ScheduleProblem) -> None:
    sched = Schedule.original(p)
    assert check_schedule(p, sched) == []
    r = simulate(p, sched)
    check_invariants(p, sched, r)
    check_against_reference(p, sched, r)


@SETTINGS
@given(problems_with_order())
def test_random_topological_order_is_valid_and_keeps_compute(case: tuple[ScheduleProblem, tuple[str, ...]]) -> None:
    p, order = case
    sched = Schedule(order)
    assert check_schedule(p, sched) == []
    r = simulate(p, sched)
    check_invariants(p, sched, r)
    check_against_reference(p, sched, r)
    original = simulate(p)
    assert r.compute_ns == original.compute_ns == base_compute(p)
    assert r.comm_ns == original.comm_ns
    assert r.initial_memory_bytes == original.initial_memory_bytes


@st.composite
def bucketed_cases(draw: Draw) -> tuple[ScheduleProblem, Schedule]:
    ch = Chooser(draw)
    p = bucketable_problem(ch)
    order = random_topological_order(p, ch, late_waits=ch.chance(0.8))
    multi = ch.chance(0.5)
    return p, Schedule(order, random_bucketing(p, order, ch, multi_dtype=multi), multi)


@SETTINGS
@given(bucketed_cases())
def test_random_valid_bucketing(case: tuple[ScheduleProblem, Schedule]) -> None:
    p, sched = case
    assert check_schedule(p, sched) == []
    r = simulate(p, sched)
    check_invariants(p, sched, r)
    unbucketed = simulate(p, Schedule(sched.order))
    assert r.compute_ns == unbucketed.compute_ns + bucket_copy_ns(p, sched.buckets)


@SETTINGS
@given(problems_with_order(), st.data())
def test_breaking_a_dependency_is_caught(case: tuple[ScheduleProblem, tuple[str, ...]], data: st.DataObject) -> None:
    """Moving an op right before one of its dependencies makes the schedule invalid."""
    p, order = case
    with_deps = [op for op in p.ops if op.deps]
    if not with_deps:
        return
    op = with_deps[data.draw(st.integers(0, len(with_deps) - 1))]
    dep = op.deps[data.draw(st.integers(0, len(op.deps) - 1))]
    rest = [n for n in order if n != op.name]
    bad = Schedule((*rest[:rest.index(dep)], op.name, *rest[rest.index(dep):]))
    violations = check_schedule(p, bad)
    assert any(v.op == op.name for v in violations)
    try:
        simulate(p, bad)
    except ScheduleError as e:
        assert e.violations == violations
    else:
        raise AssertionError("simulate accepted an invalid schedule")


def test_seeded_rng_path() -> None:
    """The plain random.Random path: deterministic per seed, valid, and bucketable."""
    n_buckets = 0
    for seed in range(100):
        p = bucketable_problem(random.Random(seed))
        assert p == bucketable_problem(random.Random(seed))
        rng = random.Random(seed)
        order = random_topological_order(p, rng, late_waits=True)
        buckets = random_bucketing(p, order, rng, multi_dtype=True)
        n_buckets += len(buckets)
        sched = Schedule(order, buckets, multi_dtype=True)
        assert check_schedule(p, sched) == []
        check_invariants(p, sched, simulate(p, sched))
    assert n_buckets > 10  # the generator does exercise bucketing
