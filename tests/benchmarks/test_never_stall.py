"""The never-stall probe (benchmarks/never_stall.py) on hand-derived problems."""

from __future__ import annotations

import dataclasses

import pytest

from fxsched.benchmarks.never_stall import (
    PolishConfig,
    ProbeConfig,
    _feeds_only_reduce_scatters,
    _units,
    broken_after,
    main,
    never_stall,
    over_budget_runs,
    polish_peak,
)
from fxsched.solver import Schedule, simulate
from fxsched.solver.serialization import save_problem
from tests.solver.solver_builders import AG, RS, coll, compute, make_problem, storage, wait, zero


def _gather_then_fill():
    """g (a gather, 300 ns) feeds m (100 ns); f (400 ns) needs nothing; m and f feed r (a
    reduce-scatter, 200 ns). In program order (g, m, f, r) m waits 300 ns for g. Running f first
    covers g (done at 300, m starts at 400): the compute stream never stalls, and r, issued after
    all compute, is the one unit left to stall: 200 ns, makespan 500 + 200 = 700 ns."""
    return make_problem([coll("g", runtime_ns=300), wait("vg", "g"), compute("m", 100, deps=["vg"]),
                         compute("f", 400), coll("r", kind=RS, runtime_ns=200, deps=["m", "f"]),
                         wait("wr", "r")])


def test_fill_covers_the_gather_and_only_the_last_reduce_scatter_stalls() -> None:
    p = _gather_then_fill()
    original = simulate(p, Schedule.original(p))
    assert original.exposed_ns == 300 + 200  # vg stalls behind g, wr behind r
    sched, res = never_stall(p)
    assert sched.order.index("f") < sched.order.index("m")
    assert [(c.name, c.exposed_ns) for c in res.collectives if c.exposed_ns] == [("r", 200)]
    assert res.makespan_ns == 700
    assert res.n_hidden_hideable_members == res.n_hideable_members == 1  # g; nothing is independent of r


def test_the_reduce_scatter_issued_last_is_waited_first() -> None:
    """a (100) feeds r1 (400 ns), b (100) feeds r2 (100 ns); r1 and r2 belong to two modules, so
    they are two units. With no gather to keep ahead of, each issues once its input is ready: r1 at
    100, running to 500, r2 at 200, queued behind it, 500..600. r2 is issued last, so it is waited
    first, at 200: it stalls 600 - 200 = 400 ns and leaves r1 done; nothing else stalls."""
    r1 = dataclasses.replace(coll("r1", kind=RS, runtime_ns=400, deps=["a"]), module="l1")
    r2 = dataclasses.replace(coll("r2", kind=RS, runtime_ns=100, deps=["b"]), module="l2")
    p = make_problem([compute("a", 100), r1, wait("w1", "r1"), compute("b", 100), r2, wait("w2", "r2")])
    sched, res = never_stall(p)
    assert sched.order == ("a", "r1", "b", "r2", "w2", "w1")
    assert [(c.name, c.exposed_ns) for c in res.collectives if c.exposed_ns] == [("r2", 400)]
    assert res.makespan_ns == 600


def test_config_rejects_negative_knobs() -> None:
    with pytest.raises(ValueError, match="ProbeConfig.window"):
        ProbeConfig(window=-1)


def _two_gathers(pad_ns: int):
    """g1 (2000 ns) feeds m1 (400), g2 (300) feeds m2 (100); a and b (1000 each) need neither; all
    compute feeds r (a reduce-scatter, 50 ns). With no pad, g2 goes out once the queue (g1, to
    2000) is no longer than the next op: after a, at 1000, when b (1000 ns) would outlast it. It
    runs 2000..2300; m1 runs 2000..2400 (g1 just done), m2 2400..2500, and r, issued at 2500,
    stalls its wait 50 ns: makespan 2550. A pad of 2 us lets g2 go out at once behind g1."""
    ops = [coll("g1", runtime_ns=2000), wait("w1", "g1"), coll("g2", runtime_ns=300), wait("w2", "g2"),
           compute("a", 1000), compute("b", 1000), compute("m1", 400, deps=["w1"]), compute("m2", 100, deps=["w2"]),
           coll("r", kind=RS, runtime_ns=50, deps=["a", "b", "m1", "m2"]), wait("wr", "r")]
    return never_stall(make_problem(ops), ProbeConfig(singles=2, issue_pad_ns=pad_ns))


