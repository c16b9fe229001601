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

from .problem import OpKind, ScheduleProblem
from .schedule import BucketPlacement, Schedule, ScheduleError, check_schedule, placements

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
        peak_memory_bytes=max([initial, *curve]),
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
    ops = problem.op_by_name
    hide = _Hideability(problem)
    issue_at = {p.issue_pos: p for p in places}
    wait_at = {p.wait_pos: p for p in places}
    group_free: dict[str, int] = {}
    running: list[tuple[str, int, int]] = []  # (group, start, end) of every issued collective
    started: dict[tuple[str, ...], tuple[int, int, int]] = {}
    timings: list[CollectiveTiming] = []
    t = compute = exposed = 0
    for i, name in enumerate(schedule.order):
        op = ops[name]
        if op.kind in (OpKind.COMPUTE, OpKind.ZERO):
            t += op.runtime_ns
            compute += op.runtime_ns
        elif i in issue_at:
            p = issue_at[i]
            copy = copy_in_ns(problem, p.members)
            t += copy
            compute += copy
            group = op.collective.group  # type: ignore[union-attr]
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
        elif i in wait_at:
            p = wait_at[i]
            issue_ns, start, end = started[p.members]
            stall = max(0, end - t)
            wait_ns = t
            t += stall
            exposed += stall
            first = ops[p.members[0]].collective
            assert first is not None
            copy = copy_out_ns(problem, p.members)
            t += copy
            compute += copy
            timings.append(CollectiveTiming(
                members=p.members, group=first.group, issue_pos=p.issue_pos, wait_pos=p.wait_pos,
                issue_ns=issue_ns, start_ns=start, end_ns=end, wait_ns=wait_ns, exposed_ns=stall,
                hideable=hide(p.members),
            ))
        if clocks is not None:
            clocks.append(t)
    timings.sort(key=lambda c: c.issue_pos)
    return timings, t, compute, exposed


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
    """(initial memory, memory at each program position) for a valid schedule."""
    places = placements(problem, schedule) if places is None else places
    ops = problem.op_by_name
    n = len(schedule.order)
    pos = {name: i for i, name in enumerate(schedule.order)}
    place_of = {m: p for p in places for m in p.members}
    alloc: dict[str, int] = {s.name: -1 for s in problem.storages if s.is_input}
    last_use: dict[str, int] = {}
    extra: list[tuple[int, int, int]] = []  # (size, alloc_pos, free_pos) of bucket buffers
    merged_outputs: list[list[str]] = []

    for name, i in pos.items():
        op = ops[name]
        use_at = i
        if op.kind is OpKind.COLLECTIVE:
            p = place_of[name]
            info = op.collective
            assert info is not None
            if len(p.members) == 1:
                use_at = p.wait_pos  # inputs stay live until the wait
                out_at = i
                for s in op.allocates:  # the comm stream writes its outputs until the wait
                    last_use[s] = max(last_use.get(s, -2), p.wait_pos)
            else:
                use_at = p.issue_pos  # the copy-in reads them
                out_at = p.wait_pos if info.kind.bucket_copies_out else p.issue_pos
            for s in op.allocates:
                alloc[s] = out_at
        else:
            for s in op.allocates:
                alloc[s] = i
        for s in op.uses:
            if last_use.get(s, -2) < use_at:
                last_use[s] = use_at

    for p in places:
        if len(p.members) == 1:
            continue
        infos = [ops[m].collective for m in p.members]
        extra.append((sum(c.bytes_in for c in infos), p.issue_pos, p.wait_pos))  # type: ignore[union-attr]
        if infos[0].kind.bucket_copies_out:  # type: ignore[union-attr]
            extra.append((sum(c.bytes_out for c in infos), p.issue_pos, p.wait_pos))  # type: ignore[union-attr]
        else:  # member outputs are views of one flat buffer: freed together
            merged_outputs.append([s for m in p.members for s in ops[m].allocates])

    free: dict[str, int] = {}
    for s in problem.storages:
        a = alloc[s.name]
        free[s.name] = _NEVER if s.never_freed else max(a, last_use.get(s.name, a))
    for names in merged_outputs:
        if not names:
            continue
        f = max(free[s] for s in names)
        for s in names:
            free[s] = f

    delta = [0] * (n + 1)
    initial = 0
    for s in problem.storages:
        _add(delta, s.size_bytes, alloc[s.name], free[s.name])
        if s.is_input:
            initial += s.size_bytes
    for size, a, f in extra:
        _add(delta, size, a, f)
    curve, cur = [], 0
    for i in range(n):
        cur += delta[i]
        curve.append(cur)
    return initial, curve


def _add(delta: list[int], size: int, a: int, f: int) -> None:
    """Count ``size`` as live over positions a..f (a == -1: live from before the first op)."""
    delta[max(a, 0)] += size
    if f != _NEVER and f + 1 < len(delta):
        delta[f + 1] -= size
