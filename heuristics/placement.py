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

from ..solver.problem import OpKind, ProblemError, ScheduleProblem
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
    def item_keys(self) -> dict[str, tuple[bool, str, int]]:
        """Per collective and wait: (is a wait, the collective whose priority orders it, original
        index), what :func:`assemble` orders the items of a slot by."""
        p = self.problem
        out: dict[str, tuple[bool, str, int]] = {}
        for c in self.units:
            w = p.wait_of[c]
            out[c] = (False, c, p.index[c])
            out[w] = (True, c, p.index[w])
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
    at: dict[int, list[str]] = {}  # the slots that hold items, and their items
    for c, unit in placement.units.items():
        s, w = issue[c], wait[c]
        if not unit.earliest <= s <= w <= unit.need:
            raise ValueError(f"collective {c!r}: slots issue {s}, wait {w} outside [{unit.earliest}, {unit.need}]")
        at.setdefault(s, []).append(c)
        at.setdefault(w, []).append(p.wait_of[c])
    # what must precede an item of a slot: the frame's block dependencies, and for the wait of a
    # bucket's member every member (each bucket is one group of those edges, kept as a group)
    bucket_of = {m: g for g, b in enumerate(buckets) for m in b}
    units, backbone = placement.units, placement.backbone
    order: list[str] = []
    done = 0  # backbone ops placed: slot k comes right before backbone op k
    for k in sorted(at):
        order.extend(backbone[done:k])
        done = k
        items = at[k]
        if len(items) == 1:
            ordered = items
        elif _unconstrained(items, placement.block_deps, bucket_of, placement.item_keys, issue_after):
            keys = placement.item_keys  # no edge among them: _Slot's order is the least key first
            ordered = sorted(items, key=lambda n: (keys[n][0], prio.get(keys[n][1], 0), keys[n][2], n))
        else:
            slot = _Slot(items, placement.block_deps, bucket_of, placement.item_keys, prio)
            soft = {n: frozenset(issue_after.get(n, ())) for n in items} if issue_after else None
            try:  # issue_after edges are preferences: drop them if they close a cycle
                ordered = slot.order(soft)
            except ValueError:
                ordered = slot.order(None)
        for n in ordered:
            if n in units:
                order.extend(units[n].chain)
            order.append(n)
    order.extend(backbone[done:])
    return Schedule(order=tuple(order), buckets=tuple(tuple(b) for b in buckets), multi_dtype=multi_dtype)


def _unconstrained(items: list[str], block_deps: Mapping[str, frozenset[str]], bucket_of: Mapping[str, int],
                   static: Mapping[str, tuple[bool, str, int]], issue_after: Mapping[str, Sequence[str]] | None) -> bool:
    """Whether no item of a slot must follow another there: none has a block dependency or an
    ``issue_after`` wait among them, and no bucket has both a member and a member's wait among
    them. Then :class:`_Slot` lowers no key and orders the items by key alone (the stream plan
    search assembles about 12 slots a plan, most of them such)."""
    present = set(items)
    seen: dict[int, bool] = {}  # per bucket: whether a wait (True) or a member (False) is here
    for n in items:
        if not present.isdisjoint(block_deps.get(n, ())):
            return False
        if issue_after and not present.isdisjoint(issue_after.get(n, ())):
            return False
        is_wait, coll, _ = static[n]
        g = bucket_of.get(coll)
        if g is not None and seen.setdefault(g, is_wait) != is_wait:
            return False
    return True


class _Slot:
    """The items (blocks and waits) that :func:`assemble` puts in one slot, and their order.

    Each item follows its block dependencies present here; a bucket member's wait follows every
    member of that bucket present here (one group of edges per bucket, counted down as a whole,
    so a bucket of ``k`` members costs ``O(k)``, not ``k**2`` edges). Keys: each item's own,
    lowered to the least key of the items that must follow it (a wait that a block needs goes
    as soon as that block would); among the items free to go, the least key goes first."""

    def __init__(self, items: list[str], block_deps: Mapping[str, frozenset[str]], bucket_of: Mapping[str, int],
                 static: Mapping[str, tuple[bool, str, int]], prio: Mapping[str, int]) -> None:
        """``static``: :attr:`Placement.item_keys`; ``prio``: each collective's priority (default 0),
        which orders it and its wait after whether the item is a wait."""
        self.items = items
        present = set(items)
        self.deps = {n: block_deps.get(n, frozenset()) & present for n in items}
        self.members: dict[int, list[str]] = {}  # per bucket: its members here
        self.waits: dict[int, list[str]] = {}  # per bucket: its members' waits here
        key: dict[str, tuple[bool, int, int]] = {}
        for n in items:
            is_wait, coll, index = static[n]
            key[n] = (is_wait, prio.get(coll, 0), index)
            g = bucket_of.get(coll)
            if g is not None:
                (self.waits if is_wait else self.members).setdefault(g, []).append(n)
        changed = True
        while changed:
            changed = False
            for n in items:
                for d in self.deps[n]:
                    if key[n] < key[d]:
                        key[d], changed = key[n], True
            for g, waits in self.waits.items():
                least = min(key[w] for w in waits)
                for m in self.members.get(g, ()):
                    if least < key[m]:
                        key[m], changed = least, True
        self.key = key

    def order(self, soft: Mapping[str, frozenset[str]] | None) -> list[str]:
        """Kahn's algorithm, least key first (then name) among the free items, with ``soft[n]``
        as extra predecessors of ``n``; raises ProblemError (a ValueError) on a cycle."""
        items, key = self.items, self.key
        present = set(items)
        indeg = dict.fromkeys(items, 0)
        users: dict[str, list[str]] = {n: [] for n in items}
        group_wait = {w: g for g, waits in self.waits.items() if self.members.get(g) for w in waits}
        left = {g: len(self.members[g]) for g in set(group_wait.values())}
        member_group = {m: g for g in left for m in self.members[g]}
        for n in items:
            preds = self.deps[n] | (soft[n] & present) if soft else self.deps[n]
            g = group_wait.get(n)
            if g is not None:
                preds = preds.difference(self.members[g])
                indeg[n] += 1  # the group: all of its members here
            indeg[n] += len(preds)
            for d in preds:
                users[d].append(n)
        heap = [(key[n], n) for n in items if indeg[n] == 0]
        heapq.heapify(heap)
        out: list[str] = []

        def release(u: str) -> None:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (key[u], u))

        while heap:
            _, n = heapq.heappop(heap)
            out.append(n)
            for u in users[n]:
                release(u)
            g = member_group.get(n)
            if g is not None:
                left[g] -= 1
                if left[g] == 0:
                    for w in self.waits[g]:
                        release(w)
        if len(out) != len(items):
            stuck = next(n for n in items if indeg[n] > 0)
            raise ProblemError(f"cycle through node {stuck!r}")
        return out
