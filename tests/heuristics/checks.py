"""Checks the free-order improvement passes' tests share."""

from __future__ import annotations

from fxsched.heuristics.overlap import original_peak
from fxsched.solver import Schedule, ScheduleProblem, SimResult, check_schedule, simulate


def assert_valid_never_worse(p: ScheduleProblem, base: Schedule, out: Schedule) -> SimResult:
    """``out`` is valid, no slower than ``base``, and within the original peak or ``base``'s;
    returns its simulation."""
    assert check_schedule(p, out) == []
    r0, r = simulate(p, base), simulate(p, out)
    assert r.makespan_ns <= r0.makespan_ns
    assert r.peak_memory_bytes <= max(original_peak(p), r0.peak_memory_bytes)
    return r
