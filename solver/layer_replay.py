"""Replaying a neighbourhood round's improvement in every isomorphic layer (``solver/layers.py``).

The neighbourhood search (``cpsat_lns.neighbourhood_solve``) works in fixed heavy-compute order: the
**backbone** (every op but the collectives, their producer-only chains and their waits) keeps
its order, and a round moves **units** (a collective with its chain, and its wait) and changes
buckets. When a round improves the incumbent ``s0`` to ``s1`` with a change local to one layer,
the same change is tried in the layer's isomorphic layers.

**The change** (:func:`local_change`). A collective *changed* when its bucket differs, when one
of its unit's ops or its wait sits at another backbone slot, or when its order among the units
and waits that stay in a slot changed (those outside a longest common subsequence of the slot's
sequences); buckets close the set (a changed collective's old and new bucket mates changed
too). ``moved`` is every unit op and wait of a changed collective. Removing ``moved`` from ``s0``
and from ``s1`` gives the same sequence (checked), so the change is exactly: where ``s1`` puts
the moved ops into that common rest, and the buckets of ``s1`` that hold them. It is *local to
layer L* when every moved op is in L and L is in a class of isomorphic layers.

**The same change in layer L'** (:func:`replay`). Every moved op maps to its counterpart in L'
(it must be a unit op or wait there too); the counterparts are taken out of the target schedule,
and each run of consecutive moved ops of ``s1`` is put back next to the counterpart of its
**anchor**: the nearest backbone op before or after the run that has a counterpart under the
same layer shift (an op of L, or of a neighbour of L whose shifted layer is in the same class;
the program's start and end count too), on the side with fewer backbone ops without one
(non-layer glue) in between, past as many of those, and in that slot on the same side of the
counterparts of the unmoved issues and waits that share its slot in ``s1``. Buckets of the moved
collectives become the mapped buckets of ``s1``. So the issues and waits of L' end up at the same
place relative to L' and its neighbours as L's are in ``s1``, in the same order, with the same
bucketing; ops of other layers are not touched. The isomorphism makes this a schedule of the
same shape, but not necessarily a valid or better one (L's neighbours, or the units of L that did
not move, may be scheduled differently from L''s), so every candidate is checked
(:func:`check_schedule`) and simulated, and kept only when it is valid, within the memory budget
and strictly better (makespan, then peak): replay never makes the incumbent worse.

All target layers are replayed at once first; if that is not better, the targets are split in
halves and each half tried in turn on the current best, down to single layers (a greedy search
layer by layer that needs few simulations when most layers agree), within a number of
simulations and, for wall-clock solves, a deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..heuristics.placement import Placement
from .layers import LayerStructure
from .problem import ScheduleProblem
from .schedule import Schedule, check_schedule
from .simulator import SimResult, makespan_ns, simulate

log = logging.getLogger(__name__)

MAX_LCS_CELLS = 250_000  # a slot's sequences longer than this: every unit in it counts as changed


@dataclass(frozen=True)
class LocalChange:
    """An improvement confined to one layer: the ops it moved, where, and their buckets."""

    layer: str
    moved: frozenset[str]
    order: tuple[str, ...]  # the improved schedule's order
    buckets: tuple[tuple[str, ...], ...]  # the improved schedule's buckets of moved collectives


class Units:
    """Backbone and units of a fixed-order problem: which ops a neighbourhood round may move (its
    chains as the problem's order runs them, as in the rounds' frames)."""

    def __init__(self, problem: ScheduleProblem):
        pl = Placement(problem, move_chains=True, contiguous_chains=True)
        self.backbone = frozenset(pl.backbone)
        self.unit_of: dict[str, str] = {}  # movable op -> its collective
        for c, u in pl.units.items():
            for op in (*u.chain, c, problem.wait_of[c]):
                self.unit_of[op] = c


def local_change(structure: LayerStructure, units: Units, s0: Schedule, s1: Schedule) -> LocalChange | None:
    """The change from ``s0`` to ``s1`` when it is local to one layer in a class (else None)."""
    bb = units.backbone
    if [x for x in s0.order if x in bb] != [x for x in s1.order if x in bb]:
        return None  # not a fixed-order move
    b0 = {m: frozenset(b) for b in s0.buckets for m in b}
    b1 = {m: frozenset(b) for b in s1.buckets for m in b}
    changed = {c for c in set(b0) | set(b1) if b0.get(c) != b1.get(c)}
    slot0, slot1 = _slots(s0.order, bb), _slots(s1.order, bb)
    changed |= {units.unit_of[x] for x in slot0 if slot0[x] != slot1[x]}
    for c in _reordered_in_slots(s0.order, s1.order, slot0, slot1, units, changed):
        changed.add(c)
    grow = True
    while grow:  # bucket mates, old and new, change with them
        mates = {m for c in changed for b in (b0.get(c), b1.get(c)) if b for m in b}
        grow = not mates <= changed
        changed |= mates
    if not changed:
        return None
    moved = frozenset(x for x, c in units.unit_of.items() if c in changed)
    if [x for x in s0.order if x not in moved] != [x for x in s1.order if x not in moved]:
        return None
    layers = {structure.layer_of.get(x) for x in moved}
    layer = layers.pop() if len(layers) == 1 else None
    if layer is None or layer not in structure.class_of:
        return None
    buckets = tuple(b for b in s1.buckets if b[0] in changed)
    return LocalChange(layer, moved, s1.order, buckets)


def _slots(order: Sequence[str], backbone: frozenset[str]) -> dict[str, int]:
    """Backbone slot (backbone ops before it) of every non-backbone op."""
    out, k = {}, 0
    for x in order:
        if x in backbone:
            k += 1
        else:
            out[x] = k
    return out


def _reordered_in_slots(o0: Sequence[str], o1: Sequence[str], slot0: dict[str, int], slot1: dict[str, int],
                        units: Units, changed: set[str]) -> set[str]:
    """Collectives whose unit's ops left the longest common subsequence of their slot's ops."""
    seqs: dict[int, tuple[list[str], list[str]]] = {}
    for order, slot, side in ((o0, slot0, 0), (o1, slot1, 1)):
        for x in order:
            if x in slot and units.unit_of[x] not in changed:
                seqs.setdefault(slot[x], ([], []))[side].append(x)
    out: set[str] = set()
    for a, b in seqs.values():
        if a != b:
            keep = _lcs(a, b)
            out |= {units.unit_of[x] for x in (*a, *b) if x not in keep}
    return out


def _lcs(a: list[str], b: list[str]) -> set[str]:
    """The elements of a longest common subsequence of ``a`` and ``b`` (empty when too large)."""
    if len(a) * len(b) > MAX_LCS_CELLS:
        return set()
    n, m = len(a), len(b)
    dp = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            dp[i][j] = dp[i + 1][j + 1] + 1 if a[i] == b[j] else max(dp[i + 1][j], dp[i][j + 1])
    keep, i, j = set(), 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            keep.add(a[i])
            i, j = i + 1, j + 1
        elif dp[i + 1][j] >= dp[i][j + 1]:
            i += 1
        else:
            j += 1
    return keep


def replay(structure: LayerStructure, units: Units, change: LocalChange, target: str,
           sched: Schedule) -> Schedule | None:
    """``sched`` with ``change`` replayed in layer ``target`` (see module docstring), or None when
    some moved op, or the bucketing around it, has no counterpart there."""
    src = change.layer
    mapped: dict[str, str] = {}
    for x in change.moved:
        y = structure.map_op(x, src, target)
        if y is None or y not in units.unit_of:
            return None
        mapped[x] = y
    out_ops = set(mapped.values())
    colls = {units.unit_of[y] for y in out_ops}
    kept = []
    for b in sched.buckets:
        inside = sum(m in colls for m in b)
        if inside and inside < len(b):
            return None  # the target's bucket holds a collective the change does not move
        if not inside:
            kept.append(b)
    rest = [x for x in sched.order if x not in out_ops]
    at = {x: i for i, x in enumerate(rest)}
    inserts: list[tuple[int, int, list[str]]] = []
    order, bb = change.order, units.backbone
    i = 0
    while i < len(order):
        if order[i] not in change.moved:
            i += 1
            continue
        j = i
        while j < len(order) and order[j] in change.moved:
            j += 1
        pos = _insertion(structure, bb, change, target, order, i, j, rest, at)
        if pos is None:
            return None
        inserts.append((pos, i, [mapped[x] for x in order[i:j]]))
        i = j
    inserts.sort(key=lambda t: (t[0], t[1]))
    new: list[str] = []
    prev = 0
    for pos, _, block in inserts:
        new.extend(rest[prev:pos])
        new.extend(block)
        prev = pos
    new.extend(rest[prev:])
    buckets = (*kept, *(tuple(mapped[m] for m in b) for b in change.buckets))
    return Schedule(tuple(new), buckets, sched.multi_dtype)


def _insertion(structure: LayerStructure, bb: frozenset[str], change: LocalChange, target: str,
               order: Sequence[str], i: int, j: int, rest: list[str], at: dict[str, int]) -> int | None:
    """Where in ``rest`` (the target schedule without the moved ops) the run ``order[i:j]`` of
    moved ops goes. Its **anchor** is the nearest backbone op before it, or after it, that has a
    counterpart (the program's start and end count as such), whichever has fewer backbone ops
    without one (glue outside the layers) in between; ties go to the earlier. The run goes next to
    the anchor's counterpart, past as many backbone ops without a counterpart, and in that slot
    on the same side of the counterparts of the unmoved issues and waits that share its slot."""
    k0, y0, near0 = _side(structure, bb, change, target, order, i - 1, -1)
    k1, y1, near1 = _side(structure, bb, change, target, order, j, 1)
    if k0 <= k1:
        if y0 is not None and y0 not in at:
            return None
        pos = at[y0] + 1 if y0 is not None else 0
        pos = _skip(structure, bb, change, target, rest, pos, k0, 1)
        end = pos
        while end < len(rest) and rest[end] not in bb:
            end += 1
        return max((p + 1 for p in range(pos, end) if rest[p] in near0), default=pos)
    if y1 is not None and y1 not in at:
        return None
    pos = at[y1] if y1 is not None else len(rest)
    pos = _skip(structure, bb, change, target, rest, pos, k1, -1)
    start = pos
    while start > 0 and rest[start - 1] not in bb:
        start -= 1
    return min((p for p in range(start, pos) if rest[p] in near1), default=pos)


def _side(structure: LayerStructure, bb: frozenset[str], change: LocalChange, target: str,
          order: Sequence[str], a: int, step: int) -> tuple[int, str | None, set[str]]:
    """Walking from ``order[a]`` by ``step``: (backbone ops without a counterpart passed, the
    counterpart of the first backbone op that has one or None at the program's edge, the
    counterparts of the unmoved issues and waits passed before the first backbone op)."""
    near: set[str] = set()
    k, in_slot = 0, True
    while 0 <= a < len(order):
        x = order[a]
        if x in bb:
            y = structure.map_op(x, change.layer, target)
            if y is not None:
                return k, y, near
            k, in_slot = k + 1, False
        elif in_slot and x not in change.moved:
            y = structure.map_op(x, change.layer, target)
            if y is not None:
                near.add(y)
        a += step
    return k, None, near


def _skip(structure: LayerStructure, bb: frozenset[str], change: LocalChange, target: str,
          rest: list[str], pos: int, k: int, step: int) -> int:
    """The insertion index ``k`` backbone ops without a counterpart away from ``pos`` in ``rest``
    (stopping short of a backbone op that has one)."""
    while k > 0 and 0 <= (pos if step > 0 else pos - 1) < len(rest):
        x = rest[pos if step > 0 else pos - 1]
        if x in bb:
            if structure.map_op(x, target, change.layer) is not None:
                break
            k -= 1
        pos += step
    return pos


class LayerReplayer:
    """Replays local improvements of a neighbourhood search in isomorphic layers; also picks the
    first windows in one layer of the largest class, so that their gains get multiplied."""

    def __init__(self, problem: ScheduleProblem, structure: LayerStructure, budget_bytes: int,
                 max_evals: int = 16, deadline: float | None = None):
        self.problem, self.structure, self.budget = problem, structure, budget_bytes
        self.units = Units(problem)
        self.max_evals, self.deadline = max_evals, deadline
        self._evals = 0  # simulations of the current replay

    def seed_window(self, res: SimResult, size: int, tried: set[tuple[str, ...]]
                    ) -> tuple[tuple[str, ...], set[str]] | None:
        """Like the search's own window (the most exposed untried placement and the ``size``
        placements nearest it in issue order), but in one representative layer of the largest
        class: the most exposed one, preferring layers whose two neighbours are in the class too
        (so that the anchors of a change there have counterparts in every other layer), and with
        the window's placements taken from that layer only (so that a gain stays local to it).
        None when no layer of that class is exposed, or when the class has no more placements
        than a window holds (a plain window then covers it: restricting it would only lose)."""
        if not self.structure.classes:
            return None
        cls = set(self.structure.classes[0].layers)
        layer_of, rank = self.structure.layer_of, self.structure.rank
        timings = sorted(res.collectives, key=lambda t: t.issue_pos)
        if sum(layer_of.get(t.members[0]) in cls for t in timings) <= size:
            return None
        exposed: dict[str, int] = {}
        for t in timings:
            lay = layer_of.get(t.members[0])
            if lay in cls and t.exposed_ns > 0 and t.members not in tried:
                exposed[lay] = exposed.get(lay, 0) + t.exposed_ns
        if not exposed:
            return None

        def inner(lay: str) -> bool:
            near = (self.structure.layer_at(rank[lay] + d) for d in (-1, 1))
            return all(n is not None and n.name in cls for n in near)

        rep = min(exposed, key=lambda lay: (not inner(lay), -exposed[lay], rank[lay]))
        mine = [t for t in timings if all(layer_of.get(m) == rep for m in t.members)]
        untried = [i for i, t in enumerate(mine) if t.members not in tried]
        if not untried:
            return None
        i = min(untried, key=lambda i: (-mine[i].exposed_ns, mine[i].wait_ns - mine[i].end_ns, i))
        lo = max(0, min(i - size // 2, len(mine) - size))
        near = mine[lo:lo + size]
        log.info("layer seed: window in %s around %s (%d ns exposed)", rep, mine[i].members[0], mine[i].exposed_ns)
        return mine[i].members, {m for t in near for m in t.members}

    def improve(self, s0: Schedule, s1: Schedule, res1: SimResult, stats: dict[str, int]
                ) -> tuple[Schedule, SimResult]:
        """``s1`` (an improvement of ``s0``) with its change replayed in the isomorphic layers where
        that is valid and better; ``(s1, res1)`` when it is not local to a layer or nothing pays."""
        change = local_change(self.structure, self.units, s0, s1)
        if change is None:
            return s1, res1
        cls = self.structure.classes[self.structure.class_of[change.layer]]
        rank = self.structure.rank
        targets = sorted((lay for lay in cls.layers if lay != change.layer),
                         key=lambda lay: (abs(rank[lay] - rank[change.layer]), rank[lay]))
        cand, applicable = s1, []
        for lay in targets:  # all at once; the layers where the change has no counterpart drop out
            nxt = replay(self.structure, self.units, change, lay, cand)
            if nxt is not None:
                cand = nxt
                applicable.append(lay)
        stats["layer_replays"] = stats.get("layer_replays", 0) + 1
        self._evals = 0
        best = (s1, res1)
        kept: list[str] = []
        pending = [applicable] if applicable else []
        while pending and self._evals < self.max_evals and not self._late():
            part = pending.pop(0)
            if part is not applicable:
                cand = best[0]
                for lay in part:
                    cand = replay(self.structure, self.units, change, lay, cand) or cand
            res = self._better(cand, best[1])
            if res is not None:
                best = (cand, res)
                kept.extend(part)
            elif len(part) > 1:
                pending[:0] = [part[:len(part) // 2], part[len(part) // 2:]]
        stats["layer_replays_kept"] = stats.get("layer_replays_kept", 0) + len(kept)
        stats["layer_replay_evals"] = stats.get("layer_replay_evals", 0) + self._evals
        log.info("layer replay: %d ops of %s moved; replayed in %d of %d layers (%d simulations): "
                 "makespan %d -> %d ns", len(change.moved), change.layer, len(kept), len(applicable),
                 self._evals, res1.makespan_ns, best[1].makespan_ns)
        return best

    def _late(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def _better(self, cand: Schedule, best: SimResult) -> SimResult | None:
        """The simulation of ``cand`` when it is valid, within the budget and strictly better."""
        self._evals += 1
        if check_schedule(self.problem, cand):
            return None
        if makespan_ns(self.problem, cand) > best.makespan_ns:
            return None
        res = simulate(self.problem, cand, check=False)
        if res.peak_memory_bytes <= self.budget and (res.makespan_ns, res.peak_memory_bytes) < (
                best.makespan_ns, best.peak_memory_bytes):
            return res
        return None


__all__ = ["LayerReplayer", "LocalChange", "Units", "local_change", "replay"]
