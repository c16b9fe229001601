"""Fewer exposed collectives at no greater makespan: let a run of stalled waits stall once, and
fill the small stalls that a time-limited search leaves.

Entry point: :func:`concentrate_stalls`. Waiting on a collective stalls the compute stream until
it ends. When several waits follow each other with no compute between them (a schedule's tail,
say), the stream resumes when the latest of their collectives ends, whatever their order. But
in the order their collectives end, every wait shows a stall of its own and every one of those
collectives counts as exposed. Waiting on the latest-ending one first takes the whole stall;
the others have ended by then and are hidden. Makespan and exposed time stay the same; the
count of exposed collectives (DESIGN.md's "hidden" and "hideable" counts) drops.

Four moves, each scored by the simulator and kept only when the peak memory does not grow and
the makespan drops, or stays and more hideable collectives are hidden:

* **reorder a run**: each maximal run of waits, zero-cost ops and lone collective issues with two
  or more stalled waits becomes the waits and zero-cost ops its issues need (old order), its
  issues, its other waits latest end first, then its other zero-cost ops in their old order
  (zero-cost ops that read a wait come after it; an invalid order is rejected by the check);
* **sink then reorder**: a stalled wait, with what depends on it up to the first positive-cost
  compute that needs it, moves there (:func:`..heuristics.sink.sunk`) and may join a later run;
  else it moves just past the compute that covers its stall, so that a collective it feeds is
  held up no longer than that (on the tp_2x4 backward: 3 more hidden, 14 us shorter);
* **jump the queue**: a stalled collective that sat behind its group's backlog has the
  collectives queued ahead of it (issued before it, started after) issued just after it
  (:func:`jumped`); on the tensor-parallel backward a norm weight's 8.5 us gradient reduction,
  477 us exposed behind 1 ms of others, then runs at once (197 to 198 of 200 hidden, same
  makespan);
* **pull**: the first compute op after a stalled wait that does not need it (nor anything but
  zero-cost ops between them) and lasts at least the stall moves just before the wait, else the
  first such ops that last that long together (:func:`pulled`). CP-SAT's window rounds stop on time, and their answers keep such stalls of a
  few microseconds (on the tensor-parallel backward's answers, 6.9 us under 148 us collectives):
  pulls took one answer from 190 to 196 of 200 hidden and 56.43 to 56.32 ms.
"""

from __future__ import annotations

import logging
import time

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.simulator import CollectiveTiming, SimResult, simulate
from .sink import sunk

log = logging.getLogger(__name__)


def _end_by_wait(problem: ScheduleProblem, res: SimResult) -> dict[str, int]:
    """Each wait op's collective end time (a bucket's members share the bucket's)."""
    wait_of = problem.wait_of
    return {wait_of[m]: t.end_ns for t in res.collectives for m in t.members}


def _runs(problem: ScheduleProblem, order: tuple[str, ...], bucketed: frozenset[str] = frozenset()
          ) -> list[tuple[int, int]]:
    """Maximal ``[start, stop)`` position ranges holding only waits, zero-cost ops and lone
    collectives (not in ``bucketed``: a bucket's issue runs its copy-in), two waits or more."""
    ops = problem.op_by_name
    out, start, waits = [], None, 0
    for p, name in enumerate(order + ("",)):
        kind = ops[name].kind if name else None
        if kind in (OpKind.WAIT, OpKind.ZERO) or (kind is OpKind.COLLECTIVE and name not in bucketed):
            start = p if start is None else start
            waits += kind is OpKind.WAIT
            continue
        if start is not None and waits >= 2:
            out.append((start, p))
        start, waits = None, 0
    return out


