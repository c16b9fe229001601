"""The heuristic warm start of :func:`.cpsat.solve`: the best greedy schedule within the memory
budget, always given to CP-SAT as its hint and returned when CP-SAT finds nothing better."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..heuristics.bucket_shift import shift_bucket_members
from ..heuristics.bucketing import DEFAULT_CAP_BYTES, bucketed_overlap
from ..heuristics.concentrate import concentrate_stalls
from ..heuristics.critical_path import critical_path_schedule, default_max_builds
from ..heuristics.far_defer import defer_far_fillers
from ..heuristics.fill import fill_stalls
from ..heuristics.overlap import OverlapConfig, overlap_schedule
from ..heuristics.parallel_plans import plan_search_seeds
from ..heuristics.pipeline import pipeline_fillers
from ..heuristics.reorder import defer_independent
from ..heuristics.single_pull import pull_single_fillers
from ..heuristics.sink import sink_stalled_waits
from .problem import OpKind, ScheduleProblem
from .schedule import Schedule
from .simulator import simulate

if TYPE_CHECKING:
    from .cpsat_config import SolveConfig

log = logging.getLogger(__name__)

WARM_START_CAPS = (DEFAULT_CAP_BYTES, 4 * DEFAULT_CAP_BYTES)  # comm-bound graphs want larger buckets
# (headroom share, cap): buckets also capped by that share of their members' memory headroom
# (heuristics.bucketing.memory_headroom); picked on the 4-node backward, where uniform caps past
# 1 GiB no longer fit the budget: 0.35 / 3 GiB gives 175.9 ms there, 1 GiB uniform 188.2 ms
HEADROOM_TRIES = ((0.35, 3 << 30), (0.5, 2 << 30))
WARM_START_SHARE = 0.6
# free mode, short wall-clock budgets: the warm start keeps at least this many seconds (at most
# STREAM_BOUND_SHARE of the budget). Its reordering steps (deferral, the critical-path rebuild, far
# deferral, pulls) take about 7-8 s on the tp_2x4 backward on a 2-core machine and gain far more
# than the window rounds they would leave time for: a 10 s solve of it gave 35,341.7 us with 0.6
# of the budget (7 of 15 steps skipped) and 33,743.2 with 0.75; at 60 s, 0.6 stays the better
# (31,820.6 against 32,080.2 with 0.75); fixed mode has no such steps (0.75: 38,673.4 against 38,626.6)
FREE_WARM_START_MIN_S = 7.5
# where one group's collectives, run alone back to back, take at least the compute (stream_bound), the
# buckets decide the makespan and CP-SAT's windows cannot restructure them: on the 4-node backward
# its 24 s of a 60 s solve gained nothing, while the plan search gains there. Such graphs give the
# warm start this share of a wall-clock budget
STREAM_BOUND_SHARE = 0.85
# wall clock: the first deferral's time is half the warm start's left, at most this: its later moves
# leave the critical-path rebuild after it a worse order. On the tp_2x4 backward, the rebuild gave
# 32.95 ms after 2-8 s of deferral, 33.0 after 16 s and 33.6 after 69 s (a 240 s budget), and that
# solve ended slower than a 60 s one (32.63 against 31.8 ms)
FIRST_DEFER_MAX_S = 20.0
# and at most this many deferral tries: the 20 s above held about 300 of them (304 in 16.5 s on the
# tp_2x4 backward) until the simulator kept each bucketing's units (sim_tables.UnitTable), which
# made a try 4.3 times faster; then 1,301 tries in 16.5 s gave 33.89 ms there against 36.06, but
# after the rebuild and the search 32.57 ms against 31.82 (a 60 s solve). With this cap the first
# deferral takes 4 s, every step after it runs, and the solve gives 31.52 and 31.61 ms
FIRST_DEFER_MAX_MOVES = 300
DEFER_MOVES_PER_S = 4  # deterministic solves: deferral tries per second of budget on graphs of
DEFER_REF_OPS = 2500  # up to this many ops; a try simulates the whole graph, so larger graphs get fewer
# deterministic solves: critical-path rebuilds per second of budget (same scaling; at most the pass's
# default). On the tp_2x4 backward its keep windows bring a rebuild within the budget only after
# 120-150 rebuilds: 6 a second gave a 10 s solve nothing from it (34,088.0 us), 30 give 33,705.7
CRITICAL_BUILDS_PER_S = 30
FAR_SEEDS = 256  # fillers tried per queue head by the far deferral (fewer past DEFER_REF_OPS ops)
# deterministic solves: far-deferral fillers tried in all, per second of budget (same scaling). With
# no such bound, its 120 moves of 256 fillers each took 134 s of a 60 s solve of the tp_2x4 backward
FAR_EVALS_PER_S = 40
PULL_EVALS = 2000  # candidates a single-pull pass tries in all (fewer past DEFER_REF_OPS ops)
# deterministic solves: the warm start's single-pull candidates per second of budget, at most PULL_EVALS
# (same scaling). Its 2,000 took 4.6 s of a 10 s solve of the tp_2x4 backward, which ran 14-16 s
# (11-13 s with 500, and the rebuilds above)
PULL_EVALS_PER_S = 50
SHIFT_EVALS = 1000  # candidates a bucket-shift pass tries in all (fewer past DEFER_REF_OPS ops)
POLISH_TRIES = 16  # stalls tried by a polish (concentrate.py): the last step here, and each search gain
# far deferrals and single pulls must gain more than this: on the tp_2x4 backward, moves of a
# second each went on gaining 2 ns apiece (rounding) for 8 s
MOVE_MIN_GAIN_NS = 1_000
BUCKETING_MIN_EXPOSED = 0.0025  # of compute: below it the bucketed tries (10 s each on 80 layers) are skipped
# deterministic solves of graphs past DEFER_REF_OPS ops: seconds of budget per bucketed try, scaled by
# size. Each runs the overlap ladder and its repairs on the whole graph (about 4 s on the 32-layer
# backward's 8k ops): with every try, a deterministic 10 s solve of it took 28 s, 17 of them in the
# four tries, none of which paid
BUCKET_TRY_S = 4.0
# the stream plan search (heuristics/stream_plan.py) after the bucketed tries, on stream-bound graphs
# only (on the tp, tp_2x4, 8-layer and DDP graphs no plan beat its start): in a wall-clock solve,
# this share of the warm start's time left, times the busiest stream's share of the makespan (where the
# stream is the bottleneck the buckets decide the makespan; elsewhere the reordering steps after it
# need the time); in a deterministic one, PLAN_EVALS_PER_S plans per second of budget (scaled by
# size; about 11 ms a plan on the 4-node backward's 2,100 ops, with 200 plans of a 10 s solve
# ending in 7.7 s: 40 a second end it in about 10 s)
PLAN_SHARE = 0.9
PLAN_EVALS_PER_S = 40


def stream_bound(problem: ScheduleProblem) -> bool:
    """Whether some group's collectives, run alone back to back, take at least the compute."""
    per_group: dict[str, int] = {}
    for c in problem.collectives:
        per_group[c.collective.group] = per_group.get(c.collective.group, 0) + c.runtime_ns  # type: ignore[union-attr]
    compute = sum(op.runtime_ns for op in problem.ops if op.kind is OpKind.COMPUTE)
    return max(per_group.values(), default=0) >= max(1, compute)


