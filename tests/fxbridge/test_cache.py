"""Schedule cache: fingerprints (what changes them, what must not) and cache entries (hit, miss,
corrupt, stale, atomic writes, install)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from fxsched.fxbridge.cache import (
    CorruptCacheEntry,
    ScheduleCache,
    SolveInfo,
    StaleCacheEntry,
    graph_fingerprint,
    graph_structure_digest,
    install,
    with_fingerprint,
)
from fxsched.fxbridge.extract import extract_problem
from fxsched.solver import (
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProcessGroup,
    Schedule,
    ScheduleProblem,
    Storage,
    save_problem,
    save_schedule,
)
from fxsched.solver.fingerprint import is_fingerprint, problem_digest, recorded_fingerprint

c10d = torch.ops._c10d_functional
aten = torch.ops.aten


# ---------------------------------------------------------------- FX graphs


def _node(g: fx.Graph, target, args, val, kwargs=None) -> fx.Node:
    n = g.call_function(target, args, kwargs or {})
    n.meta["val"] = val
    return n


def fsdp_graph(rows: int = 64, cols: int = 32, dtype: torch.dtype = torch.bfloat16, group: str = "g",
               group_size: int = 4, device: str = "cpu") -> fx.GraphModule:
    """shard -> all_gather -> wait -> mm -> reduce_scatter -> wait: a tiny FSDP-like step."""
    with FakeTensorMode():
        shard = torch.empty(rows // group_size, cols, dtype=dtype)
        full, full_w = torch.empty(rows, cols, dtype=dtype), torch.empty(rows, cols, dtype=dtype)
        x = torch.empty(16, rows, dtype=dtype)
        y = torch.empty(16, cols, dtype=dtype)
        ybuf = torch.empty(16, cols, dtype=dtype)
        rs, rs_w = torch.empty(16 // group_size, cols, dtype=dtype), torch.empty(16 // group_size, cols, dtype=dtype)
    g = fx.Graph()
    p, px = g.placeholder("primals_1"), g.placeholder("primals_2")
    p.meta["val"], px.meta["val"] = shard, x
    ag = _node(g, c10d.all_gather_into_tensor.default, (p, group_size, group), full)
    w = _node(g, c10d.wait_tensor.default, (ag,), full_w)
    mm = _node(g, aten.mm.default, (px, w), y)
    z = _node(g, aten.zeros_like.default, (mm,), ybuf, {"device": torch.device(device)})
    add = _node(g, aten.add.Tensor, (mm, z), y)
    r = _node(g, c10d.reduce_scatter_tensor.default, (add, "sum", group_size, group), rs)
    wr = _node(g, c10d.wait_tensor.default, (r,), rs_w)
    g.output((wr,))
    return fx.GraphModule(torch.nn.Module(), g)


def fingerprint(gm: fx.GraphModule, groups=None, profile: str = "h100", fuse: bool = True) -> str:
    problem = extract_problem(gm, groups=groups or {"g": 4}, profile=profile, fuse=fuse).problem
    return graph_fingerprint(gm, problem, profile=profile, fuse=fuse)


def test_fingerprint_is_stable_for_an_identical_retrace():
    a, b = fingerprint(fsdp_graph()), fingerprint(fsdp_graph())
    assert is_fingerprint(a) and a == b
    # the problem's name is a label, not part of the key
    gm = fsdp_graph()
    p1 = extract_problem(gm, groups={"g": 4}, name="export/backward").problem
    p2 = extract_problem(gm, groups={"g": 4}, name="graph").problem
    assert graph_fingerprint(gm, p1) == graph_fingerprint(gm, p2) == a


@pytest.mark.parametrize("change", [
    dict(rows=128),                       # shape
    dict(dtype=torch.float32),            # dtype
    dict(group="h"),                      # process-group name
    dict(group_size=2),                   # group size argument in the graph
])
def test_fingerprint_changes_with_the_graph(change):
    base = fingerprint(fsdp_graph())
    gm = fsdp_graph(**change)
    groups = {change.get("group", "g"): change.get("group_size", 4)}
    assert fingerprint(gm, groups) != base


def test_fingerprint_changes_with_group_size_profile_and_fusion():
    gm = fsdp_graph()
    base = fingerprint(gm)
    assert fingerprint(gm, groups={"g": 8}) != base        # PG size as extraction sees it
    assert fingerprint(gm, profile="a100") != base         # hardware profile
    assert fingerprint(gm, fuse=False) != base             # cost-model option


def test_fingerprint_is_rank_independent():
    """Each rank has its own device index and its own global ranks in a sub-group; every rank must
    compute the same key, or ranks would pick different schedules and NCCL would hang."""
    assert graph_structure_digest(fsdp_graph(device="cuda:0")) == graph_structure_digest(fsdp_graph(device="cuda:3"))
    assert graph_structure_digest(fsdp_graph(device="cpu")) != graph_structure_digest(fsdp_graph(device="cuda:0"))
    gm = fsdp_graph()
    fps = {fingerprint(gm, groups={"g": ProcessGroup("g", 4, ranks)}) for ranks in [(0, 1, 2, 3), (4, 5, 6, 7)]}
    assert len(fps) == 1


def test_fingerprint_sees_node_names_and_costs():
    gm = fsdp_graph()
    base = fingerprint(gm)
    next(n for n in gm.graph.nodes if n.op == "call_function").name = "renamed"
    assert fingerprint(gm) != base
    p = extract_problem(fsdp_graph(), groups={"g": 4}).problem
    slower = ScheduleProblem(ops=tuple(Op(o.name, o.kind, o.runtime_ns + (o.kind is OpKind.COMPUTE),
                                           o.deps, o.allocates, o.uses, o.collective, o.waits_on, o.heavy,
                                           o.target, o.module) for o in p.ops),
                             storages=p.storages, groups=p.groups, comm_curves=p.comm_curves,
                             bucket_costs=p.bucket_costs, name=p.name)
    assert problem_digest(slower) != problem_digest(p)


# ---------------------------------------------------------------- cache entries (no torch needed)


def small_problem(name: str = "p") -> ScheduleProblem:
    """x -> ag -> w -> y, with independent compute z."""
    info = CollectiveInfo(CollectiveKind.ALL_GATHER, "A", "bf16", 100, 200)
    ops = (
        Op("x", OpKind.COMPUTE, 100, allocates=("sx",)),
        Op("ag", OpKind.COLLECTIVE, 500, deps=("x",), allocates=("so",), uses=("sx",), collective=info),
        Op("z", OpKind.COMPUTE, 600),
        Op("w", OpKind.WAIT, 0, deps=("ag",), waits_on="ag"),
        Op("y", OpKind.COMPUTE, 100, deps=("w",), uses=("so",)),
    )
    return ScheduleProblem(ops=ops, storages=(Storage("sx", 100), Storage("so", 200)),
                           groups=(ProcessGroup("A", 2),),
                           comm_curves=(CommCurve("A", CollectiveKind.ALL_GATHER, ((0, 100), (1000, 1100))),),
                           name=name)


FP = "ab" * 32
FP2 = "cd" * 32
GOOD = Schedule(("x", "ag", "z", "w", "y"))


def test_miss_then_hit(tmp_path):
    cache = ScheduleCache(tmp_path / "missing-dir")
    assert cache.get(FP) is None and cache.fingerprints() == []
    p = small_problem()
    path = cache.put(FP, GOOD, problem=p, solve=SolveInfo("optimal", 700, 700, "cpsat", 1.5, {"workers": 1}))
    assert path == tmp_path / "missing-dir" / f"{FP}.json"
    assert cache.get(FP, p) == GOOD
    assert cache.get(FP2) is None
    entry = cache.get_entry(FP)
    assert entry.problem_name == "p" and entry.solve.status == "optimal" and entry.solve.gap == 0.0
    assert entry.solve.config == {"workers": 1} and entry.solve.created
    assert cache.fingerprints() == [FP]
    doc = json.loads(path.read_text())
    assert doc["format"] == "fxsched.cache-entry" and doc["fingerprint"] == FP


def test_tokens_change_with_entries(tmp_path):
    cache = ScheduleCache(tmp_path)
    empty = cache.state_token()
    assert cache.entry_token(FP) is None
    cache.put(FP, GOOD, problem=small_problem())
    t1, s1 = cache.entry_token(FP), cache.state_token()
    assert t1 and s1 != empty
    cache.put(FP, Schedule(("x", "ag", "w", "z", "y")), problem=small_problem())
    assert cache.entry_token(FP) != t1 and cache.state_token() != s1


@pytest.mark.parametrize("content, field", [
    (b"{not json", "<json>"),
    (b"[1, 2]", "<json>"),
    (json.dumps({"format": "something-else"}).encode(), "format"),
    (json.dumps({"format": "fxsched.cache-entry", "version": 99}).encode(), "version"),
    (json.dumps({"format": "fxsched.cache-entry", "version": 1, "fingerprint": FP, "problem": "p",
                 "solve": {}}).encode(), "schedule"),
    (json.dumps({"format": "fxsched.cache-entry", "version": 1, "fingerprint": FP, "problem": "p",
                 "schedule": {"format": "fxsched.schedule", "schema_version": 1, "order": [1, 2]},
                 "solve": {}}).encode(), "schedule"),
    (json.dumps({"format": "fxsched.cache-entry", "version": 1, "fingerprint": "short", "problem": "p",
                 "schedule": {}, "solve": {}}).encode(), "fingerprint"),
])
def test_corrupt_entry_names_file_and_field(tmp_path, caplog, content, field):
    cache = ScheduleCache(tmp_path)
    path = tmp_path / f"{FP}.json"
    path.write_bytes(content)
    with pytest.raises(CorruptCacheEntry) as err:
        cache.get(FP)
    assert err.value.path == path and err.value.field == field
    assert str(path) in str(err.value) and repr(field) in str(err.value)
    with caplog.at_level(logging.WARNING, logger="fxsched.fxbridge.cache"):
        assert cache.lookup(FP) is None  # what a compile hook sees: a warning and a miss
    assert str(path) in caplog.text


def test_stale_entries(tmp_path, caplog):
    cache = ScheduleCache(tmp_path)
    cache.put(FP, GOOD, problem=small_problem())
    # an entry copied under another fingerprint's name
    (tmp_path / f"{FP2}.json").write_bytes((tmp_path / f"{FP}.json").read_bytes())
    with pytest.raises(StaleCacheEntry, match="fingerprint") as err:
        cache.get(FP2)
    assert err.value.field == "fingerprint" and str(tmp_path / f"{FP2}.json") in str(err.value)
    # a schedule that does not fit the problem the compile extracted
    other = ScheduleProblem(ops=small_problem().ops[:1] + (Op("q", OpKind.COMPUTE, 5, deps=("x",)),),
                            storages=(Storage("sx", 100),), name="other")
    with pytest.raises(StaleCacheEntry) as err:
        cache.get(FP, other)
    assert err.value.field == "schedule" and "unknown_op" in str(err.value)
    with caplog.at_level(logging.WARNING):
        assert cache.lookup(FP, other) is None
    assert cache.lookup(FP, small_problem()) == GOOD


def test_put_is_atomic(tmp_path, monkeypatch):
    cache = ScheduleCache(tmp_path)
    cache.put(FP, GOOD, problem=small_problem())
    before = (tmp_path / f"{FP}.json").read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        cache.put(FP, Schedule(("x", "ag", "w", "z", "y")), problem=small_problem())
    monkeypatch.undo()
    assert (tmp_path / f"{FP}.json").read_bytes() == before  # the old entry is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{FP}.json"]  # no temporary file left
    assert cache.get(FP) == GOOD


def test_put_refuses_bad_input(tmp_path):
    cache = ScheduleCache(tmp_path)
    with pytest.raises(ValueError, match="invalid schedule"):
        cache.put(FP, Schedule(("ag", "x", "z", "w", "y")), problem=small_problem())
    with pytest.raises(ValueError, match="records fingerprint"):
        cache.put(FP, GOOD, problem=with_fingerprint(small_problem(), FP2))
    with pytest.raises(ValueError, match="not a fingerprint"):
        cache.put("../../etc/passwd", GOOD)
    assert list(tmp_path.iterdir()) == []


def test_install_uses_the_recorded_fingerprint(tmp_path):
    p = small_problem()
    save_problem(p, tmp_path / "p.json")
    save_schedule(GOOD, tmp_path / "s.json")
    with pytest.raises(ValueError, match="metadata.fingerprint"):
        install(tmp_path / "s.json", tmp_path / "p.json", tmp_path / "cache")
    save_problem(with_fingerprint(p, FP), tmp_path / "p.json")
    path = install(tmp_path / "s.json", tmp_path / "p.json", tmp_path / "cache")
    assert path.name == f"{FP}.json"
    entry = ScheduleCache(tmp_path / "cache").get_entry(FP, p)
    assert entry.schedule == GOOD and entry.solve.status == "installed"
    assert entry.solve.objective_ns == 800 and entry.solve.exposed_ns == 0  # x 100, z 600 hides ag, y 100
    bad = Schedule(("x", "z", "w", "ag", "y"))
    save_schedule(bad, tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not fit"):
        install(tmp_path / "bad.json", tmp_path / "p.json", tmp_path / "cache")
    assert recorded_fingerprint(with_fingerprint(p, FP)) == FP and recorded_fingerprint(p) is None
