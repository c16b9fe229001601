"""Overlap list scheduler: hide collectives behind compute, in fixed heavy-compute order.

Entry point: :func:`overlap_schedule`. Each collective (or bucket) moves with its
producer-only chain; its wait sinks to just before its first use. Per process group, the
collectives something consumes are planned in the order they are needed (Inductor's
priority: the index of the compute they feed, then the slot their inputs exist, then original
order); those that only feed the graph's outputs (gradient reductions) are planned as needed
at the end, or issued as soon as their inputs exist (both are rungs of the ladder below).
Where each consumed one is issued:

* ``just_in_time``: as late as still lets it finish before it is needed, planned backwards
  over the group's FIFO on the backbone's compute clock (the chains' own compute is left out:
  ``slack`` covers it): prefetching no earlier than needed keeps buffers short-lived.
* ``early``: as early as its inputs allow, at most ``prefetch_limit_ns`` of compute ahead.
  Issuing early also pulls the chains' casts forward, and that compute can hide a gather
  that nothing else could.
* ``keep``: where the original order issued it (no prefetch; only its wait moves), the
  rung that still pays when memory forbids any prefetch.
* ``auto`` (default): all three, keeping the best.

Memory: the scheduler tries a ladder of settings, from most to least aggressive — waits
sunk to first use or placed where the collective should have finished, and at most k
collectives in flight per group (before issuing one more, the oldest is waited: Inductor's
"place the oldest wait" rule) — and keeps the best makespan whose peak memory fits the budget
(default: the original order's peak). The original order is the last rung.

A rung that exceeds the budget at a few positions is not lost: with ``repair_memory`` (default
on), the fastest over-budget rungs that would beat the best fitting one are repaired collective
by collective (:func:`.memory_repair.repair_memory`: waits pulled earlier, issues pulled later,
toward the original placement) and kept when they then fit and are faster.

With a wall-clock ``deadline`` (a compile hook's time budget), once it has passed no further rung
is walked and no repair starts, as soon as one rung has been scored: on the 80-layer backward
the ladder and its repairs take about 9 s, which a 10 s budget cannot afford.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule, ScheduleError, check_schedule
from ..solver.simulator import SimResult, copy_in_ns, memory_curve, simulate
from .memory_repair import DEFAULT_MAX_SIMULATIONS, MemoryRepair, repair_memory
from .placement import Placement, assemble

log = logging.getLogger(__name__)

_IN_FLIGHT_LADDER = (None, 8, 4, 2, 1)
_Best = tuple[tuple[int, int], Schedule] | None  # ((makespan, peak), schedule) of the best so far
_REPAIR_SIMULATIONS = 2 * DEFAULT_MAX_SIMULATIONS  # per policy, over all the rungs it repairs
_MIN_REPAIR_SIMULATIONS = 8  # fewer left: no more repairs
_MAX_REPAIRS = 3  # rungs repaired per policy, fastest first


@dataclass(frozen=True)
class OverlapConfig:
    policy: str = "auto"  # "just_in_time", "early", "keep", or "auto": all, keep the best
    prefetch_limit_ns: int | None = None  # "early": most compute time to prefetch ahead of need
    slack: float = 0.05  # "just_in_time": finish this fraction of a runtime before the need
    assume_bucketed: bool = False  # a same-key predecessor in the FIFO saves this one's latency
    move_chains: bool = True
    memory_budget_bytes: int | None = None  # None: the original order's peak
    repair_memory: bool = True  # repair over-budget rungs collective by collective

    def __post_init__(self) -> None:
        if self.policy not in ("auto", "just_in_time", "early", "keep"):
            raise ValueError(f"OverlapConfig.policy: unknown policy {self.policy!r}")
        if self.slack < 0:
            raise ValueError("OverlapConfig.slack must be >= 0")
        if self.prefetch_limit_ns is not None and self.prefetch_limit_ns < 0:
            raise ValueError("OverlapConfig.prefetch_limit_ns must be >= 0")


@dataclass(frozen=True)
class _Item:
    members: tuple[str, ...]
    group: str
    key: tuple
    earliest: int
    need: int
    runtime_ns: int
    first: int  # smallest original index, for stable tie-breaks


def original_peak(problem: ScheduleProblem) -> int:
    initial, curve = memory_curve(problem, Schedule.original(problem))
    return max([initial, *curve])


def memory_budget(problem: ScheduleProblem, config: OverlapConfig) -> int:
    """The budget ``config`` sets: its bytes, or by default the original order's peak."""
    return config.memory_budget_bytes if config.memory_budget_bytes is not None else original_peak(problem)