def warm_start_share(problem: ScheduleProblem, time_budget_s: float | None = None, mode: str = "fixed") -> float:
    """The share of a wall-clock budget the warm start may take: STREAM_BOUND_SHARE where the
    graph is :func:`stream_bound`, else WARM_START_SHARE, or in free mode at least
    FREE_WARM_START_MIN_S of ``time_budget_s`` (at most STREAM_BOUND_SHARE of it)."""
    if stream_bound(problem):
        return STREAM_BOUND_SHARE
    if mode == "free" and time_budget_s:
        return max(WARM_START_SHARE, min(STREAM_BOUND_SHARE, FREE_WARM_START_MIN_S / time_budget_s))
    return WARM_START_SHARE


def size_scale(problem: ScheduleProblem) -> float:
    """1 up to DEFER_REF_OPS ops, less in proportion past it: the share of a local search's tries
    a graph gets, since each try simulates the whole graph."""
    return min(1.0, DEFER_REF_OPS / max(1, len(problem.ops)))


def far_seeds(problem: ScheduleProblem) -> int:
    """Fillers the far deferral tries per queue head: FAR_SEEDS, scaled by :func:`size_scale`."""
    return max(16, int(FAR_SEEDS * size_scale(problem)))


def far_evals(problem: ScheduleProblem, time_budget_s: float) -> int:
    """Fillers the far deferral tries in all in a deterministic solve of ``time_budget_s``:
    FAR_EVALS_PER_S per second, scaled by :func:`size_scale`, and at least one full head's worth."""
    return max(far_seeds(problem), int(FAR_EVALS_PER_S * time_budget_s * size_scale(problem)))


