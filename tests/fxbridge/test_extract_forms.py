"""Extraction of the coalesced and in-place collective forms (hand-built graphs, hand-derived sizes)."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from fxsched.fxbridge.extract import extract_problem
from fxsched.solver import OpKind, check_schedule, Schedule, simulate

c10d = torch.ops._c10d_functional


def _node(g: fx.Graph, target, args, val) -> fx.Node:
    n = g.call_function(target, args)
    n.meta["val"] = val
    return n


def test_coalesced_all_gather_is_one_collective_with_one_wait():
    """Two fp32 shards (64 B, 128 B) gathered over 4 ranks in one coalesced call:
    one collective of 192 B in / 768 B out; the first wait is its wait, the second is free."""
    with FakeTensorMode():
        a, b = torch.empty(16), torch.empty(32)
        ga, gb = torch.empty(64), torch.empty(128)
        wa, wb, s = torch.empty(64), torch.empty(128), torch.empty(64)
    g = fx.Graph()
    pa, pb = g.placeholder("primals_1"), g.placeholder("primals_2")
    pa.meta["val"], pb.meta["val"] = a, b
    coll = _node(g, c10d.all_gather_into_tensor_coalesced.default, ([pa, pb], 4, "g"), [ga, gb])
    ia = _node(g, operator.getitem, (coll, 0), ga)
    ib = _node(g, operator.getitem, (coll, 1), gb)
    w1 = _node(g, c10d.wait_tensor.default, (ia,), wa)
    w2 = _node(g, c10d.wait_tensor.default, (ib,), wb)
    out = _node(g, torch.ops.aten.add.Tensor, (w1, w1), s)
    g.output((out, w2))
    p = extract_problem(fx.GraphModule(torch.nn.Module(), g), groups={"g": 4}).problem
    (c,) = p.collectives
    assert c.collective.kind.value == "all_gather"
    assert (c.collective.bytes_in, c.collective.bytes_out) == (192, 768)
    kinds = {op.name: op.kind for op in p.ops}
    assert kinds[w1.name] is OpKind.WAIT and kinds[w2.name] is OpKind.ZERO
    assert p.op_by_name[w1.name].waits_on == c.name
    assert w1.name in p.op_by_name[w2.name].deps
    assert check_schedule(p, Schedule.original(p)) == []
    # storages: two 64/128 B inputs; the gathered 256 B + 512 B buffers (waits alias them); 256 B add
    assert sorted(s.size_bytes for s in p.storages) == [64, 128, 256, 256, 512]


def test_in_place_all_reduce_allocates_nothing():
    """all_reduce_ returns its input: the collective and its wait allocate no storage."""
    with FakeTensorMode():
        x, w, y = torch.empty(8), torch.empty(8), torch.empty(8)
    g = fx.Graph()
    px = g.placeholder("tangents_1")
    px.meta["val"] = x
    ar = _node(g, c10d.all_reduce_.default, (px, "sum", "g"), x)
    wt = _node(g, c10d.wait_tensor.default, (ar,), w)
    out = _node(g, torch.ops.aten.mul.Tensor, (wt, wt), y)
    g.output((out,))
    p = extract_problem(fx.GraphModule(torch.nn.Module(), g), groups={"g": 2}).problem
    (c,) = p.collectives
    assert c.collective.kind.value == "all_reduce" and c.collective.reduce_op == "sum"
    assert c.allocates == () and p.op_by_name[wt.name].allocates == ()
    r = simulate(p)
    # 32 B input live from the start (read by the mul through the wait), then the 32 B product
    assert r.initial_memory_bytes == 32 and list(r.memory_curve) == [32, 32, 64]
