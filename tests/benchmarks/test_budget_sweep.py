"""The budget sweep (benchmarks/budget_sweep.py) on a hand-derived problem where memory decides."""

from __future__ import annotations

from fxsched.benchmarks.budget_sweep import sweep, table
from tests.solver.solver_builders import AG, coll, compute, make_problem, storage, wait


def _loss_then_gather():
    """a (2,000 ns) makes the temporary T (1,000 B), which b (10 ns) reads, making U (1 B); g
    gathers the parameter pg (100 B, never freed) into G (500 B; 700 ns), which y (1,000 ns) reads
    with U. The original order (a, b, g, y) peaks at b: 100 + 1,000 + 1 = 1,101 B.

    At that budget g cannot be live beside T (1,601 B), so it is issued after b: the optimum is
    2,010 + 700 + 1,000 = 3,710 ns. With 1.5x (1,651 B) it is issued first and hides under a:
    the compute, 3,010 ns, at a peak of 1,601 B (1601/1101 of the original)."""
    return make_problem([
        compute("a", 2_000, allocates=["T"], heavy=True),
        compute("b", 10, deps=["a"], uses=["T"], allocates=["U"]),
        coll("g", "A", AG, runtime_ns=700, bytes_in=100, bytes_out=500, uses=["pg"], allocates=["G"]),
        wait("wg", "g", uses=["G"]),
        compute("y", 1_000, deps=["wg", "b"], uses=["G", "U"], heavy=True),
    ], [storage("pg", 100, param=True), storage("T", 1_000), storage("U", 1), storage("G", 500)], groups=("A",))


def test_sweep_finds_what_each_budget_allows_and_proves_it() -> None:
    p = _loss_then_gather()
    rows = sweep(p, [1.0, 1.5], time_limit_s=2.0, workers=1, wall_clock=False)
    assert [(r.ratio, r.result.makespan_ns, r.bound_ns, r.result.peak_memory_bytes) for r in rows] == [
        (1.0, 3_710, 3_710, 1_101), (1.5, 3_010, 3_010, 1_601)]
    assert [r.gap for r in rows] == [0.0, 0.0]
    text = "\n".join(table(p, rows))
    assert "| 1x | 3.7 | 0.7 |" in text and "| 1.5x | 3.0 | 0.0 |" in text
    assert "| 1.454 |" in text  # 1601 / 1101
