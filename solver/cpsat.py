"""``solve``: the CP-SAT scheduler, warm-started by the heuristics, scored by the one simulator.

    result = solve(problem, time_budget_s=10)            # fixed heavy-compute order, buckets on
    result = solve(problem, 10, SolveConfig(mode="free"))  # any topological order (small graphs)

The model (cpsat_frame / cpsat_model / cpsat_memory) decides buckets, issue and wait positions
and FIFO orders; the returned schedule is always re-scored by :func:`simulate`, and
``Result.objective`` is that simulated makespan. ``lower_bound`` is CP-SAT's proven bound on
the makespan over the modelled space (the mode, bucket candidates, slots and windows of the
config), never below :func:`bounds.makespan_lower_bound` (valid for every schedule within the
memory budget); when the final polish (compute pulled into stalls) leaves that space with a
shorter schedule, the structural bound alone.

Determinism (every rank must apply the same schedule): with ``deterministic=True`` (default)
the search is limited by ``max_deterministic_time`` only, with a fixed seed and worker count
(``interleave_search`` when workers > 1), so identical inputs give identical schedules. The
budget is then converted to CP-SAT's deterministic time units at ``deterministic_rate`` units
per second (0.25: on the 2-core machines we measure on, one unit of a large model took 3-6 s
of wall time), so a budget of seconds stays roughly seconds there, and the same on every rank;
faster machines finish sooner. ``deterministic=False`` uses a wall-clock limit instead.

Link contention (``problem.link_contention > 0``) is not modelled: the model plans without it
and the simulator scores the result with it; ``Result.exact`` is then False.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from ..heuristics.concentrate import concentrate_stalls
from ..heuristics.hide import hide_collectives
from ..heuristics.split_buckets import HIDE_EVALS as SPLIT_HIDE_EVALS
from ..heuristics.split_buckets import hidden_key, split_buckets
from .bounds import makespan_lower_bound
from .cpsat_config import (
    Progress,
    Result,
    SolutionReporter,
    SolveConfig,
    Status,
    make_solver,
    model_stats,
    proven,
    reordered,
    resolve_budget,
)
from .cpsat_frame import Frame, build_frame, order_pairs
from .cpsat_hint import add_hint, decode, hint_vars
from .cpsat_lns import centers_of, deterministic_rounds, lns_frame_options, neighbourhood_solve
from .cpsat_model import ModelBuilder
from .layers import detect_layers
from .problem import OpKind, ScheduleProblem
from .schedule import Schedule
from .simulator import SimResult, simulate
from .spine_fill import spine_fill
from .warm_start import (DEFER_MOVES_PER_S, bucket_tries, critical_builds, far_evals, plan_evals, pull_evals,
                         size_scale, stream_bound, warm_start, warm_start_share)

log = logging.getLogger(__name__)
POLISH_SHARE = 0.04  # of a wall-clock budget, kept for the final polish (about 2.4 s of a 60 s solve)
SPINE_ROUNDS = 4  # spine fills at most, each from the last one kept
HIDE_EVALS = 8000  # candidates the final count-first search scores (fewer on larger graphs: size_scale)
# Bucket splits the polish then tries, each polished by split_buckets' HIDE_EVALS candidates
# (size_scale). A pass scores every split of every bucket before it takes the best, and the gains
# come in steps: on the 4-node backward's 60 s answer with 5% of slack, a gather bucket's first
# member alone (121 hidden), then, 34 tries in, the tail bucket's last member alone (147; 8 tries
# stopped at 121). 64 take 1-2 s there and 2.4 s on the tp_2x4 backward.
SPLIT_TRIES = 64

def solve(
    problem: ScheduleProblem,
    time_budget_s: float = 10.0,
    config: SolveConfig = SolveConfig(),
    *,
    hint: Schedule | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> Result:
    """Schedule ``problem`` with CP-SAT within ``time_budget_s`` (see module docstring).

    The answer's runs of stalled waits are then reordered so that fewer collectives show the
    same stall, and compute is pulled into small stalls left by a search stopped on time
    (:func:`..heuristics.concentrate.concentrate_stalls`; makespan and peak no worse, the
    objective updated when the makespan drops; ``model_objective`` stays CP-SAT's own); last,
    more collectives are hidden by single moves ranked by that count first
    (:func:`..heuristics.hide.hide_collectives`; peak no higher, makespan at most
    ``config.hide_slack`` above the answer's; a longer one is no longer proven optimal), and
    buckets are split where that hides more of their members within the same caps
    (:func:`..heuristics.split_buckets.split_buckets`). They take fewer tries on larger graphs
    and, on a wall clock, the last 4% of the budget. A search that ran past the whole budget
    leaves only the runs' reorder (one simulation), and that only within another 4% of the budget.
    With ``config.spine_share`` (free mode) that share of the budget then goes to
    :func:`.spine_fill.spine_fill`, which reassigns compute to the windows of the answer's longest
    collective chain at once; polished the same way, its order is kept when it hides more at no
    longer makespan, within the memory budget, and the fill runs again from it
    (:func:`_spine_rounds`).
    """
    t0 = time.perf_counter()
    # on a wall clock the search leaves the last 4% of the budget to the polish (and the spine
    # fill's share before that)
    spine_s = config.spine_share * time_budget_s if config.polish and config.mode == "free" else 0.0
    search_s = (time_budget_s if config.deterministic or not config.polish
                else (1 - POLISH_SHARE - spine_s / time_budget_s) * time_budget_s)
    res = _solve(problem, search_s, config, hint, progress, t0)
    if res.status is Status.INFEASIBLE or not config.polish:
        return res
    tries = max(4, int(64 * size_scale(problem)))
    deadline = None if config.deterministic else t0 + time_budget_s
    late = deadline is not None and time.perf_counter() > deadline
    if late and time.perf_counter() > deadline + POLISH_SHARE * time_budget_s:
        sched = res.schedule  # far past the deadline: nothing more
    elif late:  # the search overran the polish's share (a busy machine): the runs of stalled waits
        # are still reordered, one simulation (a 60 s solve of the 4-node FSDP backward, done at
        # 65.1 s, had skipped it and left a 34-member bucket exposed that the reorder hides)
        sched = concentrate_stalls(problem, res.schedule, max_tries=0)
    else:
        sched = _polished(problem, res.schedule, config, tries, deadline)
        if spine_s:  # deterministic solves give it deterministic time on top of the search's
            end = None if deadline is None else min(time.perf_counter() + spine_s, deadline - POLISH_SHARE * time_budget_s)
            sched = _spine_rounds(problem, sched, res.budget_bytes, config, tries, deadline, spine_s, end)
    if sched is res.schedule:
        return dataclasses.replace(res, runtime=time.perf_counter() - t0)
    r = simulate(problem, sched)  # the makespan may have dropped (compute pulled into stalls), or grown by the slack
    status, lower = res.status, res.lower_bound
    if r.makespan_ns > res.objective:  # traded for hidden collectives: no longer what the search proved
        status = Status.FEASIBLE
    if r.makespan_ns < lower:  # outside the modelled space (light compute moved in fixed mode): only
        # the structural bound holds for it
        floor = makespan_lower_bound(problem, resolve_budget(problem, config.memory_budget)).makespan_ns
        status, lower = Status.FEASIBLE, min(lower, floor)
    return dataclasses.replace(res, schedule=sched, objective=r.makespan_ns, peak_memory_bytes=r.peak_memory_bytes,
                               status=proven(status, r.makespan_ns, lower), lower_bound=lower,
                               runtime=time.perf_counter() - t0)


def _polished(problem: ScheduleProblem, sched: Schedule, config: SolveConfig, tries: int,
              deadline: float | None) -> Schedule:
    """The final polish: stalls concentrated, then more collectives hidden, then buckets split where
    that hides more (see :func:`solve`)."""
    fixed = config.mode == "fixed"
    sched = concentrate_stalls(problem, sched, max_tries=tries, deadline=deadline, keep_heavy_order=fixed)
    cap = int(simulate(problem, sched).makespan_ns * (1 + config.hide_slack))  # no slack: the answer's own
    sched = hide_collectives(problem, sched, max_makespan_ns=cap,
                             max_evals=max(64, int(HIDE_EVALS * size_scale(problem))), deadline=deadline,
                             keep_compute_order=fixed)
    return split_buckets(problem, sched, max_makespan_ns=cap, max_tries=max(2, int(SPLIT_TRIES * size_scale(problem))),
                         hide_evals=max(64, int(SPLIT_HIDE_EVALS * size_scale(problem))), deadline=deadline,
                         keep_compute_order=fixed)


def _spine_rounds(problem: ScheduleProblem, polished: Schedule, budget_bytes: int, config: SolveConfig,
                  tries: int, deadline: float | None, spine_s: float, end: float | None) -> Schedule:
    """``polished`` (the answer's polish), or the best of SPINE_ROUNDS rounds of the spine fill,
    each polished, that hides more at no longer makespan (:func:`_more_hidden`). Round ``k`` runs
    the fill with seed ``config.seed + k`` from the last round's polished order when that hid no
    fewer than its own start (a plateau: another order, or the same one, which the next seed
    searches again), else from that start. A new seed is what gets past a plateau: from two
    answers with 197 of 200 hidden on the tp_2x4 backward (31,379.0 and 31,467.9 us), six 30 s
    rounds at radius 8 with the seed changed each round reached 198 at 31,332.3 us in the third
    and the fourth, where rounds with one seed had returned the same order (benchmarks/RESULTS.md).
    On a wall clock each round gets what is left up to ``end`` (the fill returns once an order
    within the budget covers a window more, else at the end of its time, solving a third of it at
    a time); in deterministic time (``end`` None) ``spine_s / SPINE_ROUNDS``."""
    best_res = simulate(problem, polished)
    best, start, hidden = polished, polished, best_res.n_hidden_hideable_members
    for k in range(SPINE_ROUNDS):
        share = spine_s / SPINE_ROUNDS if end is None else end - time.perf_counter()
        if share <= 0:
            break
        spine = spine_fill(problem, start, budget_bytes, dataclasses.replace(config, seed=config.seed + k), share,
                           radius=config.spine_radius)
        if spine is None:
            break
        cand = _polished(problem, spine, config, tries, deadline)
        cand_res = simulate(problem, cand)
        if _more_hidden(problem, best_res, cand_res):
            best, best_res = cand, cand_res
        if cand_res.n_hidden_hideable_members >= hidden:  # more, or as many: a plateau to go on from
            start, hidden = cand, cand_res.n_hidden_hideable_members
    return best


def _more_hidden(problem: ScheduleProblem, a: SimResult, b: SimResult) -> bool:
    """Whether ``b`` hides more hideable collectives than ``a`` (bucket members counted, as the
    polish's bucket splits do) at no longer makespan, or as many in less; both within the memory
    budget (the spine fill checks its own)."""
    better = b.makespan_ns <= a.makespan_ns and hidden_key(b) > hidden_key(a)
    log.info("solve %s: spine fill %d hidden at %d ns, against %d at %d ns: %s", problem.name,
             b.n_hidden_hideable_members, b.makespan_ns, a.n_hidden_hideable_members, a.makespan_ns,
             "kept" if better else "dropped")
    return better


def _solve(problem: ScheduleProblem, time_budget_s: float, config: SolveConfig, hint: Schedule | None,
           progress: Callable[[Progress], None] | None, t0: float) -> Result:
    budget = resolve_budget(problem, config.memory_budget)
    if problem.link_contention:
        log.warning("solve: link contention %.2f is not modelled; the simulator scores it", problem.link_contention)
    # wall-clock solves keep at least 40% of the budget for the search (15% on stream-bound graphs, and
    # in free mode under short budgets, what FREE_WARM_START_MIN_S leaves)
    deadline = (None if config.deterministic
                else t0 + warm_start_share(problem, time_budget_s, config.mode) * time_budget_s)
    # a bound valid for every schedule within the budget (any order, any buckets): the floor of every
    # reported bound. After the warm start, whose first steps it would otherwise delay (2.4 s on the
    # 4-node backward), except where the warm start takes STREAM_BOUND_SHARE: the 10 s solves of
    # the 4-node backward took 10.8-11.7 s with the bound after it
    bound_first = deadline is not None and stream_bound(problem)
    floor_ns = makespan_lower_bound(problem, budget).makespan_ns if bound_first else 0
    # deterministic solves bound the deferral by the budget; wall-clock ones by the deadline
    scale = size_scale(problem)
    moves = max(16, int(DEFER_MOVES_PER_S * time_budget_s * scale)) if config.deterministic else 4096
    builds = critical_builds(problem, time_budget_s) if config.deterministic else None
    far = far_evals(problem, time_budget_s) if config.deterministic else None
    bucketed = bucket_tries(problem, time_budget_s) if config.deterministic else None
    plans = plan_evals(problem, time_budget_s) if config.deterministic else None
    pulls = pull_evals(problem, time_budget_s) if config.deterministic else None
    h_res = simulate(problem, hint) if hint is not None else None
    if h_res is not None and h_res.peak_memory_bytes > budget:
        # a search started over the budget may never get back within it (the 4-node backward,
        # hinted with an order 3.1% over its peak, ended with no schedule), where the warm start
        # fits by construction
        log.warning("solve: the hint's peak (%d B) exceeds the memory budget (%d B); starting from "
                    "the warm start instead", h_res.peak_memory_bytes, budget)
        hint = h_res = None
    h_name, h_sched = (("hint", hint) if hint is not None
                       else warm_start(problem, budget, config, deadline, moves, builds, far, bucketed, plans, pulls))
    if h_res is None:
        h_res = simulate(problem, h_sched)
    if not bound_first:
        floor_ns = makespan_lower_bound(problem, budget).makespan_ns
    n_free = sum(op.kind is not OpKind.ZERO for op in problem.ops)
    if config.mode == "free" and n_free * (n_free - 1) // 2 > 4 * config.max_order_literals:
        frame, pairs = None, n_free * (n_free - 1) // 2  # far too large for a free frame: skip building it
    else:
        frame = build_frame(problem, config.frame_options())
        pairs = order_pairs(frame)
    if pairs > config.max_order_literals:
        layers = detect_layers(problem, config.layer_pattern) if config.layer_replay else None
        free_windows = config.mode == "free" and config.free_window > 0
        # the rounds search in fixed order around the warm start's order (same ops, so the schedule
        # fits the original problem), with its chains where it runs them: each round's model then
        # holds the incumbent exactly. Free order at scale: the warm start deferred independent
        # compute, and every other round is a free-order window (cpsat_window.py)
        problem = reordered(problem, h_sched.order)
        config = dataclasses.replace(config, mode="fixed")
        frame = build_frame(problem, lns_frame_options(config))
        return neighbourhood_solve(problem, config, budget, (h_name, h_sched, h_res), time_budget_s, t0,
                                    floor_ns, progress, frame, pairs, layers, free_windows)
    if not config.deterministic:  # a wall-clock budget covers the warm start too
        time_budget_s = max(0.0, time_budget_s - (time.perf_counter() - t0))
    t_build = time.perf_counter()
    builder = ModelBuilder(frame, budget, config.pinned)
    builder.build()
    builder.minimize_makespan()
    add_hint(builder, h_sched)
    stats = model_stats(builder, time.perf_counter() - t_build)
    solver = make_solver(config, time_budget_s * (1 - config.peak_phase_fraction if config.minimize_peak else 1))
    status = solver.Solve(builder.model, SolutionReporter(progress, t0))
    exact = not problem.link_contention

    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        model_obj = int(solver.Value(builder.v.makespan))
        bound = max(floor_ns, int(solver.BestObjectiveBound()))
        sched = decode(builder, solver)
        if config.minimize_peak:
            sched = _peak_phase(builder, solver, model_obj, config, time_budget_s * config.peak_phase_fraction) or sched
        res = simulate(problem, sched)
        cp_status = Status.OPTIMAL if status == cp_model.OPTIMAL else Status.FEASIBLE
        if h_res.peak_memory_bytes <= budget and (h_res.makespan_ns, h_res.peak_memory_bytes) < (
                res.makespan_ns, res.peak_memory_bytes):
            log.info("solve: the heuristic %s (%d ns) beats the CP-SAT schedule (%d ns)", h_name,
                     h_res.makespan_ns, res.makespan_ns)
            if h_res.makespan_ns < bound:  # outside the modelled space: only the structural bound holds
                bound = floor_ns
            return Result(proven(Status.HEURISTIC, h_res.makespan_ns, bound), h_res.makespan_ns,
                          min(bound, h_res.makespan_ns),
                          time.perf_counter() - t0, h_sched, f"heuristic:{h_name}", h_res.peak_memory_bytes,
                          budget, model_obj, exact=exact, stats=stats)
        return Result(cp_status, res.makespan_ns, min(bound, res.makespan_ns), time.perf_counter() - t0, sched,
                      "cpsat", res.peak_memory_bytes, budget, model_obj, exact=exact, stats=stats)

    if status == cp_model.INFEASIBLE or h_res.peak_memory_bytes > budget:
        return _infeasible(problem, frame, config, budget, h_sched, h_res, time_budget_s, t0, stats,
                           proven=status == cp_model.INFEASIBLE)
    log.warning("solve: CP-SAT found no schedule in %.1fs (%s); returning the heuristic %s",
                time_budget_s, solver.StatusName(status), h_name)
    return Result(proven(Status.HEURISTIC, h_res.makespan_ns, floor_ns), h_res.makespan_ns,
                  min(floor_ns, h_res.makespan_ns), time.perf_counter() - t0, h_sched,
                  f"heuristic:{h_name}", h_res.peak_memory_bytes, budget, exact=exact, stats=stats)


def _peak_phase(builder: ModelBuilder, solver: cp_model.CpSolver, makespan: int,
                config: SolveConfig, time_s: float) -> Schedule | None:
    """Lowest peak at a makespan no worse than ``makespan``, hinted with the phase-1 solution."""
    m = builder.model
    m.ClearHints()
    for var in hint_vars(builder):
        m.AddHint(var, solver.Value(var))
    builder.minimize_peak(makespan)
    s2 = make_solver(config, time_s)
    st = s2.Solve(m)
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return decode(builder, s2)
    return None


def _infeasible(problem: ScheduleProblem, frame: Frame, config: SolveConfig, budget: int, h_sched: Schedule,
                h_res, time_budget_s: float, t0: float, stats: dict, proven: bool) -> Result:
    """No schedule fits: find the lowest peak any schedule reaches (CP-SAT without a budget)."""
    b = ModelBuilder(frame, None, config.pinned)
    b.build()
    b.model.Minimize(b.v.peak)
    add_hint(b, h_sched)
    solver = make_solver(config, max(time_budget_s * 0.5, 0.1))
    st = solver.Solve(b.model)
    best, best_res = h_sched, h_res
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        cand = decode(b, solver)
        r = simulate(problem, cand)
        if r.peak_memory_bytes < best_res.peak_memory_bytes:
            best, best_res = cand, r
    orig = simulate(problem)
    if orig.peak_memory_bytes < best_res.peak_memory_bytes:
        best, best_res = Schedule.original(problem), orig
    log.warning("solve: no schedule fits %d bytes%s; the lowest peak found is %d bytes", budget,
                " (proven)" if proven else "", best_res.peak_memory_bytes)
    return Result(Status.INFEASIBLE, best_res.makespan_ns, 0, time.perf_counter() - t0, best, "min-peak",
                  best_res.peak_memory_bytes, budget, min_feasible_budget_bytes=best_res.peak_memory_bytes,
                  exact=not problem.link_contention, stats=stats)


__all__ = ["Progress", "Result", "SolveConfig", "Status", "centers_of", "decode", "deterministic_rounds",
           "resolve_budget", "solve", "warm_start"]
