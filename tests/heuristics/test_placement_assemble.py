"""``assemble`` (heuristics/placement.py) against the per-edge form it replaced
(reference_assemble.py), on random problems, slots, buckets, priorities and issue-after hints:
the same schedule, or the same error."""

from __future__ import annotations

import random

import pytest
from fxsched.heuristics.placement import Placement, assemble
from fxsched.solver import CollectiveKind

from tests.heuristics.reference_assemble import reference_assemble
from tests.solver.random_dags import random_bucketing, random_problem, random_topological_order


def _outcome(fn, *args, **kwargs):  # noqa: ANN001, ANN202
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        return ("error", str(e))


def _cases(seed: int):  # noqa: ANN202
    """Random (placement, issue, wait, buckets, priority, issue_after) inputs from one seed."""
    rng = random.Random(seed)
    p = random_problem(rng, max_ops=40, kinds=(CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER),
                       reduce_ops=("sum",), max_groups=2)
    pl = Placement(p)
    buckets = random_bucketing(p, random_topological_order(p, rng, late_waits=True), rng)
    for _ in range(8):
        issue, wait = {}, {}
        for c, u in pl.units.items():
            issue[c] = rng.randint(u.earliest, u.need)
            wait[c] = rng.randint(issue[c], u.need)
        if rng.random() < 0.5:  # bucket members share an issue slot and a wait slot, or try to
            for b in buckets:
                s = max(issue[m] for m in b)
                w = max(s, min(wait[m] for m in b))
                for m in b:
                    issue[m], wait[m] = s, w
        prio = {c: rng.randint(0, 3) for c in pl.units} if rng.random() < 0.5 else None
        after = None
        if rng.random() < 0.3:  # issue-after hints: some waits before some collectives' blocks
            waits = [p.wait_of[c] for c in pl.units]
            after = {c: rng.sample(waits, min(2, len(waits))) for c in pl.units if rng.random() < 0.3}
        yield pl, issue, wait, buckets, prio, after


@pytest.mark.parametrize("seed", range(60))
def test_assemble_matches_the_per_edge_form(seed: int) -> None:
    for pl, issue, wait, buckets, prio, after in _cases(seed):
        got = _outcome(assemble, pl, issue, wait, buckets, priority=prio, issue_after=after)
        want = _outcome(reference_assemble, pl, issue, wait, buckets, priority=prio, issue_after=after)
        assert got == want


def test_the_random_cases_reach_shared_slots() -> None:
    """The comparison above is not vacuous: many cases assemble, and in many of those a slot holds
    two or more items with a bucket among them (where the grouped edges differ from the per-edge
    form's)."""
    assembled = shared = 0
    for seed in range(60):
        for pl, issue, wait, buckets, prio, after in _cases(seed):
            if isinstance(_outcome(assemble, pl, issue, wait, buckets, priority=prio, issue_after=after), tuple):
                continue
            assembled += 1
            slots = [issue[m] for b in buckets for m in b] + [wait[m] for b in buckets for m in b]
            shared += any(slots.count(s) > 1 for s in slots)
    assert assembled >= 200 and shared >= 50, (assembled, shared)


def test_the_random_cases_take_both_slot_paths(monkeypatch) -> None:  # noqa: ANN001
    """The comparison above covers both ways a shared slot is ordered: by key alone where nothing
    there must follow anything else (``_unconstrained``), and by the grouped edges otherwise."""
    from fxsched.heuristics import placement

    seen = {True: 0, False: 0}
    plain = placement._unconstrained

    def counted(*args):  # noqa: ANN002, ANN202
        out = plain(*args)
        seen[out] += 1
        return out

    monkeypatch.setattr(placement, "_unconstrained", counted)
    for seed in range(60):
        for pl, issue, wait, buckets, prio, after in _cases(seed):
            _outcome(assemble, pl, issue, wait, buckets, priority=prio, issue_after=after)
    assert seen[True] >= 100 and seen[False] >= 100, seen
