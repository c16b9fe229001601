"""Tail deferral: hide an exposed collective behind compute that does not depend on it (free order).

Entry point: :func:`defer_independent`. In fixed heavy-compute order the last gradient
reduction of a backward graph has nothing left to hide behind: its wait stalls the stream
at the very end. But compute that is *not an ancestor* of that collective (the weight
gradients of the first layer, say) may run after it is issued. Moving such compute from
before the issue to just after it is always valid:

* every op moved is a non-ancestor of the collective, so the collective's inputs still exist
  when it is issued;
* the moved set is the non-ancestor compute in a suffix (in program order) of the ops before
  the issue, closed under descendants within that suffix: a descendant of a moved op comes
  later, is itself a non-ancestor, and moves too, in its old relative order. Collectives and
  waits that depend on nothing moved stay, so the group's FIFO order ahead of the collective
  is kept.

Moving compute can delay collectives that depend on it, so every move is scored by the
simulator and kept only if the makespan drops and the peak memory stays within the budget.
This is a heavy-compute reorder: its result is a free-order schedule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import numpy as np

from ..solver.problem import OpKind, ScheduleProblem, bit_mask
from ..solver.schedule import Schedule, check_schedule
from ..solver.sim_tables import sim_tables
from ..solver.simulator import CollectiveTiming, SimResult, makespan_at, simulate
from .bucketing import bit_indices
from .overlap import original_peak

log = logging.getLogger(__name__)


class Deferrals:
    """Deferrals of seed sets past issues of one schedule, built as index arrays (op index per
    position): a search ranks hundreds of them by makespan and names the ops of the few it keeps."""

    def __init__(self, problem: ScheduleProblem, sched: Schedule):
        self.problem, self.sched = problem, sched
        self.at, self.pos = sim_tables(problem).positions(problem, sched.order)
        self.bucketed = np.zeros(len(problem.ops), dtype=bool)
        for b in sched.buckets:
            self.bucketed[[problem.index[m] for m in b]] = True

    def order(self, issue_pos: int, seeds: set[str]) -> tuple[np.ndarray, bool]:
        """The order with ``seeds`` (before ``issue_pos``) and every op that depends on them up to
        the issue moved just after it, in their old relative order, and whether that moves a bucket
        member. What depends on a seed and lies before the issue is its descendants there: a path
        from a seed runs through ops placed between the two."""
        problem = self.problem
        idx = [problem.index[s] for s in seeds]
        first = int(self.pos[idx].min())
        bits = 0
        for i in idx:
            bits |= problem.descendants[i] | (1 << i)
        seg = self.at[first:issue_pos + 1]
        moved = bit_mask(bits, len(problem.ops))[seg]
        new = np.concatenate((self.at[:first], seg[~moved], seg[moved], self.at[issue_pos + 1:]))
        return new, bool(self.bucketed[seg[moved]].any())

    def valid_order(self, issue_pos: int, seeds: set[str]) -> np.ndarray | None:
        """:meth:`order`, or None when it moves a bucket member past another member's wait."""
        at, moves_member = self.order(issue_pos, seeds)
        return None if moves_member and check_schedule(self.problem, self.schedule(at)) else at

    def schedule(self, at: np.ndarray) -> Schedule:
        """The schedule of the order ``at`` (with the deferrals' schedule's buckets)."""
        return named(self.problem, at, self.sched)


def named(problem: ScheduleProblem, at: np.ndarray, like: Schedule) -> Schedule:
    """The schedule of the order ``at`` (op index per position) with ``like``'s buckets: what a search
    that ranks index-array candidates keeps."""
    return Schedule(order=tuple(map(problem.names.__getitem__, at.tolist())), buckets=like.buckets,
                    multi_dtype=like.multi_dtype)


def deferred(problem: ScheduleProblem, sched: Schedule, issue_pos: int, seeds: set[str]) -> Schedule | None:
    """``sched`` with ``seeds`` (non-ancestors of the collective issued at ``issue_pos``, before it)
    and every op that depends on them up to the issue moved just after the issue, in their old
    relative order; None when it moves a bucket member past another member's wait."""
    d = Deferrals(problem, sched)
    at = d.valid_order(issue_pos, seeds)
    return None if at is None else d.schedule(at)


def _suffix_seeds(problem: ScheduleProblem, order: tuple[str, ...], anc: int, start: int, issue_pos: int) -> set[str]:
    """The non-ancestor compute in ``order[start:issue_pos]``."""
    return {op for op in order[start:issue_pos]
            if not anc >> problem.index[op] & 1 and problem.ops[problem.index[op]].kind is OpKind.COMPUTE}


