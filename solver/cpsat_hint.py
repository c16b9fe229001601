"""Schedules to and from CP-SAT: hint values for the model's decisions, and the decoded order.

Each present item is anchored where the schedule runs it (an issue block at its last member, a
wait block at its first member wait, others at their first op), then given a key in that order.
In fixed mode the slot is the number of backbone ops before the anchor, snapped to an allowed
slot (issues earlier, waits later). Times are left for CP-SAT to complete, except in window
rounds (cpsat_window.py), whose models hold the whole graph: there the simulated times are hinted too.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

from .cpsat_frame import Frame, ItemKind
from .schedule import Schedule

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

    from .cpsat_model import ModelBuilder

log = logging.getLogger(__name__)


def chosen_candidates(f: Frame, sched: Schedule) -> set[int] | None:
    """The candidates that reproduce ``sched``'s buckets (None if some bucket is not a candidate)."""
    idx = f.problem.index
    by_members = {c.members: c.index for c in f.candidates}
    chosen: set[int] = set()
    bucketed: set[str] = set()
    for b in sched.buckets:
        members = tuple(sorted(b, key=idx.__getitem__))
        if members not in by_members:
            return None
        chosen.add(by_members[members])
        bucketed.update(members)
    for c in f.problem.collectives:
        if c.name not in bucketed:
            if (c.name,) not in by_members:
                return None
            chosen.add(by_members[(c.name,)])
    return chosen


def item_anchors(f: Frame, sched: Schedule, chosen: set[int]) -> list[tuple[int, int]]:
    """``(position, item)`` for every item present under ``chosen``, sorted: where ``sched`` runs it
    (an issue block at its last member, a wait block at its first member wait, others at their
    first op). Keys given in this order reproduce ``sched`` (up to zero-cost ops folded into the
    item they read)."""
    pos = {op: i for i, op in enumerate(sched.order)}
    wait_of = f.problem.wait_of
    anchors = []
    for it in f.items:
        if it.candidate is not None and it.candidate not in chosen:
            continue
        members = f.candidates[it.candidate].members if it.candidate is not None else ()
        if it.kind is ItemKind.ISSUE:
            a = max(pos[m] for m in members)
        elif it.kind is ItemKind.WAIT:
            a = min(pos[wait_of[m]] for m in members)
        else:
            a = pos[it.ops[0]]
        anchors.append((a, it.index))
    anchors.sort()
    return anchors


def hint_values(builder: ModelBuilder, sched: Schedule) -> list[tuple[object, int]]:
    f, v = builder.frame, builder.v
    chosen = chosen_candidates(f, sched)
    if chosen is None:
        log.debug("hint: the schedule's buckets are not all candidates; no hint")
        return []
    anchors = item_anchors(f, sched, chosen)
    keys: dict[int, int] = {}
    out: list[tuple[object, int]] = [(v.x[c.index], int(c.index in chosen)) for c in f.candidates]
    if f.mode == "free":
        k = 1
        for _, i in anchors:
            keys[i] = k
            k += len(f.items[i].ops)
    else:
        pos = {op: i for i, op in enumerate(sched.order)}
        bb_pos = sorted(pos[b] for b in f.backbone)
        placed: list[tuple[int, int, int]] = []
        for a, i in anchors:
            it = f.items[i]
            if it.kind is ItemKind.FIXED:
                continue
            slot = bisect.bisect_left(bb_pos, a)
            slots = it.slots
            if it.kind is ItemKind.ISSUE:
                j = bisect.bisect_right(slots, slot) - 1
                slot = slots[max(j, 0)]
            else:
                j = bisect.bisect_left(slots, slot)
                slot = slots[min(j, len(slots) - 1)]
            placed.append((slot, a, i))
        placed.sort()
        used: dict[int, int] = {}
        for slot, _, i in placed:
            rank = used.get(slot, 0)
            used[slot] = rank + len(f.items[i].ops)
            keys[i] = 1 + slot * f.key_span + rank
            out.append((v.slot[i], slot))
    for i, k in keys.items():
        if not isinstance(v.key[i], int):  # frozen items of a window round have constant keys
            out.append((v.key[i], k))
    for (a, b), lit in v.before.items():
        if a in keys and b in keys:
            out.append((lit, int(keys[a] < keys[b])))
    if f.window is not None:
        out += _time_hints(builder, anchors)
    return out


def _time_hints(builder: ModelBuilder, anchors: list[tuple[int, int]]) -> list[tuple[object, int]]:
    """The simulated times of the window frame's incumbent (``Frame.clocks``, ``Frame.comm_timing``,
    from :func:`.cpsat_window.window_frame`) for every item and collective: a window round's model
    holds the whole graph, and CP-SAT left to complete a hint of keys alone on a 2k-op backward
    found nothing in 15 s (with these it starts from the incumbent at once). The hint of a window
    round is that incumbent."""
    f, v = builder.frame, builder.v
    clocks = f.clocks
    out: list[tuple[object, int]] = []
    for a, i in anchors:
        it = f.items[i]
        if it.times is not None:  # constant
            continue
        end = clocks[a]
        start = clocks[a - 1] if it.kind is ItemKind.WAIT and a > 0 else end - it.cost_ns
        out += [(v.start[i], start), (v.end[i], end)]
    for c in f.candidates:
        if c.index not in f.comm_times and (t := f.comm_timing.get(frozenset(c.members))) is not None:
            out += [(v.comm_start[c.index], t[0]), (v.comm_end[c.index], t[1])]
    return out


def add_hint(builder: ModelBuilder, sched: Schedule) -> None:
    """Hint the model with ``sched``: candidate choices and item keys, and in window rounds the
    simulated times too (CP-SAT completes the rest)."""
    for var, val in hint_values(builder, sched):
        builder.model.AddHint(var, val)


def hint_vars(builder: ModelBuilder) -> list:
    """Every decision and time variable of the model (to hint a second phase with a solution)."""
    v = builder.v
    out = [*v.x.values(), *v.before.values(), *v.slot.values(), *v.start.values(), *v.end.values(),
           *v.comm_start.values(), *v.seg_start, v.makespan, v.peak, *v.key.values()]
    return [var for var in out if not isinstance(var, int)]  # window rounds: constants


def decode(builder: ModelBuilder, solver: cp_model.CpSolver) -> Schedule:
    """The program order of a CP-SAT solution: present items by key, each expanded to its ops."""
    frame, v = builder.frame, builder.v
    chosen = {c.index for c in frame.candidates if solver.Value(v.x[c.index])}
    placed = []
    for it in frame.items:
        if it.candidate is not None and it.candidate not in chosen:
            continue
        key = v.key[it.index]
        placed.append((key if isinstance(key, int) else solver.Value(key), it.index))
    order = [op for _, i in sorted(placed) for op in frame.items[i].ops]
    buckets = tuple(frame.candidates[k].members for k in sorted(chosen) if frame.candidates[k].is_bucket)
    return Schedule(order=tuple(order), buckets=buckets, multi_dtype=frame.multi_dtype)