def reordered_runs(problem: ScheduleProblem, schedule: Schedule, res: SimResult) -> Schedule:
    """``schedule`` with every run of waits that stalls more than once ordered latest end first.

    A lone collective issued inside the run (the last gradient reduction of a backward, say)
    goes first, after the waits and zero-cost ops it needs (in their old order), so that it no
    longer splits the run; when it needs a wait of one issued in the run, the issues stay and
    only the waits between them are reordered."""
    ops, index = problem.op_by_name, problem.index
    end = _end_by_wait(problem, res)
    stalled = {problem.wait_of[m] for t in res.collectives if t.exposed_ns > 0 for m in t.members}
    order = list(schedule.order)

    def latest_first(run: list[str]) -> list[str]:
        waits = sorted((n for n in run if ops[n].kind is OpKind.WAIT), key=lambda n: -end[n])  # stable
        return waits + [n for n in run if ops[n].kind is not OpKind.WAIT]

    for a, b in _runs(problem, schedule.order, frozenset(m for bk in schedule.buckets for m in bk)):
        run = order[a:b]
        if sum(n in stalled for n in run) < 2:
            continue
        issues = [n for n in run if ops[n].kind is OpKind.COLLECTIVE]
        feeds = 0  # ancestors of the run's issues
        for n in issues:
            feeds |= problem.ancestors[index[n]]
        first = [n for n in run if feeds >> index[n] & 1 and ops[n].kind is not OpKind.COLLECTIVE]
        if any(ops[n].waits_on in issues for n in first):
            cuts = [0, *(k for k, n in enumerate(run) if n in issues), len(run)]
            order[a:b] = [n for x, y in zip(cuts, cuts[1:]) for n in latest_first(run[x:y])]
            continue
        order[a:b] = first + issues + latest_first([n for n in run if n not in first and n not in issues])
    return Schedule(tuple(order), schedule.buckets, schedule.multi_dtype)


def pulled(problem: ScheduleProblem, schedule: Schedule, wait_pos: int, stall_ns: int, reach: int = 64,
           keep_heavy_order: bool = False, accumulate: bool = False, keep_compute_order: bool = False
           ) -> Schedule | None:
    """``schedule`` with compute from the ``reach`` positions after the stalled wait at ``wait_pos``
    that can run before it moved just before the wait, with the zero-cost ops between them that
    it needs: the first op that lasts at least ``stall_ns``, or with ``accumulate`` the first ops
    in order until they last that long together; None when there are none. CP-SAT's answers keep
    stalls of a few microseconds where compute ready before the wait runs just after it.
    ``keep_heavy_order`` (fixed heavy-compute order): a heavy op never passes another;
    ``keep_compute_order``: no compute op passes another (the scan stops at the first that stays)."""
    order, ops, index = schedule.order, problem.ops, problem.index
    moved: set[str] = set()
    total, passed_heavy = 0, False  # passed_heavy: a heavy op that stays lies between
    for q in range(wait_pos + 1, min(len(order), wait_pos + 1 + reach)):
        op = ops[index[order[q]]]
        fits = op.runtime_ns >= stall_ns or (accumulate and op.runtime_ns > 0)
        if op.kind is OpKind.COMPUTE and fits and not (op.heavy and passed_heavy):
            anc = problem.ancestors[index[op.name]]  # what it needs from the wait on: the ops there it depends on
            need = [n for n in order[wait_pos:q] if anc >> index[n] & 1 and n not in moved]
            # it may not need the wait, nor compute, a collective or another wait that stays
            if all(ops[index[n]].kind is OpKind.ZERO for n in need):
                moved |= set(need) | {op.name}
                total += op.runtime_ns
                if total >= stall_ns:
                    new = order[:wait_pos] + tuple(n for n in order[wait_pos:q + 1] if n in moved) + tuple(
                        n for n in order[wait_pos:] if n not in moved)
                    return Schedule(new, schedule.buckets, schedule.multi_dtype)
                continue
        if keep_compute_order and op.kind is OpKind.COMPUTE:
            return None
        passed_heavy = passed_heavy or (keep_heavy_order and op.heavy)
    return None


def jumped(schedule: Schedule, res: SimResult, stalled: CollectiveTiming) -> Schedule | None:
    """``schedule`` with the units of ``stalled``'s group that wait in its FIFO when it is issued
    (issued before it, started no earlier) issued just after it instead, keeping their order; None
    when there are none. A short collective stuck behind its group's backlog (a norm weight's
    gradient reduction ahead of tensor parallelism's all-reduce, say) then runs at once; where
    the group's stream stays busy, the backlog ends when it did. Only issue ops move, later,
    and nothing but their waits depends on them; a wait they would pass fails the check."""
    ahead = {u.issue_pos for u in res.collectives
             if u.group == stalled.group and u.issue_pos < stalled.issue_pos and u.start_ns >= stalled.issue_ns}
    if not ahead:
        return None
    order = schedule.order
    moved = tuple(order[q] for q in sorted(ahead))
    kept = [n for q, n in enumerate(order) if q not in ahead]
    k = kept.index(order[stalled.issue_pos]) + 1
    return Schedule(tuple(kept[:k]) + moved + tuple(kept[k:]), schedule.buckets, schedule.multi_dtype)


