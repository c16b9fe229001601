"""Retarget CPU-traced AOTAutograd graphs to CUDA and re-propagate FakeTensor metadata.

Autograd cannot run on fake CUDA tensors in a CPU-only torch build, so the zoo traces on
CPU and rewrites the result into what a CUDA trace would have produced:

* every ``device=cpu`` argument (factory ops such as ``full`` / ``scalar_tensor``,
  ``_to_copy``) becomes ``cuda``;
* ``aten._scaled_dot_product_flash_attention_for_cpu`` (forward) becomes
  ``aten._scaled_dot_product_flash_attention`` and its backward becomes
  ``aten._scaled_dot_product_flash_attention_backward`` with the CUDA signature
  (``cum_seq_q/k = None``, ``max_q/max_k`` = sequence lengths, and the forward's
  ``rng_state`` / ``unused`` outputs -- getitems 6 and 7 -- saved for the backward:
  they are appended to the forward's outputs and inserted as backward placeholders just
  before the tangents, which keeps AOTAutograd's ``saved values`` convention);
* ``meta["val"]`` of every node is recomputed with
  :class:`torch.fx.passes.fake_tensor_prop.FakeTensorProp` under a fresh
  ``FakeTensorMode``, starting from CUDA FakeTensors for the placeholders.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

logger = logging.getLogger(__name__)

aten = torch.ops.aten
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BW = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_CUDA_FLASH = aten._scaled_dot_product_flash_attention.default
_CUDA_FLASH_BW = aten._scaled_dot_product_flash_attention_backward.default
_CUDA = torch.device("cuda")


def _to_cuda_arg(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == "cpu":
        return _CUDA
    if isinstance(value, str) and value == "cpu":
        return "cuda"
    return value


def retarget_devices(gm: fx.GraphModule) -> int:
    """Replace CPU device arguments by CUDA in every node; returns the number of nodes changed."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        new_args = tuple(_to_cuda_arg(a) for a in node.args)
        new_kwargs = {k: _to_cuda_arg(v) for k, v in node.kwargs.items()}
        if new_args != node.args or new_kwargs != node.kwargs:
            node.args, node.kwargs = new_args, new_kwargs
            changed += 1
    return changed


def _as_sequence(arg: Any) -> Sequence[Any]:
    if not isinstance(arg, (tuple, list)):
        raise TypeError(f"expected the graph output to be a tuple or list, got {type(arg)}")
    return arg


def _free_name(base: str, graphs: list[fx.Graph]) -> str:
    """``base`` or ``base_<k>``: a node name unused in all ``graphs``."""
    taken = {n.name for g in graphs for n in g.nodes}
    if base not in taken:
        return base
    k = 1
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def _getitem(fw: fx.Graph, bw: fx.Graph, node: fx.Node, idx: int) -> fx.Node:
    """The ``node[idx]`` getitem of ``fw``, created (with a name free in both graphs) if missing."""
    for user in node.users:
        if user.target is operator.getitem and user.args[1] == idx:
            return user
    last = max((u for u in node.users), key=lambda u: list(fw.nodes).index(u), default=node)
    with fw.inserting_after(last):
        return fw.create_node(
            "call_function", operator.getitem, (node, idx), name=_free_name("getitem", [fw, bw])
        )


def retarget_flash_attention(fw: fx.GraphModule, bw: fx.GraphModule) -> int:
    """Rewrite CPU flash attention (fwd in ``fw``, bwd in ``bw``) into the CUDA ops.

    Forward and backward nodes are matched through the saved ``out`` / ``logsumexp``
    values, whose backward placeholders carry the forward node names.
    Returns the number of attention calls rewritten.
    """
    fw_out = fw.graph.output_node()
    fw_outputs = list(_as_sequence(fw_out.args[0]))
    bw_placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in bw_placeholders}
    first_tangent = next((n for n in bw_placeholders if n.name.startswith("tangents")), None)
    rewritten = 0
    for node in list(fw.graph.nodes):
        if node.target is not _CPU_FLASH:
            continue
        q, k, v = node.args[:3]
        dropout_p = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
        is_causal = node.args[4] if len(node.args) > 4 else node.kwargs.get("is_causal", False)
        if node.kwargs.get("attn_mask") is not None:
            raise NotImplementedError("flash attention with attn_mask cannot be retargeted")
        scale = node.kwargs.get("scale")
        node.target = _CUDA_FLASH
        node.args = (q, k, v, dropout_p, is_causal)
        node.kwargs = {"scale": scale}
        node._rename(_free_name("_scaled_dot_product_flash_attention", [fw.graph, bw.graph]))
        out_fw = _getitem(fw.graph, bw.graph, node, 0)
        lse_fw = _getitem(fw.graph, bw.graph, node, 1)
        seed_fw = _getitem(fw.graph, bw.graph, node, 6)
        offset_fw = _getitem(fw.graph, bw.graph, node, 7)
        # Save the rng state like a CUDA trace does.
        fw_outputs.extend([seed_fw, offset_fw])
        lse_bw = by_name.get(lse_fw.name)
        if lse_bw is None:
            raise RuntimeError(f"backward does not receive {lse_fw.name} from {node.name}")
        assert first_tangent is not None, "backward graph has no tangents placeholder"
        with bw.graph.inserting_before(first_tangent):
            seed_bw = bw.graph.placeholder(seed_fw.name)
            offset_bw = bw.graph.placeholder(offset_fw.name)
        assert (seed_bw.name, offset_bw.name) == (seed_fw.name, offset_fw.name)
        seq_q = q.meta["val"].shape[2]
        seq_k = k.meta["val"].shape[2]
        for user in list(lse_bw.users):
            if user.target is not _CPU_FLASH_BW:
                continue
            g, bq, bk, bv, bout, blse, bp, bc = user.args[:8]
            if user.kwargs.get("attn_mask") is not None:
                raise NotImplementedError("flash attention backward with attn_mask")
            if bout.name != out_fw.name and not bout.name.startswith("alias"):
                logger.debug("flash backward %s: out input is %s", user.name, bout.name)
            user.target = _CUDA_FLASH_BW
            user.args = (g, bq, bk, bv, bout, blse, None, None, seq_q, seq_k, bp, bc,
                         seed_bw, offset_bw)
            user.kwargs = {"scale": user.kwargs.get("scale")}
            user._rename(
                _free_name("_scaled_dot_product_flash_attention_backward", [fw.graph, bw.graph])
            )
        rewritten += 1
    fw_out.args = (tuple(fw_outputs),)
    fw.graph.lint()
    bw.graph.lint()
    return rewritten


