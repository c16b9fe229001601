"""Stall filling: pull ready compute forward into the time a wait would stall (free order).

Entry point: :func:`fill_stalls`. Walking a schedule on the execution model's clocks, a wait
whose collective has not finished stalls the compute stream. Later compute whose inputs
already exist may run there instead (tensor parallelism's weight gradients of the block just
finished, under the next activation-gradient collective, say). Ops are pulled in their
program order. Without ``overshoot`` only ops that fit the stall that is left are pulled, so
nothing after the wait starts later than before and what they feed can only start earlier;
with it, the last op pulled may outlast the stall. The result is valid by construction: an
op is pulled only when every dependency is already placed.

The walk's clocks are its own estimate (bucket copies priced by the simulator's
``copy_in_ns``/``copy_out_ns``, link contention ignored); each pass is scored by the simulator
and kept only if the makespan drops and the peak memory stays within the budget. A pass that breaks the budget
is retried with no fills before the first position over budget. This reorders heavy compute:
the result is a free-order schedule.
"""

from __future__ import annotations

import itertools
import logging
import time

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, placements
from ..solver.simulator import copy_in_ns, copy_out_ns, simulate
from .overlap import original_peak

log = logging.getLogger(__name__)


def _walk(problem: ScheduleProblem, sched: Schedule, no_fill_before: int, window: int,
          overshoot: bool) -> tuple[Schedule, int]:
    """One pass: the new schedule and how many ops were pulled."""
    order = sched.order
    ops = problem.op_by_name
    places = placements(problem, sched)
    issue_at = {p.issue_pos: p for p in places}
    wait_at = {p.wait_pos: p for p in places}
    emitted: set[str] = set()
    out: list[str] = []
    group_free: dict[str, int] = {}
    end_of: dict[tuple[str, ...], int] = {}
    t = pulled = 0
    for i, name in enumerate(order):
        if name in emitted:
            continue
        op = ops[name]
        if op.kind in (OpKind.COMPUTE, OpKind.ZERO):
            t += op.runtime_ns
        elif i in issue_at:  # a bucket is issued at its last member's position
            p = issue_at[i]
            t += copy_in_ns(problem, p.members)
            group = op.collective.group  # type: ignore[union-attr]
            start = max(t, group_free.get(group, 0))
            group_free[group] = end_of[p.members] = start + problem.bucket_runtime_ns(p.members)
        elif i in wait_at:  # and waited at its first member's wait
            p = wait_at[i]
            stall = end_of[p.members] - t
            if stall > 0 and len(out) >= no_fill_before:
                for j in range(i + 1, min(len(order), i + window)):
                    cand = order[j]
                    c = ops[cand]
                    if (cand in emitted or c.kind is not OpKind.COMPUTE or (c.runtime_ns > stall and not overshoot)
                            or any(d not in emitted for d in c.deps)):
                        continue
                    emitted.add(cand)
                    out.append(cand)
                    t += c.runtime_ns
                    stall -= c.runtime_ns
                    pulled += 1
                    if stall <= 0:
                        break
            t += max(0, stall) + copy_out_ns(problem, p.members)
        emitted.add(name)
        out.append(name)
    return Schedule(order=tuple(out), buckets=sched.buckets, multi_dtype=sched.multi_dtype), pulled


def fill_stalls(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                window: int = 400, passes: int = 4, deadline: float | None = None) -> Schedule:
    """Improve ``schedule`` by pulling ready compute into stalls (see module doc).

    ``window``: how many later positions a stall looks at; ``passes``: walks over the improved
    schedule (each fill moves the stalls after it), alternating without and with overshoot.
    The memory budget defaults to the original order's peak. ``deadline`` (a
    ``time.perf_counter()`` value; None: none) stops before a pass that would start after it.
    """
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    best, res = schedule, simulate(problem, schedule)
    failed = 0
    for _, overshoot in zip(range(passes), itertools.cycle((False, True))):
        if deadline is not None and time.perf_counter() > deadline:
            break
        no_fill_before, improved = 0, False
        for _retry in range(8):
            cand, pulled = _walk(problem, best, no_fill_before, window, overshoot)
            if not pulled:
                break
            r = simulate(problem, cand)
            if r.peak_memory_bytes <= budget:
                if r.makespan_ns < res.makespan_ns:
                    best, res, improved = cand, r, True
                break
            over = next(k for k, m in enumerate(r.memory_curve) if m > budget)
            no_fill_before = max(no_fill_before + 1, over + 1)
        failed = 0 if improved else failed + 1
        if failed == 2:  # neither variant helps any more
            break
        log.debug("fill_stalls %s: makespan %d ns", problem.name, res.makespan_ns)
    return best
