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

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.simulator import SimResult, simulate
from .overlap import original_peak

log = logging.getLogger(__name__)


def _deferred(problem: ScheduleProblem, sched: Schedule, members: tuple[str, ...], issue_pos: int,
              seeds: set[str]) -> Schedule:
    """``sched`` with ``seeds`` (non-ancestors of ``members`` before ``issue_pos``) and every op that
    depends on them up to the issue moved just after the issue, in their old relative order."""
    order = sched.order
    moved, kept, moved_bits = [], [], 0
    first = min(sched.order.index(s) for s in seeds)
    for pos in range(first, issue_pos + 1):
        op = order[pos]
        i = problem.index[op]
        if op in seeds or problem.ancestors[i] & moved_bits:
            moved.append(op)
            moved_bits |= 1 << i
        else:
            kept.append(op)
    new = order[:first] + tuple(kept) + tuple(moved) + order[issue_pos + 1:]
    return Schedule(order=new, buckets=sched.buckets, multi_dtype=sched.multi_dtype)


def _suffix_seeds(problem: ScheduleProblem, order: tuple[str, ...], anc: int, start: int, issue_pos: int) -> set[str]:
    """The non-ancestor compute in ``order[start:issue_pos]``."""
    return {op for op in order[start:issue_pos]
            if not anc >> problem.index[op] & 1 and problem.ops[problem.index[op]].kind is OpKind.COMPUTE}


def _private_seeds(problem: ScheduleProblem, order: tuple[str, ...], anc: int, issue_pos: int) -> list[set[str]]:
    """Per collective issued before ``issue_pos`` that is not an ancestor: the compute before the issue
    that is not an ancestor, with the collective itself, when that compute outlasts the collective;
    the latest issued first (moving compute from far back shrinks earlier overlap windows)."""
    pos = {op: i for i, op in enumerate(order[:issue_pos])}
    out = []
    for op in order[:issue_pos]:
        i = problem.index[op]
        o = problem.ops[i]
        if o.kind is not OpKind.COLLECTIVE or anc >> i & 1:
            continue
        a = problem.ancestors[i] & ~anc
        seeds = {problem.ops[j].name for j in _bits(a) if problem.ops[j].name in pos
                 and problem.ops[j].kind is OpKind.COMPUTE}
        if seeds:
            net = sum(problem.ops[problem.index[s]].runtime_ns for s in seeds) - o.runtime_ns
            if net > 0:
                out.append((-pos[op], seeds | {op}))
    out.sort(key=lambda x: x[0])
    return [s for _, s in out]


def _bits(mask: int):
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


def defer_independent(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                      max_moves: int = 16, tries_per_move: int = 12) -> Schedule:
    """Improve ``schedule`` by deferring independent compute past exposed collectives (see module doc).

    Exposed collectives are visited last-wait first; for each, suffixes of the non-ancestor ops
    before its issue are tried, holding about 1, 1.5, 2, ... times its exposed time of compute.
    Each accepted move re-simulates; at most ``max_moves`` moves are kept.
    """
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    best, res = schedule, simulate(problem, schedule)
    runtime = {op.name: op.runtime_ns if op.kind is OpKind.COMPUTE else 0 for op in problem.ops}
    tried: set[tuple[str, ...]] = set()
    for _ in range(max_moves):
        exposed = [t for t in res.collectives if t.exposed_ns > 0 and t.members not in tried]
        if not exposed:
            break
        t = max(exposed, key=lambda t: t.wait_pos)
        tried.add(t.members)
        found = _best_move(problem, best, res, t, runtime, budget, tries_per_move)
        if found is not None:
            best, res = found
            tried.clear()  # the landscape changed: earlier collectives may now be movable
            log.debug("defer_independent %s: makespan %d ns", problem.name, res.makespan_ns)
    return best


def _best_move(problem: ScheduleProblem, sched: Schedule, res: SimResult, t, runtime: dict[str, int],
               budget: int, tries: int) -> tuple[Schedule, SimResult] | None:
    """The best deferral for timing ``t``: suffixes of growing compute, and unions of the private
    compute of the best-netting earlier collectives (their compute minus their own comm time)."""
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
    union: set[str] = set()
    for seeds in _private_seeds(problem, order, anc, t.issue_pos)[:tries]:
        union = union | seeds
        seed_sets.append(union)
    found = None
    for seeds in seed_sets:
        if not seeds:
            continue
        cand = _deferred(problem, sched, t.members, t.issue_pos, seeds)
        if check_schedule(problem, cand):
            continue  # split a bucket's issue from another member's wait
        r = simulate(problem, cand)
        if r.peak_memory_bytes <= budget and r.makespan_ns < (found[1].makespan_ns if found else res.makespan_ns):
            found = (cand, r)
    return found