def test_a_gather_goes_out_just_in_time() -> None:
    sched, res = _two_gathers(0)
    assert sched.order == ("g1", "a", "g2", "b", "w1", "m1", "w2", "m2", "r", "wr")
    assert [(c.name, c.exposed_ns) for c in res.collectives if c.exposed_ns] == [("r", 50)]
    assert res.makespan_ns == 2550
    early, _ = _two_gathers(2000)
    assert early.order[:3] == ("g1", "g2", "a")


def test_only_up_casts_that_feed_reduce_scatters_wait_for_them() -> None:
    """x (10 B) is read through a view by c, which writes 20 B and feeds r1 alone: an up-cast, so it
    waits for r1. m reads x and y (10 B each) and writes 10 B for r2: not an up-cast. d writes 20 B
    from y but also feeds compute e: it stays in program order."""
    ops = [compute("x", 10, allocates=["x"]), compute("y", 10, allocates=["y"]),
           zero("v", deps=["x"], uses=["x"]), compute("c", 5, deps=["v"], allocates=["c"], uses=["x"]),
           coll("r1", kind=RS, runtime_ns=50, deps=["c"], uses=["c"]), wait("w1", "r1"),
           compute("m", 20, deps=["x", "y"], allocates=["m"], uses=["x", "y"]),
           coll("r2", kind=RS, runtime_ns=50, deps=["m"], uses=["m"]), wait("w2", "r2"),
           compute("d", 5, deps=["y"], allocates=["d"], uses=["y"]), compute("e", 5, deps=["d"], uses=["d"]),
           coll("r3", kind=RS, runtime_ns=50, deps=["d"], uses=["d"]), wait("w3", "r3")]
    storages = [storage("x", 10), storage("y", 10), storage("c", 20), storage("m", 10), storage("d", 20)]
    assert _feeds_only_reduce_scatters(make_problem(ops, storages)) == {"c"}


def test_reduce_scatters_bucket_by_module_path_within_one_group() -> None:
    """Modules l.0.a, l.0.b, l.1.a at depth 2 make groups l.0 (two) and l.1; span 2 puts both
    groups of group A in one unit; the one on group B stays apart; the first collective alone with
    singles=1."""
    def rs(name: str, module: str, group: str = "A"):
        return dataclasses.replace(coll(name, group, RS, runtime_ns=10), module=module)
    ops = [rs("r1", "l.0.a"), rs("r2", "l.0.b"), rs("r3", "l.1.a"), rs("r4", "l.1.a", "B")]
    p = make_problem(ops + [wait(f"w{o.name}", o.name) for o in ops])
    assert _units(p, RS, 0, depth=2, span=1) == [("r1", "r2"), ("r3",), ("r4",)]
    assert _units(p, RS, 0, depth=2, span=2) == [("r1", "r2", "r3"), ("r4",)]
    assert _units(p, RS, 1, depth=3, span=1) == [("r1",), ("r2",), ("r3",), ("r4",)]


def test_over_budget_runs_name_where_an_order_needs_more() -> None:
    """loss_then_gather in the order g, a, b, wg, y: pg (100 B) and G (500) live from g, T (1000)
    from a, U (1) from b; T dies after b. Positions 1 (1600 B) and 2 (1601 B) exceed the original
    order's 1101 B; the run's top is b."""
    from tests.solver.solver_builders import loss_then_gather

    p = loss_then_gather()
    order = ("g", "a", "b", "wg", "y")
    runs = over_budget_runs(order, simulate(p, Schedule(order)).memory_curve, 1101)
    assert [(r.first, r.last, r.peak_bytes, r.at) for r in runs] == [(1, 2, 1601, "b")]
    assert over_budget_runs(Schedule.original(p).order, simulate(p).memory_curve, 1101) == []


def test_a_graph_without_reduce_scatters() -> None:
    """g (300 ns) feeds m (100); f (400) needs nothing: f covers g, nothing stalls, makespan 500."""
    p = make_problem([coll("g", runtime_ns=300), wait("vg", "g"), compute("m", 100, deps=["vg"]), compute("f", 400)])
    sched, res = never_stall(p)
    assert sched.order == ("g", "f", "vg", "m")
    assert res.exposed_ns == 0 and res.makespan_ns == 500


