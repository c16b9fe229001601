"""Trace a zoo config into AOTAutograd forward/backward ATen graphs on CPU.

Steps of :func:`build_graphs`:

1. (Re)initialize a fake process group (``FakeStore``) of ``world_size`` ranks, rank 0,
   and build the device meshes. Process-group names come from c10d's group counter,
   which ``destroy_process_group()`` resets, so names are deterministic per config.
2. Trace the functional training step (:mod:`.llama`) with ``aot_function``, Inductor's
   decomposition table and the min-cut partitioner. Before partitioning, the FSDP
   parameter path (view/cast -> ``all_gather_into_tensor`` -> ``wait_tensor`` -> views) is
   tagged ``MUST_RECOMPUTE`` like SimpleFSDP's selective-checkpoint policy, so the
   backward re-gathers parameters (reshard after forward) instead of saving them.
3. Retarget the graphs to CUDA (:mod:`.retarget`) and re-propagate ``meta["val"]``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .config import GroupInfo, ZooConfig, ZooGraph
from .llama import Parallel, make_inputs, make_step, param_module_stack, param_specs
from .retarget import retarget_to_cuda

logger = logging.getLogger(__name__)

C10D = torch.ops._c10d_functional
COLLECTIVE_OPS: tuple[Any, ...] = (
    C10D.all_gather_into_tensor.default,
    C10D.reduce_scatter_tensor.default,
    C10D.all_reduce.default,
    C10D.all_to_all_single.default,
)
_VIEW_OPS = {
    torch.ops.aten.view.default,
    torch.ops.aten._unsafe_view.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten.permute.default,
    torch.ops.aten.t.default,
    torch.ops.aten.slice.Tensor,
    torch.ops.aten.alias.default,
    torch.ops.aten.expand.default,
}
_CAST_OPS = {
    torch.ops.prims.convert_element_type.default,
    torch.ops.aten._to_copy.default,
}
_LOCK = threading.Lock()


def _ensure_process_group(world_size: int) -> None:
    """Make the default group a fresh fake group of ``world_size`` ranks (rank 0).

    An existing fake default group (from an earlier build) is destroyed first, which also
    resets c10d's group-name counter, so group names only depend on the config. A real
    (non-fake) default group is never touched: that raises ``RuntimeError``.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        backend = str(dist.get_backend())
        if backend != "fake":
            raise RuntimeError(
                f"a {backend!r} default process group is initialized; the graph zoo needs "
                "to own the default group (it traces with a fake process group)"
            )
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def activate_groups(config: ZooConfig) -> dict[str, GroupInfo]:
    """(Re)create the fake process groups of ``config`` without tracing.

    :func:`build_graphs` leaves the groups of its config alive, so that the group names in
    the graphs resolve (``torch.distributed.distributed_c10d._resolve_process_group``,
    which Inductor's collective cost estimator uses). After building another config, call
    this to make an earlier graph's names resolve again; the names are the same as at its
    build. Returns the rank-0 groups of the config's meshes.
    """
    with _LOCK:
        _ensure_process_group(config.world_size)
        _, meshes = _build_parallel(config)
        return _collect_groups(meshes)


def release_process_group() -> None:
    """Destroy the fake default process group left by :func:`build_graphs` (else no-op)."""
    with _LOCK:
        if dist.is_initialized() and str(dist.get_backend()) == "fake":
            dist.destroy_process_group()


def _build_parallel(cfg: ZooConfig) -> tuple[Parallel, list[DeviceMesh]]:
    """Meshes for the config, wrapped in a :class:`Parallel`; also returns the 1-D meshes."""
    if cfg.parallelism == "fsdp_tp":
        mesh = init_device_mesh(
            "cpu", (cfg.dp_size, cfg.tp_size), mesh_dim_names=("dp", "tp")
        )
        dp, tp = mesh["dp"], mesh["tp"]
        return Parallel(cfg, dp, tp, mesh), [dp, tp]
    mesh = init_device_mesh("cpu", (cfg.world_size,), mesh_dim_names=("dp",))
    return Parallel(cfg, mesh), [mesh]


def _collect_groups(meshes: list[DeviceMesh]) -> dict[str, GroupInfo]:
    groups: dict[str, GroupInfo] = {}
    for mesh in meshes:
        pg = mesh.get_group()
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
        groups[str(pg.group_name)] = GroupInfo(str(pg.group_name), pg.size(), ranks)
    return groups


def _is_single_input_passthrough(node: fx.Node) -> bool:
    return node.op == "call_function" and (node.target in _VIEW_OPS or node.target in _CAST_OPS)


