"""Can the compute stream run without a stall and stay within a memory budget? A proof tool.

A schedule hides every collective but one unit only if its compute stream never waits before all
compute has run, where :func:`.bounds.exposed_after_compute` holds (the unit issued last is issued
after all compute, so it is exposed). This module decides a relaxation of that question with
CP-SAT. When the relaxation has no solution, no schedule whose peak fits the budget runs its
compute stream without a stall until it has run every cut, so every such schedule exposes at least
two units.

**The relaxation.** Take cuts ``u_0 .. u_K``: compute ops. In any order the ops before ``u_k``
form a set ``X_k`` that holds each member's dependencies, and of two cuts the one that runs first
has its set and itself inside the other's (which one is fixed where one depends on the other, and
a choice of the model elsewhere). Take an order whose compute stream never stalls before it has
run every cut, w.l.o.g. in the oracle's canonical form (a bucket's members stand at its issue,
which moves no event in time and raises no memory at a compute op). Then:

- *time:* the clock at ``u_k`` is the compute of ``X_k`` plus the bucket copies run before it;
  per member of a bucket issued before it that is at most half a launch and its bytes' share of
  the copy-in, and for a gather waited before it as much of the copy-out (a bucket has two
  members or more, issued together, so a member counts only where a collective that could share
  its bucket was issued before the cut too; a copy is one launch plus its bytes at the memory
  bandwidth). Every collective that ``u_k`` depends on has ended by then, and what runs after its
  wait and before ``u_k`` (its *tail*) has run too. Each was issued no earlier than its *head*,
  the compute that precedes it in every schedule within the budget (its ancestors', or
  :func:`.memory_cuts.memory_heads`), and its group runs one collective at a time; so the clock
  is at least ``h + τ`` plus the least
  comm time (:func:`.bounds._comm_lb_fn`, any bucketing) of those with heads ``>= h`` and tails
  ``>= τ``. Its own bucket's copy-in runs before it starts and the copy-out after it ends, so
  for one such collective the clock less its own copy allowances is at least that. A collective
  issued after an earlier cut ``u_j`` starts after ``u_j`` ends and after all of its group issued
  before ``u_j`` (FIFO); one whose wait runs before ``u_k`` has ended. Those sums price each byte
  at what every bucket that runs before the cut pays within the budget
  (:func:`.cut_prices.cut_byte_prices`), and the sets made of whole buckets (what was issued
  before a cut; at ``set_levels`` head levels, what ended before one) at least the cheapest
  buckets of their bytes (:func:`.cut_prices.set_chords`).
- *memory:* what the simulator counts at ``u_k``, or less (:mod:`.cut_memory`).

Memory is checked at the cuts only and time from below only, so a solution is no schedule; no
solution is a proof. ``least`` minimizes the largest memory at the cuts instead: its bound is
memory that every such order reaches at some cut.

Why not :mod:`.cpsat`'s model: that one schedules every op, and on a 2,000-op backward it proves
nothing of this kind; here an op is one Boolean per cut.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from .bounds import _comm_lb_fn, _comm_of, _memory_peaks, _weights
from .cut_prices import byte_prices, cut_byte_prices, set_chords
from .memory_cuts import memory_heads
from .cut_memory import bucket_partners, Term, memory_terms
from .problem import Op, OpKind, ProblemError, ScheduleProblem, bit_mask

__all__ = ["CutsConfig", "CutsResult", "stall_free_cuts"]

_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
           cp_model.UNKNOWN: "unknown", cp_model.MODEL_INVALID: "invalid"}


@dataclass(frozen=True)
class CutsConfig:
    """How to solve the relaxation. ``deterministic``: the limit is CP-SAT's deterministic time
    (repeatable, for tests); ``least``: minimize the largest memory at the cuts; ``max_subset``:
    the largest set of newly needed collectives whose subsets get the "issued after ``u_j``"
    bound (2^n constraints each); ``set_levels``: at how many head levels per cut the FIFO sum
    also takes the set's cheapest buckets (:func:`.cut_prices.set_chords`; a min of lines each)."""

    time_limit_s: float = 60.0
    workers: int = 1
    seed: int = 0
    deterministic: bool = True
    least: bool = False
    max_subset: int = 6
    set_levels: int = 8

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ValueError(f"CutsConfig.time_limit_s must be > 0, got {self.time_limit_s!r}")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"CutsConfig.workers must be an integer >= 1, got {self.workers!r}")
        if not isinstance(self.max_subset, int) or not 0 <= self.max_subset <= 12:
            raise ValueError(f"CutsConfig.max_subset must be an integer in [0, 12], got {self.max_subset!r}")
        if not isinstance(self.set_levels, int) or self.set_levels < 0:
            raise ValueError(f"CutsConfig.set_levels must be an integer >= 0, got {self.set_levels!r}")