def _fake_like(mode: FakeTensorMode, val: Any, device: torch.device) -> Any:
    if isinstance(val, torch.Tensor):
        with mode:
            return torch.empty_strided(
                tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=device
            )
    return val


_NO_CUDA_MSG = "not linked with support for cuda"


class _CudaFakeTensorProp(FakeTensorProp):
    """FakeTensorProp that survives ops whose fake kernels touch real CUDA in a CPU build.

    Some decompositions used by fake tensor dispatch call bound ``Tensor`` methods (for
    example ``~mask`` in ``_unsafe_masked_index_put_accumulate``), which abort with
    "PyTorch is not linked with support for cuda devices" on fake CUDA tensors of a
    CPU-only build. For such a node the output metadata is computed on CPU FakeTensors
    with the same sizes, strides and dtypes, then moved back to CUDA.
    """

    fallback_ops: set[str]

    def __init__(self, gm: fx.GraphModule, mode: FakeTensorMode) -> None:
        super().__init__(gm, mode)
        self.fallback_ops = set()

    def run_node(self, n: fx.Node) -> Any:
        try:
            return super().run_node(n)
        except RuntimeError as exc:
            if _NO_CUDA_MSG not in str(exc) or n.op != "call_function":
                raise
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        mode = self._mode
        to_cpu = lambda v: _fake_like(mode, v, torch.device("cpu"))  # noqa: E731
        cpu_args = torch.utils._pytree.tree_map(to_cpu, args)
        cpu_kwargs = torch.utils._pytree.tree_map(to_cpu, kwargs)
        target = cast(Callable[..., Any], n.target)
        with mode:
            cpu_out = target(*cpu_args, **cpu_kwargs)
        result = torch.utils._pytree.tree_map(lambda v: _fake_like(mode, v, _CUDA), cpu_out)
        n.meta["val"] = result
        self.fallback_ops.add(str(n.target))
        return result


def propagate(gm: fx.GraphModule, inputs: list[Any], mode: FakeTensorMode) -> set[str]:
    """Set ``meta["val"]`` of every node by running ``gm`` on FakeTensors ``inputs``.

    Returns the ops whose metadata had to be computed on CPU (see :class:`_CudaFakeTensorProp`).
    """
    prop = _CudaFakeTensorProp(gm, mode)
    prop.propagate_dont_convert_inputs(*inputs)
    return prop.fallback_ops


def retarget_to_cuda(
    fw: fx.GraphModule, bw: fx.GraphModule
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Rewrite both graphs (in place) for CUDA and recompute their metadata."""
    n_dev = retarget_devices(fw) + retarget_devices(bw)
    n_attn = retarget_flash_attention(fw, bw)
    logger.debug("retargeted %d device arguments and %d attention calls", n_dev, n_attn)
    fw.recompile()
    bw.recompile()
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    fw_inputs = [
        _fake_like(mode, n.meta.get("val"), _CUDA)
        for n in fw.graph.nodes if n.op == "placeholder"
    ]
    fallbacks = propagate(fw, fw_inputs, mode)
    fw_vals = {n.name: n.meta.get("val") for n in fw.graph.nodes}
    bw_inputs = []
    for n in bw.graph.nodes:
        if n.op != "placeholder":
            continue
        if n.name in fw_vals and fw_vals[n.name] is not None:
            bw_inputs.append(fw_vals[n.name])  # a saved activation: same FakeTensor
        else:
            bw_inputs.append(_fake_like(mode, n.meta.get("val"), _CUDA))
    fallbacks |= propagate(bw, bw_inputs, mode)
    if fallbacks:
        logger.debug("meta computed on CPU and moved to CUDA for: %s", sorted(fallbacks))
    return fw, bw
