"""Peak memory in the CP-SAT model: storage life ranges as intervals on the key (program) axis.

The simulator counts a storage as live from the position of the op that allocates it to the
position of its last use (parameters and graph outputs: to the end). Here each storage is an
interval ``[alloc key, last use key + 1)`` whose end is a variable above every use; a cumulative
over all of them with capacity ``peak`` is then the simulator's peak, since every key between
two ops carries no more than the op before it. Collective rules as in the simulator: a lone
collective's inputs stay live to its wait; a bucket's copy-in reads them at the bucket issue; a
bucket's flat buffers live from issue to wait; all_gather/all_to_all bucket outputs appear at
the wait, reduce_scatter/all_reduce ones at the issue and are freed together.

Storages whose whole life is fixed (fixed mode: backbone only) form a constant base profile,
reduced to its maximum between consecutive breakpoints of the variable load.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from .cpsat_frame import ItemKind
from .problem import OpKind

if TYPE_CHECKING:
    from .cpsat_model import ModelBuilder

Point = tuple[list, object]  # (enforcement literals, key expression or int)


class MemoryModel:
    def __init__(self, b: ModelBuilder):
        self.b = b
        self.f = b.frame
        self.p = b.problem
        self.m = b.model
        self.v = b.v
        self.end_key = b.key_hi + 1  # past the last op: "never freed"
        self.intervals: list = []
        self.demands: list[int] = []
        self.base: list[tuple[int, int, int]] = []  # constant (start, end, size)
        self.breaks: set[int] = {0, self.end_key}

    # points ---------------------------------------------------------------
    def _pos(self, op: str) -> list[Point]:
        """Where ``op`` runs: one point per item that may hold it."""
        out = []
        for item, off in self.f.op_items[op]:
            lit = self.v.present[item]
            out.append(([] if lit is True else [lit], self.v.key[item] + off))
        return out

    def _issue_pos(self, cand: int) -> Point:
        it = self.f.issue_item[cand]
        return [self.v.x[cand]], self.v.key[it] + len(self.f.items[it].ops) - 1

    def _wait_pos(self, cand: int) -> Point:
        return [self.v.x[cand]], self.v.key[self.f.wait_item[cand]]

    def _alloc_points(self, op: str) -> list[Point]:
        o = self.p.op_by_name[op]
        if o.kind is not OpKind.COLLECTIVE:
            return self._pos(op)
        out = []
        for k in self.f.cands_of[op]:
            c = self.f.candidates[k]
            if not c.is_bucket:
                it = self.f.issue_item[k]
                off = self.f.items[it].ops.index(op)
                out.append(([self.v.x[k]], self.v.key[it] + off))
            else:
                out.append(self._wait_pos(k) if c.copies_out else self._issue_pos(k))
        return out

    def _use_points(self, op: str) -> list[Point]:
        o = self.p.op_by_name[op]
        if o.kind is not OpKind.COLLECTIVE:
            return self._pos(op)
        return [self._issue_pos(k) if self.f.candidates[k].is_bucket else self._wait_pos(k)
                for k in self.f.cands_of[op]]

    # model ----------------------------------------------------------------
    def add(self) -> None:
        alloc_by: dict[str, str] = {}
        users: dict[str, list[str]] = {}
        for op in self.p.ops:
            for s in op.allocates:
                alloc_by[s] = op.name
            for s in op.uses:
                users.setdefault(s, []).append(op.name)
        ends: dict[str, object] = {}
        for s in self.p.storages:
            if s.size_bytes == 0:
                continue
            allocs: list[Point] = [([], 0)] if s.is_input else self._alloc_points(alloc_by[s.name])
            uses = [pt for u in users.get(s.name, ()) for pt in self._use_points(u)]
            if s.name in alloc_by and self.p.op_by_name[alloc_by[s.name]].kind is OpKind.COLLECTIVE:
                uses += [self._wait_pos(k) for k in self.f.cands_of[alloc_by[s.name]]]
            ends[s.name] = self._storage(s.size_bytes, s.never_freed, allocs, uses)
        self._merged_outputs(ends)
        self._flat_buffers()
        self._base_profile()
        self.m.AddCumulative(self.intervals, self.demands, self.v.peak)

    def _storage(self, size: int, never_freed: bool, allocs: list[Point], uses: list[Point]) -> object:
        const = all(not enf and isinstance(e, int) for enf, e in allocs + uses)
        if never_freed and len(allocs) == 1 and not allocs[0][0] and isinstance(allocs[0][1], int):
            self.base.append((allocs[0][1], self.end_key, size))
            return self.end_key
        if const and len(allocs) == 1:
            a = allocs[0][1]
            end = self.end_key if never_freed else max([a + 1, *(e + 1 for _, e in uses)])  # type: ignore[operator]
            self.base.append((a, end, size))  # type: ignore[arg-type]
            return end
        end = self.m.NewIntVar(0, self.end_key, "")
        if never_freed:
            self.m.Add(end == self.end_key)
        for enf, e in uses:
            self.m.Add(end >= e + 1).OnlyEnforceIf(enf)
            if isinstance(e, int):
                self.breaks.add(e + 1)
        for enf, a in allocs:
            self.m.Add(end >= a + 1).OnlyEnforceIf(enf)
            self._interval(a, end, size, enf)
        return end

    def _interval(self, start, end, size: int, enf: list) -> None:
        if isinstance(start, int):
            self.breaks.add(start)
        length = self.m.NewIntVar(0, self.end_key, "")
        if enf:
            assert len(enf) == 1
            iv = self.m.NewOptionalIntervalVar(start, length, end, enf[0], "")
        else:
            iv = self.m.NewIntervalVar(start, length, end, "")
        self.intervals.append(iv)
        self.demands.append(size)

    def _merged_outputs(self, ends: dict[str, object]) -> None:
        """reduce_scatter / all_reduce bucket outputs are views of one buffer: freed together."""
        ops = self.p.op_by_name
        for c in self.f.candidates:
            if not c.is_bucket or c.copies_out:
                continue
            outs = [ends[s] for mname in c.members for s in ops[mname].allocates if s in ends]
            for a in outs:
                for b in outs:
                    if a is not b and not isinstance(a, int):
                        self.m.Add(a >= b).OnlyEnforceIf(self.v.x[c.index])

    def _flat_buffers(self) -> None:
        ops = self.p.op_by_name
        for c in self.f.candidates:
            if not c.is_bucket:
                continue
            infos = [ops[mname].collective for mname in c.members]
            size = sum(i.bytes_in for i in infos)  # type: ignore[union-attr]
            if c.copies_out:
                size += sum(i.bytes_out for i in infos)  # type: ignore[union-attr]
            if size == 0:
                continue
            (_, start), (_, wait) = self._issue_pos(c.index), self._wait_pos(c.index)
            self._interval(start, wait + 1, size, [self.v.x[c.index]])

    def _base_profile(self) -> None:
        """The constant storages, as their maximum over each range between breakpoints."""
        if not self.base:
            return
        if self.f.mode == "fixed":
            span = self.f.key_span
            for it in self.f.items:
                if it.kind is not ItemKind.FIXED:
                    for s in it.slots:  # a slot's movable keys see one constant base
                        self.breaks.update((1 + s * span, 1 + s * span + span - 1))
        delta: dict[int, int] = {}
        for a, e, size in self.base:
            delta[a] = delta.get(a, 0) + size
            delta[e] = delta.get(e, 0) - size
        points = sorted(delta)
        if self.f.mode != "fixed":  # movable items may sit anywhere: keep every step
            self.breaks.update(points)
        level, levels = 0, []
        for k in points:
            level += delta[k]
            levels.append(level)
        breaks = sorted(k for k in self.breaks if 0 <= k <= self.end_key)
        if self.f.window is not None:
            # window rounds: every variable point lies in the window's keys, so the load outside
            # them is the incumbent's (within the budget); only the window's base matters
            lo, hi = (1 + k for k in self.f.window)
            breaks = [lo, *(k for k in breaks if lo < k < hi), hi]
        for lo, hi in zip(breaks, breaks[1:]):
            # the base level at lo, and every change inside [lo, hi)
            i = bisect.bisect_right(points, lo) - 1
            peak = levels[i] if i >= 0 else 0
            j = i + 1
            while j < len(points) and points[j] < hi:
                peak = max(peak, levels[j])
                j += 1
            if peak > 0:
                self.intervals.append(self.m.NewIntervalVar(lo, hi - lo, hi, ""))
                self.demands.append(peak)

