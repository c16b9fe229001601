"""Lower bounds (solver/bounds.py): hand-derived values, and never above the brute-force optimum.

The oracle runs without a memory budget, so it is the best makespan over every schedule in any
compute order and any bucketing: a valid bound must never exceed it.
"""

from __future__ import annotations

import pytest
from fxsched.solver.bounds import exposed_lower_bound, makespan_lower_bound
from oracle import brute_force
from solver_builders import AR, coll, compute, make_problem, wait
from tiny_instances import tiny_problems

NO_BUDGET = 10**15
PROBLEMS = tiny_problems(20, seed=5)


def test_dependency_chain_bound_is_the_only_schedule() -> None:
    """a (100 ns) -> collective (size 400: 100 + 400 = 500 ns) -> wait -> b (50 ns): the one schedule
    takes 100 + 500 + 50 = 650 ns, and the bound proves it."""
    p = make_problem([
        compute("a", 100, heavy=True),
        coll("c", runtime_ns=500, bytes_in=200, bytes_out=200, deps=["a"]),
        wait("w", "c"),
        compute("b", 50, deps=["w"]),
    ])
    b = makespan_lower_bound(p)
    assert b.makespan_ns == 650
    assert b.exposed_ns == 500
    assert brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns == 650


def test_bucketed_bound_prices_one_bucket_of_everything() -> None:
    """Two independent gathers of 400 bytes (500 ns each alone) and x (10 ns) after both waits.
    Any bucketing of 800 bytes on curve 100 + bytes costs at least 900 ns (one bucket; the curve
    is concave, so splitting only adds latency), and x runs after: the FIFO term proves 910.

    The stream term (time reversed: x needs both, so both are "released" after x's 10 ns) knows
    that a bucket of more than 400 bytes holds both gathers and copies its 400 output bytes out
    (100 + 400 ns) before x. Backwards from the end, a first bucket of s <= 400 bytes (it may be
    one gather: no copy) runs from 10 to 110 + s; the rest starts at max(110 + s, 10 + 100 + 400
    - s/2) and takes 100 + 800 - s: least for s >= 266.7, at 1010 (one bucket: 1410), less a grid
    cell or two (under 5 ns). The true optimum is 1010 (unbucketed: 500 + 500 + 10)."""
    p = make_problem([
        coll("c1", runtime_ns=500, bytes_in=200, bytes_out=200),
        coll("c2", runtime_ns=500, bytes_in=200, bytes_out=200),
        wait("w1", "c1"),
        wait("w2", "c2"),
        compute("x", 10, deps=["w1", "w2"], heavy=True),
    ])
    assert 1_005 <= makespan_lower_bound(p).makespan_ns <= 1_010
    assert exposed_lower_bound(p).exposed_ns == 1000  # unbucketed FIFO bound: 500 + 500
    assert brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns == 1010


def test_chain_bound_follows_dependent_collectives() -> None:
    """a (100) -> c1 (500) -> b (50) -> c2 (300) -> d (20), x (200) independent. Along the chain
    nothing overlaps but x: 100 + 500 + 50 + 300 + 20 = 970 ns, which the schedule a, c1, x, w1,
    b, c2, w2, d reaches (x hides under c1). Each collective alone proves only
    100 + 500 + 70 = 670, their group's FIFO 100 + (100 + 600) + 20 = 820."""
    p = make_problem([
        compute("a", 100, heavy=True),
        coll("c1", runtime_ns=500, bytes_in=200, bytes_out=200, deps=["a"]),
        wait("w1", "c1"),
        compute("b", 50, deps=["w1"]),
        coll("c2", runtime_ns=300, bytes_in=100, bytes_out=100, deps=["b"]),
        wait("w2", "c2"),
        compute("d", 20, deps=["w2"]),
        compute("x", 200, heavy=True),
    ])
    b = makespan_lower_bound(p)
    assert b.makespan_ns == 970 and b.limiting.startswith("chain")
    assert brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns == 970


@pytest.mark.parametrize("idx", range(len(PROBLEMS)))
def test_bound_never_exceeds_the_optimum(idx: int) -> None:
    p = PROBLEMS[idx]
    opt = brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns
    b = makespan_lower_bound(p)
    assert b.compute_ns <= b.makespan_ns <= opt
    unbucketed = brute_force(p, bucketing=False, budget_bytes=NO_BUDGET).best_makespan_ns
    assert b.compute_ns + exposed_lower_bound(p).exposed_ns <= unbucketed


