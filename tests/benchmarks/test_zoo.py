"""Tests of the graph zoo (``fxsched.benchmarks.zoo``) on the small 2-layer configs.

Expected collective counts are derived from the model structure, not from the graphs:

* ``P = 9 * layers + 3`` parameters: per block wq, wk, wv, wo, w1, w2, w3 and two RMSNorm
  weights; plus the token embedding, the final norm and the output projection.
* FSDP forward: one all_gather per parameter. FSDP backward: one reduce_scatter per
  parameter, and the parameters are re-gathered (reshard after forward, SimpleFSDP's
  recompute policy) wherever the backward needs the full weight: every parameter except
  the token embedding, whose backward (``embedding_dense_backward``) only needs the indices.
  So ``P - 1`` backward all_gathers.
* Sequence-parallel TP adds, per block, one all_gather of the sequence before attention and
  before the MLP and one reduce_scatter after each (``2 * layers`` each, forward); the
  backward swaps them (``2 * layers`` reduce_scatters and all_gathers). Parameters that are
  replicated over TP (``2 * layers`` norms, embedding, final norm, output) see only a
  sequence shard, so their gradients are all_reduced over TP: ``2 * layers + 3``.
* DDP: no forward collective; one all_reduce per parameter gradient in the backward.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.fx as fx
from fxsched.benchmarks.zoo import (
    ZOO,
    GroupInfo,
    ZooConfig,
    ZooGraph,
    activate_groups,
    build,
    build_graphs,
    release_process_group,
)

C10D = torch.ops._c10d_functional
AG = C10D.all_gather_into_tensor.default
RS = C10D.reduce_scatter_tensor.default
AR = C10D.all_reduce.default
A2A = C10D.all_to_all_single.default
WAIT = C10D.wait_tensor.default
COLLECTIVES = {AG: "all_gather", RS: "reduce_scatter", AR: "all_reduce", A2A: "all_to_all"}

SMALL = ["llama_fsdp_8r_small", "llama_fsdp_32r_4n_small", "llama_fsdp_tp_small",
         "llama_fsdp_tp_2x4_small", "llama_ddp_small"]


def _group_arg(node: fx.Node) -> str:
    return str(node.args[-1])


def _size_arg(node: fx.Node) -> int | None:
    """The group size a collective carries in its args (None for all_reduce)."""
    if node.target is AG:
        return int(node.args[1])
    if node.target is RS:
        return int(node.args[2])
    return None


def _collectives(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in COLLECTIVES]


def _counts(gm: fx.GraphModule, groups: dict[str, GroupInfo]) -> Counter[tuple[str, int]]:
    """Counter of (collective kind, group size)."""
    return Counter((COLLECTIVES[n.target], groups[_group_arg(n)].size) for n in _collectives(gm))


def _expected(cfg: ZooConfig) -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
    """(forward, backward) collective counts derived from the model structure."""
    n_params = 9 * cfg.layers + 3
    fw: Counter[tuple[str, int]] = Counter()
    bw: Counter[tuple[str, int]] = Counter()
    if cfg.parallelism == "ddp":
        bw[("all_reduce", cfg.world_size)] = n_params
        return fw, bw
    dp = cfg.world_size // cfg.tp_size
    fw[("all_gather", dp)] += n_params
    bw[("reduce_scatter", dp)] += n_params
    bw[("all_gather", dp)] += n_params - 1  # no re-gather of the embedding
    if cfg.parallelism == "fsdp_tp":
        tp = cfg.tp_size
        fw[("all_gather", tp)] += 2 * cfg.layers
        fw[("reduce_scatter", tp)] += 2 * cfg.layers
        bw[("all_gather", tp)] += 2 * cfg.layers
        bw[("reduce_scatter", tp)] += 2 * cfg.layers
        bw[("all_reduce", tp)] += 2 * cfg.layers + 3
    return fw, bw


@pytest.fixture(scope="module", autouse=True)
def _release_fake_pg() -> Iterator[None]:
    """Leave no fake default process group behind for other test modules."""
    yield
    release_process_group()


@pytest.fixture(scope="module")
def zoo_graphs() -> dict[str, tuple[ZooGraph, dict[str, int]]]:
    """Each small graph, with group sizes resolved by c10d right after its build."""
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    out: dict[str, tuple[ZooGraph, dict[str, int]]] = {}
    for name in SMALL:
        zg = build(name)
        resolved = {g: int(_get_group_size_by_name(g)) for g in zg.groups}
        out[name] = (zg, resolved)
    return out


@pytest.fixture(params=SMALL)
def entry(
    request: Any, zoo_graphs: dict[str, tuple[ZooGraph, dict[str, int]]]
) -> tuple[ZooGraph, dict[str, int]]:
    return zoo_graphs[request.param]


def _graphs(zg: ZooGraph) -> list[tuple[str, fx.GraphModule]]:
    return [("forward", zg.forward), ("backward", zg.backward)]


def test_zoo_names() -> None:
    for name in ("llama_fsdp_8r", "llama_fsdp_32r_4n", "llama_fsdp_tp", "llama_ddp"):
        assert name in ZOO and f"{name}_small" in ZOO
        assert ZOO[f"{name}_small"].layers == 2
    assert ZOO["llama_fsdp_8r"].layers == 8
    assert ZOO["llama_fsdp_32r_4n"].world_size == 32
    assert ZOO["llama_fsdp_32r_4n"].num_nodes == 4
    assert ZOO["llama_fsdp_tp"].parallelism == "fsdp_tp"
    assert ZOO["llama_ddp"].parallelism == "ddp"


def test_lint_and_meta(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    zg, _ = entry
    assert zg.device == "cuda"
    for label, gm in _graphs(zg):
        gm.graph.lint()
        for node in gm.graph.nodes:
            if node.op == "output":
                continue
            assert "val" in node.meta, f"{label}: {node.name} has no meta['val']"
            val = node.meta["val"]
            if isinstance(val, torch.Tensor):
                assert isinstance(val, torch._subclasses.fake_tensor.FakeTensor), node.name
                assert val.device.type == "cuda", f"{label}: {node.name} on {val.device}"
            else:
                assert isinstance(val, (tuple, list, int, torch.SymInt)), (node.name, val)


def test_collective_counts(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    zg, _ = entry
    exp_fw, exp_bw = _expected(zg.config)
    assert _counts(zg.forward, zg.groups) == exp_fw
    assert _counts(zg.backward, zg.groups) == exp_bw


def test_waits_pair_with_collectives(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    zg, _ = entry
    for label, gm in _graphs(zg):
        waits = [n for n in gm.graph.nodes if n.target is WAIT]
        for w in waits:
            assert w.args[0].target in COLLECTIVES, f"{label}: {w.name} waits on {w.args[0]}"
        for c in _collectives(gm):
            users = list(c.users)
            assert len(users) == 1 and users[0].target is WAIT, f"{label}: {c.name} users {users}"
        assert len(waits) == len(_collectives(gm))


def test_groups_match_collectives(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    zg, resolved = entry
    used = {_group_arg(c) for _, gm in _graphs(zg) for c in _collectives(gm)}
    assert used == set(zg.groups)
    for name, info in zg.groups.items():
        assert info.name == name
        assert info.size == resolved[name] == len(info.ranks)
        assert 0 in info.ranks
    for _, gm in _graphs(zg):
        for c in _collectives(gm):
            size = _size_arg(c)
            if size is not None:
                assert size == zg.groups[_group_arg(c)].size, c.name
    cfg = zg.config
    expected_sizes = (
        {cfg.world_size} if cfg.parallelism != "fsdp_tp"
        else {cfg.world_size // cfg.tp_size, cfg.tp_size}
    )
    assert sorted(g.size for g in zg.groups.values()) == sorted(expected_sizes)
    assert zg.group_sizes == {name: info.size for name, info in zg.groups.items()}


def test_mixed_precision(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    """bf16 parameter all_gathers right behind their cast; fp32 gradient reductions."""
    zg, _ = entry
    cfg = zg.config
    dp_size = cfg.world_size // cfg.tp_size
    cast = torch.ops.prims.convert_element_type.default
    param_gathers = [
        c for c in _collectives(zg.forward)
        if c.target is AG and zg.groups[_group_arg(c)].size == dp_size
        and cfg.parallelism != "ddp"
    ]
    for c in param_gathers:
        assert c.args[0].target is cast and c.args[0].args[1] == torch.bfloat16, c.name
        assert c.meta["val"].dtype == torch.bfloat16
    grad_reductions = [
        c for c in _collectives(zg.backward)
        if (c.target is RS and zg.groups[_group_arg(c)].size == dp_size)
        or (c.target is AR and cfg.parallelism == "ddp")
    ]
    assert len(grad_reductions) == 9 * cfg.layers + 3
    for c in grad_reductions:
        assert c.meta["val"].dtype == torch.float32, c.name


def test_attention_retargeted(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    zg, _ = entry
    aten = torch.ops.aten
    fw = Counter(n.target for n in zg.forward.graph.nodes)
    bw = Counter(n.target for n in zg.backward.graph.nodes)
    assert fw[aten._scaled_dot_product_flash_attention.default] == zg.config.layers
    assert bw[aten._scaled_dot_product_flash_attention_backward.default] == zg.config.layers
    assert fw[aten._scaled_dot_product_flash_attention_for_cpu.default] == 0


def test_saved_values_line_up(entry: tuple[ZooGraph, dict[str, int]]) -> None:
    """Forward outputs after the loss are the backward's non-tangent placeholders, by name."""
    zg, _ = entry
    outs = list(zg.forward.graph.output_node().args[0])
    assert outs[0].meta["val"].shape == ()  # the loss
    saved = [o.name for o in outs[1:]]
    phs = [n.name for n in zg.backward.graph.nodes if n.op == "placeholder"]
    assert saved == [p for p in phs if not p.startswith("tangents")]
    fw_params = [n for n in zg.forward.graph.nodes if n.op == "placeholder"][: len(zg.param_names)]
    assert [n.meta["zoo_param"] for n in fw_params] == list(zg.param_names)
    assert len(zg.param_names) == 9 * zg.config.layers + 3


