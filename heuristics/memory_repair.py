"""Local memory repair: fix an over-budget overlap schedule collective by collective.

Entry point: :func:`repair_memory`. The overlap scheduler's aggressive rungs often exceed the
memory budget at only a few program positions (in backward, right at the start, where the loss
gradient's temporaries meet the first prefetched gathers), so discarding the whole rung throws
away the overlap everywhere else. The repair instead takes the rung's slots (fixed heavy-compute
order, :mod:`.placement`) and, while the simulated peak exceeds the budget, moves one collective
(or bucket) back toward its original placement or toward its need:

* **wait earlier**: just before the first over-budget position it spans, or at its original
  slot. A collective's input stays live until its wait (DESIGN.md, "Execution model"), so this
  frees inputs that die with the collective (reduce_scatter gradients, cast staging buffers);
* **issue later**: just after the last over-budget position its buffers span (never past its
  need), or at its original slot, or both back at their original slots. A collective's output is
  allocated at issue and its chain's outputs just before, so a later issue keeps those buffers
  out of the over-budget positions (prefetched all_gathers).

Only collectives whose buffers are live at an over-budget position are candidates. Each round
simulates the few moves that promise to free the most bytes there, and applies the one with the
smallest makespan increase per byte of excess actually freed (bytes over the budget, summed over
positions); once the schedule fits, moves made redundant by later ones are undone where that is
faster. The number of simulator calls is capped (a few dozen, ~10-20 ms each on 2,400-op graphs).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.simulator import SimResult, simulate
from .placement import Placement, assemble

log = logging.getLogger(__name__)

DEFAULT_MAX_SIMULATIONS = 48
UNDO_SIMULATIONS = 16  # extra simulator calls for the undo pass once a repair fits
MOVES_PER_ROUND = 4  # moves simulated per round, the most promising first
_GIVE_UP_FACTOR = 3  # give up when, at the excess freed per move so far, even 3x the simulations left fall short


_Trial = tuple[dict[str, int], dict[str, int], Schedule, SimResult]  # issue, wait, schedule, simulation


@dataclass(frozen=True)
class _Unit:
    """A collective or a bucket: its members move together."""

    members: tuple[str, ...]
    earliest: int
    need: int
    orig_issue: int
    orig_wait: int
    storages: tuple[str, ...]  # what its chain ops and members allocate
    issue_bytes: int  # freeable bytes of those: kept out of the positions before its issue (ranking)
    wait_bytes: int  # freeable bytes its members read: they may die at its wait (for ranking only)


@dataclass(frozen=True)
class MemoryRepair:
    """What :func:`repair_memory` reached: its last schedule and simulation, whether that fits
    the budget, and what it took."""

    schedule: Schedule
    result: SimResult
    fits: bool
    moves: int
    simulations: int


def repair_memory(
    placement: Placement,
    issue: Mapping[str, int],
    wait: Mapping[str, int],
    budget: int,
    buckets: Sequence[Sequence[str]] = (),
    multi_dtype: bool = False,
    priority: Mapping[str, int] | None = None,
    issue_after: Mapping[str, Sequence[str]] | None = None,
    *,
    max_simulations: int = DEFAULT_MAX_SIMULATIONS,
    deadline: float | None = None,
) -> MemoryRepair | None:
    """Repair the schedule that :func:`assemble` builds from these slots until its peak memory
    fits ``budget`` (see the module docstring); ``issue`` and ``wait`` map every collective to
    its slot, the other arguments are :func:`assemble`'s.

    Each round simulates the ``MOVES_PER_ROUND`` moves that promise to free the most excess
    bytes and applies the one with the least makespan increase per byte actually freed (the
    first one that costs nothing, when one does). Once the schedule fits, each moved unit's
    move is undone, or its wait put back, where the result still fits and is faster (a cheap
    move taken early can be made redundant by a costlier one taken later). The search stops at
    ``max_simulations`` simulator calls (the undo pass may add ``UNDO_SIMULATIONS``), or early
    when it frees excess too slowly to finish, or once ``deadline`` (a ``time.perf_counter()``
    time; wall-clock solves) has passed, before it fits. Returns None when the slots do not assemble.
    The schedule is valid by construction (:func:`assemble`); callers that hand it out should
    still check it.
    """
    p = placement.problem
    issue0, wait0 = dict(issue), dict(wait)
    issue, wait = dict(issue), dict(wait)
    units = _units(placement, buckets)
    sims = moves = 0
    scored: dict[Schedule, SimResult] = {}  # different moves often assemble to the same order

    def trial(unit: _Unit, s2: int, w2: int) -> _Trial | None:
        """``unit`` moved to slots (s2, w2), simulated; None when that does not assemble."""
        nonlocal sims
        iss, wt = dict(issue), dict(wait)
        for m in unit.members:
            iss[m], wt[m] = s2, w2
        try:
            sch = assemble(placement, iss, wt, buckets, multi_dtype, priority, issue_after)
        except ValueError:  # a reader of this collective's wait cannot follow it
            return None
        if sch not in scored:
            sims += 1
            scored[sch] = simulate(p, sch, check=False)
        return iss, wt, sch, scored[sch]

    try:
        sched = assemble(placement, issue, wait, buckets, multi_dtype, priority, issue_after)
    except ValueError as e:
        log.debug("repair_memory: the given slots do not assemble: %s", e)
        return None
    res = scored[sched] = simulate(p, sched, check=False)
    sims = 1
    excess0 = excess = _excess(res, budget)
    moved: list[_Unit] = []
    start_makespan = res.makespan_ns
    while (res.peak_memory_bytes > budget and excess and sims < max_simulations  # excess 0: inputs alone
           and (deadline is None or time.perf_counter() <= deadline)):
        best: tuple[tuple[float, int, int], _Unit, _Trial] | None = None
        for unit, s2, w2 in _moves(placement, units, sched, res, budget, issue, wait, wait0)[:MOVES_PER_ROUND]:
            if sims >= max_simulations or (deadline is not None and time.perf_counter() > deadline):
                break
            t = trial(unit, s2, w2)
            if t is None:
                continue
            r = t[3]
            freed = excess - _excess(r, budget)
            if freed <= 0:
                continue
            cost = max(0, r.makespan_ns - res.makespan_ns)
            key = (cost / freed, -freed, r.makespan_ns)
            if best is None or key < best[0]:
                best = (key, unit, t)
            if cost == 0:  # nothing beats a free move by much: take it now, save simulations
                break
        if best is None:
            break
        _, unit, (issue, wait, sched, res) = best
        moved.append(unit)
        moves += 1
        excess = _excess(res, budget)
        pace = (excess0 - excess) / moves  # excess freed per move so far
        if res.peak_memory_bytes > budget and moves >= 2 and excess > pace * _GIVE_UP_FACTOR * (max_simulations - sims):
            log.debug("repair_memory: too slow: %d of %d excess bytes left after %d moves", excess, excess0, moves)
            break
    if res.peak_memory_bytes > budget:
        log.debug("repair_memory: gave up after %d moves, %d simulations (peak %d > budget %d)",
                  moves, sims, res.peak_memory_bytes, budget)
        return MemoryRepair(sched, res, False, moves, sims)
    undo_until = sims + UNDO_SIMULATIONS
    for unit in reversed(list(dict.fromkeys(moved))):
        m0 = unit.members[0]
        s, w = issue[m0], wait[m0]
        for s2, w2 in dict.fromkeys([(issue0[m0], wait0[m0]), (s, max(s, wait0[m0]))]):
            if (s2, w2) == (s, w) or sims >= undo_until:
                continue
            t = trial(unit, s2, w2)
            if t is not None and t[3].peak_memory_bytes <= budget and t[3].makespan_ns < res.makespan_ns:
                issue, wait, sched, res = t
                break
    log.debug("repair_memory: fits after %d moves, %d simulations; makespan %d -> %d ns",
              moves, sims, start_makespan, res.makespan_ns)
    return MemoryRepair(sched, res, True, moves, sims)


def _excess(res: SimResult, budget: int) -> int:
    """Bytes over the budget, summed over program positions (the repair's progress measure)."""
    return sum(m - budget for m in res.memory_curve if m > budget)


def _units(pl: Placement, buckets: Sequence[Sequence[str]]) -> list[_Unit]:
    """Every bucket and every collective outside one, with its slot bounds and original slots
    (as the ``keep`` policy takes them) and the bytes a move can free."""
    p = pl.problem
    ops, sizes = p.op_by_name, {s.name: (s.size_bytes, s.never_freed) for s in p.storages}
    orig_issue, orig_wait = pl.original_slots
    out = []
    for members in pl.groups(buckets):
        earliest, need = pl.slot_bounds(members)
        oi = min(max(earliest, *(orig_issue[m] for m in members)), need)
        ow = min(max(oi, min(orig_wait[m] for m in members)), need)
        made = tuple(s for m in members for op in (*pl.units[m].chain, m) for s in ops[op].allocates)
        outputs = {s for m in members for s in ops[m].allocates}
        read = {s for m in members for s in ops[m].uses if s not in outputs}
        out.append(_Unit(members, earliest, need, oi, ow, made,
                         sum(sizes[s][0] for s in set(made) if not sizes[s][1]),
                         sum(sizes[s][0] for s in read if not sizes[s][1])))
    return out


def _moves(
    pl: Placement, units: list[_Unit], sched: Schedule, res: SimResult, budget: int,
    issue: Mapping[str, int], wait: Mapping[str, int], wait0: Mapping[str, int],
) -> list[tuple[_Unit, int, int]]:
    """Candidate (unit, issue slot, wait slot) moves, the most excess bytes they may free first.

    A unit is a candidate when something it allocates is live at an over-budget position (from
    its chain's first op to the last use of its outputs). The estimate counts the unit's own
    bytes at the over-budget positions the move takes them out of: what it allocates, for the
    positions before the new issue; what it reads, for the positions after the new wait. A
    later issue takes the rung's own wait slot back (``wait0``, or the new issue slot if
    later): a wait pulled earlier to free inputs is rarely worth its stall once the issue moves.
    """
    p = pl.problem
    over = [q for q, m in enumerate(res.memory_curve) if m > budget]
    pos = {name: i for i, name in enumerate(sched.order)}
    bb_before = [0] * (len(sched.order) + 1)  # backbone ops before each position
    for i, name in enumerate(sched.order):
        bb_before[i + 1] = bb_before[i] + (name in pl.slot_of_backbone)
    last_use = _last_uses(p, sched, pos)
    bb_over = [bb_before[q] for q in over]  # non-decreasing, as ``over`` is sorted
    scored: list[tuple[int, int, int, _Unit, int, int]] = []
    for u in units:
        start = min(pos[op] for m in u.members for op in (*pl.units[m].chain, m))
        issue_pos = max(pos[m] for m in u.members)
        wait_pos = min(pos[p.wait_of[m]] for m in u.members)
        end = max([wait_pos, *(last_use.get(s, wait_pos) for s in u.storages)])
        lo, hi = bisect.bisect_left(over, start), bisect.bisect_right(over, end)  # spanned: over[lo:hi]
        if lo == hi:
            continue
        # in flight: the spanned positions q with issue_pos < q <= wait_pos, over[a:b]
        a, b = (bisect.bisect_right(over, issue_pos, lo, hi), bisect.bisect_right(over, wait_pos, lo, hi)) \
            if u.wait_bytes else (lo, lo)
        s, w = issue[u.members[0]], wait[u.members[0]]
        cand = [(min(u.need, bb_over[hi - 1] + 1), None),  # issue after the last one it spans
                (u.orig_issue, None), (u.orig_issue, u.orig_wait)]
        if a < b:  # wait before the first one it is in flight over, or where it was
            cand += [(s, max(s, min(w, bb_over[a]))), (s, max(s, min(w, u.orig_wait)))]
        seen: set[tuple[int, int]] = set()
        for s2, w2_or_none in cand:
            w2 = max(wait0[u.members[0]], s2) if w2_or_none is None else w2_or_none
            if not (u.earliest <= s2 <= w2 <= u.need and s2 >= s) or (s2, w2) == (s, w) or (s2, w2) in seen:
                continue
            seen.add((s2, w2))
            gain = u.issue_bytes * (bisect.bisect_left(bb_over, s2, lo, hi) - lo)  # spanned before slot s2
            gain += u.wait_bytes * (b - bisect.bisect_left(bb_over, w2, a, b))  # in flight from slot w2 on
            if gain > 0:
                scored.append((-gain, pos[u.members[0]], len(scored), u, s2, w2))
    scored.sort(key=lambda x: x[:3])
    return [(u, s2, w2) for _, _, _, u, s2, w2 in scored]


def _last_uses(p: ScheduleProblem, sched: Schedule, pos: Mapping[str, int]) -> dict[str, int]:
    """Position of the last op that reads each storage (a collective's output: its wait too)."""
    out: dict[str, int] = {}
    for name, i in pos.items():
        op = p.op_by_name[name]
        for s in op.uses:
            if out.get(s, -1) < i:
                out[s] = i
        if op.waits_on is not None:
            for s in p.op_by_name[op.waits_on].allocates:
                if out.get(s, -1) < i:
                    out[s] = i
    return out
