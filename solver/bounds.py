"""Cheap, valid lower bounds on exposed communication time (for schedules without bucketing).

Two arguments, both from the execution model:

* **Dependency bound.** A collective ``c`` cannot start before all compute it depends on has
  run, and everything that depends on it runs after it ends, all on the one compute stream. So
  ``makespan >= anc(c) + rt(c) + desc(c)``, i.e. ``exposed >= rt(c) - indep(c)`` where
  ``indep(c)`` is the compute independent of ``c``.
* **FIFO bound.** A group's collectives run one at a time. The first cannot start before the
  smallest ancestor compute of any of them, and after the last ends at least the smallest
  descendant compute of any of them remains. So ``makespan >= min anc + sum rt + min desc``.

Bucketing changes runtimes, so these bounds hold only for unbucketed schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import OpKind, ScheduleProblem


@dataclass(frozen=True)
class ExposedBound:
    exposed_ns: int
    dependency_ns: int  # best single-collective dependency bound
    fifo_ns: int  # best per-group FIFO bound
    limiting: str  # the collective or group that gives the bound


def _bit_sum(bits: int, weights: np.ndarray) -> int:
    n = len(weights)
    raw = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    mask = np.unpackbits(raw, bitorder="little")[:n].astype(bool)
    return int(weights[mask].sum())


def exposed_lower_bound(problem: ScheduleProblem) -> ExposedBound:
    """A lower bound on the exposed time of every valid unbucketed schedule of ``problem``."""
    weights = np.array(
        [op.runtime_ns if op.kind in (OpKind.COMPUTE, OpKind.ZERO) else 0 for op in problem.ops],
        dtype=np.int64,
    )
    total = int(weights.sum())
    best_dep, dep_name = 0, ""
    per_group: dict[str, list[tuple[int, int, int]]] = {}
    for c in problem.collectives:
        i = problem.index[c.name]
        anc = _bit_sum(problem.ancestors[i], weights)
        desc = _bit_sum(problem.descendants[i], weights)
        bound = anc + c.runtime_ns + desc - total
        if bound > best_dep:
            best_dep, dep_name = bound, c.name
        per_group.setdefault(c.collective.group, []).append((anc, c.runtime_ns, desc))  # type: ignore[union-attr]
    best_fifo, fifo_name = 0, ""
    for g, items in per_group.items():
        bound = min(a for a, _, _ in items) + sum(r for _, r, _ in items) + min(d for _, _, d in items) - total
        if bound > best_fifo:
            best_fifo, fifo_name = bound, g
    if best_dep >= best_fifo:
        return ExposedBound(best_dep, best_dep, best_fifo, f"collective {dep_name}" if dep_name else "none")
    return ExposedBound(best_fifo, best_dep, best_fifo, f"group {fifo_name}")