@dataclass(frozen=True)
class CutsResult:
    """``status``: ``infeasible`` (the proof), ``feasible``/``optimal`` (sets found), ``unknown``.
    ``sets``: the ops before each cut in the found solution; ``memory_bytes`` and ``clocks_ns``:
    the relaxation's memory and compute time at each cut there. ``lower_bound_bytes`` (``least``):
    memory that every stall-free order within the budget reaches at some cut."""

    status: str
    cuts: tuple[str, ...]
    budget_bytes: int
    runtime: float
    sets: tuple[tuple[str, ...], ...] = ()
    memory_bytes: tuple[int, ...] = ()
    clocks_ns: tuple[int, ...] = ()
    lower_bound_bytes: int | None = None

    @property
    def proves_stall(self) -> bool:
        """Whether every schedule within the budget stalls its compute stream before it has run every cut."""
        return self.status == "infeasible" or (
            self.lower_bound_bytes is not None and self.lower_bound_bytes > self.budget_bytes)


class _CutsModel:
    """The CP-SAT model: variables, then one method per constraint family, then the objective."""

    def __init__(self, problem: ScheduleProblem, cuts: Sequence[int], budget_bytes: int, config: CutsConfig):
        self.p, self.cuts, self.budget, self.config = problem, list(cuts), budget_bytes, config
        self.n = len(problem.ops)
        self.w = _weights(problem)
        self._tails: dict[tuple[int, int], int] = {}
        self._ahead: dict[tuple[int, str], object] = {}
        self.m = cp_model.CpModel()
        self._variables()
        self._closure()
        self._heads()
        self._stream()
        self._waits()
        self._fifo()
        self._memory()
        self._objective()

    # ---- variables ----
    def _variables(self) -> None:
        """x[k][i]: op i runs before cut k; 1 or 0 where the graph decides it."""
        p = self.p
        self.x: list[list] = []
        for k, u in enumerate(self.cuts):
            anc, desc = p.ancestors[u], p.descendants[u]
            row: list = []
            for i in range(self.n):
                if anc >> i & 1:
                    row.append(1)
                elif i == u or desc >> i & 1:
                    row.append(0)
                else:
                    row.append(self.m.NewBoolVar(f"x{k}_{i}"))
            self.x.append(row)
        self.zero = self.m.NewConstant(0)  # keeps every sum below a CP-SAT expression
        self.t = [self.zero + sum(int(self.w[i]) * self.x[k][i] for i in range(self.n) if self.w[i])
                  for k in range(len(self.cuts))]

    def _le(self, a, b) -> None:
        """a <= b for 0/1 constants or literals."""
        if isinstance(a, int) and isinstance(b, int):
            if a > b:
                raise AssertionError("fixed literals contradict")  # the graph fixes both consistently
        elif isinstance(a, int):
            if a == 1:
                self.m.Add(b == 1)
        elif isinstance(b, int):
            if b == 0:
                self.m.Add(a == 0)
        else:
            self.m.AddImplication(a, b)

    # ---- constraints ----
    def _closure(self) -> None:
        """Each set holds its members' dependencies; of two cuts, the one that runs first has its
        set, and itself, inside the other's (fixed where one depends on the other, else a choice)."""
        index = self.p.index
        K = len(self.cuts)
        for k in range(K):
            for i, op in enumerate(self.p.ops):
                for d in op.deps:
                    self._le(self.x[k][i], self.x[k][index[d]])
        self.first: list[list] = [[0] * K for _ in range(K)]  # first[j][k]: u_j runs before u_k
        for j, k in itertools.combinations(range(K), 2):
            a, b = self.cuts[j], self.cuts[k]
            if self.p.ancestors[b] >> a & 1:
                self.first[j][k], self.first[k][j] = 1, 0
            elif self.p.ancestors[a] >> b & 1:
                self.first[j][k], self.first[k][j] = 0, 1
            else:
                o = self.m.NewBoolVar(f"first{j}_{k}")
                self.first[j][k], self.first[k][j] = o, o.Not()
        for j in range(K):
            for k in range(K):
                if j != k and not (isinstance(self.first[j][k], int) and self.first[j][k] == 0):
                    self._nested(j, k)

    def _nested(self, j: int, k: int) -> None:
        """Where u_j runs first: X_j and u_j inside X_k."""
        o, xj, xk = self.first[j][k], self.x[j], self.x[k]
        if isinstance(o, int):
            for i in range(self.n):
                self._le(xj[i], xk[i])
            return
        self.m.AddBoolOr([o.Not(), xk[self.cuts[j]]])
        for i in range(self.n):
            a, b = xj[i], xk[i]
            if (isinstance(a, int) and a == 0) or (isinstance(b, int) and b == 1):
                continue
            if isinstance(a, int):  # a == 1
                self.m.AddImplication(o, b)
            elif isinstance(b, int):  # b == 0
                self.m.AddImplication(o, a.Not())
            else:
                self.m.AddBoolOr([o.Not(), a.Not(), b])

    def _if_first(self, ct, j: int, k: int, lits: Sequence = ()) -> None:
        """Enforce ``ct`` where u_j runs before u_k and the literals hold."""
        o = self.first[j][k]
        extra = [] if isinstance(o, int) else [o]
        ct.OnlyEnforceIf([*extra, *lits])

    def _heads(self) -> None:
        """Per collective: its head, its lower bound per (group, kind), its copy allowance."""
        p, w = self.p, self.w
        index = p.index
        dep = {c.name: int(w[bit_mask(p.ancestors[index[c.name]], self.n)].sum()) for c in p.collectives}
        mem = memory_heads(p, self.budget, w, dep, _memory_peaks(p, 8))
        self.head = {index[c.name]: max(dep[c.name], mem.get(c.name, 0)) for c in p.collectives}
        by: dict[tuple, list[Op]] = {}
        for c in p.collectives:
            by.setdefault((c.collective.group, c.collective.kind), []).append(c)  # type: ignore[union-attr]
        fns = {key: _comm_lb_fn(p, key[0], key[1], members) for key, members in by.items()}
        self.lb_of: dict[str, dict] = {}  # group -> kind -> the bound, as bounds._comm_of takes them
        for (group, kind), (fn, _) in fns.items():
            self.lb_of.setdefault(group, {})[kind] = fn
        # per collective: comm time every bucketing within the budget pays for its bytes
        rate = byte_prices(p, self.budget, by, {key: s for key, (_, s) in fns.items()})
        self.per_byte = {index[c.name]: math.floor(rate[c.name] * c.collective.size_bytes)  # type: ignore[union-attr]
                         for c in p.collectives}
        self.key_of = {index[c.name]: key for key, members in by.items() for c in members}
        self.per_byte_at: list[dict[int, int]] = []  # the prices of what runs before each cut
        for u in self.cuts:
            rate_k = cut_byte_prices(p, self.budget, by, {key: s for key, (_, s) in fns.items()}, u)
            self.per_byte_at.append({
                i: max(v, math.floor(rate_k.get(p.ops[i].name, 0.0) * p.ops[i].collective.size_bytes))  # type: ignore[union-attr]
                for i, v in self.per_byte.items()})
        self.chords = {key: set_chords(p, key, members) for key, members in by.items()}
        partners = bucket_partners(p)
        costs = p.bucket_costs
        # A bucket (two members or more) copies in at its issue and, for gathers, out at its wait:
        # launch + 2 bytes / bandwidth each. Per member that is at most half a launch plus its own
        # bytes' share, counted where it was issued (copy-in) or waited (copy-out) before the cut,
        # and only where a collective that could share its bucket was issued before the cut too
        # (a bucket's members are issued together).
        wait_of = p.wait_of
        half = -(-costs.launch_overhead_ns // 2)
        self.allow: list[tuple[int, int, list[int]]] = []  # (op whose being before the cut pays, ns, mates)
        bw = costs.memory_bandwidth_gbps
        for c in p.collectives:
            i, info = index[c.name], c.collective
            if i in partners:
                self.allow.append((i, half + math.ceil(2 * info.bytes_in / bw), partners[i]))  # type: ignore[union-attr]
                if info.kind.bucket_copies_out:  # type: ignore[union-attr]
                    out_ns = half + math.ceil(2 * info.bytes_out / bw)  # type: ignore[union-attr]
                    self.allow.append((index[wait_of[c.name]], out_ns, partners[i]))
        self.paid = [{i: self._paid(k, i, mates) for i, _, mates in self.allow} for k in range(len(self.cuts))]
        self.clock = [self.t[k] + sum(a * self.paid[k][i] for i, a, _ in self.allow) for k in range(len(self.cuts))]
        self.own_copies = {}  # per bucketable collective: its copy-in and copy-out allowances, (op, ns) each
        for i, a, _ in self.allow:
            c = i if p.ops[i].kind is OpKind.COLLECTIVE else index[p.ops[i].waits_on]  # type: ignore[index]
            self.own_copies.setdefault(c, []).append((i, a))

    def _paid(self, k: int, i: int, mates: list[int]):
        """0, 1 or a literal: op ``i`` runs before cut k and so does one of ``mates`` (issued with it)."""
        x = self.x[k]
        mine, others = x[i], [x[j] for j in mates if not (isinstance(x[j], int) and x[j] == 0)]
        if (isinstance(mine, int) and mine == 0) or not others:
            return 0
        if isinstance(mine, int) and any(isinstance(o, int) for o in others):
            return 1
        z = self.m.NewBoolVar("")
        if not isinstance(mine, int):
            self.m.AddImplication(z, mine)
        if not any(isinstance(o, int) for o in others):
            self.m.AddBoolOr([z.Not(), *others])
        return z

    def _set_comm(self, items: Sequence[tuple[int, object]], whole: bool, k: int):
        """At most the comm time of the collectives of ``items`` (``(index, 0/1 or literal)``, one
        group) that ended before cut ``k`` or were issued before it, where the literal holds: per
        kind, the larger of their byte prices there and, where ``whole``
        (every bucket that holds one of them runs within the time counted), the chords of the
        cheapest buckets of their bytes (:func:`.cut_prices.set_chords`)."""
        price = self.per_byte_at[k]
        by_key: dict[tuple, list[tuple[int, object]]] = {}
        for i, d in items:
            if not (isinstance(d, int) and d == 0):
                by_key.setdefault(self.key_of[i], []).append((i, d))
        out = []
        for key, its in by_key.items():
            lin = self.zero + sum(price[i] * d for i, d in its)
            chords = self.chords.get(key) if whole else None
            if not chords:
                out.append(lin)
                continue
            size = {i: self.p.ops[i].collective.size_bytes for i, _ in its}  # type: ignore[union-attr]
            lines = [(math.floor(a), [math.floor(b * size[i]) for i, _ in its]) for a, b in chords]
            if all(isinstance(d, int) for _, d in its):  # all 1: a constant
                out.append(max(sum(price[i] for i, _ in its), min(a + sum(cs) for a, cs in lines)))
                continue
            ub = max(max(a + sum(cs) for a, cs in lines), sum(price[i] for i, _ in its))
            m = self.m.NewIntVar(0, ub, "")
            self.m.AddMinEquality(m, [self.zero + a + sum(c * d for c, (_, d) in zip(cs, its)) for a, cs in lines])
            y = self.m.NewIntVar(0, ub, "")
            self.m.Add(y >= lin)
            held = [d for _, d in its if not isinstance(d, int)]
            if len(held) < len(its):  # one holds for sure
                self.m.Add(y >= m)
            else:  # the lines cost a launch at 0 bytes: only where one holds
                some = self.m.NewBoolVar("")
                self.m.AddBoolOr([some.Not(), *held])
                for d in held:
                    self.m.AddImplication(d, some)
                self.m.Add(y >= m).OnlyEnforceIf(some)
            out.append(y)
        return self.zero + sum(out)

    def _comm(self, cols: Sequence[int]) -> int:
        """Least comm time of ``cols`` (one group) in any buckets, rounded down."""
        if not cols:
            return 0
        ops = [self.p.ops[i] for i in cols]
        return max(0, math.floor(_comm_of(ops, self.lb_of[ops[0].collective.group], {})))  # type: ignore[union-attr]

    def _need(self, cols: Sequence[int], k: int) -> int:
        """The least clock at cut k once all of ``cols`` (one group) have ended: the last of those
        with heads ``>= h`` ends at ``h`` plus their comm time or later, and what runs after its
        wait and before the cut (its tail) runs after that."""
        best = 0
        for h in sorted({self.head[i] for i in cols}):
            late = [i for i in cols if self.head[i] >= h]
            for tail in sorted({self._tail(i, k) for i in late}):
                best = max(best, h + tail + self._comm([i for i in late if self._tail(i, k) >= tail]))
        return best

    def _tail(self, c: int, k: int) -> int:
        """Compute that runs after collective ``c``'s wait and before cut k in every order."""
        key = (c, k)
        if key not in self._tails:
            w = self.p.index[self.p.wait_of[self.p.ops[c].name]]
            mask = self.p.descendants[w] & self.p.ancestors[self.cuts[k]]
            self._tails[key] = int(self.w[bit_mask(mask, self.n)].sum()) if mask else 0
        return self._tails[key]

    def _needed(self, k: int) -> dict[str, list[int]]:
        """Per group: the collectives cut ``k`` depends on."""
        out: dict[str, list[int]] = {}
        anc = self.p.ancestors[self.cuts[k]]
        for c in self.p.collectives:
            i = self.p.index[c.name]
            if anc >> i & 1:
                out.setdefault(c.collective.group, []).append(i)  # type: ignore[union-attr]
        return out

    def _stream(self) -> None:
        """What cut k depends on has ended by its clock; collectives issued after u_j start after it."""
        needed = [self._needed(k) for k in range(len(self.cuts))]
        for k, groups in enumerate(needed):
            for g, cols in groups.items():
                self.m.Add(self.clock[k] >= self._need(cols, k))
                for c in cols:  # its own bucket's copy-in runs before it starts, the copy-out after it ends
                    own = [a * self.paid[k][i] for i, a in self.own_copies.get(c, ())]
                    if own:
                        self.m.Add(self.clock[k] - sum(own) >= self._need([c], k))
                for j in range(len(self.cuts)):
                    if j == k or (isinstance(self.first[j][k], int) and self.first[j][k] == 0):
                        continue
                    new = [i for i in cols if i not in needed[j].get(g, ())]
                    if not new or len(new) > self.config.max_subset:
                        continue
                    start = self.t[j] + int(self.w[self.cuts[j]])
                    for r in range(1, len(new) + 1):
                        for sub in itertools.combinations(new, r):
                            lits = [self.x[j][i] for i in sub]
                            if any(isinstance(lit, int) and lit == 1 for lit in lits):
                                continue
                            least_tail = min(self._tail(i, k) for i in sub)
                            self._if_first(self.m.Add(self.clock[k] >= start + self._comm(sub) + least_tail), j, k,
                                           [lit.Not() for lit in lits if not isinstance(lit, int)])
            for c in self.p.collectives:  # issued before the cut: after its head
                i = self.p.index[c.name]
                lit = self.x[k][i]
                if self.head[i] and not (isinstance(lit, int) and lit == 0):
                    ct = self.m.Add(self.t[k] >= self.head[i])
                    if not isinstance(lit, int):
                        ct.OnlyEnforceIf(lit)
        self.needed = needed

    def _waits(self) -> None:
        """A collective waited before cut k has ended by its clock, with what cut k needs of its group."""
        wait_of = self.p.wait_of
        index = self.p.index
        for k, groups in enumerate(self.needed):
            for c in self.p.collectives:
                i, g = index[c.name], c.collective.group  # type: ignore[union-attr]
                if i in groups.get(g, ()):
                    continue
                lit = self.x[k][index[wait_of[c.name]]]
                if isinstance(lit, int) and lit == 0:
                    continue
                ct = self.m.Add(self.clock[k] >= self._need([*groups.get(g, ()), i], k))
                if not isinstance(lit, int):
                    ct.OnlyEnforceIf(lit)

    def _fifo(self) -> None:
        """The stream runs what ended before a cut one at a time, and in issue order.

        Ended by cut k's clock: what it needs and what was waited before it; those with heads of
        ``h`` or more take at least their bytes' comm time after ``h``, at the prices of
        :func:`.cut_prices.cut_byte_prices` (linear in the literals) or the set's chords. A
        collective that cut k needs but that was issued after ``u_j`` ends after everything issued
        before ``u_j`` in its group (FIFO)."""
        p, index = self.p, self.p.index
        wait_of = p.wait_of
        by_group: dict[str, list[int]] = {}
        for c in p.collectives:
            by_group.setdefault(c.collective.group, []).append(index[c.name])  # type: ignore[union-attr]
        for k, groups in enumerate(self.needed):
            x = self.x[k]
            for g, cols in by_group.items():
                need = set(groups.get(g, ()))
                done = {i: 1 if i in need else x[index[wait_of[p.ops[i].name]]] for i in cols}
                done = {i: d for i, d in done.items() if not (isinstance(d, int) and d == 0) and self.per_byte[i]}
                levels = sorted({self.head[i] for i in done})
                step = max(1, -(-len(levels) // self.config.set_levels)) if self.config.set_levels else len(levels) + 1
                whole = set(levels[::step][:self.config.set_levels])  # the lowest first: the largest set
                for h in levels:
                    terms = self._set_comm([(i, d) for i, d in done.items() if self.head[i] >= h], h in whole, k)
                    if any(self.head[i] == h for i in need):
                        self.m.Add(self.clock[k] >= h + terms)
                        continue
                    at_h = self.m.NewBoolVar("")  # something with head h ended: only then does h count
                    for i, d in done.items():
                        if self.head[i] == h:
                            self.m.AddImplication(d, at_h)
                    self.m.Add(self.clock[k] >= h + terms).OnlyEnforceIf(at_h)
                for j in range(len(self.cuts)):
                    if j == k or (isinstance(self.first[j][k], int) and self.first[j][k] == 0):
                        continue
                    if (j, g) not in self._ahead:  # issued before u_j: whole buckets, all run before what follows
                        self._ahead[j, g] = self._set_comm([(i, self.x[j][i]) for i in cols], True, j)
                    for c in need:
                        lit = self.x[j][c]
                        if isinstance(lit, int) and lit == 1:
                            continue  # issued before u_j: nothing follows from it
                        ct = self.m.Add(self.clock[k] >= self._comm([c]) + self._tail(c, k) + self._ahead[j, g])
                        self._if_first(ct, j, k, [] if isinstance(lit, int) else [lit.Not()])

    def _memory(self) -> None:
        """Memory at each cut (see :func:`memory_terms`) within the budget."""
        self.terms = memory_terms(self.p)
        sizes = self.p.storage_by_name
        self.mem = []
        for k, u in enumerate(self.cuts):
            x = self.x[k]
            const = sum(sizes[s].size_bytes for s in self.p.ops[u].allocates)
            parts = []
            live: list = []  # per term: 0, 1 or its literal
            for t in self.terms:
                on = self._term_live(x, t, u, live)
                live.append(on)
                if isinstance(on, int):
                    const += t.size * on
                elif t.size:
                    parts.append(t.size * on)
            expr = self.zero + const + sum(parts)
            self.m.Add(expr <= self.budget)
            self.mem.append(expr)

    def _term_live(self, x: list, t: Term, u: int, live: list):
        """0, 1 or a literal at least as large as whether term ``t`` counts at cut ``u``."""
        if (t.pos and t.pos[0] == u) or t.size == 0:
            return 0
        pl = 1 if not t.pos else x[t.pos[0]]
        if isinstance(pl, int) and pl == 0:
            return 0
        lits = None if t.neg is None else [x[r] for r in t.neg]
        if lits is not None and all(isinstance(lit, int) and lit == 1 for lit in lits):
            return 0  # every reader ran
        if t.unless is not None:  # in flight (pos before, neg not: one each) unless the other term counts
            other = live[t.unless]
            if isinstance(other, int) and other == 1:
                return 0
            v = self.m.NewBoolVar("")
            self.m.Add(v >= pl - lits[0] - other)  # type: ignore[index]
            return v
        if lits is None or any(isinstance(lit, int) and lit == 0 for lit in lits):
            return pl
        v = self.m.NewBoolVar("")
        for lit in lits:
            if not isinstance(lit, int):
                self.m.AddBoolOr([v, lit] if isinstance(pl, int) else [v, pl.Not(), lit])
        return v

    # ---- objective ----
    def _objective(self) -> None:
        """``least``: the largest memory at the cuts; else none (a decision)."""
        if self.config.least:
            self.peak = self.m.NewIntVar(0, self.budget, "peak")
            for expr in self.mem:
                self.m.Add(expr <= self.peak)
            self.m.Minimize(self.peak)


def _check_cuts(problem: ScheduleProblem, cuts: Sequence[str]) -> list[int]:
    """The cuts' op indices; a ProblemError names an unknown, non-compute or repeated cut."""
    if not cuts:
        raise ProblemError("stall_free_cuts: no cuts given")
    index = problem.index
    out = []
    for name in cuts:
        if name not in index:
            raise ProblemError(f"cut {name!r}: no such op")
        if problem.ops[index[name]].kind in (OpKind.COLLECTIVE, OpKind.WAIT):
            raise ProblemError(f"cut {name!r}: a {problem.ops[index[name]].kind.value}, not a compute op")
        out.append(index[name])
    if len(set(out)) != len(out):
        raise ProblemError(f"cut {next(c for c in cuts if list(cuts).count(c) > 1)!r}: listed twice")
    return out


def stall_free_cuts(problem: ScheduleProblem, cuts: Sequence[str], budget_bytes: int,
                    config: CutsConfig = CutsConfig(), given: Sequence[Sequence[str]] | None = None) -> CutsResult:
    """Whether an order whose compute stream never stalls until it has run every cut can keep the memory at
    every cut within ``budget_bytes`` (the module doc's relaxation; ``infeasible`` proves not). ``given``:
    per cut, the ops before it (a real order's, say), fixed; then ``infeasible`` says the model rules out
    those sets, which for a stall-free order within the budget would be a bug."""
    if budget_bytes <= 0:
        raise ProblemError(f"stall_free_cuts: budget_bytes must be > 0, got {budget_bytes!r}")
    idx = _check_cuts(problem, cuts)
    if given is not None and len(given) != len(idx):
        raise ProblemError(f"stall_free_cuts: {len(given)} given sets for {len(idx)} cuts")
    t0 = time.perf_counter()
    model = _CutsModel(problem, idx, budget_bytes, config)
    for k, names in enumerate(given or ()):
        unknown = set(names) - set(problem.index)
        if unknown:
            raise ProblemError(f"stall_free_cuts: given set {k}: no such op {sorted(unknown)[0]!r}")
        before = {problem.index[n] for n in names}
        for i, lit in enumerate(model.x[k]):
            if isinstance(lit, int):
                if lit != (i in before):
                    return CutsResult("infeasible", tuple(cuts), budget_bytes, time.perf_counter() - t0)
            else:
                model.m.Add(lit == int(i in before))
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = config.workers
    prm.random_seed = config.seed
    prm.linearization_level = 2  # the LP relaxation closes these models (level 1 leaves them UNKNOWN)
    if config.deterministic:
        prm.max_deterministic_time = config.time_limit_s
    else:
        prm.max_time_in_seconds = config.time_limit_s
    code = solver.Solve(model.m)
    status = _STATUS[code]
    runtime = time.perf_counter() - t0
    base = dict(status=status, cuts=tuple(cuts), budget_bytes=budget_bytes, runtime=runtime)
    if status == "infeasible":
        return CutsResult(**base)
    bound = None
    if config.least and status == "optimal":
        bound = int(round(solver.ObjectiveValue()))
    elif config.least and status in ("feasible", "unknown"):
        bound = math.floor(solver.BestObjectiveBound())  # rounded down: a float a hair high proves nothing
    if status not in ("optimal", "feasible"):
        return CutsResult(**base, lower_bound_bytes=bound)

    def val(lit) -> int:
        return lit if isinstance(lit, int) else int(solver.Value(lit))

    sets = tuple(tuple(op.name for i, op in enumerate(problem.ops) if val(model.x[k][i]))
                 for k in range(len(idx)))
    return CutsResult(**base, sets=sets, memory_bytes=tuple(int(solver.Value(e)) for e in model.mem),
                      clocks_ns=tuple(int(solver.Value(t)) for t in model.t),
                      lower_bound_bytes=bound)
