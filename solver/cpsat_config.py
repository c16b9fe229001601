"""The solver-neutral types of :func:`.cpsat.solve` (config, result, status, progress) and the
CP-SAT plumbing its phases share: solver parameters, the progress callback, statistics.

Split from cpsat.py so that the neighbourhood search (cpsat_lns.py) and the one-model path
(cpsat.py) use the same pieces without importing each other.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from ortools.sat.python import cp_model

from ..heuristics.overlap import original_peak
from .cpsat_frame import FrameOptions
from .cpsat_model import ModelBuilder
from .layers import DEFAULT_LAYER_PATTERN
from .problem import ScheduleProblem
from .schedule import Schedule

log = logging.getLogger(__name__)


class Status(str, Enum):
    OPTIMAL = "optimal"  # proven optimal: by CP-SAT over the modelled space, or meets the structural bound
    FEASIBLE = "feasible"  # a CP-SAT schedule, not proven optimal
    HEURISTIC = "heuristic"  # CP-SAT found nothing better in time: the heuristic's schedule
    INFEASIBLE = "infeasible"  # nothing fits the memory budget; see min_feasible_budget_bytes


SPINE_RADIUS = 4  # SolveConfig.spine_radius's default (solver/spine_fill.py)


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
    # heuristic searches side by side, one process each (the stream plan search's seeds: seed,
    # seed + 1, ...; heuristics.parallel_plans). 1: none; the compile hook keeps 1
    processes: int = 1
    deterministic: bool = True
    deterministic_rate: float = 0.25  # deterministic time units per second of budget (see module doc)
    minimize_peak: bool = True  # second phase: lowest peak at the best makespan
    polish: bool = True  # stalls concentrated, compute pulled into them (concentrate.py): warm start, gains, answer
    # final polish: more collectives hidden (hide.py) at a makespan at most this share above the answer's
    # (0: never longer); a positive slack trades makespan for collectives whose runtime has slack
    hide_slack: float = 0.0
    # free mode: this share of the budget goes to the spine fill (solver/spine_fill.py), which
    # reassigns compute to the windows of the longest collective chain at once; its answer,
    # polished, is kept when it hides more at no longer makespan within the memory budget (0: off)
    spine_share: float = 0.0
    # slots an op may move from the incumbent's in the spine fill (two chain windows each way at 4);
    # wider lets weight gradients cascade across more windows, in a larger model
    spine_radius: int = SPINE_RADIUS
    peak_phase_fraction: float = 0.2
    max_order_literals: int = 40_000  # above this, neighbourhood rounds around the incumbent
    lns_rounds: int = 8  # deterministic mode: neighbourhood rounds on large graphs (each a window)
    lns_radius: int = 6  # slots a windowed item may move
    lns_window: int = 6  # placements (buckets or lone collectives) freed per round
    free_window: int = 60  # free mode at scale: timed ops whose order every other round frees (0: none)
    layer_replay: bool = True  # large graphs: replay a round's gain in isomorphic layers (layer_replay.py)
    layer_pattern: str = DEFAULT_LAYER_PATTERN  # module FQN regex whose group 1 names a layer
    layer_seed_rounds: int = 2  # the first rounds' windows sit in one layer of the largest class
    layer_replay_evals: int = 16  # simulations per replayed gain

    def __post_init__(self) -> None:
        if self.mode not in ("fixed", "free"):
            raise ValueError(f"SolveConfig.mode must be 'fixed' or 'free', got {self.mode!r}")
        if self.workers < 1:
            raise ValueError("SolveConfig.workers must be >= 1")
        if self.processes < 1:
            raise ValueError("SolveConfig.processes must be >= 1")
        if self.deterministic_rate <= 0:
            raise ValueError("SolveConfig.deterministic_rate must be > 0")
        if isinstance(self.hide_slack, bool) or not 0.0 <= self.hide_slack <= 1.0:
            raise ValueError(f"SolveConfig.hide_slack must be a share in [0, 1], got {self.hide_slack!r}")
        if isinstance(self.spine_share, bool) or not 0.0 <= self.spine_share < 0.5:
            raise ValueError(f"SolveConfig.spine_share must be a share in [0, 0.5), got {self.spine_share!r}")
        if isinstance(self.spine_radius, bool) or not isinstance(self.spine_radius, int) or self.spine_radius < 1:
            raise ValueError(f"SolveConfig.spine_radius must be an integer >= 1, got {self.spine_radius!r}")
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
    model_objective: int | None = None  # CP-SAT's makespan for its own schedule (before the final polish)
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


class SolutionReporter(cp_model.CpSolverSolutionCallback):
    """Passes each improving solution to the progress callback ``fn`` and notes when it came."""

    def __init__(self, fn: Callable[[Progress], None] | None, t0: float):
        super().__init__()
        self.fn, self.t0 = fn, t0
        self.last = time.perf_counter()

    def on_solution_callback(self) -> None:
        self.last = time.perf_counter()
        if self.fn is not None:
            self.fn(Progress(time.perf_counter() - self.t0, int(self.ObjectiveValue()), int(self.BestObjectiveBound())))


def solve_patiently(solver: cp_model.CpSolver, model: cp_model.CpModel, reporter: SolutionReporter,
                    patience_s: float) -> int:
    """``solver.Solve(model, reporter)``, stopped once no better solution has come for the longer
    of ``patience_s`` and half the time since the start (wall-clock rounds only: a window that
    keeps improving runs on to its time limit, one that stalls gives its time back). A window of
    the tp backward's tail improved from 8 s to 25 s into one 30 s round, and found nothing in
    the 10 s round that restarted it; other windows reach their best in a few seconds."""
    start = reporter.last = time.perf_counter()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            now = time.perf_counter()
            if now - reporter.last > max(patience_s, 0.5 * (now - start)):
                solver.stop_search()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return solver.Solve(model, reporter)
    finally:
        done.set()
        watcher.join()


def proven(status: Status, objective: int, bound: int) -> Status:
    """OPTIMAL when the schedule meets a proven bound (whoever found it), else ``status``."""
    return Status.OPTIMAL if objective <= bound else status


def reordered(problem: ScheduleProblem, order: tuple[str, ...]) -> ScheduleProblem:
    """``problem`` with its ops in ``order`` (a valid program order): the fixed mode's backbone follows it."""
    by_name = {op.name: op for op in problem.ops}
    return dataclasses.replace(problem, ops=tuple(by_name[n] for n in order))


