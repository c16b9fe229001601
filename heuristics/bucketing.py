"""Greedy size-capped bucketing of compatible collectives (DESIGN.md, "Bucketing").

Entry points:

* :func:`bucket_greedy` returns explicit buckets (tuples of collective names, 2+ each) for
  the overlap scheduler (:func:`fxsched.heuristics.overlap.overlap_schedule`) to place.
* :func:`bucketed_overlap` buckets, places the buckets with the overlap scheduler, and keeps
  the unbucketed overlap schedule when bucketing does not pay (copy-in/out costs).

Which collectives may share a bucket (enforced by :class:`BucketFeasibility`, which
:mod:`fxsched.heuristics.plans` reuses):

1. the same :meth:`CollectiveInfo.bucket_key` (kind, group, reduce op, dtype; dtype dropped in
   multi-dtype mode), and a comm curve to price the bucket at its summed size;
2. no member depends on another, directly or through other nodes;
3. feasible in the fixed-compute-order frame (:class:`Placement`): the bucket's latest
   ``unit.earliest`` is at most its earliest ``unit.need`` (else the overlap scheduler raises);
4. no cycle between buckets: contract every bucket into one node (a bucket is issued once
   and waited once); if bucket B holds a collective that depends on a member of bucket B'
   and B' one that depends on a member of B, no program order can issue and wait both, so
   the merge that would close such a cycle is refused;
Nothing here imports torch or ortools.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule, placements
from ..solver.simulator import SimResult, simulate
from .overlap import OverlapConfig, memory_budget, overlap_schedule
from .placement import Placement

log = logging.getLogger(__name__)

DEFAULT_CAP_BYTES = 256 * 2**20
DEFAULT_OVERLAP = OverlapConfig()

Bucket = tuple[str, ...]


def bit_indices(mask: int) -> Iterable[int]:
    """Indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class BucketFeasibility:
    """Incremental check of which collectives may join a bucket (rules 2-4 of the module doc).

    Collectives are numbered by their position in ``problem.collectives``. ``succ[i]`` is the
    bitset of the collectives that transitively depend on collective ``i``; ``node[i]`` the
    bitset of the bucket (open or closed) that holds ``i`` (just ``i`` while it is alone).
    Every bucket built through :meth:`join` stays registered, so later merges are checked
    against all of them for cycles.
    """

    def __init__(self, problem: ScheduleProblem, placement: Placement):
        self.problem = problem
        self.placement = placement
        names = [c.name for c in problem.collectives]
        self.names = names
        self.num = {n: i for i, n in enumerate(names)}
        op_idx = [problem.index[n] for n in names]
        desc = problem.descendants
        succ = []
        for i in range(len(names)):
            d = desc[op_idx[i]]
            m = 0
            if d:
                for j, oj in enumerate(op_idx):
                    if d >> oj & 1:
                        m |= 1 << j
            succ.append(m)
        self.succ: list[int] = succ
        self.node: list[int] = [1 << i for i in range(len(names))]

    def independent(self, members: Sequence[str], cand: str) -> bool:
        """Whether ``cand`` neither depends on, nor is depended on by, any of ``members``."""
        c = self.num[cand]
        mask = 0
        for m in members:
            i = self.num[m]
            if self.succ[i] >> c & 1:
                return False
            mask |= 1 << i
        return not self.succ[c] & mask

    def frame_feasible(self, members: Sequence[str]) -> bool:
        """Whether the bucket's inputs all exist no later than its first need (rule 3)."""
        units = self.placement.units
        return max(units[m].earliest for m in members) <= min(units[m].need for m in members)

    def acyclic(self, merged: int) -> bool:
        """Whether contracting the collectives of bitset ``merged`` into one bucket keeps the
        bucket graph acyclic, given the buckets registered so far (rule 4)."""
        succ, node = self.succ, self.node
        frontier = 0
        for i in bit_indices(merged):
            frontier |= succ[i]
        reach = 0
        while frontier:
            if frontier & merged:
                return False
            reach |= frontier
            new = 0
            for j in bit_indices(frontier):
                new |= node[j] | succ[j]
            frontier = new & ~reach
        return True

    def can_join(self, members: Sequence[str], cand: str) -> bool:
        """Whether ``cand`` may join the bucket ``members`` (all rules but the key and cap)."""
        if not self.independent(members, cand):
            return False
        if not self.frame_feasible((*members, cand)):
            return False
        merged = 1 << self.num[cand]
        for m in members:
            merged |= self.node[self.num[m]]
        return self.acyclic(merged)

    def join(self, members: Sequence[str]) -> None:
        """Register ``members`` as one bucket (call after :meth:`can_join` allowed each)."""
        merged = 0
        for m in members:
            merged |= self.node[self.num[m]]
        for i in bit_indices(merged):
            self.node[i] = merged


