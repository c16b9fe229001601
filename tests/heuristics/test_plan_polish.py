"""Plan polish (heuristics/plan_polish.py): its moves by hand, and the kick that leaves a basin
the descent alone cannot, on a made-up score whose optimum is known."""

from __future__ import annotations

import random

from fxsched.heuristics.plan_polish import _kick, _moves, polish

N = 12  # one list of 12 collectives


def cuts(plan) -> tuple[int, ...]:
    """The inner boundaries of a one-list plan."""
    return tuple(r[1] for r in plan[0][1:])


def of_cuts(*cs: int):
    bounds = (0, *cs, N)
    return (tuple((0, a, b) for a, b in zip(bounds, bounds[1:])),)


def two_basins(plan) -> float:
    """Three runs cut at (4, 8) score 0 (the optimum); four runs cut at (3, 6, 9) score 10 (a
    local optimum: no move keeps four runs and scores less); other three- and four-run plans score
    their distance from those; any other run count 1000."""
    c = cuts(plan)
    if len(c) == 2:
        return sum(abs(a - b) for a, b in zip(c, (4, 8)))
    if len(c) == 3:
        return 10 + sum(abs(a - b) for a, b in zip(c, (3, 6, 9)))
    return 1000


def test_moves_by_hand() -> None:
    """Two runs (0-5, 5-12): the boundary shifts by -4..4 (1..9 but 5), no joint shift (a run with
    a next and a next-but-one), no swap (one list): 8 moves."""
    moves = _moves(of_cuts(5))
    assert sorted(seq[0][2] for _, seq in moves) == [1, 2, 3, 4, 6, 7, 8, 9]
    three = _moves(of_cuts(4, 8))
    joint = [seq for _, seq in three if seq[0][2] != 4 and seq[1][2] != 8]
    # both boundaries of the middle run (4-8), each by -3..3 but 0: 36 pairs, less the 6 that leave it
    # empty (d1 - d2 >= 4)
    assert len(joint) == 30
    # two lists in one group: neighbouring runs of different lists swap
    plan = (((0, 0, 3), (1, 0, 2), (0, 3, 6)),)
    assert (0, [(1, 0, 2), (0, 0, 3), (0, 3, 6)]) in _moves(plan)


def test_the_descent_alone_is_stuck() -> None:
    """No descent move of (3, 6, 9) scores below its 10: the search needs the kick."""
    start = of_cuts(3, 6, 9)
    assert two_basins(start) == 10
    assert all(two_basins(((*seq,),)) >= 10 for _, seq in _moves(start))


def test_polish_leaves_the_basin() -> None:
    """From (3, 6, 9) the polish reaches the optimum (4, 8), within the plans it was given, and
    scores only plans of valid runs; the same seed scores the same plans."""
    def run(seed: int) -> list:
        scored: list = []

        def score(plan) -> float:
            assert all(r[2] - r[1] <= 7 for seq in plan for r in seq)
            scored.append(plan)
            return two_basins(plan)

        n = polish(lambda r: r[2] - r[1] <= 7, of_cuts(3, 6, 9), score, random.Random(seed), [1.0], max_evals=200)
        assert n <= 200 and len(set(scored)) == n
        return scored

    scored = run(0)
    assert min(two_basins(p) for p in scored) == 0
    assert run(0) == scored


def test_kick_changes_the_run_count_by_one() -> None:
    """A kick drops a boundary (and shifts one of the merged run's) or splits a run: the plan has
    one run fewer or one more, over the same collectives, and only valid runs."""
    rng = random.Random(3)
    start = of_cuts(3, 6, 9)
    for _ in range(50):
        kicked = _kick(lambda r: r[2] - r[1] <= 8, start, rng, [1.0])
        assert kicked is not None
        runs = kicked[0]
        assert len(runs) in (3, 5)
        assert runs[0][1] == 0 and runs[-1][2] == N
        assert all(a[2] == b[1] for a, b in zip(runs, runs[1:]))
        assert all(r[2] - r[1] <= 8 for r in runs)


def test_polish_ends_when_it_sees_nothing_new() -> None:
    """Five collectives in runs of at most 2 (8 plans: the compositions of 5 into 1s and 2s): with
    plans to spare, the polish stops once its kicks and descents find no plan it has not scored,
    having scored at most all of them."""
    start = (((0, 0, 2), (0, 2, 4), (0, 4, 5)),)
    n = polish(lambda r: r[2] - r[1] <= 2, start, lambda plan: float(len(plan[0])), random.Random(1), [1.0],
               max_evals=10**6)
    assert 1 <= n <= 8
