"""The scheduling problem: plain, validated data that every scheduler and the simulator share.

A :class:`ScheduleProblem` is one step of distributed training reduced to what scheduling needs:
operations with integer-nanosecond runtimes and data dependencies, the storages they allocate and
use (already alias-resolved: views use their base's storage), the process groups, and a
collective cost curve per (group, kind) so that a bucket of collectives can be priced at its
summed size. ``ops`` is listed in the original program order.

Nothing here imports torch; ``fxsched.fxbridge`` builds problems from FX graphs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

import numpy as np


class ProblemError(ValueError):
    """A problem (or schedule file) is malformed; the message names the offending item."""


def _require_int(what: str, **fields: object) -> None:
    for key, val in fields.items():
        if not isinstance(val, int) or isinstance(val, bool):
            raise ProblemError(f"{what}: {key} must be an integer, got {val!r}")


class OpKind(str, Enum):
    """What an operation is on the execution model's streams."""

    COMPUTE = "compute"  # runs on the compute stream for ``runtime_ns``
    COLLECTIVE = "collective"  # issued into its process group's FIFO comm stream
    WAIT = "wait"  # stalls the compute stream until its collective ends
    ZERO = "zero"  # views, getitem and other metadata ops: no time, no allocation


class CollectiveKind(str, Enum):
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"

    @property
    def bucket_copies_out(self) -> bool:
        """Whether a bucket of this kind needs a copy after the wait (vs. views of the flat output).

        all_gather outputs are rank-interleaved in the flat buffer and need a per-rank
        un-interleave copy; all_to_all likewise. reduce_scatter and all_reduce outputs are
        contiguous slices (views) of the flat output.
        """
        return self in (CollectiveKind.ALL_GATHER, CollectiveKind.ALL_TO_ALL)


@dataclass(frozen=True)
class ProcessGroup:
    """A process group: its collectives run one at a time, in issue order (FIFO)."""

    name: str
    size: int
    ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ProblemError("process group: empty name")
        _require_int(f"process group {self.name!r}", size=self.size)
        if self.size < 1:
            raise ProblemError(f"process group {self.name!r}: size must be >= 1, got {self.size}")
        if self.ranks and len(self.ranks) != self.size:
            raise ProblemError(
                f"process group {self.name!r}: {len(self.ranks)} ranks listed for size {self.size}"
            )


@dataclass(frozen=True)
class CommCurve:
    """Runtime of one collective kind on one group as a function of its size.

    ``points`` are ``(size_bytes, runtime_ns)`` breakpoints with strictly increasing sizes,
    evaluated by linear interpolation and extended linearly past the last point. The size is
    the one torch's ``comm_analysis`` prices: input plus output bytes.
    """

    group: str
    kind: CollectiveKind
    points: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if len(self.points) < 2:
            raise ProblemError(f"comm curve {self.group}/{self.kind.value}: needs >= 2 points")
        for x, y in self.points:
            _require_int(f"comm curve {self.group}/{self.kind.value}", size_bytes=x, runtime_ns=y)
        sizes = [p[0] for p in self.points]
        if sizes[0] < 0 or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ProblemError(
                f"comm curve {self.group}/{self.kind.value}: sizes must be >= 0 and increasing"
            )
        if any(p[1] < 0 for p in self.points):
            raise ProblemError(f"comm curve {self.group}/{self.kind.value}: negative runtime")

    def runtime_ns(self, size_bytes: int) -> int:
        """Interpolated runtime in integer nanoseconds (rounded up)."""
        pts = self.points
        i = bisect.bisect_right([p[0] for p in pts], size_bytes) - 1
        i = min(max(i, 0), len(pts) - 2)
        (x0, y0), (x1, y1) = pts[i], pts[i + 1]
        return max(0, math.ceil(y0 + (y1 - y0) * (size_bytes - x0) / (x1 - x0)))


