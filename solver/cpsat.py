"""``solve``: the CP-SAT scheduler, warm-started by the heuristics, scored by the one simulator.

    result = solve(problem, time_budget_s=10)            # fixed heavy-compute order, buckets on
    result = solve(problem, 10, SolveConfig(mode="free"))  # any topological order (small graphs)

The model (cpsat_frame / cpsat_model / cpsat_memory) decides buckets, issue and wait positions
and FIFO orders; the returned schedule is always re-scored by :func:`simulate`, and
``Result.objective`` is that simulated makespan. ``lower_bound`` is CP-SAT's proven bound on
the makespan over the modelled space (the mode, bucket candidates, slots and windows of the
config), never below :func:`bounds.makespan_lower_bound` (valid for every schedule).

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

import bisect
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from ortools.sat.python import cp_model

from ..heuristics.concentrate import concentrate_stalls
from ..heuristics.overlap import original_peak
from .bounds import makespan_lower_bound
from .cpsat_frame import (
    Frame,
    FrameOptions,
    bucket_size_bytes,
    build_frame,
    order_pairs,
)
from .cpsat_hint import add_hint, decode, hint_vars
from .cpsat_model import ModelBuilder
from .cpsat_window import free_window, paid_rate, round_cost, window_frame
from .layer_replay import LayerReplayer
from .layers import DEFAULT_LAYER_PATTERN, LayerStructure, detect_layers
from .problem import OpKind, ScheduleProblem
from .schedule import Schedule, placements
from .simulator import SimResult, simulate
from .warm_start import CRITICAL_BUILDS_PER_S, DEFER_MOVES_PER_S, DEFER_REF_OPS, WARM_START_SHARE, warm_start

log = logging.getLogger(__name__)


class Status(str, Enum):
    OPTIMAL = "optimal"  # proven optimal: by CP-SAT over the modelled space, or meets the structural bound
    FEASIBLE = "feasible"  # a CP-SAT schedule, not proven optimal
    HEURISTIC = "heuristic"  # CP-SAT found nothing better in time: the heuristic's schedule
    INFEASIBLE = "infeasible"  # nothing fits the memory budget; see min_feasible_budget_bytes


@dataclass(frozen=True)
class Progress:
    """What a progress callback sees at each improving CP-SAT solution."""

    time_s: float
    objective_ns: int  # the model's makespan of the new solution
    bound_ns: int


@dataclass(frozen=True)
class SolveConfig:
    mode: str = "fixed"  # "fixed" heavy-compute order, or "free" topological order
    bucketing: bool = True
    multi_dtype: bool = False
    bucket_cap_bytes: int | None = None
    max_bucket_size: int = 4
    bucket_window: int = 4  # candidates: subsets of this many consecutive same-key collectives
    memory_budget: int | float | None = None  # bytes (int), ratio of the original peak (float); None: 1.0
    coarsen: bool = True
    coarsen_threshold_ns: int = 20_000
    max_ahead: int | None = None  # issue at most this many collectives ahead per group (None: any)
    plan: tuple[tuple[str, ...], ...] = ()  # buckets that must be formed (module plans)
    pinned: tuple[tuple[str, str], ...] = ()  # (a, b): op a runs before op b
    seed: int = 0
    workers: int = 1
    deterministic: bool = True
    deterministic_rate: float = 0.25  # deterministic time units per second of budget (see module doc)
    minimize_peak: bool = True  # second phase: lowest peak at the best makespan
    peak_phase_fraction: float = 0.2
    max_order_literals: int = 40_000  # above this, neighbourhood rounds around the incumbent
    lns_rounds: int = 8  # deterministic mode: neighbourhood rounds on large graphs (each a window)
    lns_radius: int = 6  # slots a windowed item may move
    lns_window: int = 6  # placements (buckets or lone collectives) freed per round
    free_window: int = 120  # free mode at scale: timed ops whose order every other round frees (0: none)
    layer_replay: bool = True  # large graphs: replay a round's gain in isomorphic layers (layer_replay.py)
    layer_pattern: str = DEFAULT_LAYER_PATTERN  # module FQN regex whose group 1 names a layer
    layer_seed_rounds: int = 2  # the first rounds' windows sit in one layer of the largest class
    layer_replay_evals: int = 16  # simulations per replayed gain

    def __post_init__(self) -> None:
        if self.mode not in ("fixed", "free"):
            raise ValueError(f"SolveConfig.mode must be 'fixed' or 'free', got {self.mode!r}")
        if self.workers < 1:
            raise ValueError("SolveConfig.workers must be >= 1")
        if self.deterministic_rate <= 0:
            raise ValueError("SolveConfig.deterministic_rate must be > 0")
        b = self.memory_budget
        if b is not None and (isinstance(b, bool) or b <= 0):
            raise ValueError(f"SolveConfig.memory_budget must be > 0 bytes or a ratio > 0, got {b!r}")

    def frame_options(self) -> FrameOptions:
        return FrameOptions(self.mode, self.bucketing, self.multi_dtype, self.bucket_cap_bytes,
                            self.max_bucket_size, self.bucket_window, self.coarsen,
                            self.coarsen_threshold_ns, self.max_ahead, self.plan)


@dataclass(frozen=True)
class Result:
    """A solver-neutral answer. ``objective`` is the simulated makespan of ``schedule``."""

    status: Status
    objective: int
    lower_bound: int
    runtime: float
    schedule: Schedule
    method: str
    peak_memory_bytes: int
    budget_bytes: int
    model_objective: int | None = None  # CP-SAT's makespan for its own schedule
    min_feasible_budget_bytes: int | None = None
    exact: bool = True
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """(objective - lower_bound) / objective: 0 when proven optimal."""
        return 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.lower_bound) / self.objective)


def resolve_budget(problem: ScheduleProblem, budget: float | None) -> int:
    """Bytes from a budget given in bytes (int), as a ratio of the original peak (float), or None (1.0)."""
    if isinstance(budget, int):
        return budget
    return int(original_peak(problem) * (1.0 if budget is None else budget))


class _Callback(cp_model.CpSolverSolutionCallback):
    def __init__(self, fn: Callable[[Progress], None] | None, t0: float):
        super().__init__()
        self.fn, self.t0 = fn, t0

    def on_solution_callback(self) -> None:
        if self.fn is not None:
            self.fn(Progress(time.perf_counter() - self.t0, int(self.ObjectiveValue()), int(self.BestObjectiveBound())))


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
    same stall (:func:`..heuristics.concentrate.concentrate_stalls`; makespan and peak no worse),
    with fewer tries on larger graphs and, on a wall clock, within 2% of the budget past it.
    """
    t0 = time.perf_counter()
    res = _solve(problem, time_budget_s, config, hint, progress, t0)
    if res.status is Status.INFEASIBLE:
        return res
    tries = max(4, int(64 * min(1.0, DEFER_REF_OPS / max(1, len(problem.ops)))))
    deadline = None if config.deterministic else max(time.perf_counter(), t0 + time_budget_s) + 0.02 * time_budget_s
    sched = concentrate_stalls(problem, res.schedule, max_tries=tries, deadline=deadline)
    if sched is res.schedule:
        return res
    return dataclasses.replace(res, schedule=sched, peak_memory_bytes=simulate(problem, sched).peak_memory_bytes,
                               runtime=time.perf_counter() - t0)


