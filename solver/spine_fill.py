"""Spine fill: compute reassigned to the windows of the longest collective chain at once (free order).

Entry point: :func:`spine_fill`. In a tensor-parallel backward the activation-gradient chain
issues a collective, waits for it, computes the next gradient, issues the next collective, and
so on. Each of these collectives is hidden only by compute that needs neither it nor anything
after it, run between its issue and its wait: weight gradients, mostly, and there is barely
enough of them. The searches before this one move such compute a few positions at a time and
stop where every move that closes one stall opens another: on the tp_2x4 backward the
count-first polish (:mod:`..heuristics.hide`) ends at 185 of 198 hidden, and at 192 or 193 with
any makespan slack. Here the chain splits the order into slots (before the first issue, then the
window of each chain collective and the gap after its wait, in turn), every other op gets a
slot, and one CP-SAT model chooses them all:

* **variables**: each op's slot, within ``radius`` of the incumbent's and within what its
  dependencies on the chain allow;
* **constraints**: dependencies (no op in an earlier slot than an input), a bucket's waits no
  earlier than its issues, and memory, exactly: the bytes live at an op in a slot (each storage
  from its allocator to its last reader, ops in a slot in the incumbent's order) at most the
  budget, at every chain op from the start and, lazily, at the highest ops of each slot where a
  decoded order peaks over it (then the model is solved again, keeping every cut). Three
  keep the makespan: a long collective of the chain's group off the chain (the tp backward's
  2.15 ms all-reduce) keeps its slot and no more compute before it, and a chain window behind
  it in the group's queue counts as covered only when the compute from its issue lasts the
  queue too; and the windows' deficits (runtime their compute misses) sum to no more than the
  incumbent's, so covering one window does not stall another longer;
* **objective**: the chain windows whose compute is shorter than their collective first, then
  how far the ops move from the incumbent's slots.

The order is decoded slot by slot, each slot's ops in the incumbent's order, so it is valid by
construction. :func:`.cpsat.solve` polishes it and keeps it only if it hides more collectives
at no longer a makespan. It is off by default (``SolveConfig.spine_share``): the model does
not see the windows of the collectives off the chain (the FSDP group's), and their stalls
mostly cost more than the chain gains. From the tp_2x4 backward's 60 s answer (185 of 198
hidden, 31,200.3 us), 30 s of it and the polish hid 186 at 31,193.1 us (benchmarks/RESULTS.md,
slack sweep); from another (185 at 31,192.6 us), six 60 s runs hid 190 to 194, at 31.33 to
31.96 ms, longer than the answer. Since every variable is hinted, rounds of 30 s each from the
last polished order (what :func:`.cpsat.solve` runs) hid 189 at 31,167.5 us, then 191 at
31,147.0 us, both shorter than that answer, then 193 at 31,282.6 us.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from .cpsat_config import SPINE_RADIUS, SolveConfig, make_solver
from .problem import OpKind, ScheduleProblem, bit_mask
from .schedule import Schedule
from .sim_tables import sim_tables
from .simulator import memory_curve, simulate

log = logging.getLogger(__name__)

# one slot variable per op and a chain of up to a few hundred collectives: above this the model
# (and the per-chain-op dependency masks) outgrow a solve's polish share
SPINE_MAX_OPS = 6_000
CUT_ROUNDS = 8  # solves that peaked over the budget (each then cuts its peaks) before a fill gives up
MAX_SOLVES = 32  # solves of one fill, each with a new seed and every cut before it
CUTS_PER_SLOT = 3  # the highest ops of a slot that peaked, each cut where it sits
# a collective of the chain's group off the chain at least this share of the chain's longest is
# held in its slot, and the chain windows queued behind it must cover its runtime too
HELD_SHARE = 0.5


@dataclass(frozen=True)
class Spine:
    """The chain: lone collectives, each depending on the previous one's wait."""

    chain: tuple[str, ...]
    issue: tuple[int, ...]  # op index of each chain collective
    wait: tuple[int, ...]  # op index of its wait

    @property
    def n_slots(self) -> int:
        """Before the first issue, then per chain collective its window and the gap after its wait."""
        return 2 * len(self.chain) + 1


