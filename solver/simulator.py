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

import bisect
import math
from dataclasses import dataclass

import numpy as np

from .problem import ScheduleProblem
from .schedule import Schedule, ScheduleError, check_schedule
from .sim_tables import copy_in_ns, copy_out_ns, sim_tables

__all__ = ["CollectiveTiming", "SimResult", "copy_in_ns", "copy_out_ns", "makespan_at", "makespan_ns",
           "memory_curve", "position_clocks", "simulate", "timed_clocks"]

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

    @property
    def n_hideable_members(self) -> int:
        """:attr:`n_hideable` with each bucket counted as its members: the graph's collectives that
        sit in hideable units (a bucket is one collective to the execution model, but it carries
        several of the graph's, and a stalled bucket leaves every one of them waited on)."""
        return sum(len(c.members) for c in self.collectives if c.hideable)

    @property
    def n_hidden_hideable_members(self) -> int:
        """:attr:`n_hidden_hideable` with each bucket counted as its members (:attr:`n_hideable_members`)."""
        return sum(len(c.members) for c in self.collectives if c.hidden and c.hideable)

    def stall_intervals(self) -> list[tuple[int, int]]:
        """The compute stream's stalls as merged ``[from, to)`` clock intervals: each stalled
        wait idles it from when it is reached until its collective ends."""
        spans = sorted((c.wait_ns, c.wait_ns + c.exposed_ns) for c in self.collectives if c.exposed_ns > 0)
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    @property
    def n_overlapped_hideable(self) -> int:
        """Hideable collectives that some compute ran beside: Inductor's "hidden" count (its
        overlap scheduler counts a collective exposed only when no compute overlaps it at all,
        while DESIGN.md's :attr:`CollectiveTiming.hidden` asks for a wait that does not stall).
        A collective is fully exposed when the compute stream stalls for the whole of its run (a
        run that takes no time has nothing beside it)."""
        stalls = self.stall_intervals()
        starts = [a for a, _ in stalls]
        n = 0
        for c in self.collectives:
            if not c.hideable:
                continue
            covered, k = 0, max(0, bisect.bisect_right(starts, c.start_ns) - 1)  # the last stall from before it
            while k < len(stalls) and stalls[k][0] < c.end_ns:
                covered += max(0, min(stalls[k][1], c.end_ns) - max(stalls[k][0], c.start_ns))
                k += 1
            n += covered < c.end_ns - c.start_ns
        return n


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
    placed = _Placed(problem, schedule)
    timings, makespan, compute, exposed = _timeline(problem, placed)
    initial, curve = _memory(problem, placed)
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


def makespan_ns(problem: ScheduleProblem, schedule: Schedule) -> int:
    """The makespan :func:`simulate` gives a valid ``schedule``, without the memory curve or the
    collectives' timings (cheaper: local searches rank many candidates by makespan and check memory
    only for the best)."""
    return _makespan(problem, _Placed(problem, schedule))


def makespan_at(problem: ScheduleProblem, at: np.ndarray, buckets: tuple[tuple[str, ...], ...]) -> int:
    """:func:`makespan_ns` of the valid schedule with op ``at[p]`` (a problem index) at each position
    ``p`` and ``buckets``: local searches that build their candidates as index arrays rank them
    without naming every op (heuristics/reorder.py, heuristics/single_pull.py)."""
    return _makespan(problem, _Placed(problem, buckets=buckets, at=at))


def makespan_hidden_at(problem: ScheduleProblem, at: np.ndarray,
                       buckets: tuple[tuple[str, ...], ...]) -> tuple[int, int]:
    """:func:`makespan_at` and the number of hidden hideable issued collectives (a lone collective or
    a bucket each, as :attr:`SimResult.n_hidden_hideable` counts them) from the same walk, without
    the memory curve or the timings: what a search that ranks candidates by that count needs
    (heuristics/hide.py)."""
    placed = _Placed(problem, buckets=buckets, at=at)
    if problem.link_contention:
        timings, makespan, _, _ = _timeline(problem, placed)
        return makespan, sum(t.hidden and t.hideable for t in timings)
    return _walk(problem, placed)


def peak_at(problem: ScheduleProblem, at: np.ndarray, buckets: tuple[tuple[str, ...], ...]) -> int:
    """:func:`simulate`'s peak memory of the valid schedule with op ``at[p]`` at each position ``p``."""
    initial, curve = _memory(problem, _Placed(problem, buckets=buckets, at=at))
    return max(initial, max(curve, default=initial))


