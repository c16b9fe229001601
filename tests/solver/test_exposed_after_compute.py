"""A collective exposed after all compute in every schedule (``bounds.exposed_after_compute``).

Hand-made: two reduce-scatters that all compute feeds (it holds, and every order bears it out);
the same with compute that feeds nothing (it does not hold, and an order with no stall at all
shows why); a gather whose output no compute reads (a bucket's copy-out after its wait can then
hide the last unit: an order with no stall shows it). Then the claim against every schedule of
small random problems: every bucketing, every canonical order of the brute-force oracle's
enumeration (oracle.py).
"""

from __future__ import annotations

import dataclasses
import random

from fxsched.solver import CollectiveKind, OpKind, Schedule, ScheduleProblem, simulate
from fxsched.solver.bounds import exposed_after_compute

from tests.solver.oracle import count_orders, enumerate_schedules, raw_orders, valid_bucketings
from tests.solver.random_dags import random_problem
from tests.solver.solver_builders import AG, RS, coll, compute, make_problem, wait


def _stalls_after_compute(p: ScheduleProblem, s: Schedule) -> bool:
    """Whether some unit of ``s`` is exposed with its wait after the last op with compute time."""
    res = simulate(p, s, check=False)
    pos = {name: i for i, name in enumerate(s.order)}
    last = max((pos[op.name] for op in p.ops if op.kind in (OpKind.COMPUTE, OpKind.ZERO) and op.runtime_ns > 0),
               default=-1)
    return any(c.exposed_ns > 0 and c.wait_pos > last for c in res.collectives)


def _two_reduce_scatters(free_ns: int = 0) -> ScheduleProblem:
    """a (100) feeds c1 (300 ns); a and x (500) feed b (100), which feeds c2 (300 ns). With
    ``free_ns``, z (that long) feeds nothing."""
    ops = [compute("a", 100), coll("c1", kind=RS, runtime_ns=300, deps=["a"]), wait("w1", "c1"),
           compute("x", 500), compute("b", 100, deps=["a", "x"]),
           coll("c2", kind=RS, runtime_ns=300, deps=["b"]), wait("w2", "c2")]
    if free_ns:
        ops.append(compute("z", free_ns))
    return make_problem(ops)


def test_all_compute_feeding_reduce_scatters_leaves_one_exposed_after_it_in_every_order() -> None:
    """Every op feeds c1 or c2, so the last issue follows all compute and its unit, or a wait
    before it, stalls after it. Checked in every order: a before the chains c1 < w1 and
    b < c2 < w2 (10 interleavings; b comes second, third or fourth in 6, 3 and 1 of them) and x
    anywhere before b (2, 3 or 4 places): 6 * 2 + 3 * 3 + 1 * 4 = 25 orders; and bucketed, in every
    canonical one."""
    p = _two_reduce_scatters()
    assert exposed_after_compute(p)
    orders = list(raw_orders(p))
    assert len(orders) == 25
    assert all(_stalls_after_compute(p, Schedule(o)) for o in orders)
    schedules = [s for b in valid_bucketings(p) for s in enumerate_schedules(p, b)]
    assert all(_stalls_after_compute(p, s) for s in schedules)


def test_compute_that_feeds_no_collective_can_hide_the_last_one() -> None:
    """z (1000 ns) feeds nothing: in a, c1, x, b, c2, z, w1, w2 the collectives run 100..400 and
    700..1000 beside x (100..600) and z (700..1700): no wait stalls at all."""
    p = _two_reduce_scatters(free_ns=1000)
    assert not exposed_after_compute(p)
    res = simulate(p, Schedule(("a", "c1", "x", "b", "c2", "z", "w1", "w2")))
    assert res.exposed_ns == 0 and res.makespan_ns == 1700


def test_a_gathers_copy_out_after_the_last_issue_can_hide_it() -> None:
    """g1 and g2 (gathers of 10 B in, 20 B out, whose outputs no compute reads) and c (a
    reduce-scatter of 50 ns fed by a (100) and y (100)). Bucketed, g1 and g2 issue at once after a
    copy-in of 100 + 20 ns (launch, then 20 B read and written at 2 GB/s), and run 120..280 (the
    curve at 60 B: 160 ns) beside a (120..220) and y (220..320). c issues at 320, after all
    compute, and runs 320..370. The bucket's wait at 320 finds it done and copies 40 B out
    (100 + 40 ns, to 460), so c's wait finds c done too: nothing stalls, though the last issue
    follows all compute. The condition on gathers rules this out."""
    p = make_problem([coll("g1", kind=AG, runtime_ns=130, bytes_in=10, bytes_out=20), wait("v1", "g1"),
                      coll("g2", kind=AG, runtime_ns=130, bytes_in=10, bytes_out=20), wait("v2", "g2"),
                      compute("a", 100), compute("y", 100),
                      coll("c", kind=RS, runtime_ns=50, bytes_in=20, bytes_out=10, deps=["a", "y"]), wait("w", "c")])
    assert not exposed_after_compute(p)
    res = simulate(p, Schedule(("g1", "g2", "a", "y", "c", "v1", "v2", "w"), (("g1", "g2"),)))
    assert res.exposed_ns == 0 and res.makespan_ns == 460


def _fed(p: ScheduleProblem, rng: random.Random) -> ScheduleProblem | None:
    """``p`` with one more reduce-scatter (and its wait) fed by every op with compute time that
    feeds no collective yet, so that all compute feeds one; None when a group has no
    reduce-scatter curve."""
    fed = 0
    for c in p.collectives:
        fed |= p.ancestors[p.index[c.name]]
    loose = [op.name for i, op in enumerate(p.ops) if op.runtime_ns > 0 and op.kind in (OpKind.COMPUTE, OpKind.ZERO)
             and not fed >> i & 1]
    group = rng.choice([g.name for g in p.groups])
    if (group, CollectiveKind.REDUCE_SCATTER) not in p.curve_by_key:
        return None
    ops = [*p.ops, coll("sink", group, RS, runtime_ns=rng.randint(1, 5000), bytes_in=64, bytes_out=32, deps=loose),
           wait("sink_w", "sink")]
    return dataclasses.replace(p, ops=tuple(ops))


def test_every_schedule_of_small_random_problems_bears_it_out() -> None:
    """Seeded random problems, each given a reduce-scatter that the compute feeding nothing feeds:
    where the conditions hold and there are two collectives or more, every canonical schedule of
    every bucketing (at most 3000 in all) has a unit exposed after all compute. The run must cover
    enough problems and schedules to mean something."""
    problems = schedules = 0
    for seed in range(300):
        rng = random.Random(seed)
        p = _fed(random_problem(rng, max_ops=9, max_groups=2, kinds=(AG, RS), dtypes=("bf16",),
                                reduce_ops=("sum",), max_inputs=2, name=f"fed_{seed}"), rng)
        if p is None or len(p.collectives) < 2 or not exposed_after_compute(p):
            continue
        buckets = valid_bucketings(p)
        if sum(count_orders(p, b) for b in buckets) > 3000:
            continue
        problems += 1
        for b in buckets:
            for s in enumerate_schedules(p, b):
                schedules += 1
                assert _stalls_after_compute(p, s), (p.name, s)
    assert problems >= 40 and schedules >= 10_000
