"""Stream plan search: choose every group's buckets and their FIFO order at once, by annealing.

Entry point: :func:`plan_search`. Where a group's communication stream is the bottleneck (the
4-node backward: its one group's stream is busy from 0.5 ms to the end), the makespan is the
stream's work plus its idle time. The work falls with fewer, larger buckets (the cost curve is
concave), and the memory budget decides how large they may be where: a gather prefetched early
holds its output, a reduce-scatter bucket holds its members' gradients until the last is ready.
The greedy bucketer (bucketing.py) draws every boundary once, from a size cap and the headroom
where a bucket starts, and the bucket shifts (bucket_shift.py) move one member at a time between
neighbours, keeping only moves that pay at once: neither reaches a plan whose early buckets are
small and whose later ones are large when the path there first gets worse.

Here a **plan** is every group's whole stream: a sequence of **runs**, each a run of consecutive
collectives of one bucket key in the order compute needs them (then the order their inputs
exist), issued as one bucket. Simulated annealing moves a boundary between two runs of one key,
merges or splits runs, and swaps neighbouring runs of different keys (a gradient bucket ahead of
a gather). The simulator scores every plan: its makespan plus a price per byte over the memory
budget, so that the search may pass through plans over it; the fastest plan within the budget
is kept.

A plan becomes a schedule in the fixed-compute-order frame (placement.py) in three passes. The
draft issues each run as early as its inputs and the runs before it on its stream allow, and
waits it where it is first needed. From the draft's timeline, each run is then issued at the
last slot whose compute clock does not pass the time the draft started it (buffers live no
longer than the stream makes them wait); from that timeline, each is waited at the first slot
whose clock reaches the time it ended (gradient buffers freed as soon as that costs no stall;
before that slot nothing changed, so no wait stalls). A plan that would beat the best so far but
lies a little over the budget (at the start of a backward, the loss gradient's temporaries meet
the first prefetched gathers) is repaired (memory_repair.py: issues later, waits earlier).

The annealing takes ``ANNEAL_SHARE`` of the plans (or the time); from the best plan within the
budget it has found, an iterated local search takes the rest (plan_polish.py: kicks that drop or add
a boundary, each followed by a descent), which leaves the annealing's basin where the annealing
at its temperatures does not.

The annealing starts from the **coarse plan** (:func:`coarse_plan`: each list cut into a few runs of
equal bytes) that scores best, priced memory included, and falls back to the given schedule's plan
if it has found nothing within the budget faster than the given schedule after ``COARSE_SHARE`` of
the search. From the given plan, the merges toward few large buckets each go over the budget alone.

On the 4-node backward (budget: the original order's peak; 2 cores), from the greedy bucketer's
175.9 ms (the bucket shifts stop at 168.2 ms), 1,500 plans (10 s) reach 161.2, 161.5, 161.0 and
162.2 ms (seeds 0-3) from the coarse start (5 runs a list: 170.9 ms at 1.066 times the budget), and
166.3, 161.1, 160.5 and 164.1 ms from the given plan.

Nothing here imports torch or ortools.
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..solver.cpsat_frame import bucket_size_bytes
from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.simulator import CollectiveTiming, SimResult, simulate, timed_clocks
from .bucketing import BucketFeasibility, bucketable
from .memory_repair import repair_memory
from .overlap import original_peak
from .placement import Placement, assemble
from .plan_polish import Plan, Run, next_of_list, polish

log = logging.getLogger(__name__)


DEFAULT_EVALS = 2000  # plans scored when neither max_evals nor a deadline is given
# share of the plans (or the time) the annealing takes; the polish (plan_polish.py) takes the rest
ANNEAL_SHARE = 0.5
T_START, T_END = 0.003, 1e-4  # annealing temperature, as shares of the incumbent's makespan
MAX_SHIFT = 4  # most collectives a boundary move carries across
REPAIR_SIMULATIONS = 12  # simulator calls a memory repair of a plan over the budget may take
REPAIR_OVER = 0.05  # and only of one at most this share over it
# plans after which a search that has beaten neither the given schedule nor (over the budget, priced)
# its score gives up: on the tp and tp_2x4 backwards (not stream-bound) 450 plans in 7-9 s gained
# nothing, time the reordering steps after it need
GIVE_UP_EVALS = 150
# and only past this share of its plans or time, after the fall back to the given plan (COARSE_SHARE)
# has had its turn. Searches run only where a stream is the bottleneck (warm_start.stream_bound): on
# the 4-node backward, seed 8 found nothing in its first 150 plans (0.4 s) and gave up, and the 60 s
# solve ended at 168,709.5 us; with 600 plans (no give-up) it reaches 162.9 ms, every seed of 0-11
# 161.1-164.5
GIVE_UP_SHARE = 0.5  # of the annealing's share
# a byte over the memory budget costs this share of the incumbent's makespan per byte of budget (1%
# over costs 1.6% of the makespan): the search may cross plans over the budget on its way
OVER_PRICE = 1.6
REJECT_TEMPERATURES = 12  # a plan slower than the current by this many temperatures is rejected unseen
COARSE_PIECES = tuple(range(1, 13))  # runs per list of the coarse plans scored as starts (coarse_plan)
# share of the search after which one that started from a coarse plan and has found nothing within the
# budget faster than the given schedule goes back to the given schedule's plan
COARSE_SHARE = 0.35


class _Frame:
    """The plan space of a problem: the placement frame, one list per (group, bucket key) in need
    order, and which runs may be buckets."""

    def __init__(self, problem: ScheduleProblem, multi_dtype: bool, cap_bytes: int | None):
        self.problem = problem
        self.pl = Placement(problem)
        self.multi_dtype = multi_dtype
        self.cap_bytes = cap_bytes
        units, index = self.pl.units, problem.index
        by_key: dict[tuple, list[str]] = {}
        for c in problem.collectives:
            info = c.collective
            assert info is not None
            by_key.setdefault((info.group, info.bucket_key(multi_dtype)), []).append(c.name)
        keys = sorted(by_key, key=repr)
        self.lists: list[tuple[str, ...]] = [
            tuple(sorted(by_key[k], key=lambda n: (units[n].need, units[n].earliest, index[n]))) for k in keys]
        self.groups: list[str] = sorted({k[0] for k in keys})
        self.group_of: list[int] = [self.groups.index(k[0]) for k in keys]
        self.can_bucket: list[bool] = [bucketable(problem, lst[0]) for lst in self.lists]
        self.feasibility = BucketFeasibility(problem, self.pl)
        self._ok: dict[Run, bool] = {}

    def members(self, run: Run) -> tuple[str, ...]:
        return self.lists[run[0]][run[1]:run[2]]

    def valid(self, run: Run) -> bool:
        """Whether ``run`` may be one bucket: its kind has a cost curve, it fits the size cap, and
        no member depends on another (the frame's slots and bucket cycles are checked later)."""
        if run[2] - run[1] < 2:
            return True
        ok = self._ok.get(run)
        if ok is None:
            ok = self._ok[run] = self._check(run)
        return ok

    def _check(self, run: Run) -> bool:
        mem = self.members(run)
        if not self.can_bucket[run[0]]:
            return False
        if self.cap_bytes is not None and bucket_size_bytes(self.problem, mem) > self.cap_bytes:
            return False
        return all(self.feasibility.independent(mem[:i], m) for i, m in enumerate(mem) if i)


def plan_of(frame: _Frame, schedule: Schedule) -> Plan:
    """The plan closest to ``schedule``: its buckets cut into runs of the lists, each group's runs
    in the order the schedule issues them (same-list runs kept in list order)."""
    bucket_id: dict[str, object] = {m: i for i, b in enumerate(schedule.buckets) for m in b}
    pos = {n: i for i, n in enumerate(schedule.order)}
    per_group: list[list[tuple[int, Run]]] = [[] for _ in frame.groups]
    for li, lst in enumerate(frame.lists):
        lo = 0
        for i in range(1, len(lst) + 1):
            if i == len(lst) or bucket_id.get(lst[i], lst[i]) != bucket_id.get(lst[i - 1], lst[i - 1]):
                run = (li, lo, i)
                per_group[frame.group_of[li]].append((max(pos[m] for m in frame.members(run)), run))
                lo = i
    plan = []
    for runs in per_group:
        runs.sort()
        seq = [r for _, r in runs]
        for li in {r[0] for r in seq}:  # same-list runs back into list order, in the slots they hold
            at = [k for k, r in enumerate(seq) if r[0] == li]
            for k, r in zip(at, sorted(seq[k] for k in at)):
                seq[k] = r
        plan.append(tuple(seq))
    return tuple(plan)


def coarse_plan(frame: _Frame, pieces: int) -> Plan:
    """Each bucketable list cut into about ``pieces`` runs of equal bytes (a run also ends where
    the next member would make it no valid bucket), each group's runs in the order compute needs
    them: the few-large-buckets end of the plan space, which merges from a finer plan seldom reach
    when each merge alone goes over the memory budget."""
    units = frame.pl.units
    ops = frame.problem.op_by_name
    per_group: list[list[Run]] = [[] for _ in frame.groups]
    for li, lst in enumerate(frame.lists):
        sizes = [ops[m].collective.size_bytes for m in lst]  # type: ignore[union-attr]
        target = sum(sizes) / pieces if frame.can_bucket[li] else 0
        runs = per_group[frame.group_of[li]]
        lo, acc = 0, 0
        for i, size in enumerate(sizes):
            if i > lo and (acc >= target or not frame.valid((li, lo, i + 1))):
                runs.append((li, lo, i))
                lo, acc = i, 0
            acc += size
        runs.append((li, lo, len(lst)))
    return tuple(tuple(sorted(runs, key=lambda r: (min(units[m].need for m in frame.members(r)), r)))
                 for runs in per_group)


@dataclass(frozen=True)
class _Realized:
    """A plan's schedule and the slots that :func:`.placement.assemble` built it from."""

    schedule: Schedule | None  # None: the second pass already ran past the caller's bar
    second_pass_ns: int  # the makespan of the second pass (the third moves only waits that cost no stall)
    issue: dict[str, int]
    wait: dict[str, int]
    buckets: list[tuple[str, ...]]
    priority: dict[str, int]

    def repaired(self, frame: _Frame, budget: int) -> tuple[Schedule, SimResult] | None:
        """The schedule with its memory repaired to fit ``budget`` (:func:`.memory_repair.repair_memory`:
        issues later, waits earlier, at most ``REPAIR_SIMULATIONS`` simulations), or None."""
        assert self.schedule is not None
        rep = repair_memory(frame.pl, self.issue, self.wait, budget, self.buckets, frame.multi_dtype, self.priority,
                            max_simulations=REPAIR_SIMULATIONS)
        return (rep.schedule, rep.result) if rep is not None and rep.fits else None


def realize(frame: _Frame, plan: Plan, bar: float = math.inf) -> _Realized | None:
    """The schedule of ``plan`` (module doc: three passes) and the slots that build it, or None when
    the frame cannot place it (a run needed before the runs ahead of it on its stream can be
    issued, or buckets that depend on each other both ways); no schedule when the second pass's
    makespan is above ``bar`` (a search that would reject it need not build the third)."""
    pl = frame.pl
    units, end_slot = pl.units, pl.n_slots - 1
    issue: dict[str, int] = {}
    need: dict[Run, int] = {}
    prio: dict[str, int] = {}
    for seq in plan:
        prev = 0
        for rank, run in enumerate(seq):
            mem = frame.members(run)
            need[run] = min(units[m].need for m in mem)
            prev = max(prev, *(units[m].earliest for m in mem))
            if prev > need[run]:
                return None
            for m in mem:
                issue[m], prio[m] = prev, rank
    buckets = [frame.members(r) for seq in plan for r in seq if r[2] - r[1] > 1]
    wait = {m: need[r] for seq in plan for r in seq for m in frame.members(r)}
    try:
        clock, timing = _slot_times(frame, assemble(pl, issue, wait, buckets, frame.multi_dtype, priority=prio))
        for seq in plan:  # issues as late as the draft's starts allow, in FIFO order
            cap = end_slot
            for run in reversed(seq):
                mem = frame.members(run)
                s0 = issue[mem[0]]
                hi = min(need[run], cap)
                s = max(s0, min(bisect.bisect_right(clock, timing[mem[0]].start_ns, s0, hi + 1) - 1, hi))
                for m in mem:
                    issue[m] = s
                cap = s
        clock, timing = _slot_times(frame, assemble(pl, issue, wait, buckets, frame.multi_dtype, priority=prio))
        if clock[-1] > bar:
            return _Realized(None, clock[-1], issue, wait, buckets, prio)
        for seq in plan:  # waits where the run has ended: before that slot nothing changes, so no stall
            for run in seq:
                mem = frame.members(run)
                s = issue[mem[0]]
                w = max(s, min(bisect.bisect_left(clock, timing[mem[0]].end_ns, s, end_slot + 1), need[run]))
                for m in mem:
                    wait[m] = w
        return _Realized(assemble(pl, issue, wait, buckets, frame.multi_dtype, priority=prio), clock[-1],
                         issue, wait, buckets, prio)
    except ValueError:  # buckets that depend on each other both ways: no order issues and waits both
        return None


def _slot_times(frame: _Frame, sched: Schedule) -> tuple[list[int], dict[str, CollectiveTiming]]:
    """The compute clock at each slot of the frame (before its backbone op) when ``sched`` runs,
    and each collective's timing."""
    timings, clocks = timed_clocks(frame.problem, sched)
    pos = {n: i for i, n in enumerate(sched.order)}
    clock = [clocks[pos[n] - 1] if pos[n] else 0 for n in frame.pl.backbone] + [clocks[-1]]
    return clock, {m: t for t in timings for m in t.members}


def _neighbour(frame: _Frame, plan: Plan, rng: random.Random, weights: Sequence[float]) -> Plan | None:
    """One random move on one group's stream (picked in proportion to ``weights``): a boundary
    shift, a merge or a split of runs of one list, or a swap of neighbouring runs of two lists;
    None when the move drawn does not apply."""
    g = rng.choices(range(len(plan)), weights)[0]
    seq = list(plan[g])
    if not seq:
        return None
    i = rng.randrange(len(seq))
    li, lo, hi = seq[i]
    move = rng.randrange(4)
    if move == 3:  # swap with the next run, when it is of another list
        if i + 1 >= len(seq) or seq[i + 1][0] == li:
            return None
        seq[i], seq[i + 1] = seq[i + 1], seq[i]
    elif move == 2:  # split
        if hi - lo < 2:
            return None
        c = rng.randrange(lo + 1, hi)
        seq[i:i + 1] = [(li, lo, c), (li, c, hi)]
    else:
        j = next_of_list(seq, i)
        if j is None:
            return None
        hj = seq[j][2]
        if move == 1:  # merge the two, at either's place
            keep, drop = (i, j) if rng.random() < 0.5 else (j, i)
            seq[keep] = (li, lo, hj)
            del seq[drop]
        else:  # shift their boundary
            d = rng.choice([k for k in range(-MAX_SHIFT, MAX_SHIFT + 1) if k])
            if not (lo < hi + d < hj):
                return None
            seq[i], seq[j] = (li, lo, hi + d), (li, hi + d, hj)
    if not all(frame.valid(r) for r in seq):
        return None
    return (*plan[:g], tuple(seq), *plan[g + 1:])


def plan_search(
    problem: ScheduleProblem,
    schedule: Schedule,
    *,
    budget_bytes: int | None = None,
    multi_dtype: bool = False,
    cap_bytes: int | None = None,
    max_evals: int | None = None,
    deadline: float | None = None,
    seed: int = 0,
) -> Schedule:
    """The fastest schedule within ``budget_bytes`` (default: the original order's peak) that an
    annealing over stream plans (module doc) reaches from ``schedule``'s, or ``schedule`` itself
    when none is faster. It scores ``max_evals`` plans (default: ``DEFAULT_EVALS`` when no
    ``deadline`` is given), stopping at a ``time.perf_counter()`` ``deadline``; the temperature
    falls with the share of either spent; the coarse plans scored first count toward ``max_evals``
    (none are scored when it is below twice their number). Deterministic for a given ``seed``
    without a deadline."""
    budget = budget_bytes if budget_bytes is not None else original_peak(problem)
    if max_evals is None and deadline is None:
        max_evals = DEFAULT_EVALS
    t0 = time.perf_counter()
    frame = _Frame(problem, multi_dtype or schedule.multi_dtype, cap_bytes)
    inc = simulate(problem, schedule)
    best: tuple[int, Schedule] | None = (inc.makespan_ns, schedule) if inc.peak_memory_bytes <= budget else None
    price0 = OVER_PRICE * inc.makespan_ns / max(1, budget)
    busy = inc.busy_ns_by_group()
    weights = [busy.get(g, 0) + 1.0 for g in frame.groups]
    scored: dict[Plan, tuple[float, int]] = {}  # (makespan, bytes over the budget)
    best_plan: Plan | None = None  # the plan of best, once the search has found one

    def score(plan: Plan, price: float, bar: float = math.inf) -> float:
        """The plan's makespan plus ``price`` per byte over the budget; one whose second pass ran past
        ``bar`` returns that pass's makespan, unscored (the annealing rejects it all but surely)."""
        nonlocal best, best_plan
        if plan in scored:
            makespan, over = scored[plan]
            return makespan + price * over
        real = realize(frame, plan, bar)
        if real is None:
            scored[plan] = (math.inf, 0)
            return math.inf
        if real.schedule is None:
            return real.second_pass_ns
        sched, res = real.schedule, simulate(problem, real.schedule, check=False)
        over = max(0, res.peak_memory_bytes - budget)
        # only a plan that would beat the best within the budget is worth a memory repair
        if 0 < over <= REPAIR_OVER * budget and (best is None or res.makespan_ns < best[0]):
            fixed = real.repaired(frame, budget)
            if fixed is not None:
                (sched, res), over = fixed, 0
        scored[plan] = (res.makespan_ns, over)
        if not over and (best is None or res.makespan_ns < best[0]):
            best, best_plan = (res.makespan_ns, sched), plan
        return res.makespan_ns + price * over

    def found_nothing() -> bool:
        """Whether no plan within the budget has beaten the given schedule yet."""
        return best is None or best[1] is schedule

    rng = random.Random(seed)
    plan = plan_of(frame, schedule)
    cur = score(plan, price0)
    given_plan, given = plan, cur
    coarse_pieces = COARSE_PIECES if max_evals is None or max_evals >= 2 * len(COARSE_PIECES) else ()
    # the annealing starts from the best coarse plan (coarse_plan); scores are cached, so min scores once
    start = min((coarse_plan(frame, k) for k in coarse_pieces), key=lambda c: score(c, price0), default=None)
    plan_from_coarse = start is not None and math.isfinite(score(start, price0))
    if plan_from_coarse:
        plan, cur = start, score(start, price0)
    least = cur  # the least score the annealing has reached
    evals, tries = len(coarse_pieces), 0  # the coarse plans count as scored
    anneal_evals = None if max_evals is None else max(evals, round(ANNEAL_SHARE * max_evals))
    anneal_until = None if deadline is None else t0 + ANNEAL_SHARE * (deadline - t0)
    gave_up = False
    while anneal_evals is None or evals < anneal_evals:
        now = time.perf_counter()
        if anneal_until is not None and now >= anneal_until:
            break
        tries += 1
        if tries > 50 * (evals + 1) + 1000:  # no move applies any more
            break
        if anneal_evals is not None:
            share = evals / max(1, anneal_evals)
        else:
            assert anneal_until is not None
            share = min(1.0, (now - t0) / max(1e-9, anneal_until - t0))
        if evals >= GIVE_UP_EVALS and share >= GIVE_UP_SHARE and found_nothing() and least >= given:
            log.info("plan_search %s: no plan beat the start in %d plans; giving up", problem.name, evals)
            gave_up = True
            break
        if plan_from_coarse and share >= COARSE_SHARE and found_nothing():
            plan, cur, plan_from_coarse = given_plan, given, False  # the coarse start found nothing: back
        temp = T_START * inc.makespan_ns * (T_END / T_START) ** share
        cand = _neighbour(frame, plan, rng, weights)
        if cand is None:
            continue
        evals += 1
        v = score(cand, price0, cur + REJECT_TEMPERATURES * temp)
        if v <= cur or (math.isfinite(v) and rng.random() < math.exp((cur - v) / temp)):
            plan, cur = cand, v
            least = min(least, cur)
        if evals % 500 == 0:
            log.debug("plan_search: %d plans, temperature %.0f ns, current %.0f, best %s", evals, temp, cur,
                      best and best[0])
    log.debug("plan_search: last plan %s %s", plan, scored.get(plan))
    if best_plan is not None and not gave_up and not found_nothing() and (max_evals is None or evals < max_evals):
        assert best is not None  # found with best_plan
        annealed = best[0]
        n = polish(frame.valid, best_plan, lambda p: score(p, price0), rng, weights,
                   max_evals=None if max_evals is None else max_evals - evals, deadline=deadline)
        log.debug("plan_search: polish scored %d plans: best %d ns (annealing %d)", n, best[0], annealed)
        evals += n
    log.info("plan_search %s: %d plans in %.1f s; %s", problem.name, evals, time.perf_counter() - t0,
             "none within the budget" if best is None else f"best {best[0]} ns (from {inc.makespan_ns})")
    if best is None or found_nothing():
        return schedule
    return _checked(problem, best[1], schedule)


def _checked(problem: ScheduleProblem, found: Schedule, fallback: Schedule) -> Schedule:
    """``found`` when it is valid (the search simulates unchecked), else ``fallback``."""
    violations = check_schedule(problem, found)
    if violations:
        log.warning("plan_search %s: dropping an invalid schedule: %s", problem.name, violations[0])
        return fallback
    return found
