"""The budget sweep (benchmarks/budget_sweep.py) on a hand-derived problem where memory decides."""

from __future__ import annotations

from fxsched.benchmarks.budget_sweep import sweep, table
from tests.solver.solver_builders import loss_then_gather


def test_sweep_finds_what_each_budget_allows_and_proves_it() -> None:
    """``loss_then_gather``: the original order peaks at 100 + 1,000 + 1 = 1,101 B. At that budget
    the gather (700 ns) cannot be live beside the temporary (1,601 B), so it is issued after b:
    the optimum is 2,010 + 700 + 1,000 = 3,710 ns. At 1.5x (1,651 B) it is issued first and hides
    under a: the compute, 3,010 ns, at a peak of 1,601 B (1601/1101 of the original)."""
    p = loss_then_gather()
    rows = sweep(p, [1.0, 1.5], time_limit_s=2.0, workers=1, wall_clock=False)
    assert [(r.ratio, r.result.makespan_ns, r.bound_ns, r.result.peak_memory_bytes) for r in rows] == [
        (1.0, 3_710, 3_710, 1_101), (1.5, 3_010, 3_010, 1_601)]
    assert [r.gap for r in rows] == [0.0, 0.0]
    text = "\n".join(table(p, rows))
    assert "| 1x | 3.7 | 0.7 |" in text and "| 1.5x | 3.0 | 0.0 |" in text
    assert "| 1.454 |" in text  # 1601 / 1101
