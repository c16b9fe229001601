"""Repeated layers: detection of isomorphic layers, replay of a local change in them, and the
neighbourhood search with replay. Every solve here is deterministic (seed 0, one worker,
deterministic time limit)."""

from __future__ import annotations

import dataclasses

import pytest
from fxsched.solver import Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig, solve
from fxsched.solver.layer_replay import LayerReplayer, Units, local_change, replay
from fxsched.solver.layers import detect_layers
from fxsched.solver.problem import Op, ScheduleProblem
from solver_builders import coll, compute, make_problem, wait


def _in(module: str | None, *ops: Op) -> list[Op]:
    return [dataclasses.replace(op, module=module) for op in ops]


def _layer(i: int, a_ns: int = 200, extra: bool = False) -> list[Op]:
    """Layer i: all_gather ag{i} (300 ns on group A, no inputs), its wait w{i}, compute a{i}
    (reads the shared input x, independent of the gather) and mm{i} (reads both).
    ``extra``: one more op b{i} between a{i} and mm{i}."""
    m = f"layers.{i}"
    ops = [coll(f"ag{i}", runtime_ns=300), wait(f"w{i}", f"ag{i}"), compute(f"a{i}", a_ns, deps=["x"])]
    if extra:
        ops.append(compute(f"b{i}", 50, deps=[f"a{i}"]))
    ops.append(compute(f"mm{i}", 100, deps=[f"w{i}", f"b{i}" if extra else f"a{i}"], heavy=True))
    return _in(f"{m}.attention", *ops)


def _parallel(layers: list[list[Op]]) -> ScheduleProblem:
    """x (100 ns, no module), then the layers in order."""
    return make_problem([compute("x", 100), *(op for lay in layers for op in lay)])


def test_three_identical_layers_and_one_different() -> None:
    p = _parallel([_layer(0), _layer(1), _layer(2), _layer(3, extra=True)])
    st = detect_layers(p)
    assert [lay.name for lay in st.layers] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert st.layer_of["ag2"] == "layers.2" and "x" not in st.layer_of  # x feeds 4 layers: not attached
    assert len(st.classes) == 1
    cls = st.classes[0]
    assert cls.template == "layers.0" and cls.layers == ("layers.0", "layers.1", "layers.2")
    assert cls.to_template["layers.2"] == {"ag2": "ag0", "w2": "w0", "a2": "a0", "mm2": "mm0"}
    assert cls.from_template["layers.1"]["mm0"] == "mm1"
    assert "layers.3" not in st.class_of
    assert st.map_op("w0", "layers.0", "layers.2") == "w2"
    assert st.map_op("b3", "layers.3", "layers.0") is None  # not in a class


def test_a_layer_that_differs_in_one_runtime_is_not_in_the_class() -> None:
    p = _parallel([_layer(0), _layer(1, a_ns=201), _layer(2), _layer(3)])
    st = detect_layers(p)
    assert [c.layers for c in st.classes] == [("layers.0", "layers.2", "layers.3")]
    assert "layers.1" not in st.class_of


def test_no_layers_and_a_custom_pattern() -> None:
    p = make_problem([compute("a", 10), compute("b", 10, deps=["a"])])
    st = detect_layers(p)
    assert st.layers == () and st.classes == ()
    blocks = _parallel([_in(f"blocks.{i}", *_layer(i)) for i in range(2)])
    assert detect_layers(blocks).layers == ()
    assert [c.layers for c in detect_layers(blocks, r"^(blocks\.\d+)").classes] == [("blocks.0", "blocks.1")]


def test_chain_neighbours_and_glue() -> None:
    """A chain of 5 layers joined by residual adds without a module: each add is attached to the
    layer it feeds; the first and last layers differ at the boundary (they read x / feed out),
    so the class is layers 1-3, and an op of a neighbour maps by the same layer shift."""
    ops = [compute("x", 100)]
    prev = "x"
    for i in range(5):
        ops += _in(None, compute(f"res{i}", 10, deps=[prev]))
        ops += _in(f"layers.{i}", coll(f"ag{i}", runtime_ns=300), wait(f"w{i}", f"ag{i}"),
                   compute(f"mm{i}", 100, deps=[f"w{i}", f"res{i}"], heavy=True))
        prev = f"mm{i}"
    ops += _in("output", compute("out", 50, deps=[prev]))
    st = detect_layers(make_problem(ops))
    assert st.layer_of["res2"] == "layers.2" and "out" not in st.layer_of
    assert [c.layers for c in st.classes] == [("layers.1", "layers.2", "layers.3")]
    assert st.map_op("mm1", "layers.2", "layers.3") == "mm2"  # the previous layer, shifted
    assert st.map_op("mm0", "layers.1", "layers.2") is None  # layer 0 is not in the class


