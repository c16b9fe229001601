"""Wait sinking: move a stalled wait, with the comm-only ops hanging off it, to where compute needs it.

Entry point: :func:`sink_stalled_waits`. A list scheduler places a wait before its first
consumer, but that consumer is sometimes another collective (FSDP's reduce-scatter of a norm
weight feeding tensor parallelism's all-reduce, say) whose own wait is only needed at the end.
The wait then stalls the compute stream behind its group's backlog for nothing. Moving the
wait, and every op after it that depends on it, up to the first positive-cost compute that
depends on it, is valid in both compute modes:

* ops that stay do not depend on a moved one, and moved ops keep their relative order and come
  after everything that stays, so every dependency still points backwards;
* no positive-cost compute moves, so the heavy-compute order is unchanged (fixed mode holds).

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


def _sunk(problem: ScheduleProblem, sched: Schedule, wait_pos: int) -> Schedule | None:
    """``sched`` with the wait at ``wait_pos`` and its dependents moved to just before the first
    positive-cost compute that depends on it; None when nothing would move or a bucket breaks."""
    order = sched.order
    ops, index = problem.ops, problem.index
    moved_bits = 1 << index[order[wait_pos]]
    moved, kept = [order[wait_pos]], []
    stop = len(order)
    for p in range(wait_pos + 1, len(order)):
        i = index[order[p]]
        if not problem.ancestors[i] & moved_bits:
            kept.append(order[p])
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


def sink_stalled_waits(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                       max_moves: int = 64, deadline: float | None = None) -> Schedule:
    """Improve ``schedule`` by sinking waits that stall (see module doc), most exposed first.

    Each round tries every stalled wait, in order of its stall, and keeps the first move that
    lowers the makespan within the memory budget (default: the original order's peak); at most
    ``max_moves`` moves are kept. ``deadline`` (a ``time.perf_counter()`` value; None: none)
    stops the search early.
    """
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    best: Schedule = schedule
    res: SimResult = simulate(problem, schedule)
    for _ in range(max_moves):
        found = None
        stalled = sorted((t for t in res.collectives if t.exposed_ns > 0), key=lambda t: -t.exposed_ns)
        for t in stalled:
            if deadline is not None and time.perf_counter() > deadline:
                return best
            cand = _sunk(problem, best, t.wait_pos)
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
