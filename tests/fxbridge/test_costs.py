"""Cost model: hardware profiles, hardware_context, collective and compute runtimes.

Oracles are hand-derived (FLOPs / peak, bytes / bandwidth) or torch's own entry points
(``comm_analysis.estimate_nccl_collective_runtime_from_fx_node``), never our own output.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import random

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx
from torch._inductor import comm_analysis
from torch._inductor.comm_analysis import NCCL_COLL, NVIDIA_GPU_TYPE, InterconnectType
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.testing._internal.distributed.fake_pg import FakeStore

import torch.utils._runtime_estimation as runtime_estimation
from fxsched.fxbridge import costs
from fxsched.fxbridge.costs import (
    collective_kind,
    collective_runtime_ns,
    collective_size_bytes,
    comm_curve_points,
    compute_runtimes_ns,
    is_heavy,
    is_view_like,
)
from fxsched.fxbridge.hardware import PROFILES, HardwareProfile, get_profile, hardware_context

c10d = torch.ops._c10d_functional
aten = torch.ops.aten
H100 = PROFILES["h100"]
WORLD = 8


@pytest.fixture(scope="module")
def group_name():
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield dist.group.WORLD.group_name
    finally:
        if owned:
            dist.destroy_process_group()


def _trace(fn, *specs, device="cuda", symbolic=False):
    """make_fx ``fn`` on fake tensors given as (shape, dtype) specs."""
    if symbolic:  # make_fx fakifies the inputs itself (cpu only: no CUDA in this build)
        args = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
        return make_fx(fn, tracing_mode="symbolic")(*args)
    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
        return make_fx(fn)(*args)


def _nodes(gm: fx.GraphModule, target) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.target == target]


def _one(gm: fx.GraphModule, target) -> fx.Node:
    (node,) = _nodes(gm, target)
    return node


def _collective_graph(gn: str, device: str = "cuda") -> fx.GraphModule:
    def fn(x, m, b):
        ag = c10d.wait_tensor(c10d.all_gather_into_tensor(x, WORLD, gn))
        rs = c10d.wait_tensor(c10d.reduce_scatter_tensor(m, "sum", WORLD, gn))
        ar = c10d.wait_tensor(c10d.all_reduce(b, "sum", gn))
        ar_ = c10d.all_reduce_(b, "avg", gn)
        a2a = c10d.wait_tensor(c10d.all_to_all_single(x, [64] * WORLD, [64] * WORLD, gn))
        agc = c10d.all_gather_into_tensor_coalesced([x, b], WORLD, gn)
        rsc = c10d.reduce_scatter_tensor_coalesced([m, m], "sum", WORLD, gn)
        arc = c10d.all_reduce_coalesced([b, b], "sum", gn)
        arc_ = c10d.all_reduce_coalesced_([b, b], "sum", gn)
        out = torch.empty(WORLD * 512, 1024, device=x.device, dtype=x.dtype)
        ago = c10d.all_gather_into_tensor_out(x, WORLD, gn, out=out)
        return ag, rs, ar, ar_, a2a, agc, rsc, arc, arc_, ago

    return _trace(
        fn,
        ((512, 1024), torch.bfloat16),
        ((WORLD * 256, 1024), torch.float32),
        ((4096,), torch.float32),
        device=device,
    )


# --------------------------------------------------------------------------- profiles
def test_profiles_and_get_profile():
    assert {"h100", "a100", "b200"} <= set(PROFILES)
    assert H100.peak_tflops["bfloat16"] == 989.0 and H100.memory_bandwidth_gbps == 3350.0
    assert H100.peak_tflops["float32"] == 67.0 and H100.peak_tflops["tf32"] == 494.5
    assert get_profile("H100") is H100 and get_profile(H100) is H100
    with pytest.raises(ValueError, match=r"unknown hardware profile 'tpu'.*a100.*b200.*h100"):
        get_profile("tpu")
    twin = dataclasses.replace(H100)
    assert twin == H100 and hash(twin) == hash(H100)
    with pytest.raises(ValueError, match="gpu_generation"):
        dataclasses.replace(H100, gpu_generation="pascal")
    with pytest.raises(ValueError, match="memory_bandwidth_gbps"):
        HardwareProfile("bad", {"bfloat16": 1.0}, 0.0, 0)
    custom = HardwareProfile("mine", {torch.bfloat16: 100.0}, 1000.0, 500)
    assert custom.peak_tflops == {"bfloat16": 100.0} and custom.tflops(torch.bfloat16) == 100.0


def test_tf32_rule_and_unknown_dtype():
    old = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        assert H100.tflops(torch.float32) == 67.0
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert H100.tflops(torch.float32) == 494.5
    finally:
        torch.backends.cuda.matmul.fp32_precision = old
    with pytest.raises(ValueError, match=r"'h100' has no peak TFLOP/s for dtype 'int64'"):
        H100.tflops(torch.int64)


# --------------------------------------------------------------------------- context
def _patched_state():
    import torch._inductor.config as cfg

    return (
        comm_analysis.get_gpu_type,
        comm_analysis._has_nvlink,
        comm_analysis.torch,
        runtime_estimation.get_gpu_dram_gbps,
        runtime_estimation.get_device_tflops,
        runtime_estimation.flops_to_ns,
        cfg.intra_node_bw,
        cfg.inter_node_bw,
    )


def test_hardware_context_patches_and_restores():
    before = _patched_state()
    custom = dataclasses.replace(
        PROFILES["b200"], gpus_per_node=4, intra_node_bw_gbps=123.0, inter_node_bw_gbps=7.0
    )
    with hardware_context(H100):
        assert comm_analysis.get_gpu_type() == NVIDIA_GPU_TYPE.HOPPER
        assert comm_analysis.torch.cuda.device_count() == 8
        assert comm_analysis.get_intra_node_bw() == 370.0  # comm_analysis' Hopper default
        assert runtime_estimation.get_gpu_dram_gbps() == 3350.0
        assert runtime_estimation.get_device_tflops(torch.bfloat16) == 989.0
        assert comm_analysis.detect_interconnect(8) == InterconnectType.NVLINK_H100
        assert comm_analysis.detect_interconnect(16) == InterconnectType.IB_NDR
        with hardware_context(custom):  # nesting, different profile
            assert comm_analysis.get_gpu_type() == NVIDIA_GPU_TYPE.BLACKWELL
            assert comm_analysis.torch.cuda.device_count() == 4
            assert comm_analysis.get_intra_node_bw() == 123.0
            assert comm_analysis.get_inter_node_bw() == 7.0
            assert comm_analysis.detect_interconnect(8) == InterconnectType.IB_NDR
        with hardware_context(H100):  # nesting, same profile
            assert comm_analysis.get_gpu_type() == NVIDIA_GPU_TYPE.HOPPER
        assert comm_analysis.get_intra_node_bw() == 370.0
        assert comm_analysis.torch.cuda.device_count() == 8
    assert _patched_state() == before
    with pytest.raises(RuntimeError, match="boom"):
        with hardware_context(custom):
            raise RuntimeError("boom")
    assert _patched_state() == before
    assert comm_analysis.torch is torch


def test_gpus_per_node_changes_collective_time():
    four = dataclasses.replace(H100, name="h100x4", gpus_per_node=4)
    # 8 ranks: one NVLink node on h100, two IB nodes with 4 GPUs per node.
    assert comm_curve_points("all_gather", 8, four) != comm_curve_points("all_gather", 8, H100)


# --------------------------------------------------------------------------- classification
def test_classification(group_name):
    gm = _collective_graph(group_name)
    kinds = {n.name: collective_kind(n) for n in gm.graph.nodes}
    assert kinds["all_gather_into_tensor"] == "all_gather"
    assert kinds["all_gather_into_tensor_out"] == "all_gather"
    assert kinds["all_gather_into_tensor_coalesced"] == "all_gather"
    assert kinds["reduce_scatter_tensor"] == "reduce_scatter"
    assert kinds["reduce_scatter_tensor_coalesced"] == "reduce_scatter"
    assert kinds["all_reduce"] == kinds["all_reduce_"] == "all_reduce"
    assert kinds["all_reduce_coalesced"] == kinds["all_reduce_coalesced_"] == "all_reduce"
    assert kinds["all_to_all_single"] == "all_to_all"
    assert kinds["wait_tensor"] is None and kinds["empty"] is None and kinds["x_1"] is None

    def fn(a, b):
        s = a.view(64, 16).t()
        p, q = torch.split(a, 512)
        return c10d.broadcast(s @ b[:64], 0, group_name), p + q, a.detach(), s.size(0) * 2

    gm2 = _trace(fn, ((1024,), torch.float32), ((128, 8), torch.float32), symbolic=True)
    by_target = {n.target: n for n in gm2.graph.nodes}
    assert collective_kind(by_target[c10d.broadcast.default]) is None
    for t in (aten.view.default, aten.t.default, aten.split.Tensor, operator.getitem,
              aten.slice.Tensor, aten.detach.default):
        assert is_view_like(by_target[t]), t
    for t in (aten.mm.default, aten.add.Tensor):
        assert not is_view_like(by_target[t]), t
    assert is_heavy(by_target[aten.mm.default]) and not is_heavy(by_target[aten.add.Tensor])


# --------------------------------------------------------------------------- collectives
def test_collective_size_bytes_hand_derived(group_name):
    gm = _collective_graph(group_name)
    x_bytes, m_bytes, b_bytes = 512 * 1024 * 2, WORLD * 256 * 1024 * 4, 4096 * 4
    assert collective_size_bytes(_one(gm, c10d.all_gather_into_tensor.default)) == 9 * x_bytes
    assert collective_size_bytes(_one(gm, c10d.all_gather_into_tensor_out.default)) == 9 * x_bytes
    assert collective_size_bytes(_one(gm, c10d.reduce_scatter_tensor.default)) == (
        m_bytes + m_bytes // WORLD
    )
    assert collective_size_bytes(_one(gm, c10d.all_reduce.default)) == 2 * b_bytes
    assert collective_size_bytes(_one(gm, c10d.all_reduce_coalesced.default)) == 4 * b_bytes


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("profile", ["h100", "a100", "b200"])
def test_collective_runtime_matches_torch_entry_point(group_name, profile, device):
    gm = _collective_graph(group_name, device)
    colls = [n for n in gm.graph.nodes if collective_kind(n) is not None]
    assert len(colls) == 10
    for node in colls:
        with hardware_context(get_profile(profile)):
            ref_ms = comm_analysis.estimate_nccl_collective_runtime_from_fx_node(node)
        got = collective_runtime_ns(node, WORLD, profile)
        assert ref_ms > 0
        assert abs(got - ref_ms * 1e6) <= 0.5, node.name


def test_collective_runtime_group_size_is_used(group_name):
    node = _one(_collective_graph(group_name), c10d.all_gather_into_tensor.default)
    size = 9 * 512 * 1024 * 2
    with hardware_context(H100):
        ref = comm_analysis.estimate_nccl_collective_runtime_impl(size, 32, NCCL_COLL.ALL_GATHER)
    assert collective_runtime_ns(node, 32, H100) == round(ref * 1e6)
    assert collective_runtime_ns(node, 1, H100) == 0


def test_collective_errors_name_the_node(group_name):
    gm = _collective_graph(group_name)
    wait = _nodes(gm, c10d.wait_tensor.default)[0]
    with pytest.raises(ValueError, match=r"node 'wait_tensor' .* not a supported collective"):
        collective_runtime_ns(wait, WORLD, H100)
    with pytest.raises(ValueError, match=r"node 'empty'"):
        collective_size_bytes(_one(gm, aten.empty.memory_format))
    with pytest.raises(ValueError, match="group_size"):
        collective_runtime_ns(_one(gm, c10d.all_reduce.default), 0, H100)


# --------------------------------------------------------------------------- curves
def _interp(points, size: int) -> float:
    xs = [x for x, _ in points]
    i = bisect.bisect_right(xs, size) - 1
    if i == len(points) - 1:
        return float(points[i][1])
    (a, fa), (b, fb) = points[i], points[i + 1]
    return fa + (fb - fa) * (size - a) / (b - a)


@pytest.mark.parametrize("profile", ["h100", "a100", "b200"])
@pytest.mark.parametrize("group_size", [2, 8, 32])
@pytest.mark.parametrize("kind", costs.COLLECTIVE_KINDS)
def test_comm_curve_interpolates_within_1pct(kind, group_size, profile):
    prof = get_profile(profile)
    points = comm_curve_points(kind, group_size, prof)
    xs = [x for x, _ in points]
    assert xs[0] == 0 and xs[-1] == 64 << 30
    assert all(a < b for a, b in zip(xs, xs[1:]))
    assert all(isinstance(x, int) and isinstance(t, int) for x, t in points)
    rng = random.Random(f"{kind}-{group_size}-{profile}")
    sizes = [int(2 ** rng.uniform(16, 36)) for _ in range(400)]
    sizes += [(64 << k) + d for k in range(10, 25) for d in (-2, -1, 0, 1)]  # tree jumps
    sizes += [64 << 10, 64 << 30]
    coll = NCCL_COLL[kind.upper()]
    with hardware_context(prof):
        for size in sizes:
            ref = comm_analysis.estimate_nccl_collective_runtime_impl(size, group_size, coll) * 1e6
            assert abs(_interp(points, size) - ref) <= 0.01 * ref, (size, ref)


def test_comm_curve_with_estimator(group_name):
    node = _one(_collective_graph(group_name), c10d.all_gather_into_tensor.default)
    calls: list[int | None] = []

    def est(n, size):
        calls.append(size)
        assert n is node
        return None if size < (1 << 20) else 0.001 + size * 1e-9  # ms

    points = comm_curve_points("all_gather", WORLD, H100, estimator=est, node=node)
    assert calls and all(isinstance(s, int) for s in calls)
    assert _interp(points, 1 << 30) == pytest.approx(1e3 + (1 << 30) * 1e-3, rel=1e-6)
    with hardware_context(H100):
        small = comm_analysis.estimate_nccl_collective_runtime_impl(
            1000, WORLD, NCCL_COLL.ALL_GATHER
        )
    assert _interp(points, 1000) == pytest.approx(small * 1e6, rel=0.01)
    with pytest.raises(ValueError, match="unknown collective kind 'broadcast'"):
        comm_curve_points("broadcast", 8, H100)


# --------------------------------------------------------------------------- compute
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_large_bf16_mm_is_flops_bound(device):
    m = n = k = 8192
    gm = _trace(torch.mm, ((m, k), torch.bfloat16), ((k, n), torch.bfloat16), device=device)
    mm = _one(gm, aten.mm.default)
    got = compute_runtimes_ns(gm, H100)[mm]
    expected = 2 * m * n * k / 989e12 * 1e9 + H100.kernel_launch_overhead_ns
    assert abs(got - expected) <= 1
    # b200: same formula with its own peak
    got_b = compute_runtimes_ns(gm, "b200")[mm]
    assert abs(got_b - (2 * m * n * k / 2250e12 * 1e9 + 2000)) <= 1


def test_small_mm_is_bandwidth_bound():
    gm = _trace(torch.mm, ((4096, 64), torch.bfloat16), ((64, 4096), torch.bfloat16))
    mm = _one(gm, aten.mm.default)
    traffic = (4096 * 64 * 2 + 4096 * 4096) * 2  # 10.3 us of HBM vs 2.2 us of FLOPs
    assert 2 * 4096 * 4096 * 64 / 989e3 < traffic / 3350.0
    assert compute_runtimes_ns(gm, H100)[mm] == round(traffic / 3350.0) + 2000
    # fp32 (no tf32): 67 TFLOP/s makes the same shape FLOP-bound.
    gm32 = _trace(torch.mm, ((4096, 64), torch.float32), ((64, 4096), torch.float32))
    got32 = compute_runtimes_ns(gm32, H100)[_one(gm32, aten.mm.default)]
    assert abs(got32 - (2 * 4096 * 4096 * 64 / 67e3 + 2000)) <= 1


def test_pointwise_add_costs_bytes_over_bandwidth():
    n = 1 << 24
    gm = _trace(torch.add, ((n,), torch.float32), ((n,), torch.float32))
    add = _one(gm, aten.add.Tensor)
    expected = round(3 * n * 4 / 3350.0) + H100.kernel_launch_overhead_ns
    assert compute_runtimes_ns(gm, H100)[add] == expected
    assert compute_runtimes_ns(gm, "a100")[add] == round(3 * n * 4 / 2039.0) + 2000


def test_pointwise_chain_fused_vs_unfused():
    n = 1 << 24

    def chain(x):
        return ((x + 1.0).relu() * 2.0).view(-1, 16)

    gm = _trace(chain, ((n,), torch.bfloat16))
    fused = compute_runtimes_ns(gm, H100, fuse=True)
    unfused = compute_runtimes_ns(gm, H100, fuse=False)
    overhead = H100.kernel_launch_overhead_ns
    per_op = round(2 * n * 2 / 3350.0)  # each op reads and writes n bf16
    assert unfused[_one(gm, aten.view.default)] == 0
    assert sum(unfused.values()) == 3 * (per_op + overhead)
    # Fused: one kernel reading x once and writing the result once.
    assert abs(sum(fused.values()) - (2 * n * 2 / 3350.0 + overhead)) <= 1
    assert sum(fused.values()) < sum(unfused.values()) / 2
    assert _one(gm, aten.view.default) in fused and fused[_one(gm, aten.view.default)] == 0


def test_compute_nodes_set_and_zero_costs(group_name):
    def fn(x, w):
        ag = c10d.wait_tensor(c10d.all_gather_into_tensor(x, WORLD, group_name))
        buf = torch.empty(8, device=x.device)
        h = ag @ w
        a, b = torch.split(h, 64)
        return a.t(), b, buf, h.size(0) * 3

    gm = _trace(fn, ((16, 32), torch.float32), ((32, 64), torch.float32), symbolic=True)
    res = compute_runtimes_ns(gm, H100)
    names = {n.name for n in res}
    assert {"sym_size_int", "mul", "split", "getitem", "t", "empty"} <= names
    assert "all_gather_into_tensor" not in names and "wait_tensor" not in names
    assert "x_1" not in names and "mm" in names
    for n, v in res.items():
        if n.target in (aten.split.Tensor, operator.getitem, aten.t.default,
                        aten.empty.memory_format, aten.sym_size.int, operator.mul):
            assert v == 0, n
    assert all(isinstance(v, int) and v >= 0 for v in res.values())


def test_estimator_override_wins(group_name):
    def fn(x, w):
        h = x @ w
        return c10d.wait_tensor(c10d.all_reduce(h + 1, "sum", group_name))

    gm = _trace(fn, ((256, 256), torch.bfloat16), ((256, 256), torch.bfloat16))
    mm = _one(gm, aten.mm.default)
    add = _one(gm, aten.add.Tensor)
    ar = _one(gm, c10d.all_reduce.default)
    seen: list[tuple[str, int | None]] = []

    def est(node, size):
        seen.append((node.name, size))
        return {"mm": 0.5, "all_reduce": 0.25}.get(node.name)

    res = compute_runtimes_ns(gm, H100, estimator=est)
    assert res[mm] == 500_000
    assert res[add] == compute_runtimes_ns(gm, H100)[add]  # None -> model
    assert ("mm", None) in seen
    assert collective_runtime_ns(ar, WORLD, H100, estimator=est) == 250_000
    assert collective_runtime_ns(ar, WORLD, H100, estimator=lambda n, s: None) == (
        collective_runtime_ns(ar, WORLD, H100)
    )
    with pytest.raises(ValueError, match=r"estimator returned an invalid runtime -1.*'mm'"):
        compute_runtimes_ns(gm, H100, estimator=lambda n, s: -1.0 if n is mm else None)


def test_unsupported_things_name_the_node(group_name):
    def bcast(x):
        return c10d.wait_tensor(c10d.broadcast(x + 1, 0, group_name))

    gm = _trace(bcast, ((64,), torch.float32))
    with pytest.raises(ValueError, match=r"node 'broadcast' .*communication op"):
        compute_runtimes_ns(gm, H100)

    traced = fx.symbolic_trace(lambda a, b: torch.relu(a @ b))  # no meta['val']
    with pytest.raises(ValueError, match=r"node 'matmul' .*no meta\['val'\]"):
        compute_runtimes_ns(traced, H100)

    fake = FakeTensorMode()
    FakeTensorProp(traced, fake).propagate(
        fake.from_tensor(torch.empty(4, 4)), fake.from_tensor(torch.empty(4, 4))
    )
    with pytest.raises(ValueError, match=r"node 'matmul' .*non-ATen target"):
        compute_runtimes_ns(traced, H100)

    gm_int = _trace(torch.mm, ((64, 64), torch.int64), ((64, 64), torch.int64))
    with pytest.raises(ValueError, match=r"node 'mm'.*no peak TFLOP/s for dtype 'int64'"):
        compute_runtimes_ns(gm_int, H100)
