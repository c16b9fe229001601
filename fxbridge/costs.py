"""Runtime estimates for fx nodes: collectives (NCCL model) and compute (roofline).

Everything here is torch's own estimators evaluated under
:func:`fxsched.fxbridge.hardware.hardware_context`, so it runs on a CPU-only machine
without triton, on graphs whose ``meta["val"]`` fake tensors are on cpu or (fake) cuda:

* collectives: ``comm_analysis.estimate_nccl_collective_runtime_impl`` on
  ``comm_analysis.estimate_fx_collective_size`` bytes (input + output, as torch does);
* compute: ``overlap_scheduling.estimate_roofline_runtime_ms`` (max of FLOP time and
  HBM-bytes time); with ``fuse=True`` the pointwise chains Inductor fuses are priced by
  ``fusion_regions.build_fusion_regions`` + ``estimate_fused_node_costs`` (each region's
  external I/O once), as ``gather_node_runtime_estimations(enable_fusion_regions=True)``.

Kernel launch overhead: ``profile.kernel_launch_overhead_ns`` is added once per kernel
Inductor would launch: once per unfused non-view node that produces a tensor, and once
per fused region (on its first non-view member, which also carries the cost of the
region's view members, so views stay at 0). Allocation-only ops (``aten.empty``...) and
ops producing no tensor cost 0 and launch nothing. An ``Estimator`` value is the node's
whole runtime: nothing is added to it.

All results are integer nanoseconds.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
from collections.abc import Callable

import torch
import torch.fx as fx
from torch._inductor import comm_analysis
from torch._inductor.comm_analysis import NCCL_COLL
from torch._inductor.fx_passes import fusion_regions, overlap_scheduling
from torch.utils._ordered_set import OrderedSet

from .hardware import HardwareProfile, get_profile, hardware_context

log = logging.getLogger(__name__)

__all__ = [
    "Estimator",
    "COLLECTIVE_KINDS",
    "is_view_like",
    "is_heavy",
    "collective_kind",
    "collective_size_bytes",
    "collective_runtime_ns",
    "comm_curve_points",
    "compute_runtimes_ns",
]

# Inductor's custom_runtime_estimation contract: (node, override_size_bytes) -> ms | None.
Estimator = Callable[[fx.Node, int | None], float | None]

COLLECTIVE_KINDS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
_KIND_OF_COLL = {
    NCCL_COLL.ALL_GATHER: "all_gather",
    NCCL_COLL.REDUCE_SCATTER: "reduce_scatter",
    NCCL_COLL.ALL_REDUCE: "all_reduce",
    NCCL_COLL.ALL_TO_ALL: "all_to_all",
}
_COLL_OF_KIND = {v: k for k, v in _KIND_OF_COLL.items()}

_aten = torch.ops.aten
_prims = torch.ops.prims
_COMM_NAMESPACES = ("_c10d_functional", "c10d", "_c10d_functional_autograd", "_dtensor")

# Zero-cost ops that fusion_regions.is_view_node (schema-aliasing aten/prims ops) misses.
_ZERO_COST_PACKETS = {
    _aten.alias,
    _aten._unsafe_view,  # reshape of a contiguous tensor: no copy in Inductor
    _aten.detach,
    _aten.lift_fresh,
    _prims.view_of,
    _aten.sym_size,
    _aten.sym_stride,
    _aten.sym_numel,
    _aten.sym_storage_offset,
    _aten._assert_scalar,
    _aten._assert_tensor_metadata,
    _aten.sym_constrain_range,
    _aten.sym_constrain_range_for_size,
}
# Allocate without launching a kernel (not views: they own fresh storage).
_ALLOC_ONLY_PACKETS = {
    _aten.empty,
    _aten.empty_strided,
    _aten.empty_like,
    _aten.new_empty,
    _aten.new_empty_strided,
    _aten.empty_permuted,
}
_SYMBOLIC_MODULES = ("_operator", "operator", "math", "builtins")
_SCALAR_TYPES = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _target_str(node: fx.Node) -> str:
    return getattr(node.target, "__name__", None) or str(node.target)


def _describe(node: fx.Node) -> str:
    return f"node {node.name!r} ({node.op} {_target_str(node)})"


def _packet(target: object) -> object:
    return getattr(target, "overloadpacket", target)


def _has_tensor(val: object) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, (list, tuple)):
        return any(_has_tensor(v) for v in val)
    if isinstance(val, dict):
        return any(_has_tensor(v) for v in val.values())
    return False


def is_view_like(node: fx.Node) -> bool:
    """True for views, getitem, and other zero-cost metadata / symbolic-shape ops."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem or fusion_regions.is_view_node(node):
        return True
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket in _ZERO_COST_PACKETS
    if getattr(target, "__module__", None) in _SYMBOLIC_MODULES or target in (
        torch.sym_int,
        torch.sym_float,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
        torch.sym_ite,
    ):
        # SymInt arithmetic on sizes (operator.mul, sym_max...): scalar-valued only.
        return isinstance(node.meta.get("val"), _SCALAR_TYPES)
    return False


