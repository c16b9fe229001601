"""Named zoo entries and :func:`build`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator

from ...solver.problem import ScheduleProblem
from .config import ZooConfig, ZooGraph
from .tracing import build_graphs

logger = logging.getLogger(__name__)

_FULL_LAYERS = 8
_SMALL_LAYERS = 2

# Llama-3-8B-shaped blocks (vocabulary cut to 32k). Tracing runs on fake tensors, so the
# sizes cost no time here, and they give a realistic compute/communication balance: with
# toy sizes every collective outweighs all compute and no scheduler could hide anything.
_LLAMA_8B = dict(dim=4096, n_heads=32, ffn_dim=14336, vocab=32000, seq_len=8192, batch=1)

_BASE: dict[str, ZooConfig] = {
    # FSDP, one node of 8 GPUs.
    "llama_fsdp_8r": ZooConfig("fsdp", layers=_FULL_LAYERS, **_LLAMA_8B, world_size=8, gpus_per_node=8),
    # FSDP over 4 nodes of 8 GPUs: one process group of 32 ranks.
    "llama_fsdp_32r_4n": ZooConfig("fsdp", layers=_FULL_LAYERS, **_LLAMA_8B, world_size=32, gpus_per_node=8),
    # 2-D: FSDP over dp=4 x sequence-parallel TP over tp=2 (one node).
    "llama_fsdp_tp": ZooConfig(
        "fsdp_tp", layers=_FULL_LAYERS, **_LLAMA_8B, world_size=8, tp_size=2, gpus_per_node=8
    ),
    # 2-D: dp=2 x tp=4 (one node).
    "llama_fsdp_tp_2x4": ZooConfig(
        "fsdp_tp", layers=_FULL_LAYERS, **_LLAMA_8B, world_size=8, tp_size=4, gpus_per_node=8
    ),
    # DDP, one node of 8 GPUs: gradients all-reduced in fp32.
    "llama_ddp": ZooConfig("ddp", layers=_FULL_LAYERS, **_LLAMA_8B, world_size=8, gpus_per_node=8),
}

ZOO: dict[str, ZooConfig] = {
    **_BASE,
    **{
        f"{name}_small": dataclasses.replace(cfg, layers=_SMALL_LAYERS)
        for name, cfg in _BASE.items()
    },
}
"""Named configs. ``*_small`` entries are the 2-layer variants used by tests."""


def build(name: str, layers: int | None = None) -> ZooGraph:
    """Build the zoo entry ``name``, optionally with ``layers`` transformer blocks.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    try:
        cfg = ZOO[name]
    except KeyError:
        raise KeyError(f"unknown zoo graph {name!r}; known: {sorted(ZOO)}") from None
    graph_name = name
    if layers is not None and layers != cfg.layers:
        cfg = dataclasses.replace(cfg, layers=layers)
        graph_name = f"{name}_L{layers}"
    return build_graphs(cfg, name=graph_name)


def problems(names: Iterable[str], parts: Iterable[str]) -> Iterator[ScheduleProblem]:
    """The extracted problem of each part of each zoo graph named, graph by graph (each traced once)."""
    parts = tuple(parts)
    for name in names:
        zg = build(name)
        for part in parts:
            yield zg.extract(part).problem