def overlap_schedule(
    problem: ScheduleProblem,
    buckets: Sequence[Sequence[str]] = (),
    *,
    multi_dtype: bool = False,
    config: OverlapConfig = OverlapConfig(),
    placement: Placement | None = None,
    deadline: float | None = None,
) -> Schedule:
    """The best schedule over the memory ladder that fits the budget (see module docstring);
    ``deadline``: a ``time.perf_counter()`` time past which the ladder stops (module doc)."""
    pl = placement or Placement(problem, config.move_chains)
    original = Schedule.original(problem)
    res0 = simulate(problem, original)
    budget = config.memory_budget_bytes if config.memory_budget_bytes is not None else res0.peak_memory_bytes
    items = _items(problem, pl, buckets, multi_dtype)
    best: _Best = None
    fallback: tuple[int, Schedule] | None = None
    scored: dict[Schedule, SimResult] = {}  # rungs often coincide; score each schedule once
    seen_all: set[Schedule] = set()
    repairs: dict[tuple, MemoryRepair | None] = {}
    policies = ("just_in_time", "early", "keep") if config.policy == "auto" else (config.policy,)
    for policy in policies:
        if scored and _past(deadline):
            log.info("overlap_schedule: deadline passed; %d of %d policies walked", policies.index(policy),
                     len(policies))
            break
        best_p, shared, over, low = _ladder(problem, pl, items, config, policy, buckets, multi_dtype, budget,
                                            scored, seen_all, deadline)
        if config.repair_memory and over and not _past(deadline):
            best_p = _repair(pl, over, buckets, multi_dtype, budget, best_p, res0, repairs, deadline)
        for cand in (shared, best_p):
            if cand is not None and (best is None or cand[0] < best[0]):
                best = cand
        if low is not None and (fallback is None or low[0] < fallback[0]):
            fallback = low
    if best is None and fallback is None:
        log.warning("overlap_schedule: no rung could place the %d buckets; scheduling without them", len(buckets))
        return overlap_schedule(problem, (), config=config, placement=pl, deadline=deadline)
    if best is not None:
        if res0.peak_memory_bytes <= budget and res0.makespan_ns < best[0][0]:
            return original
        return _checked(problem, best[1])
    if res0.peak_memory_bytes <= budget:
        log.info("overlap_schedule: no overlapped schedule fits %d bytes; keeping the original order", budget)
        return original
    assert fallback is not None
    log.warning("overlap_schedule: memory budget %d bytes is below every schedule tried; "
                "returning the one with the lowest peak", budget)
    return original if res0.peak_memory_bytes <= fallback[0] else _checked(problem, fallback[1])


def _ladder(
    problem: ScheduleProblem, pl: Placement, items: list[_Item], config: OverlapConfig, policy: str,
    buckets: Sequence[Sequence[str]], multi_dtype: bool, budget: int,
    scored: dict[Schedule, SimResult], seen_all: set[Schedule], deadline: float | None = None,
) -> tuple[_Best, _Best, list[_Rung], tuple[int, Schedule] | None]:
    """Walk ``policy``'s ladders: (best fitting rung, best fitting rung as "auto" walks it, the
    over-budget rungs to repair, the over-budget rung with the lowest peak).

    Each (completion, flush) ladder goes from the most to the least in-flight collectives and
    stops at its first rung that fits, which is what ``policy`` alone does (the first and third
    results, so that "auto" repairs exactly what each policy alone would, and is never slower
    than any). "auto" used to skip the rungs an earlier policy already scored and stop at the
    first new rung that fits; the second result keeps that walk, so it is never slower than it
    was either. ``scored`` and ``seen_all`` are shared between policies. Past ``deadline`` no
    rung is walked once one has been scored (by any policy).
    """
    best: _Best = None
    shared: _Best = None
    over: list[_Rung] = []
    low: tuple[int, Schedule] | None = None
    seen: set[Schedule] = set()
    for on_completion, flush_early in itertools.product((False, True), (False, True)):
        alone_done = shared_done = False
        for in_flight in _IN_FLIGHT_LADDER:
            if scored and _past(deadline):
                return best, shared, over, low
            issue, wait, prio, after = _plan(pl, items, config, policy, on_completion, in_flight, flush_early)
            try:
                sched = assemble(pl, issue, wait, buckets, multi_dtype, prio, after)
            except ValueError as e:  # a bucket the cross-group reads push past a member's need
                log.debug("overlap_schedule: rung %s skipped: %s", (policy, on_completion, flush_early, in_flight), e)
                continue
            if sched in seen:
                continue
            seen.add(sched)
            new = sched not in seen_all
            seen_all.add(sched)
            if sched not in scored:
                scored[sched] = simulate(problem, sched, check=False)  # the one returned is checked later
            res = scored[sched]
            key = (res.makespan_ns, res.peak_memory_bytes)
            fits = res.peak_memory_bytes <= budget
            if not fits and (low is None or res.peak_memory_bytes < low[0]):
                low = (res.peak_memory_bytes, sched)
            if not alone_done:
                if fits:
                    alone_done = True
                    if best is None or key < best[0]:
                        best = (key, sched)
                else:
                    excess = sum(m - budget for m in res.memory_curve if m > budget)
                    over.append(_Rung(res.makespan_ns, excess, issue, wait, prio, after))
            if new and fits and not shared_done:
                shared_done = True
                if shared is None or key < shared[0]:
                    shared = (key, sched)
            if alone_done and shared_done:
                break
    return best, shared, over, low


