"""Bucket shifts: move collectives between neighbouring buckets of one key on a group's stream.

Entry point: :func:`shift_bucket_members`. The greedy bucketer (bucketing.py) draws every bucket
boundary once, from a size cap and the memory headroom where the bucket starts. Where the
communication stream is the bottleneck (the 4-node backward: its one group's stream is busy
from 0.5 ms to the end) the boundaries decide the makespan: a larger bucket costs less per
byte (the cost curve is concave), but holds its buffers longer and is issued only once its last
member is ready. Here each unit (a bucket or a lone collective) trades members with the next
unit of the same group and bucket key in issue order, either way: the member of one with the
earliest or the latest wait moves into the other, or all of it merges into the other.

A moved collective goes to just before the destination's issue (its last member), and its wait,
when that would come first, to just after the destination's wait. A candidate that breaks the
execution model (a gradient not yet computed where an earlier bucket is issued, a user of the
result before its moved wait, members that depend on each other) is dropped by
:func:`..solver.schedule.check_schedule`; the simulator scores the rest. Each sweep tries every
pair and keeps the best move that shortens the makespan by more than ``min_gain_ns`` within the
memory budget; the search starts again from it. On the 4-node backward it shortened a 60 s
solve's answer from 174.0 to 168.2 ms in 2.7 s.

Nothing here imports torch or ortools.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ..solver.cpsat_frame import bucket_size_bytes
from ..solver.problem import ScheduleProblem
from ..solver.schedule import BucketPlacement, Schedule, check_schedule, placements
from ..solver.simulator import simulate
from .bucketing import bucketable
from .overlap import original_peak

log = logging.getLogger(__name__)


def shift_bucket_members(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                         max_moves: int = 64, max_evals: int | None = None, cap_bytes: int | None = None,
                         deadline: float | None = None, min_gain_ns: int = 0) -> Schedule:
    """Improve ``schedule``'s bucket boundaries by moving collectives between neighbouring units
    of one key (see module doc). At most ``max_moves`` moves are kept, each shortening the makespan
    by more than ``min_gain_ns`` with the peak within ``budget_bytes`` (default: the original
    order's peak); no bucket grows past ``cap_bytes`` (None: no cap). ``max_evals`` (None: no
    limit) bounds the candidates simulated in all, a bound on the work that does not depend on the
    machine; ``deadline`` (a ``time.perf_counter()`` value) stops the search early."""
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    best, res = schedule, simulate(problem, schedule)
    evals = 0
    for _ in range(max_moves):
        found = None
        for cand in _candidates(problem, best, cap_bytes):
            if (max_evals is not None and evals >= max_evals) or (deadline is not None and time.perf_counter() > deadline):
                break
            if check_schedule(problem, cand):
                continue
            evals += 1
            r = simulate(problem, cand, check=False)
            limit = res.makespan_ns - min_gain_ns if found is None else found[1].makespan_ns
            if r.peak_memory_bytes <= max(budget, res.peak_memory_bytes) and r.makespan_ns < limit:
                found = (cand, r)
        if found is None:
            break
        best, res = found
        log.debug("shift_bucket_members %s: makespan %d ns, %d buckets", problem.name, res.makespan_ns,
                  len(best.buckets))
    return best


def _candidates(problem: ScheduleProblem, sched: Schedule, cap_bytes: int | None) -> Iterator[Schedule]:
    """Every move between neighbouring units of one key (one member, half or all of a unit), and
    every split of a bucket (:func:`_splits`)."""
    ops = problem.op_by_name
    pos = {name: i for i, name in enumerate(sched.order)}
    by_key: dict[tuple, list[BucketPlacement]] = {}
    for pl in placements(problem, sched):
        if all(bucketable(problem, m) for m in pl.members):
            info = ops[pl.members[0]].collective
            assert info is not None
            by_key.setdefault((info.group, info.bucket_key(sched.multi_dtype)), []).append(pl)
    for units in by_key.values():
        for a, b in zip(units, units[1:]):
            for src, dst in ((a, b), (b, a)):
                by_wait = _by_wait(problem, src, pos)
                half = len(by_wait) // 2
                parts = [by_wait[:1], by_wait[-1:], by_wait[:half], by_wait[half:]] if len(by_wait) > 1 else []
                for moving in dict.fromkeys(tuple(x) for x in (*parts, by_wait) if x):
                    if cap_bytes is not None and bucket_size_bytes(problem, (*dst.members, *moving)) > cap_bytes:
                        continue
                    yield _moved(problem, sched, src, dst, moving)
        for u in units:
            if len(u.members) >= 2:
                yield from _splits(problem, sched, u, pos)


def _splits(problem: ScheduleProblem, sched: Schedule, unit: BucketPlacement, pos: dict[str, int]) -> Iterator[Schedule]:
    """``unit`` split in two: by issue position (the first part may start sooner), and with its
    first-waited member, or half, issued ahead of the rest (a gather needed early need not wait
    for the whole bucket)."""
    buckets = [b for b in sched.buckets if set(b) != set(unit.members)]
    by_pos = sorted(unit.members, key=pos.__getitem__)
    half = len(by_pos) // 2
    if half >= 2:
        yield Schedule(sched.order, (*buckets, tuple(by_pos[:half]), tuple(by_pos[half:])), sched.multi_dtype)
    by_wait = _by_wait(problem, unit, pos)
    for k in dict.fromkeys((1, half)):
        ahead, rest = by_wait[:k], by_wait[k:]
        if not ahead or not rest:
            continue
        going = set(ahead)
        order = [o for o in sched.order if o not in going]
        i = order.index(next(m for m in by_pos if m not in going))  # the rest's first member
        order[i:i] = [o for o in sched.order if o in going]
        yield Schedule(tuple(order), (*buckets, *(tuple(x) for x in (ahead, rest) if len(x) >= 2)), sched.multi_dtype)


def _by_wait(problem: ScheduleProblem, unit: BucketPlacement, pos: dict[str, int]) -> list[str]:
    """``unit``'s members in the order of their waits."""
    return sorted(unit.members, key=lambda m: pos[problem.wait_of[m]])


def _moved(problem: ScheduleProblem, sched: Schedule, src: BucketPlacement, dst: BucketPlacement,
           moving: tuple[str, ...]) -> Schedule:
    """``sched`` with ``moving`` (members of ``src``) joined to ``dst`` (see module doc)."""
    issue_op, wait_op = sched.order[dst.issue_pos], sched.order[dst.wait_pos]
    going = set(moving)
    waits = {problem.wait_of[m] for m in moving}
    rest = [o for o in sched.order if o not in going]
    i = rest.index(issue_op)
    order = rest[:i] + [o for o in sched.order if o in going] + rest[i:]
    early = [o for o in order[:i + len(moving)] if o in waits]  # would come before the new issue
    if early:
        order = [o for o in order if o not in waits]
        j = order.index(wait_op) + 1
        order[j:j] = early
    left = tuple(m for m in src.members if m not in going)
    buckets = [b for b in sched.buckets if set(b) not in (set(src.members), set(dst.members))]
    buckets.append((*dst.members, *moving))
    if len(left) >= 2:
        buckets.append(left)
    return Schedule(tuple(order), tuple(buckets), sched.multi_dtype)
