"""Filler pipelining: rebuild a free order in which weight gradients wait for stalls (free order).

Entry point: :func:`pipeline_fillers`. In a tensor-parallel backward every activation-gradient
collective sits on the critical chain: the compute after its wait needs it and the compute
before its issue feeds it, so only *filler* compute (:func:`.reorder.filler_ops`: weight
gradients, which no waited-for collective depends on) can hide it. A block's weight gradients
become ready only after the block's own collectives, so hiding the next block's collectives
needs them held back by about one block: a software pipeline. Greedy passes that move one op at
a time rarely find it, since every filler moved uncovers the stall it was hiding.

This pass rebuilds the program order on the execution model's clocks instead:

* collectives (whole buckets, when every member is ready) are issued as soon as their inputs
  exist, and copy-ins priced as the simulator prices them;
* a wait is placed when an op needs its result, or once its collective has ended (which frees
  its buffers without a stall);
* chain compute (everything but fillers) runs in the given order (which placed the prefetches);
* fillers run while the next chain op would stall: first the oldest that fits the stall,
  else (with ``overshoot``) the oldest; and whenever the ready fillers add up to more than
  ``backlog_ns`` (held-back fillers keep their inputs live: the knob trades overlap for memory).

The result is valid by construction (an op is placed only after all its dependencies, bucket
members are issued together before any of their waits). Each setting is scored by the
simulator; the fastest within the memory budget is kept when it beats the input
(:func:`pipeline_fillers`, which also narrows the pipelining where memory runs over).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterable

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, check_schedule, issued_units
from ..solver.simulator import copy_in_ns, copy_out_ns, simulate
from .overlap import original_peak
from .reorder import filler_ops, waited_collectives

log = logging.getLogger(__name__)


class _Builder:
    """One construction of the pipelined order (see module doc)."""

    def __init__(self, problem: ScheduleProblem, sched: Schedule, fillers: frozenset[str],
                 backlog_ns: int | None, overshoot: bool, keep: tuple[tuple[int, int], ...] = ()):
        self.p, self.fillers, self.backlog_ns, self.overshoot = problem, fillers, backlog_ns, overshoot
        self.keep = keep  # (lo, hi): while lo <= ops placed < hi, compute keeps the given order
        self.ops = problem.op_by_name
        self.rank = {n: i for i, n in enumerate(sched.order)}  # tie-break: the given order
        self.multi_dtype = sched.multi_dtype
        self.bucket_of = {m: b for b in sched.buckets for m in b}
        self.unsat = {op.name: len(op.deps) for op in problem.ops}
        self.placed: set[str] = set()
        self.pseudo: set[str] = set()  # waits of issued collectives, and zero ops behind them: placed on demand
        self.out: list[str] = []
        self.t = 0
        self.group_free: dict[str, int] = {}
        self.end_of: dict[str, int] = {}  # collective -> its bucket's end
        self.waited: set[tuple[str, ...]] = set()  # buckets whose copy-out already ran
        self.cands: dict[str, int] = {}  # compute whose inputs exist or are being communicated -> when they exist
        self.ready_colls: dict[str, int] = {}  # likewise for collectives
        self.pending_waits: list[tuple[int, int, str]] = []  # (end, rank, wait) of pseudo waits
        self.chain_heap: list[tuple[int, str]] = []  # chain candidates by rank (lazy deletion)
        self.fill_later: list[tuple[int, int, str]] = []  # fillers not ready yet, by ready time
        self.fill_now: list[tuple[int, str]] = []  # fillers ready now, by rank
        self.fill_now_ns = 0  # their summed runtime
        self.all_heap: list[tuple[int, str]] = []  # every candidate by rank (keep windows)

    # ---------------------------------------------------------------- readiness
    def _need(self, name: str) -> tuple[int, list[str]]:
        """When the unplaced pseudo ops ``name`` needs exist (their waits' ends) and those ops, in
        dependency order."""
        ready, chain, seen = 0, [], set()
        stack = [d for d in self.ops[name].deps if d in self.pseudo]
        while stack:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            chain.append(d)
            op = self.ops[d]
            if op.kind is OpKind.WAIT:
                ready = max(ready, self.end_of[op.waits_on])  # type: ignore[index]
            stack.extend(x for x in op.deps if x in self.pseudo)
        chain.sort(key=self.p.index.__getitem__)  # the problem's order is topological
        return ready, chain

    def _satisfied(self, name: str) -> None:
        """``name`` was placed or became pseudo-ready: count it off for its users."""
        for u in self.p.users[name]:
            self.unsat[u] -= 1
            if self.unsat[u] == 0:
                self._became_ready(u)

    def _became_ready(self, name: str) -> None:
        op = self.ops[name]
        if op.kind is OpKind.COLLECTIVE:
            self.ready_colls[name] = self._need(name)[0]
        elif op.kind is OpKind.COMPUTE:
            at = self._need(name)[0]
            self.cands[name] = at
            r = self.rank[name]
            heapq.heappush(self.all_heap, (r, name))
            if name in self.fillers:
                heapq.heappush(self.fill_later, (at, r, name))
            else:
                heapq.heappush(self.chain_heap, (r, name))
        elif op.kind is OpKind.WAIT or any(d in self.pseudo for d in op.deps):
            self.pseudo.add(name)
            if op.kind is OpKind.WAIT:
                heapq.heappush(self.pending_waits, (self.end_of[op.waits_on], self.rank[name], name))  # type: ignore[index]
            self._satisfied(name)
        else:
            self._place(name)

    # ---------------------------------------------------------------- placing
    def _place(self, name: str) -> None:
        op = self.ops[name]
        self.out.append(name)
        self.placed.add(name)
        was_pseudo = name in self.pseudo
        self.pseudo.discard(name)
        if op.kind is OpKind.WAIT:
            members = self.bucket_of.get(op.waits_on, (op.waits_on,))  # type: ignore[arg-type]
            self.t = max(self.t, self.end_of[op.waits_on])  # type: ignore[index]
            if members not in self.waited:
                self.waited.add(members)
                self.t += copy_out_ns(self.p, members)
            return  # already counted off for its users when it became pseudo-ready
        self.t += op.runtime_ns if op.kind is OpKind.COMPUTE else 0
        if not was_pseudo:  # a pseudo op was counted off for its users when it became pseudo-ready
            self._satisfied(name)

    def _place_with_needs(self, name: str) -> None:
        for d in self._need(name)[1]:
            if d not in self.placed:
                self._place(d)
        self._place(name)

    def _issue(self, members: tuple[str, ...]) -> None:
        """Issue one collective or bucket now (placing the waits its inputs need: a stall)."""
        for m in members:
            for d in self._need(m)[1]:
                if d not in self.placed:
                    self._place(d)
        self.t += copy_in_ns(self.p, members)
        group = self.ops[members[0]].collective.group  # type: ignore[union-attr]
        end = max(self.t, self.group_free.get(group, 0)) + self.p.bucket_runtime_ns(members)
        self.group_free[group] = end
        for m in sorted(members, key=self.rank.__getitem__):
            del self.ready_colls[m]
            self.end_of[m] = end
            self._place(m)

    def _issuable(self, stall: bool) -> list[tuple[str, ...]]:
        """Buckets (or lone collectives) with every member ready, in the given order; without
        ``stall`` only those whose inputs need no wait on an unfinished collective."""
        out: list[tuple[str, ...]] = []
        for c in sorted(self.ready_colls, key=self.rank.__getitem__):
            members = self.bucket_of.get(c, (c,))
            if members in out or any(m not in self.ready_colls for m in members):
                continue
            if stall or all(self.ready_colls[m] <= self.t for m in members):  # waits on ended collectives: no stall
                out.append(members)
        return out

    def _flush_waits(self) -> bool:
        """Place the waits of collectives that have already ended (no stall): their inputs and
        buffers are freed there rather than at the end. True if any was."""
        done = []
        while self.pending_waits and self.pending_waits[0][0] <= self.t:
            done.append(heapq.heappop(self.pending_waits))
        for _, _, w in sorted(done, key=lambda x: x[1]):
            if w not in self.placed:
                self._place_with_needs(w)
        return bool(done)

    def _issue_ready(self) -> bool:
        """Issue every collective (bucket) whose inputs exist without a stall; True if any was."""
        ready = self._issuable(stall=False)
        for members in ready:
            self._issue(members)
        return bool(ready)

    # ---------------------------------------------------------------- the loop
    def build(self) -> Schedule:
        for op in self.p.ops:
            if not op.deps:
                self._became_ready(op.name)
        while True:
            while self._issue_ready() | self._flush_waits():
                pass
            if not self.cands:
                stalled = self._issuable(stall=True)  # collectives that need a wait first: take the stall
                if stalled:
                    self._issue(stalled[0])
                    continue
                break
            name = self._pick()
            del self.cands[name]
            self._place_with_needs(name)
        for name in sorted(self.pseudo | {o.name for o in self.p.ops if o.name not in self.placed},
                           key=self.p.index.__getitem__):
            if name not in self.placed:
                self.out.append(name)
                self.placed.add(name)
        return Schedule(tuple(self.out), tuple(dict.fromkeys(self.bucket_of.values())), self.multi_dtype)

    def _top(self, heap: list[tuple[int, str]]) -> str | None:
        """The live candidate with the least rank in ``heap`` (dropping placed ones)."""
        while heap and heap[0][1] not in self.cands:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def _take_filler(self, name: str) -> str:
        self.fill_now.remove((self.rank[name], name))
        heapq.heapify(self.fill_now)
        self.fill_now_ns -= self.ops[name].runtime_ns
        return name

    def _pick(self) -> str:
        """The next compute op: chain first; fillers in the chain's stalls or past the backlog."""
        while self.fill_later and self.fill_later[0][0] <= self.t:
            _, r, n = heapq.heappop(self.fill_later)
            heapq.heappush(self.fill_now, (r, n))
            self.fill_now_ns += self.ops[n].runtime_ns
        if any(lo <= len(self.out) < hi for lo, hi in self.keep):  # the given order, fillers included
            name = self._top(self.all_heap)
            assert name is not None
            if (self.rank[name], name) in self.fill_now:
                return self._take_filler(name)
            if name in self.fillers:
                self.fill_later.remove((self.cands[name], self.rank[name], name))
                heapq.heapify(self.fill_later)
            return name
        oldest = self.fill_now[0][1] if self.fill_now else None
        if oldest is not None and self.backlog_ns is not None and self.fill_now_ns > self.backlog_ns:
            return self._take_filler(oldest)
        best = self._top(self.chain_heap)
        if best is None:
            if oldest is not None:
                return self._take_filler(oldest)
            _, r, n = heapq.heappop(self.fill_later)  # only fillers left, none ready: the first to be
            return n
        stall = self.cands[best] - self.t
        if stall > 0 and oldest is not None:
            fits = next((n for _, n in sorted(self.fill_now) if self.ops[n].runtime_ns <= stall), None)
            if fits is not None:
                return self._take_filler(fits)
            if self.overshoot:
                return self._take_filler(oldest)
        return best


def pipeline_fillers_of(problem: ScheduleProblem, schedule: Schedule,
                        waited: frozenset[str] | None = None) -> frozenset[str]:
    """The fillers worth holding back: :func:`.reorder.filler_ops` less the ancestors of any
    collective (or bucket) that outlasts every collective some compute waits for (the output
    projection's gradient all-reduce, say): held back, they would push it to the end, exposed.
    ``waited``: :func:`.reorder.waited_collectives`, when the caller has it."""
    waited = waited_collectives(problem) if waited is None else waited
    fillers = filler_ops(problem, waited)
    units = issued_units(problem, schedule)
    rt = {u: problem.bucket_runtime_ns(u) for u in units}
    limit = max((rt[u] for u in units if any(m in waited for m in u)), default=0)
    urgent = 0
    for u in units:
        if rt[u] > limit:
            for m in u:
                urgent |= problem.ancestors[problem.index[m]]
    return frozenset(f for f in fillers if not urgent >> problem.index[f] & 1)


def pipelined_order(problem: ScheduleProblem, schedule: Schedule, *, backlog_ns: int | None = None,
                    overshoot: bool = True, fillers: Iterable[str] | None = None,
                    keep: tuple[tuple[int, int], ...] = ()) -> Schedule:
    """One pipelined rebuild of ``schedule``'s order, keeping its buckets (see module doc);
    compute keeps the given order while the number of ops placed is in a ``keep`` range."""
    fill = pipeline_fillers_of(problem, schedule) if fillers is None else frozenset(fillers)
    return _Builder(problem, schedule, fill, backlog_ns, overshoot, keep).build()


def pipeline_fillers(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                     deadline: float | None = None, retries: int = 60,
                     keep_windows: tuple[int, ...] = (10, 20, 30, 60)) -> Schedule:
    """The fastest pipelined rebuild of ``schedule`` within the memory budget, or ``schedule``.

    Tried: unlimited backlog without overshoot, then with it, then a backlog of 8 times the
    median collective that compute waits for. A rebuild over the budget is retried (at most
    ``retries`` times) with the given compute order kept over the ``keep_windows`` ops up to its
    first position over the budget (held-back fillers raised the memory there; a window that
    does not help reaches further back); the first setting is tried with each window.
    ``deadline`` (a ``time.perf_counter()`` value) stops the ladder early.
    """
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    waited_names = waited_collectives(problem)
    fillers = pipeline_fillers_of(problem, schedule, waited_names)
    if not fillers or not problem.collectives:
        return schedule
    best, res = schedule, simulate(problem, schedule)
    waited = sorted(c.runtime_ns for c in problem.collectives if c.name in waited_names) or [0]
    median = waited[len(waited) // 2]
    settings = [(None, False, w) for w in keep_windows] + [(None, True, keep_windows[-1]),
                                                           (8 * median, False, keep_windows[-1])]
    for backlog, overshoot, window in settings:
        keep: tuple[tuple[int, int], ...] = ()
        for _ in range(retries + 1):
            if deadline is not None and time.perf_counter() > deadline:
                return best
            cand = pipelined_order(problem, schedule, backlog_ns=backlog, overshoot=overshoot, fillers=fillers,
                                   keep=keep)
            if check_schedule(problem, cand):  # a bucket the rebuild could not keep together
                break
            r = simulate(problem, cand, check=False)
            log.debug("pipeline_fillers %s: backlog %s overshoot %s keep %s: makespan %d ns, peak %d",
                      problem.name, backlog, overshoot, keep, r.makespan_ns, r.peak_memory_bytes)
            if r.makespan_ns >= res.makespan_ns:
                break  # keeping more of the given order only slows it down further
            if r.peak_memory_bytes <= budget:
                best, res = cand, r
                break
            keep = widen_keep(keep, next(k for k, m in enumerate(r.memory_curve) if m > budget), window)
    return best


def widen_keep(keep: tuple[tuple[int, int], ...], over: int, window: int,
               grow: bool = False) -> tuple[tuple[int, int], ...]:
    """``keep`` ranges after a rebuild first ran over the budget at position ``over``: a new range of
    ``window`` ops ending there, or, when a range holds it already (what was held back before that
    range raised it), that range reaching ``window`` ops further back (with ``grow``: half its
    length, when that is more, so a long run over the budget takes fewer rebuilds)."""
    hit = [k for k, (lo, hi) in enumerate(keep) if lo <= over < hi]
    if hit:
        lo, hi = keep[hit[0]]
        reach = window if not grow else max(window, (hi - lo) // 2)
        return (*keep[:hit[0]], (max(0, lo - reach), hi), *keep[hit[0] + 1:])
    return (*keep, (max(0, over - window), over + 1))