def position_clocks(problem: ScheduleProblem, schedule: Schedule) -> list[int]:
    """The compute-stream clock right after each position of a valid ``schedule`` (a wait's
    stall and copy-out included): the times a model hinted with ``schedule`` should take."""
    clocks: list[int] = []
    _timeline(problem, _Placed(problem, schedule), clocks, timings=False)
    return clocks


def timed_clocks(problem: ScheduleProblem, schedule: Schedule) -> tuple[list[CollectiveTiming], list[int]]:
    """Every issued collective's timing and the compute-stream clock after each position of a valid
    ``schedule``, from one pass (no memory curve): what a search that places issues and waits by
    the times an earlier draft reached needs (heuristics/stream_plan.py)."""
    clocks: list[int] = []
    timings = _timeline(problem, _Placed(problem, schedule), clocks)[0]
    return timings, clocks


class _Placed:
    """A valid schedule's positions: the op at each, each op's, and each issued unit's issue and
    wait (:class:`.sim_tables.UnitTable`), computed once for the timeline and the memory curve."""

    def __init__(self, problem: ScheduleProblem, schedule: Schedule | None = None, *,
                 buckets: tuple[tuple[str, ...], ...] = (), at: np.ndarray | None = None):
        """Of ``schedule``, or (without one) of the order ``at`` (op index per position) and ``buckets``."""
        self.tables = tables = sim_tables(problem)
        if schedule is not None:
            self.at, self.pos = tables.positions(problem, schedule.order)
            buckets = schedule.buckets
        else:
            assert at is not None
            self.at, self.pos = at, np.empty(len(at), dtype=np.int64)
            self.pos[at] = np.arange(len(at), dtype=np.int64)
        self.units = tables.units(problem, buckets)
        self.issue, self.wait = self.units.positions(self.pos)


def _timeline(
    problem: ScheduleProblem, placed: _Placed, clocks: list[int] | None = None, timings: bool = True
) -> tuple[list[CollectiveTiming], int, int, int]:
    """Every issued collective's timing (none when not ``timings``), the makespan, the compute
    time and the exposed time (and, into ``clocks``, the compute-stream clock after each position).

    The compute clock is a running sum of op runtimes plus what the issues and waits add (copies,
    stalls): only those events are walked, in program order."""
    units = placed.units.units
    count = len(units)
    ran = np.cumsum(placed.tables.runtime[placed.at])  # compute and zero-cost ops' time through each position
    positions = np.concatenate([placed.issue, placed.wait])
    walk = np.argsort(positions, kind="stable")  # no two events share a position
    event_pos = positions[walk]
    added = np.zeros(len(placed.at), dtype=np.int64) if clocks is not None else None  # copies and stalls per position
    group_free: dict[str, int] = {}
    running: list[tuple[str, int, int]] = []  # (group, start, end) of every issued collective
    issued, starts, ends = [0] * count, [0] * count, [0] * count
    waited, stalls = [0] * count, [0] * count
    contention = problem.link_contention
    offset = copies = exposed = 0  # offset: copies and stalls so far, on top of ``ran``
    for i, e, base in zip(event_pos.tolist(), walk.tolist(), ran[event_pos].tolist()):
        t = base + offset
        if e < count:  # an issue
            u = units[e]
            copy = u.copy_in_ns
            t += copy
            step = copy
            start = max(t, group_free.get(u.group, 0))
            runtime = u.runtime_ns
            if contention and any(g != u.group and s0 <= start < e0 for g, s0, e0 in running):
                runtime = math.ceil(runtime * (1 + contention))
            end = start + runtime
            group_free[u.group] = end
            running.append((u.group, start, end))
            issued[e], starts[e], ends[e] = t, start, end
        else:  # a wait
            e -= count
            stall = max(0, ends[e] - t)
            exposed += stall
            copy = units[e].copy_out_ns
            step = stall + copy
            waited[e], stalls[e] = t, stall
        copies += copy
        offset += step
        if added is not None:
            added[i] += step
    if added is not None:
        clocks.extend((ran + np.cumsum(added)).tolist())
    out: list[CollectiveTiming] = []
    if timings:
        issue_pos, wait_pos = placed.issue.tolist(), placed.wait.tolist()
        for k in np.argsort(placed.issue, kind="stable").tolist():
            u = units[k]
            out.append(CollectiveTiming(
                members=u.members, group=u.group, issue_pos=issue_pos[k], wait_pos=wait_pos[k],
                issue_ns=issued[k], start_ns=starts[k], end_ns=ends[k], wait_ns=waited[k], exposed_ns=stalls[k],
                hideable=u.hideable,
            ))
    total = int(ran[-1]) if len(ran) else 0
    return out, total + offset, total + copies, exposed


