"""Stream plan searches from several seeds side by side, one process each (a portfolio).

Entry point: :func:`plan_search_seeds`. The stream plan search (stream_plan.py) is a pure-Python
annealing: it keeps one core busy, and where it decides the result (a communication-bound graph
such as the 4-node FSDP backward) the seed decides a good part of it. On a machine with more
cores than that, the same wall-clock time buys more seeds: the first runs in this process, the
others in child processes (``spawn``: a fresh interpreter, so that nothing forked from a parent
with threads, such as torch's, runs in them), and the fastest answer within the budget wins.

Deterministic: each seed's search is deterministic without a deadline, and the winner is picked
by (over the budget, makespan, peak memory, seed order), so equal inputs give equal answers on
every rank. A child that fails (it could not start, or raised) is logged and left out; the
parent's own seed always runs, so the result is never worse than a one-seed search from it.

Nothing here imports torch or ortools.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.simulator import simulate
from .overlap import original_peak
from .stream_plan import plan_search

log = logging.getLogger(__name__)


def _search(problem: ScheduleProblem, schedule: Schedule, seed: int, kwargs: dict[str, Any]) -> Schedule:
    """One seed's search."""
    return plan_search(problem, schedule, seed=seed, **kwargs)


def _child_search(payload: bytes, seed: int) -> Schedule:
    """A child process's whole job (top-level, so that it pickles): one seed's search of the
    ``(problem, schedule, kwargs)`` pickled in ``payload``.

    The parent pickles them itself, before its own search starts. Handed to the pool as objects,
    they would be pickled later, in the pool's feeder thread, while the parent's search fills the
    problem's cached properties: "dictionary changed size during iteration", and the child's seed
    was lost (on the 4-node backward, in every 2-process solve).
    """
    problem, schedule, kwargs = pickle.loads(payload)
    return _search(problem, schedule, seed, kwargs)


def plan_search_seeds(problem: ScheduleProblem, schedule: Schedule, seeds: Sequence[int], *,
                      budget_bytes: int | None = None, **kwargs: Any) -> Schedule:
    """The fastest of :func:`.stream_plan.plan_search` from ``schedule`` with each of ``seeds``
    (module doc): the first in this process, each other in a child process at the same time.

    ``kwargs`` go to every search as given (``max_evals``, ``deadline``: a ``time.perf_counter()``
    value, which is the system's monotonic clock and so means the same instant in a child).
    """
    if not seeds:
        raise ValueError("plan_search_seeds: no seeds")
    budget = original_peak(problem) if budget_bytes is None else budget_bytes
    kwargs = dict(kwargs, budget_bytes=budget)
    futures: list[tuple[int, Future[Schedule]]] = []
    pool = None
    if len(seeds) > 1:
        try:
            payload = pickle.dumps((problem, schedule, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
            pool = ProcessPoolExecutor(len(seeds) - 1, mp_context=multiprocessing.get_context("spawn"))
            futures = [(s, pool.submit(_child_search, payload, s)) for s in seeds[1:]]
        except Exception as exc:  # noqa: BLE001 - no child: the parent's seed still runs
            log.warning("plan_search_seeds %s: could not start child searches (%s); one seed only", problem.name, exc)
    collected = False
    try:
        results = [(seeds[0], _search(problem, schedule, seeds[0], kwargs))]
        for seed, fut in futures:
            try:
                results.append((seed, fut.result()))
            except Exception as exc:  # noqa: BLE001 - a failed child loses its seed, not the search
                log.warning("plan_search_seeds %s: seed %d failed (%s); left out", problem.name, seed, exc)
        collected = True
    finally:
        if pool is not None:  # on an error here, do not wait for the children's searches to end
            pool.shutdown(wait=collected, cancel_futures=True)
    best_key, best = None, schedule
    for k, (seed, sched) in enumerate(results):
        r = simulate(problem, sched)
        key = (r.peak_memory_bytes > budget, r.makespan_ns, r.peak_memory_bytes, k)
        log.debug("plan_search_seeds %s: seed %d: makespan %d ns, peak %d", problem.name, seed, r.makespan_ns,
                  r.peak_memory_bytes)
        if best_key is None or key < best_key:
            best_key, best = key, sched
    return best
