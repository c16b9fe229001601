"""Bucket splits (heuristics/split_buckets.py) and their place in ``solve``'s polish: hand-derived
timelines, a brute-force oracle over every order and bucketing, and validity / never-worse on
tiny problems."""

from __future__ import annotations

import pytest
from fxsched.heuristics.split_buckets import split_buckets, splits
from fxsched.solver import BucketCosts, Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig, _polished

from tests.solver.oracle import raw_orders, valid_bucketings
from tests.solver.solver_builders import AR, coll, compute, make_problem, wait
from tests.solver.tiny_instances import tiny_problems

# copies of empty buffers cost nothing; a bucket of 0-byte all-reduces runs 100 ns (the default
# curve, 100 + size), a lone one its own runtime
NO_COPY = BucketCosts(memory_bandwidth_gbps=2.0, launch_overhead_ns=0)


def _most_members_hidden(problem, max_makespan_ns: int) -> int:
    """Brute force: the most collectives hidden (bucket members counted) over every bucketing and
    order within the makespan cap."""
    best = -1
    for buckets in valid_bucketings(problem):
        for order in raw_orders(problem):
            sched = Schedule(order, buckets)
            if check_schedule(problem, sched):
                continue
            r = simulate(problem, sched)
            if r.makespan_ns <= max_makespan_ns:
                best = max(best, r.n_hidden_hideable_members)
    return best


def _early_and_late():
    """c1 and c2 (all-reduces on A, 110 ns alone, 100 ns as one bucket) need nothing; x (60 ns)
    needs neither; y (10 ns) needs w1, z (120 ns) needs y, q (10 ns) needs w2 and z.

    Bucketed, issued at 0: x 0..60, w1 stalls 40 (to 100), y, z 100..230, q 230..240: 240 ns,
    both members exposed; only x can run before w1, so every bucketed order stalls there.
    Alone: c1 0..110, c2 110..220 (FIFO); w1 stalls 50 (to 110), y, z 110..240, w2 finds c2
    done, q 240..250: 250 ns, c2 hidden; c1 needs 110 ns before w1 and has x's 60 alone."""
    p = make_problem([coll("c1", "A", AR, runtime_ns=110), coll("c2", "A", AR, runtime_ns=110),
                      compute("x", 60), wait("w1", "c1"), compute("y", 10, deps=["w1"]),
                      compute("z", 120, deps=["y"]), wait("w2", "c2"), compute("q", 10, deps=["w2", "z"])],
                     groups=("A",), costs=NO_COPY)
    return p, Schedule(tuple(op.name for op in p.ops), (("c1", "c2"),))


def test_a_split_that_costs_makespan_waits_for_a_cap_that_allows_it() -> None:
    p, bucketed = _early_and_late()
    r0 = simulate(p, bucketed)
    assert (r0.makespan_ns, r0.exposed_ns, r0.n_hidden_hideable_members, r0.n_hideable_members) == (240, 40, 0, 2)
    assert _most_members_hidden(p, 249) == 0 and _most_members_hidden(p, 250) == 1
    assert split_buckets(p, bucketed) is bucketed
    assert split_buckets(p, bucketed, max_makespan_ns=249) is bucketed
    out = split_buckets(p, bucketed, max_makespan_ns=250)
    assert not check_schedule(p, out) and out.buckets == ()
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable_members, r.peak_memory_bytes) == (250, 1, r0.peak_memory_bytes)


def _one_early_two_late():
    """c1 (needs nothing), c2 and c3 (need x, 100 ns): all-reduces on A, 100 ns alone or as a
    bucket; y (10 ns) needs w1, q (10 ns) needs y, w2 and w3.

    One bucket, issued after x at 100: w1 stalls 100 (to 200), y 200..210, q 210..220: 220 ns,
    none of the three hidden. Halved by position, c1 alone and (c2, c3): c1 0..100 under x, w1
    finds it done, y 100..110, the pair 100..200, w2 stalls 90, q 200..210: 210 ns, c1 hidden.
    Dissolved: c2 100..200 and c3 200..300 queue, q ends at 310. Within 220 ns one hidden is the
    most (the oracle); a second needs w3 waited first, so that w2 finds c2 done, past 300 ns."""
    p = make_problem([coll("c1", "A", AR, runtime_ns=100), compute("x", 100),
                      coll("c2", "A", AR, runtime_ns=100, deps=["x"]), coll("c3", "A", AR, runtime_ns=100, deps=["x"]),
                      wait("w1", "c1"), compute("y", 10, deps=["w1"]), wait("w2", "c2"), wait("w3", "c3"),
                      compute("q", 10, deps=["y", "w2", "w3"])], groups=("A",), costs=NO_COPY)
    return p, Schedule(tuple(op.name for op in p.ops), (("c1", "c2", "c3"),))


def test_a_bucket_is_halved_where_dissolving_it_would_queue() -> None:
    p, bucketed = _one_early_two_late()
    r0 = simulate(p, bucketed)
    assert (r0.makespan_ns, r0.n_hidden_hideable_members) == (220, 0)
    dissolved, halved, last_alone = list(splits(p, bucketed))
    assert dissolved.buckets == () and halved.buckets == (("c2", "c3"),) and last_alone.buckets == (("c1", "c2"),)
    # last alone: (c1, c2) issued at c2's place (100) runs 100..200, c3 queues 200..300; w1
    # stalls to 200, y 200..210, w3 stalls to 300, q 300..310, none hidden
    assert [simulate(p, s).makespan_ns for s in (dissolved, halved, last_alone)] == [310, 210, 310]
    assert simulate(p, last_alone).n_hidden_hideable_members == 0
    out = split_buckets(p, bucketed)
    assert out.buckets == (("c2", "c3"),)
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable_members) == (210, 1)
    assert _most_members_hidden(p, 220) == 1 and _most_members_hidden(p, 10**9) == 2