def critical_builds(problem: ScheduleProblem, time_budget_s: float) -> int:
    """Critical-path rebuilds a deterministic solve of ``time_budget_s`` runs: CRITICAL_BUILDS_PER_S
    per second, scaled by :func:`size_scale`, at least 8 and at most the pass's own default."""
    per_budget = int(CRITICAL_BUILDS_PER_S * time_budget_s * size_scale(problem))
    return max(8, min(default_max_builds(problem), per_budget))


def pull_evals(problem: ScheduleProblem, time_budget_s: float | None = None) -> int:
    """Candidates a single-pull pass tries in all: PULL_EVALS, or with ``time_budget_s`` (the warm
    start of a deterministic solve) PULL_EVALS_PER_S per second if fewer, scaled by
    :func:`size_scale`, so that deterministic solves, which run it with no deadline, do a bounded
    amount of work."""
    evals = PULL_EVALS if time_budget_s is None else min(PULL_EVALS, PULL_EVALS_PER_S * time_budget_s)
    return max(64, int(evals * size_scale(problem)))


def shift_evals(problem: ScheduleProblem) -> int:
    """Candidates a bucket-shift pass tries in all: SHIFT_EVALS, scaled by :func:`size_scale`."""
    return max(64, int(SHIFT_EVALS * size_scale(problem)))


def bucket_tries(problem: ScheduleProblem, time_budget_s: float) -> int | None:
    """Bucketed tries a deterministic solve of ``time_budget_s`` runs: every one (None) on graphs
    of up to DEFER_REF_OPS ops, where they are cheap, else one per BUCKET_TRY_S seconds of budget
    scaled by :func:`size_scale` (0 for a 10 s solve of the 32-layer backward, 2 for 30 s)."""
    scale = size_scale(problem)
    return None if scale >= 1.0 else int(time_budget_s * scale / BUCKET_TRY_S)


def plan_evals(problem: ScheduleProblem, time_budget_s: float) -> int:
    """Plans the stream plan search scores in a deterministic solve of ``time_budget_s``:
    PLAN_EVALS_PER_S per second, scaled by :func:`size_scale`."""
    return int(PLAN_EVALS_PER_S * time_budget_s * size_scale(problem))


