"""Per-problem arrays the simulator reads on every call, built once per problem.

The simulator (simulator.py) scores every schedule that every search tries: the stream plan
search alone scores a few thousand plans per solve of the 4-node backward. Its memory curve and
compute clock then run as array operations over these tables, and only the issued collectives
(a few hundred at most) are walked one by one. On the 4-node backward (2,113 ops) that took a
full simulation (:func:`.simulator.simulate`, the schedule check included) from 4.4 to 1.2 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .problem import OpKind, ScheduleProblem

_KEY = "sim_tables"  # the problem's ``derived`` cache key


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