def _tail_of_three():
    """c1 needs a, c2 needs b, c3 needs d (a, b 100 ns; d 150 ns, the last compute): all-reduces
    on A, 150 ns alone and 100 ns as any bucket (no copies); their waits come at the end.

    One bucket, issued after d at 350: 350..450, its wait stalls 100, none hidden (450 ns).
    The last member alone: (c1, c2) issued after b at 200 runs 200..300, under d; c3 issued at
    350 runs 350..500. The bucket's wait (its first member's, at 350) finds it done; w3 stalls
    150: two hidden in 500 ns. Halved by position, c1 alone (100..250) and (c2, c3) issued at 350
    (350..450): only c1 hidden, 450 ns. Dissolved: c1 100..250, c2 250..400 and c3 400..550
    queue, w2 stalls at 350 as well: one hidden, 550 ns. c3 needs the last compute, so its wait
    stalls in every order: two is the most (the oracle), and it takes 500 ns."""
    p = make_problem([compute("a", 100), coll("c1", "A", AR, runtime_ns=150, deps=["a"]),
                      compute("b", 100), coll("c2", "A", AR, runtime_ns=150, deps=["b"]),
                      compute("d", 150), coll("c3", "A", AR, runtime_ns=150, deps=["d"]),
                      wait("w1", "c1"), wait("w2", "c2"), wait("w3", "c3")], groups=("A",), costs=NO_COPY)
    return p, Schedule(tuple(op.name for op in p.ops), (("c1", "c2", "c3"),))


def test_the_last_member_alone_hides_the_others_where_halves_and_singles_do_not() -> None:
    p, bucketed = _tail_of_three()
    r0 = simulate(p, bucketed)
    assert (r0.makespan_ns, r0.n_hidden_hideable_members) == (450, 0)
    dissolved, halved, last_alone = list(splits(p, bucketed))
    assert last_alone.buckets == (("c1", "c2"),)
    got = [simulate(p, s) for s in (dissolved, halved, last_alone)]
    assert [(r.makespan_ns, r.n_hidden_hideable_members) for r in got] == [(550, 1), (450, 1), (500, 2)]
    assert _most_members_hidden(p, 499) == 1 and _most_members_hidden(p, 500) == 2 == _most_members_hidden(p, 10**9)
    out = split_buckets(p, bucketed, max_makespan_ns=500)
    r = simulate(p, out)
    assert out.buckets == (("c1", "c2"),) and (r.makespan_ns, r.n_hidden_hideable_members) == (500, 2)
    assert simulate(p, split_buckets(p, bucketed, max_makespan_ns=499)).n_hidden_hideable_members == 1


def test_a_bucket_of_four_also_has_its_first_member_alone() -> None:
    """From four members on, the candidates are: dissolved, halved, the last alone, the first alone."""
    p = make_problem([coll(f"c{k}", "A", AR, runtime_ns=150) for k in range(4)]
                     + [wait(f"w{k}", f"c{k}") for k in range(4)], groups=("A",), costs=NO_COPY)
    bucketed = Schedule(tuple(op.name for op in p.ops), (("c0", "c1", "c2", "c3"),))
    assert [s.buckets for s in splits(p, bucketed)] == [(), (("c0", "c1"), ("c2", "c3")), (("c0", "c1", "c2"),),
                                                        (("c1", "c2", "c3"),)]


def test_the_polish_of_solve_splits_buckets_within_its_slack() -> None:
    """``solve``'s final polish (hide_collectives, then split_buckets) with ``hide_slack`` allowing
    10 ns over the bucketed 240 ns: the split of :func:`_early_and_late`; without a slack, none."""
    p, bucketed = _early_and_late()
    assert _polished(p, bucketed, SolveConfig(mode="free"), tries=8, deadline=None).buckets == (("c1", "c2"),)
    out = _polished(p, bucketed, SolveConfig(mode="free", hide_slack=10 / 240), tries=8, deadline=None)
    assert out.buckets == () and simulate(p, out).n_hidden_hideable_members == 1


@pytest.mark.parametrize("problem", tiny_problems(12, seed=5)[::2], ids=lambda p: p.name)
def test_splits_are_valid_and_the_pass_is_never_worse(problem) -> None:
    """Every bucketing of 2+ members of a tiny problem, in its first valid order: each split is a
    valid schedule, and the pass keeps the makespan cap and the peak and never hides fewer."""
    seen = 0
    for buckets in valid_bucketings(problem)[1:]:
        sched = next((s for s in (Schedule(o, buckets) for o in raw_orders(problem)) if not check_schedule(problem, s)), None)
        if sched is None:
            continue
        seen += 1
        for cand in splits(problem, sched):
            assert not check_schedule(problem, cand) and cand.order == sched.order
            # a split: another bucketing, each new bucket part of one of the old ones
            assert set(cand.buckets) != set(sched.buckets)
            assert all(any(set(b) <= set(old) for old in sched.buckets) for b in cand.buckets)
        r0 = simulate(problem, sched)
        cap = r0.makespan_ns + 50
        out = split_buckets(problem, sched, max_makespan_ns=cap)
        assert not check_schedule(problem, out)
        r = simulate(problem, out)
        assert r.makespan_ns <= cap and r.peak_memory_bytes <= r0.peak_memory_bytes
        assert r.n_hidden_hideable_members >= r0.n_hidden_hideable_members
    assert seen
