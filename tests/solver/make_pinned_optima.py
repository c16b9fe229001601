"""Regenerate tests/solver/data/pinned_optima.json: tiny problems with their brute-force optima.

Run from the repository root: ``python -m tests.solver.make_pinned_optima``. Each entry holds a
problem (``problem_to_dict``), the oracle's optimum in free and fixed mode (bucketing on, default
budget = the original order's peak; ``null`` when nothing fits), that budget, and the number of
free-mode canonical schedules enumerated. CP-SAT tests compare against these numbers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fxsched.solver import ScheduleProblem
from fxsched.solver.serialization import problem_to_dict

try:
    from .oracle import brute_force, default_budget
    from .tiny_instances import tiny_problems
except ImportError:  # run with tests/solver on sys.path
    from oracle import brute_force, default_budget  # type: ignore[no-redef]
    from tiny_instances import tiny_problems  # type: ignore[no-redef]

PINNED_SEED = 2024
N_ENTRIES = 20
SCHEMA = 1
PATH = Path(__file__).parent / "data" / "pinned_optima.json"


def entry(p: ScheduleProblem) -> dict[str, Any]:
    """One file entry: the problem and its free/fixed optima under the default budget."""
    free = brute_force(p, mode="free")
    fixed = brute_force(p, mode="fixed")
    return {
        "problem": problem_to_dict(p),
        "free_optimum_ns": free.best_makespan_ns,
        "fixed_optimum_ns": fixed.best_makespan_ns,
        "budget_bytes": default_budget(p),
        "n_schedules": free.n_schedules,
    }


def build(seed: int = PINNED_SEED, n: int = N_ENTRIES) -> dict[str, Any]:
    return {"schema": SCHEMA, "seed": seed, "entries": [entry(p) for p in tiny_problems(n, seed=seed)]}


def main() -> None:
    t0 = time.perf_counter()
    data = build()
    PATH.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join(json.dumps(e, separators=(",", ":")) for e in data["entries"])
    PATH.write_text(f'{{"schema": {data["schema"]}, "seed": {data["seed"]}, "entries": [\n{body}\n]}}\n')
    print(f"wrote {len(data['entries'])} entries to {PATH} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
