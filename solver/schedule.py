"""A schedule (program order + buckets) and the checker that lists everything wrong with one.

Bucket semantics (shared by the simulator, the checker and every scheduler): a bucket is
issued at the program position of its last member, and waited at the position of its first
member's wait. Every member's wait must therefore come after every member's issue.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from .problem import OpKind, ScheduleProblem
from .sim_tables import sim_tables


@dataclass(frozen=True)
class Schedule:
    """Program order of every op, and the buckets (tuples of collective names, 2+ each).

    ``multi_dtype``: buckets may mix dtypes (their keys ignore dtype).
    """

    order: tuple[str, ...]
    buckets: tuple[tuple[str, ...], ...] = ()
    multi_dtype: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        object.__setattr__(self, "buckets", tuple(tuple(b) for b in self.buckets))

    @classmethod
    def original(cls, problem: ScheduleProblem) -> Schedule:
        """The problem's own program order, with no buckets."""
        return cls(order=tuple(op.name for op in problem.ops))


class ViolationKind(str, Enum):
    UNKNOWN_OP = "unknown_op"
    MISSING_OP = "missing_op"
    DUPLICATE_OP = "duplicate_op"
    NOT_TOPOLOGICAL = "not_topological"
    WAIT_BEFORE_COLLECTIVE = "wait_before_collective"
    BUCKET_NOT_COLLECTIVE = "bucket_not_collective"
    BUCKET_TOO_SMALL = "bucket_too_small"
    OP_IN_TWO_BUCKETS = "op_in_two_buckets"
    MIXED_BUCKET_KEY = "mixed_bucket_key"
    DEPENDENT_BUCKET_MEMBERS = "dependent_bucket_members"


@dataclass(frozen=True)
class Violation:
    kind: ViolationKind
    op: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


class ScheduleError(ValueError):
    """A schedule that breaks the execution model; carries every violation."""

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        shown = "; ".join(str(v) for v in violations[:5])
        more = f" (+{len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(f"invalid schedule: {shown}{more}")


@dataclass(frozen=True)
class BucketPlacement:
    """Where a bucket (or a lone collective) is issued and waited in a given order."""

    members: tuple[str, ...]
    issue_pos: int
    wait_pos: int


def check_schedule(problem: ScheduleProblem, schedule: Schedule) -> list[Violation]:
    """Every way ``schedule`` breaks the execution model; empty when it is valid.

    An order that holds every op once, after its dependencies (the common case: every search
    checks each candidate), is recognised with array operations; any other is walked op by op
    to name each violation."""
    if sim_tables(problem).is_complete_topological(problem, schedule.order):
        return _check_buckets(problem, schedule, dict(zip(schedule.order, range(len(schedule.order)))))
    out: list[Violation] = []
    ops = problem.op_by_name
    pos: dict[str, int] = {}
    for i, name in enumerate(schedule.order):
        if name not in ops:
            out.append(Violation(ViolationKind.UNKNOWN_OP, name, f"{name!r} is not an op of the problem"))
        elif name in pos:
            out.append(Violation(ViolationKind.DUPLICATE_OP, name, f"{name!r} appears twice in the order"))
        else:
            pos[name] = i
    for op in problem.ops:
        if op.name not in pos:
            out.append(Violation(ViolationKind.MISSING_OP, op.name, f"{op.name!r} is missing from the order"))
    for name, i in pos.items():
        op = ops[name]
        for d in op.deps:
            if d in pos and pos[d] > i:
                kind = ViolationKind.WAIT_BEFORE_COLLECTIVE if d == op.waits_on else ViolationKind.NOT_TOPOLOGICAL
                out.append(Violation(kind, name, f"{name!r} at {i} comes before its dependency {d!r} at {pos[d]}"))
    out.extend(_check_buckets(problem, schedule, pos))
    return out


def _check_buckets(problem: ScheduleProblem, schedule: Schedule, pos: dict[str, int]) -> list[Violation]:
    out: list[Violation] = []
    ops = problem.op_by_name
    owner: dict[str, int] = {}
    for b, members in enumerate(schedule.buckets):
        if len(members) < 2:
            out.append(Violation(ViolationKind.BUCKET_TOO_SMALL, members[0] if members else "",
                                 f"bucket {b} has {len(members)} member(s); a bucket needs 2 or more"))
        colls = []
        for m in members:
            if m not in ops or ops[m].kind is not OpKind.COLLECTIVE:
                out.append(Violation(ViolationKind.BUCKET_NOT_COLLECTIVE, m, f"bucket {b}: {m!r} is not a collective"))
                continue
            if m in owner:
                out.append(Violation(ViolationKind.OP_IN_TWO_BUCKETS, m,
                                     f"{m!r} is in buckets {owner[m]} and {b}"))
            owner[m] = b
            colls.append(m)
        if not colls:
            continue
        key0 = ops[colls[0]].collective.bucket_key(schedule.multi_dtype)  # type: ignore[union-attr]
        for m in colls[1:]:
            key = ops[m].collective.bucket_key(schedule.multi_dtype)  # type: ignore[union-attr]
            if key != key0:
                out.append(Violation(ViolationKind.MIXED_BUCKET_KEY, m,
                                     f"bucket {b}: {m!r} has key {key}, {colls[0]!r} has {key0}"))
        if _dependent_members(problem, colls):
            for i, a in enumerate(colls):
                for c in colls[i + 1:]:
                    if problem.depends_on(a, c) or problem.depends_on(c, a):
                        out.append(Violation(ViolationKind.DEPENDENT_BUCKET_MEMBERS, c,
                                             f"bucket {b}: {a!r} and {c!r} depend on each other"))
        if all(m in pos for m in colls) and all(problem.wait_of[m] in pos for m in colls):
            issue = max(colls, key=lambda m: pos[m])
            for m in colls:
                w = problem.wait_of[m]
                if m != issue and pos[w] < pos[issue]:
                    out.append(Violation(ViolationKind.WAIT_BEFORE_COLLECTIVE, w,
                                         f"bucket {b}: wait {w!r} at {pos[w]} comes before member "
                                         f"{issue!r} is issued at {pos[issue]}"))
    return out


def _dependent_members(problem: ScheduleProblem, members: list[str]) -> bool:
    """Whether some member of ``members`` depends on another (one pass over their ancestor sets;
    the caller then names the pairs)."""
    index, ancestors = problem.index, problem.ancestors
    mask = 0
    for m in members:
        mask |= 1 << index[m]
    return any(ancestors[index[m]] & mask for m in members)


def issued_units(problem: ScheduleProblem, schedule: Schedule) -> list[tuple[str, ...]]:
    """What the schedule issues: each bucket, then each collective in no bucket (alone), members
    in the problem's order (:meth:`.sim_tables.SimTables.units`)."""
    return [u.members for u in sim_tables(problem).units(problem, schedule.buckets).units]


def placements(problem: ScheduleProblem, schedule: Schedule) -> list[BucketPlacement]:
    """Issue and wait positions of every bucket and lone collective, sorted by issue position.

    Assumes ``schedule`` is valid (see :func:`check_schedule`).
    """
    tables = sim_tables(problem)
    units = tables.units(problem, schedule.buckets)
    issue, wait = units.positions(tables.positions(problem, schedule.order)[1])
    return [BucketPlacement(members=units.units[k].members, issue_pos=int(issue[k]), wait_pos=int(wait[k]))
            for k in np.argsort(issue, kind="stable").tolist()]
