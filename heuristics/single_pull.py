"""Single pulls: close a stall with one op from anywhere after it (free order).

Entry point: :func:`pull_single_fillers`. :func:`.fill.fill_stalls` walks the program once and
pulls ready compute into every stall in turn, so one pull that outlasts its stall and delays
what follows sinks the whole pass. Here each stall is tried on its own: any compute op after the
wait whose inputs all exist before it may move to just before the wait, and the simulator
scores each move. On the tp backward, two activation-gradient collectives were left exposed by
6.4 and 6.8 us after the search; a 17 us cast from further on hides each of them.

Stalls are tried least exposed first (a small one is the likeliest to close completely). Per
stall, ops that cover the exposure come first, the shortest of them first (they delay the
least), then the rest, longest first. The best move that shortens the makespan within the
memory budget is kept, and the search starts again. A move is valid by construction: the op's
inputs stay before it and its users after it, and no collective or wait moves relative to
another.
"""

from __future__ import annotations

import numpy as np

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.sim_tables import sim_tables
from ..solver.simulator import CollectiveTiming, SimResult, makespan_at, simulate
from .overlap import original_peak
from .reorder import first_improvements, named


def pull_single_fillers(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                        max_moves: int = 32, max_candidates: int = 40, deadline: float | None = None,
                        min_gain_ns: int = 0, max_evals: int | None = None) -> Schedule:
    """Improve ``schedule`` by moving single ops to just before stalled waits (see module doc).

    At most ``max_moves`` moves are kept, each shortening the makespan by more than
    ``min_gain_ns``; ``max_candidates`` ops are tried per stall, and ``max_evals`` (None: no limit)
    candidates in all, a bound on the work that does not depend on the machine (each one
    simulates the whole graph). The memory budget defaults to the original order's peak.
    ``deadline`` (a ``time.perf_counter()`` value; None: none, the deterministic default) stops it
    early."""
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    left = [max_evals]  # candidates still to try (None: no limit)
    return first_improvements(
        problem, schedule, "pull_single_fillers", max_moves, deadline, lambda t: (t.exposed_ns, t.wait_pos),
        lambda sched, res, t: _best_pull(problem, sched, res, t, budget, max_candidates, min_gain_ns, left))


def pull_candidates(problem: ScheduleProblem, order: tuple[str, ...], wait_pos: int, exposed_ns: int,
                    limit: int) -> list[int]:
    """Positions of the compute ops after ``wait_pos`` whose inputs all come before it, in the
    order they are tried (see module doc), at most ``limit``."""
    pos = {op: i for i, op in enumerate(order)}
    ops = problem.op_by_name
    covering: list[tuple[int, int]] = []
    short: list[tuple[int, int]] = []
    for j in range(wait_pos + 1, len(order)):
        op = ops[order[j]]
        if op.kind is not OpKind.COMPUTE or op.runtime_ns == 0 or any(pos[d] >= wait_pos for d in op.deps):
            continue
        if op.runtime_ns >= exposed_ns:
            covering.append((op.runtime_ns, j))
        else:
            short.append((-op.runtime_ns, j))
    return [j for _, j in sorted(covering) + sorted(short)][:limit]


def _best_pull(problem: ScheduleProblem, sched: Schedule, res: SimResult, t: CollectiveTiming, budget: int,
               limit: int, min_gain_ns: int, left: list[int | None]) -> tuple[Schedule, SimResult] | None:
    """The fastest single pull before ``t``'s wait within ``budget`` that beats ``res`` by more
    than ``min_gain_ns`` (None if none does). Ranked by makespan, then simulated in full; ``left``
    holds how many candidates may still be tried, counted down."""
    order, w = sched.order, t.wait_pos
    at, _ = sim_tables(problem).positions(problem, order)
    ranked: list[tuple[int, int, np.ndarray]] = []
    cands = pull_candidates(problem, order, w, t.exposed_ns, limit if left[0] is None else min(limit, left[0]))
    if left[0] is not None:
        left[0] -= len(cands)
    for j in cands:  # ranked as index arrays; only the ones simulated in full are named
        cand_at = np.concatenate((at[:w], at[j:j + 1], at[w:j], at[j + 1:]))
        if (ms := makespan_at(problem, cand_at, sched.buckets)) < res.makespan_ns - min_gain_ns:
            ranked.append((ms, j, cand_at))
    for _, _, cand_at in sorted(ranked, key=lambda x: x[:2]):
        cand = named(problem, cand_at, sched)
        r = simulate(problem, cand, check=False)  # valid by construction
        if r.peak_memory_bytes <= budget:
            return cand, r
    return None
