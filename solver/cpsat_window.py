"""Free-order windows: neighbourhood rounds that reorder compute, for free mode at scale.

A free-order model of a whole large graph needs an order literal per pair of items (a million on
a 2k-op backward), so :func:`.cpsat.solve` searches such graphs in rounds over windows of the
incumbent. Fixed-order rounds move collectives and waits only; the stalls they cannot remove
need compute moved (weight gradients pulled under a tensor-parallel collective, or held back
past the embedding's reduce-scatter at the end of a backward). A **free window** is a run of
consecutive program positions of the incumbent: every item the incumbent runs there (compute,
issue or wait block) may take any order its dependencies allow; every other item is frozen at
its key, in the incumbent's order. The model then needs order literals only between free items
(:meth:`.cpsat_model.ModelBuilder._window_order`), and buckets stay the incumbent's.

**Truncated windows.** The simulator is monotone: with the same program order after the window,
a compute clock no later at its end and every collective ending no later, nothing after it runs
later. So a window model may hold everything after the window at the incumbent's times, as
constants: the free items must end before the first item after the window starts (where none
follows, by the incumbent's clock at the window's end: ``Frame.window_end_ns``), each
collective issued in the window before the incumbent's next one of its group starts and before
its wait after the window ends. Every solution is then no slower than the incumbent, the model
times the window alone (on the tp backward a 120-op window's model otherwise propagated through
the thousand items after it: 10 s to the first gain), and it minimizes the window's end; the
simulator says how much of that the rest of the program keeps.

Entry points: :func:`window_frame` builds the frame, :func:`free_window` picks the window
around the incumbent's most exposed collective not tried yet (:func:`window_around` gives the
positions around a place), and :func:`paid_rate` (with
:func:`round_cost`) says whether free windows or fixed rounds have paid more so far.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from .cpsat_frame import Frame, FrameOptions, ItemKind, build_frame
from .cpsat_hint import chosen_candidates, item_anchors
from .problem import OpKind, ScheduleProblem
from .schedule import Schedule
from .simulator import SimResult, position_clocks, simulate


def window_frame(problem: ScheduleProblem, sched: Schedule, lo: int, hi: int, truncate: bool = False
                 ) -> Frame | None:
    """The free-mode frame of ``problem`` with ``sched``'s buckets forced, in which the items
    ``sched`` runs at positions ``[lo, hi)`` are free and the others are frozen at the keys that
    reproduce ``sched``; None when no item starts in the window.

    ``truncate``: the items after the window keep ``sched``'s times too, as constants, like those
    before it (see the module doc): the model then times the window only, and its objective is
    the window's end (:meth:`.cpsat_model.ModelBuilder.minimize_window_end`)."""
    frame = build_frame(problem, FrameOptions(mode="free", bucketing=False, multi_dtype=sched.multi_dtype,
                                              plan=sched.buckets))
    chosen = chosen_candidates(frame, sched)
    assert chosen is not None  # the forced buckets and the lone collectives are the only candidates
    clocks = position_clocks(problem, sched)
    key, span = 0, None
    for pos, i in item_anchors(frame, sched, chosen):
        it = frame.items[i]
        if lo <= pos < hi:
            span = (key if span is None else span[0], key + len(it.ops))
        else:
            it.key, it.anchor = key, pos
            if pos < lo or truncate:  # done before the window (or, truncated, after it): the incumbent's times
                it.times = (clocks[pos - 1] if it.kind is ItemKind.WAIT and pos else clocks[pos] - it.cost_ns,
                            clocks[pos])
        key += len(it.ops)
    if span is None:
        return None
    frame.window = span
    frame.clocks = clocks
    frame.window_end_ns = clocks[hi - 1] if truncate and hi > 0 else None
    frame.comm_timing = {frozenset(t.members): (t.start_ns, t.end_ns) for t in simulate(problem, sched).collectives}
    for c in frame.candidates:
        if frame.items[frame.issue_item[c.index]].times is not None:
            frame.comm_times[c.index] = frame.comm_timing[frozenset(c.members)]
    return frame


def free_window(problem: ScheduleProblem, sched: Schedule, res: SimResult, size: int,
                tried: set[tuple[tuple[str, ...], int]]) -> tuple[tuple[str, ...], int, int] | None:
    """``(members, lo, hi)``: the untried most exposed placement of ``sched`` (simulated as ``res``)
    and the positions around its wait holding ``size`` ops that are not zero-cost, half before
    the wait and half after (fewer where the order ends); None when every exposed one was tried.
    Placements that queued behind their group's stream come last: what hides a queue is compute
    deferred past its head, far from the wait (:mod:`..heuristics.far_defer`).
    ``tried`` holds ``(members, exposed ns)``: a placement is tried again once its stall changed
    (a gain elsewhere that left it as it was leaves its window as futile as before: the tp
    backward's last reduce-scatter, queued behind the embedding's, cost 7 s a try)."""
    exposed = sorted((t for t in res.collectives if t.exposed_ns > 0 and (t.members, t.exposed_ns) not in tried),
                     key=lambda t: (t.start_ns > t.issue_ns, -t.exposed_ns, t.wait_pos))
    if not exposed:
        return None
    t = exposed[0]
    return t.members, *window_around(problem, sched, t.wait_pos, size, size // 2)  # half before the wait


def window_around(problem: ScheduleProblem, sched: Schedule, pos: int, size: int, before: int) -> tuple[int, int]:
    """``(lo, hi)``: the positions of ``sched`` holding ``size`` ops that are not zero-cost,
    ``before`` of them before position ``pos`` and the rest from it on (shifted where the order
    ends), with the zero-cost ops between them."""
    ops = problem.op_by_name
    timed = [p for p, name in enumerate(sched.order) if ops[name].kind is not OpKind.ZERO]
    at = next((k for k, p in enumerate(timed) if p >= pos), len(timed))
    first = max(0, min(at - before, len(timed) - size))
    last = min(len(timed), first + size)
    lo = timed[first] if first > 0 else 0
    hi = timed[last] if last < len(timed) else len(sched.order)
    return lo, hi


def paid_rate(paid: list) -> float:
    """How well a kind of neighbourhood round has paid for its work: (ns gained + PRIOR_GAIN_NS) /
    (seconds + PRIOR_S), ``paid`` being ``[seconds, ns gained]``. Seconds, not rounds: on the
    4-node forward a fixed round took a fraction of a free one, and counting rounds gave free
    windows the time the fixed rounds' gains needed (10 s wall clock: 71.72 ms against 71.01 ms
    without free windows). Nanoseconds, not gains: on the tp backward fixed rounds gained 2 us
    each, and counting them as gains kept the free windows, which gain tens of microseconds
    where they pull compute under a stall, from running again after one failed window. The
    prior is optimism that a few seconds without a gain do not exhaust."""
    return (paid[1] + PRIOR_GAIN_NS) / (paid[0] + PRIOR_S)


PRIOR_GAIN_NS = 50_000  # a kind's rate before it has gained anything: 50 us over 10 s
PRIOR_S = 10.0


def round_cost(deterministic: bool, solver: cp_model.CpSolver, round_s: float) -> float:
    """A round's cost for :func:`paid_rate`: its wall time; in deterministic mode the round's
    budget (the same on every rank; CP-SAT's own deterministic time leaves presolve out)."""
    return round_s if deterministic else solver.WallTime()