def test_bound_is_tight_somewhere() -> None:
    """Not a vacuous bound: on some tiny problems it proves more than the total compute."""
    assert sum(makespan_lower_bound(p).exposed_ns > 0 for p in PROBLEMS) >= 5


def _last_reduction(z_feeds_e: bool):
    """x (1000) -> y (100) -> all_reduce c (size 200: 300 ns); z (50) independent, feeding the
    all_reduce e (size 100: 200 ns) of the same group when ``z_feeds_e``."""
    ops = [
        compute("x", 1000, heavy=True),
        compute("y", 100, deps=["x"]),
        coll("c", kind=AR, runtime_ns=300, bytes_in=100, bytes_out=100, deps=["y"]),
        wait("wc", "c"),
        compute("z", 50, heavy=True),
    ]
    if z_feeds_e:
        ops += [coll("e", kind=AR, runtime_ns=200, bytes_in=50, bytes_out=50, deps=["z"]), wait("we", "e")]
    return make_problem(ops)


def test_deferral_bound_charges_compute_that_feeds_the_same_group() -> None:
    """x (1000) -> y (100) -> c (size 200: 300 ns) and, independent, z (50) -> e (size 100: 200 ns),
    both all_reduces of group A. z can run before c is issued (so c starts at 1150 and ends at
    1450) or after it (then e queues behind c: 1100 + 300 + at least 100 ns, its per-byte price,
    which is more than z's 50 ns of compute could hide). Either way makespan >= 1450, which
    z, x, y, c, e is. Dependency alone proves 1100 + 300 = 1400; the FIFO pair proves
    50 + 400 = 450."""
    p = _last_reduction(z_feeds_e=True)
    b = makespan_lower_bound(p)
    assert b.makespan_ns == 1450 and b.limiting == "compute deferred past c"
    assert brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns == 1450


def test_deferral_bound_lets_compute_without_collectives_hide_the_last_one() -> None:
    """As above, but z feeds nothing: it can always run under c, so the bound drops to
    x, y, c: 1100 + 300 = 1400, and z, x, y, c, e is no longer forced: x, y, c, z reaches 1400."""
    p = _last_reduction(z_feeds_e=False)
    assert makespan_lower_bound(p).makespan_ns == 1400
    assert brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns == 1400


def _ddp_tail(seed: int):
    """A random DDP-like tail: a chain x0 -> ... -> c (the last gradient's all_reduce) and
    independent compute feeding other all_reduces of the same group, sometimes shared by two of
    them or feeding none, so that the deferral bound is the one that binds."""
    import random
    rng = random.Random(seed)
    ops = []
    prev: list[str] = []
    for i in range(rng.randint(1, 3)):
        ops.append(compute(f"x{i}", rng.randint(50, 800), deps=prev, heavy=True))
        prev = [f"x{i}"]
    size = rng.randint(50, 400)
    ops += [coll("c", kind=AR, runtime_ns=100 + 2 * size, bytes_in=size, bytes_out=size, deps=prev), wait("wc", "c")]
    shared = rng.random() < 0.5
    if shared:
        ops.append(compute("s", rng.randint(10, 200), heavy=True))
    for j in range(rng.randint(1, 3)):
        deps = ["s"] if shared and j < 2 else []
        ops.append(compute(f"z{j}", rng.randint(10, 300), deps=deps, heavy=True))
        if rng.random() < 0.8:
            size = rng.randint(10, 200)
            ops += [coll(f"e{j}", kind=AR, runtime_ns=100 + 2 * size, bytes_in=size, bytes_out=size, deps=[f"z{j}"]),
                    wait(f"we{j}", f"e{j}")]
    return make_problem(ops)


DDP_TAILS = [p for p in map(_ddp_tail, range(60)) if len(p.ops) <= 12][:30]  # brute force stays ~1 s each


@pytest.mark.parametrize("idx", range(len(DDP_TAILS)))
def test_deferral_bound_never_exceeds_the_optimum(idx: int) -> None:
    p = DDP_TAILS[idx]
    assert makespan_lower_bound(p).makespan_ns <= brute_force(p, budget_bytes=NO_BUDGET).best_makespan_ns


def test_deferral_bound_binds_on_ddp_tails() -> None:
    """Not vacuous: on these problems it is often the bound that binds."""
    assert sum(makespan_lower_bound(p).limiting.startswith("compute deferred") for p in DDP_TAILS) >= 8
