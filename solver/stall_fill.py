"""What filling one stalled wait with compute moved in from later in the order would take.

A stall of ``s`` at a wait ``w`` goes away if ``s`` more compute runs before ``w``. With no wait
moved, that compute comes from later in the order, and every op between ``w`` and where it came
from then runs ``s`` earlier. A later wait that had ``slack`` (its collective ended that long before
the compute stream reached it) stalls unless at least ``s - slack`` of the moved compute came from
after it. The shift ends at the next stalled wait, whose own stall absorbs it. So each later wait
(before the next stall) whose slack is under ``s`` needs ``s - slack`` of the fill from beyond it,
and the whole ``s`` must come from beyond ``w`` itself. :func:`stall_fill` compares each need with
the compute beyond that point that depends on no wait at or after ``w`` (the most that could move in
front of ``w`` without moving a wait; memory not checked) and names the point where the need most
exceeds it.

On a comm-bound stretch, where each collective starts when the one before it in its group ends,
this is exact. A collective issued after ``w`` that started when it was issued would start earlier
too, and its wait would gain slack: then the need is an upper estimate (:attr:`StallFill.exact`).

This explains why a stall moves rather than disappears: on the 4-node FSDP backward's offline
answers the head's stall is several ms while every wait after it until the tail has under 1 ms of
slack (benchmarks/RESULTS.md). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .problem import OpKind, ScheduleProblem, bit_mask
from .simulator import CollectiveTiming, SimResult


@dataclass(frozen=True)
class StallFill:
    """What filling the stall of one exposed unit with compute from later in the order takes, at
    the later wait where it is hardest: the one whose need most exceeds what could move."""

    stall_ns: int
    tightest: tuple[str, ...] | None  # members of that later unit (None: the stalled wait's own need)
    tightest_slack_ns: int  # its slack (0 when ``tightest`` is None)
    need_ns: int  # compute that must come from after ``tightest``'s wait (after the stalled wait if None)
    movable_ns: int  # compute there that depends on no wait at or after the stalled one
    exact: bool  # False: a collective issued after the stalled wait started when issued (need over-estimated)

    @property
    def fillable(self) -> bool:
        """Whether enough compute is there to move, memory aside (necessary, not sufficient)."""
        return self.movable_ns >= self.need_ns


def stall_fill(problem: ScheduleProblem, sim: SimResult, order: Sequence[str],
               unit: CollectiveTiming) -> StallFill | None:
    """:class:`StallFill` of ``unit`` (one of ``sim.collectives``, the result of ``order``), or
    None when its wait does not stall (see the module doc). The whole stall from after its own wait,
    and ``stall - slack`` from after every later hidden wait up to the next stall whose slack is
    under the stall, are the constraints; the one returned has the largest need less movable
    compute (the own wait's: ``tightest`` None)."""
    return stall_fills(problem, sim, order)[sim.collectives.index(unit)]


def stall_fills(problem: ScheduleProblem, sim: SimResult, order: Sequence[str]) -> list[StallFill | None]:
    """:func:`stall_fill` of every unit of ``sim.collectives``, in that order: the arrays are built
    once, the waits that block a move are added as the stalled waits are taken from last to first,
    and each walk stops at the next stall, so every hidden wait is walked once."""
    idx = problem.index
    at = np.fromiter((idx[name] for name in order), dtype=np.int64, count=len(order))
    rt = np.array([op.runtime_ns if op.kind is OpKind.COMPUTE else 0 for op in problem.ops], dtype=np.int64)[at]
    by_wait = sorted(range(len(sim.collectives)), key=lambda k: sim.collectives[k].wait_pos)
    units = [sim.collectives[k] for k in by_wait]
    out: list[StallFill | None] = [None] * len(sim.collectives)
    blocked, added = 0, len(by_wait)  # waits of by_wait[added:] are in ``blocked``
    for r in range(len(by_wait) - 1, -1, -1):
        unit = units[r]
        if unit.exposed_ns == 0:
            continue
        while added > 0 and units[added - 1].wait_pos >= unit.wait_pos:
            added -= 1
            for m in units[added].members:
                blocked |= problem.descendants[idx[problem.wait_of[m]]]
        own = np.where(bit_mask(blocked, len(problem.ops))[at], 0, rt)
        after = np.append(np.cumsum(own[::-1])[::-1][1:], 0)  # compute movable after each position
        out[by_wait[r]] = _fill(unit, itertools.islice(units, r + 1, None), after)
    return out


def _fill(unit: CollectiveTiming, later: Iterable[CollectiveTiming], after: np.ndarray) -> StallFill:
    """The constraint of ``unit``'s stall with the largest need less movable compute, walking
    ``later`` (units by wait position) up to the next stall; ``after``: movable compute after
    each position."""
    s, p = unit.exposed_ns, unit.wait_pos
    best = StallFill(s, None, 0, s, int(after[p]), True)
    exact = True
    for c in later:
        if c.exposed_ns:  # the next stall absorbs the shift
            break
        if c.issue_pos > p and c.start_ns == c.issue_ns and c.runtime_ns:
            exact = False  # released by compute: it would start earlier as well
        slack = c.wait_ns - c.end_ns
        if slack < s:
            cand = StallFill(s, c.members, slack, s - slack, int(after[c.wait_pos]), True)
            if cand.need_ns - cand.movable_ns > best.need_ns - best.movable_ns:
                best = cand
    return dataclasses.replace(best, exact=exact)
