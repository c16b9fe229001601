"""Critical-path list scheduling: rebuild a free order that runs the longest remaining path first.

Entry point: :func:`critical_path_schedule`. In a tensor-parallel backward the activation-gradient
chain (compute, then a collective the next compute waits for, and so on) and the tail that
follows the last layer's gradient (the embedding's reduce-scatter, then its all-reduce) set the
makespan; weight gradients can run almost anywhere. :mod:`.pipeline` keeps the chain in the given
order. This pass reorders the chain too, by each op's *bottom level* (:func:`bottom_levels`):
the longest path from the op to the end of the graph, compute and collective runtimes summed (the
time that must still pass once the op starts, streams' contention aside).

On the execution model's clocks (:class:`.pipeline._Builder`: collectives issued as soon as their
inputs exist, waits placed when an op needs them or once their collective has ended), each time
the compute stream is free the builder runs:

* the candidate with the highest bottom level, when its inputs exist now;
* else (it would stall until ``a``) the ready op with the highest bottom level that ends by ``a``,
  or overshoots ``a`` by no more than the top candidate's slack ``L - a - bl(top)``, where ``L``
  (the critical path or the total compute, whichever is longer) bounds the makespan from below;
* else nothing: the stream stalls for the top candidate.
* ``backlog_ns``: when the ready ops with more than ``backlog_ns`` of slack add up to more than
  ``backlog_ns``, the first of them in the given order runs instead. Deferred compute keeps its
  inputs live, and its gradient reductions would pile up on their group's stream at the end.

Memory: bottom levels pull ready work forward and defer weight gradients, which can raise the
peak. A rebuild over the budget is retried with the given (within-budget) order kept over a window
of ops ending at its first position over the budget, and that window widened when the position
is hit again (:func:`.pipeline.widen_keep`, as :func:`.pipeline.pipeline_fillers` does). Each
rebuild is scored by the simulator; the fastest within the budget is kept when it beats the input.
The result is valid by construction, like the pipeline's.
"""

from __future__ import annotations

import heapq
import logging
import time

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.simulator import simulate
from .overlap import original_peak
from .pipeline import _Builder, widen_keep
from .reorder import waited_collectives

log = logging.getLogger(__name__)

BACKLOG_MULTIPLES = (None, 8)  # backlog settings tried, in medians of the collectives compute waits for
KEEP_WINDOW = 5  # ops of the given order kept before a position over the budget, per retry
MAX_BUILDS = 400  # rebuilds per call on graphs of up to REF_OPS ops (fewer on larger ones)
REF_OPS = 2500


def bottom_levels(problem: ScheduleProblem, buckets: tuple[tuple[str, ...], ...] = ()) -> dict[str, int]:
    """Per op: the longest path (ns) from its start to the end of the graph, counting compute
    runtimes and collective runtimes (a bucket member counts its whole bucket's runtime); waits
    and zero ops add nothing. One reverse pass over the problem's (topological) order."""
    bucket_of = {m: b for b in buckets for m in b}
    out: dict[str, int] = {}
    for op in reversed(problem.ops):
        if op.kind is OpKind.COMPUTE:
            own = op.runtime_ns
        elif op.kind is OpKind.COLLECTIVE:
            own = problem.bucket_runtime_ns(bucket_of.get(op.name, (op.name,)))
        else:
            own = 0
        out[op.name] = own + max((out[u] for u in problem.users[op.name]), default=0)
    return out


class _CriticalPathBuilder(_Builder):
    """One critical-path rebuild (see module doc); ``keep`` ranges keep the given order.

    Candidates sit in heaps (lazy deletion: a name no longer in ``cands`` was placed), so a pick
    costs a few heap operations, not a scan of every candidate (thousands on an 80-layer graph).
    The backlog set (ready ops with bottom level under ``bound - t - backlog``) only loses members
    as the clock advances, so it is kept incrementally too.
    """

    def __init__(self, problem: ScheduleProblem, sched: Schedule, bl: dict[str, int], bound_ns: int,
                 backlog_ns: int | None, keep: tuple[tuple[int, int], ...] = ()):
        super().__init__(problem, sched, frozenset(), None, False, keep)
        self.bl, self.bound_ns, self.critical_backlog_ns = bl, bound_ns, backlog_ns
        self.waiting: list[tuple[int, int, str]] = []  # (when its inputs exist, index, name)
        self.ready: list[tuple[int, int, str]] = []  # (-bottom level, index, name): inputs exist now
        self.by_level: list[tuple[int, int, str]] = []  # (-bottom level, index, name): every candidate
        self.backlog: set[str] = set()
        self.backlog_ns_sum = 0
        self.backlog_by_level: list[tuple[int, int, str]] = []
        self.backlog_by_rank: list[tuple[int, str]] = []

    def _became_ready(self, name: str) -> None:
        super()._became_ready(name)
        if name in self.cands:
            i = self.p.index[name]
            heapq.heappush(self.waiting, (self.cands[name], i, name))
            heapq.heappush(self.by_level, (-self.bl[name], i, name))

    def _advance(self) -> None:
        """Move candidates whose inputs now exist to ``ready``; update the backlog set."""
        backlog = self.critical_backlog_ns
        threshold = None if backlog is None else self.bound_ns - self.t - backlog
        while self.waiting and self.waiting[0][0] <= self.t:
            _, i, name = heapq.heappop(self.waiting)
            if name not in self.cands:  # placed already (a stall for it, or a kept range)
                continue
            item = (-self.bl[name], i, name)
            heapq.heappush(self.ready, item)
            if threshold is not None and self.bl[name] < threshold:
                self.backlog.add(name)
                self.backlog_ns_sum += self.ops[name].runtime_ns
                heapq.heappush(self.backlog_by_level, item)
                heapq.heappush(self.backlog_by_rank, (self.rank[name], name))
        while threshold is not None and self.backlog_by_level and (
                self.backlog_by_level[0][2] not in self.backlog or -self.backlog_by_level[0][0] >= threshold):
            self._leave_backlog(heapq.heappop(self.backlog_by_level)[2])

    def _leave_backlog(self, name: str) -> None:
        if name in self.backlog:
            self.backlog.remove(name)
            self.backlog_ns_sum -= self.ops[name].runtime_ns

    def _taken(self, name: str) -> str:
        self._leave_backlog(name)
        return name

    def _pick(self) -> str:
        if any(lo <= len(self.out) < hi for lo, hi in self.keep):
            name = self._top(self.all_heap)
            assert name is not None
            return self._taken(name)
        self._advance()
        t, cands = self.t, self.cands
        backlog = self.critical_backlog_ns
        if backlog is not None and self.backlog_ns_sum > backlog:
            heap = self.backlog_by_rank
            while heap[0][1] not in self.backlog:
                heapq.heappop(heap)
            return self._taken(heap[0][1])
        while self.by_level[0][2] not in cands:
            heapq.heappop(self.by_level)
        top = self.by_level[0][2]
        at = cands[top]
        if at <= t:
            return self._taken(top)
        slack = max(0, self.bound_ns - at - self.bl[top])
        popped, choice = [], top
        while self.ready:  # ready ops by bottom level: the first that ends within the slack
            item = heapq.heappop(self.ready)
            if item[2] not in cands:
                continue
            popped.append(item)
            if t + self.ops[item[2]].runtime_ns - at <= slack:
                choice = item[2]
                break
        for item in popped:
            heapq.heappush(self.ready, item)
        return self._taken(choice)


