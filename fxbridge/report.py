"""Side-by-side tables of schedules scored by the one simulator (used by the demo and benchmarks)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from ..heuristics import HEURISTICS

from ..solver.bounds import ExposedBound, exposed_lower_bound
from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.simulator import SimResult, simulate


@dataclass(frozen=True)
class Row:
    """One scheduler's result on one problem."""

    scheduler: str
    result: SimResult
    solve_time_s: float = 0.0


def fmt_us(ns: int) -> str:
    return f"{ns / 1e3:,.1f}"


def fmt_mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:,.1f}"


def graph_summary(problem: ScheduleProblem) -> list[tuple[str, str]]:
    """(label, value) lines describing the problem: ops, collectives by kind and group, bounds."""
    kinds = Counter(op.kind for op in problem.ops)
    colls = Counter((c.collective.kind.value, c.collective.group) for c in problem.collectives)  # type: ignore[union-attr]
    sizes = {g.name: g.size for g in problem.groups}
    lines = [
        ("ops", f"{len(problem.ops)} ({kinds[OpKind.COMPUTE]} compute, {kinds[OpKind.ZERO]} zero-cost, "
                f"{kinds[OpKind.COLLECTIVE]} collectives, {kinds[OpKind.WAIT]} waits)"),
        ("heavy compute ops", str(sum(op.heavy for op in problem.ops))),
    ]
    for (kind, group), n in sorted(colls.items()):
        total = sum(c.runtime_ns for c in problem.collectives
                    if c.collective.kind.value == kind and c.collective.group == group)  # type: ignore[union-attr]
        lines.append((f"  {kind} on group {group} (size {sizes[group]})", f"{n} x, {fmt_us(total)} us total"))
    return lines


def rows_table(problem: ScheduleProblem, rows: list[Row], bound: ExposedBound | None = None) -> str:
    """A fixed-width table, one row per scheduler, original order first."""
    bound = bound or exposed_lower_bound(problem)
    base_peak = rows[0].result.peak_memory_bytes if rows else 0
    head = ["scheduler", "compute us", "comm us", "exposed us", "makespan us", "hidden/hideable",
            "collectives", "peak MiB", "peak vs orig", "solve s"]
    body = []
    for r in rows:
        res = r.result
        body.append([
            r.scheduler, fmt_us(res.compute_ns), fmt_us(res.comm_ns), fmt_us(res.exposed_ns),
            fmt_us(res.makespan_ns), f"{res.n_hidden_hideable}/{res.n_hideable}", str(res.n_collectives),
            fmt_mib(res.peak_memory_bytes),
            f"{res.peak_memory_bytes / base_peak:.3f}" if base_peak else "-", f"{r.solve_time_s:.2f}",
        ])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    out.append(f"lower bound on exposed time (unbucketed): {fmt_us(bound.exposed_ns)} us "
               f"(dependency {fmt_us(bound.dependency_ns)}, FIFO {fmt_us(bound.fifo_ns)}; limited by {bound.limiting})")
    return "\n".join(out)


def original_row(problem: ScheduleProblem) -> Row:
    return Row("original order", simulate(problem, Schedule.original(problem)))


def scheduler_rows(problem: ScheduleProblem) -> list[Row]:
    """The original order, then every registered heuristic with its own run time."""
    rows = [original_row(problem)]
    for name, heuristic in HEURISTICS.items():
        t0 = time.perf_counter()
        schedule = heuristic(problem)
        rows.append(Row(name, simulate(problem, schedule), time.perf_counter() - t0))
    return rows