def test_rebuild_is_deterministic() -> None:
    """Same config -> same graphs and group names, even after other world sizes."""
    cfg = ZooConfig("fsdp_tp", layers=1, world_size=8, tp_size=2)
    first = build_graphs(cfg)
    build_graphs(ZooConfig("fsdp", layers=1, world_size=32))
    second = build_graphs(cfg)
    assert first.forward.code == second.forward.code
    assert first.backward.code == second.backward.code
    assert first.groups == second.groups
    assert [n.name for n in first.backward.graph.nodes] == [
        n.name for n in second.backward.graph.nodes
    ]


def test_build_layer_override_and_padding() -> None:
    zg = build("llama_ddp_small", layers=1)
    assert zg.config.layers == 1 and zg.name == "llama_ddp_small_L1"
    assert _counts(zg.backward, zg.groups) == Counter({("all_reduce", 8): 12})
    # vocab 1000 and ffn 700 do not divide 32 ranks: shards are padded, then sliced.
    cfg = ZooConfig("fsdp", layers=1, world_size=32, vocab=1000, ffn_dim=700)
    padded = build_graphs(cfg)
    exp_fw, exp_bw = _expected(cfg)
    assert _counts(padded.forward, padded.groups) == exp_fw
    assert _counts(padded.backward, padded.groups) == exp_bw
    with pytest.raises(KeyError, match="unknown zoo graph"):
        build("no_such_graph")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"parallelism": "zero3"}, "parallelism"),
        ({"parallelism": "fsdp", "layers": 0}, "layers"),
        ({"parallelism": "fsdp", "dim": 250}, "n_heads"),
        ({"parallelism": "fsdp", "tp_size": 2}, "tp_size"),
        ({"parallelism": "fsdp_tp", "tp_size": 3}, "tp_size"),
        ({"parallelism": "fsdp_tp", "tp_size": 8}, "tp_size"),
        ({"parallelism": "fsdp_tp", "tp_size": 2, "seq_len": 127}, "seq_len"),
        ({"parallelism": "fsdp", "world_size": 12, "gpus_per_node": 8}, "gpus_per_node"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ZooConfig(**kwargs)


def test_config_is_frozen() -> None:
    cfg = ZooConfig("ddp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.layers = 3  # type: ignore[misc]


def test_activate_and_release_groups() -> None:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    cfg = ZooConfig("fsdp_tp", layers=1, world_size=8, tp_size=4)
    zg = build_graphs(cfg)
    build_graphs(ZooConfig("ddp", layers=1, world_size=16, gpus_per_node=8))
    groups = activate_groups(cfg)
    assert {n: g.size for n, g in groups.items()} == {n: g.size for n, g in zg.groups.items()}
    for name, info in zg.groups.items():
        assert _get_group_size_by_name(name) == info.size
    release_process_group()
    assert not dist.is_initialized()
    release_process_group()  # no-op


def test_cpu_device_option() -> None:
    zg = build_graphs(ZooConfig("fsdp", layers=1), device="cpu")
    assert zg.device == "cpu"
    for _, gm in _graphs(zg):
        gm.graph.lint()
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                assert val.device.type == "cpu", node.name
    targets = {n.target for n in zg.forward.graph.nodes}
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in targets
    with pytest.raises(ValueError, match="device"):
        build_graphs(ZooConfig("fsdp", layers=1), device="xpu")