def _kept(problem: ScheduleProblem, cand: Schedule, res: SimResult) -> SimResult | None:
    """``cand``'s result when it is valid, no higher in peak than ``res``, and shorter, or as
    long and hiding more hideable collectives; else None."""
    if check_schedule(problem, cand):
        return None
    r = simulate(problem, cand)
    if r.peak_memory_bytes > res.peak_memory_bytes:
        return None
    if r.makespan_ns < res.makespan_ns or (r.makespan_ns == res.makespan_ns
                                           and r.n_hidden_hideable > res.n_hidden_hideable):
        return r
    return None


def concentrate_stalls(problem: ScheduleProblem, schedule: Schedule, *, max_tries: int = 64,
                       deadline: float | None = None, keep_heavy_order: bool = False,
                       jump: bool = True) -> Schedule:
    """``schedule`` with a shorter makespan or fewer exposed hideable collectives, at no greater
    makespan or peak memory.

    First the runs of stalled waits are reordered; then each stalled wait, most exposed first and
    at most ``max_tries`` of them, is tried sunk to the compute that needs it with the runs
    reordered again, else sunk just past its stall, else let jump its group's queue
    (:func:`jumped`), else with compute pulled in front of it
    (:func:`pulled`; with ``keep_heavy_order``, no heavy op passes another). ``deadline`` (a ``time.perf_counter()``
    value) stops the tries early: a try starts only if the longest one so far would end by it.
    ``jump=False`` leaves the queue jumps out: a search that polishes each of its incumbents keeps
    them for its answer, since a jump that only hides more reorders a group's FIFO, which steers
    the search (on the tensor-parallel backward, jumps in every polish of a deterministic 60 s
    solve ended 31 us longer, with no more hidden, than jumps in the answer's polish alone).
    """
    if deadline is not None and time.perf_counter() > deadline:
        return schedule  # each pass simulates the whole graph (a third of a second at 80 layers)
    t_sim = time.perf_counter()
    best, res = schedule, simulate(problem, schedule)
    guess = 4 * (time.perf_counter() - t_sim)  # a try simulates up to four times, until one is timed
    longest = 0.0
    cand = reordered_runs(problem, best, res)
    if cand.order != best.order and (r := _kept(problem, cand, res)) is not None:
        best, res = cand, r
    tried: set[str] = set()
    t_try = None
    for _ in range(max_tries):
        now = time.perf_counter()
        if t_try is not None:
            longest = max(longest, now - t_try)
        t_try = now
        stalled = [t for t in res.collectives if t.exposed_ns > 0]
        untried = sorted((t for t in stalled if t.members[0] not in tried), key=lambda t: -t.exposed_ns)
        if not untried or (deadline is not None and now + (longest or guess) > deadline):
            break
        t = untried[0]
        tried.add(t.members[0])
        kept = None
        for cover in (None, t.exposed_ns):  # to the compute that needs it, else just past the stall
            moved = sunk(problem, best, t.wait_pos, cover)
            if moved is not None:
                cand = reordered_runs(problem, moved, simulate(problem, moved))
                if (kept := _kept(problem, cand, res)) is not None:
                    best, res = cand, kept
                    break
        if kept is not None:
            continue
        if jump and t.fifo_delay_ns > 0:
            cand = jumped(best, res, t)
            if cand is not None and (kept := _kept(problem, cand, res)) is not None:
                best, res = cand, kept
                continue
        for accumulate in (False, True):  # one op that covers the stall, else the first ones that do
            cand = pulled(problem, best, t.wait_pos, t.exposed_ns, keep_heavy_order=keep_heavy_order,
                          accumulate=accumulate)
            if cand is not None and (r := _kept(problem, cand, res)) is not None:
                best, res = cand, r
                break
    if best is not schedule:
        log.debug("concentrate_stalls %s: %d of %d hideable collectives hidden", problem.name,
                  res.n_hidden_hideable, res.n_hideable)
    return best
