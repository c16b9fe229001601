"""Extraction pass: a post-grad FX graph -> a :class:`ScheduleProblem` plus the map back to nodes.

Entry point: :func:`extract_problem`. Each ``call_function`` node becomes one op named after
the node. Placeholders and ``get_attr`` nodes become input storages. Storages are tracked with
torch's ``GraphAliasTracker`` (``fx_passes/memory_estimator.py``) with two corrections:
every device counts (its default profile drops CPU tensors, and our zoo may trace on CPU), and
``wait_tensor``'s output, which fake-tensor propagation gives a fresh storage, aliases the
collective's output (the real op returns the same buffer).

A coalesced collective has several ``wait_tensor`` nodes (one per output); the first in
program order becomes the collective's wait, the others zero-cost ops after it.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._inductor.fx_passes.memory_estimator import GraphAliasTracker, StorageKey

from ..solver.problem import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProcessGroup,
    ScheduleProblem,
    Storage,
)
from .costs import (
    Estimator,
    collective_kind,
    collective_runtime_ns,
    comm_curve_points,
    compute_runtimes_ns,
    is_heavy,
    is_view_like,
)
from .hardware import HardwareProfile, get_profile

log = logging.getLogger(__name__)

META_KEY = "fxsched"  # per-node results live in node.meta["fxsched"]
_WAIT = torch.ops._c10d_functional.wait_tensor.default


class ExtractionError(ValueError):
    """The graph cannot be turned into a problem; the message names the node."""


@dataclass
class Extraction:
    """The problem and, for each op name, the FX node it came from."""

    problem: ScheduleProblem
    nodes: dict[str, fx.Node]
    graph_module: fx.GraphModule


def is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is _WAIT


def is_parameter_default(node: fx.Node) -> bool:
    """AOTAutograd names parameters (and forward inputs) ``primals_*``; as torch's MemoryTracker does,
    treat them as never freed."""
    return node.name.startswith("primals")


def extract_problem(
    gm: fx.GraphModule,
    *,
    groups: Mapping[str, int | ProcessGroup] | None = None,
    profile: str | HardwareProfile = "h100",
    fuse: bool = True,
    estimator: Estimator | None = None,
    is_parameter: Callable[[fx.Node], bool] = is_parameter_default,
    name: str = "graph",
) -> Extraction:
    """Build the scheduling problem of ``gm`` (original program order = graph order).

    ``groups`` maps each process-group name to its size (or a ProcessGroup); groups not given are
    resolved from the live c10d registry. ``estimator`` follows Inductor's
    ``custom_runtime_estimation`` contract and overrides any node it prices.
    """
    hw = get_profile(profile)
    graph = gm.graph
    nodes = list(graph.nodes)
    _check_nodes(nodes)
    tracker = GraphAliasTracker(nodes)
    canon = _canonical_storages(nodes, tracker)
    runtimes = compute_runtimes_ns(gm, hw, fuse=fuse, estimator=estimator)
    pgs = _resolve_groups(nodes, groups)

    storage_names: dict[StorageKey, str] = {}
    per_node: dict[str, int] = {}
    storages: list[Storage] = []
    output_storages = set()
    for node in nodes:
        if node.op == "output":
            output_storages = {canon.get(k, k) for k in tracker.get_storage_uses(node)}

    def new_storage(key: StorageKey, node: fx.Node, is_input: bool, never_freed: bool) -> str:
        count = per_node.get(node.name, 0)
        per_node[node.name] = count + 1
        sname = node.name if count == 0 else f"{node.name}#{count}"
        storage_names[key] = sname
        storages.append(Storage(sname, int(key.storage.nbytes()), is_input=is_input,
                                never_freed=never_freed or key in output_storages))
        return sname

    by_name = {n.name: n for n in nodes}
    first_wait: dict[fx.Node, fx.Node] = {}
    ops: list[Op] = []
    for node in nodes:
        if node.op in ("placeholder", "get_attr"):
            for k in tracker.get_fresh_allocations(node):
                if canon.get(k, k) == k:
                    new_storage(k, node, True, node.op == "get_attr" or is_parameter(node))
            continue
        if node.op == "output":
            continue
        allocates = tuple(
            new_storage(k, node, False, False)
            for k in tracker.get_fresh_allocations(node) if canon.get(k, k) == k
        )
        uses = tuple(dict.fromkeys(storage_names[canon.get(k, k)] for k in tracker.get_storage_uses(node)))
        deps = tuple(dict.fromkeys(d.name for d in node.all_input_nodes if d.op == "call_function"))
        module = _module_of(node)
        kind = collective_kind(node)
        if kind is not None:
            info = _collective_info(node, kind, pgs)
            op = Op(node.name, OpKind.COLLECTIVE,
                    collective_runtime_ns(node, pgs[info.group].size, hw, estimator),
                    deps, allocates, uses, collective=info, target=_target_name(node), module=module)
        elif is_wait(node):
            coll = _collective_of_wait(node)
            if coll not in first_wait:
                first_wait[coll] = node
                op = Op(node.name, OpKind.WAIT, 0, tuple(dict.fromkeys((coll.name, *deps))), allocates, uses,
                        waits_on=coll.name, target=_target_name(node), module=module)
            else:  # a further wait on a coalesced collective: free once the first wait is done
                op = Op(node.name, OpKind.ZERO, 0, tuple(dict.fromkeys((first_wait[coll].name, *deps))),
                        (), uses, target=_target_name(node), module=module)
        else:
            rt = runtimes.get(node, 0)
            zero = rt == 0 and not allocates and (is_view_like(node) or node.target is operator.getitem)
            op = Op(node.name, OpKind.ZERO if zero else OpKind.COMPUTE, 0 if zero else rt, deps,
                    allocates, uses, heavy=is_heavy(node), target=_target_name(node), module=module)
        ops.append(op)

    curves = []
    representative: dict[tuple[str, CollectiveKind], fx.Node] = {}
    for op in ops:
        if op.collective is not None:
            representative.setdefault((op.collective.group, op.collective.kind), by_name[op.name])
    for (gname, ckind), rep in representative.items():
        pts = comm_curve_points(ckind.value, pgs[gname].size, hw, estimator, rep if estimator else None)
        curves.append(CommCurve(gname, ckind, tuple(pts)))

    used_groups = {op.collective.group for op in ops if op.collective is not None}
    problem = ScheduleProblem(
        ops=tuple(ops),
        storages=tuple(storages),
        groups=tuple(pgs[g] for g in sorted(used_groups)),
        comm_curves=tuple(curves),
        bucket_costs=BucketCosts(hw.memory_bandwidth_gbps, hw.kernel_launch_overhead_ns),
        name=name,
        metadata={"profile": hw.name, "fuse": str(fuse), "estimator": "custom" if estimator else "analytical"},
    )
    for op in ops:
        by_name[op.name].meta.setdefault(META_KEY, {})["op_kind"] = op.kind.value
        by_name[op.name].meta[META_KEY]["runtime_ns"] = op.runtime_ns
    log.info("extracted %s: %d ops, %d collectives, %d storages", name, len(ops),
             len(problem.collectives), len(storages))
    return Extraction(problem, {op.name: by_name[op.name] for op in ops}, gm)


def _check_nodes(nodes: list[fx.Node]) -> None:
    """Reject what the problem cannot represent, naming the node."""
    for node in nodes:
        if node.op in ("call_module", "call_method"):
            raise ExtractionError(f"node {node.name!r}: unsupported op kind {node.op!r} (expected a post-grad ATen graph)")
        if node.op in ("placeholder", "call_function", "get_attr") and "val" not in node.meta:
            raise ExtractionError(f"node {node.name!r}: missing meta['val'] (run FakeTensorProp first)")
        if node.op != "call_function":
            continue
        ns = getattr(node.target, "namespace", None)
        if ns in ("_c10d_functional", "c10d", "_dtensor") and collective_kind(node) is None and not is_wait(node):
            raise ExtractionError(f"node {node.name!r}: unsupported collective {node.target}")
        if is_wait(node):
            _collective_of_wait(node)


def _collective_of_wait(node: fx.Node) -> fx.Node:
    """The collective ``node`` waits on (directly or through getitem of a coalesced collective)."""
    arg = node.args[0] if node.args else None
    if isinstance(arg, fx.Node) and arg.target is operator.getitem:
        arg = arg.args[0]
    if not isinstance(arg, fx.Node) or collective_kind(arg) is None:
        raise ExtractionError(f"wait {node.name!r}: does not wait on a collective (its input is {arg})")
    return arg


def _canonical_storages(nodes: list[fx.Node], tracker: GraphAliasTracker) -> dict[StorageKey, StorageKey]:
    """Map each wait_tensor output storage to the collective output storage it really is."""
    canon: dict[StorageKey, StorageKey] = {}
    for node in nodes:
        if not is_wait(node):
            continue
        src = node.args[0]
        assert isinstance(src, fx.Node)
        fresh = list(tracker.get_fresh_allocations(node))
        base = list(tracker.node_to_output_storages[src])
        if len(fresh) == 1 and len(base) == 1:
            canon[fresh[0]] = canon.get(base[0], base[0])
        elif fresh:
            raise ExtractionError(f"wait {node.name!r}: cannot match its output storage to {src.name!r}")
    return canon


def _resolve_groups(nodes: list[fx.Node], groups: Mapping[str, int | ProcessGroup] | None) -> dict[str, ProcessGroup]:
    out: dict[str, ProcessGroup] = {}
    for node in nodes:
        if node.op != "call_function" or collective_kind(node) is None:
            continue
        gname = _group_name(node)
        if gname in out:
            continue
        given = (groups or {}).get(gname)
        if isinstance(given, ProcessGroup):
            out[gname] = given
        elif given is not None:
            out[gname] = ProcessGroup(gname, int(given))
        else:
            out[gname] = _live_group(gname, node)
    return out


def _live_group(gname: str, node: fx.Node) -> ProcessGroup:
    from torch.distributed import distributed_c10d as c10d

    try:
        pg = c10d._resolve_process_group(gname)
        return ProcessGroup(gname, pg.size(), tuple(c10d.get_process_group_ranks(pg)))
    except Exception as e:  # noqa: BLE001 - any failure means: the caller must say the size
        raise ExtractionError(
            f"collective {node.name!r}: process group {gname!r} is not live and its size was not given "
            f"(pass groups={{{gname!r}: size}}): {e}"
        ) from e


def _resolve_group_name(group_name: Any) -> str:
    """bucketing.py's ``_resolve_group_name`` where torch has it (a group given as an FX node,
    as compile-on-one-rank graphs do); torch before 2.13 takes only strings."""
    from torch._inductor.fx_passes import bucketing

    resolve = getattr(bucketing, "_resolve_group_name", None)
    return str(resolve(group_name) if resolve is not None else group_name)


def _group_name(node: fx.Node) -> str:
    from torch.fx.operator_schemas import normalize_function

    norm = normalize_function(node.target, args=node.args, kwargs=node.kwargs,  # type: ignore[arg-type]
                              normalize_to_only_use_kwargs=True)
    if norm is None or "group_name" not in norm[1]:
        raise ExtractionError(f"collective {node.name!r}: cannot find its group_name argument")
    return str(_resolve_group_name(norm[1]["group_name"]))


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _collective_info(node: fx.Node, kind: str, pgs: Mapping[str, ProcessGroup]) -> CollectiveInfo:
    gname = _group_name(node)
    ins = [t for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
    outs = _tensors(node.meta.get("val"))
    if not ins or not outs:
        raise ExtractionError(f"collective {node.name!r}: no tensor input or output in meta['val']")
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in ins})
    reduce_op = None
    if kind in ("reduce_scatter", "all_reduce"):
        reduce_op = next((str(a) for a in node.args if isinstance(a, str) and a != gname), None)
    nbytes = lambda ts: sum(int(t.numel()) * t.element_size() for t in ts)  # noqa: E731
    return CollectiveInfo(
        kind=CollectiveKind(kind), group=gname, dtype="+".join(dtypes),
        bytes_in=nbytes(ins), bytes_out=nbytes(outs), reduce_op=reduce_op,
    )


def _module_of(node: fx.Node) -> str | None:
    """The innermost module FQN of a node (backward nodes carry their forward's stack)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    last = list(stack.values())[-1]
    return last[0] if isinstance(last, tuple) else str(last)


def _target_name(node: fx.Node) -> str:
    t = node.target
    return t.name() if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))
