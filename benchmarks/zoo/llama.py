"""A functional Llama-style training step with SimpleFSDP / TP / DDP parallelism.

The model is written as plain functions over a flat list of parameter tensors so that
AOTAutograd can trace it directly (no dynamo). Parallelism follows SimpleFSDP
(torchtitan ``experiments/simple_fsdp``):

* **FSDP**: each parameter is stored as a local fp32 shard of dim 0 (padded when dim 0 is
  not divisible by the data-parallel degree). At its first use it becomes a DTensor
  ``Shard(0)`` and is redistributed to ``Replicate()`` with ``forward_dtype=bfloat16`` and
  ``backward_dtype=float32``: the forward graph casts the shard to bf16 right before its
  ``all_gather_into_tensor``; the backward casts the gradient to fp32 and
  ``reduce_scatter_tensor``\\ s it (gradients are marked ``Partial`` via
  ``to_local(grad_placements=...)``).
* **FSDP + TP** (2-D mesh ``dp x tp``): Megatron sequence parallelism. Activations between
  blocks are sharded on the sequence dim over ``tp``; each attention / MLP all-gathers the
  sequence (``all_gather`` on tp; ``reduce_scatter`` in backward), runs column-parallel
  q/k/v (w1/w3) and row-parallel wo (w2), and reduce-scatters the partial sums back to
  sequence shards (``reduce_scatter`` on tp; ``all_gather`` in backward). Parameters are
  FSDP-sharded over ``dp``. Norm weights, the embedding and the output projection are
  replicated over ``tp`` and see only a sequence shard, so their gradients are partial over
  both mesh dims (``reduce_scatter`` on dp and ``all_reduce`` on tp).
* **DDP**: parameters are full fp32 replicas cast to bf16 at first use; gradients are
  ``all_reduce``\\ d in fp32 (``to_local(grad_placements=[Partial()])``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from .config import ZooConfig

logger = logging.getLogger(__name__)

COMPUTE_DTYPE = torch.bfloat16
REDUCE_DTYPE = torch.float32
NORM_EPS = 1e-5
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the model.

    Attributes:
        name: dotted name in Llama (torchtitan) convention.
        shape: shape of the weight as used by the local compute, i.e. after the FSDP
            all-gather (the tensor-parallel local shard for TP-sharded weights).
        tp_replicated: the weight is replicated over the TP mesh dim and only sees a
            sequence shard, so its gradient is partial over TP (only with ``fsdp_tp``).
    """

    name: str
    shape: tuple[int, ...]
    tp_replicated: bool


