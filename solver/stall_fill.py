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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .problem import OpKind, ScheduleProblem
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
    if unit.exposed_ns == 0:
        return None
    s, p = unit.exposed_ns, unit.wait_pos
    after = _movable_after(problem, sim, order, p)
    best = StallFill(s, None, 0, s, int(after[p]), True)
    exact = True
    for c in sorted((c for c in sim.collectives if c.wait_pos > p), key=lambda c: c.wait_pos):
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


def _movable_after(problem: ScheduleProblem, sim: SimResult, order: Sequence[str], p: int) -> np.ndarray:
    """Per position ``q``: runtime of the compute ops after ``q`` that descend from no wait at or
    after ``p`` (the most that could move in front of ``p``'s wait without moving a wait)."""
    idx, n = problem.index, len(problem.ops)
    blocked = 0
    for c in sim.collectives:
        if c.wait_pos >= p:
            for m in c.members:
                blocked |= problem.descendants[idx[problem.wait_of[m]]]
    bits = np.unpackbits(np.frombuffer(blocked.to_bytes((n + 7) // 8, "little"), dtype=np.uint8),
                         bitorder="little")[:n]
    at = np.fromiter((idx[name] for name in order), dtype=np.int64, count=len(order))
    rt = np.array([op.runtime_ns if op.kind is OpKind.COMPUTE else 0 for op in problem.ops], dtype=np.int64)
    own = np.where(bits[at] == 1, 0, rt[at])
    after = np.zeros(len(order) + 1, dtype=np.int64)
    after[:-1] = np.cumsum(own[::-1])[::-1]  # from q onwards
    return np.append(after[1:], 0)  # after q: positions q + 1 onwards