def critical_path_order(problem: ScheduleProblem, schedule: Schedule, *, backlog_ns: int | None = None,
                        keep: tuple[tuple[int, int], ...] = (), bl: dict[str, int] | None = None) -> Schedule:
    """One critical-path rebuild of ``schedule``'s order, keeping its buckets (see module doc);
    compute keeps the given order while the number of ops placed is in a ``keep`` range."""
    bl = bottom_levels(problem, schedule.buckets) if bl is None else bl
    return _CriticalPathBuilder(problem, schedule, bl, _bound(problem, bl), backlog_ns, keep).build()


def _bound(problem: ScheduleProblem, bl: dict[str, int]) -> int:
    """``L``: the critical path or the total compute, whichever is longer (module doc)."""
    compute = sum(op.runtime_ns for op in problem.ops if op.kind is OpKind.COMPUTE)
    return max(max(bl.values(), default=0), compute)


def default_max_builds(problem: ScheduleProblem) -> int:
    """MAX_BUILDS, scaled down past REF_OPS ops (each rebuild and its simulation cost grow with them)."""
    return max(4, MAX_BUILDS * min(REF_OPS, len(problem.ops)) // max(1, len(problem.ops)))


def critical_path_schedule(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                           deadline: float | None = None, max_builds: int | None = None) -> Schedule:
    """The fastest critical-path rebuild of ``schedule`` within the memory budget, or ``schedule``.

    Tried: each backlog of ``BACKLOG_MULTIPLES`` (None: no backlog rule; else that many medians of
    the collectives compute waits for); a rebuild over the budget is retried with the given order
    kept in widening windows (module doc). A setting whose unconstrained rebuild does not beat the
    best so far stops there. At most ``max_builds`` rebuilds in all (default ``MAX_BUILDS``, scaled
    down past ``REF_OPS`` ops; a count, so that the result does not depend on the machine), shared
    evenly, a setting's unused ones going to the next; ``deadline`` (a ``time.perf_counter()``
    value) stops earlier.
    """
    if not problem.collectives:
        return schedule
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    if max_builds is None:
        max_builds = default_max_builds(problem)
    bl = bottom_levels(problem, schedule.buckets)
    bound = _bound(problem, bl)
    waited = waited_collectives(problem)
    times = sorted(c.runtime_ns for c in problem.collectives if c.name in waited) or [0]
    median = times[len(times) // 2]
    best, res = schedule, simulate(problem, schedule)
    left = max_builds
    for i, mult in enumerate(BACKLOG_MULTIPLES):
        backlog = None if mult is None else mult * median
        keep: tuple[tuple[int, int], ...] = ()
        for _ in range(max(1, left // (len(BACKLOG_MULTIPLES) - i))):  # a setting's unused builds go on
            if deadline is not None and time.perf_counter() > deadline:
                return best
            left -= 1
            cand = _CriticalPathBuilder(problem, schedule, bl, bound, backlog, keep).build()
            if check_schedule(problem, cand):  # a bucket the rebuild could not keep together
                break
            r = simulate(problem, cand, check=False)
            log.debug("critical_path %s: backlog %s keep %d windows: makespan %d ns, peak %d",
                      problem.name, backlog, len(keep), r.makespan_ns, r.peak_memory_bytes)
            if not keep and r.makespan_ns >= res.makespan_ns:
                break  # the unconstrained rebuild is the fastest of the setting's, mostly
            if r.peak_memory_bytes <= budget:
                if r.makespan_ns < res.makespan_ns:
                    best, res = cand, r
                break
            over = next(k for k, m in enumerate(r.memory_curve) if m > budget)
            keep = widen_keep(keep, over, KEEP_WINDOW, grow=True)
    if best is not schedule:
        log.info("critical_path %s: makespan %d ns", problem.name, res.makespan_ns)
    return best
