"""Greedy schedulers and bucketers: the CP-SAT warm start and the fallback when time runs out.

Torch-free and ortools-free. Every heuristic maps a problem to a :class:`Schedule` that the one
simulator scores. :data:`HEURISTICS` names them for benchmarks and the CLI.
"""

from __future__ import annotations

from collections.abc import Callable

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from .bucketing import bucket_greedy, bucketed_overlap
from .classic import raise_and_sink, raise_collectives, sink_waits
from .overlap import OverlapConfig, overlap_schedule
from .plans import ModulePlan, per_block_plan, plan_buckets, plan_schedule

Heuristic = Callable[[ScheduleProblem], Schedule]

HEURISTICS: dict[str, Heuristic] = {
    "sink_waits": sink_waits,
    "raise_collectives": raise_collectives,
    "raise_and_sink": raise_and_sink,
    "overlap": overlap_schedule,
    "overlap_jit": lambda p: overlap_schedule(p, config=OverlapConfig(policy="just_in_time")),
    "overlap_early": lambda p: overlap_schedule(p, config=OverlapConfig(policy="early")),
    "bucket+overlap": bucketed_overlap,
    "bucket_exposed+overlap": lambda p: bucketed_overlap(p, exposed_first=True),
    "bucket_multidtype+overlap": lambda p: bucketed_overlap(p, multi_dtype=True),
    "plan_per_block": lambda p: _plan_or_overlap(p),
}


def _plan_or_overlap(problem: ScheduleProblem) -> Schedule:
    """Module bucket plan with one entry per block; plain overlap when no module is known."""
    plan = per_block_plan(problem)
    return plan_schedule(problem, plan) if plan else overlap_schedule(problem)

__all__ = ["HEURISTICS", "Heuristic", "ModulePlan", "OverlapConfig", "bucket_greedy", "bucketed_overlap",
           "overlap_schedule", "per_block_plan", "plan_buckets", "plan_schedule", "raise_and_sink",
           "raise_collectives", "sink_waits"]