def test_replaying_a_local_change_in_layer_0_onto_layers_1_and_2() -> None:
    """Layers 0-2 identical, layer 3 not (a3 takes 250 ns). Original order x, then per layer
    ag, w, a, mm: every gather (300 ns) is exposed, since a{i} runs only after w{i}.
    Makespan: x 0-100; per layer i<3 (start s): ag s..s+300, w stalls to s+300, a +200, mm +100,
    so 600 ns per layer: 100 + 3 * 600 = 1900; layer 3: 300 + 250 + 100 = 650 -> 2550.
    The local change in layer 0 sinks w0 past a0 (a0 runs under ag0: 200 of its 300 ns hidden):
    layer 0 takes 400 ns, so 2350. Replayed in layers 1 and 2 (w{i} after a{i}), each of them
    takes 400 ns too: 100 + 3 * 400 + 650 = 1950. Layer 3 is not in the class: untouched."""
    p = _parallel([_layer(0), _layer(1), _layer(2), _layer(3, a_ns=250)])
    st = detect_layers(p)
    units = Units(p)
    s0 = Schedule.original(p)
    assert simulate(p, s0).makespan_ns == 2550
    o = list(s0.order)
    o.remove("w0")
    o.insert(o.index("a0") + 1, "w0")
    s1 = Schedule(tuple(o))
    r1 = simulate(p, s1)
    assert r1.makespan_ns == 2350

    change = local_change(st, units, s0, s1)
    assert change is not None and change.layer == "layers.0" and change.moved == {"ag0", "w0"}
    one = replay(st, units, change, "layers.1", s1)
    assert one is not None and one.order == (
        "x", "ag0", "a0", "w0", "mm0", "ag1", "a1", "w1", "mm1", "ag2", "w2", "a2", "mm2",
        "ag3", "w3", "a3", "mm3")
    assert replay(st, units, change, "layers.3", s1) is None  # not isomorphic

    stats: dict[str, int] = {}
    best, res = LayerReplayer(p, st, budget_bytes=1 << 40).improve(s0, s1, r1, stats)
    assert best.order == (
        "x", "ag0", "a0", "w0", "mm0", "ag1", "a1", "w1", "mm1", "ag2", "a2", "w2", "mm2",
        "ag3", "w3", "a3", "mm3")
    assert check_schedule(p, best) == []
    assert res.makespan_ns == simulate(p, best).makespan_ns == 1950
    assert stats["layer_replays"] == 1 and stats["layer_replays_kept"] == 2
    assert stats["layer_replay_evals"] == 1  # both layers at once: better, kept


def test_a_change_spanning_two_layers_is_not_replayed() -> None:
    p = _parallel([_layer(0), _layer(1), _layer(2)])
    s0 = Schedule.original(p)
    o = list(s0.order)
    for i in (0, 1):
        o.remove(f"w{i}")
        o.insert(o.index(f"a{i}") + 1, f"w{i}")
    s1 = Schedule(tuple(o))
    assert local_change(detect_layers(p), Units(p), s0, s1) is None


def test_replay_keeps_the_incumbent_when_the_replay_is_not_better() -> None:
    """The change 'issue ag0 first' (anchored at the program start) gains 100 ns: 1800.
    Replayed in layer 1 it puts ag1 first: ag1 runs 0-300, ag0 300-600 in group A's FIFO, w0
    stalls to 600, a0 and mm0 end at 900, w1 does not stall, layer 1 ends at 1200 and layer 2
    (ag2 issued at 1200, 600 ns) at 1800: no better than the incumbent, so it comes back as is."""
    p = _parallel([_layer(0), _layer(1), _layer(2)])
    st, units = detect_layers(p), Units(p)
    s0 = Schedule.original(p)
    s1 = Schedule(("ag0", *(n for n in s0.order if n != "ag0")))
    r1 = simulate(p, s1)
    assert r1.makespan_ns == 1800
    change = local_change(st, units, s0, s1)
    assert change is not None
    one = replay(st, units, change, "layers.1", s1)
    assert one is not None and one.order == (
        "ag1", "ag0", "x", "w0", "a0", "mm0", "w1", "a1", "mm1", "ag2", "w2", "a2", "mm2")
    assert simulate(p, one).makespan_ns == 1800
    stats: dict[str, int] = {}
    best, res = LayerReplayer(p, st, budget_bytes=1 << 40).improve(s0, s1, r1, stats)
    assert best == s1 and res.makespan_ns == 1800 and stats["layer_replays_kept"] == 0


def _layered(n: int) -> ScheduleProblem:
    """n identical layers with two gathers each, a shared input and every wait at its issue."""
    ops = [compute("x", 100)]
    for i in range(n):
        ops += _in(f"layers.{i}",
                   coll(f"g{i}", runtime_ns=250), wait(f"v{i}", f"g{i}"),
                   coll(f"ag{i}", runtime_ns=300), wait(f"w{i}", f"ag{i}"),
                   compute(f"a{i}", 200, deps=["x"], heavy=True),
                   compute(f"c{i}", 150, deps=[f"v{i}", f"a{i}"], heavy=True),
                   compute(f"mm{i}", 100, deps=[f"w{i}", f"c{i}"], heavy=True))
    return make_problem(ops)


@pytest.mark.parametrize(("n", "replayed"), [(3, False), (5, True)])
def test_neighbourhood_search_with_replay_is_never_worse_than_without(n: int, replayed: bool) -> None:
    """Forced onto the neighbourhood path from the original order: with replay the answer is
    valid, scored by the simulator, and no worse than without. With 3 layers (6 placements) a
    plain window covers them all, so no window is seeded in a layer and nothing is local; with
    5, the first window sits in one layer and its gain is replayed in others. No final polish:
    it may shorten either answer, and the comparison is about the search."""
    p = _layered(n)
    base = SolveConfig(mode="fixed", max_order_literals=0, lns_rounds=4, bucketing=False, minimize_peak=False,
                       polish=False)
    off = solve(p, 8, dataclasses.replace(base, layer_replay=False), hint=Schedule.original(p))
    on = solve(p, 8, dataclasses.replace(base, layer_replay=True), hint=Schedule.original(p))
    assert check_schedule(p, on.schedule) == []
    assert on.peak_memory_bytes <= on.budget_bytes
    assert on.objective == simulate(p, on.schedule).makespan_ns
    assert on.objective <= off.objective <= simulate(p).makespan_ns
    assert on.stats["layers_in_classes"] == n
    assert (on.stats.get("layer_replays_kept", 0) >= 1) is replayed
