"""The one simulator that scores every schedule (DESIGN.md, "Execution model").

- One compute stream runs compute ops in program order, each for its ``runtime_ns``.
- One comm stream per process group runs its collectives one at a time in issue order.
- A collective issued at position p starts when every compute op before p has finished and the
  group's previous collective has ended.
- A wait at position p stalls the compute stream until its collective ends; the stall is
  exposed time. Makespan = compute time (bucket copies included) + exposed time.
- A bucket is issued at its last member's position: a copy-in kernel runs there on the compute
  stream, then one collective priced at the summed size. It is waited at its first member's
  wait; all_gather/all_to_all buckets then run a copy-out kernel.
- Optional link contention (``problem.link_contention = f``, default 0): a collective that
  starts while a collective of another group is still running takes ``(1 + f)`` times as
  long, as when groups share links. Collectives are priced in issue order, each against
  the ones issued before it.
- Memory follows the caching allocator in program order: outputs are allocated when their op
  is issued, freed after their last use; a collective's inputs stay live until its wait;
  ``never_freed`` storages (parameters, graph outputs) stay live. The curve holds, for each
  position, the memory after that op's allocations and before its frees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .problem import ScheduleProblem
from .schedule import BucketPlacement, Schedule, ScheduleError, check_schedule, placements
from .sim_tables import sim_tables

_NEVER = 1 << 62


@dataclass(frozen=True)
class CollectiveTiming:
    """Timeline of one issued collective (a lone collective or a whole bucket)."""

    members: tuple[str, ...]
    group: str
    issue_pos: int
    wait_pos: int
    issue_ns: int  # compute-stream clock when it was enqueued (after any copy-in)
    start_ns: int
    end_ns: int
    wait_ns: int  # compute-stream clock when its wait was reached
    exposed_ns: int
    hideable: bool

    @property
    def name(self) -> str:
        return self.members[0]

    @property
    def runtime_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def hidden(self) -> bool:
        return self.exposed_ns == 0

    @property
    def fifo_delay_ns(self) -> int:
        """Time it sat behind earlier collectives of its group."""
        return self.start_ns - self.issue_ns


@dataclass(frozen=True)
class SimResult:
    makespan_ns: int
    exposed_ns: int
    compute_ns: int
    comm_ns: int
    peak_memory_bytes: int
    initial_memory_bytes: int
    memory_curve: tuple[int, ...]
    collectives: tuple[CollectiveTiming, ...]

    @property
    def n_collectives(self) -> int:
        return len(self.collectives)

    def busy_ns_by_group(self) -> dict[str, int]:
        """Per process group, the time its stream spends running collectives."""
        busy: dict[str, int] = {}
        for c in self.collectives:
            busy[c.group] = busy.get(c.group, 0) + c.end_ns - c.start_ns
        return busy

    @property
    def n_hidden(self) -> int:
        return sum(c.hidden for c in self.collectives)

    @property
    def n_hideable(self) -> int:
        return sum(c.hideable for c in self.collectives)

    @property
    def n_hidden_hideable(self) -> int:
        return sum(c.hidden and c.hideable for c in self.collectives)


def simulate(problem: ScheduleProblem, schedule: Schedule | None = None, *, check: bool = True) -> SimResult:
    """Score ``schedule`` (default: the original order) under the execution model.

    Raises :class:`ScheduleError` listing every violation when ``check`` and the schedule is
    invalid.
    """
    schedule = schedule or Schedule.original(problem)
    if check:
        violations = check_schedule(problem, schedule)
        if violations:
            raise ScheduleError(violations)
    places = placements(problem, schedule)
    timings, makespan, compute, exposed = _timeline(problem, schedule, places)
    initial, curve = memory_curve(problem, schedule, places)
    return SimResult(
        makespan_ns=makespan,
        exposed_ns=exposed,
        compute_ns=compute,
        comm_ns=sum(t.runtime_ns for t in timings),
        peak_memory_bytes=max(initial, max(curve, default=initial)),
        initial_memory_bytes=initial,
        memory_curve=tuple(curve),
        collectives=tuple(timings),
    )


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


def makespan_ns(problem: ScheduleProblem, schedule: Schedule) -> int:
    """The makespan :func:`simulate` gives a valid ``schedule``, without the memory curve (cheaper:
    local searches rank many candidates by makespan and check memory only for the best)."""
    return _timeline(problem, schedule, placements(problem, schedule))[1]


def position_clocks(problem: ScheduleProblem, schedule: Schedule) -> list[int]:
    """The compute-stream clock right after each position of a valid ``schedule`` (a wait's
    stall and copy-out included): the times a model hinted with ``schedule`` should take."""
    clocks: list[int] = []
    _timeline(problem, schedule, placements(problem, schedule), clocks)
    return clocks


def timed_clocks(problem: ScheduleProblem, schedule: Schedule) -> tuple[list[CollectiveTiming], list[int]]:
    """Every issued collective's timing and the compute-stream clock after each position of a valid
    ``schedule``, from one pass (no memory curve): what a search that places issues and waits by
    the times an earlier draft reached needs (heuristics/stream_plan.py)."""
    clocks: list[int] = []
    timings = _timeline(problem, schedule, placements(problem, schedule), clocks)[0]
    return timings, clocks


def _timeline(
    problem: ScheduleProblem, schedule: Schedule, places: list[BucketPlacement], clocks: list[int] | None = None
) -> tuple[list[CollectiveTiming], int, int, int]:
    """Every issued collective's timing, the makespan, the compute time and the exposed time
    (and, into ``clocks``, the compute-stream clock after each position).

    The compute clock is a running sum of op runtimes plus what the issues and waits add (copies,
    stalls): only those events are walked, in program order."""
    tables = sim_tables(problem)
    ops = problem.op_by_name
    hide = _Hideability(problem)
    at, _ = tables.positions(problem, schedule.order)
    ran = np.cumsum(tables.runtime[at])  # compute and zero-cost ops' time through each position
    events = sorted([(p.issue_pos, p) for p in places] + [(p.wait_pos, p) for p in places], key=lambda e: e[0])
    added = np.zeros(len(at), dtype=np.int64) if clocks is not None else None  # copies and stalls per position
    group_free: dict[str, int] = {}
    running: list[tuple[str, int, int]] = []  # (group, start, end) of every issued collective
    started: dict[tuple[str, ...], tuple[int, int, int]] = {}
    timings: list[CollectiveTiming] = []
    offset = copies = exposed = 0  # offset: copies and stalls so far, on top of ``ran``
    for i, p in events:
        t = int(ran[i]) + offset
        if i == p.issue_pos:
            copy = copy_in_ns(problem, p.members)
            t += copy
            step = copy
            group = ops[p.members[0]].collective.group  # type: ignore[union-attr]
            start = max(t, group_free.get(group, 0))
            runtime = problem.bucket_runtime_ns(p.members)
            if problem.link_contention and any(
                g != group and s0 <= start < e0 for g, s0, e0 in running
            ):
                runtime = math.ceil(runtime * (1 + problem.link_contention))
            end = start + runtime
            group_free[group] = end
            running.append((group, start, end))
            started[p.members] = (t, start, end)
        else:
            issue_ns, start, end = started[p.members]
            stall = max(0, end - t)
            exposed += stall
            first = ops[p.members[0]].collective
            assert first is not None
            copy = copy_out_ns(problem, p.members)
            step = stall + copy
            timings.append(CollectiveTiming(
                members=p.members, group=first.group, issue_pos=p.issue_pos, wait_pos=p.wait_pos,
                issue_ns=issue_ns, start_ns=start, end_ns=end, wait_ns=t, exposed_ns=stall,
                hideable=hide(p.members),
            ))
        copies += copy
        offset += step
        if added is not None:
            added[i] += step
    if added is not None:
        clocks.extend((ran + np.cumsum(added)).tolist())
    timings.sort(key=lambda c: c.issue_pos)
    total = int(ran[-1]) if len(ran) else 0
    return timings, total + offset, total + copies, exposed


class _Hideability:
    """A collective is hideable when some positive-cost compute is independent of it."""

    def __init__(self, problem: ScheduleProblem):
        self.problem = problem

    def __call__(self, members: tuple[str, ...]) -> bool:
        p = self.problem
        related = 0
        for m in members:
            related |= p.ancestors[p.index[m]] | p.descendants[p.index[m]] | (1 << p.index[m])
        return bool(p.timed_compute_mask & ~related)


def memory_curve(
    problem: ScheduleProblem, schedule: Schedule, places: list[BucketPlacement] | None = None
) -> tuple[int, list[int]]:
    """(initial memory, memory at each program position) for a valid schedule.

    A storage is live from the position that allocates it (-1: an input, live from the start)
    through its last use: its allocator's position, or for a collective's output its issue (a
    lone collective, a reduce_scatter/all_reduce bucket) or its bucket's wait (all_gather/
    all_to_all buckets copy out there); its last use, the last position that reads it, or for
    a collective's input its wait (alone) or its bucket's issue (the copy-in). A lone
    collective's outputs stay live until its wait; a bucket's flat buffers live from its issue
    to its wait; the outputs of a bucket that does not copy out are views of one buffer, freed
    together. Computed as array operations over :mod:`.sim_tables`."""
    places = placements(problem, schedule) if places is None else places
    tables = sim_tables(problem)
    index = problem.index
    n = len(schedule.order)
    _, pos = tables.positions(problem, schedule.order)
    use_at, out_at = pos.copy(), pos.copy()  # per op: the position its reads count at / its outputs appear
    late: list[tuple[np.ndarray, int]] = []  # a lone collective's outputs: live until its wait
    extra: list[tuple[int, int, int]] = []  # (size, alloc_pos, free_pos) of bucket buffers
    merged: list[np.ndarray] = []  # outputs of a bucket that does not copy out: freed together
    ops = problem.op_by_name
    for p in places:
        idx = [index[m] for m in p.members]
        if len(idx) == 1:
            use_at[idx[0]] = p.wait_pos
            late.append((tables.allocates[idx[0]], p.wait_pos))
            continue
        infos = [ops[m].collective for m in p.members]
        copies_out = infos[0].kind.bucket_copies_out  # type: ignore[union-attr]
        use_at[idx] = p.issue_pos
        out_at[idx] = p.wait_pos if copies_out else p.issue_pos
        extra.append((sum(c.bytes_in for c in infos), p.issue_pos, p.wait_pos))  # type: ignore[union-attr]
        if copies_out:
            extra.append((sum(c.bytes_out for c in infos), p.issue_pos, p.wait_pos))  # type: ignore[union-attr]
        else:
            merged.append(np.concatenate([tables.allocates[i] for i in idx]))
    last = np.full(len(tables.size), -2, dtype=np.int64)
    if len(tables.read):
        last[tables.read] = np.maximum.reduceat(use_at[tables.use_op], tables.read_starts)
    for storages, w in late:
        last[storages] = np.maximum(last[storages], w)
    alloc = np.where(tables.alloc_op >= 0, out_at[np.maximum(tables.alloc_op, 0)], -1)
    free = np.where(tables.never_freed, _NEVER, np.maximum(alloc, np.where(last == -2, alloc, last)))
    for group in merged:
        if len(group):
            free[group] = free[group].max()
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, np.maximum(alloc, 0), tables.size)
    freed = free != _NEVER
    np.add.at(delta, free[freed] + 1, -tables.size[freed])
    for size, a, f in extra:
        _add(delta, size, a, f)
    return tables.initial, np.cumsum(delta[:n]).tolist()


def _add(delta: np.ndarray, size: int, a: int, f: int) -> None:
    """Count ``size`` as live over positions a..f (a == -1: live from before the first op)."""
    delta[max(a, 0)] += size
    if f != _NEVER and f + 1 < len(delta):
        delta[f + 1] -= size
