"""Terse constructors for hand-written scheduling problems in the solver tests.

Defaults are chosen so that hand derivations stay simple:

- every (group, kind) gets the comm curve ``runtime(size) = 100 + size`` ns (points (0, 100) and
  (1000, 1100), extended linearly);
- bucket copies cost ``copy_ns(b) = 100 + b`` ns (bandwidth 2 bytes/ns, launch 100 ns), since a
  copy reads and writes ``b`` bytes: ``100 + ceil(2 * b / 2)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fxsched.solver import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProcessGroup,
    ScheduleProblem,
    Storage,
)

AG = CollectiveKind.ALL_GATHER
RS = CollectiveKind.REDUCE_SCATTER
AR = CollectiveKind.ALL_REDUCE
A2A = CollectiveKind.ALL_TO_ALL

LINEAR_POINTS: tuple[tuple[int, int], ...] = ((0, 100), (1000, 1100))
SIMPLE_COSTS = BucketCosts(memory_bandwidth_gbps=2.0, launch_overhead_ns=100)


def compute(
    name: str,
    runtime_ns: int,
    deps: Sequence[str] = (),
    allocates: Sequence[str] = (),
    uses: Sequence[str] = (),
    heavy: bool = False,
) -> Op:
    return Op(name, OpKind.COMPUTE, runtime_ns, tuple(deps), tuple(allocates), tuple(uses), heavy=heavy)


def zero(name: str, deps: Sequence[str] = (), uses: Sequence[str] = ()) -> Op:
    """A view / getitem: no time, no allocation."""
    return Op(name, OpKind.ZERO, 0, tuple(deps), (), tuple(uses))


def coll(
    name: str,
    group: str = "A",
    kind: CollectiveKind = AG,
    *,
    runtime_ns: int = 0,
    bytes_in: int = 0,
    bytes_out: int = 0,
    dtype: str = "bf16",
    reduce_op: str | None = None,
    deps: Sequence[str] = (),
    allocates: Sequence[str] = (),
    uses: Sequence[str] = (),
) -> Op:
    if reduce_op is None and kind in (RS, AR):
        reduce_op = "sum"
    info = CollectiveInfo(kind, group, dtype, bytes_in, bytes_out, reduce_op)
    return Op(name, OpKind.COLLECTIVE, runtime_ns, tuple(deps), tuple(allocates), tuple(uses),
              collective=info)


def wait(name: str, on: str, deps: Sequence[str] = (), uses: Sequence[str] = ()) -> Op:
    all_deps = (on, *(d for d in deps if d != on))
    return Op(name, OpKind.WAIT, 0, all_deps, (), tuple(uses), waits_on=on)


def storage(name: str, size: int, *, inp: bool = False, param: bool = False, keep: bool = False) -> Storage:
    """``inp``: graph input; ``param``: graph input never freed; ``keep``: never freed (output)."""
    return Storage(name, size, is_input=inp or param, never_freed=param or keep)


def curves_for(groups: Iterable[str], points: tuple[tuple[int, int], ...] = LINEAR_POINTS) -> tuple[CommCurve, ...]:
    return tuple(CommCurve(g, k, points) for g in groups for k in CollectiveKind)


def make_problem(
    ops: Sequence[Op],
    storages: Sequence[Storage] = (),
    groups: Sequence[str] = ("A", "B"),
    *,
    group_size: int = 2,
    costs: BucketCosts = SIMPLE_COSTS,
    name: str = "hand",
) -> ScheduleProblem:
    return ScheduleProblem(
        ops=tuple(ops),
        storages=tuple(storages),
        groups=tuple(ProcessGroup(g, group_size) for g in groups),
        comm_curves=curves_for(groups),
        bucket_costs=costs,
        name=name,
    )


def loss_then_gather(temp: int = 1_000, gathered: int = 500):
    """a (2000 ns) makes the temporary T (``temp`` B), which b (10 ns) reads, making U (1 B); g
    gathers the parameter pg (100 B, never freed) into G (``gathered`` B; 100 + 100 + ``gathered``
    ns on the default curve), and y (1000 ns) reads G and U. In the original order (a, b, g, y)
    memory peaks at b: pg + T + U."""
    return make_problem([
        compute("a", 2_000, allocates=["T"], heavy=True),
        compute("b", 10, deps=["a"], uses=["T"], allocates=["U"]),
        coll("g", "A", AG, runtime_ns=200 + gathered, bytes_in=100, bytes_out=gathered, uses=["pg"], allocates=["G"]),
        wait("wg", "g", uses=["G"]),
        compute("y", 1_000, deps=["wg", "b"], uses=["G", "U"], heavy=True),
    ], [storage("pg", 100, param=True), storage("T", temp), storage("U", 1), storage("G", gathered)], groups=("A",))