def need_order(problem: ScheduleProblem, placement: Placement) -> list[str]:
    """Collectives in the order the frame needs them: ``unit.need``, then original index."""
    units, idx = placement.units, problem.index
    return sorted((c.name for c in problem.collectives), key=lambda c: (units[c].need, idx[c]))


def bucketable(problem: ScheduleProblem, name: str) -> bool:
    """Whether a collective can be priced inside a bucket (its group and kind have a curve)."""
    info = problem.op_by_name[name].collective
    assert info is not None
    return (info.group, info.kind) in problem.curve_by_key


def exposed_collectives(problem: ScheduleProblem, schedule: Schedule) -> set[str]:
    """Collectives whose wait stalls the compute stream when ``schedule`` is simulated (every
    member of an exposed bucket counts as exposed)."""
    res = simulate(problem, schedule)
    return {m for t in res.collectives if t.exposed_ns > 0 for m in t.members}


def bucket_greedy(
    problem: ScheduleProblem,
    *,
    cap_bytes: int = DEFAULT_CAP_BYTES,
    multi_dtype: bool = False,
    exposed_first: bool = False,
    schedule: Schedule | None = None,
    placement: Placement | None = None,
    headroom: Mapping[str, int] | None = None,
) -> tuple[Bucket, ...]:
    """Greedy size-capped buckets of compatible collectives.

    A bucket's size is the sum over its members of ``max(bytes_in, bytes_out)``, so one cap
    serves all_gather (output is larger) and reduce_scatter (input is larger). The walk goes
    over the collectives in need order (:func:`need_order`) keeping one open bucket per
    bucket key. A collective joins its key's open bucket when the cap still holds and
    :meth:`BucketFeasibility.can_join` allows it; otherwise that bucket is closed and the
    collective opens a new one. A collective larger than the cap, or without a comm curve
    for its (group, kind), stays alone. Buckets of one member are dropped.

    ``exposed_first``: simulate ``schedule`` (default: the unbucketed
    :func:`overlap_schedule` in the same frame) and walk twice. Pass 1 walks only the
    collectives whose wait stalls there (in need order), so exposed collectives are
    bucketed with each other first: they are on the critical path, where each latency a
    merge saves shows in the makespan. Pass 2 walks every collective not yet in a bucket
    (the hidden ones and the exposed ones pass 1 left alone), with fresh open buckets.
    Both passes share the feasibility state. Without ``exposed_first``, ``schedule`` is
    ignored.

    ``headroom``: per collective, bytes that a bucket holding it may take beyond its own size
    (:func:`memory_headroom`): a bucket's cap is then the least of ``cap_bytes`` and each
    member's size plus headroom, so buckets stay small where memory is tight and grow where it
    frees up (comm-bound graphs, where every merge saves latency and per-byte cost).

    Members of each bucket are listed in original order; buckets in the order they were
    closed (deterministic for a given problem).
    """
    if cap_bytes < 0:
        raise ValueError(f"bucket_greedy: cap_bytes must be >= 0, got {cap_bytes}")
    pl = placement or Placement(problem)
    feas = BucketFeasibility(problem, pl)
    walk = [c for c in need_order(problem, pl) if bucketable(problem, c)]
    passes: list[list[str]] = [walk]
    if exposed_first:
        sched = schedule if schedule is not None else overlap_schedule(problem, placement=pl)
        exposed = exposed_collectives(problem, sched)
        first = [c for c in walk if c in exposed]
        log.debug("bucket_greedy: %d of %d collectives exposed", len(first), len(walk))
        passes = [first, walk]
    ops = problem.op_by_name
    done: set[str] = set()
    out: list[list[str]] = []
    for names in passes:
        open_: dict[tuple, tuple[list[str], int, int]] = {}  # key -> (members, size, cap) of its open bucket
        for c in names:
            if c in done:
                continue
            info = ops[c].collective
            assert info is not None
            key = info.bucket_key(multi_dtype)
            size = max(info.bytes_in, info.bytes_out)
            own_cap = cap_bytes if headroom is None else min(cap_bytes, size + headroom[c])
            cur = open_.get(key)
            if cur is not None and cur[1] + size <= min(cur[2], own_cap) and feas.can_join(cur[0], c):
                cur[0].append(c)
                open_[key] = (cur[0], cur[1] + size, min(cur[2], own_cap))
                feas.join(cur[0])
                continue
            if cur is not None:
                _close(cur[0], out, done)
            open_[key] = ([c], size, own_cap)  # one larger than the cap stays alone: nothing fits beside it
        for members, _, _ in open_.values():
            _close(members, out, done)
    idx = problem.index
    buckets = tuple(tuple(sorted(b, key=idx.__getitem__)) for b in out)
    log.debug("bucket_greedy: %d buckets over %d collectives (cap %d bytes)",
              len(buckets), sum(map(len, buckets)), cap_bytes)
    return buckets


