"""Turn a schedule (the heuristic warm start) into CP-SAT hint values for the model's decisions.

Each present item is anchored where the schedule runs it (an issue block at its last member, a
wait block at its first member wait, others at their first op), then given a key in that order.
In fixed mode the slot is the number of backbone ops before the anchor, snapped to an allowed
slot (issues earlier, waits later). Times are left for CP-SAT to complete.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

from .cpsat_frame import ItemKind
from .schedule import Schedule

if TYPE_CHECKING:
    from .cpsat_model import ModelBuilder

log = logging.getLogger(__name__)


def chosen_candidates(builder: ModelBuilder, sched: Schedule) -> set[int] | None:
    """The candidates that reproduce ``sched``'s buckets (None if some bucket is not a candidate)."""
    f = builder.frame
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


def hint_values(builder: ModelBuilder, sched: Schedule) -> list[tuple[object, int]]:
    f, v = builder.frame, builder.v
    chosen = chosen_candidates(builder, sched)
    if chosen is None:
        log.debug("hint: the schedule's buckets are not all candidates; no hint")
        return []
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
    keys: dict[int, int] = {}
    out: list[tuple[object, int]] = [(v.x[c.index], int(c.index in chosen)) for c in f.candidates]
    if f.mode == "free":
        k = 1
        for _, i in anchors:
            keys[i] = k
            k += len(f.items[i].ops)
    else:
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
        out.append((v.key[i], k))
    for (a, b), lit in v.before.items():
        if a in keys and b in keys:
            out.append((lit, int(keys[a] < keys[b])))
    return out
