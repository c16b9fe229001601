"""fxsched on a torch older than the 2.13 it is developed against (pyproject allows >= 2.9).

Each fallback is exercised here by removing, for one test, the torch attribute that older
releases lack, and checked against a hand-derived value or against torch's own function."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from torch._inductor.fx_passes import bucketing, fusion_regions, overlap_scheduling
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fxsched.fxbridge import extract, hardware
from fxsched.fxbridge.costs import compute_runtimes_ns
from fxsched.fxbridge.hardware import PROFILES

aten = torch.ops.aten
H100 = PROFILES["h100"]


def _trace(fn, *specs):
    with FakeTensorMode():
        return make_fx(fn)(*[torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in specs])


def _costs_of(gm, target, **kw) -> list[int]:
    costs = compute_runtimes_ns(gm, H100, **kw)
    return [costs[n] for n in gm.graph.nodes if n.target == target]


def test_roofline_without_torch_estimate_matches_torch(monkeypatch):
    """The fallback for ``overlap_scheduling.estimate_roofline_runtime_ms`` (torch < 2.13)
    prices a FLOP-bound and a bandwidth-bound matmul and a pointwise add as torch's does, and
    as the textbook roofline says (2mnk / 989 TFLOP/s; bytes / 3,350 GB/s)."""
    mm_big = _trace(torch.mm, ((8192, 8192), torch.bfloat16), ((8192, 8192), torch.bfloat16))
    mm_small = _trace(torch.mm, ((4096, 64), torch.bfloat16), ((64, 4096), torch.bfloat16))
    add = _trace(torch.add, ((1 << 24,), torch.float32), ((1 << 24,), torch.float32))
    cases = [(mm_big, aten.mm.default), (mm_small, aten.mm.default), (add, aten.add.Tensor)]
    with_torch = [_costs_of(gm, t) for gm, t in cases]
    monkeypatch.delattr(overlap_scheduling, "estimate_roofline_runtime_ms")
    without = [_costs_of(gm, t) for gm, t in cases]
    assert without == with_torch
    launch = H100.kernel_launch_overhead_ns
    assert abs(without[0][0] - (2 * 8192 ** 3 / 989e12 * 1e9 + launch)) <= 1
    assert without[1][0] == round((4096 * 64 * 2 + 4096 * 4096) * 2 / 3350.0) + launch
    assert without[2][0] == round(3 * (1 << 24) * 4 / 3350.0) + launch


def test_roofline_patch_without_flops_to_ns():
    """torch < 2.13's ``get_compute_time`` prices ``(flops / 2) / (0.75 * tflops * 1e15)`` s
    (its source, written out here); with the patched ``get_device_tflops`` that is the
    textbook ``flops / (989e12)`` s for an H100 bf16 matmul."""
    old_module = types.SimpleNamespace(get_gpu_dram_gbps=None, get_device_tflops=None)
    values = hardware._roofline_patch(old_module, H100)
    assert set(values) == {"get_gpu_dram_gbps", "get_device_tflops"}
    flops = 2 * 8192 ** 3
    old_formula_ns = (flops / 2) / (0.75 * values["get_device_tflops"](torch.bfloat16) * 1e15) * 1e9
    assert old_formula_ns == pytest.approx(flops / 989e12 * 1e9, rel=1e-12)
    new_module = types.SimpleNamespace(get_gpu_dram_gbps=None, get_device_tflops=None, flops_to_ns=None)
    values = hardware._roofline_patch(new_module, H100)
    assert values["flops_to_ns"](flops, torch.bfloat16) == pytest.approx(flops / 989e12 * 1e9, rel=1e-12)


def test_patch_attrs_skips_only_optional_missing_names():
    module = types.SimpleNamespace(a=1)
    with hardware._patch_attrs(module, {"a": 2, "b": 3}, optional=("b",)):
        assert module.a == 2 and not hasattr(module, "b")
    assert module.a == 1
    with pytest.raises(AttributeError, match="b"):
        with hardware._patch_attrs(module, {"a": 2, "b": 3}):
            pass
    assert module.a == 1


def test_fusion_unpriced_without_torch_estimate(monkeypatch, caplog):
    """Without ``fusion_regions.estimate_fused_node_costs`` (torch < 2.13) a pointwise chain is
    priced node by node, as ``fuse=False`` prices it, and a warning says so."""
    gm = _trace(lambda x: ((x + 1.0).relu() * 2.0), ((1 << 24,), torch.bfloat16))
    unfused = compute_runtimes_ns(gm, H100, fuse=False)
    assert compute_runtimes_ns(gm, H100, fuse=True) != unfused
    monkeypatch.delattr(fusion_regions, "estimate_fused_node_costs")
    with caplog.at_level(logging.WARNING, logger="fxsched.fxbridge.costs"):
        assert compute_runtimes_ns(gm, H100, fuse=True) == unfused
    assert "fusion is not priced" in caplog.text


def test_group_name_without_torch_resolver(monkeypatch):
    class _Node:
        meta = {"val": types.SimpleNamespace(group_name="7")}

    assert extract._resolve_group_name(_Node()) == "7"  # torch's resolver: a node's group
    monkeypatch.delattr(bucketing, "_resolve_group_name")
    assert extract._resolve_group_name("3") == "3"