@dataclass(frozen=True)
class _Rung:
    """The slots of a rung whose schedule exceeded the budget (see :func:`_plan`)."""

    makespan_ns: int
    excess: int  # bytes over the budget summed over positions: the smaller, the easier to repair
    issue: dict[str, int]
    wait: dict[str, int]
    prio: dict[str, int]
    after: dict[str, tuple[str, ...]]


def _repair(
    pl: Placement, over: list[_Rung], buckets: Sequence[Sequence[str]], multi_dtype: bool, budget: int,
    best: _Best, res0: SimResult, memo: dict[tuple, MemoryRepair | None], deadline: float | None = None,
) -> _Best:
    """``best`` improved by repairing one policy's fastest over-budget rungs that are faster
    than it (or than the original order when nothing fits yet): at most ``_MAX_REPAIRS``
    rungs and ``_REPAIR_SIMULATIONS`` simulator calls. A repair rarely speeds a rung up, so
    slower rungs are not tried, nor, once one repair succeeded, rungs no faster and further
    over the budget than the one repaired, nor any rung once a repair failed (what stopped it,
    a point no move frees or memory freed too slowly, is most likely shared by the policy's
    other rungs). ``memo`` holds the repairs done for other policies: a rung repaired again
    costs what it cost then, so each policy's result is the one it gets alone. No repair starts
    past ``deadline``, and a repair under way stops there."""
    def bar() -> float:
        if best is not None:
            return best[0][0]
        return res0.makespan_ns if res0.peak_memory_bytes <= budget else float("inf")

    repaired_excess: int | None = None
    sims_left, tries = _REPAIR_SIMULATIONS, 0
    for rung in sorted(over, key=lambda r: (r.makespan_ns, r.excess)):
        if (rung.makespan_ns >= bar() or sims_left < _MIN_REPAIR_SIMULATIONS or tries == _MAX_REPAIRS
                or _past(deadline)):
            break
        if repaired_excess is not None and rung.excess > repaired_excess:
            continue
        tries += 1
        cap = min(DEFAULT_MAX_SIMULATIONS, sims_left)
        slots = (cap, *(tuple(sorted(d.items())) for d in (rung.issue, rung.wait, rung.prio, rung.after)))
        if slots not in memo:  # "auto" meets the same rung under several policies
            memo[slots] = repair_memory(pl, rung.issue, rung.wait, budget, buckets, multi_dtype, rung.prio,
                                        rung.after, max_simulations=cap, deadline=deadline)
        fixed = memo[slots]
        if fixed is None:
            continue
        sims_left -= fixed.simulations
        if not fixed.fits:
            break
        repaired_excess = rung.excess
        key = (fixed.result.makespan_ns, fixed.result.peak_memory_bytes)
        log.debug("overlap_schedule: repaired a rung: makespan %d -> %d ns, peak %d <= %d",
                  rung.makespan_ns, key[0], key[1], budget)
        if best is None or key < best[0]:
            best = (key, fixed.schedule)
    return best


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _checked(problem: ScheduleProblem, schedule: Schedule) -> Schedule:
    """Raise ScheduleError if a bug made an invalid schedule (never hand one out)."""
    violations = check_schedule(problem, schedule)
    if violations:
        raise ScheduleError(violations)
    return schedule