def spine_of(problem: ScheduleProblem, sched: Schedule) -> Spine | None:
    """The chain of ``sched``'s lone collectives with the most runtime (None: fewer than two)."""
    bucketed = {m for b in sched.buckets for m in b}
    index, anc, wait_of = problem.index, problem.ancestors, problem.wait_of
    cols = sorted((c for c in problem.collectives if c.name not in bucketed), key=lambda c: index[c.name])
    best: dict[str, int] = {}
    prev: dict[str, str | None] = {}
    for c in cols:
        a, top, arg = anc[index[c.name]], 0, None
        for d in best:  # only earlier collectives can feed c
            if a >> index[wait_of[d]] & 1 and best[d] > top:
                top, arg = best[d], d
        best[c.name], prev[c.name] = top + c.runtime_ns, arg
    if not best:
        return None
    last: str | None = max(best, key=lambda n: (best[n], -index[n]))
    chain: list[str] = []
    while last is not None:
        chain.append(last)
        last = prev[last]
    if len(chain) < 2:
        return None
    chain.reverse()
    return Spine(tuple(chain), tuple(index[c] for c in chain), tuple(index[wait_of[c]] for c in chain))


class SpineModel:
    """The slot model of one incumbent (see the module doc): variables / constraints / objective."""

    def __init__(self, problem: ScheduleProblem, sched: Schedule, spine: Spine, budget_bytes: int, radius: int):
        self.problem, self.sched, self.spine = problem, sched, spine
        self.budget, self.radius = budget_bytes, radius
        self.model = cp_model.CpModel()
        n = len(problem.ops)
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[[problem.index[name] for name in sched.order]] = np.arange(n)
        # incumbent positions of the chain ops, in order (each starts a slot)
        bounds = np.array([self.pos[i] for pair in zip(spine.issue, spine.wait) for i in pair])
        self.inc = np.searchsorted(bounds, self.pos, side="right")  # each op's incumbent slot
        self.fixed = {i: 2 * t + 1 for t, i in enumerate(spine.issue)} | {i: 2 * t + 2 for t, i in enumerate(spine.wait)}
        # an op's place inside its slot, as decoded: a chain op first, the rest in the incumbent's order
        self.rank = self.pos + np.where(np.isin(np.arange(n), list(self.fixed)), 0, n)
        self.held = self._held()
        self.runtime = sim_tables(problem).runtime
        self.compute_ops = [j for j in range(n) if self.runtime[j] > 0 and j not in self.fixed]  # what fills windows
        self.storages = self._lifetimes()
        self.slot: list[object] = []  # per op: an int (fixed) or an IntVar
        self.dom: list[tuple[int, int]] = []
        self.cover: list[cp_model.IntVar] = []
        self.moves: list[cp_model.IntVar] = []
        self.solved: list[int] | None = None
        self._ge: dict[tuple[int, int], object] = {}
        self._cuts: dict[tuple[int, int], int] = {}
        # every variable with its value under given slots: the hint is complete (CP-SAT starts from
        # a solution instead of searching for one; a round that found none in its time ended the fill)
        self._values: list[tuple[object, Callable[[list[int]], int]]] = []

    def _held(self) -> tuple[int, ...]:
        """Lone collectives of the chain's group off the chain, at least HELD_SHARE of its longest."""
        p, chain = self.problem, set(self.spine.chain)
        groups = Counter(p.op_by_name[c].collective.group for c in self.spine.chain)  # type: ignore[union-attr]
        group = groups.most_common(1)[0][0]
        longest = max(p.op_by_name[c].runtime_ns for c in chain)
        bucketed = {m for b in self.sched.buckets for m in b}
        return tuple(p.index[c.name] for c in p.collectives
                     if c.name not in chain and c.name not in bucketed and c.collective.group == group  # type: ignore[union-attr]
                     and c.runtime_ns >= HELD_SHARE * longest)

    def _var(self, lo: int, hi: int, value: Callable[[list[int]], int]):
        """A new variable (a literal when ``hi`` is 1) and its value under given slots, for :meth:`hint`."""
        var = self.model.NewBoolVar("") if (lo, hi) == (0, 1) else self.model.NewIntVar(lo, hi, "")
        self._values.append((var, value))
        return var

    def hint(self, slots: list[int]) -> None:
        """Hint every variable with its value under ``slots`` (the incumbent's: valid under every cut)."""
        self.model.ClearHints()
        for var, value in self._values:
            self.model.AddHint(var, value(slots))  # type: ignore[arg-type]

    def uncovered_at(self, slots: list[int]) -> int:
        """The chain windows whose compute under ``slots`` is shorter than their collective: the
        fewest the model can count uncovered there (a queue may ask a cover for more)."""
        return sum(shortfall(slots) > 0 for _, shortfall in self._deficits)

    def build(self) -> cp_model.CpModel:
        self.variables()
        self.dependencies()
        self.bucket_order()
        self.memory()
        self.windows()
        self.queues()
        self.stall_cap()
        self.objective()
        self.hint([int(s) for s in self.inc])
        return self.model

    # ------------------------------------------------------------------ variables
    def variables(self) -> None:
        """Each op's slot: inside what its dependencies on the chain allow, within ``radius`` (a
        held collective keeps its own)."""
        p, sp, n = self.problem, self.spine, len(self.problem.ops)
        lo, hi = np.zeros(n, dtype=np.int64), np.full(n, sp.n_slots - 1, dtype=np.int64)
        for t, (i, w) in enumerate(zip(sp.issue, sp.wait)):
            lo[bit_mask(p.descendants[i], n)] = np.maximum(lo[bit_mask(p.descendants[i], n)], 2 * t + 1)
            lo[bit_mask(p.descendants[w], n)] = np.maximum(lo[bit_mask(p.descendants[w], n)], 2 * t + 2)
            hi[bit_mask(p.ancestors[w], n)] = np.minimum(hi[bit_mask(p.ancestors[w], n)], 2 * t + 1)
            hi[bit_mask(p.ancestors[i], n)] = np.minimum(hi[bit_mask(p.ancestors[i], n)], 2 * t)
        for j in range(n):
            if j in self.fixed:
                self.slot.append(self.fixed[j])
                self.dom.append((self.fixed[j], self.fixed[j]))
                continue
            r = 0 if j in self.held else self.radius
            a, b = max(int(lo[j]), int(self.inc[j]) - r), min(int(hi[j]), int(self.inc[j]) + r)
            assert a <= self.inc[j] <= b, p.ops[j].name  # the incumbent is valid
            self.slot.append(a if a == b else self._var(a, b, lambda s, j=j: s[j]))
            self.dom.append((a, b))

    # ---------------------------------------------------------------- constraints
    def dependencies(self) -> None:
        """No op in an earlier slot than an input (a chain op starts its slot, so what it needs
        sits in an earlier one)."""
        p, m = self.problem, self.model
        for j, op in enumerate(p.ops):
            for d in op.deps:
                y = p.index[d]
                if self.dom[y][1] <= self.dom[j][0] - (j in self.fixed):
                    continue  # holds for every value
                m.Add(self.slot[y] <= self.slot[j] - (1 if j in self.fixed else 0))  # type: ignore[operator]

    def bucket_order(self) -> None:
        """A bucket is issued with its last member and waited with its first: every member's wait
        no earlier than every member's issue (ties keep the incumbent's order, which is valid)."""
        p, wait_of = self.problem, self.problem.wait_of
        for b in self.sched.buckets:
            for x in b:
                for y in b:
                    self.model.Add(self.slot[p.index[wait_of[x]]] >= self.slot[p.index[y]])  # type: ignore[operator]

    def memory(self) -> None:
        """The bytes live at each chain op at most the budget (:meth:`cut`); the other ops' peaks
        are cut as decoded orders show them (:meth:`cut_peaks`)."""
        for j, s in self.fixed.items():
            self.cut(j, s)

    def _lifetimes(self) -> list[tuple[int | None, tuple[int, ...] | None, int]]:
        """Per storage with bytes: (its allocating op, None for an input; the ops whose place ends
        its life, None if it is never freed; its size). A collective's reads and outputs count at
        its wait (it holds its inputs and outputs until then); an unread storage lives at its
        allocator alone; an input no op reads is never live (the simulator's accounting)."""
        p = self.problem
        wait_of, index = p.wait_of, p.index
        readers: dict[str, set[int]] = {}
        alloc_of: dict[str, int] = {}
        for j, op in enumerate(p.ops):
            at = index[wait_of[op.name]] if op.kind is OpKind.COLLECTIVE else j
            for s in op.uses:
                readers.setdefault(s, set()).add(at)
            for s in op.allocates:
                alloc_of[s] = j
                if op.kind is OpKind.COLLECTIVE:
                    readers.setdefault(s, set()).add(at)
        out: list[tuple[int | None, tuple[int, ...] | None, int]] = []
        for st in p.storages:
            a = alloc_of.get(st.name)
            rs = tuple(sorted(readers.get(st.name, ()))) or ((a,) if a is not None else ())
            if st.size_bytes and (rs or st.never_freed):
                out.append((a, None if st.never_freed else rs, st.size_bytes))
        return out

    def _at_or_before(self, x: int, o: int, s: int):
        """Whether ``x`` runs no later than ``o`` placed in slot ``s``: True, False or a literal."""
        v = s if self.rank[x] <= self.rank[o] else s - 1
        a, b = self.dom[x]
        return True if b <= v else False if a > v else self._at_most(x, v)

    def _at_or_after(self, x: int, o: int, s: int):
        """Whether ``x`` runs no earlier than ``o`` placed in slot ``s``: True, False or a literal."""
        v = s if self.rank[x] >= self.rank[o] else s + 1
        a, b = self.dom[x]
        return True if a >= v else False if b < v else self._at_least(x, v)

    def cut(self, o: int, s: int, extra: int = 0) -> bool:
        """Bound the bytes live at op ``o`` to the budget whenever ``o`` sits in slot ``s`` (exact
        for lone collectives and plain ops; ``extra``: bytes it misses, a bucket's flat buffers).
        False if already cut there with as much."""
        if self._cuts.get((o, s), -1) >= extra:
            return False
        self._cuts[(o, s)] = extra
        m, const, terms = self.model, extra, []
        for a, rs, size in self.storages:
            born = True if a is None else self._at_or_before(a, o, s)
            if born is False:
                continue
            ends: list[object] = []
            read_after = rs is None  # never freed
            for r in rs or ():
                lit = self._at_or_after(r, o, s)
                if lit is True:
                    read_after = True
                    break
                if lit is not False:
                    ends.append(lit)
            if read_after:
                ends = [True]
            if not ends:
                continue
            if born is True and read_after:
                const += size
                continue
            # forced on by its allocator before o and a reader after
            live = self._var(0, 1, lambda sl, a=a, rs=rs: int(self._live_at(a, rs, o, s, sl)))
            for lit in ends:
                m.AddBoolOr([x.Not() for x in (born, lit) if x is not True] + [live])
            terms.append(size * live)
        if not terms and const <= self.budget:
            return True
        ct = m.Add(sum(terms) + const <= self.budget)  # type: ignore[misc]
        a, b = self.dom[o]
        ct.OnlyEnforceIf([lit for lit in (self._at_least(o, s) if a < s else None,
                                          self._at_most(o, s) if b > s else None) if lit is not None])
        return True

    def _live_at(self, a: int | None, rs: tuple[int, ...] | None, o: int, s: int, slot: list[int]) -> bool:
        """Whether the storage made by ``a`` and last read by one of ``rs`` is live at ``o`` placed in
        slot ``s``, the other ops in ``slot``."""
        ro = self.rank[o]
        if a is not None and not (slot[a] < s or (slot[a] == s and self.rank[a] <= ro)):
            return False
        return rs is None or any(slot[r] > s or (slot[r] == s and self.rank[r] >= ro) for r in rs)

    def live_bytes(self, o: int, slot: list[int]) -> int:
        """The bytes :meth:`cut` counts at ``o`` under the slots ``slot``."""
        return sum(size for a, rs, size in self.storages if self._live_at(a, rs, o, slot[o], slot))

    def cut_peaks(self, sched: Schedule, curve: np.ndarray) -> int:
        """Cuts at the CUTS_PER_SLOT highest ops of every slot where ``sched`` (the last decode)
        peaks over the budget, each where it sits; how many were new."""
        assert self.solved is not None
        p, peaks = self.problem, {}
        for q in np.flatnonzero(curve > self.budget).tolist():
            peaks.setdefault(self.solved[p.index[sched.order[q]]], []).append(q)
        added = 0
        for s, qs in peaks.items():
            for q in sorted(qs, key=lambda q: -curve[q])[:CUTS_PER_SLOT]:
                o = p.index[sched.order[q]]
                added += self.cut(o, s, max(0, int(curve[q]) - self.live_bytes(o, self.solved)))
        return added

    def _at_most(self, j: int, v: int):
        """The literal ``slot[j] <= v`` (one per op and value)."""
        return self._at_least(j, v + 1).Not()

    def _at_least(self, j: int, v: int):
        """The literal ``slot[j] >= v`` (one per op and value)."""
        if (j, v) not in self._ge:
            lit = self._var(0, 1, lambda s: int(s[j] >= v))
            self.model.Add(self.slot[j] >= v).OnlyEnforceIf(lit)  # type: ignore[operator]
            self.model.Add(self.slot[j] < v).OnlyEnforceIf(lit.Not())  # type: ignore[operator]
            self._ge[(j, v)] = lit
        return self._ge[(j, v)]

    def _in_range(self, j: int, lo: int, hi: int):
        """Whether op ``j``'s slot is in [lo, hi]: True, False or a literal (implied one way only:
        for sums that must reach a demand)."""
        a, b = self.dom[j]
        if b < lo or a > hi or lo > hi:
            return False
        if lo <= a and b <= hi:
            return True
        inside = self._var(0, 1, lambda s: int(lo <= s[j] <= hi))
        if a < lo:
            self.model.AddImplication(inside, self._at_least(j, lo))
        if b > hi:
            self.model.AddImplication(inside, self._at_most(j, hi))
        return inside

    def _compute(self, lits: list[tuple[int, object]]) -> tuple[int, list]:
        """(constant, terms) of the runtime summed over (op, True or literal) pairs."""
        const, terms = 0, []
        for j, lit in lits:
            if lit is True:
                const += int(self.runtime[j])
            elif lit is not False:
                terms.append(int(self.runtime[j]) * lit)
        return const, terms

    def windows(self) -> None:
        """A chain window is covered when the compute placed in it lasts its collective's runtime;
        its deficit is at least what that compute misses."""
        p, m = self.problem, self.model
        self._deficits: list[tuple[object, Callable[[list[int]], int]]] = []  # (variable, its value)
        for t, name in enumerate(self.spine.chain):
            s, need = 2 * t + 1, p.op_by_name[name].runtime_ns
            ops = self.compute_ops
            const, terms = self._compute([(j, self._in_range(j, s, s)) for j in ops])
            def fill(sl: list[int], s: int = s, ops: list[int] = ops) -> int:
                return int(sum(self.runtime[j] for j in ops if sl[j] == s))

            # hinted uncovered: always valid (a queue may ask more of a cover than its window, :meth:`queues`)
            cov = self._var(0, 1, lambda sl: 0)
            m.Add(sum(terms) + const >= need).OnlyEnforceIf(cov)  # type: ignore[misc]
            def shortfall(sl: list[int], need: int = need, fill=fill) -> int:
                return max(0, need - fill(sl))

            deficit = self._var(0, need, shortfall)
            m.Add(deficit + sum(terms) + const >= need)  # type: ignore[misc]
            self.cover.append(cov)
            self._deficits.append((deficit, shortfall))

    def queues(self) -> None:
        """Each held collective keeps the compute before it to the incumbent's (its queue starts
        no later), and a chain window behind it in the queue is covered only when the compute
        from the held collective's issue to the chain collective's wait lasts both runtimes and
        those of the chain collectives between (while an op's radius can still reach it)."""
        p, m, chain = self.problem, self.model, self.spine.chain
        for x in self.held:
            sx = self.dom[x][0]
            const, terms = self._compute([(j, self._at_or_before(j, x, sx)) for j in self.compute_ops if j != x])
            was = int(sum(self.runtime[j] for j in self.compute_ops if self.pos[j] < self.pos[x]))
            m.Add(sum(terms) + const <= was)  # type: ignore[misc]
            demand = p.ops[x].runtime_ns
            for t, name in enumerate(chain):
                s = 2 * t + 1
                if s < sx:
                    continue
                if s > sx + 2 * self.radius + 2:
                    break
                demand += p.op_by_name[name].runtime_ns
                const, terms = self._compute([(j, self._in_range(j, sx if self.rank[j] > self.rank[x] else sx + 1, s))
                                              for j in self.compute_ops if j != x])
                if const >= demand:
                    break
                m.Add(sum(terms) + const >= demand).OnlyEnforceIf(self.cover[t])  # type: ignore[misc]

    def stall_cap(self) -> None:
        """The chain windows' deficits (their collectives' runtime the compute in them misses) sum
        to no more than the incumbent's: compute moved to cover one window is not taken from
        another that then stalls longer (on the tp backward: from the last window, whose all-reduce
        then ends the step later)."""
        inc = [int(s) for s in self.inc]
        was = sum(shortfall(inc) for _, shortfall in self._deficits)
        self.model.Add(sum(d for d, _ in self._deficits) <= was)  # type: ignore[misc]

    # ------------------------------------------------------------------ objective
    def objective(self) -> None:
        """Uncovered windows first, then the slots moved (summed over ops)."""
        m = self.model
        for j, v in enumerate(self.slot):
            if isinstance(v, int):
                continue
            d = self._var(0, self.radius, lambda s, j=j: abs(s[j] - int(self.inc[j])))
            m.AddAbsEquality(d, v - int(self.inc[j]))  # type: ignore[operator]
            self.moves.append(d)
        weight = self.radius * len(self.moves) + 1
        m.Minimize(weight * sum(1 - c for c in self.cover) + sum(self.moves))

    def decode(self, solver: cp_model.CpSolver) -> Schedule:
        """Slot by slot; a chain op first in its slot, the rest in the incumbent's order."""
        p = self.problem
        slot = [v if isinstance(v, int) else solver.Value(v) for v in self.slot]
        self.solved = slot
        key = sorted(range(len(p.ops)), key=lambda j: (slot[j], self.rank[j]))
        return Schedule(order=tuple(p.ops[j].name for j in key), buckets=self.sched.buckets,
                        multi_dtype=self.sched.multi_dtype)