@dataclass(frozen=True)
class CollectiveInfo:
    """What a collective does: enough to price it, bucket it and check bucket compatibility."""

    kind: CollectiveKind
    group: str
    dtype: str
    bytes_in: int
    bytes_out: int
    reduce_op: str | None = None

    def __post_init__(self) -> None:
        _require_int(f"collective on {self.group!r}", bytes_in=self.bytes_in, bytes_out=self.bytes_out)
        if self.bytes_in < 0 or self.bytes_out < 0:
            raise ProblemError(
                f"collective on {self.group!r}: negative size ({self.bytes_in}, {self.bytes_out})"
            )

    @property
    def size_bytes(self) -> int:
        """The size the cost curve prices (input + output), as torch's comm_analysis does."""
        return self.bytes_in + self.bytes_out

    def bucket_key(self, multi_dtype: bool = False) -> tuple[str, str, str | None, str | None]:
        """Collectives merge into one bucket only when these keys are equal."""
        return (self.kind.value, self.group, self.reduce_op, None if multi_dtype else self.dtype)


@dataclass(frozen=True)
class Storage:
    """One allocation, counted once however many views alias it.

    ``is_input``: live before the first op (graph input). ``never_freed``: parameters and
    graph outputs, which stay live to the end.
    """

    name: str
    size_bytes: int
    is_input: bool = False
    never_freed: bool = False

    def __post_init__(self) -> None:
        _require_int(f"storage {self.name!r}", size_bytes=self.size_bytes)
        if self.size_bytes < 0:
            raise ProblemError(f"storage {self.name!r}: negative size_bytes {self.size_bytes}")


@dataclass(frozen=True)
class Op:
    """One schedulable operation.

    ``deps`` are the ops whose results it reads (through views too). ``allocates`` are the
    storages it creates; ``uses`` the storages it reads. A collective carries ``collective``;
    a wait names the collective it waits on in ``waits_on`` (and depends on it). ``heavy``
    marks FLOP-heavy compute (matmul, attention, conv) whose order the fixed-order mode keeps.
    """

    name: str
    kind: OpKind
    runtime_ns: int = 0
    deps: tuple[str, ...] = ()
    allocates: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    collective: CollectiveInfo | None = None
    waits_on: str | None = None
    heavy: bool = False
    target: str = ""
    module: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ProblemError("op with empty name")
        _require_int(f"op {self.name!r}", runtime_ns=self.runtime_ns)
        if self.runtime_ns < 0:
            raise ProblemError(f"op {self.name!r}: negative runtime_ns {self.runtime_ns}")
        is_coll = self.kind is OpKind.COLLECTIVE
        if is_coll != (self.collective is not None):
            raise ProblemError(f"op {self.name!r}: collective info must be given iff kind is collective")
        if (self.kind is OpKind.WAIT) != (self.waits_on is not None):
            raise ProblemError(f"op {self.name!r}: waits_on must be given iff kind is wait")
        if self.kind is OpKind.WAIT and self.waits_on not in self.deps:
            raise ProblemError(f"wait {self.name!r}: must depend on its collective {self.waits_on!r}")
        if self.kind is OpKind.ZERO and (self.runtime_ns or self.allocates):
            raise ProblemError(f"zero-cost op {self.name!r}: has a runtime or allocations")


@dataclass(frozen=True)
class BucketCosts:
    """Prices of the compute a bucket adds: the copy-in (concatenation) and the copy-out.

    A copy moves ``bytes`` once for reading and once for writing at ``memory_bandwidth_gbps``
    (GB/s == bytes/ns), plus one kernel launch.
    """

    memory_bandwidth_gbps: float = 3350.0
    launch_overhead_ns: int = 5_000

    def __post_init__(self) -> None:
        if self.memory_bandwidth_gbps <= 0 or self.launch_overhead_ns < 0:
            raise ProblemError("bucket costs: bandwidth must be > 0 and launch overhead >= 0")

    def copy_ns(self, size_bytes: int) -> int:
        return self.launch_overhead_ns + math.ceil(2 * size_bytes / self.memory_bandwidth_gbps)


