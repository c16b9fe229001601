"""What filling a stall takes (solver/stall_fill.py), on hand-derived timelines: a stall whose only
filler sits before a later wait with little slack (filling it moves the stall there), the same
stall with a filler beyond that wait, the estimate flag when a later collective starts when it is
issued, the next stall absorbing the shift, the stall's own need binding; then the batched
computation against the definition, op by op, on seeded random schedules."""

from __future__ import annotations

from fxsched.fxbridge.timeline import collective_rows
from fxsched.solver import Schedule, simulate
from fxsched.solver.stall_fill import stall_fill

from tests.solver.solver_builders import coll, compute, make_problem, wait


def _lead(beyond: int = 0, third: bool = False):
    """x (100), then c1 (1000 ns) and c2 (1800 ns) on group A, both issued after x: c1 runs
    100..1100, c2 queues behind it, 1100..2900. w1 comes next: it stalls 1000 (to 1100). Then u
    (1000, needs nothing), a (900, needs w1), w2 at 3000, 100 after c2 ends (slack 100), then
    ``v`` (``beyond`` ns, needs nothing) and b (100, needs w2 and a). With ``third``, c3 on group B
    (100 ns) is issued right after u, at 2100, and starts then; its wait comes after w2."""
    ops = [compute("x", 100),
           coll("c1", runtime_ns=1000, deps=["x"]), coll("c2", runtime_ns=1800, deps=["x"]),
           wait("w1", "c1"), compute("u", 1000)]
    if third:
        ops.append(coll("c3", "B", runtime_ns=100, deps=["u"]))
    ops += [compute("a", 900, deps=["w1"]), wait("w2", "c2")]
    if third:
        ops.append(wait("w3", "c3"))
    if beyond:
        ops.append(compute("v", beyond))
    ops.append(compute("b", 100, deps=["w2", "a"]))
    return make_problem(ops)


def _fill_of(p):
    """c1's :class:`StallFill` in the original order, and the order's simulation."""
    sim = simulate(p)
    unit = next(c for c in sim.collectives if c.members == ("c1",))
    return stall_fill(p, sim, Schedule.original(p).order, unit), sim


def test_filling_a_stall_from_before_a_tight_wait_moves_the_stall_there() -> None:
    """c1 stalls 1000; w2 has 100 slack, so 900 of the fill must come from after w2, where only b
    is, and b needs w2: nothing there can move (movable 0). The one filler, u, sits between the
    waits: pulled before w1 it hides c1 (u ends at 1100) but a ends at 2000 and w2 then stalls
    2900 - 2000 = 900, the need less what was movable."""
    p = _lead()
    fill, sim = _fill_of(p)
    assert [c.exposed_ns for c in sim.collectives] == [1000, 0]
    assert (fill.stall_ns, fill.tightest, fill.tightest_slack_ns, fill.need_ns, fill.movable_ns, fill.exact) == (
        1000, ("c2",), 100, 900, 0, True)
    assert not fill.fillable
    pulled = simulate(p, Schedule(("x", "c1", "c2", "u", "w1", "a", "w2", "b")))
    assert {c.name: c.exposed_ns for c in pulled.collectives} == {"c1": 0, "c2": 900}
    assert stall_fill(p, sim, Schedule.original(p).order, sim.collectives[1]) is None  # c2 is hidden


def test_a_filler_beyond_the_tight_wait_fills_the_stall() -> None:
    """v (1000 ns, needs nothing) after w2: 900 must come from after w2 and v's 1000 can. Moved
    before w1 it runs 100..1100, w1 finds c1 done, and w2 is reached at 3000 as before: both hidden."""
    p = _lead(beyond=1000)
    fill, _ = _fill_of(p)
    assert (fill.tightest, fill.need_ns, fill.movable_ns, fill.fillable) == (("c2",), 900, 1000, True)
    filled = simulate(p, Schedule(("x", "c1", "c2", "v", "w1", "u", "a", "w2", "b")))
    assert [c.exposed_ns for c in filled.collectives] == [0, 0]


def test_a_later_collective_released_by_compute_makes_it_an_estimate() -> None:
    """c3 on group B is issued at 2100 (after x 0..100, the stall to 1100, u 1100..2100) and starts
    then: with the compute earlier it would start earlier, so the need is an upper estimate. The
    report's "to fill its stall" column says so, with the numbers in us."""
    p = _lead(third=True)
    fill, sim = _fill_of(p)
    c3 = next(c for c in sim.collectives if c.members == ("c3",))
    assert (c3.issue_ns, c3.start_ns, c3.exposed_ns) == (2100, 2100, 0)
    assert (fill.tightest, fill.need_ns, fill.movable_ns, fill.exact) == (("c2",), 900, 0, False)
    rows = {r.name: r for r in collective_rows(p)}
    assert rows["c1"].fill == ("needs 0.9 us of compute from after c2 (0.1 us slack), 0.0 us movable "
                               "(an upper estimate: later collectives released by compute)")
    assert rows["c2"].fill == "" and rows["c3"].fill == ""


def test_no_tighter_wait_needs_the_whole_stall_from_after_it() -> None:
    """With c2 as short as 500 ns (1100..1600) w2 has 1400 slack, more than c1's stall: the fill can
    come from anywhere after w1, and u (1000) is there: fillable, need 1000."""
    p = make_problem([compute("x", 100), coll("c1", runtime_ns=1000, deps=["x"]),
                      coll("c2", runtime_ns=500, deps=["x"]), wait("w1", "c1"), compute("u", 1000),
                      compute("a", 900, deps=["w1"]), wait("w2", "c2"), compute("b", 100, deps=["w2", "a"])])
    fill, _ = _fill_of(p)
    assert (fill.tightest, fill.tightest_slack_ns, fill.need_ns, fill.movable_ns, fill.fillable) == (
        None, 0, 1000, 1000, True)


