"""check_schedule: every ViolationKind from a crafted bad schedule; simulate refuses them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fxsched.solver import (
    Schedule,
    ScheduleError,
    ScheduleProblem,
    Violation,
    ViolationKind,
    check_schedule,
    simulate,
)

from solver_builders import AG, RS, coll, compute, make_problem, wait

V = ViolationKind


def _problem() -> ScheduleProblem:
    """Collectives for every bucket-key case, all on p's output unless said otherwise.

    c1, c2: all_gather A bf16 (compatible); c3: all_gather A f32; c4: reduce_scatter A bf16 sum;
    c10: reduce_scatter A f32 sum; c6: reduce_scatter A bf16 avg; c5: all_gather B bf16;
    c9: all_gather A bf16 that depends directly on c1; c7: all_gather A bf16 that depends on c1
    through w1 and x.
    """
    return make_problem([
        compute("p", 10),
        coll("c1", kind=AG, bytes_in=10, bytes_out=20, runtime_ns=5, deps=["p"]),
        coll("c2", kind=AG, bytes_in=10, bytes_out=20, runtime_ns=5, deps=["p"]),
        coll("c3", kind=AG, dtype="f32", bytes_in=10, bytes_out=20, runtime_ns=5, deps=["p"]),
        coll("c4", kind=RS, reduce_op="sum", bytes_in=20, bytes_out=10, runtime_ns=5, deps=["p"]),
        coll("c10", kind=RS, reduce_op="sum", dtype="f32", bytes_in=20, bytes_out=10, runtime_ns=5, deps=["p"]),
        coll("c6", kind=RS, reduce_op="avg", bytes_in=20, bytes_out=10, runtime_ns=5, deps=["p"]),
        coll("c5", "B", kind=AG, bytes_in=10, bytes_out=20, runtime_ns=5, deps=["p"]),
        coll("c9", kind=AG, bytes_in=10, bytes_out=20, runtime_ns=5, deps=["c1"]),
        wait("w1", "c1"),
        compute("x", 10, deps=["w1"]),
        coll("c7", kind=AG, bytes_in=10, bytes_out=20, runtime_ns=5, deps=["x"]),
        *(wait(f"w{i}", f"c{i}") for i in (2, 3, 4, 10, 6, 5, 9, 7)),
        compute("end", 1, deps=[f"w{i}" for i in (1, 2, 3, 4, 10, 6, 5, 9, 7)]),
    ])


P = _problem()
ORDER = tuple(op.name for op in P.ops)


def kinds_of(violations: Sequence[Violation]) -> set[ViolationKind]:
    return {v.kind for v in violations}


def assert_invalid(sched: Schedule, expected: set[ViolationKind], op: str | None = None,
                   exact: bool = True) -> list[Violation]:
    out = check_schedule(P, sched)
    if exact:
        assert kinds_of(out) == expected, out
    else:
        assert expected <= kinds_of(out), out
    if op is not None:
        assert op in {v.op for v in out if v.kind in expected}
    with pytest.raises(ScheduleError) as err:
        simulate(P, sched)
    assert {v.kind for v in err.value.violations} == kinds_of(out)
    assert "invalid schedule" in str(err.value)
    return out


def moved(name: str, after: str | None) -> tuple[str, ...]:
    """ORDER with ``name`` moved right after ``after`` (None: to the front)."""
    rest = [n for n in ORDER if n != name]
    i = 0 if after is None else rest.index(after) + 1
    return (*rest[:i], name, *rest[i:])


def test_original_order_and_valid_buckets_have_no_violation() -> None:
    assert check_schedule(P, Schedule(ORDER)) == []
    ok = Schedule(ORDER, (("c1", "c2"), ("c4", "c10"), ("c3", "c7")), multi_dtype=True)
    assert check_schedule(P, ok) == []
    all_gathers = Schedule(ORDER, (("c1", "c2"), ("c3", "c7")), multi_dtype=True)
    assert simulate(P, all_gathers).n_collectives == 9 - 2


def test_every_violation_kind_is_covered_here() -> None:
    covered = {V.UNKNOWN_OP, V.MISSING_OP, V.DUPLICATE_OP, V.NOT_TOPOLOGICAL, V.WAIT_BEFORE_COLLECTIVE,
               V.BUCKET_NOT_COLLECTIVE, V.BUCKET_TOO_SMALL, V.OP_IN_TWO_BUCKETS, V.MIXED_BUCKET_KEY,
               V.DEPENDENT_BUCKET_MEMBERS}
    assert covered == set(ViolationKind)


def test_unknown_op() -> None:
    out = assert_invalid(Schedule((*ORDER, "ghost")), {V.UNKNOWN_OP}, "ghost")
    assert "ghost" in str(out[0])


def test_missing_op() -> None:
    assert_invalid(Schedule(ORDER[:-1]), {V.MISSING_OP}, "end")


def test_duplicate_op() -> None:
    assert_invalid(Schedule((*ORDER, "p")), {V.DUPLICATE_OP}, "p")


def test_not_topological() -> None:
    out = assert_invalid(Schedule(moved("p", "c1")), {V.NOT_TOPOLOGICAL}, "c1")
    assert [v.op for v in out] == ["c1"]  # p moved just after c1: only c1 reads p too early


def test_wait_before_its_collective() -> None:
    assert_invalid(Schedule(moved("w2", "p")), {V.WAIT_BEFORE_COLLECTIVE}, "w2")


def test_wait_before_a_later_bucket_member_is_issued() -> None:
    """p c1 w1 c2 ...: valid alone; bucketing (c1, c2) issues the bucket at c2, after w1."""
    order = moved("w1", "c1")
    assert check_schedule(P, Schedule(order)) == []
    assert_invalid(Schedule(order, (("c1", "c2"),)), {V.WAIT_BEFORE_COLLECTIVE}, "w1")


def test_bucket_member_not_a_collective() -> None:
    assert_invalid(Schedule(ORDER, (("c1", "p"),)), {V.BUCKET_NOT_COLLECTIVE}, "p")
    assert_invalid(Schedule(ORDER, (("c1", "w2"),)), {V.BUCKET_NOT_COLLECTIVE}, "w2")
    assert_invalid(Schedule(ORDER, (("c1", "ghost"),)), {V.BUCKET_NOT_COLLECTIVE}, "ghost")


def test_bucket_of_size_one_or_zero() -> None:
    assert_invalid(Schedule(ORDER, (("c1",),)), {V.BUCKET_TOO_SMALL}, "c1")
    assert_invalid(Schedule(ORDER, ((),)), {V.BUCKET_TOO_SMALL})


def test_op_in_two_buckets() -> None:
    """(c1, c2) and (c2, c3) are each valid under multi_dtype; c2 is in both."""
    sched = Schedule(ORDER, (("c1", "c2"), ("c2", "c3")), multi_dtype=True)
    assert_invalid(sched, {V.OP_IN_TWO_BUCKETS}, "c2")


@pytest.mark.parametrize("pair", [("c1", "c3"), ("c4", "c10")])
def test_mixed_dtype_is_allowed_only_with_multi_dtype(pair: tuple[str, str]) -> None:
    assert_invalid(Schedule(ORDER, (pair,)), {V.MIXED_BUCKET_KEY}, pair[1])
    assert check_schedule(P, Schedule(ORDER, (pair,), multi_dtype=True)) == []


@pytest.mark.parametrize("multi_dtype", [False, True])
@pytest.mark.parametrize("pair", [("c1", "c4"), ("c1", "c5"), ("c4", "c6")], ids=["kind", "group", "reduce_op"])
def test_mixed_kind_group_or_reduce_op_is_never_allowed(pair: tuple[str, str], multi_dtype: bool) -> None:
    assert_invalid(Schedule(ORDER, (pair,), multi_dtype=multi_dtype), {V.MIXED_BUCKET_KEY}, pair[1])


def test_dependent_bucket_members_directly() -> None:
    """c9 reads c1 itself. Bucket issued at c9 (8); w1 (9) and w9 come after it: only the
    dependency is wrong."""
    assert_invalid(Schedule(ORDER, (("c1", "c9"),)), {V.DEPENDENT_BUCKET_MEMBERS})


def test_dependent_bucket_members_through_other_nodes() -> None:
    """c7 depends on c1 through w1 and x, so w1 also comes before the bucket's issue at c7."""
    out = assert_invalid(Schedule(ORDER, (("c1", "c7"),)), {V.DEPENDENT_BUCKET_MEMBERS}, exact=False)
    assert kinds_of(out) == {V.DEPENDENT_BUCKET_MEMBERS, V.WAIT_BEFORE_COLLECTIVE}
    # the reverse listing is reported as well
    assert V.DEPENDENT_BUCKET_MEMBERS in kinds_of(check_schedule(P, Schedule(ORDER, (("c7", "c1"),))))


def test_many_violations_are_all_listed_and_message_is_capped() -> None:
    sched = Schedule(tuple(reversed(ORDER)) + ("g1", "g2"), (("p",), ("c1", "c5"), ("c2", "c2")))
    out = check_schedule(P, sched)
    assert {V.UNKNOWN_OP, V.NOT_TOPOLOGICAL, V.WAIT_BEFORE_COLLECTIVE, V.BUCKET_TOO_SMALL,
            V.BUCKET_NOT_COLLECTIVE, V.MIXED_BUCKET_KEY, V.OP_IN_TWO_BUCKETS} <= kinds_of(out)
    err = ScheduleError(out)
    assert err.violations == out
    assert f"(+{len(out) - 5} more)" in str(err)
