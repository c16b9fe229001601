"""Wait sinking: move a stalled wait, with the comm-only ops after it, to where compute needs it;
and issue a collective that holds a stalled one up in its FIFO after it.

Entry point: :func:`sink_stalled_waits`. A list scheduler places a wait before its first
consumer, but that consumer is sometimes another collective (FSDP's reduce-scatter of a norm
weight feeding tensor parallelism's all-reduce, say) whose own wait is only needed at the end.
The wait then stalls the compute stream behind its group's backlog for nothing. Moving the
wait, and every op after it that depends on it, up to the first positive-cost compute that
depends on it, is valid in both compute modes:

* ops that stay do not depend on a moved one, and moved ops keep their relative order and come
  after everything that stays, so every dependency still points backwards;
* no positive-cost compute moves, so the heavy-compute order is unchanged (fixed mode holds).

The same pass also reorders a group's FIFO: a lone collective that makes a stalled one wait
behind it (a long gradient reduction ahead of tensor parallelism's next gather, say) is issued
after it, or after one of the group's next few collectives issued before its own wait. Nothing
in between depends on it, so that move is valid in both modes too.

Each move is scored by the simulator and kept only if the makespan drops and the peak memory
stays within the budget (later waits keep buffers alive longer).
"""

from __future__ import annotations

import logging
import time

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.simulator import SimResult, makespan_ns, simulate
from .overlap import original_peak

log = logging.getLogger(__name__)


def sunk(problem: ScheduleProblem, sched: Schedule, wait_pos: int, cover_ns: int | None = None) -> Schedule | None:
    """``sched`` with the wait at ``wait_pos`` and its dependents moved to just before the first
    positive-cost compute that depends on it, or with ``cover_ns``, to just after the first
    compute passed that lasts ``cover_ns`` in all, if that comes first (a stall covered, without
    holding up what the wait feeds any longer); None when nothing would move or a bucket breaks."""
    order = sched.order
    ops, index = problem.ops, problem.index
    moved_bits = 1 << index[order[wait_pos]]
    moved, kept = [order[wait_pos]], []
    stop, passed = len(order), 0
    for p in range(wait_pos + 1, len(order)):
        i = index[order[p]]
        if cover_ns is not None and passed >= cover_ns:
            stop = p
            break
        if not problem.ancestors[i] & moved_bits:
            kept.append(order[p])
            passed += ops[i].runtime_ns if ops[i].kind is OpKind.COMPUTE else 0
            continue
        if ops[i].kind is OpKind.COMPUTE and ops[i].runtime_ns > 0:
            stop = p
            break
        moved.append(order[p])
        moved_bits |= 1 << i
    if not kept:
        return None
    new = Schedule(order=order[:wait_pos] + tuple(kept) + tuple(moved) + order[stop:],
                   buckets=sched.buckets, multi_dtype=sched.multi_dtype)
    if sched.buckets and check_schedule(problem, new):
        return None  # moved a bucket member's issue past another member's wait
    return new


def _issued_later(problem: ScheduleProblem, sched: Schedule, blocker_pos: int, after_pos: int) -> Schedule | None:
    """``sched`` with the collective issued at ``blocker_pos`` issued right after ``after_pos``
    instead; None when something in between depends on it or a bucket breaks."""
    order = sched.order
    bit = 1 << problem.index[order[blocker_pos]]
    if any(problem.ancestors[problem.index[order[p]]] & bit for p in range(blocker_pos + 1, after_pos + 1)):
        return None
    new = Schedule(order=order[:blocker_pos] + order[blocker_pos + 1:after_pos + 1] + (order[blocker_pos],)
                   + order[after_pos + 1:], buckets=sched.buckets, multi_dtype=sched.multi_dtype)
    if sched.buckets and check_schedule(problem, new):
        return None
    return new


def _candidates(problem: ScheduleProblem, sched: Schedule, res: SimResult, later_slots: int = 6):
    """Moves for each stalled collective, most exposed first: its wait sunk, and the lone
    collective ahead of it in its group's FIFO (when it made it wait) issued after it, or after
    one of the next ``later_slots - 1`` of the group (a long gradient reduction is best issued
    where the group has the most time before its next collective is needed)."""
    by_group: dict[str, list] = {}
    for t in res.collectives:  # in issue order
        by_group.setdefault(t.group, []).append(t)
    rank = {t.members: (ts, k) for ts in by_group.values() for k, t in enumerate(ts)}
    for t in sorted((t for t in res.collectives if t.exposed_ns > 0), key=lambda t: -t.exposed_ns):
        yield lambda t=t: sunk(problem, sched, t.wait_pos)
        ts, k = rank[t.members]
        prev = ts[k - 1] if k else None
        if t.fifo_delay_ns > 0 and prev is not None and len(prev.members) == 1:
            # behind this one, or behind one of the next few issued before the blocker's wait
            for nxt in ts[k:k + later_slots]:
                if nxt.issue_pos < prev.wait_pos:
                    yield lambda prev=prev, nxt=nxt: _issued_later(problem, sched, prev.issue_pos, nxt.issue_pos)


def sink_stalled_waits(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                       max_moves: int = 64, deadline: float | None = None) -> Schedule:
    """Improve ``schedule`` by sinking waits that stall (see module doc), most exposed first, and by
    issuing a lone collective that holds a stalled one up in its group's FIFO after it.

    Each round tries every stalled collective, in order of its stall, and keeps the first move that
    lowers the makespan within the memory budget (default: the original order's peak); at most
    ``max_moves`` moves are kept. ``deadline`` (a ``time.perf_counter()`` value; None: none)
    stops the search early.
    """
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    best: Schedule = schedule
    res: SimResult = simulate(problem, schedule)
    for _ in range(max_moves):
        found = None
        for move in _candidates(problem, best, res):
            if deadline is not None and time.perf_counter() > deadline:
                return best
            cand = move()
            if cand is None or makespan_ns(problem, cand) >= res.makespan_ns:
                continue
            r = simulate(problem, cand)
            if r.peak_memory_bytes <= budget:
                found = (cand, r)
                break
        if found is None:
            break
        best, res = found
        log.debug("sink_stalled_waits %s: makespan %d ns", problem.name, res.makespan_ns)
    return best
