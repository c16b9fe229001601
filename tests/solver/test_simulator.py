"""Hand-computed timelines for the simulator (DESIGN.md, "Execution model").

Every expected number below is derived by hand in the test's docstring. Conventions from
solver_builders: comm curve ``runtime(size) = 100 + size`` for every (group, kind) and bucket copy
``copy_ns(b) = 100 + b``. A lone collective runs for its own ``runtime_ns``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fxsched.solver import (
    CollectiveKind,
    CollectiveTiming,
    CommCurve,
    ProblemError,
    Schedule,
    ScheduleProblem,
    SimResult,
    check_schedule,
    simulate,
)

from solver_builders import A2A, AG, AR, RS, coll, compute, make_problem, storage, wait, zero


def run(
    p: ScheduleProblem,
    order: Sequence[str] | None = None,
    buckets: Sequence[Sequence[str]] = (),
    multi_dtype: bool = False,
) -> SimResult:
    names = tuple(order) if order is not None else tuple(op.name for op in p.ops)
    sched = Schedule(names, tuple(tuple(b) for b in buckets), multi_dtype)
    assert check_schedule(p, sched) == []
    r = simulate(p, sched)
    assert r.makespan_ns == r.compute_ns + r.exposed_ns
    assert r.exposed_ns == sum(c.exposed_ns for c in r.collectives)
    return r


def timing(r: SimResult, member: str) -> CollectiveTiming:
    return next(c for c in r.collectives if member in c.members)


def _fifo_problem(second_group: str = "A") -> ScheduleProblem:
    return make_problem([
        compute("a", 10),
        coll("c1", "A", runtime_ns=30, deps=["a"]),
        coll("c2", second_group, runtime_ns=20, deps=["a"]),
        compute("b", 5),
        wait("w2", "c2"),
        wait("w1", "c1"),
        compute("d", 10, deps=["w1", "w2"]),
    ])


def test_fifo_wait_on_later_collective_drains_earlier_one() -> None:
    """a 0-10. c1 issued at 10 on A: runs 10-40. c2 issued at 10 on A, A busy until 40: runs 40-60.
    b 10-15. w2 at 15 stalls until 60 (45 exposed; this also covers c1). w1 at 60: c1 ended at
    40, no stall. d 60-70. makespan 70 = compute 25 + exposed 45."""
    r = run(_fifo_problem())
    c1, c2 = timing(r, "c1"), timing(r, "c2")
    assert (c1.issue_ns, c1.start_ns, c1.end_ns, c1.wait_ns, c1.exposed_ns) == (10, 10, 40, 60, 0)
    assert (c2.issue_ns, c2.start_ns, c2.end_ns, c2.wait_ns, c2.exposed_ns) == (10, 40, 60, 15, 45)
    assert c2.fifo_delay_ns == 30 and c1.fifo_delay_ns == 0
    assert c2.runtime_ns == 20
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns, r.comm_ns) == (70, 25, 45, 50)
    assert [c.name for c in r.collectives] == ["c1", "c2"]  # sorted by issue position
    assert (c1.issue_pos, c1.wait_pos, c2.issue_pos, c2.wait_pos) == (1, 5, 2, 4)


def test_fifo_waits_in_issue_order() -> None:
    """Same problem, order a c1 c2 b w1 w2 d. c1 10-40, c2 40-60, b 10-15. w1 at 15 stalls 25
    (t=40); w2 at 40 stalls 20 (t=60); d 60-70. makespan 70 = 25 + 45."""
    r = run(_fifo_problem(), ["a", "c1", "c2", "b", "w1", "w2", "d"])
    assert (timing(r, "c1").exposed_ns, timing(r, "c2").exposed_ns) == (25, 20)
    assert timing(r, "c2").wait_ns == 40
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (70, 25, 45)


def test_two_groups_run_in_parallel() -> None:
    """c1 on A, c2 on B, both issued at 10: c1 10-40 and c2 10-30 at the same time. b 10-15.
    w2 at 15 stalls 15 (t=30); w1 at 30 stalls 10 (t=40); d 40-50. makespan 50 = 25 + 25
    (vs 70 when both are on A)."""
    r = run(_fifo_problem(second_group="B"))
    c1, c2 = timing(r, "c1"), timing(r, "c2")
    assert (c1.group, c1.start_ns, c1.end_ns) == ("A", 10, 40)
    assert (c2.group, c2.start_ns, c2.end_ns) == ("B", 10, 30)
    assert (c2.exposed_ns, c1.exposed_ns) == (15, 10)
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (50, 25, 25)


def _issue_problem() -> ScheduleProblem:
    return make_problem([
        compute("a", 10),
        compute("b", 20),
        coll("c1", runtime_ns=15, deps=["a"]),
        wait("w1", "c1"),
        compute("d", 5, deps=["w1"]),
    ])


def test_issue_after_compute_starts_when_that_compute_ends_and_stalls() -> None:
    """Order a b c1 w1 d. a 0-10, b 10-30. c1's input is ready at 10 but it is issued after b, so
    it starts at 30 and ends at 45. w1 at 30 stalls 15 (exposed). d 45-50. makespan 50 = 35 + 15."""
    r = run(_issue_problem())
    c1 = timing(r, "c1")
    assert (c1.issue_ns, c1.start_ns, c1.end_ns, c1.wait_ns, c1.exposed_ns) == (30, 30, 45, 30, 15)
    assert not c1.hidden and c1.hideable  # b is independent of c1
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (50, 35, 15)
    assert (r.n_hidden, r.n_hideable, r.n_hidden_hideable) == (0, 1, 0)


def test_wait_that_does_not_stall_is_hidden() -> None:
    """Order a c1 b w1 d. c1 issued at 10: 10-25 while b runs 10-30. w1 at 30: no stall.
    d 30-35. makespan 35 = 35 + 0."""
    r = run(_issue_problem(), ["a", "c1", "b", "w1", "d"])
    c1 = timing(r, "c1")
    assert (c1.issue_ns, c1.start_ns, c1.end_ns, c1.wait_ns, c1.exposed_ns) == (10, 10, 25, 30, 0)
    assert c1.hidden and c1.hideable
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (35, 35, 0)
    assert (r.n_hidden, r.n_hideable, r.n_hidden_hideable) == (1, 1, 1)


def test_partially_hidden_collective_and_zero_ops_take_no_time() -> None:
    """a 0-10; view v (0 ns) keeps t=10; c1 (30) issued at 10: 10-40; b 10-22; view v2 at 22;
    w1 at 22 stalls 18 (t=40); d 40-45. makespan 45 = compute 27 + exposed 18."""
    p = make_problem([
        compute("a", 10), zero("v", deps=["a"]), coll("c1", runtime_ns=30, deps=["v"]),
        compute("b", 12), zero("v2", deps=["b"]), wait("w1", "c1"), compute("d", 5, deps=["w1", "v2"]),
    ])
    r = run(p)
    c1 = timing(r, "c1")
    assert (c1.issue_ns, c1.end_ns, c1.wait_ns, c1.exposed_ns) == (10, 40, 22, 18)
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (45, 27, 18)


def test_overlapped_counts_collectives_that_compute_ran_beside() -> None:
    """Inductor's sense of hidden (not fully exposed) against DESIGN.md's (no stall), by hand.
    Order a b c1 w1 d: c1 runs 30-45 while w1 stalls 30-45, so no compute runs beside it: neither.
    Order a c1 b w1 d: c1 10-25 under b (10-30), no stall: both. The partial case of the test
    above: c1 10-40, w1 stalls 22-40, b ran 10-22 beside it: overlapped, not hidden."""
    assert (run(_issue_problem()).n_overlapped_hideable, run(_issue_problem()).n_hidden_hideable) == (0, 0)
    r = run(_issue_problem(), ["a", "c1", "b", "w1", "d"])
    assert (r.n_overlapped_hideable, r.n_hidden_hideable, r.stall_intervals()) == (1, 1, [])
    p = make_problem([
        compute("a", 10), zero("v", deps=["a"]), coll("c1", runtime_ns=30, deps=["v"]),
        compute("b", 12), zero("v2", deps=["b"]), wait("w1", "c1"), compute("d", 5, deps=["w1", "v2"]),
    ])
    r = run(p)
    assert (r.n_overlapped_hideable, r.n_hidden_hideable, r.stall_intervals()) == (1, 0, [(22, 40)])


def test_hidden_collective_inside_another_stall_is_not_overlapped() -> None:
    """a 0-10; c1 (A, 30) issued at 10: 10-40; b 10-15; c2 (B, 10) issued at 15: 15-25; w1 at 15
    stalls until 40; w2 at 40 does not stall (c2 ended at 25), so c2 is hidden, but it ran wholly
    inside w1's stall [15, 40): no compute beside it, fully exposed in Inductor's sense. c1 had b
    beside it (10-15): overlapped, not hidden. d 40-45: makespan 45 = compute 20 + exposed 25."""
    p = make_problem([
        compute("a", 10), coll("c1", "A", runtime_ns=30, deps=["a"]), compute("b", 5),
        coll("c2", "B", runtime_ns=10), wait("w1", "c1"), wait("w2", "c2"), compute("d", 5, deps=["w1", "w2"]),
    ])
    r = run(p)
    assert (timing(r, "c2").start_ns, timing(r, "c2").end_ns, timing(r, "c2").exposed_ns) == (15, 25, 0)
    assert timing(r, "c1").hideable and timing(r, "c2").hideable
    assert r.stall_intervals() == [(15, 40)]
    assert (r.makespan_ns, r.n_hidden_hideable, r.n_overlapped_hideable) == (45, 1, 1)
    assert timing(r, "c2").hidden and not timing(r, "c1").hidden


def _ag_bucket_problem() -> ScheduleProblem:
    return make_problem([
        compute("p", 50),
        coll("c1", kind=AG, runtime_ns=300, bytes_in=100, bytes_out=200, deps=["p"]),
        compute("q", 60),
        coll("c2", kind=AG, runtime_ns=600, bytes_in=200, bytes_out=400, deps=["q"]),
        compute("r", 70),
        wait("w1", "c1"),
        wait("w2", "c2"),
        compute("x", 10, deps=["w1", "w2"]),
    ])


def test_all_gather_unbucketed_reference() -> None:
    """p 0-50. c1 issued at 50: 50-350. q 50-110. c2 issued at 110, A busy: 350-950. r 110-180.
    w1 at 180 stalls 170 (t=350); w2 at 350 stalls 600 (t=950); x 950-960.
    makespan 960 = 190 + 770; 2 collectives."""
    r = run(_ag_bucket_problem())
    assert (timing(r, "c2").start_ns, timing(r, "c2").end_ns) == (350, 950)
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns, r.n_collectives) == (960, 190, 770, 2)


def test_all_gather_bucket_copy_in_summed_runtime_and_copy_out() -> None:
    """Bucket (c1, c2): issued at c2's position 3, waited at w1's position 5.
    Copy-in copy_ns(100 + 200) = 400; runtime curve(100+200+200+400 = 900) = 1000; copy-out
    copy_ns(200 + 400) = 700. p 0-50; c1 is only a member: nothing; q 50-110; copy-in 110-510;
    collective 510-1510; r 510-580; w1 at 580 stalls 930 (t=1510), copy-out 1510-2210; w2 nothing;
    x 2210-2220. compute = 50+60+70+10 + 400 + 700 = 1290; makespan 2220 = 1290 + 930."""
    r = run(_ag_bucket_problem(), buckets=[("c2", "c1")])
    assert r.n_collectives == 1
    (b,) = r.collectives
    assert b.members == ("c1", "c2") and b.name == "c1" and b.group == "A"
    assert (b.issue_pos, b.wait_pos) == (3, 5)
    assert (b.issue_ns, b.start_ns, b.end_ns, b.wait_ns, b.exposed_ns) == (510, 510, 1510, 580, 930)
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns, r.comm_ns) == (2220, 1290, 930, 1000)


def test_reduce_scatter_bucket_no_copy_out_and_waited_at_first_wait() -> None:
    """Bucket (c1, c2) of reduce_scatters; w2 comes before w1 in program order, so the bucket is
    waited at w2 (position 5). Copy-in copy_ns(400 + 200) = 700; runtime curve(400+200+200+100 =
    900) = 1000; no copy-out. p 0-50; r 50-350; c2 at 3: copy-in 350-1050, collective 1050-2050;
    s 1050-1250; w2 at 1250 stalls 800 (t=2050); y 2050-2060; w1 nothing; z 2060-2070.
    compute = 50+300+700+200+10+10 = 1270; makespan 2070 = 1270 + 800."""
    p = make_problem([
        compute("p", 50),
        coll("c1", kind=RS, runtime_ns=1, bytes_in=400, bytes_out=200, deps=["p"], allocates=["o1"]),
        compute("r", 300),
        coll("c2", kind=RS, runtime_ns=1, bytes_in=200, bytes_out=100, deps=["p"], allocates=["o2"]),
        compute("s", 200),
        wait("w2", "c2"),
        compute("y", 10, deps=["w2"]),
        wait("w1", "c1"),
        compute("z", 10, deps=["w1"]),
    ], [storage("o1", 200), storage("o2", 100)])
    r = run(p, buckets=[("c1", "c2")])
    (b,) = r.collectives
    assert (b.issue_pos, b.wait_pos) == (3, 5)
    assert (b.issue_ns, b.start_ns, b.end_ns, b.wait_ns, b.exposed_ns) == (1050, 1050, 2050, 1250, 800)
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns, r.comm_ns) == (2070, 1270, 800, 1000)


def test_bucket_queues_behind_lone_collective_issued_between_its_members() -> None:
    """c1, c3, c2 all all_gathers on A; bucket (c1, c2) is issued at c2 (position 3), after c3.
    Bucket runtime curve(100+200+100+200 = 600) = 700, copy-in copy_ns(200) = 300, copy-out
    copy_ns(400) = 500. p 0-10; c3 issued at 10: 10-510; copy-in 10-310; bucket issued at 310 but
    A is busy until 510: 510-1210 (FIFO delay 200); q 310-410; w3 at 410 stalls 100 (t=510);
    w1 at 510 stalls 700 (t=1210), copy-out 1210-1710; w2 nothing; z 1710-1720.
    compute = 10+300+100+500+10 = 920; exposed 800; makespan 1720."""
    p = make_problem([
        compute("p", 10),
        coll("c1", bytes_in=100, bytes_out=200, runtime_ns=1, deps=["p"]),
        coll("c3", bytes_in=50, bytes_out=100, runtime_ns=500, deps=["p"]),
        coll("c2", bytes_in=100, bytes_out=200, runtime_ns=1, deps=["p"]),
        compute("q", 100),
        wait("w3", "c3"), wait("w1", "c1"), wait("w2", "c2"),
        compute("z", 10, deps=["w1", "w2", "w3"]),
    ])
    r = run(p, buckets=[("c1", "c2")])
    assert r.n_collectives == 2
    c3, b = timing(r, "c3"), timing(r, "c1")
    assert [c.members for c in r.collectives] == [("c3",), ("c1", "c2")]
    assert (c3.issue_ns, c3.start_ns, c3.end_ns, c3.wait_ns, c3.exposed_ns) == (10, 10, 510, 410, 100)
    assert (b.issue_pos, b.wait_pos) == (3, 6)
    assert (b.issue_ns, b.start_ns, b.end_ns, b.wait_ns, b.exposed_ns) == (310, 510, 1210, 510, 700)
    assert b.fifo_delay_ns == 200
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (1720, 920, 800)


@pytest.mark.parametrize(("kind", "makespan", "compute_ns"), [(AR, 800, 300), (A2A, 1100, 600)])
def test_all_reduce_bucket_views_all_to_all_bucket_copies_out(
    kind: CollectiveKind, makespan: int, compute_ns: int
) -> None:
    """Two collectives of 100 in / 100 out. Bucket runtime curve(400) = 500; copy-in
    copy_ns(200) = 300 (0-300), collective 300-800, w1 at 300 stalls 500. all_reduce: no copy-out,
    makespan 800 = 300 + 500. all_to_all: copy-out copy_ns(200) = 300, makespan 1100 = 600 + 500."""
    p = make_problem([
        coll("c1", kind=kind, bytes_in=100, bytes_out=100, runtime_ns=7, allocates=["o1"]),
        coll("c2", kind=kind, bytes_in=100, bytes_out=100, runtime_ns=7, allocates=["o2"]),
        wait("w1", "c1"), wait("w2", "c2"),
    ], [storage("o1", 100), storage("o2", 100)])
    r = run(p, buckets=[("c1", "c2")])
    (b,) = r.collectives
    assert (b.start_ns, b.end_ns, b.exposed_ns) == (300, 800, 500)
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (makespan, compute_ns, 500)


def test_bucket_copies_out_by_kind() -> None:
    assert CollectiveKind.ALL_GATHER.bucket_copies_out and CollectiveKind.ALL_TO_ALL.bucket_copies_out
    assert not CollectiveKind.REDUCE_SCATTER.bucket_copies_out
    assert not CollectiveKind.ALL_REDUCE.bucket_copies_out


def test_comm_curve_interpolates_extrapolates_and_rounds_up() -> None:
    """Points (0, 0), (3, 10), (6, 13): size 1 -> ceil(3.33) = 4; size 3 -> 10; size 4 -> 11;
    size 9 -> 16 (slope 1 past the last point)."""
    c = CommCurve("A", CollectiveKind.ALL_GATHER, ((0, 0), (3, 10), (6, 13)))
    assert [c.runtime_ns(s) for s in (0, 1, 3, 4, 6, 9)] == [0, 4, 10, 11, 13, 16]
    assert CommCurve("A", CollectiveKind.ALL_GATHER, ((10, 100), (20, 200))).runtime_ns(5) == 50


def test_bucket_runtime_is_curve_at_summed_in_plus_out_size() -> None:
    """curve = 100 + size. Lone c1 keeps its own 300. Bucket: 100 + (100+200) + (200+400) = 1000."""
    p = _ag_bucket_problem()
    assert p.bucket_runtime_ns(["c1"]) == 300
    assert p.bucket_runtime_ns(["c1", "c2"]) == 1000
    assert p.bucket_costs.copy_ns(300) == 400


def test_bucket_runtime_without_curve_is_problem_error() -> None:
    p = ScheduleProblem(
        ops=_ag_bucket_problem().ops, groups=_ag_bucket_problem().groups, comm_curves=(),
    )
    with pytest.raises(ProblemError, match="no comm curve"):
        p.bucket_runtime_ns(["c1", "c2"])


def test_only_ancestors_and_descendants_is_not_hideable() -> None:
    """Chain a -> c1 -> w1 -> b: the only compute is c1's ancestor and descendant, so nothing can
    run during c1. a 0-10, c1 10-60, w1 stalls 50, b 60-70. makespan 70 = 20 + 50."""
    p = make_problem([compute("a", 10), coll("c1", runtime_ns=50, deps=["a"]), wait("w1", "c1"),
                      compute("b", 10, deps=["w1"])])
    r = run(p)
    c1 = timing(r, "c1")
    assert not c1.hideable and not c1.hidden and c1.exposed_ns == 50
    assert (r.makespan_ns, r.n_hideable, r.n_hidden, r.n_hidden_hideable) == (70, 0, 0, 0)


@pytest.mark.parametrize(("extra_runtime", "hideable"), [(5, True), (0, False)])
def test_independent_compute_makes_hideable(extra_runtime: int, hideable: bool) -> None:
    """Independent compute x placed before c1 (so it cannot actually hide it) still makes c1
    hideable when it takes time; a 0-ns compute or a view does not."""
    p = make_problem([compute("x", extra_runtime), zero("v"), compute("a", 10),
                      coll("c1", runtime_ns=50, deps=["a"]), wait("w1", "c1"),
                      compute("b", 10, deps=["w1"])])
    r = run(p)
    assert timing(r, "c1").hideable is hideable
    assert timing(r, "c1").exposed_ns == 50


def test_zero_runtime_collective_hidden_but_not_hideable() -> None:
    p = make_problem([coll("c1", runtime_ns=0), wait("w1", "c1")])
    r = run(p)
    assert (r.n_hidden, r.n_hideable, r.n_hidden_hideable, r.makespan_ns) == (1, 0, 0, 0)


def test_bucket_is_not_hideable_when_members_cover_each_others_independent_compute() -> None:
    """p1 -> c1 and p2 -> c2. Alone, c1 can hide behind p2 and c2 behind p1 (hideable). As a
    bucket, p1 and p2 are both its ancestors: nothing independent is left."""
    p = make_problem([compute("p1", 10), compute("p2", 10),
                      coll("c1", bytes_in=1, bytes_out=2, runtime_ns=20, deps=["p1"]),
                      coll("c2", bytes_in=1, bytes_out=2, runtime_ns=20, deps=["p2"]),
                      wait("w1", "c1"), wait("w2", "c2")])
    assert run(p, ["p1", "c1", "p2", "c2", "w1", "w2"]).n_hideable == 2
    bucketed = run(p, buckets=[("c1", "c2")])
    assert bucketed.n_collectives == 1 and bucketed.n_hideable == 0


def test_simulate_defaults_to_original_order_and_is_deterministic() -> None:
    p = _ag_bucket_problem()
    assert simulate(p) == simulate(p, Schedule.original(p)) == simulate(p)
    assert Schedule.original(p).order == tuple(op.name for op in p.ops)


@pytest.mark.parametrize("kind", [RS, AR])
def test_view_bucket_members_without_storages_simulate(kind: CollectiveKind) -> None:
    """Storages are optional in the IR; timing must not depend on them. Two collectives of
    100 in / 100 out, bucketed: copy-in 300 (0-300), collective 300-800, w1 stalls 500."""
    p = make_problem([
        coll("c1", kind=kind, bytes_in=100, bytes_out=100, runtime_ns=7),
        coll("c2", kind=kind, bytes_in=100, bytes_out=100, runtime_ns=7),
        wait("w1", "c1"), wait("w2", "c2"),
    ])
    r = run(p, buckets=[("c1", "c2")])
    assert (r.makespan_ns, r.compute_ns, r.exposed_ns) == (800, 300, 500)


def test_link_contention_stretches_a_collective_that_overlaps_another_group() -> None:
    """c1 on A (100) and c2 on B (100) both issued at 0; x (10) then w1, w2.
    Off: both run 0-100; w1 stalls 90 (t=100), w2 0; makespan 100.
    f=0.5: c1 is priced first (nothing running): 0-100; c2 starts at 0 while c1 runs, so it
    takes 150: 0-150. w1 stalls 90 (t=100), w2 stalls 50 (t=150); makespan 150 = 10 + 140."""
    import dataclasses

    p = make_problem([
        coll("c1", "A", runtime_ns=100), coll("c2", "B", runtime_ns=100), compute("x", 10),
        wait("w1", "c1"), wait("w2", "c2"),
    ])
    off = run(p)
    assert (timing(off, "c2").end_ns, off.makespan_ns, off.exposed_ns) == (100, 100, 90)
    on = run(dataclasses.replace(p, link_contention=0.5))
    assert (timing(on, "c1").end_ns, timing(on, "c2").end_ns) == (100, 150)
    assert (on.makespan_ns, on.exposed_ns) == (150, 140)
    with pytest.raises(ProblemError, match="link_contention"):
        dataclasses.replace(p, link_contention=-1.0)


def test_position_clocks_by_hand() -> None:
    """c1 and c2 (30 ns each, one group: c1 0..30, c2 30..60) issued at 0; x 0..10; w1 stalls to
    30; v1 (a view) adds nothing; w2 stalls to 60; z 60..65: the clock after each position."""
    from fxsched.solver.simulator import position_clocks

    p = make_problem([
        coll("c1", "A", runtime_ns=30), coll("c2", "A", runtime_ns=30), compute("x", 10),
        wait("w1", "c1"), zero("v1", deps=["w1"]), wait("w2", "c2"), compute("z", 5, deps=["v1", "w2"]),
    ])
    assert position_clocks(p, Schedule.original(p)) == [0, 0, 10, 30, 30, 60, 65]
