"""Greedy bucketing (fxsched.heuristics.bucketing): hand-derived cases and properties.

Conventions from tests/solver/solver_builders: comm curve ``runtime(size) = 100 + size`` ns
(size = bytes_in + bytes_out) unless a test sets its own, bucket copy ``copy_ns(b) = 100 + b``.
"""

from __future__ import annotations

import random

import pytest
from fxsched.heuristics.bucketing import (
    BucketFeasibility,
    bucket_greedy,
    bucketed_overlap,
    exposed_collectives,
    memory_headroom,
)
from fxsched.heuristics.overlap import OverlapConfig, original_peak, overlap_schedule
from fxsched.heuristics.placement import Placement
from fxsched.solver import (
    BucketCosts,
    CollectiveKind,
    CommCurve,
    Schedule,
    ScheduleProblem,
    check_schedule,
    simulate,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.solver.random_dags import random_problem
from tests.solver.solver_builders import AG, AR, RS, coll, compute, make_problem, storage, wait

MB = 2**20


def ag(name: str, size: int, *, dtype: str = "bf16", group: str = "A", deps: tuple[str, ...] = ()):
    """An all_gather over 2 ranks whose output is ``size`` bytes (input size/2)."""
    return coll(name, group, AG, bytes_in=size // 2, bytes_out=size, runtime_ns=100 + size + size // 2,
                dtype=dtype, deps=deps)


def assert_valid_with(p: ScheduleProblem, buckets, multi_dtype: bool = False) -> Schedule:
    sched = overlap_schedule(p, buckets, multi_dtype=multi_dtype)
    assert check_schedule(p, sched) == []
    return sched


# ---------------------------------------------------------------- cap


def cap_problem(sizes: list[int]) -> ScheduleProblem:
    """Independent all_gathers c0.., each waited and consumed by its own compute n0.., in order."""
    ops = [ag(f"c{i}", s) for i, s in enumerate(sizes)]
    for i in range(len(sizes)):
        ops += [wait(f"w{i}", f"c{i}"), compute(f"n{i}", 1000, deps=[f"w{i}"])]
    return make_problem(ops)


def test_cap_respected() -> None:
    """3 x 100 MB under a 250 MB cap: the first two fit (200 MB), the third would make 300."""
    p = cap_problem([100 * MB] * 3)
    assert bucket_greedy(p, cap_bytes=250 * MB) == (("c0", "c1"),)
    assert bucket_greedy(p, cap_bytes=300 * MB) == (("c0", "c1", "c2"),)
    assert bucket_greedy(p, cap_bytes=150 * MB) == ()
    assert_valid_with(p, bucket_greedy(p, cap_bytes=250 * MB))


def test_size_is_max_of_in_and_out() -> None:
    """An all_gather counts its output (100 MB), a reduce_scatter its input (100 MB)."""
    ops = [coll("r0", "A", RS, bytes_in=100 * MB, bytes_out=50 * MB, runtime_ns=5),
           coll("r1", "A", RS, bytes_in=100 * MB, bytes_out=50 * MB, runtime_ns=5),
           wait("w0", "r0"), wait("w1", "r1"), compute("n", 10, deps=["w0", "w1"])]
    p = make_problem(ops)
    assert bucket_greedy(p, cap_bytes=200 * MB) == (("r0", "r1"),)
    assert bucket_greedy(p, cap_bytes=200 * MB - 1) == ()


def test_collective_larger_than_cap_stays_alone() -> None:
    p = cap_problem([300 * MB, 100 * MB, 100 * MB])
    assert bucket_greedy(p, cap_bytes=250 * MB) == (("c1", "c2"),)


def test_headroom_caps_each_bucket() -> None:
    """3 x 100 MB, cap 1 GB. Headroom 300/300/50 MB: c0 and c1 fit (200 MB <= 100 + 300 each),
    c2's own cap is 150 MB, so it stays out. With c1 at 50 MB no two fit (200 > 150)."""
    p = cap_problem([100 * MB] * 3)
    assert bucket_greedy(p, cap_bytes=1000 * MB) == (("c0", "c1", "c2"),)
    room = {"c0": 300 * MB, "c1": 300 * MB, "c2": 50 * MB}
    assert bucket_greedy(p, cap_bytes=1000 * MB, headroom=room) == (("c0", "c1"),)
    assert bucket_greedy(p, cap_bytes=150 * MB, headroom=room) == ()
    assert bucket_greedy(p, cap_bytes=1000 * MB, headroom={**room, "c1": 50 * MB}) == ()


def test_memory_headroom_by_hand() -> None:
    """c gathers a 50-byte input into a 100-byte output that n reads. Original order c, w, n: the
    input (live from the start) and the output (from c's issue) are both live at c's issue and at
    its wait (150 bytes); under a 400-byte budget c's headroom is 250 bytes, 125 at share 0.5."""
    p = make_problem([
        coll("c", "A", AG, runtime_ns=100, bytes_in=50, bytes_out=100, allocates=["out"], uses=["in"]),
        wait("w", "c"),
        compute("n", 10, deps=["w"], uses=["out"]),
    ], storages=[storage("in", 50, inp=True), storage("out", 100)])
    base = Schedule.original(p)
    assert simulate(p, base).memory_curve == (150, 150, 100)
    assert memory_headroom(p, base, 400) == {"c": 250}
    assert memory_headroom(p, base, 400, share=0.5) == {"c": 125}
    assert memory_headroom(p, base, 100) == {"c": 0}


# ---------------------------------------------------------------- dependencies


def chain_dependent_problem(dtype2: str) -> ScheduleProblem:
    """c2 reads c1's result through compute ``a``, which feeds only c2 (c2's producer-only
    chain), so the fixed-order frame alone would allow the pair: both units span slot 0."""
    ops = [ag("c1", 20), wait("w1", "c1"), compute("a", 10, deps=["w1"]),
           ag("c2", 20, dtype=dtype2, deps=("a",)), wait("w2", "c2"),
           ag("c3", 20, dtype=dtype2), wait("w3", "c3"),
           compute("h", 1000, deps=["w2", "w3"], heavy=True)]
    return make_problem(ops)


@pytest.mark.parametrize(("dtype2", "multi_dtype"), [("bf16", False), ("bf16", True), ("f32", True)])
def test_dependent_members_refused(dtype2: str, multi_dtype: bool) -> None:
    p = chain_dependent_problem(dtype2)
    assert p.depends_on("c2", "c1")
    pl = Placement(p)
    assert pl.units["c2"].chain == ("a",)
    feas = BucketFeasibility(p, pl)
    assert feas.frame_feasible(["c1", "c2"])  # only the dependency rule refuses the pair
    assert not feas.independent(["c1"], "c2")
    assert not feas.can_join(["c1"], "c2")
    buckets = bucket_greedy(p, cap_bytes=10**9, multi_dtype=multi_dtype)
    assert not any({"c1", "c2"} <= set(b) for b in buckets)
    assert_valid_with(p, buckets, multi_dtype)


@pytest.mark.parametrize("multi_dtype", [False, True])
def test_dependent_through_backbone_compute_refused(multi_dtype: bool) -> None:
    """c2 reads heavy compute h, which reads c1's wait; c3 is independent and needed later."""
    ops = [ag("c1", 20), wait("w1", "c1"), compute("h", 100, deps=["w1"], heavy=True),
           ag("c2", 20, dtype="f32" if multi_dtype else "bf16", deps=("h",)), ag("c3", 20),
           wait("w2", "c2"), wait("w3", "c3"), compute("k", 100, deps=["w2", "w3"], heavy=True)]
    p = make_problem(ops)
    assert p.depends_on("c2", "c1")
    buckets = bucket_greedy(p, cap_bytes=10**9, multi_dtype=multi_dtype)
    assert not any({"c1", "c2"} <= set(b) for b in buckets)
    # need order c1 (slot 0), c2 and c3 (slot 1): c3 joins c2's bucket, not c1's
    assert buckets == (("c2", "c3"),)
    assert_valid_with(p, buckets, multi_dtype)


def test_frame_infeasible_pair_refused() -> None:
    """c2's input comes from compute x after slot 0, but c1 is needed at slot 0."""
    ops = [ag("c1", 20), wait("w1", "c1"), compute("h", 100, deps=["w1"], heavy=True),
           compute("x", 100, heavy=True), ag("c2", 20, deps=("x",)), wait("w2", "c2"),
           compute("k", 100, deps=["w2"], heavy=True)]
    p = make_problem(ops)
    assert not p.depends_on("c2", "c1")
    assert bucket_greedy(p, cap_bytes=10**9) == ()


# ---------------------------------------------------------------- keys


def two_consumed(*colls) -> ScheduleProblem:
    ops = list(colls)
    ops += [wait(f"w_{c.name}", c.name) for c in colls]
    ops.append(compute("h", 1000, deps=[f"w_{c.name}" for c in colls], heavy=True))
    return make_problem(ops)


def test_mixed_dtype_only_in_multi_dtype_mode() -> None:
    p = two_consumed(ag("c1", 20, dtype="bf16"), ag("c2", 20, dtype="f32"))
    assert bucket_greedy(p) == ()
    buckets = bucket_greedy(p, multi_dtype=True)
    assert buckets == (("c1", "c2"),)
    assert_valid_with(p, buckets, multi_dtype=True)


@pytest.mark.parametrize("multi_dtype", [False, True])
def test_mixed_kind_group_or_op_never(multi_dtype: bool) -> None:
    p = two_consumed(
        ag("c1", 20), coll("c2", "A", RS, bytes_in=20, bytes_out=10, runtime_ns=130),
        ag("c3", 20, group="B"), coll("c4", "A", RS, bytes_in=20, bytes_out=10, runtime_ns=130, reduce_op="avg"),
        coll("c5", "A", AR, bytes_in=20, bytes_out=20, runtime_ns=140), ag("c6", 20),
    )
    assert bucket_greedy(p, multi_dtype=multi_dtype) == (("c1", "c6"),)


# ---------------------------------------------------------------- exposed first


def exposed_problem() -> ScheduleProblem:
    """Original order: c1 hidden behind ``long``; c2 and c3 waited right after their issue."""
    ops = [ag("c1", 100), compute("long", 10_000, heavy=True), wait("w1", "c1"), compute("n1", 10, deps=["w1"]),
           ag("c2", 100), wait("w2", "c2"), compute("n2", 10, deps=["w2"]),
           ag("c3", 100), wait("w3", "c3"), compute("n3", 10, deps=["w3"])]
    return make_problem(ops)


def test_exposed_first_picks_the_exposed_ones() -> None:
    """Cap 250 fits two of the three 100-byte gathers. Need order c1, c2, c3 gives (c1, c2);
    in the original order c1 (250 ns) hides behind 10 us of compute while c2 and c3 stall
    250 ns each, so exposed-first buckets (c2, c3) instead."""
    p = exposed_problem()
    original = Schedule.original(p)
    assert exposed_collectives(p, original) == {"c2", "c3"}
    assert bucket_greedy(p, cap_bytes=250) == (("c1", "c2"),)
    buckets = bucket_greedy(p, cap_bytes=250, exposed_first=True, schedule=original)
    assert buckets == (("c2", "c3"),)
    assert_valid_with(p, buckets)


# ---------------------------------------------------------------- latency


def latency_problem(costs: BucketCosts) -> ScheduleProblem:
    """Two 10 -> 20 byte all_gathers, both needed by the only compute (50 ns)."""
    curve_pts = ((0, 10_000), (1000, 11_000))  # 10 us latency + 1 ns/byte
    ops = [coll(f"c{i}", "A", AG, bytes_in=10, bytes_out=20, runtime_ns=10_030) for i in (1, 2)]
    ops += [wait("w1", "c1"), wait("w2", "c2"), compute("n", 50, deps=["w1", "w2"])]
    p = make_problem(ops, groups=("A",), costs=costs)
    return ScheduleProblem(p.ops, p.storages, p.groups,
                           tuple(CommCurve("A", k, curve_pts) for k in CollectiveKind), costs)


def test_bucketing_saves_latency() -> None:
    """Unbucketed: 10_030 + 10_030 = 20_060 ns of comm, all exposed; makespan 20_110.
    Bucketed: copy-in 100 + 2*20/2 = 120, one collective of 60 bytes = 10_060 ns, copy-out
    100 + 2*40/2 = 140, compute 50: makespan 120 + 10_060 + 140 + 50 = 10_370."""
    p = latency_problem(BucketCosts(memory_bandwidth_gbps=2.0, launch_overhead_ns=100))
    r0 = simulate(p, overlap_schedule(p))
    assert (r0.comm_ns, r0.exposed_ns, r0.makespan_ns) == (20_060, 20_060, 20_110)
    roomy = OverlapConfig(memory_budget_bytes=1000)  # the bucket buffers take 20 + 40 bytes
    sched = bucketed_overlap(p, config=roomy)
    assert sched.buckets == (("c1", "c2"),)
    r1 = simulate(p, sched)
    assert (r1.comm_ns, r1.exposed_ns, r1.makespan_ns) == (10_060, 10_060, 10_370)
    assert r1.peak_memory_bytes == 60
    # default budget: the original order's peak (0 bytes) leaves no room for bucket buffers
    assert original_peak(p) == 0
    assert bucketed_overlap(p).buckets == ()


def test_bucketing_not_kept_when_copies_cost_more() -> None:
    """At 0.01 B/ns the copies cost 100 + 4000 and 100 + 8000 ns: 10_370 becomes 22_310 > 20_110."""
    p = latency_problem(BucketCosts(memory_bandwidth_gbps=0.01, launch_overhead_ns=100))
    sched = bucketed_overlap(p, config=OverlapConfig(memory_budget_bytes=1000))
    assert sched.buckets == ()
    assert simulate(p, sched).makespan_ns == 20_110


# ---------------------------------------------------------------- properties

KINDS = (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER)


@st.composite
def frame_problems(draw) -> ScheduleProblem:
    """Random problems whose every collective fits the fixed-compute-order frame on its own."""
    p = random_problem(draw, max_ops=40, max_groups=2, kinds=KINDS, reduce_ops=("sum",))
    pl = Placement(p)
    assume(all(u.earliest <= u.need for u in pl.units.values()))
    return p


def check_buckets(p: ScheduleProblem, buckets, cap: int, multi_dtype: bool) -> None:
    seen: set[str] = set()
    for b in buckets:
        assert len(b) >= 2
        assert not seen & set(b)
        seen |= set(b)
        infos = [p.op_by_name[m].collective for m in b]
        assert len({i.bucket_key(multi_dtype) for i in infos}) == 1
        assert sum(max(i.bytes_in, i.bytes_out) for i in infos) <= cap
        for i, a in enumerate(b):
            for c in b[i + 1:]:
                assert not p.depends_on(a, c) and not p.depends_on(c, a)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(frame_problems(), st.integers(0, 3), st.booleans(), st.booleans())
def test_greedy_buckets_are_valid(p: ScheduleProblem, cap_i: int, multi_dtype: bool, exposed_first: bool) -> None:
    cap = (0, 4096, 20_000, 10**9)[cap_i]
    buckets = bucket_greedy(p, cap_bytes=cap, multi_dtype=multi_dtype, exposed_first=exposed_first)
    check_buckets(p, buckets, cap, multi_dtype)
    assert_valid_with(p, buckets, multi_dtype)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(frame_problems(), st.integers(0, 2), st.booleans(), st.booleans(), st.booleans())
def test_bucketed_overlap_never_worse(
    p: ScheduleProblem, cap_i: int, multi_dtype: bool, exposed_first: bool, roomy: bool
) -> None:
    """Default budget (the original order's peak, which the original order always fits), or a
    roomy one under which bucketing pays more often."""
    cap = (4096, 20_000, 10**9)[cap_i]
    config = OverlapConfig(memory_budget_bytes=10**12) if roomy else OverlapConfig()
    budget = 10**12 if roomy else original_peak(p)
    base = simulate(p, overlap_schedule(p, config=config))
    sched = bucketed_overlap(p, cap_bytes=cap, multi_dtype=multi_dtype, exposed_first=exposed_first, config=config)
    assert check_schedule(p, sched) == []
    res = simulate(p, sched)
    assert res.makespan_ns <= base.makespan_ns
    assert res.peak_memory_bytes <= budget


def test_seeded_buckets_valid_with_all_kinds() -> None:
    """Seeded loop over problems with every kind and dtype: the frame may reject units, but
    every bucket must still be sound and placeable whenever the unbucketed problem is."""
    for seed in range(150):
        p = random_problem(random.Random(seed), max_ops=40)
        pl = Placement(p)
        for multi_dtype in (False, True):
            buckets = bucket_greedy(p, cap_bytes=10**9, multi_dtype=multi_dtype, placement=pl)
            check_buckets(p, buckets, 10**9, multi_dtype)
            for b in buckets:
                assert max(pl.units[m].earliest for m in b) <= min(pl.units[m].need for m in b)
            if all(u.earliest <= u.need for u in pl.units.values()):
                assert_valid_with(p, buckets, multi_dtype)


@pytest.mark.parametrize("seed", range(6))
def test_given_base_is_the_unbucketed_schedule(seed: int) -> None:
    """Passing the unbucketed overlap schedule as ``base`` changes nothing but the work done."""
    from tests.solver.tiny_instances import tiny_problems

    for p in tiny_problems(4, seed=100 + seed):
        cfg = OverlapConfig(memory_budget_bytes=original_peak(p))
        base = overlap_schedule(p, config=cfg)
        assert bucketed_overlap(p, config=cfg, base=base) == bucketed_overlap(p, config=cfg)