def warm_start(problem: ScheduleProblem, budget_bytes: int, config: SolveConfig,
               deadline: float | None = None, defer_moves: int = 16,
               critical_builds: int | None = None, far_tries: int | None = None,
               max_bucketed: int | None = None, max_plans: int | None = None,
               pull_tries: int | None = None) -> tuple[str, Schedule]:
    """The best heuristic schedule within the budget: fixed-order overlap, without buckets and
    with the greedy bucketer at the model's cap (or, with no cap, each of ``WARM_START_CAPS``) and
    with buckets capped by memory headroom too (``HEADROOM_TRIES``); no bucketed try when the
    unbucketed one fits and exposes under ``BUCKETING_MIN_EXPOSED`` of its compute, since buckets
    can save no more than the exposed time, and at most ``max_bucketed`` of them (None: no bound;
    deterministic solves: :func:`bucket_tries`);
    then, on a :func:`stream_bound` graph where buckets may pay (the same test), each group's
    buckets and FIFO order searched whole (:func:`..heuristics.stream_plan.plan_search`, from ``config.processes``
    seeds side by side: :func:`..heuristics.parallel_plans.plan_search_seeds`; ``max_plans`` plans each, or with a
    ``deadline``, ``PLAN_SHARE`` of the time left times the busiest stream's share of the
    makespan; neither: its default);
    then stalled waits sunk and bucket boundaries shifted (:func:`..heuristics.bucket_shift.shift_bucket_members`,
    when the schedule has buckets and exposes more than ``BUCKETING_MIN_EXPOSED``). In free mode, then: stalls filled with ready compute, independent
    compute deferred past exposed collectives, stalls filled and waits sunk; weight gradients
    held back for the next stalls (:func:`..heuristics.pipeline.pipeline_fillers`), the order rebuilt
    longest path first (:func:`..heuristics.critical_path.critical_path_schedule`, at most
    ``critical_builds`` rebuilds; None: its default), deferred again, single fillers from far back
    deferred past the heads of exposed queues (:func:`..heuristics.far_defer.defer_far_fillers`),
    stalls filled and waits sunk, and single ops pulled into stalls one at a time
    (:func:`..heuristics.single_pull.pull_single_fillers`).
    Then bucket boundaries shifted again, and last, compute pulled into small stalls and runs of stalled waits concentrated
    (:func:`..heuristics.concentrate.concentrate_stalls`; in fixed mode no heavy op passes another).
    The two deferrals share ``defer_moves`` tries (the far one and the pulls get half as many too,
    and the far one tries at most ``far_tries`` fillers in all; None: no such bound; the pulls at
    most ``pull_tries`` candidates; None: :func:`pull_evals`);
    with a ``deadline``, the first gets half the time left (at most ``FIRST_DEFER_MAX_S``) and the
    second half of what is left after it. With a ``deadline`` (wall-clock solves only) the overlap
    scheduler's ladders (:func:`..heuristics.overlap.overlap_schedule`), the tries after the first,
    and the later steps stop once it has passed, and no step starts after it."""
    oc = OverlapConfig(memory_budget_bytes=budget_bytes)
    t = time.perf_counter()
    base = overlap_schedule(problem, config=oc, deadline=deadline)  # the bucketed tries compare with it
    first_s = time.perf_counter() - t
    r = simulate(problem, base)
    best = ((r.peak_memory_bytes > budget_bytes, r.makespan_ns, r.peak_memory_bytes), "overlap", base)
    tries: list[tuple[int, float | None]] = []  # (cap, headroom share)
    if config.bucketing and not config.plan:
        # no cap in the model is not "one bucket" for the greedy bucketer: try its default and larger,
        # and larger still where the memory headroom allows (comm-bound graphs)
        cap = config.bucket_cap_bytes
        tries = [(c, None) for c in ((cap,) if cap is not None else WARM_START_CAPS)]
        tries += [(c if cap is None else min(cap, c), share) for share, c in HEADROOM_TRIES]
    if tries and r.peak_memory_bytes <= budget_bytes and r.exposed_ns <= BUCKETING_MIN_EXPOSED * r.compute_ns:
        # buckets add compute (copies) and can only save exposed time: little is left to save
        log.info("warm start %s: overlap exposes %d ns; no bucketed tries", problem.name, r.exposed_ns)
        tries = []
    if max_bucketed is not None and len(tries) > max_bucketed:
        log.info("warm start %s: %d of %d bucketed tries within the budget", problem.name, max_bucketed, len(tries))
        tries = tries[:max_bucketed]
    for cap, share in tries:
        name = f"bucket+overlap@{cap >> 20}MiB" + ("" if share is None else f"/headroom {share:g}")
        # a bucketed try costs about 1.5x the first: skip what cannot finish before the deadline
        if deadline is not None and time.perf_counter() + 1.5 * first_s > deadline:
            log.info("warm start %s: no time left for %s", problem.name, name)
            break
        sched = bucketed_overlap(problem, cap_bytes=cap, multi_dtype=config.multi_dtype, config=oc, base=base,
                                 headroom_share=share, deadline=deadline)
        r = simulate(problem, sched)
        key = (r.peak_memory_bytes > budget_bytes, r.makespan_ns, r.peak_memory_bytes)
        if key < best[0]:
            best = (key, name, sched)
    name, sched = best[1], best[2]
    if config.bucketing and not config.plan and (max_plans is None or max_plans > 0) and stream_bound(problem):
        r = simulate(problem, sched)
        if r.exposed_ns > BUCKETING_MIN_EXPOSED * r.compute_ns and (deadline is None or time.perf_counter() < deadline):
            share = PLAN_SHARE * min(1.0, max(r.busy_ns_by_group().values(), default=0) / max(1, r.makespan_ns))
            until = None if deadline is None else time.perf_counter() + share * (deadline - time.perf_counter())
            t = time.perf_counter()
            seeds = [config.seed + k for k in range(config.processes)]
            new = plan_search_seeds(problem, sched, seeds, budget_bytes=budget_bytes, multi_dtype=config.multi_dtype,
                                    cap_bytes=config.bucket_cap_bytes, max_evals=max_plans, deadline=until)
            log.debug("warm start %s: plan search in %.2f s%s", problem.name, time.perf_counter() - t,
                      " (changed)" if new != sched else "")
            if new != sched:
                name, sched = f"{name}+plan", new
    # the two deferral passes share the moves (deterministic) evenly; the time as the docstring says
    half_moves = max(8, defer_moves // 2)
    mid = None if deadline is None else time.perf_counter() + min(
        FIRST_DEFER_MAX_S, 0.5 * max(0.0, deadline - time.perf_counter()))

    def sink(s: Schedule) -> Schedule:
        return sink_stalled_waits(problem, s, budget_bytes=budget_bytes, deadline=deadline)

    def fill(s: Schedule) -> Schedule:
        return fill_stalls(problem, s, budget_bytes=budget_bytes, deadline=deadline)

    def defer(until: float | None, most: int = half_moves) -> Callable[[Schedule], Schedule]:
        return lambda s: defer_independent(problem, s, budget_bytes=budget_bytes, max_moves=most, deadline=until)

    def defer_half_left(s: Schedule) -> Schedule:  # the second deferral leaves half its time to the far one
        until = None if deadline is None else time.perf_counter() + 0.5 * max(0.0, deadline - time.perf_counter())
        return defer(until)(s)

    def far(s: Schedule) -> Schedule:
        return defer_far_fillers(problem, s, budget_bytes=budget_bytes, max_moves=half_moves, deadline=deadline,
                                 max_seeds=far_seeds(problem), min_gain_ns=MOVE_MIN_GAIN_NS, max_evals=far_tries)

    def pull(s: Schedule) -> Schedule:
        return pull_single_fillers(problem, s, budget_bytes=budget_bytes, max_moves=half_moves, deadline=deadline,
                                   min_gain_ns=MOVE_MIN_GAIN_NS,
                                   max_evals=pull_evals(problem) if pull_tries is None else pull_tries)

    def pipeline(s: Schedule) -> Schedule:
        return pipeline_fillers(problem, s, budget_bytes=budget_bytes, deadline=deadline)

    def critical(s: Schedule) -> Schedule:
        return critical_path_schedule(problem, s, budget_bytes=budget_bytes, deadline=deadline,
                                      max_builds=critical_builds)

    def shift(s: Schedule) -> Schedule:
        # module plans fix the buckets; with none kept by the bucketed tries, buckets do not pay here and
        # shifts that form them gain little (tp_2x4 backward: 61 us in 7 s, where far deferrals and
        # pulls gain about 100 us a second)
        if not config.bucketing or config.plan or not s.buckets:
            return s
        r = simulate(problem, s)
        if r.exposed_ns <= BUCKETING_MIN_EXPOSED * r.compute_ns:  # little left for buckets to save
            return s
        return shift_bucket_members(problem, s, budget_bytes=budget_bytes, max_evals=shift_evals(problem),
                                    cap_bytes=config.bucket_cap_bytes, deadline=deadline, min_gain_ns=MOVE_MIN_GAIN_NS)

    def polish(s: Schedule) -> Schedule:
        return concentrate_stalls(problem, s, max_tries=POLISH_TRIES, deadline=deadline, jump=False,
                                  keep_heavy_order=config.mode == "fixed")

    steps: list[tuple[str, Callable[[Schedule], Schedule]]] = [("sink", sink), ("shift", shift)]
    if config.mode == "free":  # heavy compute may move: fill stalls, defer, then pipeline weight gradients
        first_defer = defer(mid, min(half_moves, FIRST_DEFER_MAX_MOVES))
        steps += [("fill", fill), ("defer", first_defer), ("fill", fill), ("sink", sink),
                  ("pipeline", pipeline), ("critical", critical), ("defer", defer_half_left), ("far", far),
                  ("fill", fill), ("sink", sink), ("pull", pull)]
    steps.append(("shift", shift))
    if config.polish:
        steps.append(("polish", polish))
    for k, (step, fn) in enumerate(steps):
        t = time.perf_counter()
        if deadline is not None and t > deadline:  # each step simulates the graph at least once
            log.info("warm start %s: deadline passed; %d of %d steps skipped", problem.name, len(steps) - k,
                     len(steps))
            break
        new = fn(sched)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("warm start %s: %s in %.2f s%s: makespan %d ns", problem.name, step, time.perf_counter() - t,
                      " (changed)" if new != sched else "", simulate(problem, new).makespan_ns)
        if new != sched:
            name, sched = f"{name}+{step}", new
    return name, sched