@dataclass(frozen=True)
class ScheduleProblem:
    """A validated scheduling problem. ``ops`` is the original program order."""

    ops: tuple[Op, ...]
    storages: tuple[Storage, ...] = ()
    groups: tuple[ProcessGroup, ...] = ()
    comm_curves: tuple[CommCurve, ...] = ()
    bucket_costs: BucketCosts = field(default_factory=BucketCosts)
    link_contention: float = 0.0  # off by default; see simulator: cross-group slowdown factor
    name: str = "problem"
    metadata: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "storages", tuple(self.storages))
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "comm_curves", tuple(self.comm_curves))
        _validate(self)

    # ---- lookups (derived once; the dataclass is frozen) ----
    @cached_property
    def op_by_name(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Op names in the problem's order (index -> name)."""
        return tuple(op.name for op in self.ops)

    @cached_property
    def index(self) -> dict[str, int]:
        """Position of each op in the original order."""
        return {op.name: i for i, op in enumerate(self.ops)}

    @cached_property
    def storage_by_name(self) -> dict[str, Storage]:
        return {s.name: s for s in self.storages}

    @cached_property
    def group_by_name(self) -> dict[str, ProcessGroup]:
        return {g.name: g for g in self.groups}

    @cached_property
    def curve_by_key(self) -> dict[tuple[str, CollectiveKind], CommCurve]:
        return {(c.group, c.kind): c for c in self.comm_curves}

    @cached_property
    def wait_of(self) -> dict[str, str]:
        """Collective name -> the name of its (single) wait."""
        return {op.waits_on: op.name for op in self.ops if op.waits_on is not None}

    @cached_property
    def collectives(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.kind is OpKind.COLLECTIVE)

    @cached_property
    def users(self) -> dict[str, tuple[str, ...]]:
        """Op name -> names of the ops that depend on it."""
        out: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for d in op.deps:
                out[d].append(op.name)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def derived(self) -> dict[str, Any]:
        """Tables other modules derive from the problem once and keep here, by key (the problem
        is immutable, so they never go stale): the simulator's arrays, say."""
        return {}

    @cached_property
    def timed_compute_mask(self) -> int:
        """Bitset of the compute ops that take time (original index): what can hide a collective."""
        m = 0
        for i, op in enumerate(self.ops):
            if op.kind is OpKind.COMPUTE and op.runtime_ns > 0:
                m |= 1 << i
        return m

    @cached_property
    def ancestors(self) -> list[int]:
        """Bitset (Python int) of transitive dependencies of each op, by original index."""
        idx = self.index
        anc = [0] * len(self.ops)
        for i, op in enumerate(self.ops):  # original order is topological (validated)
            a = 0
            for d in op.deps:
                j = idx[d]
                a |= anc[j] | (1 << j)
            anc[i] = a
        return anc

    @cached_property
    def descendants(self) -> list[int]:
        """Bitset of the ops that transitively depend on each op, by original index."""
        idx = self.index
        desc = [0] * len(self.ops)
        for i in range(len(self.ops) - 1, -1, -1):
            d = 0
            for u in self.users[self.ops[i].name]:
                j = idx[u]
                d |= desc[j] | (1 << j)
            desc[i] = d
        return desc

    def depends_on(self, a: str, b: str) -> bool:
        """True when op ``a`` transitively depends on op ``b``."""
        return bool(self.ancestors[self.index[a]] >> self.index[b] & 1)

    def bucket_runtime_ns(self, members: Sequence[str]) -> int:
        """Runtime of one collective that carries all ``members`` (a single op keeps its own)."""
        ops = [self.op_by_name[m] for m in members]
        if len(ops) == 1:
            return ops[0].runtime_ns
        info = ops[0].collective
        assert info is not None
        curve = self.curve_by_key.get((info.group, info.kind))
        if curve is None:
            raise ProblemError(f"no comm curve for group {info.group!r} kind {info.kind.value!r}")
        return curve.runtime_ns(sum(op.collective.size_bytes for op in ops))  # type: ignore[union-attr]


def _validate(p: ScheduleProblem) -> None:
    """Raise ProblemError naming the first malformed item."""
    seen: dict[str, int] = {}
    for i, op in enumerate(p.ops):
        if op.name in seen:
            raise ProblemError(f"op {op.name!r}: duplicate name")
        seen[op.name] = i
    storages = {s.name for s in p.storages}
    if len(storages) != len(p.storages):
        raise ProblemError("duplicate storage name")
    if not 0.0 <= p.link_contention <= 10.0:
        raise ProblemError(f"link_contention must be in [0, 10], got {p.link_contention!r}")
    groups = {g.name for g in p.groups}
    if len(groups) != len(p.groups):
        dup = next(g.name for g in p.groups if sum(h.name == g.name for h in p.groups) > 1)
        raise ProblemError(f"process group {dup!r}: duplicate name")
    curve_keys = [(c.group, c.kind) for c in p.comm_curves]
    for k in curve_keys:
        if curve_keys.count(k) > 1:
            raise ProblemError(f"comm curve {k[0]}/{k[1].value}: duplicate (group, kind)")
    allocator: dict[str, str] = {}
    waits: dict[str, str] = {}
    for i, op in enumerate(p.ops):
        for d in op.deps:
            if d not in seen:
                raise ProblemError(f"op {op.name!r}: unknown dependency {d!r}")
            if seen[d] >= i:
                what = "cycle" if _reaches(p, op.name, d, seen) else "dependency listed after it"
                raise ProblemError(f"op {op.name!r}: {what} through {d!r} (ops must be in a topological order)")
        for s in (*op.allocates, *op.uses):
            if s not in storages:
                raise ProblemError(f"op {op.name!r}: unknown storage {s!r}")
        for s in op.allocates:
            if s in allocator:
                raise ProblemError(f"storage {s!r}: allocated by both {allocator[s]!r} and {op.name!r}")
            allocator[s] = op.name
        if op.collective is not None and op.collective.group not in groups:
            raise ProblemError(f"collective {op.name!r}: unknown process group {op.collective.group!r}")
        if op.waits_on is not None:
            target = p.ops[seen[op.waits_on]] if op.waits_on in seen else None
            if target is None or target.kind is not OpKind.COLLECTIVE:
                raise ProblemError(f"wait {op.name!r}: waits on {op.waits_on!r}, which is not a collective")
            if op.waits_on in waits:
                raise ProblemError(
                    f"collective {op.waits_on!r}: has two waits ({waits[op.waits_on]!r}, {op.name!r})"
                )
            waits[op.waits_on] = op.name
    for op in p.ops:
        if op.kind is OpKind.COLLECTIVE and op.name not in waits:
            raise ProblemError(f"collective {op.name!r}: has no wait")
    for s in p.storages:
        if s.name not in allocator and not s.is_input:
            raise ProblemError(f"storage {s.name!r}: not allocated by any op and not a graph input")
        if s.name in allocator and s.is_input:
            raise ProblemError(f"storage {s.name!r}: graph input allocated by op {allocator[s.name]!r}")
    for c in p.comm_curves:
        if c.group not in groups:
            raise ProblemError(f"comm curve: unknown process group {c.group!r}")


def _reaches(p: ScheduleProblem, src: str, dst: str, seen: dict[str, int]) -> bool:
    """Whether ``dst`` depends transitively on ``src`` (used only to word an error)."""
    by_name = {op.name: op for op in p.ops}
    stack, visited = [dst], set()
    while stack:
        n = stack.pop()
        if n == src:
            return True
        if n in visited or n not in by_name:
            continue
        visited.add(n)
        stack.extend(by_name[n].deps)
    return False


def topological_order(
    names: Iterable[str], deps: dict[str, Sequence[str]], key: Callable[[str], Any] | None = None
) -> list[str]:
    """Kahn's algorithm: smallest ``key`` first among the free nodes (default: the given order).
    Raises ProblemError naming a node on a cycle."""
    names = list(names)
    indeg = {n: 0 for n in names}
    users: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for d in deps.get(n, ()):
            if d not in indeg:
                raise ProblemError(f"node {n!r}: unknown dependency {d!r}")
            indeg[n] += 1
            users[d].append(n)
    if key is None:
        pos = {n: i for i, n in enumerate(names)}
        key = pos.__getitem__
    heap = [(key(n), n) for n in names if indeg[n] == 0]
    heapq.heapify(heap)
    out: list[str] = []
    while heap:
        _, n = heapq.heappop(heap)
        out.append(n)
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (key(u), u))
    if len(out) != len(names):
        stuck = next(n for n in names if indeg[n] > 0)
        raise ProblemError(f"cycle through node {stuck!r}")
    return out


def bit_mask(bits: int, n: int) -> np.ndarray:
    """The int bitset ``bits`` over ``n`` ops (``ScheduleProblem.ancestors`` / ``descendants``)
    as a boolean array."""
    raw = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)
