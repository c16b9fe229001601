"""Per-problem arrays the simulator reads on every call, built once per problem.

The simulator (simulator.py) scores every schedule that every search tries: the stream plan
search alone scores a few thousand plans per solve of the 4-node backward. Its memory curve and
compute clock then run as array operations over these tables, and only the issued collectives
(a few hundred at most) are walked one by one. On the 4-node backward (2,113 ops) that took a
full simulation (:func:`.simulator.simulate`, the schedule check included) from 4.4 to 1.2 ms.

What the simulator reads of each issued unit (a bucket or a lone collective: its members, group,
runtime, copies, whether it is hideable, and the ops and storages its positions move) depends only on the bucketing, so a
:class:`UnitTable` per bucketing is kept too (:meth:`SimTables.units`), and the issue and wait
positions of every unit come from a few array reductions. The deferral passes score one
bucketing thousands of times: on the tp_2x4 backward (2,375 ops, 200 collectives) a makespan
(:func:`.simulator.makespan_ns`) went from 2.24 to 0.3 ms and a full simulation from 4.53 to 1.2 ms;
on the 4-node backward, from 0.80 to 0.11 and from 2.10 to 0.8 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .problem import OpKind, ScheduleProblem

_KEY = "sim_tables"  # the problem's ``derived`` cache key
MAX_BUCKETINGS = 256  # unit tables kept per problem (a plan search tries thousands of bucketings)
MAX_UNITS = 1 << 16  # per-unit values kept per problem


def copy_in_ns(problem: ScheduleProblem, members: tuple[str, ...]) -> int:
    """The compute-stream copy-in a bucket runs right before its issue (0 for a lone collective)."""
    if len(members) == 1:
        return 0
    ops = problem.op_by_name
    return problem.bucket_costs.copy_ns(sum(ops[m].collective.bytes_in for m in members))  # type: ignore[union-attr]


def copy_out_ns(problem: ScheduleProblem, members: tuple[str, ...]) -> int:
    """The compute-stream copy-out an all_gather/all_to_all bucket runs at its wait (else 0)."""
    ops = problem.op_by_name
    if len(members) == 1 or not ops[members[0]].collective.kind.bucket_copies_out:  # type: ignore[union-attr]
        return 0
    return problem.bucket_costs.copy_ns(sum(ops[m].collective.bytes_out for m in members))  # type: ignore[union-attr]


@dataclass(frozen=True)
class _Unit:
    """What the simulator reads of one issued unit (members ordered by problem index)."""

    members: tuple[str, ...]
    group: str
    runtime_ns: int
    copy_in_ns: int
    copy_out_ns: int
    copies_out: bool  # a bucket whose kind copies out at its wait (all_gather, all_to_all)
    bytes_in: int
    bytes_out: int
    hideable: bool  # some positive-cost compute is independent of every member (DESIGN.md)


class UnitTable:
    """The issued units of one bucketing (each bucket, then each collective in no bucket, alone),
    as lists and arrays (see the module doc)."""

    def __init__(self, problem: ScheduleProblem, units: list[_Unit], tables: SimTables):
        index, wait_of = problem.index, problem.wait_of
        self.units = units
        sizes = [len(u.members) for u in units]
        self.starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
        self.member_ops = np.array([index[m] for u in units for m in u.members], dtype=np.int64)
        self.wait_ops = np.array([index[wait_of[m]] for u in units for m in u.members], dtype=np.int64)
        owner = np.repeat(np.arange(len(units), dtype=np.int64), sizes)
        multi = np.array(sizes, dtype=np.int64)[owner] > 1
        self.single_units = np.flatnonzero(np.array(sizes) == 1)
        self.single_ops = self.member_ops[self.starts[self.single_units]]
        allocs = [tables.allocates[i] for i in self.single_ops]
        self.single_storages = np.concatenate(allocs) if allocs else np.zeros(0, dtype=np.int64)
        self.single_storage_unit = np.repeat(self.single_units, [len(a) for a in allocs]).astype(np.int64)
        self.multi_ops, self.multi_owner = self.member_ops[multi], owner[multi]
        self.multi_copies_out = np.array([units[k].copies_out for k in self.multi_owner], dtype=bool)
        self.multi_units = [k for k, u in enumerate(units) if len(u.members) > 1]
        self.merged = [np.concatenate([tables.allocates[index[m]] for m in units[k].members])
                       for k in self.multi_units if not units[k].copies_out]
        group_of = {g: i for i, g in enumerate(sorted({u.group for u in units}))}
        self.n_groups = len(group_of)
        # per unit, as lists: copy-in, copy-out, runtime and group number (the makespan-only walk)
        self.walk = ([u.copy_in_ns for u in units], [u.copy_out_ns for u in units], [u.runtime_ns for u in units],
                     [group_of[u.group] for u in units])
        self.hideable = [u.hideable for u in units]

    def positions(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per unit, its issue position (its last member's) and wait position (its first member's
        wait's), given ``pos``, the position of each op."""
        if not len(self.units):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return (np.maximum.reduceat(pos[self.member_ops], self.starts),
                np.minimum.reduceat(pos[self.wait_ops], self.starts))