def _close(members: list[str], out: list[list[str]], done: set[str]) -> None:
    """Keep a closed bucket when it has 2+ members (a single collective stays alone)."""
    if len(members) >= 2:
        out.append(members)
        done.update(members)


def bucketed_overlap(
    problem: ScheduleProblem,
    *,
    cap_bytes: int = DEFAULT_CAP_BYTES,
    multi_dtype: bool = False,
    exposed_first: bool = False,
    config: OverlapConfig = DEFAULT_OVERLAP,
    base: Schedule | None = None,
    headroom_share: float | None = None,
    deadline: float | None = None,
) -> Schedule:
    """:func:`bucket_greedy`, then :func:`overlap_schedule` places the buckets.

    The memory budget is overlap_schedule's (``config.memory_budget_bytes``, default the
    original order's peak). The bucketed schedule is kept only when it simulates to a
    strictly smaller makespan than the unbucketed ``overlap_schedule`` and its peak memory
    is within ``max(budget, unbucketed peak)``; otherwise the unbucketed schedule is returned
    (bucketing is not always a win: copy-in/out cost compute time and buffers). ``base``: that
    unbucketed schedule when the caller has it already (same ``config``; 7.5 s on 80 layers).
    ``headroom_share``: cap each bucket by that share of its members' memory headroom in the
    unbucketed schedule too (:func:`memory_headroom`). ``deadline``: overlap_schedule's.
    """
    pl = Placement(problem, config.move_chains)
    base = overlap_schedule(problem, config=config, placement=pl, deadline=deadline) if base is None else base
    r0 = simulate(problem, base)
    budget = memory_budget(problem, config)
    headroom = None if headroom_share is None else memory_headroom(problem, base, budget, headroom_share, r0)
    buckets = bucket_greedy(problem, cap_bytes=cap_bytes, multi_dtype=multi_dtype,
                            exposed_first=exposed_first, schedule=base, placement=pl, headroom=headroom)
    if not buckets:
        return base
    try:
        cand = overlap_schedule(problem, buckets, multi_dtype=multi_dtype, config=config, placement=pl,
                                deadline=deadline)
        r1 = simulate(problem, cand)
    except ValueError as err:  # ScheduleError is a ValueError too
        log.warning("bucketed_overlap: placing %d buckets failed (%s); keeping the unbucketed schedule",
                    len(buckets), err)
        return base
    if r1.makespan_ns < r0.makespan_ns and r1.peak_memory_bytes <= max(budget, r0.peak_memory_bytes):
        log.info("bucketed_overlap: %d buckets: makespan %d -> %d ns", len(buckets),
                 r0.makespan_ns, r1.makespan_ns)
        return cand
    log.info("bucketed_overlap: bucketing does not pay (makespan %d vs %d ns, peak %d vs %d); "
             "keeping the unbucketed schedule", r1.makespan_ns, r0.makespan_ns,
             r1.peak_memory_bytes, r0.peak_memory_bytes)
    return base


def memory_headroom(problem: ScheduleProblem, schedule: Schedule, budget_bytes: int,
                    share: float = 1.0, res: SimResult | None = None) -> dict[str, int]:
    """Per collective: ``share`` of the memory budget left over its whole span in ``schedule``
    (``budget - max memory`` from its issue to its wait, at least 0). A bucket's buffers live over
    that span, so a bucket that holds it can take roughly that much beyond its own size; share < 1
    leaves room for the bucket's span growing (buckets are issued at their last member's slot)
    and for the other buckets it overlaps. ``res``: ``schedule`` simulated, when the caller has it."""
    curve = (simulate(problem, schedule) if res is None else res).memory_curve
    out: dict[str, int] = {}
    for p in placements(problem, schedule):
        left = max(0, budget_bytes - max(curve[p.issue_pos:p.wait_pos + 1]))
        for m in p.members:
            out[m] = int(share * left)
    return out