def _private_seeds(problem: ScheduleProblem, order: tuple[str, ...], anc: int, issue_pos: int,
                   limit: int) -> list[set[str]]:
    """For the ``limit`` latest collectives issued before ``issue_pos`` that are not ancestors: the
    compute before the issue that is not an ancestor, with the collective itself, when that compute
    outlasts the collective (moving compute from far back shrinks earlier overlap windows)."""
    before = set(order[:issue_pos])
    out = []
    for p in range(issue_pos - 1, -1, -1):
        if len(out) >= limit:
            break
        op = order[p]
        i = problem.index[op]
        o = problem.ops[i]
        if o.kind is not OpKind.COLLECTIVE or anc >> i & 1:
            continue
        seeds = {n for j in bit_indices(problem.ancestors[i] & ~anc) if (n := problem.ops[j].name) in before
                 and problem.ops[j].kind is OpKind.COMPUTE}
        if seeds and sum(problem.ops[problem.index[s]].runtime_ns for s in seeds) > o.runtime_ns:
            out.append(seeds | {op})
    return out


def feeds_compute(problem: ScheduleProblem) -> list[bool]:
    """Per op (by original index): whether some positive-cost compute depends on it (one reverse pass)."""
    out = [False] * len(problem.ops)
    idx = problem.index
    for i in range(len(problem.ops) - 1, -1, -1):
        for u in problem.users[problem.ops[i].name]:
            j = idx[u]
            if out[j] or (problem.ops[j].kind is OpKind.COMPUTE and problem.ops[j].runtime_ns > 0):
                out[i] = True
                break
    return out


def waited_collectives(problem: ScheduleProblem) -> frozenset[str]:
    """Collectives whose wait feeds positive-cost compute (the rest only feed the graph's outputs)."""
    feeds = feeds_compute(problem)
    return frozenset(c.name for c in problem.collectives if feeds[problem.index[problem.wait_of[c.name]]])


def filler_ops(problem: ScheduleProblem, waited: frozenset[str] | None = None) -> frozenset[str]:
    """Positive-cost compute that no collective some compute waits for depends on (weight
    gradients: they feed only gradient reductions and the graph's outputs). ``waited``:
    :func:`waited_collectives`, when the caller has it."""
    fed = 0  # ancestors of collectives whose wait feeds positive-cost compute
    for c in waited_collectives(problem) if waited is None else waited:
        fed |= problem.ancestors[problem.index[c]]
    return frozenset(op.name for i, op in enumerate(problem.ops)
                     if op.kind is OpKind.COMPUTE and op.runtime_ns > 0 and not fed >> i & 1)


def defer_independent(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                      max_moves: int = 16, tries_per_move: int = 12, deadline: float | None = None) -> Schedule:
    """Improve ``schedule`` by deferring independent compute past exposed collectives (see module doc).

    Exposed collectives are visited last-wait first; for each, suffixes of the non-ancestor ops
    before its issue are tried, holding about 1, 1.5, 2, ... times its exposed time of compute,
    and so are the latest earlier collectives together with their own non-ancestor compute.
    Each accepted move re-simulates; at most ``max_moves`` moves are kept. ``deadline`` (a
    ``time.perf_counter()`` value; None: none, the deterministic default) stops the search early.
    """
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    best, res = schedule, simulate(problem, schedule)
    runtime = {op.name: op.runtime_ns if op.kind is OpKind.COMPUTE else 0 for op in problem.ops}
    tried: set[tuple[str, ...]] = set()
    fillers = filler_ops(problem)
    for _ in range(max_moves):
        if deadline is not None and time.perf_counter() > deadline:
            log.info("defer_independent %s: deadline reached", problem.name)
            break
        exposed = [t for t in res.collectives if t.exposed_ns > 0 and t.members not in tried]
        if not exposed:
            break
        t = max(exposed, key=lambda t: t.wait_pos)
        tried.add(t.members)
        found = _best_move(problem, best, res, t, runtime, budget, tries_per_move, fillers)
        if found is not None:
            best, res = found
            tried.clear()  # the landscape changed: earlier collectives may now be movable
            log.debug("defer_independent %s: makespan %d ns", problem.name, res.makespan_ns)
    return best


