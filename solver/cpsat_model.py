"""The CP-SAT model of the execution model over a :class:`Frame` (variables / constraints / objective).

Decisions: which candidate (lone collective or bucket) holds each collective, the key (program
position) of every movable item, and hence each group's FIFO order. Times follow from them:

* the compute clock: an item starts no earlier than every item before it ends (pairwise order
  literals; in fixed mode the backbone is a chain of segment intervals);
* a collective starts no earlier than its issue block ends (chains and copy-in run first) and
  than every collective issued before it on its group ends (FIFO); a wait ends no earlier than
  its collective (plus the bucket copy-out);
* memory: every storage is an interval on the key axis from the key of the op that allocates it
  to one past the key of its last use, so a cumulative over keys bounds the memory at every
  program position exactly as the simulator counts it.

Every time constraint is a lower bound, so the model's makespan is an upper bound on the
simulated makespan of the decoded order, and equal to it at an optimum (each simulated
timeline is itself a model solution).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from .cpsat_frame import Frame, Item, ItemKind


@dataclass
class ModelVars:
    present: dict[int, object] = field(default_factory=dict)  # item -> literal (or True)
    x: dict[int, cp_model.IntVar] = field(default_factory=dict)  # candidate -> chosen
    key: dict[int, object] = field(default_factory=dict)  # item -> first key (var or int)
    slot: dict[int, cp_model.IntVar] = field(default_factory=dict)  # fixed mode, movable items
    start: dict[int, cp_model.IntVar] = field(default_factory=dict)
    end: dict[int, cp_model.IntVar] = field(default_factory=dict)
    seg_start: list[cp_model.IntVar] = field(default_factory=list)
    seg_end: list[object] = field(default_factory=list)
    comm_start: dict[int, cp_model.IntVar] = field(default_factory=dict)
    comm_end: dict[int, cp_model.IntVar] = field(default_factory=dict)
    before: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    makespan: cp_model.IntVar | None = None
    peak: cp_model.IntVar | None = None


class ModelBuilder:
    """Builds the CP-SAT model for one frame. ``budget_bytes`` caps the peak (None: uncapped)."""

    def __init__(self, frame: Frame, budget_bytes: int | None, pinned: tuple[tuple[str, str], ...] = ()):
        self.frame = frame
        self.problem = frame.problem
        self.budget = budget_bytes
        self.pinned = pinned
        self.model = cp_model.CpModel()
        self.v = ModelVars()
        items = frame.items
        self.movable = [it for it in items if it.kind is not ItemKind.FIXED]
        self.horizon = (sum(it.cost_ns for it in items) + sum(c.runtime_ns for c in frame.candidates) + 1)
        self.key_hi = frame.n_keys + 1  # keys are shifted by one: key 0 is "before the first op"
        self.window_end: cp_model.IntVar | None = None  # truncated window rounds: minimize_window_end

    def build(self) -> cp_model.CpModel:
        self.variables()
        self.constraints()
        return self.model

    # ------------------------------------------------------------------ variables
    def variables(self) -> None:
        m, v, f = self.model, self.v, self.frame
        for c in f.candidates:
            v.x[c.index] = m.NewBoolVar(f"x_{c.index}")
        for it in f.items:
            v.present[it.index] = True if it.candidate is None else v.x[it.candidate]
            if it.kind is ItemKind.FIXED:
                v.key[it.index] = 1 + it.key  # type: ignore[operator]
                continue
            if it.times is not None:  # window rounds: done before the window
                v.start[it.index], v.end[it.index] = it.times
            else:
                v.start[it.index] = m.NewIntVar(0, self.horizon, f"s_{it.index}")
                v.end[it.index] = m.NewIntVar(0, self.horizon, f"e_{it.index}")
            if f.mode == "fixed":
                span = f.key_span
                v.slot[it.index] = sl = m.NewIntVarFromDomain(cp_model.Domain.FromValues(it.slots), f"sl_{it.index}")
                rank = m.NewIntVar(0, span - 1 - len(it.ops), f"r_{it.index}")
                k = m.NewIntVar(1, self.key_hi, f"k_{it.index}")
                m.Add(k == 1 + sl * span + rank)
                v.key[it.index] = k
            elif it.key is not None:  # frozen item of a window round
                v.key[it.index] = 1 + it.key
            else:
                lo, hi = f.window if f.window is not None else (0, f.n_keys)
                v.key[it.index] = m.NewIntVar(1 + lo, hi - len(it.ops) + 1, f"k_{it.index}")
        for c in f.candidates:
            if c.index in f.comm_times:
                v.comm_start[c.index], v.comm_end[c.index] = f.comm_times[c.index]
                continue
            v.comm_start[c.index] = m.NewIntVar(0, self.horizon, f"cs_{c.index}")
            v.comm_end[c.index] = m.NewIntVar(0, self.horizon, f"ce_{c.index}")
        for a, b in f.segments:
            s = m.NewIntVar(0, self.horizon, f"gs_{a}")
            v.seg_start.append(s)
            v.seg_end.append(s + sum(f.items[k].cost_ns for k in range(a, b)))
        v.makespan = m.NewIntVar(0, self.horizon, "makespan")
        v.peak = m.NewIntVar(0, sum(s.size_bytes for s in self.problem.storages) * 3 + 1, "peak")

    # ---------------------------------------------------------------- constraints
    def constraints(self) -> None:
        self.choose_candidates()
        self.item_durations()
        self.backbone_chain()
        self.pairwise_order()
        self.collective_timing()
        self.pins()
        self.makespan_def()
        self.memory()

    def choose_candidates(self) -> None:
        """Each collective is in exactly one chosen candidate (plan buckets are the only ones)."""
        for name, cands in self.frame.cands_of.items():
            self.model.AddExactlyOne(self.v.x[c] for c in cands)

    def item_durations(self) -> None:
        m, v = self.model, self.v
        for it in self.movable:
            if it.times is not None:
                continue
            if it.kind is ItemKind.WAIT:
                m.Add(v.end[it.index] >= v.start[it.index] + it.cost_ns)
            else:
                m.Add(v.end[it.index] == v.start[it.index] + it.cost_ns)

    def backbone_chain(self) -> None:
        """Fixed mode: segments run in order; a movable item before/after a segment is ordered
        with it on the clock, decided by its slot (only the segments its slots touch or bound:
        the chain orders it with the rest)."""
        f, m, v = self.frame, self.model, self.v
        for g in range(1, len(f.segments)):
            m.Add(v.seg_start[g] >= v.seg_end[g - 1])
        if f.mode != "fixed":
            return
        seg_starts = [a for a, _ in f.segments]
        for it in self.movable:
            lo, hi = min(it.slots), max(it.slots)
            lit = v.present[it.index]
            enf = [] if lit is True else [lit]
            first_g = max(0, bisect.bisect_left(seg_starts, lo) - 1)
            last_g = min(len(f.segments), bisect.bisect_right(seg_starts, hi) + 1)
            for g in range(first_g, last_g):
                a, b = f.segments[g]
                if b <= lo:
                    if b == lo:
                        m.Add(v.start[it.index] >= v.seg_end[g]).OnlyEnforceIf(enf)
                elif a >= hi:
                    if a == hi:
                        m.Add(v.seg_start[g] >= v.end[it.index]).OnlyEnforceIf(enf)
                else:
                    first = m.NewBoolVar("")  # item in a slot at or before a
                    m.Add(v.slot[it.index] <= a).OnlyEnforceIf(first)
                    m.Add(v.slot[it.index] >= b).OnlyEnforceIf(first.Not())
                    m.Add(v.seg_start[g] >= v.end[it.index]).OnlyEnforceIf([first, *enf])
                    m.Add(v.start[it.index] >= v.seg_end[g]).OnlyEnforceIf([first.Not(), *enf])

    def _order_free(self, a: Item, b: Item) -> bool:
        """Whether a and b may both be present, and so need an order between them."""
        f = self.frame
        if a.candidate is not None and b.candidate is not None and a.candidate != b.candidate:
            if set(f.candidates[a.candidate].members) & set(f.candidates[b.candidate].members):
                return False
        if f.mode == "fixed" and not set(a.slots) & set(b.slots):
            return False  # their slots order them (through the segments between)
        return True

    def pairwise_order(self) -> None:
        """Every two movable items that may share a place get an order literal (or a forced order
        from data dependencies): keys, the clock and, for two issues of one group, FIFO. Frozen
        items (anchored at the incumbent's positions) keep their mutual order: a chain of
        consecutive pairs, and per group a FIFO chain of their issues, stand for all their pairs."""
        free = [it for it in self.movable if it.anchor is None]
        frozen = sorted((it for it in self.movable if it.anchor is not None), key=lambda it: (it.anchor, it.index))
        if self.frame.window is not None:
            self._window_order(free, frozen)
            return
        for a, b in itertools.chain(itertools.combinations(free, 2), itertools.product(free, frozen)):
            self._order_pair(a, b)
        for a, b in zip(frozen, frozen[1:]):
            self._precede(a, b, [])
        self._frozen_fifo(frozen)

    def _frozen_fifo(self, frozen: list[Item]) -> None:
        """Per group, a FIFO chain of the frozen items' issues."""
        last_issue: dict[str, Item] = {}
        for it in frozen:
            if it.kind is ItemKind.ISSUE:
                group = self.frame.candidates[it.candidate].group  # type: ignore[index]
                prev = last_issue.get(group)
                if prev is not None:
                    self._fifo(prev, it, self._presences(prev, it))
                last_issue[group] = it

    def _window_order(self, free: list[Item], frozen: list[Item]) -> None:
        """Free window (cpsat_window.py): the frozen items run in their key order, the free ones
        between the last frozen item before the window and the first after it, in any order their
        dependencies allow; each free issue sits in its group's FIFO between the frozen issues
        before and after the window. Frozen items' keys are constants, so only the clock and the
        FIFO need stating for them."""
        lo = self.frame.window[0]  # type: ignore[index]
        for a, b in itertools.combinations(free, 2):
            self._order_pair(a, b)
        for a, b in zip(frozen, frozen[1:]):
            self._clock(a, b)
        self._frozen_fifo(frozen)
        before = [it for it in frozen if it.key < lo]  # type: ignore[operator]
        after = frozen[len(before):]
        cands = self.frame.candidates

        def group(it: Item) -> str:
            return cands[it.candidate].group  # type: ignore[index]

        prev = {group(it): it for it in before if it.kind is ItemKind.ISSUE}  # the last one per group
        nxt = {group(it): it for it in reversed(after) if it.kind is ItemKind.ISSUE}  # the first one
        end = self.frame.window_end_ns
        for w in free:
            if before:
                self._clock(before[-1], w)
            if after:
                self._clock(w, after[0])
            elif end is not None:  # a truncated window at the end of the order: no later than the incumbent's
                self._ge(end, self.v.end[w.index], self._presences(w, w)[:1])
            if w.kind is ItemKind.ISSUE:
                if (p := prev.get(group(w))) is not None:
                    self._fifo(p, w, self._presences(p, w))
                if (n := nxt.get(group(w))) is not None:
                    self._fifo(w, n, self._presences(w, n))

    def _clock(self, a: Item, b: Item) -> None:
        """b starts after a ends on the compute stream (when both are present)."""
        self._ge(self.v.start[b.index], self.v.end[a.index], self._presences(a, b))

    def _ge(self, lhs, rhs, enf: list) -> None:
        """``lhs >= rhs`` under ``enf``; window rounds make some terms constants (done before the
        window), and a constraint between two constants that holds is left out."""
        if isinstance(lhs, int) and isinstance(rhs, int):
            if lhs < rhs:
                self.model.AddBoolOr([lit.Not() for lit in enf])
            return
        self.model.Add(lhs >= rhs).OnlyEnforceIf(enf)

    def _presences(self, a: Item, b: Item) -> list:
        return [self.v.present[i.index] for i in (a, b) if self.v.present[i.index] is not True]

    def _order_pair(self, a: Item, b: Item) -> None:
        m, v, f = self.model, self.v, self.frame
        free = self._order_free(a, b)
        if (a.index in b.deps or b.index in a.deps) and (free or f.mode == "fixed"):
            first, second = (a, b) if a.index in b.deps else (b, a)
            self._precede(first, second, [])
        elif free:
            lit = m.NewBoolVar(f"b_{a.index}_{b.index}")
            v.before[(a.index, b.index)] = lit
            self._precede(a, b, [lit])
            self._precede(b, a, [lit.Not()])
        elif f.mode == "fixed" and self._same_group_issues(a, b) and not set(a.slots) & set(b.slots):
            # slots (contiguous runs) order them: the clock follows from the segments between,
            # the group's FIFO must be stated
            first, second = (a, b) if max(a.slots) < min(b.slots) else (b, a)
            self._fifo(first, second, self._presences(a, b))

    def _precede(self, a: Item, b: Item, enf: list) -> None:
        """Under ``enf`` (and both present): a runs before b."""
        v = self.v
        enf = enf + [v.present[i.index] for i in (a, b) if v.present[i.index] is not True]
        self._ge(v.key[b.index], v.key[a.index] + len(a.ops), enf)
        self._ge(v.start[b.index], v.end[a.index], enf)
        if self._same_group_issues(a, b):
            self._fifo(a, b, enf)

    def _same_group_issues(self, a: Item, b: Item) -> bool:
        if a.kind is not ItemKind.ISSUE or b.kind is not ItemKind.ISSUE:
            return False
        cands = self.frame.candidates
        return cands[a.candidate].group == cands[b.candidate].group  # type: ignore[index]

    def _fifo(self, a: Item, b: Item, enf: list) -> None:
        """Issue a before issue b on one group: b's collective starts after a's ends (under ``enf``,
        which must hold the presence literals)."""
        v = self.v
        ca, cb = self.frame.candidates[a.candidate], self.frame.candidates[b.candidate]  # type: ignore[index]
        self._ge(v.comm_start[cb.index], v.comm_end[ca.index], enf)

    def collective_timing(self) -> None:
        m, v, f = self.model, self.v, self.frame
        by_group: dict[str, list] = {}
        for c in f.candidates:
            x = v.x[c.index]
            w = f.wait_item[c.index]
            self._ge(v.end[w], v.comm_end[c.index] + c.copy_out_ns, [x])
            if c.index in f.comm_times:  # window rounds: issued before the window, times constant
                continue
            m.Add(v.comm_end[c.index] == v.comm_start[c.index] + c.runtime_ns)
            m.Add(v.comm_start[c.index] >= v.end[f.issue_item[c.index]]).OnlyEnforceIf(x)
            by_group.setdefault(c.group, []).append(m.NewOptionalIntervalVar(
                v.comm_start[c.index], c.runtime_ns, v.comm_end[c.index], x, f"comm_{c.index}"))
        for intervals in by_group.values():
            m.AddNoOverlap(intervals)  # redundant with FIFO, helps propagation

    def pins(self) -> None:
        """User pins (a, b): op a runs before op b."""
        v, f = self.v, self.frame
        for a, b in self.pinned:
            for ia, oa in f.op_items[a]:
                for ib, ob in f.op_items[b]:
                    enf = [v.present[i] for i in (ia, ib) if v.present[i] is not True]
                    self._ge(v.key[ib] + ob, v.key[ia] + oa + 1, enf)

    def makespan_def(self) -> None:
        m, v = self.model, self.v
        if v.seg_end:
            m.Add(v.makespan >= v.seg_end[-1])
        for it in self.movable:
            lit = v.present[it.index]
            m.Add(v.makespan >= v.end[it.index]).OnlyEnforceIf([] if lit is True else [lit])

    # --------------------------------------------------------------------- memory
    def memory(self) -> None:
        """Cumulative over keys: storages, bucket buffers, and (fixed mode) the constant base."""
        from .cpsat_memory import (
            MemoryModel,  # one seam: storage life ranges in key space
        )

        MemoryModel(self).add()
        if self.budget is not None:
            self.model.Add(self.v.peak <= self.budget)

    # ------------------------------------------------------------------ objective
    def minimize_makespan(self) -> None:
        self.model.Minimize(self.v.makespan)

    def minimize_window_end(self) -> None:
        """Truncated window rounds (cpsat_window.py): the end of the window's last item, then the
        sum of the ends of the collectives issued in it whose wait after it stalled (what the rest
        of the program waits on: a window that ends as early with such a collective ending
        earlier is better; the others' ends matter only in as far as they are bounded). Weighted
        so that one ns of the first outweighs every ns of the second."""
        m, v, f = self.model, self.v, self.frame
        end = m.NewIntVar(0, self.horizon, "window_end")
        for it in self.movable:
            if it.times is None:
                lit = v.present[it.index]
                m.Add(end >= v.end[it.index]).OnlyEnforceIf([] if lit is True else [lit])
        comm = []
        for c in f.candidates:
            w = f.items[f.wait_item[c.index]]
            if c.index not in f.comm_times and w.times is not None and w.times[1] - w.times[0] > w.cost_ns:
                comm.append(v.comm_end[c.index])
        m.Minimize((len(comm) + 1) * end + sum(comm))
        self.window_end = end

    def minimize_peak(self, makespan_cap: int) -> None:
        self.model.ClearObjective()
        self.model.Add(self.v.makespan <= makespan_cap)
        self.model.Minimize(self.v.peak)


