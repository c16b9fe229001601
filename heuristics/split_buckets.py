"""More hidden collectives by splitting buckets: a count-first pass over a schedule's buckets.

Entry point: :func:`split_buckets`. A bucket is issued once its last member is ready and waited
where its first member is needed, so one stall of a bucket of ``k`` leaves ``k`` collectives
waited on, and its copy-in runs on the compute stream; alone, a member that is ready early starts
early, but every collective pays its own latency. The searches before this one keep a bucket
wherever it shortens the makespan, and the count-first polish (:mod:`.hide`) moves ops, never
buckets. DESIGN.md counts the collectives whose waits stall ("hidden/hideable"), and the issue's
target counts them member by member.

Each bucket (those whose waits stall first, least exposed first) is tried dissolved (its members
alone) and, from three members up, halved (its earlier and later members by program position),
with its last member alone, and, from four up, with its first member alone; each part of two or
more a bucket again. The last member alone is for a communication-bound tail: every compute op
there feeds a collective, so the last unit issued is waited with no compute left to hide it, and
a bucket there leaves every member exposed. Alone, its last member takes the stall, and the rest
is issued at the member before, under the last compute. The first member alone is issued no
later, and can start before the others are ready. A split keeps the order, so it is valid: each
part is issued at its last member's position, no later than the bucket was, and every member's
wait stays after that. Each candidate is polished by :func:`.hide.hide_collectives` and ranked by
the collectives hidden (a bucket's members each counted), then the makespan; the best is kept
when it ranks above the schedule (more hidden, or as many in a shorter makespan) within
``max_makespan_ns`` (by default the input's makespan: never longer) and ``budget_bytes`` (by
default the input's peak), and the pass runs again from it until no split gains.

A bucket whose members are all hidden can gain too: without its copy-in and its hold on the
group, others stall less. The tp_2x4 backward's answers bucket three 16 KB all-reduces of the
tensor-parallel group, hidden. Dissolved and polished (8 tries of 400 candidates, 0.2 s): the
60 s answer (185 of 198 units hidden, 187 of 200 collectives, 31,192.6 us) became 187 of 200 at
31,190.6 us, and 189 of 200 at 31,282.8 us with 0.5% of slack; a 240 s answer with the spine
fill (191 of 198, 193 of 200, 31,143.4 us) became 193 of 200 at 31,141.4 us, and 195 of 200 at
31,290.5 us with 0.5%. On the 4-node backward's 60 s answer (8 buckets, 110 of 149 collectives
hidden at 160,112.3 us, its last bucket of 27 reductions exposed 39.2 ms), halves and dissolves
gained nothing within 0.5%, and 121 with 5%. With the last member alone this pass (no try
limit) hides 119 with 0.5% of slack (160,631.7 us), 121 with 1%, and 147 with 5% (164,678.3 us,
original peak): the tail's embedding reduction alone takes 42.8 ms of stall, and one gather of
the first layer the 7.1 ms of the start (2.8 s, 2 cores).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.simulator import SimResult, simulate
from .hide import hide_collectives

log = logging.getLogger(__name__)

HIDE_EVALS = 400  # candidates the polish of one split scores


def hidden_key(res: SimResult) -> tuple[int, int]:
    """Collectives hidden (a bucket's members each counted), then the shorter makespan: the rank
    of the count-first passes (here and :func:`..solver.cpsat.solve`'s spine rounds)."""
    return res.n_hidden_hideable_members, -res.makespan_ns


def splits(problem: ScheduleProblem, schedule: Schedule, res: SimResult | None = None) -> Iterator[Schedule]:
    """Each bucket of ``schedule`` dissolved, then (three members or more) halved by position and
    with its last member alone, then (four or more) with its first member alone: the buckets whose
    waits stall first, least exposed first (``res``: the schedule's simulation), then the others,
    whose members are hidden already but whose copy and latency may stall others."""
    res = simulate(problem, schedule) if res is None else res
    pos = {name: k for k, name in enumerate(schedule.order)}
    exposed = {frozenset(t.members): t.exposed_ns for t in res.collectives if len(t.members) > 1}
    order = sorted(range(len(schedule.buckets)),
                   key=lambda b: (exposed.get(frozenset(schedule.buckets[b]), 0) == 0,
                                  exposed.get(frozenset(schedule.buckets[b]), 0)))
    for b in order:
        members = schedule.buckets[b]
        rest = schedule.buckets[:b] + schedule.buckets[b + 1:]
        yield Schedule(schedule.order, rest, schedule.multi_dtype)
        if len(members) >= 3:
            by_pos = sorted(members, key=lambda m: pos[m])
            cuts = [len(by_pos) // 2, len(by_pos) - 1]  # halved, then the last member alone
            if len(by_pos) >= 4:
                cuts.append(1)  # the first member alone (for three, the halves)
            for cut in cuts:
                early = set(by_pos[:cut])
                parts = (tuple(m for m in members if m in early), tuple(m for m in members if m not in early))
                yield Schedule(schedule.order, rest + tuple(h for h in parts if len(h) >= 2), schedule.multi_dtype)


def split_buckets(problem: ScheduleProblem, schedule: Schedule, *, max_makespan_ns: int | None = None,
                  budget_bytes: int | None = None, max_tries: int | None = None, hide_evals: int = HIDE_EVALS,
                  deadline: float | None = None, keep_compute_order: bool = False) -> Schedule:
    """``schedule`` with buckets split where that hides more collectives (members counted), or as
    many in a shorter makespan, no longer than ``max_makespan_ns`` (None: the input's makespan)
    and peaking no higher than ``budget_bytes`` (None: the input's peak); the input itself when
    no split gains.

    ``max_tries`` (None: no bound) caps the splits polished, ``hide_evals`` each polish's
    candidates, both bounds on the work that do not depend on the machine; ``deadline`` (a
    ``time.perf_counter()`` value) stops early. ``keep_compute_order``: the fixed mode's polish.
    """
    res = simulate(problem, schedule)
    cap = res.makespan_ns if max_makespan_ns is None else max_makespan_ns
    peak = res.peak_memory_bytes if budget_bytes is None else budget_bytes
    best, best_res, tries = schedule, res, 0

    def spent() -> bool:
        return ((max_tries is not None and tries >= max_tries)
                or (deadline is not None and time.perf_counter() >= deadline))

    while best.buckets and not spent():
        found: tuple[Schedule, SimResult] | None = None
        for cand in splits(problem, best, best_res):
            if spent():
                break
            tries += 1
            out = hide_collectives(problem, cand, max_makespan_ns=cap, budget_bytes=peak, max_evals=hide_evals,
                                   deadline=deadline, keep_compute_order=keep_compute_order)
            r = simulate(problem, out)
            if r.makespan_ns <= cap and r.peak_memory_bytes <= peak and hidden_key(r) > hidden_key(found[1] if found else best_res):
                found = (out, r)
        if found is None:
            break
        best, best_res = found
    if best is not schedule:
        log.info("split buckets %s: %d -> %d collectives hidden, %d -> %d buckets, makespan %d -> %d ns", problem.name,
                 res.n_hidden_hideable_members, best_res.n_hidden_hideable_members, len(schedule.buckets),
                 len(best.buckets), res.makespan_ns, best_res.makespan_ns)
    return best
