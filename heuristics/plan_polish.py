"""Plan polish: iterated local search over stream plans, after the annealing.

Entry point: :func:`polish`. The annealing (stream_plan.py) settles in one basin of the plan
space within about 3,000 plans and stays there: on the 4-node backward its 3,000-plan runs end
anywhere from 160.1 to 164.6 ms by seed, and 40 s runs do no better. The basins are walled by
the memory budget. The 160.53 ms plan the annealing reaches with seed 0 lies one boundary from the
160.11 ms one: dropping the boundary between its second and third gather buckets and moving the
next one back by one collective gives a 162.2 ms plan, from which boundary shifts alone descend
to 160.11 ms. That first step climbs 1.7 ms, which the annealing at its temperatures (0.5 ms
falling to 16 us) all but never takes.

So the polish alternates a **kick** and a **descent**, keeping a result only when it beats the
best so far (iterated local search):

- a kick drops one boundary of a list (two neighbouring runs merge) and shifts a boundary of the
  merged run by up to ``KICK_SHIFT`` collectives, or splits a run in two;
- a descent takes the first improving move (in random order) among: a boundary shifted by up to
  ``SHIFT`` collectives, the two boundaries of a run shifted at once by up to ``JOINT_SHIFT``
  each, and two neighbouring runs of different lists swapped; until none improves.

Measured on the 4-node backward (budget: the original order's peak):

- from the annealing's 3,000-plan results of seeds 0-5, 4,000 plans of polish each: 160.62 ->
  160.11 ms (after 1,610 plans), 161.01 -> 160.11 (1,439), 163.84 -> 160.48, 161.75 -> 161.46,
  162.24 -> 161.93, 162.05 unchanged;
- 60 s solves (``fxsched solve --time-limit 60 --workers 2 --processes 2 --mode free``), seeds
  0-3: 160.23, 160.11, 160.53 and 160.61 ms with half the search polishing (stream_plan's
  ``ANNEAL_SHARE``), 160.11, 160.18, 160.11 and 161.72 with 30%, and 160.53, 160.11, 161.04 and
  161.32 with the annealing alone.

Nothing here imports torch or ortools.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

Run = tuple[int, int, int]  # (list, lo, hi): the collectives lists[list][lo:hi], issued as one bucket
Plan = tuple[tuple[Run, ...], ...]  # per group (sorted by name): its runs in FIFO order

SHIFT = 4  # most collectives a descent's boundary shift carries across
JOINT_SHIFT = 3  # and each boundary of a run shifted at once
KICK_SHIFT = 4  # most collectives a kick's shift carries across
KICK_SPLIT = 1 / 3  # share of kicks that split a run (the rest drop a boundary)
KICK_TRIES = 100  # random draws a kick may take to find one that applies
STALE_ROUNDS = 100  # kicks in a row whose descents score no plan not seen before end the polish


def next_of_list(seq: Sequence[Run], i: int) -> int | None:
    """The index of the next run after ``i`` of the same list, or None."""
    return next((k for k in range(i + 1, len(seq)) if seq[k][0] == seq[i][0]), None)


def _prev_of_list(seq: Sequence[Run], i: int) -> int | None:
    """The index of the last run before ``i`` of the same list, or None."""
    return next((k for k in range(i - 1, -1, -1) if seq[k][0] == seq[i][0]), None)


def _with(plan: Plan, g: int, seq: list[Run]) -> Plan:
    return (*plan[:g], tuple(seq), *plan[g + 1:])


def _moves(plan: Plan) -> list[tuple[int, list[Run]]]:
    """Every descent move of ``plan`` (module doc), as (group, its new runs)."""
    out: list[tuple[int, list[Run]]] = []
    for g, runs in enumerate(plan):
        seq = list(runs)
        for i, (li, lo, hi) in enumerate(seq):
            j = next_of_list(seq, i)
            if j is None:
                continue
            hj = seq[j][2]
            for d in range(-SHIFT, SHIFT + 1):
                if d and lo < hi + d < hj:
                    new = list(seq)
                    new[i], new[j] = (li, lo, hi + d), (li, hi + d, hj)
                    out.append((g, new))
            k = next_of_list(seq, j)
            if k is None:
                continue
            hk = seq[k][2]
            for d1 in range(-JOINT_SHIFT, JOINT_SHIFT + 1):
                for d2 in range(-JOINT_SHIFT, JOINT_SHIFT + 1):
                    if d1 and d2 and lo < hi + d1 < hj + d2 < hk:
                        new = list(seq)
                        new[i], new[j], new[k] = (li, lo, hi + d1), (li, hi + d1, hj + d2), (li, hj + d2, hk)
                        out.append((g, new))
        for i in range(len(seq) - 1):
            if seq[i][0] != seq[i + 1][0]:
                new = list(seq)
                new[i], new[i + 1] = new[i + 1], new[i]
                out.append((g, new))
    return out


def _kick(valid: Callable[[Run], bool], plan: Plan, rng: random.Random, weights: Sequence[float]) -> Plan | None:
    """One random kick of ``plan`` (module doc) on a group drawn in proportion to ``weights``, or
    None when none of ``KICK_TRIES`` draws applies."""
    for _ in range(KICK_TRIES):
        g = rng.choices(range(len(plan)), weights)[0]
        seq = list(plan[g])
        if not seq:
            continue
        i = rng.randrange(len(seq))
        li, lo, hi = seq[i]
        if rng.random() < KICK_SPLIT:
            if hi - lo < 4:
                continue
            c = rng.randrange(lo + 2, hi - 1)
            seq[i:i + 1] = [(li, lo, c), (li, c, hi)]
        else:
            j = next_of_list(seq, i)
            if j is None:
                continue
            hj = seq[j][2]
            keep, drop = (i, j) if rng.random() < 0.5 else (j, i)
            seq[keep] = (li, lo, hj)
            del seq[drop]
            m = keep if keep < drop else keep - 1  # the merged run's index
            after = next_of_list(seq, m)
            before = _prev_of_list(seq, m)
            sides = [(m, after)] * (after is not None) + [(before, m)] * (before is not None)
            if not sides:
                continue
            a, b = rng.choice(sides)
            assert a is not None and b is not None
            c = seq[a][2] + rng.choice([d for d in range(-KICK_SHIFT, KICK_SHIFT + 1) if d])
            if not seq[a][1] < c < seq[b][2]:
                continue
            seq[a], seq[b] = (li, seq[a][1], c), (li, c, seq[b][2])
        if all(valid(r) for r in seq):
            return _with(plan, g, seq)
    return None


def polish(
    valid: Callable[[Run], bool],
    plan: Plan,
    score: Callable[[Plan], float],
    rng: random.Random,
    weights: Sequence[float],
    *,
    max_evals: int | None = None,
    deadline: float | None = None,
) -> int:
    """Iterated local search (module doc) from ``plan`` over plans whose runs are all ``valid``,
    scoring with ``score`` (the annealing's priced score, cached: a descent scores many plans
    again), until it has scored ``max_evals`` distinct plans or a ``time.perf_counter()``
    ``deadline`` passes; the caller's ``score`` keeps the best schedule it sees. Returns the number
    of distinct plans scored."""
    if max_evals is None and deadline is None:
        raise ValueError("polish: give max_evals or a deadline")
    seen: set[Plan] = set()

    def spent() -> bool:
        return (max_evals is not None and len(seen) >= max_evals) or (
            deadline is not None and time.perf_counter() >= deadline)

    def value(p: Plan) -> float:
        seen.add(p)
        return score(p)

    def descend(p: Plan, cur: float) -> tuple[Plan, float]:
        while not spent():
            moves = _moves(p)
            rng.shuffle(moves)
            for g, seq in moves:
                if spent():
                    break
                if not all(valid(r) for r in seq):
                    continue
                cand = _with(p, g, seq)
                v = value(cand)
                if v < cur:
                    p, cur = cand, v
                    break
            else:
                break
        return p, cur

    best, best_v = descend(plan, value(plan))
    stale = 0  # rounds in a row that scored no new plan: a small plan space all seen
    while not spent() and stale < STALE_ROUNDS:
        kicked = _kick(valid, best, rng, weights)
        if kicked is None:
            break
        before = len(seen)
        p, v = descend(kicked, value(kicked))
        if v < best_v:
            best, best_v = p, v
        stale = 0 if len(seen) > before else stale + 1
    return len(seen)