def _items(problem: ScheduleProblem, pl: Placement, buckets: Sequence[Sequence[str]], multi_dtype: bool) -> list[_Item]:
    ops = problem.op_by_name
    out = []
    for members in pl.groups(buckets):
        info = ops[members[0]].collective
        assert info is not None
        earliest, need = pl.slot_bounds(members)
        if earliest > need:
            raise ValueError(f"bucket {members}: a member is needed (slot {need}) before another's "
                             f"inputs exist (slot {earliest}) in fixed-compute-order mode")
        # the copy-in runs on the compute stream right before the issue
        rt = problem.bucket_runtime_ns(members) + copy_in_ns(problem, members)
        out.append(_Item(members, info.group, info.bucket_key(multi_dtype), earliest, need, rt,
                         min(problem.index[m] for m in members)))
    return out


def _latency(problem: ScheduleProblem, item: _Item) -> int:
    info = problem.op_by_name[item.members[0]].collective
    curve = problem.curve_by_key.get((info.group, info.kind))  # type: ignore[union-attr]
    return min(curve.runtime_ns(0), item.runtime_ns) if curve else 0


def _plan(
    pl: Placement, items: list[_Item], config: OverlapConfig, policy: str, on_completion: bool,
    in_flight: int | None, flush_early: bool,
) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, tuple[str, ...]]]:
    """Issue and wait slots of every collective, the in-slot priority (issue order), and the
    waits each collective must follow (the max-in-flight rule).

    Per group, the collectives something consumes are planned in need order by ``policy``.
    Those only the graph's output consumes (gradient reductions) are planned with them, as
    needed at the end, or, with ``flush_early``, issued as soon as their inputs exist, so their
    inputs die early (at the price of occupying the FIFO sooner). All are then issued in order
    of their planned slots, ties in need order.
    """
    clock = pl.clock
    last = pl.n_slots - 1
    by_group: dict[str, list[_Item]] = {}
    for it in items:
        by_group.setdefault(it.group, []).append(it)
    issue: dict[str, int] = {}
    wait: dict[str, int] = {}
    prio: dict[str, int] = {}
    after: dict[str, tuple[str, ...]] = {}
    original_issue = pl.original_slots[0]
    for group_items in by_group.values():
        consumed = sorted((it for it in group_items if it.need < last or not flush_early),
                          key=lambda i: (i.need, i.earliest, i.first))
        rt = {it: it.runtime_ns for it in group_items}
        if config.assume_bucketed:
            for prev, it in zip(consumed, consumed[1:]):
                if prev.key == it.key:
                    rt[it] -= _latency(pl.problem, it)
        want = {it: it.earliest for it in group_items}
        if policy == "keep":
            want = {it: max(original_issue[m] for m in it.members) for it in group_items}
        elif policy == "just_in_time":
            next_start = None
            for it in reversed(consumed):
                end = clock[it.need] - int(rt[it] * config.slack)
                if next_start is not None:
                    end = min(end, next_start)
                next_start = end - rt[it]
                want[it] = pl.slot_at_or_before(next_start, it.earliest, it.need)
        elif config.prefetch_limit_ns is not None:
            for it in consumed:
                want[it] = pl.slot_at_or_after(clock[it.need] - config.prefetch_limit_ns, it.earliest, it.need)
        seq = sorted(group_items, key=lambda i: (want[i], i.need, i.first))
        prev_issue, prev_end = 0, 0
        slots: list[tuple[int, int]] = []
        for i, it in enumerate(seq):
            s = max(want[it], prev_issue)
            oldest: tuple[str, ...] = ()
            if in_flight is not None and i >= in_flight:
                s = max(s, slots[i - in_flight][1])  # the oldest in flight is waited first
                oldest = tuple(pl.problem.wait_of[m] for m in seq[i - in_flight].members)
            s = min(s, it.need)
            end = max(clock[s], prev_end) + rt[it]
            w = pl.slot_at_or_after(end, s, it.need) if on_completion else it.need
            slots.append((s, w))
            prev_issue, prev_end = s, end
            for m in it.members:
                issue[m], wait[m] = s, w
                prio[m] = len(prio)
                after[m] = oldest
    return issue, wait, prio, after