def is_heavy(node: fx.Node) -> bool:
    """FLOP-heavy compute (mm, conv, attention...): torch's ``is_compute_node``."""
    return node.op == "call_function" and overlap_scheduling.is_compute_node(node)


def _is_comm_op(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.namespace in _COMM_NAMESPACES


def _is_wait(node: fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace in ("_c10d_functional", "_c10d_functional_autograd")
        and target._opname == "wait_tensor"
    )


def collective_kind(node: fx.Node) -> str | None:
    """Kind of a ``_c10d_functional`` collective (incl. in-place/_out/coalesced), else None."""
    if node.op != "call_function":
        return None
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "_c10d_functional":
        return None
    coll = comm_analysis.get_collective_type_from_kernel_name(target.name())
    return _KIND_OF_COLL.get(coll)


def _require_kind(node: fx.Node) -> str:
    kind = collective_kind(node)
    if kind is None:
        raise ValueError(
            f"{_describe(node)} is not a supported collective; supported: "
            "_c10d_functional all_gather_into_tensor(_out/_coalesced), "
            "reduce_scatter_tensor(_out/_coalesced), all_reduce(_)(_coalesced(_)), "
            "all_to_all_single"
        )
    return kind


def collective_size_bytes(node: fx.Node) -> int:
    """Input + output bytes of a collective (``comm_analysis.estimate_fx_collective_size``)."""
    _require_kind(node)
    size = int(comm_analysis.estimate_fx_collective_size(node))
    if size == 0 and not _has_tensor(node.meta.get("val")):
        raise ValueError(
            f"{_describe(node)} has no tensor meta['val']; trace the graph with make_fx "
            "under FakeTensorMode (or run FakeTensorProp) first"
        )
    return size


def _ms_to_ns(ms: float, node: fx.Node | None, source: str) -> int:
    value = float(ms)
    if not math.isfinite(value) or value < 0:
        where = _describe(node) if node is not None else "comm curve"
        raise ValueError(f"{source} returned an invalid runtime {ms!r} ms for {where}")
    return int(round(value * 1e6))


def _check_group_size(group_size: int) -> int:
    if int(group_size) != group_size or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    return int(group_size)


def collective_runtime_ns(
    node: fx.Node,
    group_size: int,
    profile: HardwareProfile | str,
    estimator: Estimator | None = None,
) -> int:
    """Runtime of one collective: ``estimator(node, None)`` if it answers, else NCCL model."""
    kind = _require_kind(node)
    group_size = _check_group_size(group_size)
    if estimator is not None:
        est = estimator(node, None)
        if est is not None:
            return _ms_to_ns(est, node, "estimator")
    size = collective_size_bytes(node)
    with hardware_context(get_profile(profile)):
        ms = comm_analysis.estimate_nccl_collective_runtime_impl(
            size, group_size, _COLL_OF_KIND[kind]
        )
    return _ms_to_ns(ms, node, "comm_analysis")


# ----------------------------------------------------------------------------------------
# Piecewise-linear comm curves
# ----------------------------------------------------------------------------------------
_CURVE_MAX_BYTES = 64 << 30
_CURVE_REL_TOL = 0.002  # per-probe tolerance; concavity bounds the max gap to ~2x this
_CURVE_MAX_POINTS = 20_000


def _analytic_ms(kind: str, group_size: int, size: int) -> float:
    # Caller holds hardware_context.
    return float(
        comm_analysis.estimate_nccl_collective_runtime_impl(size, group_size, _COLL_OF_KIND[kind])
    )


def _build_curve(f: Callable[[int], float]) -> tuple[tuple[int, int], ...]:
    """Adaptive breakpoints of ``f`` (ns) on [0, 64 GiB].

    comm_analysis' model is, between jumps, a minimum over (algo, proto) of concave
    functions of the size (linear, or ``n**0.83`` with the IB multi-rail factor), hence
    concave: an interval whose chord matches ``f`` at 1/4, 1/2, 3/4 within tol is within
    ~2*tol everywhere. The only jumps are the tree correction factor's log2 buckets at
    ``64 * 2**k`` bytes; both sides of each are seeded so no chord spans a jump.
    """
    seeds = {0, _CURVE_MAX_BYTES}
    seeds.update(1 << k for k in range(37))
    for k in range(25):
        seeds.update(((64 << k) - 1, 64 << k))
    values: dict[int, float] = {s: f(s) for s in sorted(s for s in seeds if s <= _CURVE_MAX_BYTES)}
    points = sorted(values)
    stack = list(zip(points, points[1:]))
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        fa, fb = values[a], values[b]
        bad = False
        for p in sorted({a + (b - a) // 4, a + (b - a) // 2, a + 3 * (b - a) // 4} - {a, b}):
            fp = values.get(p)
            if fp is None:
                fp = values[p] = f(p)
            interp = fa + (fb - fa) * (p - a) / (b - a)
            if abs(interp - fp) > _CURVE_REL_TOL * max(abs(fp), 1e-9):
                bad = True
        if bad:
            if len(values) > _CURVE_MAX_POINTS:
                log.warning("comm curve: %d samples, stopping refinement", len(values))
                break
            mid = a + (b - a) // 2
            stack.extend(((a, mid), (mid, b)))
    # Keep only breakpoints: drop samples while every sample dropped since the last kept
    # point stays on the chord from that point to the next sample.
    xs = sorted(values)
    kept, dropped = [xs[0]], []
    for i in range(1, len(xs) - 1):
        a, b = kept[-1], xs[i + 1]
        slope = (values[b] - values[a]) / (b - a)
        if all(
            abs(values[a] + slope * (q - a) - values[q])
            <= 0.25 * _CURVE_REL_TOL * max(abs(values[q]), 1e-9)
            for q in (*dropped, xs[i])
        ):
            dropped.append(xs[i])
        else:
            kept.append(xs[i])
            dropped = []
    kept.append(xs[-1])
    return tuple((x, int(round(values[x]))) for x in kept)


@functools.lru_cache(maxsize=256)
def _analytic_curve(
    kind: str, group_size: int, profile: HardwareProfile
) -> tuple[tuple[int, int], ...]:
    with hardware_context(profile):
        return _build_curve(lambda n: _analytic_ms(kind, group_size, n) * 1e6)


def comm_curve_points(
    kind: str,
    group_size: int,
    profile: HardwareProfile | str,
    estimator: Estimator | None = None,
    node: fx.Node | None = None,
) -> tuple[tuple[int, int], ...]:
    """(size_bytes, runtime_ns) breakpoints, sizes strictly increasing from 0 to 64 GiB.

    Linear interpolation is within 1% of comm_analysis for sizes >= 64 KiB. With both
    ``estimator`` and ``node``, ``estimator(node, size)`` is sampled instead
    (comm_analysis where it returns None). Sizes are collective_size_bytes units.
    """
    if kind not in _COLL_OF_KIND:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {COLLECTIVE_KINDS}")
    group_size = _check_group_size(group_size)
    profile = get_profile(profile)
    if estimator is None or node is None:
        return _analytic_curve(kind, group_size, profile)

    def f(size: int) -> float:
        est = estimator(node, size)
        if est is not None:
            return float(_ms_to_ns(est, node, "estimator"))
        return _analytic_ms(kind, group_size, size) * 1e6

    with hardware_context(profile):
        return _build_curve(f)


# ----------------------------------------------------------------------------------------
# Compute
# ----------------------------------------------------------------------------------------
def _check_computable(node: fx.Node) -> None:
    if _is_comm_op(node):
        raise ValueError(
            f"{_describe(node)} is a communication op that fxsched does not support "
            f"(collectives: {COLLECTIVE_KINDS} in torch.ops._c10d_functional, plus wait_tensor)"
        )
    if "val" not in node.meta:
        raise ValueError(
            f"{_describe(node)} has no meta['val']; trace the graph with make_fx under "
            "FakeTensorMode (or run FakeTensorProp) first"
        )
    target = node.target
    if _has_tensor(node.meta["val"]) and not isinstance(
        target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
    ):
        raise ValueError(
            f"{_describe(node)} computes a tensor with a non-ATen target; compute costs need "
            "an ATen-level graph (make_fx / Inductor post-grad), where FLOPs are countable"
        )


def _launches_kernel(node: fx.Node) -> bool:
    return _packet(node.target) not in _ALLOC_ONLY_PACKETS and _has_tensor(node.meta.get("val"))


def _old_torch_roofline_ms(node: fx.Node) -> float:
    """torch 2.13's ``estimate_roofline_runtime_ms`` for a torch without it: the max of the
    FLOP time and the transfer time of ``torch.utils._runtime_estimation`` (ms)."""
    from torch.utils._pytree import tree_flatten, tree_map
    from torch.utils._runtime_estimation import get_compute_time, get_transfer_time

    if fusion_regions.is_view_node(node):
        return 0.0
    val = lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a  # noqa: E731
    args, kwargs, out = tree_map(val, node.args), tree_map(val, node.kwargs), node.meta.get("val")
    if out is None:
        return 0.0
    flat_in, _ = tree_flatten((args, kwargs))
    flat_out, _ = tree_flatten(out)
    dtypes = [t.dtype for t in flat_out if isinstance(t, torch.Tensor)]
    compute_ns = get_compute_time(_packet(node.target), args, kwargs, out, {dtypes[0]}) if dtypes else 0.0
    return max(float(compute_ns), float(get_transfer_time(flat_in, flat_out))) / 1e6


def _roofline_ms(node: fx.Node) -> float:
    estimate = getattr(overlap_scheduling, "estimate_roofline_runtime_ms", _old_torch_roofline_ms)
    try:
        return float(estimate(node))
    except Exception as e:  # flop formulas / dtype lookups: re-raise naming the node
        raise ValueError(f"cannot estimate the runtime of {_describe(node)}: {e}") from e


def compute_runtimes_ns(
    gm: fx.GraphModule,
    profile: HardwareProfile | str,
    *,
    fuse: bool = True,
    estimator: Estimator | None = None,
) -> dict[fx.Node, int]:
    """Runtime (ns) of every call_function node that is not a collective or wait_tensor.

    View-like nodes cost 0; others the roofline plus launch overhead (see module doc);
    with ``fuse`` Inductor's pointwise fusion regions are charged their external I/O once.
    ``estimator(node, None)``, when not None, replaces a node's cost (ms), fused or not
    (unlike ``gather_node_runtime_estimations``, where fused costs overwrite it).
    """
    profile = get_profile(profile)
    overhead = int(profile.kernel_launch_overhead_ns)
    nodes = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and collective_kind(n) is None and not _is_wait(n)
    ]
    result: dict[fx.Node, int] = {}
    with hardware_context(profile):
        overrides: dict[fx.Node, int] = {}
        if estimator is not None:
            for n in nodes:
                est = estimator(n, None)
                if est is not None:
                    overrides[n] = _ms_to_ns(est, n, "estimator")
        for n in nodes:
            if n not in overrides and not is_view_like(n):
                _check_computable(n)

        region_of: dict[fx.Node, OrderedSet[fx.Node]] = {}
        fused_ms: dict[fx.Node, float] = {}
        if fuse and not hasattr(fusion_regions, "estimate_fused_node_costs"):
            # torch before 2.13 prices fusion regions only by collapsing the graph into
            # subgraph modules; pricing each node alone over-charges pointwise chains.
            log.warning("torch %s has no fusion_regions.estimate_fused_node_costs: pointwise "
                        "fusion is not priced, each node pays its own I/O", torch.__version__)
            fuse = False
        if fuse:
            region_of = fusion_regions.build_fusion_regions(gm)
            if region_of:
                fused_ms = fusion_regions.estimate_fused_node_costs(region_of)

        # One kernel per fused region: its first non-view member ("lead") carries the
        # launch overhead and the I/O torch attributed to the region's view members.
        lead_extra_ms: dict[fx.Node, float] = {}
        seen: set[int] = set()
        for members in region_of.values():
            if id(members) in seen:
                continue
            seen.add(id(members))
            members_list = list(members)
            lead = next((m for m in members_list if not is_view_like(m)), members_list[0])
            lead_extra_ms[lead] = sum(
                fused_ms.get(m, 0.0) for m in members_list if m is not lead and is_view_like(m)
            )

        for n in nodes:
            if n in overrides:
                result[n] = overrides[n]
            elif n in region_of:
                if n in lead_extra_ms:
                    ms = fused_ms.get(n, 0.0) + lead_extra_ms[n]
                    result[n] = _ms_to_ns(ms, n, "fusion_regions") + overhead
                elif is_view_like(n):
                    result[n] = 0
                else:
                    result[n] = _ms_to_ns(fused_ms.get(n, 0.0), n, "fusion_regions")
            elif is_view_like(n) or not _launches_kernel(n):
                result[n] = 0
            else:
                result[n] = _ms_to_ns(_roofline_ms(n), n, "roofline") + overhead
    return result
