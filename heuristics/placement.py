"""Fixed-compute-order placement: the frame every greedy scheduler here works in.

The **backbone** is every op that is neither a collective, nor a wait, nor in a collective's
**producer-only chain**, kept in the original order (so the order of heavy compute is kept, as
Inductor does). A chain is the non-heavy ops (casts, views, copy-in) that feed nothing but their
collective, whatever they cost: in Llama graphs every parameter all_gather sits right behind its own bf16 cast, so
moving the collective alone would hide nothing (Inductor's ``_schedule_path_to_collective``).

Slot ``k`` is the gap just before backbone op ``k`` (slot ``len(backbone)`` is the end). A
scheduler picks an issue slot for each collective (its chain goes with it) and a wait slot for
each wait; :func:`assemble` turns those choices into a :class:`Schedule`.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from ..solver.problem import OpKind, ScheduleProblem, topological_order
from ..solver.schedule import Schedule


def producer_only_chain(problem: ScheduleProblem, collective: str) -> tuple[str, ...]:
    """The cheap ops that feed nothing but ``collective`` (transitively), in original order."""
    ops, users, idx = problem.op_by_name, problem.users, problem.index
    chain: set[str] = set()
    heap = [(-idx[d], d) for d in ops[collective].deps]
    heapq.heapify(heap)
    seen: set[str] = set()
    while heap:  # latest first, so every user of a candidate is decided before it
        _, d = heapq.heappop(heap)
        if d in seen:
            continue
        seen.add(d)
        op = ops[d]
        if op.kind not in (OpKind.COMPUTE, OpKind.ZERO) or op.heavy:
            continue
        if all(u == collective or u in chain for u in users[d]):
            chain.add(d)
            for dd in op.deps:
                heapq.heappush(heap, (-idx[dd], dd))
    return tuple(sorted(chain, key=idx.__getitem__))


def _contiguous_suffix(problem: ScheduleProblem, collective: str, chain: tuple[str, ...]) -> tuple[str, ...]:
    """The ops of ``chain`` after the last timed compute op outside it that precedes ``collective``."""
    if not chain:
        return chain
    ops, idx = problem.ops, problem.index
    members = set(chain)
    lo = idx[chain[0]]
    for i in range(idx[collective] - 1, lo - 1, -1):
        op = ops[i]
        if op.name not in members and op.kind is OpKind.COMPUTE and op.runtime_ns > 0:
            return tuple(m for m in chain if idx[m] > i)
    return chain


@dataclass(frozen=True)
class Unit:
    """A collective with its chain, and the slots between which it may be issued and waited."""

    collective: str
    chain: tuple[str, ...]
    earliest: int  # first slot where everything it reads is available
    need: int  # last slot its wait may take (just before its first consumer)


class Placement:
    """Backbone, units and the compute clock of a problem in fixed-compute-order mode."""

    def __init__(self, problem: ScheduleProblem, move_chains: bool = True, contiguous_chains: bool = False):
        """``contiguous_chains``: a chain keeps only its ops that no other timed op separates from
        the collective in ``problem``'s order; the rest stay in the backbone, where that order runs
        them. A neighbourhood search over an incumbent's order uses it, so that every incumbent is
        exactly representable (a chain moved to its issue would run its compute elsewhere)."""
        self.problem = problem
        ops = problem.ops
        chains = {c.name: producer_only_chain(problem, c.name) if move_chains else ()
                  for c in problem.collectives}
        if contiguous_chains:
            chains = {c: _contiguous_suffix(problem, c, ch) for c, ch in chains.items()}
        in_unit = {op: c for c, ch in chains.items() for op in ch} | {c: c for c in chains}
        self.backbone: tuple[str, ...] = tuple(
            op.name for op in ops if op.kind is not OpKind.WAIT and op.name not in in_unit)
        self.slot_of_backbone = {name: i for i, name in enumerate(self.backbone)}
        by_name = problem.op_by_name
        clock = [0]
        for name in self.backbone:
            clock.append(clock[-1] + by_name[name].runtime_ns)
        self.clock: tuple[int, ...] = tuple(clock)  # compute time before each slot
        self.n_slots = len(self.backbone) + 1

        # earliest: after every backbone op the unit reads, and no earlier than any collective
        # whose wait it reads (that wait sits between the two issues). Units in original order,
        # so a collective is settled before any unit that reads its result.
        earliest: dict[str, int] = {}
        for c in sorted(chains, key=problem.index.__getitem__):
            e = 0
            for m in (*chains[c], c):
                for d in by_name[m].deps:
                    if d in self.slot_of_backbone:
                        e = max(e, self.slot_of_backbone[d] + 1)
                    elif by_name[d].waits_on is not None:
                        e = max(e, earliest[by_name[d].waits_on])
            earliest[c] = e
        # need: before the first backbone op that reads the wait, and no later than the latest
        # issue of any collective whose unit reads it (settled first: reverse original order).
        # Where that reader is actually issued is known only once a scheduler has chosen:
        # :meth:`reconcile` then pulls the wait up to it.
        readers: dict[str, list[str]] = {c: [] for c in chains}
        need_of: dict[str, int] = {}
        for c in sorted(chains, key=problem.index.__getitem__, reverse=True):
            need = self.n_slots - 1
            for u in problem.users[problem.wait_of[c]]:
                if u in self.slot_of_backbone:
                    need = min(need, self.slot_of_backbone[u])
                elif u in in_unit:
                    if in_unit[u] not in readers[c]:
                        readers[c].append(in_unit[u])
                    need = min(need, need_of[in_unit[u]])
            need_of[c] = need
        self.units: dict[str, Unit] = {c: Unit(c, chains[c], earliest[c], need_of[c]) for c in chains}
        self.readers: dict[str, tuple[str, ...]] = {c: tuple(r) for c, r in readers.items()}

    def reconcile(
        self, issue: dict[str, int], wait: dict[str, int], buckets: Sequence[Sequence[str]] = ()
    ) -> None:
        """Make chosen slots consistent where a collective reads another's wait: the reader
        (its whole bucket) is issued no earlier than the collective it reads, and that wait is
        placed no later than the reader's issue; a collective raised here has its wait moved
        no earlier than its new issue. Mutates ``issue`` and ``wait``."""
        bucket_of = {m: tuple(b) for b in buckets for m in b}
        raised: set[str] = set()
        for c in sorted(self.units, key=self.problem.index.__getitem__):
            for u in self.readers[c]:
                if issue[u] < issue[c]:
                    for m in bucket_of.get(u, (u,)):
                        if issue[m] < issue[c]:
                            issue[m] = issue[c]
                            raised.add(m)
        for c in self.units:
            if self.readers[c]:
                wait[c] = min(wait[c], *(issue[u] for u in self.readers[c]))
            if c in raised:
                wait[c] = max(wait[c], issue[c])

    def groups(self, buckets: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
        """Every bucket, then every collective outside one: what moves as one item."""
        bucketed = {m for b in buckets for m in b}
        return [tuple(b) for b in buckets] + [(c,) for c in self.units if c not in bucketed]

    def slot_bounds(self, members: Sequence[str]) -> tuple[int, int]:
        """(earliest, need) of a bucket: after every member's inputs, before any member's need."""
        return max(self.units[m].earliest for m in members), min(self.units[m].need for m in members)

    def slot_at_or_before(self, t: int, lo: int, hi: int) -> int:
        """The last slot in [lo, hi] whose compute clock is <= t (lo if none)."""
        s = bisect.bisect_right(self.clock, t, lo, hi + 1) - 1
        return max(lo, min(s, hi))

    def slot_at_or_after(self, t: int, lo: int, hi: int) -> int:
        """The first slot in [lo, hi] whose compute clock is >= t (hi if none)."""
        s = bisect.bisect_left(self.clock, t, lo, hi + 1)
        return max(lo, min(s, hi))

    @cached_property
    def block_deps(self) -> dict[str, frozenset[str]]:
        """Per collective, the waits its block (chain and issue) reads; per wait, its collective:
        what must precede each item of a slot in :func:`assemble`, buckets aside."""
        p = self.problem
        out: dict[str, frozenset[str]] = {}
        for c, unit in self.units.items():
            out[c] = frozenset(d for m in (*unit.chain, c) for d in p.op_by_name[m].deps
                               if p.op_by_name[d].kind is OpKind.WAIT)
            out[p.wait_of[c]] = frozenset((c,))
        return out

    @cached_property
    def original_slots(self) -> tuple[dict[str, int], dict[str, int]]:
        """(issue, wait) slots that reproduce the original positions as closely as the frame allows."""
        issue, wait = {}, {}
        nxt = self._next_backbone_slot
        for c, u in self.units.items():
            issue[c] = min(max(nxt[c], u.earliest), u.need)
            wait[c] = min(max(nxt[self.problem.wait_of[c]], issue[c]), u.need)
        return issue, wait

    @cached_property
    def _next_backbone_slot(self) -> dict[str, int]:
        out, k = {}, 0
        for op in self.problem.ops:
            if op.name in self.slot_of_backbone:
                k = self.slot_of_backbone[op.name] + 1
            else:
                out[op.name] = k
        return out


def assemble(
    placement: Placement,
    issue: Mapping[str, int],
    wait: Mapping[str, int],
    buckets: Sequence[Sequence[str]] = (),
    multi_dtype: bool = False,
    priority: Mapping[str, int] | None = None,
    issue_after: Mapping[str, Sequence[str]] | None = None,
) -> Schedule:
    """Build the schedule that issues each collective (right after its chain) at ``issue[c]``
    and waits at ``wait[c]``, after :meth:`Placement.reconcile`.

    Within a slot, each collective's chain and issue form one contiguous block. Blocks go
    before waits, each in ``priority`` order (default: original order), subject to: data
    dependencies, a bucket's waits after all its members' issues, and ``issue_after[c]``
    (waits that must come before collective ``c``'s block when they share its slot).
    """
    p = placement.problem
    prio = priority or {}
    issue, wait = dict(issue), dict(wait)
    placement.reconcile(issue, wait, buckets)
    at: list[list[str]] = [[] for _ in range(placement.n_slots)]
    for c, unit in placement.units.items():
        s, w = issue[c], wait[c]
        if not unit.earliest <= s <= w <= unit.need:
            raise ValueError(f"collective {c!r}: slots issue {s}, wait {w} outside [{unit.earliest}, {unit.need}]")
        at[s].append(c)
        at[w].append(p.wait_of[c])
    # item -> items that must precede it (when in its slot)
    before: dict[str, set[str]] = {n: set(d) for n, d in placement.block_deps.items()}
    for b in buckets:
        for m in b:
            before[p.wait_of[m]].update(b)
    def own_key(n: str) -> tuple[bool, int, int]:
        return (p.op_by_name[n].kind is OpKind.WAIT, prio.get(p.op_by_name[n].waits_on or n, 0), p.index[n])

    order: list[str] = []
    for k, items in enumerate(at):
        if len(items) == 1:
            n = items[0]
            order.extend((*placement.units[n].chain, n) if n in placement.units else (n,))
        elif items:
            # a wait that a block needs goes as soon as that block would (it must precede it)
            key = {n: own_key(n) for n in items}
            changed = True
            while changed:
                changed = False
                for n in items:
                    for d in before.get(n, ()):
                        if d in key and key[n] < key[d]:
                            key[d], changed = key[n], True
            soft = {n: set(issue_after.get(n, ())) for n in items} if issue_after else {}
            try:  # issue_after edges are preferences: drop them if they close a cycle
                ordered = _local_topo(items, {n: before.get(n, set()) | soft.get(n, set()) for n in items},
                                      key.__getitem__)
            except ValueError:
                ordered = _local_topo(items, before, key.__getitem__)
            for n in ordered:
                order.extend((*placement.units[n].chain, n) if n in placement.units else (n,))
        if k < len(placement.backbone):
            order.append(placement.backbone[k])
    return Schedule(order=tuple(order), buckets=tuple(tuple(b) for b in buckets), multi_dtype=multi_dtype)


def _local_topo(items: list[str], before: Mapping[str, set[str]], key) -> list[str]:  # noqa: ANN001
    """Order ``items`` so that each comes after those of ``before[item]`` present here,
    smallest ``key`` first when free (raises ProblemError, a ValueError, on a cycle)."""
    present = set(items)
    return topological_order(items, {n: [d for d in before.get(n, ()) if d in present] for n in items}, key)