def memory_curve(problem: ScheduleProblem, schedule: Schedule) -> tuple[int, list[int]]:
    """(initial memory, memory at each program position) for a valid schedule.

    A storage is live from the position that allocates it (-1: an input, live from the start)
    through its last use: its allocator's position, or for a collective's output its issue (a
    lone collective, a reduce_scatter/all_reduce bucket) or its bucket's wait (all_gather/
    all_to_all buckets copy out there); its last use, the last position that reads it, or for
    a collective's input its wait (alone) or its bucket's issue (the copy-in). A lone
    collective's outputs stay live until its wait; a bucket's flat buffers live from its issue
    to its wait; the outputs of a bucket that does not copy out are views of one buffer, freed
    together. Computed as array operations over :mod:`.sim_tables`."""
    return _memory(problem, _Placed(problem, schedule))


def _makespan(problem: ScheduleProblem, placed: _Placed) -> int:
    """:func:`_timeline`'s makespan alone: the same walk over issues and waits, keeping only what
    the makespan needs (the searches rank thousands of candidates by it). Links that contend
    need every running collective: that case takes the full walk."""
    if problem.link_contention:
        return _timeline(problem, placed, timings=False)[1]
    return _walk(problem, placed)[0]


def _walk(problem: ScheduleProblem, placed: _Placed) -> tuple[int, int]:
    """(makespan, hidden hideable units) of :func:`_makespan`'s walk (no link contention)."""
    ran = np.cumsum(placed.tables.runtime[placed.at])
    total = int(ran[-1]) if len(ran) else 0
    count = len(placed.units.units)
    positions = np.concatenate([placed.issue, placed.wait])
    walk = np.argsort(positions, kind="stable")
    copy_in, copy_out, runtime, group = placed.units.walk
    hideable = placed.units.hideable
    free, ends = [0] * placed.units.n_groups, [0] * count
    hidden = 0
    offset = 0  # copies and stalls so far
    for e, base in zip(walk.tolist(), ran[positions[walk]].tolist()):
        if e < count:  # an issue: its copy-in, then it starts once its group's stream is free
            offset += copy_in[e]
            t, g = base + offset, group[e]
            end = (t if t > free[g] else free[g]) + runtime[e]
            free[g] = ends[e] = end
        else:  # a wait: its stall, then its copy-out
            e -= count
            stall = ends[e] - base - offset
            if stall > 0:
                offset += stall
            elif hideable[e]:
                hidden += 1
            offset += copy_out[e]
    return total + offset, hidden


def _memory(problem: ScheduleProblem, placed: _Placed) -> tuple[int, list[int]]:
    """:func:`memory_curve` of a placed schedule."""
    tables, units, n = placed.tables, placed.units, len(placed.at)
    issue, wait = placed.issue, placed.wait
    use_at, out_at = placed.pos.copy(), placed.pos.copy()  # per op: the position its reads count at / its outputs appear
    use_at[units.single_ops] = wait[units.single_units]
    use_at[units.multi_ops] = issue[units.multi_owner]
    out_at[units.multi_ops] = np.where(units.multi_copies_out, wait[units.multi_owner], issue[units.multi_owner])
    last = np.full(len(tables.size), -2, dtype=np.int64)
    if len(tables.read):
        last[tables.read] = np.maximum.reduceat(use_at[tables.use_op], tables.read_starts)
    # a lone collective's outputs: live until its wait (each storage has one allocator)
    singles = units.single_storages
    last[singles] = np.maximum(last[singles], wait[units.single_storage_unit])
    alloc = np.where(tables.alloc_op >= 0, out_at[np.maximum(tables.alloc_op, 0)], -1)
    free = np.where(tables.never_freed, _NEVER, np.maximum(alloc, np.where(last == -2, alloc, last)))
    for group in units.merged:  # outputs of a bucket that does not copy out: freed together
        if len(group):
            free[group] = free[group].max()
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, np.maximum(alloc, 0), tables.size)
    freed = free != _NEVER
    np.add.at(delta, free[freed] + 1, -tables.size[freed])
    for k in units.multi_units:  # a bucket's flat buffers, from its issue to its wait
        u, a, f = units.units[k], int(issue[k]), int(wait[k])
        _add(delta, u.bytes_in, a, f)
        if u.copies_out:
            _add(delta, u.bytes_out, a, f)
    return tables.initial, np.cumsum(delta[:n]).tolist()


def _add(delta: np.ndarray, size: int, a: int, f: int) -> None:
    """Count ``size`` as live over positions a..f (a == -1: live from before the first op)."""
    delta[max(a, 0)] += size
    if f != _NEVER and f + 1 < len(delta):
        delta[f + 1] -= size