def _best_move(problem: ScheduleProblem, sched: Schedule, res: SimResult, t, runtime: dict[str, int],
               budget: int, tries: int, fillers: frozenset[str]) -> tuple[Schedule, SimResult] | None:
    """The best deferral for timing ``t``: suffixes of growing non-ancestor compute before its
    issue; the latest ``fillers`` alone, growing, and the nearest one that covers the exposure
    (moving them delays no collective that compute waits for); and growing unions of the latest
    earlier collectives with their non-ancestor compute (see :func:`_private_seeds`). Candidates
    are ranked by makespan (no memory curve) and the fastest within ``budget`` is returned."""
    anc = 0
    for m in t.members:
        anc |= problem.ancestors[problem.index[m]] | (1 << problem.index[m])
    order = sched.order
    seed_sets: list[set[str]] = []
    targets = [t.exposed_ns * (1 + k / 2) for k in range(tries)]
    acc, k = 0, 0
    for pos in range(t.issue_pos - 1, -1, -1):
        if anc >> problem.index[order[pos]] & 1:
            continue
        acc += runtime[order[pos]]
        while k < len(targets) and acc >= targets[k]:
            seed_sets.append(_suffix_seeds(problem, order, anc, pos, t.issue_pos))
            k += 1
        if k == len(targets):
            break
    acc, k, latest = 0, 0, set()  # the latest fillers alone: moving them delays no waited-for collective
    single = None
    for pos in range(t.issue_pos - 1, -1, -1):
        op = order[pos]
        if op not in fillers or anc >> problem.index[op] & 1:
            continue
        if single is None and runtime[op] >= t.exposed_ns:
            single = {op}
        latest.add(op)
        acc += runtime[op]
        while k < 3 and acc >= targets[k]:
            seed_sets.append(set(latest))
            k += 1
        if k == 3 and single is not None:
            break
    if single is not None:
        seed_sets.append(single)
    union: set[str] = set()
    for seeds in _private_seeds(problem, order, anc, t.issue_pos, tries):
        union = union | seeds
        seed_sets.append(union)
    return fastest_deferral(problem, sched, res, t.issue_pos, seed_sets, budget)


def fastest_deferral(problem: ScheduleProblem, sched: Schedule, res: SimResult, issue_pos: int,
                     seed_sets: Iterable[set[str]], budget: int, deadline: float | None = None,
                     min_gain_ns: int = 0) -> tuple[Schedule, SimResult] | None:
    """Of the deferrals of each seed set past the issue at ``issue_pos`` (:func:`deferred`), the
    fastest within ``budget`` that beats ``res`` (the simulation of ``sched``) by more than
    ``min_gain_ns``, simulated; None if none does. Candidates are ranked by makespan (no memory
    curve), ties by their order, and only the best are simulated in full; ``deadline`` stops the
    ranking early."""
    d = Deferrals(problem, sched)
    ranked: list[tuple[int, int, np.ndarray]] = []
    for k, seeds in enumerate(seed_sets):
        if deadline is not None and time.perf_counter() > deadline:
            break
        if not seeds:
            continue
        at = d.valid_order(issue_pos, seeds)
        if at is not None and (ms := makespan_at(problem, at, sched.buckets)) < res.makespan_ns - min_gain_ns:
            ranked.append((ms, k, at))
    for _, _, at in sorted(ranked, key=lambda x: x[:2]):  # the fastest that fits the memory budget
        cand = d.schedule(at)
        r = simulate(problem, cand, check=False)  # valid by construction (deferred)
        if r.peak_memory_bytes <= budget:
            return cand, r
    return None


Move = Callable[[Schedule, SimResult, CollectiveTiming], "tuple[Schedule, SimResult] | None"]


def first_improvements(problem: ScheduleProblem, schedule: Schedule, name: str, max_moves: int,
                       deadline: float | None, key: Callable[[CollectiveTiming], tuple], best_move: Move) -> Schedule:
    """The local search that far deferral and single pulls share: up to ``max_moves`` times, the
    exposed collectives in ``key`` order, and the first whose ``best_move(schedule, its
    simulation, collective)`` finds a move (the new schedule, simulated) takes it; the search stops
    when none does, or at ``deadline`` (a ``time.perf_counter()`` value; None: none)."""
    best, res = schedule, simulate(problem, schedule)
    for _ in range(max_moves):
        found = None
        for t in sorted((t for t in res.collectives if t.exposed_ns > 0), key=key):
            if deadline is not None and time.perf_counter() > deadline:
                return best
            found = best_move(best, res, t)
            if found is not None:
                break
        if found is None:
            break
        best, res = found
        log.debug("%s %s: makespan %d ns", name, problem.name, res.makespan_ns)
    return best