def test_after_holds_a_gather_behind_the_op_it_must_follow() -> None:
    """_gather_then_fill with g after f: f runs first (0..400, it is what g must follow), g goes
    out at 400 and ends at 700, so m waits 300 ns (700..800); r, issued at 800, stalls 200 ns:
    makespan 1000, against 700 without the pair."""
    p = _gather_then_fill()
    sched, res = never_stall(p, after={"g": "f"})
    assert sched.order == ("f", "g", "vg", "m", "r", "wr")
    assert [(c.name, c.exposed_ns) for c in res.collectives if c.exposed_ns] == [("g", 300), ("r", 200)]
    assert res.makespan_ns == 1000
    assert broken_after(sched.order, {"g": "f"}) == []
    assert broken_after(never_stall(p)[0].order, {"g": "f"}) == [("g", "f")]
    with pytest.raises(ValueError, match="'nope'"):
        never_stall(p, after={"g": "nope"})


def _fill_before_the_loss():
    """loss_then_gather plus f (500 ns), which writes F (400 B) for y. g (700 ns) must go out
    before a, or y waits: after a only f and b (510 ns) are left to cover it. So G (500 B) is in
    flight while a's T (1000 B) lives, over the parameter pg (100 B): 1600 B at a, 1601 at b
    (U), whatever the order; F live there too makes 2001. Running f after b instead (T is freed
    then) gives the same times and a peak of 1601 B, the least an order that never stalls has."""
    return make_problem([
        compute("a", 2_000, allocates=["T"], heavy=True),
        compute("b", 10, deps=["a"], uses=["T"], allocates=["U"]),
        compute("f", 500, allocates=["F"]),
        coll("g", "A", AG, runtime_ns=700, bytes_in=100, bytes_out=500, uses=["pg"], allocates=["G"]),
        wait("wg", "g", uses=["G"]),
        compute("y", 1_000, deps=["wg", "b", "f"], uses=["G", "U", "F"], heavy=True),
    ], [storage("pg", 100, param=True), storage("T", 1000), storage("U", 1), storage("G", 500), storage("F", 400)],
        groups=("A",))


POLISH = PolishConfig(rounds=4, window=10, time_s=5.0, deterministic=True, workers=1)


def test_polish_lowers_the_peak_without_a_stall() -> None:
    p = _fill_before_the_loss()
    start = Schedule(("f", "g", "a", "b", "wg", "y"))
    before = simulate(p, start)
    assert before.peak_memory_bytes == 2001 and before.exposed_ns == 0 and before.makespan_ns == 3510
    sched, res, log = polish_peak(p, start, 1601, POLISH)
    assert res.peak_memory_bytes == 1601
    assert res.exposed_ns == 0 and res.makespan_ns == 3510
    assert sched.order.index("f") > sched.order.index("b")
    assert log and log[0].endswith("kept")
    # a pair the start order breaks (f after y, which f feeds) is no pin: the same answer
    assert polish_peak(p, start, 1601, POLISH, after={"f": "y"})[1].peak_memory_bytes == 1601


def test_polish_does_not_buy_memory_with_a_stall() -> None:
    """loss_then_gather in the order g, a, b, wg, y: 1601 B, no stall. The original order's 1101 B
    needs g after b, and then y waits for it: no window may trade that, so the order stays."""
    from tests.solver.solver_builders import loss_then_gather

    p = loss_then_gather()
    start = Schedule(("g", "a", "b", "wg", "y"))
    sched, res, log = polish_peak(p, start, 1101, POLISH)
    assert sched.order == start.order and res.peak_memory_bytes == 1601 and res.exposed_ns == 0
    assert log and not any(line.endswith("kept") for line in log)


def test_polish_keeps_the_after_pairs() -> None:
    """With b after f, F is live at b in every order: the least peak with no stall is then
    2001 B (g must still go out before a), where without the pair it is 1601 B."""
    p = _fill_before_the_loss()
    start = Schedule(("f", "g", "a", "b", "wg", "y"))
    sched, res, _ = polish_peak(p, start, 1601, POLISH, after={"b": "f"})
    assert broken_after(sched.order, {"b": "f"}) == []
    assert res.peak_memory_bytes == 2001 and res.exposed_ns == 0


def test_cli_reports_polish_rounds_and_broken_pairs(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    save_problem(_fill_before_the_loss(), path)
    assert main([str(path), "--after", "g:f", "--polish-rounds", "1", "--polish-s", "2"]) == 0
    out = capsys.readouterr().out
    assert "hand: hidden" in out and "polish: window" in out
    with pytest.raises(SystemExit):
        main([str(path), "--after", "g"])