def model_stats(builder: ModelBuilder, build_s: float) -> dict[str, int]:
    f = builder.frame
    stats = {"items": len(f.items), "candidates": len(f.candidates), "order_literals": len(builder.v.before),
             "segments": len(f.segments), "build_ms": int(build_s * 1000)}
    log.info("solve %s: %s", f.problem.name, stats)
    return stats


def make_solver(config: SolveConfig, time_s: float, lns: bool = False, presolve: bool = True) -> cp_model.CpSolver:
    """A CP-SAT solver for ``time_s`` under ``config``; ``lns``: for a hinted window model;
    ``presolve=False``: no presolve at all (see :func:`.cpsat_lns._free_round`)."""
    solver = cp_model.CpSolver()
    prm = solver.parameters
    if lns:  # window models are large and hinted: spend the time searching, not presolving
        prm.cp_model_probing_level = 0
        prm.symmetry_level = 0
        if config.deterministic:  # nor on LP bounds, which a window's model does not report:
            # these two interleaved LP workers ran 27 s and 6 s of wall time for 0.11 and 0.05
            # deterministic units on a window of the tp backward (1.25 units then took 50 s)
            prm.ignore_subsolvers.extend(["reduced_costs", "max_lp"])
    if not presolve:
        prm.cp_model_presolve = False
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


