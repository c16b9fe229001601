"""Classic passes, as selectable baselines (the behaviour of Inductor's ``comms.py`` seeds).

* :func:`sink_waits`: every wait moves to just before its first use; nothing else moves.
* :func:`raise_collectives`: every collective (alone, without its chain, as ``comms.py``
  does) moves to just after its inputs exist; waits stay where they were (so a collective
  that reads another's wait rises only to just after that wait).
* :func:`raise_and_sink`: both.

They ignore memory on purpose: they are the baselines the overlap scheduler is measured
against.
"""

from __future__ import annotations

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from .placement import Placement, assemble


def _frame(problem: ScheduleProblem) -> Placement:
    return Placement(problem, move_chains=False)


def sink_waits(problem: ScheduleProblem) -> Schedule:
    """Original order with each wait just before its first use."""
    pl = _frame(problem)
    issue, _ = pl.original_slots
    return assemble(pl, issue, {c: u.need for c, u in pl.units.items()}, priority=problem.index)


def raise_collectives(problem: ScheduleProblem) -> Schedule:
    """Original order with each collective issued as soon as its inputs exist."""
    pl = _frame(problem)
    _, wait = pl.original_slots
    issue = {c: u.earliest for c, u in pl.units.items()}
    for c in sorted(issue, key=problem.index.__getitem__):  # waits stay: a reader rises only to them
        for u in pl.readers[c]:
            issue[u] = max(issue[u], wait[c])
    return assemble(pl, issue, {c: max(wait[c], issue[c]) for c in issue}, priority=problem.index)


def raise_and_sink(problem: ScheduleProblem) -> Schedule:
    """Each collective as early as its inputs allow, each wait just before its first use."""
    pl = _frame(problem)
    return assemble(pl, {c: u.earliest for c, u in pl.units.items()},
                    {c: u.need for c, u in pl.units.items()}, priority=problem.index)