class SimTables:
    """Op runtimes, storage sizes and who allocates and reads each storage, as arrays (ops by
    original index, storages by their order in ``problem.storages``)."""

    def __init__(self, problem: ScheduleProblem):
        ops = problem.ops
        sidx = {s.name: i for i, s in enumerate(problem.storages)}
        # compute and zero-cost ops advance the compute clock (collectives and waits: at events)
        self.runtime = np.array([op.runtime_ns if op.kind in (OpKind.COMPUTE, OpKind.ZERO) else 0 for op in ops],
                                dtype=np.int64)
        self.size = np.array([s.size_bytes for s in problem.storages], dtype=np.int64)
        self.never_freed = np.array([s.never_freed for s in problem.storages], dtype=bool)
        self.initial = int(sum(s.size_bytes for s in problem.storages if s.is_input))
        # the op that allocates each storage (-1: none, an input allocated before the first op)
        self.alloc_op = np.full(len(problem.storages), -1, dtype=np.int64)
        self.allocates: list[np.ndarray] = []
        for i, op in enumerate(ops):
            mine = np.array([sidx[s] for s in op.allocates], dtype=np.int64)
            self.alloc_op[mine] = i
            self.allocates.append(mine)
        # every (storage, reader) pair sorted by storage, so one reduceat gives each storage's last use
        pairs = sorted((sidx[s], i) for i, op in enumerate(ops) for s in op.uses)
        self.use_storage = np.array([s for s, _ in pairs], dtype=np.int64)
        self.use_op = np.array([i for _, i in pairs], dtype=np.int64)
        self.read = np.unique(self.use_storage)  # storages with at least one reader
        self.read_starts = np.searchsorted(self.use_storage, self.read)
        index = problem.index
        edges = [(index[d], i) for i, op in enumerate(ops) for d in op.deps]
        self.dep = np.array([d for d, _ in edges], dtype=np.int64)  # each dependency edge: dep -> op
        self.dependent = np.array([i for _, i in edges], dtype=np.int64)
        self._unit_tables: dict[tuple[tuple[str, ...], ...], UnitTable] = {}
        self._units: dict[tuple[str, ...], _Unit] = {}

    def units(self, problem: ScheduleProblem, buckets: tuple[tuple[str, ...], ...]) -> UnitTable:
        """The :class:`UnitTable` of ``buckets`` (a valid schedule's), kept for later calls."""
        table = self._unit_tables.get(buckets)
        if table is None:
            if len(self._unit_tables) >= MAX_BUCKETINGS:
                self._unit_tables.clear()
            bucketed = {m for b in buckets for m in b}
            units = [self._unit(problem, tuple(b)) for b in buckets]
            units += [self._unit(problem, (c.name,)) for c in problem.collectives if c.name not in bucketed]
            table = self._unit_tables[buckets] = UnitTable(problem, units, self)
        return table

    def _unit(self, problem: ScheduleProblem, members: tuple[str, ...]) -> _Unit:
        unit = self._units.get(members)
        if unit is None:
            if len(self._units) >= MAX_UNITS:
                self._units.clear()
            ordered = tuple(sorted(members, key=problem.index.__getitem__))
            infos = [problem.op_by_name[m].collective for m in ordered]
            related = 0  # the members, their ancestors and their descendants
            for m in ordered:
                i = problem.index[m]
                related |= problem.ancestors[i] | problem.descendants[i] | (1 << i)
            unit = self._units[members] = _Unit(
                members=ordered, group=infos[0].group,  # type: ignore[union-attr]
                runtime_ns=problem.bucket_runtime_ns(ordered), copy_in_ns=copy_in_ns(problem, ordered),
                copy_out_ns=copy_out_ns(problem, ordered),
                copies_out=len(ordered) > 1 and infos[0].kind.bucket_copies_out,  # type: ignore[union-attr]
                bytes_in=sum(c.bytes_in for c in infos),  # type: ignore[union-attr]
                bytes_out=sum(c.bytes_out for c in infos),  # type: ignore[union-attr]
                hideable=bool(problem.timed_compute_mask & ~related))
        return unit

    def positions(self, problem: ScheduleProblem, order: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(op index at each position, position of each op)`` for a complete ``order``."""
        at = np.fromiter(map(problem.index.__getitem__, order), dtype=np.int64, count=len(order))
        pos = np.empty(len(problem.ops), dtype=np.int64)
        pos[at] = np.arange(len(at), dtype=np.int64)
        return at, pos

    def is_complete_topological(self, problem: ScheduleProblem, order: Sequence[str]) -> bool:
        """Whether ``order`` holds every op exactly once, each after its dependencies."""
        n = len(problem.ops)
        if len(order) != n:
            return False
        try:
            at, pos = self.positions(problem, order)
        except KeyError:  # an unknown op
            return False
        if n and np.bincount(at, minlength=n).max() != 1:
            return False
        return not bool((pos[self.dep] > pos[self.dependent]).any())


def sim_tables(problem: ScheduleProblem) -> SimTables:
    """The problem's :class:`SimTables`, built on first use and kept with the (immutable) problem."""
    tables = problem.derived.get(_KEY)
    if tables is None:
        tables = problem.derived[_KEY] = SimTables(problem)
    return tables
