"""Bucket shifts (heuristics/bucket_shift.py): hand-derived merges and splits checked against the
brute-force oracle, the memory budget and the size cap, and validity on tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.bucket_shift import shift_bucket_members
from fxsched.heuristics.bucketing import bucketed_overlap
from fxsched.heuristics.overlap import OverlapConfig, overlap_schedule
from fxsched.solver import BucketCosts, ProcessGroup, Schedule, ScheduleProblem, simulate

from tests.heuristics.checks import assert_valid_never_worse
from tests.solver.oracle import brute_force
from tests.solver.solver_builders import RS, coll, compute, curves_for, storage, wait
from tests.solver.tiny_instances import tiny_problems

# a collective of s bytes takes 1000 + s ns (a large latency: buckets pay off); a bucket copy of
# b bytes takes ceil(2 * b / 1000) ns (next to nothing)
LATENCY_POINTS = ((0, 1000), (1000, 2000))
CHEAP_COPIES = BucketCosts(memory_bandwidth_gbps=1000.0, launch_overhead_ns=0)


def _problem(ops, storages=(), points=LATENCY_POINTS) -> ScheduleProblem:
    return ScheduleProblem(ops=tuple(ops), storages=tuple(storages), groups=(ProcessGroup("A", 2),),
                           comm_curves=curves_for(["A"], points), bucket_costs=CHEAP_COPIES, name="shift")


def two_gradients() -> ScheduleProblem:
    """a (100 ns) makes g1 for reduce-scatter r1, b (100 ns) makes g2 for r2 (20 bytes each).

    Order a, r1, b, r2, w1, w2: r1 runs 100..1120, r2 queues behind it, 1120..2140: 2140.
    One bucket, issued at r2 (200 ns) after a copy-in of ceil(80 / 1000) = 1 ns: 201..1241: 1241.
    Its peak is the two gradients and the 40-byte flat buffer (80 bytes) where the lone
    reduce-scatters peak at the two gradients (40 bytes).
    """
    return _problem([
        compute("a", 100, allocates=["g1"]),
        coll("r1", kind=RS, runtime_ns=1020, bytes_in=20, deps=["a"], uses=["g1"]),
        compute("b", 100, allocates=["g2"]),
        coll("r2", kind=RS, runtime_ns=1020, bytes_in=20, deps=["b"], uses=["g2"]),
        wait("w1", "r1"),
        wait("w2", "r2"),
    ], [storage("g1", 20), storage("g2", 20)])


def test_merges_two_reduce_scatters() -> None:
    p = two_gradients()
    base = Schedule.original(p)
    r0 = simulate(p, base)
    assert (r0.makespan_ns, r0.peak_memory_bytes) == (2140, 40)
    out = shift_bucket_members(p, base, budget_bytes=80)
    assert [set(b) for b in out.buckets] == [{"r1", "r2"}]
    assert simulate(p, out).makespan_ns == 1241 == brute_force(p, budget_bytes=80).best_makespan_ns


def test_budget_and_cap_refuse_the_merge() -> None:
    p = two_gradients()
    base = Schedule.original(p)
    assert shift_bucket_members(p, base, budget_bytes=79) == base  # the bucket peaks at 80 bytes
    assert shift_bucket_members(p, base, budget_bytes=80, cap_bytes=39) == base  # it holds 40 bytes
    assert shift_bucket_members(p, base, budget_bytes=80, cap_bytes=40).buckets


def two_gathers() -> ScheduleProblem:
    """Gathers x1 (needed by c1, 3000 ns) and x2 (needed by c2 after it), 20 bytes each, on a cheap
    curve (100 + s ns).

    One bucket (no input bytes to copy in): 0..140, its wait copies out 40 bytes in 1 ns: c1
    141..3141, c2 ..6141.
    Apart: x1 0..120, x2 120..240 (hidden under c1): c1 120..3120, c2 ..6120.
    """
    return _problem([
        coll("x1", runtime_ns=120, bytes_out=20, allocates=["o1"]),
        coll("x2", runtime_ns=120, bytes_out=20, allocates=["o2"]),
        wait("w1", "x1"),
        compute("c1", 3000, deps=["w1"], uses=["o1"]),
        wait("w2", "x2"),
        compute("c2", 3000, deps=["w2", "c1"], uses=["o2"]),
    ], [storage("o1", 20), storage("o2", 20)], points=((0, 100), (1000, 1100)))


def test_splits_a_bucket_whose_first_member_is_needed_early() -> None:
    p = two_gathers()
    base = Schedule(Schedule.original(p).order, (("x1", "x2"),))
    assert simulate(p, base).makespan_ns == 6141
    out = shift_bucket_members(p, base, budget_bytes=1 << 20)
    assert out.buckets == ()
    assert simulate(p, out).makespan_ns == 6120 == brute_force(p, budget_bytes=1 << 20).best_makespan_ns


def test_max_evals_and_moves_bound_the_work() -> None:
    p = two_gradients()
    base = Schedule.original(p)
    assert shift_bucket_members(p, base, budget_bytes=80, max_evals=0) == base
    assert shift_bucket_members(p, base, budget_bytes=80, max_moves=0) == base


@pytest.mark.parametrize("p", tiny_problems(20, seed=13), ids=lambda p: p.name)
def test_valid_never_worse_within_budget(p) -> None:
    """From the greedy bucketer's schedule (no cap: every bucket it can form), the shifted schedule
    is valid, no worse, within the original peak, and no better than the oracle."""
    base = bucketed_overlap(p, cap_bytes=1 << 40, config=OverlapConfig())
    r = assert_valid_never_worse(p, base, shift_bucket_members(p, base))
    assert r.makespan_ns >= brute_force(p, budget_bytes=r.peak_memory_bytes).best_makespan_ns


@pytest.mark.parametrize("p", tiny_problems(10, seed=17), ids=lambda p: p.name)
def test_from_unbucketed_valid_never_worse(p) -> None:
    base = overlap_schedule(p)
    r = assert_valid_never_worse(p, base, shift_bucket_members(p, base))
    assert r.makespan_ns >= brute_force(p, budget_bytes=r.peak_memory_bytes).best_makespan_ns


def test_shifts_somewhere() -> None:
    """The property tests above are not vacuous: on their unbucketed tiny problems some shift does
    pay (1 of the 10 at this writing), so an accepted move is among those they check."""
    gains = 0
    for p in tiny_problems(10, seed=17):
        base = overlap_schedule(p)
        gains += simulate(p, shift_bucket_members(p, base)).makespan_ns < simulate(p, base).makespan_ns
    assert gains >= 1