def tag_fsdp_regather(joint: fx.GraphModule, num_params: int) -> int:
    """Mark the parameter all-gather paths of a joint graph ``MUST_RECOMPUTE``.

    A path is: parameter placeholder -> views/casts -> ``all_gather_into_tensor`` ->
    ``wait_tensor`` -> views (including an FSDP padding slice). Returns the number of
    all-gathers tagged.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    params = placeholders[:num_params]
    tagged = 0
    for param in params:
        frontier = list(param.users)
        chain: list[fx.Node] = []
        gather = None
        while frontier:
            node = frontier.pop()
            if node.target is C10D.all_gather_into_tensor.default:
                gather = node
                break
            if _is_single_input_passthrough(node) and len(node.users) == 1:
                chain.append(node)
                frontier.extend(node.users)
        if gather is None:
            continue
        path = [*chain, gather]
        waits = [u for u in gather.users if u.target is C10D.wait_tensor.default]
        stack = list(waits)
        while stack:
            node = stack.pop()
            path.append(node)
            stack.extend(u for u in node.users if _is_single_input_passthrough(u)
                         and u.target not in _CAST_OPS)
        for node in path:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            node.meta["ac_graph_id"] = 0
        tagged += 1
    return tagged


def annotate_grad_reductions(bw: fx.GraphModule, param_names: list[str]) -> int:
    """Give the gradient-reduction chains of ``bw`` the module stack of their parameter.

    AOTAutograd records the forward module of a backward node as
    ``meta["fwd_nn_module_stack"]`` (matched through autograd sequence numbers), which the
    DTensor redistribute backward (cast, reduce_scatter / all_reduce, wait, views) lacks.
    Walking back from each parameter gradient output through single-input nodes without
    that metadata, this tags them. Returns the number of nodes tagged.
    """
    outputs = bw.graph.output_node().args[0]
    if not isinstance(outputs, (tuple, list)):
        raise TypeError(f"backward output is {type(outputs)}, expected a tuple")
    tagged = 0
    for name, out in zip(param_names, outputs[: len(param_names)], strict=True):
        stack = param_module_stack(name)
        node = out
        while isinstance(node, fx.Node) and node.op == "call_function":
            if node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack"):
                break
            node.meta["fwd_nn_module_stack"] = dict(stack)
            tagged += 1
            inputs = [a for a in node.all_input_nodes]
            if len(inputs) != 1:
                break
            node = inputs[0]
    return tagged


def _partition_fn(num_params: int, regather: bool) -> Callable[..., Any]:
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        if regather:
            n = tag_fsdp_regather(joint, num_params)
            logger.debug("tagged %d parameter all-gathers for recompute", n)
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    return partition


def trace_step(cfg: ZooConfig) -> tuple[fx.GraphModule, fx.GraphModule, dict[str, GroupInfo]]:
    """Trace one training step on CPU; returns (forward, backward, groups).

    The fake process group is left initialized so that callers can resolve group names;
    the next call re-creates it.
    """
    from torch._functorch.aot_autograd import aot_function
    from torch._inductor.decomposition import select_decomp_table

    _ensure_process_group(cfg.world_size)
    par, meshes = _build_parallel(cfg)
    groups = _collect_groups(meshes)
    specs = param_specs(cfg)
    captured: dict[str, fx.GraphModule] = {}

    def fw_compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
        captured["forward"] = gm
        return _boxed(gm)

    def bw_compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
        captured["backward"] = gm
        return _boxed(gm)

    compiled = aot_function(
        make_step(cfg, par, specs),
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler,
        partition_fn=_partition_fn(len(specs), cfg.parallelism != "ddp"),
        decompositions=select_decomp_table(),
    )
    # Run on FakeTensors: AOTAutograd reuses the ambient fake mode, and the compiled
    # forward/backward then execute on fake tensors (no real compute).
    with FakeTensorMode(allow_non_fake_inputs=False):
        inputs = make_inputs(cfg, specs)
        loss = compiled(*inputs)
        loss.backward()
    if "forward" not in captured or "backward" not in captured:
        raise RuntimeError(f"AOTAutograd did not produce both graphs for {cfg}")
    annotate_grad_reductions(captured["backward"], [s.name for s in specs])
    return captured["forward"], captured["backward"], groups


def _boxed(gm: fx.GraphModule) -> Callable[..., Any]:
    """Wrap ``gm`` in AOTAutograd's boxed calling convention (a list of arguments)."""

    def run(args: list[Any]) -> Any:
        return gm(*args)

    setattr(run, "_boxed_call", True)  # noqa: B010  (what functorch's make_boxed_func sets)
    return run


def _config_name(cfg: ZooConfig) -> str:
    parts = [f"llama_{cfg.parallelism}", f"L{cfg.layers}", f"w{cfg.world_size}"]
    if cfg.tp_size > 1:
        parts.append(f"tp{cfg.tp_size}")
    if cfg.num_nodes > 1:
        parts.append(f"n{cfg.num_nodes}")
    return "_".join(parts)


def graph_groups(gms: list[fx.GraphModule], known: dict[str, GroupInfo]) -> dict[str, GroupInfo]:
    """The subset of ``known`` whose names appear in the collectives of ``gms``.

    Raises ``RuntimeError`` if a collective names a group that is not known.
    """
    used: dict[str, GroupInfo] = {}
    for gm in gms:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in COLLECTIVE_OPS:
                name = str(node.args[-1])
                if name not in known:
                    raise RuntimeError(f"collective {node.name} uses unknown group {name!r}")
                used[name] = known[name]
    return dict(sorted(used.items()))


def build_graphs(config: ZooConfig, name: str | None = None, device: str = "cuda") -> ZooGraph:
    """Trace ``config`` into a :class:`ZooGraph`.

    Args:
        config: what to trace.
        name: name to record (defaults to a name derived from the config).
        device: ``"cuda"`` (default) retargets the graphs' devices and FakeTensor metadata
            to CUDA; ``"cpu"`` keeps the CPU FakeTensors AOTAutograd recorded.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    with _LOCK:
        start = time.perf_counter()
        fw, bw, known = trace_step(config)
        groups = graph_groups([fw, bw], known)
        if device == "cuda":
            fw, bw = retarget_to_cuda(fw, bw)
        specs = param_specs(config)
        fw_params = [n for n in fw.graph.nodes if n.op == "placeholder"][: len(specs)]
        for node, spec in zip(fw_params, specs, strict=True):
            node.meta["zoo_param"] = spec.name
        logger.info(
            "traced %s in %.2fs: forward %d nodes, backward %d nodes",
            name or _config_name(config),
            time.perf_counter() - start,
            len(fw.graph.nodes),
            len(bw.graph.nodes),
        )
    return ZooGraph(
        name=name or _config_name(config),
        config=config,
        forward=fw,
        backward=bw,
        groups=groups,
        device=device,
        param_names=tuple(s.name for s in specs),
    )
