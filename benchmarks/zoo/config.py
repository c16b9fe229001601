"""Configuration and result types of the graph zoo.

This module does not import torch at module level, so a config can be built and
validated cheaply; :class:`ZooGraph` only refers to ``torch.fx.GraphModule`` in
type annotations.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch.fx

    from ...fxbridge.extract import Extraction

logger = logging.getLogger(__name__)

PARALLELISMS: tuple[str, ...] = ("fsdp", "fsdp_tp", "ddp")


def _require_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ZooConfig.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class ZooConfig:
    """Shape and parallelism of one Llama-style training step.

    Attributes:
        parallelism: ``"fsdp"`` (SimpleFSDP-style, 1-D mesh of ``world_size``),
            ``"fsdp_tp"`` (2-D mesh ``(world_size // tp_size, tp_size)``: FSDP over
            the first dim, Megatron sequence-parallel TP over the second) or
            ``"ddp"`` (replicated parameters, gradients all-reduced).
        layers: number of transformer blocks.
        dim: model width.
        n_heads: attention heads (``dim`` must be divisible by it).
        ffn_dim: SwiGLU hidden width.
        vocab: vocabulary size.
        seq_len: sequence length (global, before sequence parallelism).
        batch: per-data-parallel-rank batch size.
        world_size: total number of ranks (process-group size of the world).
        tp_size: tensor-parallel degree, only for ``"fsdp_tp"`` (must be 1 otherwise).
        gpus_per_node: GPUs per node, used to describe the topology only (the
            traced graph does not depend on it).
    """

    parallelism: str
    layers: int = 2
    dim: int = 256
    n_heads: int = 8
    ffn_dim: int = 768
    vocab: int = 1024
    seq_len: int = 128
    batch: int = 2
    world_size: int = 8
    tp_size: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.parallelism not in PARALLELISMS:
            raise ValueError(
                f"ZooConfig.parallelism must be one of {PARALLELISMS}, got {self.parallelism!r}"
            )
        for name in (
            "layers",
            "dim",
            "n_heads",
            "ffn_dim",
            "vocab",
            "seq_len",
            "batch",
            "world_size",
            "tp_size",
            "gpus_per_node",
        ):
            _require_positive(name, getattr(self, name))
        if self.dim % self.n_heads != 0:
            raise ValueError(
                f"ZooConfig.n_heads ({self.n_heads}) must divide ZooConfig.dim ({self.dim})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"ZooConfig.dim / ZooConfig.n_heads must be even for rotary embedding, "
                f"got head_dim {self.head_dim}"
            )
        if self.world_size > self.gpus_per_node and self.world_size % self.gpus_per_node:
            raise ValueError(
                f"ZooConfig.world_size ({self.world_size}) must be a multiple of "
                f"ZooConfig.gpus_per_node ({self.gpus_per_node}) when it spans several nodes"
            )
        if self.parallelism == "fsdp_tp":
            if self.tp_size < 2:
                raise ValueError(
                    f"ZooConfig.tp_size must be >= 2 for parallelism 'fsdp_tp', got {self.tp_size}"
                )
            if self.world_size % self.tp_size != 0 or self.world_size == self.tp_size:
                raise ValueError(
                    f"ZooConfig.tp_size ({self.tp_size}) must divide ZooConfig.world_size "
                    f"({self.world_size}) with a data-parallel degree of at least 2"
                )
            for name in ("n_heads", "ffn_dim", "seq_len"):
                if getattr(self, name) % self.tp_size != 0:
                    raise ValueError(
                        f"ZooConfig.{name} ({getattr(self, name)}) must be divisible by "
                        f"ZooConfig.tp_size ({self.tp_size})"
                    )
            if self.dim % self.tp_size != 0:
                raise ValueError(
                    f"ZooConfig.dim ({self.dim}) must be divisible by ZooConfig.tp_size "
                    f"({self.tp_size})"
                )
        elif self.tp_size != 1:
            raise ValueError(
                f"ZooConfig.tp_size must be 1 unless parallelism is 'fsdp_tp', got {self.tp_size}"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_heads

    @property
    def dp_size(self) -> int:
        """Data-parallel (FSDP or DDP) degree."""
        return self.world_size // self.tp_size

    @property
    def num_nodes(self) -> int:
        """Number of nodes the world spans (at least 1)."""
        return max(1, -(-self.world_size // self.gpus_per_node))

    def num_params(self) -> int:
        """Number of parameter tensors: 9 per block plus embedding, final norm, output."""
        return 9 * self.layers + 3


@dataclass
class GroupInfo:
    """A process group as it appears in the traced graphs.

    Attributes:
        name: the ``group_name`` string passed to the ``_c10d_functional`` ops.
        size: number of ranks in the group.
        ranks: global ranks of the group that contains rank 0 (the traced rank).
    """

    name: str
    size: int
    ranks: tuple[int, ...]


@dataclass
class ZooGraph:
    """The forward and backward post-grad graphs of one training step.

    Attributes:
        name: a short name describing the config (or the zoo entry name).
        config: the config that produced the graphs.
        forward: AOTAutograd forward graph (min-cut partitioned).
        backward: AOTAutograd backward graph.
        groups: every process-group name that appears in either graph.
        device: device type of the ``meta["val"]`` FakeTensors (``"cuda"`` or ``"cpu"``).
        param_names: parameter name of each parameter placeholder of the forward
            graph, in placeholder order.
    """

    name: str
    config: ZooConfig
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    groups: dict[str, GroupInfo]
    device: str = "cuda"
    param_names: tuple[str, ...] = field(default_factory=tuple)

    @property
    def group_sizes(self) -> dict[str, int]:
        """Every process group's size by name, as :func:`fxbridge.extract.extract_problem` takes them."""
        return {g.name: g.size for g in self.groups.values()}

    def extract(self, part: str, **kwargs: Any) -> Extraction:
        """``part`` (``"forward"`` or ``"backward"``) extracted as the problem ``{name}/{part}``
        with :attr:`group_sizes`; ``kwargs`` go to ``extract_problem`` (``profile``, ...)."""
        from ...fxbridge.extract import extract_problem  # here: the module imports no torch at load

        return extract_problem(getattr(self, part), groups=self.group_sizes, name=f"{self.name}/{part}", **kwargs)
