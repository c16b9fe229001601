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
  earlier than its issues, and memory: at every chain op, the bytes live across it (each
  storage from its allocator's slot to its last reader's) at most the incumbent's there plus
  the incumbent's headroom under the budget in the two slots around it. What runs inside a slot
  is not modelled, so the decoded order is simulated; where it peaks over the budget, the ops
  that moved across those slots go back to the incumbent's and the model is solved again
  (MEMORY_TRIES solves in all, then nothing);
* **objective**: the chain windows whose compute is shorter than their collective first, then
  how far the ops move from the incumbent's slots.

The order is decoded slot by slot, each slot's ops in the incumbent's order, so it is valid by
construction. :func:`.cpsat.solve` polishes it and keeps it only if it hides more collectives
at no longer a makespan; it is off by default (``SolveConfig.spine_share``), since the model
sees neither the other collectives' windows nor their group's FIFO. On the tp_2x4 backward's
60 s answer (185 of 198 hidden, 31,192.6 us, at the original order's peak), without the memory
guard and with the polish allowed the order's peak, one 60 s solve reached 196 of 198 at
31,194.0 us and 2.1% more memory. With the guard, held to the answer's peak, it does not pay
yet: from a 60 s answer hiding 184 of 197 at 31,202.3 us, 30 s of it and the polish hide 189 at
32,297.0 us, and 193 at 5% slack, where the answer's own polish hides 190 at 31,414.1 us
(benchmarks/RESULTS.md, slack sweep).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from .cpsat_config import SolveConfig, make_solver
from .problem import OpKind, ScheduleProblem, bit_mask
from .schedule import Schedule
from .sim_tables import sim_tables
from .simulator import memory_curve, simulate

log = logging.getLogger(__name__)

SPINE_RADIUS = 4  # slots an op may move from the incumbent's (2 chain windows each way)
# one slot variable per op and a chain of up to a few hundred collectives: above this the model
# (and the per-chain-op dependency masks) outgrow a solve's polish share
SPINE_MAX_OPS = 6_000
MEMORY_TRIES = 3  # solves, each pinning the ops of the slots the last one's order peaked over the budget in


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

    def __init__(self, problem: ScheduleProblem, sched: Schedule, spine: Spine, budget_bytes: int, radius: int,
                 pinned: frozenset[int] = frozenset()):
        self.problem, self.sched, self.spine, self.pinned = problem, sched, spine, pinned
        self.budget, self.radius = budget_bytes, radius
        self.model = cp_model.CpModel()
        n = len(problem.ops)
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[[problem.index[name] for name in sched.order]] = np.arange(n)
        bounds = np.array([self.pos[i] for pair in zip(spine.issue, spine.wait) for i in pair])
        self.bounds = bounds  # incumbent positions of the chain ops, in order (each starts a slot)
        self.inc = np.searchsorted(bounds, self.pos, side="right")  # each op's incumbent slot
        self.fixed = {i: 2 * t + 1 for t, i in enumerate(spine.issue)} | {i: 2 * t + 2 for t, i in enumerate(spine.wait)}
        self.slot: list[object] = []  # per op: an int (fixed) or an IntVar
        self.dom: list[tuple[int, int]] = []
        self.cover: list[cp_model.IntVar] = []
        self.moves: list[cp_model.IntVar] = []
        self._ge: dict[tuple[int, int], tuple[object, object]] = {}

    def build(self) -> cp_model.CpModel:
        self.variables()
        self.dependencies()
        self.bucket_order()
        self.memory()
        self.windows()
        self.objective()
        return self.model

    # ------------------------------------------------------------------ variables
    def variables(self) -> None:
        """Each op's slot: inside what its dependencies on the chain allow, within ``radius``."""
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
            r = 0 if j in self.pinned else self.radius
            a, b = max(int(lo[j]), int(self.inc[j]) - r), min(int(hi[j]), int(self.inc[j]) + r)
            assert a <= self.inc[j] <= b, p.ops[j].name  # the incumbent is valid
            self.slot.append(a if a == b else self.model.NewIntVar(a, b, f"slot_{j}"))
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
        """At each chain op (the start of slot ``b``), the storages live across it (allocated in
        an earlier slot, read in this one or later) at most the incumbent's bytes there plus the
        incumbent's headroom under the budget over the slots on both sides."""
        p, m, n_b = self.problem, self.model, self.spine.n_slots - 1
        _, curve = memory_curve(p, self.sched)
        curve_arr = np.asarray(curve, dtype=np.int64)
        ends = np.append(self.bounds, len(curve_arr))
        starts = np.insert(self.bounds, 0, 0)
        per_slot = [int(curve_arr[a:e].max()) if e > a else 0 for a, e in zip(starts, ends)]
        live_at: list[list[tuple[int, object]]] = [[] for _ in range(n_b + 1)]  # per boundary b >= 1
        inc_live = np.zeros(n_b + 1, dtype=np.int64)
        for s, (alloc, last, size) in enumerate(self._lifetimes()):
            if size == 0:
                continue
            (alo, ahi), (llo, lhi), (ai, li) = alloc[0], last[0], (alloc[1], last[1])
            for b in range(max(1, alo + 1), min(n_b, lhi) + 1):  # alloc <= b - 1 and last >= b possible
                if ai <= b - 1 and li >= b:
                    inc_live[b] += size
                early = True if ahi <= b - 1 else self._at_most(alloc[2], b - 1)
                late = True if llo >= b else self._at_least(last[2], b)
                if early is True and late is True:
                    live_at[b].append((size, 1))
                    continue
                live = m.NewBoolVar(f"live_{s}_{b}")
                m.AddBoolOr([lit.Not() for lit in (early, late) if lit is not True] + [live])
                live_at[b].append((size, live))
        for b in range(1, n_b + 1):
            cap = int(inc_live[b]) + max(0, self.budget - max(per_slot[b - 1], per_slot[b]))
            terms = live_at[b]
            if terms and sum(size for size, _ in terms) > cap:
                m.Add(sum(size * lit for size, lit in terms) <= cap)  # type: ignore[misc]

    def _lifetimes(self):
        """Per storage: ((domain, incumbent slot, expr) of its allocating slot, the same of its last
        reader's slot, size). A collective's reads and outputs count at its wait (it holds its
        inputs and outputs until then); inputs are allocated in slot 0; never-freed storages and
        unread ones end in the last slot and their allocator's."""
        p, last_slot = self.problem, self.spine.n_slots - 1
        wait_of, index = p.wait_of, p.index
        readers: dict[str, list[int]] = {}
        alloc_of: dict[str, int] = {}
        for j, op in enumerate(p.ops):
            at = index[wait_of[op.name]] if op.kind is OpKind.COLLECTIVE else j
            for s in op.uses:
                readers.setdefault(s, []).append(at)
            for s in op.allocates:
                alloc_of[s] = j
                if op.kind is OpKind.COLLECTIVE:
                    readers.setdefault(s, []).append(at)
        out = []
        for st in p.storages:
            a = alloc_of.get(st.name)
            alloc = ((0, 0), 0, 0) if a is None else (self.dom[a], int(self.inc[a]), self.slot[a])
            if st.never_freed:
                last = ((last_slot, last_slot), last_slot, last_slot)
            else:
                rs = readers.get(st.name, []) or ([a] if a is not None else [])
                if not rs:
                    last = ((0, 0), 0, 0)
                else:
                    dom = (max(self.dom[r][0] for r in rs), max(self.dom[r][1] for r in rs))
                    inc = max(int(self.inc[r]) for r in rs)
                    exprs = [self.slot[r] for r in rs]
                    if dom[0] == dom[1]:
                        expr: object = dom[0]
                    else:
                        expr = self.model.NewIntVar(dom[0], dom[1], f"last_{st.name}")
                        self.model.AddMaxEquality(expr, exprs)
                    last = (dom, inc, expr)
            out.append((alloc, last, st.size_bytes))
        return out

    def _at_most(self, expr: object, v: int):
        """The literal ``expr <= v`` (one per variable and value)."""
        return self._at_least(expr, v + 1).Not()

    def _at_least(self, expr: object, v: int):
        """The literal ``expr >= v`` (one per variable and value)."""
        key = (id(expr), v)
        if key not in self._ge:
            lit = self.model.NewBoolVar("")
            self.model.Add(expr >= v).OnlyEnforceIf(lit)  # type: ignore[operator]
            self.model.Add(expr < v).OnlyEnforceIf(lit.Not())  # type: ignore[operator]
            self._ge[key] = (expr, lit)  # keeps expr alive, so its id stays its own
        return self._ge[key][1]

    def windows(self) -> None:
        """A chain window is covered when the compute placed in it lasts its collective's runtime."""
        p, m = self.problem, self.model
        runtime = sim_tables(p).runtime
        fill: list[list[tuple[int, object]]] = [[] for _ in self.spine.chain]
        for j in range(len(p.ops)):
            if runtime[j] <= 0 or j in self.fixed:
                continue
            a, b = self.dom[j]
            for s in range(a | 1, b + 1, 2):  # the odd slots are windows
                if a == b:
                    fill[s // 2].append((int(runtime[j]), 1))
                    continue
                inside = m.NewBoolVar(f"in_{j}_{s}")
                m.Add(self.slot[j] == s).OnlyEnforceIf(inside)  # type: ignore[arg-type]
                fill[s // 2].append((int(runtime[j]), inside))
        for t, name in enumerate(self.spine.chain):
            cov = m.NewBoolVar(f"cover_{t}")
            need = p.op_by_name[name].runtime_ns
            m.Add(sum(w * lit for w, lit in fill[t]) >= need).OnlyEnforceIf(cov)  # type: ignore[misc]
            self.cover.append(cov)

    # ------------------------------------------------------------------ objective
    def objective(self) -> None:
        """Uncovered windows first, then the slots moved (summed over ops)."""
        m = self.model
        for j, v in enumerate(self.slot):
            if isinstance(v, int):
                continue
            d = m.NewIntVar(0, self.radius, f"move_{j}")
            m.AddAbsEquality(d, v - int(self.inc[j]))  # type: ignore[operator]
            self.moves.append(d)
            m.AddHint(v, int(self.inc[j]))  # type: ignore[arg-type]
        weight = self.radius * len(self.moves) + 1
        m.Minimize(weight * sum(1 - c for c in self.cover) + sum(self.moves))

    def moved_across(self, sched: Schedule, positions: np.ndarray) -> frozenset[int]:
        """The ops whose move (incumbent slot to decoded slot, ``sched`` the last decode) reached or
        crossed a slot that holds one of these positions."""
        p = self.problem
        slots = {self.solved[p.index[sched.order[int(q)]]] for q in positions}
        return frozenset(j for j, (a, b) in enumerate(zip(self.inc.tolist(), self.solved))
                         if a != b and any(min(a, b) <= v <= max(a, b) for v in slots))

    def decode(self, solver: cp_model.CpSolver) -> Schedule:
        """Slot by slot; a chain op first in its slot, the rest in the incumbent's order."""
        p = self.problem
        slot = [v if isinstance(v, int) else solver.Value(v) for v in self.slot]
        self.solved = slot
        key = sorted(range(len(p.ops)), key=lambda j: (slot[j], j not in self.fixed, self.pos[j]))
        return Schedule(order=tuple(p.ops[j].name for j in key), buckets=self.sched.buckets,
                        multi_dtype=self.sched.multi_dtype)


def spine_fill(problem: ScheduleProblem, sched: Schedule, budget_bytes: int, config: SolveConfig,
               time_s: float, radius: int = SPINE_RADIUS) -> Schedule | None:
    """``sched`` with compute reassigned to its chain's windows (see the module doc), or None: not
    free mode, too large a graph (SPINE_MAX_OPS), no chain, no chain collective stalled, no
    answer within ``time_s``, or every one of the MEMORY_TRIES solves (sharing ``time_s``) peaked
    over ``budget_bytes`` (or ``sched``'s peak, if higher). On a wall clock ``time_s`` covers the
    model builds too; in deterministic mode it is CP-SAT's deterministic time alone. The result is
    valid; its makespan is not checked (the caller polishes and compares)."""
    if config.mode != "free" or len(problem.ops) > SPINE_MAX_OPS or time_s <= 0:
        return None
    spine = spine_of(problem, sched)
    if spine is None:
        return None
    res = simulate(problem, sched)
    chain = set(spine.chain)
    if not any(t.exposed_ns > 0 and t.members[0] in chain for t in res.collectives):
        return None
    budget = max(budget_bytes, res.peak_memory_bytes)
    pinned: frozenset[int] = frozenset()
    end = time.perf_counter() + time_s  # on a wall clock, model builds count too (about 1 s at 2,400 ops)
    for k in range(MEMORY_TRIES):
        if not config.deterministic and time.perf_counter() >= end:
            return None
        builder = SpineModel(problem, sched, spine, budget, radius, pinned)
        builder.build()
        left = time_s / MEMORY_TRIES if config.deterministic else (end - time.perf_counter()) / (MEMORY_TRIES - k)
        if left <= 0:
            return None
        solver = make_solver(config, left, lns=True)
        if solver.Solve(builder.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        cand = builder.decode(solver)
        over = np.flatnonzero(np.asarray(memory_curve(problem, cand)[1]) > budget)
        log.debug("spine_fill %s: %d-collective chain, %d of its windows uncovered, %d positions over budget",
                  problem.name, len(spine.chain), sum(1 - solver.Value(c) for c in builder.cover), len(over))
        if not len(over):
            return cand
        # what moved across the slots that peaked goes back to the incumbent's slot; the next solve
        # keeps everything else free
        pinned |= builder.moved_across(cand, over)
    return None