def test_the_next_stall_absorbs_the_shift() -> None:
    """c1 stalls 1000 (to 1100), a runs 1100..2000, then w2 stalls 900 (c2 ends 2900), then w3
    finds c3 (group B, 100..2800) done with 100 slack. Filling c1's stall runs a 1000 earlier, but
    w2's stall grows by as much and the clock is 2900 again at w3: c3's small slack does not count.
    The need is the whole stall from after w1, where a and b both need w1's or w2's data: 0 movable."""
    p = make_problem([compute("x", 100), coll("c1", runtime_ns=1000, deps=["x"]),
                      coll("c2", runtime_ns=1800, deps=["x"]), coll("c3", "B", runtime_ns=2700, deps=["x"]),
                      wait("w1", "c1"), compute("a", 900, deps=["w1"]), wait("w2", "c2"), wait("w3", "c3"),
                      compute("b", 100, deps=["w2", "w3", "a"])])
    fill, sim = _fill_of(p)
    assert {c.name: (c.exposed_ns, c.wait_ns - c.end_ns) for c in sim.collectives} == {
        "c1": (1000, -1000), "c2": (900, -900), "c3": (0, 100)}
    assert (fill.tightest, fill.need_ns, fill.movable_ns) == (None, 1000, 0)


def test_the_whole_stall_from_after_its_wait_can_be_the_binding_need() -> None:
    """c2 is on group B (100..1100); w2 comes at 2000 (after the stall to 1100 and a, 900): slack
    900, so only 100 must come from beyond w2, and v (400, needs nothing) is there. But the whole
    1000 must come from beyond w1, where only v can move (a and b need w1 or w2): 400 of 1000, so
    that is the need reported. Pulled before w1, v leaves c1 600 exposed."""
    p = make_problem([compute("x", 100), coll("c1", runtime_ns=1000, deps=["x"]),
                      coll("c2", "B", runtime_ns=1000, deps=["x"]), wait("w1", "c1"),
                      compute("a", 900, deps=["w1"]), wait("w2", "c2"), compute("v", 400),
                      compute("b", 100, deps=["w2", "a"])])
    fill, sim = _fill_of(p)
    assert {c.name: (c.exposed_ns, c.wait_ns - c.end_ns) for c in sim.collectives} == {"c1": (1000, -1000), "c2": (0, 900)}
    assert (fill.tightest, fill.need_ns, fill.movable_ns, fill.fillable) == (None, 1000, 400, False)
    pulled = simulate(p, Schedule(("x", "c1", "c2", "v", "w1", "a", "w2", "b")))
    assert {c.name: c.exposed_ns for c in pulled.collectives} == {"c1": 600, "c2": 0}


def _reference(p, sim, order, unit):
    """The module doc's definition, unit by unit and op by op (what stall_fills computes at once)."""
    if unit.exposed_ns == 0:
        return None
    s, w = unit.exposed_ns, unit.wait_pos
    blocked = set()
    for c in sim.collectives:
        if c.wait_pos >= w:
            for m in c.members:
                blocked |= {o.name for o in p.ops if p.depends_on(o.name, p.wait_of[m])}

    def movable(q):
        return sum(p.op_by_name[n].runtime_ns for n in order[q + 1:]
                   if p.op_by_name[n].kind.value == "compute" and n not in blocked)

    needs = [(s - movable(w), None, 0, s, movable(w))]
    exact = True
    for c in sorted((c for c in sim.collectives if c.wait_pos > w), key=lambda c: c.wait_pos):
        if c.exposed_ns:
            break
        exact &= not (c.issue_pos > w and c.start_ns == c.issue_ns and c.runtime_ns)
        if c.wait_ns - c.end_ns < s:
            need = s - (c.wait_ns - c.end_ns)
            needs.append((need - movable(c.wait_pos), c.members, c.wait_ns - c.end_ns, need, movable(c.wait_pos)))
    top = max(n[0] for n in needs)
    _, members, slack, need, mov = next(n for n in needs if n[0] == top)  # the first of the largest
    return (s, members, slack, need, mov, exact)


def test_stall_fills_matches_the_definition_on_random_schedules() -> None:
    """Seeded random problems, orders and bucketings: the batched, incremental computation gives
    what the definition gives op by op, for every unit."""
    import random

    from fxsched.solver.stall_fill import stall_fills
    from tests.solver.random_dags import random_bucketing, random_problem, random_topological_order

    checked = 0
    for seed in range(40):
        rng = random.Random(seed)
        p = random_problem(rng, max_ops=24)
        order = random_topological_order(p, rng, late_waits=seed % 2 == 0)
        sched = Schedule(order, random_bucketing(p, order, rng))
        sim = simulate(p, sched)
        got = stall_fills(p, sim, sched.order)
        for unit, fill in zip(sim.collectives, got):
            ref = _reference(p, sim, sched.order, unit)
            assert (None if fill is None else (fill.stall_ns, fill.tightest, fill.tightest_slack_ns, fill.need_ns,
                                                fill.movable_ns, fill.exact)) == ref
            checked += ref is not None
    assert checked >= 40  # enough stalled units to mean something