def _solve(problem: ScheduleProblem, time_budget_s: float, config: SolveConfig, hint: Schedule | None,
           progress: Callable[[Progress], None] | None, t0: float) -> Result:
    budget = resolve_budget(problem, config.memory_budget)
    if problem.link_contention:
        log.warning("solve: link contention %.2f is not modelled; the simulator scores it", problem.link_contention)
    # wall-clock solves keep at least 40% of the budget for the search
    deadline = None if config.deterministic else t0 + WARM_START_SHARE * time_budget_s
    # deterministic solves bound the deferral by the budget; wall-clock ones by the deadline
    scale = min(1.0, DEFER_REF_OPS / max(1, len(problem.ops)))
    moves = max(16, int(DEFER_MOVES_PER_S * time_budget_s * scale)) if config.deterministic else 4096
    builds = max(8, int(CRITICAL_BUILDS_PER_S * time_budget_s * scale)) if config.deterministic else None
    h_name, h_sched = (("hint", hint) if hint is not None
                       else warm_start(problem, budget, config, deadline, moves, builds))
    h_res = simulate(problem, h_sched)
    # a bound valid for every schedule (any order, any buckets): the floor of every reported bound
    floor_ns = makespan_lower_bound(problem).makespan_ns
    n_free = sum(op.kind is not OpKind.ZERO for op in problem.ops)
    if config.mode == "free" and n_free * (n_free - 1) // 2 > 4 * config.max_order_literals:
        frame, pairs = None, n_free * (n_free - 1) // 2  # far too large for a free frame: skip building it
    else:
        frame = build_frame(problem, config.frame_options())
        pairs = order_pairs(frame)
    if pairs > config.max_order_literals:
        layers = detect_layers(problem, config.layer_pattern) if config.layer_replay else None
        free_windows = config.mode == "free" and config.free_window > 0
        if config.mode == "free":
            # free order at scale: the warm start deferred independent compute; search in fixed order
            # around its heavy-compute order (same ops, so the schedule fits the original problem),
            # and every other round in a free-order window (cpsat_window.py)
            problem = reordered(problem, h_sched.order)
            config = dataclasses.replace(config, mode="fixed")
            frame = build_frame(problem, config.frame_options())
            pairs = order_pairs(frame)
        return _neighbourhood_solve(problem, config, budget, (h_name, h_sched, h_res), time_budget_s, t0,
                                    floor_ns, progress, frame, pairs, layers, free_windows)
    if not config.deterministic:  # a wall-clock budget covers the warm start too
        time_budget_s = max(0.0, time_budget_s - (time.perf_counter() - t0))
    t_build = time.perf_counter()
    builder = ModelBuilder(frame, budget, config.pinned)
    builder.build()
    builder.minimize_makespan()
    add_hint(builder, h_sched)
    stats = _stats(builder, time.perf_counter() - t_build)
    solver = _solver(config, time_budget_s * (1 - config.peak_phase_fraction if config.minimize_peak else 1))
    status = solver.Solve(builder.model, _Callback(progress, t0))
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
            return Result(_proven(Status.HEURISTIC, h_res.makespan_ns, bound), h_res.makespan_ns,
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
    return Result(_proven(Status.HEURISTIC, h_res.makespan_ns, floor_ns), h_res.makespan_ns,
                  min(floor_ns, h_res.makespan_ns), time.perf_counter() - t0, h_sched,
                  f"heuristic:{h_name}", h_res.peak_memory_bytes, budget, exact=exact, stats=stats)


def _proven(status: Status, objective: int, bound: int) -> Status:
    """OPTIMAL when the schedule meets a proven bound (whoever found it), else ``status``."""
    return Status.OPTIMAL if objective <= bound else status


def reordered(problem: ScheduleProblem, order: tuple[str, ...]) -> ScheduleProblem:
    """``problem`` with its ops in ``order`` (a valid program order): the fixed mode's backbone follows it."""
    by_name = {op.name: op for op in problem.ops}
    return dataclasses.replace(problem, ops=tuple(by_name[n] for n in order))


def _stats(builder: ModelBuilder, build_s: float) -> dict[str, int]:
    f = builder.frame
    stats = {"items": len(f.items), "candidates": len(f.candidates), "order_literals": len(builder.v.before),
             "segments": len(f.segments), "build_ms": int(build_s * 1000)}
    log.info("solve %s: %s", f.problem.name, stats)
    return stats


def positions_of(problem: ScheduleProblem, sched: Schedule) -> tuple[tuple[str, int, int], ...]:
    """Per collective, the program positions where ``sched`` issues and waits it (its bucket's)."""
    pos = {op: i for i, op in enumerate(sched.order)}
    wait_of = problem.wait_of
    return tuple((c.name, pos[c.name], pos[wait_of[c.name]]) for c in problem.collectives)


def centers_of(problem: ScheduleProblem, frame: Frame, sched: Schedule) -> tuple[tuple[str, int, int], ...]:
    """Per collective, the backbone slots where ``sched`` issues and waits it (its bucket's)."""
    pos = {op: i for i, op in enumerate(sched.order)}
    bb = sorted(pos[b] for b in frame.backbone)
    out = []
    for p in placements(problem, sched):
        i, w = bisect.bisect_left(bb, p.issue_pos), bisect.bisect_left(bb, p.wait_pos)
        out.extend((m, i, w) for m in p.members)
    return tuple(out)


def _neighbourhood_solve(problem: ScheduleProblem, config: SolveConfig, budget: int, heur: tuple,
                         time_budget_s: float, t0: float, floor_ns: int,  # the whole budget, from t0
                         progress: Callable[[Progress], None] | None, full: Frame, full_pairs: int,
                         layers: LayerStructure | None = None, free_windows: bool = False) -> Result:
    """Large graphs: rounds of CP-SAT over windows of the incumbent (first: the heuristic's).

    Each round frees the collectives (lone or bucketed) around the incumbent's most exposed one
    that has not been tried yet: they may move within ``lns_radius`` slots and their buckets may
    be split or merged with the next one (``bucket_moves``); every other bucket is forced as it
    is and held at its slots. An improved incumbent restarts the list; when every window has been
    tried without a gain, windows and radius double. The model's bound covers
    only the window, so the reported bound is the structural one (``bounds.makespan_lower_bound``),
    valid for every schedule. With ``layers`` (isomorphic layers of the problem), a gain local to
    one layer is replayed in the others and the first windows sit in one of them (layer_replay.py).
    With ``free_windows`` (free mode), a round may be a free-order window instead
    (:func:`_free_round`): whichever kind has paid more for its time so far
    (:func:`.cpsat_window.paid_rate`), free first on an unbucketed incumbent, fixed first on a
    bucketed one; a gain there changes the heavy-compute order the fixed rounds keep.
    """
    h_name, best, best_res = heur
    method = f"heuristic:{h_name}"
    stats: dict[str, int] = {"full_order_pairs": full_pairs, "rounds": 0, "improved": 0}
    # a round has a fixed cost (model build, presolve, reaching the hint) that grows with the
    # graph: about ROUND_S_PER_ITEM seconds per item of the full frame (44 s a round on the
    # 80-layer backward's 15k items). Deterministic: lns_rounds, but no more than the budget has
    # rounds of that cost, or of MIN_ROUND_S, and none when one round costs more than the whole
    # budget (decided from the budget and the size, not the clock); a round's deterministic time
    # shrinks past LNS_REF_ITEMS items, where CP-SAT's units take longer (about 19 s each on the
    # 80-layer backward, 4-5 s on 2k items). Wall clock: rounds until the time or the windows run out.
    n_items = len(full.items)
    if config.deterministic:
        rounds, round_s = deterministic_rounds(config.lns_rounds, time_budget_s, n_items)
    else:
        rounds = max(1, len(problem.collectives))
    tried: set[tuple[str, ...]] = set()
    size, radius = config.lns_window, config.lns_radius
    replayer = None
    if layers is not None and layers.classes:
        replayer = LayerReplayer(problem, layers, budget, config.layer_replay_evals,
                                 None if config.deterministic else t0 + time_budget_s)
        stats["layers_in_classes"] = len(layers.class_of)
    free_size, free_tried = config.free_window, set()
    # free mode: each round is of the kind that has paid more for its work so far (paid_rate);
    # free windows keep the incumbent's buckets and fixed rounds split and merge them, so on a
    # bucketed incumbent free windows start as if one round had already failed, else fixed ones
    free_first = not best.buckets
    paid = {True: [0.0 if free_first else MIN_ROUND_S, 0], False: [MIN_ROUND_S if free_first else 0.0, 0]}
    fixed_done = False
    for rnd in range(rounds):
        rates = (paid_rate(paid[True]), paid_rate(paid[False]))
        if free_windows and (fixed_done or rates[0] > rates[1] or (rates[0] == rates[1] and free_first)):
            left = time_budget_s - (time.perf_counter() - t0)
            if not config.deterministic and left <= 0:
                break
            got = _free_round(problem, config, budget, best, best_res, free_size, free_tried,
                              round_s if config.deterministic else min(left, max(MIN_ROUND_S, left / 3)),
                              progress, t0, stats)
            if got is None:  # every exposed collective tried at this size: widen (up to 4x), then stop
                if free_size >= 4 * config.free_window:
                    free_windows = False
                    if fixed_done:
                        break
                free_size, free_tried = min(2 * free_size, 4 * config.free_window), set()
                continue
            paid[True][0] += got[2]
            if got[1].peak_memory_bytes <= budget and (got[1].makespan_ns, got[1].peak_memory_bytes) < (
                    best_res.makespan_ns, best_res.peak_memory_bytes):
                best, best_res, method = got[0], got[1], "cpsat-lns"
                stats["improved"] += 1
                paid[True][1] += 1
                tried.clear()
                free_tried.clear()
                # the fixed rounds keep the new heavy-compute order
                problem = reordered(problem, best.order)
                full = build_frame(problem, config.frame_options())
                if replayer is not None and layers is not None:
                    replayer = LayerReplayer(problem, layers, budget, config.layer_replay_evals,
                                             None if config.deterministic else t0 + time_budget_s)
                log.info("solve %s: round %d (free window): makespan %d ns", problem.name, rnd, best_res.makespan_ns)
            continue
        window = replayer.seed_window(best_res, size, tried) if replayer and rnd < config.layer_seed_rounds else None
        window = window or _window(best_res, size, tried)
        if window is None:  # every window tried without a gain: widen them while they can still grow
            if size >= len(best_res.collectives) and radius >= MAX_RADIUS_FACTOR * config.lns_radius:
                if not free_windows:
                    break
                fixed_done = True
                continue
            size, radius, tried = 2 * size, 2 * radius, set()
            window = _window(best_res, size, tried)
            if window is None:  # no collectives at all
                break
        tried.add(window[0])
        centers = centers_of(problem, full, best)
        moves = bucket_moves(problem, Schedule(best.order, tuple(b for b in best.buckets if set(b) & window[1]),
                                               best.multi_dtype), config)
        opts = dataclasses.replace(
            config.frame_options(), centers=centers, radius=radius, bucketing=False,
            plan=tuple(dict.fromkeys((*(b for b in best.buckets if not set(b) & window[1]), *config.plan))),
            extra=moves, frozen=frozenset(c.name for c in problem.collectives if c.name not in window[1]),
            bucketed_only=frozenset(m for b in best.buckets if len(b) >= 4 and set(b) & window[1] for m in b),
            positions=positions_of(problem, best))
        t_round = time.perf_counter()
        frame = build_frame(problem, opts)
        builder = ModelBuilder(frame, budget, config.pinned)
        builder.build()
        builder.minimize_makespan()
        add_hint(builder, best)
        stats.update(_stats(builder, time.perf_counter() - t_round))
        stats["rounds"] += 1
        left = time_budget_s - (time.perf_counter() - t0)
        if not config.deterministic and left <= 0:
            break
        # wall clock: rounds of at least MIN_ROUND_S (a window model needs ~1-3 s to reach its hint)
        if not config.deterministic:
            round_s = min(left, max(MIN_ROUND_S, left / 3))
        solver = _solver(config, round_s, lns=True)
        status = solver.Solve(builder.model, _Callback(progress, t0))
        paid[False][0] += round_cost(config.deterministic, solver, round_s)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        sched = decode(builder, solver)
        res = simulate(problem, sched)
        if res.peak_memory_bytes <= budget and (res.makespan_ns, res.peak_memory_bytes) < (
                best_res.makespan_ns, best_res.peak_memory_bytes):
            if replayer is not None:
                sched, res = replayer.improve(best, sched, res, stats)
            best, best_res, method = sched, res, "cpsat-lns"
            stats["improved"] += 1
            paid[False][1] += 1
            tried.clear()
            log.info("solve %s: round %d: makespan %d ns", problem.name, rnd, res.makespan_ns)
    st = _proven(Status.FEASIBLE if method == "cpsat-lns" else Status.HEURISTIC, best_res.makespan_ns, floor_ns)
    if best_res.peak_memory_bytes > budget:
        st = Status.INFEASIBLE
    return Result(st, best_res.makespan_ns, min(floor_ns, best_res.makespan_ns), time.perf_counter() - t0, best,
                  method, best_res.peak_memory_bytes, budget,
                  min_feasible_budget_bytes=best_res.peak_memory_bytes if st is Status.INFEASIBLE else None,
                  exact=not problem.link_contention, stats=stats)


def _free_round(problem: ScheduleProblem, config: SolveConfig, budget: int, best: Schedule, best_res: SimResult,
                size: int, tried: set[tuple[str, ...]], round_s: float,
                progress: Callable[[Progress], None] | None, t0: float,
                stats: dict[str, int]) -> tuple[Schedule, SimResult, float] | None:
    """One free-order window round around the incumbent's most exposed untried collective
    (:func:`.cpsat_window.free_window`): its simulated answer (the incumbent when CP-SAT found
    nothing) and its cost (:func:`.cpsat_window.round_cost`); None when every exposed collective
    was tried at this size."""
    window = free_window(problem, best, best_res, size, tried)
    if window is None:
        return None
    tried.add(window[0])
    frame = window_frame(problem, best, window[1], window[2])
    if frame is None:
        return best, best_res, 0.0
    builder = ModelBuilder(frame, budget, config.pinned)
    builder.build()
    builder.minimize_makespan()
    add_hint(builder, best)
    stats["free_rounds"] = stats.get("free_rounds", 0) + 1
    solver = _solver(config, round_s, lns=True)
    status = solver.Solve(builder.model, _Callback(progress, t0))
    work = round_cost(config.deterministic, solver, round_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return best, best_res, work
    sched = decode(builder, solver)
    res = simulate(problem, sched)
    log.info("solve %s: free window %d..%d around %s: %d ns", problem.name, window[1], window[2], window[0][0],
             res.makespan_ns)
    return sched, res, work


def deterministic_rounds(max_rounds: int, time_budget_s: float, n_items: int) -> tuple[int, float]:
    """``(rounds, seconds of budget per round)`` for a deterministic neighbourhood search over a
    frame of ``n_items`` (see :func:`_neighbourhood_solve`); 0 rounds when one would cost more
    than the budget, unless the graph is small (a round of ``MIN_ROUND_S``)."""
    round_cost_s = max(MIN_ROUND_S, ROUND_S_PER_ITEM * n_items)
    rounds = min(max_rounds, int(time_budget_s // round_cost_s))
    if rounds == 0 and round_cost_s == MIN_ROUND_S:
        rounds = 1
    return rounds, (time_budget_s / rounds * min(1.0, LNS_REF_ITEMS / n_items) if rounds else 0.0)


MIN_ROUND_S = 4.0
ROUND_S_PER_ITEM = 0.003  # deterministic rounds: measured wall cost of a window round per frame item
LNS_REF_ITEMS = 2000  # deterministic rounds: their units shrink in proportion past this many items
MAX_RADIUS_FACTOR = 8  # windows stop widening at this multiple of lns_radius


def _window(res: SimResult, size: int, tried: set[tuple[str, ...]]) -> tuple[tuple[str, ...], set[str]] | None:
    """The untried most exposed placement of the simulated schedule ``res`` (else the untried one
    with the least slack) and the collectives of the ``size`` placements nearest it in issue order."""
    timings = sorted(res.collectives, key=lambda t: t.issue_pos)
    order = sorted(range(len(timings)), key=lambda i: (-timings[i].exposed_ns, timings[i].wait_ns - timings[i].end_ns))
    for i in order:
        if timings[i].members in tried:
            continue
        lo = max(0, i - size // 2)
        near = timings[lo:lo + size]
        return timings[i].members, {m for t in near for m in t.members}
    return None


def bucket_moves(problem: ScheduleProblem, sched: Schedule, config: SolveConfig) -> tuple[tuple[str, ...], ...]:
    """The neighbourhood's bucket candidates: the incumbent's buckets, each split in halves, and
    each merged with the next one of its key, so a round can refine the bucketing as well as move
    it (members of buckets of 4 or more get no lone candidate: splitting them to single
    collectives is never the move that pays at scale). Infeasible ones are dropped by the frame."""
    if not config.bucketing or config.plan:  # module plans fix the buckets
        return sched.buckets
    idx = problem.index
    buckets = sorted((tuple(sorted(b, key=idx.__getitem__)) for b in sched.buckets), key=lambda b: idx[b[0]])
    out = list(buckets)
    by_key: dict[tuple, list[tuple[str, ...]]] = {}
    for b in buckets:
        if len(b) >= 4:
            out += [b[:len(b) // 2], b[len(b) // 2:]]
        key = problem.op_by_name[b[0]].collective.bucket_key(config.multi_dtype)  # type: ignore[union-attr]
        by_key.setdefault(key, []).append(b)
    for same in by_key.values():
        for a, b in zip(same, same[1:]):
            if config.bucket_cap_bytes is None or bucket_size_bytes(problem, a + b) <= config.bucket_cap_bytes:
                out.append(a + b)
    return tuple(dict.fromkeys(out))


def _solver(config: SolveConfig, time_s: float, lns: bool = False) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    prm = solver.parameters
    if lns:  # window models are large and hinted: spend the time searching, not presolving
        prm.cp_model_probing_level = 0
        prm.symmetry_level = 0
        if config.deterministic:  # nor on LP bounds, which a window's model does not report:
            # these two interleaved LP workers ran 27 s and 6 s of wall time for 0.11 and 0.05
            # deterministic units on a window of the tp backward (1.25 units then took 50 s)
            prm.ignore_subsolvers.extend(["reduced_costs", "max_lp"])
    prm.random_seed = config.seed
    prm.num_workers = config.workers
    if config.deterministic:
        prm.max_deterministic_time = max(time_s * config.deterministic_rate, 0.01)
        # emergency stop only: a run that hits it is no longer reproducible (logged)
        prm.max_time_in_seconds = max(10 * time_s, 30.0)
        if config.workers > 1:
            prm.interleave_search = True
    else:
        prm.max_time_in_seconds = max(time_s, 0.01)
    return solver


def _peak_phase(builder: ModelBuilder, solver: cp_model.CpSolver, makespan: int,
                config: SolveConfig, time_s: float) -> Schedule | None:
    """Lowest peak at a makespan no worse than ``makespan``, hinted with the phase-1 solution."""
    m = builder.model
    m.ClearHints()
    for var in hint_vars(builder):
        m.AddHint(var, solver.Value(var))
    builder.minimize_peak(makespan)
    s2 = _solver(config, time_s)
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
    solver = _solver(config, max(time_budget_s * 0.5, 0.1))
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


__all__ = ["Progress", "Result", "SolveConfig", "Status", "decode", "resolve_budget", "solve", "warm_start"]
