"""The execution model walked op by op, position by position: the oracle that the simulator's
array form (solver/simulator.py over solver/sim_tables.py) is checked against.

This is the simulator as it was written first, straight from DESIGN.md's rules: one pass over
the program order advancing the compute clock op by op, and one pass over the storages with
per-storage allocation and last-use positions. It is kept here, not in the library, so that
one simulator scores every schedule; tests compare the two on random problems
(test_sim_tables.py).
"""

from __future__ import annotations

import math

from fxsched.solver.problem import OpKind, ScheduleProblem
from fxsched.solver.schedule import Schedule, placements
from fxsched.solver.simulator import CollectiveTiming, copy_in_ns, copy_out_ns

NEVER = 1 << 62


def _hideable(problem: ScheduleProblem, members: tuple[str, ...]) -> bool:
    related = 0
    for m in members:
        i = problem.index[m]
        related |= problem.ancestors[i] | problem.descendants[i] | (1 << i)
    return bool(problem.timed_compute_mask & ~related)


def timeline(problem: ScheduleProblem, schedule: Schedule) -> tuple[list[CollectiveTiming], int, int, int, list[int]]:
    """(timings by issue position, makespan, compute, exposed, clock after each position)."""
    ops = problem.op_by_name
    places = placements(problem, schedule)
    issue_at = {p.issue_pos: p for p in places}
    wait_at = {p.wait_pos: p for p in places}
    group_free: dict[str, int] = {}
    running: list[tuple[str, int, int]] = []
    started: dict[tuple[str, ...], tuple[int, int, int]] = {}
    timings: list[CollectiveTiming] = []
    clocks: list[int] = []
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
            if problem.link_contention and any(g != group and s0 <= start < e0 for g, s0, e0 in running):
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
            copy = copy_out_ns(problem, p.members)
            t += copy
            compute += copy
            timings.append(CollectiveTiming(
                members=p.members, group=first.group, issue_pos=p.issue_pos, wait_pos=p.wait_pos,  # type: ignore[union-attr]
                issue_ns=issue_ns, start_ns=start, end_ns=end, wait_ns=wait_ns, exposed_ns=stall,
                hideable=_hideable(problem, p.members),
            ))
        clocks.append(t)
    timings.sort(key=lambda c: c.issue_pos)
    return timings, t, compute, exposed, clocks


def memory(problem: ScheduleProblem, schedule: Schedule) -> tuple[int, list[int]]:
    """(initial memory, memory at each program position)."""
    places = placements(problem, schedule)
    ops = problem.op_by_name
    n = len(schedule.order)
    place_of = {m: p for p in places for m in p.members}
    alloc: dict[str, int] = {s.name: -1 for s in problem.storages if s.is_input}
    last_use: dict[str, int] = {}
    extra: list[tuple[int, int, int]] = []
    merged_outputs: list[list[str]] = []
    for i, name in enumerate(schedule.order):
        op = ops[name]
        use_at = i
        if op.kind is OpKind.COLLECTIVE:
            p = place_of[name]
            info = op.collective
            if len(p.members) == 1:
                use_at = p.wait_pos
                out_at = i
                for s in op.allocates:
                    last_use[s] = max(last_use.get(s, -2), p.wait_pos)
            else:
                use_at = p.issue_pos
                out_at = p.wait_pos if info.kind.bucket_copies_out else p.issue_pos  # type: ignore[union-attr]
            for s in op.allocates:
                alloc[s] = out_at
        else:
            for s in op.allocates:
                alloc[s] = i
        for s in op.uses:
            last_use[s] = max(last_use.get(s, -2), use_at)
    for p in places:
        if len(p.members) == 1:
            continue
        infos = [ops[m].collective for m in p.members]
        extra.append((sum(c.bytes_in for c in infos), p.issue_pos, p.wait_pos))  # type: ignore[union-attr]
        if infos[0].kind.bucket_copies_out:  # type: ignore[union-attr]
            extra.append((sum(c.bytes_out for c in infos), p.issue_pos, p.wait_pos))  # type: ignore[union-attr]
        else:
            merged_outputs.append([s for m in p.members for s in ops[m].allocates])
    free = {s.name: NEVER if s.never_freed else max(alloc[s.name], last_use.get(s.name, alloc[s.name]))
            for s in problem.storages}
    for names in merged_outputs:
        if names:
            f = max(free[s] for s in names)
            for s in names:
                free[s] = f
    delta = [0] * (n + 1)
    intervals = [(s.size_bytes, alloc[s.name], free[s.name]) for s in problem.storages] + extra
    for size, a, f in intervals:
        delta[max(a, 0)] += size
        if f != NEVER:
            delta[f + 1] -= size
    initial = sum(s.size_bytes for s in problem.storages if s.is_input)
    curve, cur = [], 0
    for i in range(n):
        cur += delta[i]
        curve.append(cur)
    return initial, curve
