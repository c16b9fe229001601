"""The brute-force oracle (oracle.py) on hand-derived optima, against raw enumeration, and the
pinned optima file it produced.

Hand problems use solver_builders: bucket copies cost ``copy_ns(b) = 100 + b`` ns; a lone
collective runs for its own ``runtime_ns``; a bucket is priced on the comm curve at its summed
size (input + output bytes). Expected numbers follow DESIGN.md's execution model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from fxsched.solver import Schedule, ScheduleProblem, check_schedule, simulate
from fxsched.solver.serialization import problem_from_dict
from oracle import (
    brute_force,
    canonical_assumptions_hold,
    count_orders,
    count_raw_orders,
    default_budget,
    enumerate_schedules,
    raw_orders,
    search,
    valid_bucketings,
)
from solver_builders import (
    AG,
    RS,
    coll,
    compute,
    curves_for,
    make_problem,
    storage,
    wait,
)
from tiny_instances import tiny_problems

PINNED = Path(__file__).parent / "data" / "pinned_optima.json"
TEST_SEED = 0


@functools.cache
def problems20() -> tuple[ScheduleProblem, ...]:
    return tuple(tiny_problems(20, seed=TEST_SEED))


# ---- hand-derived optima ----

def test_independent_compute_hides_the_collective() -> None:
    """c (6 us) feeds b (2 us) through w; a (10 us) is independent. Items a | c < w < b: a goes
    in one of 4 places. Issuing c first (c, a, w, b): c runs 0-6000 under a (0-10000), w does
    not stall, b ends at 12000. a, c, w, b stalls 6000 at w: 18000, as do the other two."""
    p = make_problem([
        compute("a", 10_000), coll("c", runtime_ns=6_000), wait("w", "c"), compute("b", 2_000, deps=["w"]),
    ])
    r = brute_force(p)
    assert (r.best_makespan_ns, r.n_schedules, r.n_feasible) == (12_000, 4, 4)
    assert r.witness is not None and r.witness.order == ("c", "a", "w", "b")
    assert simulate(p).makespan_ns == 18_000


def fifo_problem(group2: str) -> ScheduleProblem:
    """c1 (6 us, A) -> w1 -> b1 (1 us); c2 (6 us, group2) -> w2 -> b2 (1 us); a (10 us) alone.
    c1 is an all_gather and c2 a reduce_scatter: never one bucket."""
    return make_problem([
        compute("a", 10_000),
        coll("c1", "A", AG, runtime_ns=6_000), wait("w1", "c1"), compute("b1", 1_000, deps=["w1"]),
        coll("c2", group2, RS, runtime_ns=6_000), wait("w2", "c2"), compute("b2", 1_000, deps=["w2"]),
    ])


def test_two_collectives_on_one_group_serialize() -> None:
    """Same group: FIFO, so the later of c1, c2 ends at >= 12000 and its consumer (1 us) ends
    at >= 13000; c1, c2, a, w1, b1, w2, b2 reaches it (w2 stalls 12000 - 11000 = 1000).
    Different groups run together: both end at 6000 under a, nothing stalls: 12000 = all compute."""
    same = brute_force(fifo_problem("A"))
    assert same.best_makespan_ns == 13_000
    assert valid_bucketings(fifo_problem("A")) == [()]
    assert brute_force(fifo_problem("B")).best_makespan_ns == 12_000


def latency_bucket_problem() -> ScheduleProblem:
    """Curve 5000 + size/10 ns on group A. c1, c2: reduce_scatters of 200 -> 100 bytes (size 300,
    5030 ns alone); b (1 us) reads both. No storages: every peak is 0."""
    p = make_problem([
        coll("c1", "A", RS, runtime_ns=5_030, bytes_in=200, bytes_out=100), wait("w1", "c1"),
        coll("c2", "A", RS, runtime_ns=5_030, bytes_in=200, bytes_out=100), wait("w2", "c2"),
        compute("b", 1_000, deps=["w1", "w2"]),
    ], groups=("A",))
    return dataclasses.replace(p, comm_curves=curves_for(("A",), ((0, 5_000), (1_000, 5_100))))


def test_latency_bound_bucket_beats_separate_collectives() -> None:
    """Separate: FIFO 0-5030, 5030-10060, b after: 11060 (6 orders: c1 < w1, c2 < w2 interleaved).
    Bucket: copy-in 100 + 400 = 500, one collective of size 600 = 5060 ns (500-5560), b: 6560
    (1 canonical order). Reduce_scatter outputs are views: no copy-out, but the flat input
    buffer (200 + 200 = 400 B) is live from issue to wait: peak 400 > the default budget of 0."""
    p = latency_bucket_problem()
    assert p.bucket_runtime_ns(("c1", "c2")) == 5_060
    assert valid_bucketings(p) == [(), (("c1", "c2"),)]
    alone = brute_force(p, bucketing=False, budget_bytes=400)
    assert (alone.best_makespan_ns, alone.n_schedules) == (11_060, 6)
    best = brute_force(p, budget_bytes=400)
    assert (best.best_makespan_ns, best.best_peak_bytes, best.n_schedules) == (6_560, 400, 7)
    assert best.witness is not None and best.witness.buckets == (("c1", "c2"),)
    assert brute_force(p, budget_bytes=400, cap_bytes=399).best_makespan_ns == 11_060  # 200 + 200 > cap
    default = brute_force(p)
    assert (default.best_makespan_ns, default.n_feasible) == (11_060, 6)


def budget_problem() -> ScheduleProblem:
    """a (10 us) reads input t (2000 B, freed after a) and writes x (1000 B); c (6 us) gathers
    param p (100 B) into g (1000 B); b (1 us) reads x and g. Original order a, c, w, b."""
    return make_problem([
        compute("a", 10_000, uses=["t"], allocates=["x"]),
        coll("c", runtime_ns=6_000, uses=["p"], allocates=["g"], bytes_in=100, bytes_out=1_000),
        wait("w", "c", uses=["g"]),
        compute("b", 1_000, deps=["a", "w"], uses=["x", "g"]),
    ], [storage("p", 100, param=True), storage("t", 2_000, inp=True), storage("x", 1_000), storage("g", 1_000)])


def test_memory_budget_forbids_the_prefetch() -> None:
    """Initial 2100 (p + t). a, c, w, b: 3100 at a (t is freed after it), 2100 after: peak 3100,
    makespan 10000 + 6000 exposed + 1000 = 17000. Any order with c before a holds t, g and x at
    a: 4100. c, a, w, b would take 11000 (c hidden under a), c, w, a, b 17000. The default
    budget (3100, the original peak) allows only a, c, w, b."""
    p = budget_problem()
    assert default_budget(p) == 3_100
    r = brute_force(p)
    assert (r.best_makespan_ns, r.best_peak_bytes, r.n_schedules, r.n_feasible) == (17_000, 3_100, 3, 1)
    loose = brute_force(p, budget_bytes=4_100)
    assert (loose.best_makespan_ns, loose.best_peak_bytes, loose.n_feasible) == (11_000, 4_100, 3)
    assert brute_force(p, budget_bytes=3_099).best_makespan_ns is None


# ---- bucketings ----

def test_valid_bucketings_follow_key_dependency_and_cap_rules() -> None:
    """c3 reads c1's result: c1 and c3 never share a bucket. c2 is f32 unless multi-dtype.
    Each member counts max(bytes_in, bytes_out) = 20 bytes against the cap."""
    def prob(dtype2: str) -> ScheduleProblem:
        return make_problem([
            coll("c1", bytes_in=10, bytes_out=20, allocates=["o1"]), wait("w1", "c1", uses=["o1"]),
            coll("c2", bytes_in=10, bytes_out=20, dtype=dtype2), wait("w2", "c2"),
            coll("c3", bytes_in=10, bytes_out=20, deps=["w1"], uses=["o1"]), wait("w3", "c3"),
            coll("c4", "B", bytes_in=10, bytes_out=20), wait("w4", "c4"),
        ], [storage("o1", 20)])
    same = prob("bf16")
    assert sorted(valid_bucketings(same)) == [(), (("c1", "c2"),), (("c2", "c3"),)]
    assert valid_bucketings(same, cap_bytes=39) == [()]
    assert valid_bucketings(prob("f32")) == [()]
    assert sorted(valid_bucketings(prob("f32"), multi_dtype=True)) == [(), (("c1", "c2"),), (("c2", "c3"),)]


def test_fixed_mode_drops_buckets_the_frame_cannot_place() -> None:
    """Original order c2, w2, A, c1... : backbone A, B (heavy, kept in this order). A reads c2's
    wait (need slot 0); c1 reads B (earliest slot 2). c1 and c2 are data-independent, so free
    mode buckets them (B, c1, c2, w1, w2, A); the frame cannot (2 > 0).

    Optima: free c2, B, c1, w2, A, w1: c2 (0-50) and c1 (100-150) both hide under compute,
    makespan 200 = all compute. Fixed keeps A before B, so w2 stalls 50 before A and c1 (issued
    after B, at 250) stalls 50 at the end: 300. (Buckets cost a 100 ns copy-in and 100 ns.)"""
    p = make_problem([
        coll("c2", runtime_ns=50), wait("w2", "c2"), compute("A", 100, deps=["w2"], heavy=True),
        compute("B", 100, heavy=True), coll("c1", deps=["B"], runtime_ns=50), wait("w1", "c1"),
    ])
    assert valid_bucketings(p) == [(), (("c2", "c1"),)]
    assert valid_bucketings(p, mode="fixed") == [()]
    fixed = brute_force(p, mode="fixed")
    assert fixed.n_schedules == count_orders(p, (), "fixed")
    assert (brute_force(p).best_makespan_ns, fixed.best_makespan_ns) == (200, 300)


# ---- enumeration ----

def test_count_orders_matches_enumeration() -> None:
    """The subset DP counts exactly what the DFS yields, in both modes, for every bucketing."""
    for p in problems20()[:8]:
        for mode in ("free", "fixed"):
            for buckets in valid_bucketings(p, mode=mode):
                if count_orders(p, buckets, mode) <= 3000:
                    schedules = list(enumerate_schedules(p, buckets, mode=mode))
                    assert len(schedules) == count_orders(p, buckets, mode)
                    assert len(set(schedules)) == len(schedules)


def canonicalize(p: ScheduleProblem, s: Schedule) -> tuple[str, ...]:
    """The module docstring's move: members gather at the last member, in original order; member
    waits gather at the first member wait, in original order."""
    pos = {n: i for i, n in enumerate(s.order)}
    at: dict[str, tuple[str, ...]] = {}
    for b in s.buckets:
        members = tuple(sorted(b, key=p.index.__getitem__))
        waits = tuple(p.wait_of[m] for m in members)
        at[max(members, key=pos.__getitem__)] = members
        at[min(waits, key=pos.__getitem__)] = waits
        at.update({n: () for n in (*members, *waits) if n not in at})
    return tuple(x for n in s.order for x in at.get(n, (n,)))


def raw_cases() -> list[tuple[ScheduleProblem, tuple[tuple[str, ...], ...]]]:
    """Tiny problems with one bucket and few enough raw topological orders to try them all."""
    out = []
    for p in tiny_problems(12, seed=3, max_compute=6, max_collectives=3):
        if count_raw_orders(p) > 6000:
            continue
        out += [(p, b) for b in valid_bucketings(p) if len(b) == 1][:2]
    return out


def test_canonical_forms_lose_no_optimum() -> None:
    """Over EVERY raw topological order valid with the bucket: the canonicalized order is a
    canonical schedule with the same makespan and no higher peak, and the minimum makespan
    within the default budget equals the canonical brute force's."""
    cases = raw_cases()
    assert len(cases) >= 5
    for p, buckets in cases:
        assert canonical_assumptions_hold(p)
        budget = default_budget(p)
        canonical = set(enumerate_schedules(p, buckets))
        best_raw, n_valid = None, 0
        for order in raw_orders(p):
            s = Schedule(order, buckets)
            if check_schedule(p, s):
                continue
            n_valid += 1
            r = simulate(p, s, check=False)
            c = Schedule(canonicalize(p, s), buckets)
            assert c in canonical, (p.name, order)
            rc = simulate(p, c)
            assert rc.makespan_ns == r.makespan_ns and rc.peak_memory_bytes <= r.peak_memory_bytes
            if r.peak_memory_bytes <= budget and (best_raw is None or r.makespan_ns < best_raw):
                best_raw = r.makespan_ns
        assert n_valid >= len(canonical)
        assert search(p, [buckets]).best_makespan_ns == best_raw, p.name