def spine_fill(problem: ScheduleProblem, sched: Schedule, budget_bytes: int, config: SolveConfig,
               time_s: float, radius: int = SPINE_RADIUS, solve_s: float | None = None) -> Schedule | None:
    """``sched`` with compute reassigned to its chain's windows (see the module doc), or None: not
    free mode, too large a graph (SPINE_MAX_OPS), no chain, no chain collective stalled, no
    answer within ``time_s``, or every solve peaked over ``budget_bytes`` (or ``sched``'s peak, if
    higher) until CUT_ROUNDS of them had or a peak could not be cut.

    The model is solved again and again, each solve for ``solve_s`` (None: a third of ``time_s``)
    with the next seed, keeping every memory cut the ones before added, until a decoded order
    within the budget leaves fewer chain windows uncovered than ``sched`` (returned at once), a
    solve proves its order optimal, MAX_SOLVES solves, or ``time_s``; then the order within the
    budget with the fewest windows uncovered. The cuts are what the later solves gain: on the
    tp_2x4 backward from a 197-of-200 answer whose one uncovered window needed compute the
    memory cuts leave little room for, 20 s solves found no cover in the first three (each
    peaking, or returning the hinted order) and then covered it in four of the next six, within
    the budget: 198 hidden at 31,338.1 us after the polish, where a fill that returned its first
    order within the budget gave the same order back round after round.

    On a wall clock ``time_s`` covers the model build too; in deterministic mode it is CP-SAT's
    deterministic time alone. The result is valid; its makespan is not checked (the caller
    polishes and compares)."""
    if config.mode != "free" or len(problem.ops) > SPINE_MAX_OPS or time_s <= 0:
        return None
    spine = spine_of(problem, sched)
    if spine is None:
        return None
    res = simulate(problem, sched)
    chain = set(spine.chain)
    if not any(t.exposed_ns > 0 and t.members[0] in chain for t in res.collectives):
        return None
    end = time.perf_counter() + time_s  # on a wall clock, the build counts too (about 1 s at 2,400 ops)
    builder = SpineModel(problem, sched, spine, max(budget_bytes, res.peak_memory_bytes), radius)
    builder.build()
    was = builder.uncovered_at([int(s) for s in builder.inc])
    slice_s = time_s / 3 if solve_s is None else solve_s
    used, cuts = 0.0, 0  # deterministic seconds spent; solves that peaked
    best: tuple[int, Schedule] | None = None  # (windows uncovered, order) within the budget
    for k in range(MAX_SOLVES):
        left = (time_s - used) if config.deterministic else (end - time.perf_counter())
        if left <= 0:
            break
        # every solve is hinted the incumbent (valid under every cut)
        solver = make_solver(dataclasses.replace(config, seed=config.seed + k), min(left, slice_s), lns=True)
        status = solver.Solve(builder.model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        used += solver.deterministic_time / config.deterministic_rate
        cand = builder.decode(solver)
        curve = np.asarray(memory_curve(problem, cand)[1])
        uncovered = sum(1 - solver.Value(c) for c in builder.cover)
        log.debug("spine_fill %s: solve %d, %d-collective chain, %d of its windows uncovered (%d before), "
                  "%d positions over budget", problem.name, k, len(spine.chain), uncovered, was,
                  int((curve > builder.budget).sum()))
        if (curve > builder.budget).any():
            cuts += 1
            if cuts >= CUT_ROUNDS or not builder.cut_peaks(cand, curve):
                break  # out of cut rounds, or nothing new to cut: the model cannot see this peak
            continue
        if best is None or uncovered < best[0]:
            best = (uncovered, cand)
        if uncovered < was or status == cp_model.OPTIMAL:
            break  # a gain, or none under these cuts (and the order is within the budget: none at all)
    return None if best is None else best[1]
