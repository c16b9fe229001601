"""Greedy schedulers and bucketers: the CP-SAT warm start and the fallback when time runs out.

Torch-free and ortools-free. Every heuristic maps a problem to a :class:`Schedule` that the one
simulator scores. :data:`HEURISTICS` names them for benchmarks and the CLI.
"""

from __future__ import annotations

from collections.abc import Callable

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from .classic import raise_and_sink, raise_collectives, sink_waits
from .overlap import OverlapConfig, overlap_schedule

Heuristic = Callable[[ScheduleProblem], Schedule]

HEURISTICS: dict[str, Heuristic] = {
    "sink_waits": sink_waits,
    "raise_collectives": raise_collectives,
    "raise_and_sink": raise_and_sink,
    "overlap": overlap_schedule,
    "overlap_jit": lambda p: overlap_schedule(p, config=OverlapConfig(policy="just_in_time")),
    "overlap_early": lambda p: overlap_schedule(p, config=OverlapConfig(policy="early")),
}

__all__ = ["HEURISTICS", "Heuristic", "OverlapConfig", "overlap_schedule", "raise_and_sink",
           "raise_collectives", "sink_waits"]