def param_specs(cfg: ZooConfig) -> list[ParamSpec]:
    """Parameters in order of first use by the forward pass (the placeholder order)."""
    tp = cfg.tp_size
    d, f, v = cfg.dim, cfg.ffn_dim, cfg.vocab
    specs = [ParamSpec("tok_embeddings.weight", (v, d), True)]
    for i in range(cfg.layers):
        p = f"layers.{i}."
        specs += [
            ParamSpec(p + "attention_norm.weight", (d,), True),
            ParamSpec(p + "attention.wq.weight", (d // tp, d), False),
            ParamSpec(p + "attention.wk.weight", (d // tp, d), False),
            ParamSpec(p + "attention.wv.weight", (d // tp, d), False),
            ParamSpec(p + "attention.wo.weight", (d, d // tp), False),
            ParamSpec(p + "ffn_norm.weight", (d,), True),
            ParamSpec(p + "feed_forward.w1.weight", (f // tp, d), False),
            ParamSpec(p + "feed_forward.w3.weight", (f // tp, d), False),
            ParamSpec(p + "feed_forward.w2.weight", (d, f // tp), False),
        ]
    specs += [
        ParamSpec("norm.weight", (d,), True),
        ParamSpec("output.weight", (v, d), True),
    ]
    assert len(specs) == cfg.num_params()
    return specs


def stored_shape(cfg: ZooConfig, spec: ParamSpec) -> tuple[int, ...]:
    """Shape of the parameter as stored on one rank (the FSDP shard, padded)."""
    if cfg.parallelism == "ddp":
        return spec.shape
    rows = -(-spec.shape[0] // cfg.dp_size)
    return (rows, *spec.shape[1:])


class Parallel:
    """Turns stored parameters into compute weights and moves sequence shards (TP).

    Args:
        cfg: the config.
        dp_mesh: 1-D mesh over which parameters are sharded (FSDP) or replicated (DDP).
        tp_mesh: 1-D tensor-parallel mesh (``fsdp_tp`` only).
        mesh_2d: the ``(dp, tp)`` mesh (``fsdp_tp`` only).
    """

    def __init__(
        self,
        cfg: ZooConfig,
        dp_mesh: DeviceMesh,
        tp_mesh: DeviceMesh | None = None,
        mesh_2d: DeviceMesh | None = None,
    ) -> None:
        self.cfg = cfg
        self.dp_mesh = dp_mesh
        self.tp_mesh = tp_mesh
        self.mesh_2d = mesh_2d

    def weight(self, stored: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
        """The bf16 weight used by the compute, with the gradient reduction of its mode."""
        if self.cfg.parallelism == "ddp":
            # fp32 all_reduce of the gradient, then the bf16 cast's backward.
            rep = DTensor.from_local(stored, self.dp_mesh, [Replicate()], run_check=False)
            full = rep.to_local(grad_placements=[Partial()])
            return full.to(COMPUTE_DTYPE)
        if self.cfg.parallelism == "fsdp_tp" and spec.tp_replicated:
            assert self.mesh_2d is not None
            dt = DTensor.from_local(
                stored, self.mesh_2d, [Shard(0), Replicate()], run_check=False
            )
            full = dt.redistribute(
                self.mesh_2d,
                [Replicate(), Replicate()],
                forward_dtype=COMPUTE_DTYPE,
                backward_dtype=REDUCE_DTYPE,
            ).to_local(grad_placements=[Partial(), Partial()])
        else:
            dt = DTensor.from_local(stored, self.dp_mesh, [Shard(0)], run_check=False)
            full = dt.redistribute(
                self.dp_mesh,
                [Replicate()],
                forward_dtype=COMPUTE_DTYPE,
                backward_dtype=REDUCE_DTYPE,
            ).to_local(grad_placements=[Partial()])
        if full.shape[0] != spec.shape[0]:  # FSDP padding
            full = full.narrow(0, 0, spec.shape[0])
        return full

    def sp_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Sequence-sharded ``[B, S/tp, D]`` -> full sequence ``[B, S, D]`` (TP all_gather)."""
        if self.tp_mesh is None:
            return x
        dt = DTensor.from_local(x, self.tp_mesh, [Shard(1)], run_check=False)
        return dt.redistribute(self.tp_mesh, [Replicate()]).to_local(
            grad_placements=[Partial()]
        )

    def sp_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Partial sums ``[B, S, D]`` -> reduced sequence shard ``[B, S/tp, D]`` (TP RS)."""
        if self.tp_mesh is None:
            return x
        dt = DTensor.from_local(x, self.tp_mesh, [Partial()], run_check=False)
        return dt.redistribute(self.tp_mesh, [Shard(1)]).to_local()


def rope_tables(cfg: ZooConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary ``cos`` and ``sin`` tables of shape ``[seq_len, head_dim]`` (rotate-half form)."""
    hd = cfg.head_dim
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    t = torch.arange(cfg.seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(COMPUTE_DTYPE), emb.sin().to(COMPUTE_DTYPE)


@contextmanager
def module_scope(path: str, kind: str) -> Iterator[None]:
    """Record ``nn_module_stack`` for the nodes traced inside (like a module call would).

    Entries follow torch.export's form ``{path: (path, type_name)}``. Only active while
    AOTAutograd preserves node metadata; AOTAutograd copies it to backward nodes.
    """
    import torch.fx.traceback as fx_traceback

    if not fx_traceback.has_preserved_node_meta():
        yield
        return
    meta = fx_traceback.current_meta
    old = meta.get("nn_module_stack")
    stack = dict(old or {})
    stack[path] = (path, f"{__name__}.{kind}")
    meta["nn_module_stack"] = stack
    try:
        yield
    finally:
        if old is None:
            meta.pop("nn_module_stack", None)
        else:
            meta["nn_module_stack"] = old


def param_module_stack(param_name: str) -> dict[str, tuple[str, str]]:
    """The ``nn_module_stack`` of the scope that uses parameter ``param_name``."""
    parts = param_name.split(".")
    if parts[0] != "layers":
        kinds = {"tok_embeddings": "Embedding", "norm": "RMSNorm", "output": "Linear"}
        return {parts[0]: (parts[0], f"{__name__}.{kinds[parts[0]]}")}
    block = f"layers.{parts[1]}"
    if parts[2] in ("attention", "attention_norm"):
        inner, kind = f"{block}.attention", "Attention"
    else:
        inner, kind = f"{block}.feed_forward", "FeedForward"
    return {
        block: (block, f"{__name__}.TransformerBlock"),
        inner: (inner, f"{__name__}.{kind}"),
    }


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
    return y.type_as(x) * w


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, S, H, hd]; cos/sin: [S, hd]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return x * c + _rotate_half(x) * s


class _Weights:
    """Lazily materialized weights: the all-gather of a parameter sits at its first use."""

    def __init__(
        self, par: Parallel, specs: Sequence[ParamSpec], stored: Sequence[torch.Tensor]
    ) -> None:
        self._par = par
        self._specs = {s.name: (s, t) for s, t in zip(specs, stored, strict=True)}

    def __call__(self, name: str) -> torch.Tensor:
        spec, stored = self._specs[name]
        return self._par.weight(stored, spec)


def _attention(
    cfg: ZooConfig, par: Parallel, w: Callable[[str], torch.Tensor], p: str,
    h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
) -> torch.Tensor:
    x = _rms_norm(h, w(p + "attention_norm.weight"))
    x = par.sp_gather(x)
    bsz, seq, _ = x.shape
    heads = cfg.n_heads // cfg.tp_size
    hd = cfg.head_dim
    q = F.linear(x, w(p + "attention.wq.weight")).view(bsz, seq, heads, hd)
    k = F.linear(x, w(p + "attention.wk.weight")).view(bsz, seq, heads, hd)
    v = F.linear(x, w(p + "attention.wv.weight")).view(bsz, seq, heads, hd)
    q = _apply_rope(q, cos, sin)
    k = _apply_rope(k, cos, sin)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        is_causal=True, scale=1.0 / math.sqrt(hd),
    )
    o = o.transpose(1, 2).reshape(bsz, seq, heads * hd)
    out = F.linear(o, w(p + "attention.wo.weight"))
    return par.sp_scatter(out)


def _feed_forward(
    par: Parallel, w: Callable[[str], torch.Tensor], p: str, h: torch.Tensor
) -> torch.Tensor:
    x = _rms_norm(h, w(p + "ffn_norm.weight"))
    x = par.sp_gather(x)
    a = F.linear(x, w(p + "feed_forward.w1.weight"))
    b = F.linear(x, w(p + "feed_forward.w3.weight"))
    out = F.linear(F.silu(a) * b, w(p + "feed_forward.w2.weight"))
    return par.sp_scatter(out)


def make_step(
    cfg: ZooConfig, par: Parallel, specs: Sequence[ParamSpec]
) -> Callable[..., torch.Tensor]:
    """The traced function ``step(*params, tokens, targets, cos, sin) -> loss``.

    ``tokens`` and ``targets`` are ``[batch, seq_len / tp_size]`` int64 (the local sequence
    shard under sequence parallelism); ``cos``/``sin`` are the full rotary tables.
    """
    n = len(specs)

    def step(*args: torch.Tensor) -> torch.Tensor:
        stored, (tokens, targets, cos, sin) = args[:n], args[n:]
        w = _Weights(par, specs, stored)
        with module_scope("tok_embeddings", "Embedding"):
            h = F.embedding(tokens, w("tok_embeddings.weight"))
        for i in range(cfg.layers):
            p = f"layers.{i}."
            with module_scope(f"layers.{i}", "TransformerBlock"):
                with module_scope(p + "attention", "Attention"):
                    h = h + _attention(cfg, par, w, p, h, cos, sin)
                with module_scope(p + "feed_forward", "FeedForward"):
                    h = h + _feed_forward(par, w, p, h)
        with module_scope("norm", "RMSNorm"):
            h = _rms_norm(h, w("norm.weight"))
        with module_scope("output", "Linear"):
            logits = F.linear(h, w("output.weight")).float()
        return F.cross_entropy(logits.view(-1, cfg.vocab), targets.reshape(-1))

    return step


def make_inputs(
    cfg: ZooConfig, specs: Sequence[ParamSpec], device: str = "cpu"
) -> list[torch.Tensor]:
    """Deterministic example inputs: stored parameters (requiring grad), then data."""
    gen = torch.Generator().manual_seed(0)
    params = []
    for spec in specs:
        shape = stored_shape(cfg, spec)
        if len(shape) == 1:
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * (1.0 / math.sqrt(shape[-1]))
        params.append(t.to(device).requires_grad_(True))
    seq_local = cfg.seq_len // cfg.tp_size
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, seq_local), generator=gen).to(device)
    targets = torch.randint(0, cfg.vocab, (cfg.batch, seq_local), generator=gen).to(device)
    cos, sin = rope_tables(cfg)
    return [*params, tokens, targets, cos.to(device), sin.to(device)]
