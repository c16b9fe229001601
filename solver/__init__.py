"""Problem IR, simulator and (later) the CP-SAT model. Never imports torch."""

from .problem import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProblemError,
    ProcessGroup,
    ScheduleProblem,
    Storage,
)
from .schedule import Schedule, ScheduleError, Violation, ViolationKind, check_schedule
from .serialization import load_problem, load_schedule, save_problem, save_schedule
from .simulator import CollectiveTiming, SimResult, simulate

__all__ = [
    "BucketCosts", "CollectiveInfo", "CollectiveKind", "CollectiveTiming", "CommCurve", "Op",
    "OpKind", "ProblemError", "ProcessGroup", "Schedule", "ScheduleError", "ScheduleProblem",
    "SimResult", "Storage", "Violation", "ViolationKind", "check_schedule", "load_problem",
    "load_schedule", "save_problem", "save_schedule", "simulate",
]
