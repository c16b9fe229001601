"""Far filler deferral: hide a queue of collectives behind one filler from far back (free order).

Entry point: :func:`defer_far_fillers`. At the end of a tensor-parallel backward the last
gradient reductions queue on their group's stream behind the embedding's (1.3 ms on the tp
backward), and only compute issued after the head of that queue can hide them. The compute
just before the head hides the tensor-parallel collectives of the first layer, so
:func:`.reorder.defer_independent`, which defers the latest compute, uncovers what it moves
from. A weight gradient of a layer far back may hide nothing critical where it is: deferred to
the tail it hides the queue, and its own reduction joins the queue for less than it covers
(488 us of matmul for a 316 us reduce-scatter).

For each exposed collective, most exposed first, the pass finds the **head** of its group's busy
period (the first collective of the run the stream carried without a break, each queued behind
the one before) and tries each filler (:func:`.reorder.filler_ops`) before the head's issue that
is not its ancestor, alone: it and what depends on it up to the issue move just after the issue
(:func:`.reorder.fastest_deferral`). The fastest move within the memory budget that shortens the
makespan is kept, and the search starts again. A move keeps every collective's inputs and the
FIFO order of every group (see reorder.py), and the simulator scores it.
"""

from __future__ import annotations

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.simulator import CollectiveTiming, SimResult
from .overlap import original_peak
from .reorder import fastest_deferral, filler_ops, first_improvements


def defer_far_fillers(problem: ScheduleProblem, schedule: Schedule, *, budget_bytes: int | None = None,
                      max_moves: int = 32, max_seeds: int = 256, deadline: float | None = None,
                      min_gain_ns: int = 0, max_evals: int | None = None) -> Schedule:
    """Improve ``schedule`` by deferring single fillers past the head of an exposed collective's
    queue (see module doc). At most ``max_moves`` moves are kept, and at most ``max_seeds``
    fillers (evenly spread over the program) are tried per head, and ``max_evals`` (None: no
    limit) in all: a bound on the work that does not depend on the machine (each try times the
    whole graph); a move must shorten the makespan by more than ``min_gain_ns``. ``deadline`` (a
    ``time.perf_counter()`` value; None: none, the deterministic default) stops it early."""
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    fillers = sorted(filler_ops(problem), key=problem.index.__getitem__)
    tried: set[tuple[tuple[str, ...], int]] = set()  # (head, makespan when tried)
    left = [max_evals]  # fillers still to try (None: no limit)

    def move(sched: Schedule, res: SimResult, t: CollectiveTiming) -> tuple[Schedule, SimResult] | None:
        head = queue_head(res, t)
        if (head.members, res.makespan_ns) in tried:
            return None
        tried.add((head.members, res.makespan_ns))
        return _best_move(problem, sched, res, head, fillers, budget, max_seeds, deadline, min_gain_ns, left)

    return first_improvements(problem, schedule, "defer_far_fillers", max_moves, deadline,
                              lambda t: (-t.exposed_ns, t.issue_pos), move)


def queue_head(res: SimResult, t: CollectiveTiming) -> CollectiveTiming:
    """The first placement of the run ``t``'s group stream carried without a break up to ``t``,
    each one after the first queued (started after its issue) behind the one before."""
    runs = sorted((c for c in res.collectives if c.group == t.group), key=lambda c: c.start_ns)
    k = runs.index(t)
    while k > 0 and runs[k].start_ns > runs[k].issue_ns and runs[k - 1].end_ns >= runs[k].start_ns:
        k -= 1
    return runs[k]


def _best_move(problem: ScheduleProblem, sched: Schedule, res: SimResult, head: CollectiveTiming,
               fillers: list[str], budget: int, max_seeds: int, deadline: float | None, min_gain_ns: int,
               left: list[int | None]) -> tuple[Schedule, SimResult] | None:
    """The fastest single-filler deferral past ``head``'s issue that shortens the makespan by more
    than ``min_gain_ns`` within ``budget`` (None if none does); ``left`` holds how many fillers may
    still be tried, counted down."""
    anc = 0
    for m in head.members:
        anc |= problem.ancestors[problem.index[m]] | (1 << problem.index[m])
    pos = {op: i for i, op in enumerate(sched.order)}
    seeds = [f for f in fillers if pos[f] < head.issue_pos and not anc >> problem.index[f] & 1]
    if len(seeds) > max_seeds:
        seeds = [seeds[k * len(seeds) // max_seeds] for k in range(max_seeds)]
    if left[0] is not None:
        seeds = seeds[:left[0]]
        left[0] -= len(seeds)
    return fastest_deferral(problem, sched, res, head.issue_pos, ({f} for f in seeds), budget, deadline,
                            min_gain_ns)
