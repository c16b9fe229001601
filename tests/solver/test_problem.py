"""Problem validation: each malformed item raises ProblemError whose message names it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from fxsched.solver import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProblemError,
    ProcessGroup,
    ScheduleProblem,
    Storage,
)
from fxsched.solver.problem import topological_order

from solver_builders import AG, RS, coll, compute, make_problem, storage, wait, zero


class _Raises:
    """pytest.raises(ProblemError) whose message must also contain every one of ``names``."""

    def __init__(self, names: Sequence[str], match: str | None) -> None:
        self.names = names
        self.ctx = pytest.raises(ProblemError, match=match)

    def __enter__(self) -> None:
        self.info = self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        handled = self.ctx.__exit__(*exc)
        msg = str(self.info.value)
        for n in self.names:
            assert n in msg, f"{n!r} not named in {msg!r}"
        return bool(handled)


def raises(*names: str, match: str | None = None) -> _Raises:
    return _Raises(names, match)


def test_problem_error_is_a_value_error() -> None:
    assert issubclass(ProblemError, ValueError)


def test_unknown_dependency() -> None:
    with raises("'b'", "'ghost'", match="unknown dependency"):
        make_problem([compute("a", 1), compute("b", 1, deps=["ghost"])])


@pytest.mark.parametrize("ops", [
    [compute("a", 1, deps=["b"]), compute("b", 1, deps=["a"])],
    [compute("a", 1, deps=["c"]), compute("b", 1, deps=["a"]), compute("c", 1, deps=["b"])],
    [compute("x", 1), compute("a", 1, deps=["a"])],
], ids=["two", "three", "self"])
def test_cycle_is_called_a_cycle(ops: Sequence[Op]) -> None:
    with raises("'a'", match="cycle"):
        make_problem(ops)


def test_dependency_listed_later_without_cycle_is_not_called_a_cycle() -> None:
    with pytest.raises(ProblemError, match="listed after") as err:
        make_problem([compute("a", 1, deps=["b"]), compute("b", 1)])
    assert "cycle" not in str(err.value) and "'a'" in str(err.value) and "'b'" in str(err.value)


def test_collective_without_wait() -> None:
    with raises("'c1'", match="no wait"):
        make_problem([coll("c1"), coll("c2"), wait("w2", "c2")])


def test_collective_with_two_waits() -> None:
    with raises("'c1'", "'w1'", "'w1b'", match="two waits"):
        make_problem([coll("c1"), wait("w1", "c1"), wait("w1b", "c1")])


def test_wait_on_non_collective() -> None:
    with raises("'w'", "'a'", match="not a collective"):
        make_problem([compute("a", 1), wait("w", "a")])


def test_wait_must_depend_on_its_collective() -> None:
    with raises("'w'", "'c1'"):
        Op("w", OpKind.WAIT, deps=(), waits_on="c1")


def test_negative_sizes() -> None:
    with raises("'s'", match="negative"):
        Storage("s", -1)
    with raises("'A'", match="negative"):
        CollectiveInfo(CollectiveKind.ALL_GATHER, "A", "bf16", -1, 0)
    with raises("'A'", match="negative"):
        CollectiveInfo(CollectiveKind.ALL_GATHER, "A", "bf16", 0, -5)


def test_negative_runtime() -> None:
    with raises("'a'", match="negative"):
        compute("a", -1)
    with raises("'c'", match="negative"):
        coll("c", runtime_ns=-3)


def test_unknown_storage() -> None:
    with raises("'a'", "'nope'", match="unknown storage"):
        make_problem([compute("a", 1, uses=["nope"])])
    with raises("'a'", "'nope'", match="unknown storage"):
        make_problem([compute("a", 1, allocates=["nope"])])


def test_unknown_process_group() -> None:
    with raises("'c1'", "'Z'", match="unknown process group"):
        make_problem([coll("c1", "Z"), wait("w1", "c1")])
    with raises("'Z'", match="unknown process group"):
        ScheduleProblem(ops=(), groups=(ProcessGroup("A", 2),),
                        comm_curves=(CommCurve("Z", AG, ((0, 0), (1, 1))),))


def test_storage_allocated_twice() -> None:
    with raises("'s'", "'a'", "'b'", match="allocated by both"):
        make_problem([compute("a", 1, allocates=["s"]), compute("b", 1, allocates=["s"])], [storage("s", 4)])


def test_duplicate_names() -> None:
    with raises("'a'", match="duplicate"):
        make_problem([compute("a", 1), compute("a", 2)])
    with pytest.raises(ProblemError, match="duplicate storage"):
        make_problem([compute("a", 1, allocates=["s"])], [storage("s", 1), storage("s", 2)])


def test_storage_allocation_must_match_input_flag() -> None:
    with raises("'s'", match="not allocated"):
        make_problem([compute("a", 1)], [storage("s", 4)])
    with raises("'s'", "'a'", match="graph input"):
        make_problem([compute("a", 1, allocates=["s"])], [storage("s", 4, inp=True)])


def test_op_shape_errors() -> None:
    info = CollectiveInfo(CollectiveKind.ALL_GATHER, "A", "bf16", 1, 2)
    with raises("'c'", match="collective"):
        Op("c", OpKind.COLLECTIVE)
    with raises("'a'", match="collective"):
        Op("a", OpKind.COMPUTE, collective=info)
    with raises("'a'", match="waits_on"):
        Op("a", OpKind.COMPUTE, deps=("c",), waits_on="c")
    with raises("'v'"):
        Op("v", OpKind.ZERO, runtime_ns=3)
    with raises("'v'"):
        Op("v", OpKind.ZERO, allocates=("s",))
    with pytest.raises(ProblemError, match="empty name"):
        Op("", OpKind.COMPUTE)


def test_group_curve_and_cost_errors() -> None:
    with raises("'A'", match="size"):
        ProcessGroup("A", 0)
    with raises("'A'", match="ranks"):
        ProcessGroup("A", 2, (0, 1, 2))
    with pytest.raises(ProblemError, match="empty name"):
        ProcessGroup("", 2)
    with raises("A/all_gather", match="2 points"):
        CommCurve("A", AG, ((0, 1),))
    with raises("A/reduce_scatter", match="increasing"):
        CommCurve("A", RS, ((5, 1), (5, 2)))
    with raises("A/all_gather", match="negative"):
        CommCurve("A", AG, ((0, 1), (5, -2)))
    with pytest.raises(ProblemError):
        BucketCosts(memory_bandwidth_gbps=0)
    with pytest.raises(ProblemError):
        BucketCosts(launch_overhead_ns=-1)


def test_bucket_costs_copy() -> None:
    """A copy reads and writes the bytes: launch + ceil(2 * b / bandwidth)."""
    assert BucketCosts(memory_bandwidth_gbps=3.0, launch_overhead_ns=7).copy_ns(10) == 7 + 7
    assert BucketCosts().copy_ns(0) == 5_000


def _diamond() -> ScheduleProblem:
    """a -> c1 -> w1 -> d, a -> b -> d, e alone; v views a."""
    return make_problem([
        compute("a", 1), zero("v", deps=["a"]), coll("c1", deps=["a"]), compute("b", 2, deps=["a"]),
        wait("w1", "c1"), compute("d", 1, deps=["w1", "b"]), compute("e", 1),
    ])


def test_lookups_and_dependency_queries() -> None:
    p = _diamond()
    assert p.index["c1"] == 2 and p.op_by_name["b"].runtime_ns == 2
    assert p.wait_of == {"c1": "w1"}
    assert [c.name for c in p.collectives] == ["c1"]
    assert p.users["a"] == ("v", "c1", "b") and p.users["d"] == ()
    assert p.depends_on("d", "a") and p.depends_on("d", "c1") and p.depends_on("w1", "c1")
    assert not p.depends_on("a", "d") and not p.depends_on("b", "c1") and not p.depends_on("e", "a")
    assert not p.depends_on("a", "a")
    idx = p.index
    assert p.ancestors[idx["d"]] == sum(1 << idx[n] for n in ("a", "c1", "b", "w1"))
    assert p.descendants[idx["a"]] == sum(1 << idx[n] for n in ("v", "c1", "b", "w1", "d"))
    assert p.group_by_name["A"].size == 2 and p.curve_by_key[("B", RS)].group == "B"
    assert p.storage_by_name == {}


def test_problem_equality_ignores_metadata_and_normalizes_tuples() -> None:
    ops = list(_diamond().ops)
    p1 = ScheduleProblem(ops=ops, groups=[ProcessGroup("A", 2)], metadata={"k": "1"})  # type: ignore[arg-type]
    p2 = ScheduleProblem(ops=tuple(ops), groups=(ProcessGroup("A", 2),), metadata={"k": "2"})
    assert p1 == p2 and isinstance(p1.ops, tuple) and isinstance(p1.groups, tuple)


def test_bucket_key() -> None:
    a = CollectiveInfo(CollectiveKind.REDUCE_SCATTER, "A", "bf16", 4, 2, "sum")
    b = CollectiveInfo(CollectiveKind.REDUCE_SCATTER, "A", "f32", 8, 4, "sum")
    assert a.size_bytes == 6
    assert a.bucket_key() != b.bucket_key()
    assert a.bucket_key(multi_dtype=True) == b.bucket_key(multi_dtype=True) == ("reduce_scatter", "A", "sum", None)


def test_topological_order_helper() -> None:
    assert topological_order(["a", "b", "c"], {"a": ["c"], "b": []}) == ["b", "c", "a"]
    with pytest.raises(ProblemError, match="cycle"):
        topological_order(["a", "b"], {"a": ["b"], "b": ["a"]})
    with raises("'a'", "'zz'", match="unknown dependency"):
        topological_order(["a"], {"a": ["zz"]})


def test_duplicate_process_group() -> None:
    with raises("'A'", match="duplicate"):
        ScheduleProblem(ops=(), groups=(ProcessGroup("A", 2), ProcessGroup("A", 4)))


def test_duplicate_comm_curve() -> None:
    with raises("A/all_gather", match="duplicate"):
        ScheduleProblem(ops=(), groups=(ProcessGroup("A", 2),),
                        comm_curves=(CommCurve("A", AG, ((0, 1), (9, 2))), CommCurve("A", AG, ((0, 5), (9, 50)))))