# ---- tiny problems: free vs fixed ----

def test_tiny_problems_are_deterministic_and_as_described() -> None:
    ps = problems20()
    assert [p.name for p in ps] == [f"tiny_{k}" for k in range(20)]
    assert [p.ops for p in tiny_problems(20, seed=TEST_SEED)] == [p.ops for p in ps]
    for k, p in enumerate(ps):
        assert 2 <= len(p.collectives) <= 4
        assert any(op.heavy and op.runtime_ns > 0 for op in p.ops)
        assert k % 2 or len(valid_bucketings(p)) > 1


def test_fixed_mode_never_beats_free_mode_and_witnesses_are_valid() -> None:
    for p in problems20():
        budget = default_budget(p)
        free = brute_force(p)
        fixed = brute_force(p, mode="fixed")
        assert free.best_makespan_ns is not None  # the original order is a canonical free schedule
        assert free.best_makespan_ns <= simulate(p).makespan_ns
        for r in (free, fixed):
            if r.witness is None:
                continue
            assert check_schedule(p, r.witness) == []
            sim = simulate(p, r.witness)
            assert (sim.makespan_ns, sim.peak_memory_bytes) == (r.best_makespan_ns, r.best_peak_bytes)
            assert sim.peak_memory_bytes <= budget
        if fixed.best_makespan_ns is not None:
            assert fixed.best_makespan_ns >= free.best_makespan_ns, p.name


# ---- the pinned file ----

def test_pinned_optima_reproduce() -> None:
    data = json.loads(PINNED.read_text())
    assert data["schema"] == 1 and len(data["entries"]) == 20
    for k in (0, 9, 15):
        e = data["entries"][k]
        p = problem_from_dict(e["problem"], f"{PINNED.name}[{k}]")
        free, fixed = brute_force(p), brute_force(p, mode="fixed")
        assert default_budget(p) == e["budget_bytes"]
        assert (free.best_makespan_ns, free.n_schedules) == (e["free_optimum_ns"], e["n_schedules"])
        assert fixed.best_makespan_ns == e["fixed_optimum_ns"]
