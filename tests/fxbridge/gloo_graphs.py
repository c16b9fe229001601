"""A small FSDP-style step with functional collectives, traced into an FX graph, for apply tests.

Shared by ``test_apply.py`` (fake process group, one process) and ``test_apply_gloo.py``
(gloo, several processes). The step has, on purpose:

* three parameter all_gathers on the world group, two fp32 and one bf16 (a multi-dtype bucket);
* two gradient reduce_scatters on a second group over all ranks (``new_group``);
* two all_reduces on the world group;
* each collective's wait right at its first use (how ``make_fx`` emits ``funcol``), so a
  schedule has to move collectives to bucket them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from fxsched.solver import Schedule
from fxsched.solver.problem import OpKind, ScheduleProblem

DIM = 8  # feature size: each gathered parameter is (2*DIM, DIM), each rank holds 2*DIM/world rows
ROWS = 4  # batch rows


def make_inputs(rank: int, world: int, seed: int = 1234) -> list[torch.Tensor]:
    """Per-rank parameter shards and activations, the same for a given (rank, seed)."""
    gen = torch.Generator().manual_seed(seed + rank)
    rows = 2 * DIM // world  # a shard: gathered over `world` ranks it is (2*DIM, DIM)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return [
        rand(rows, DIM),  # w1 shard, fp32
        rand(rows, DIM).to(torch.bfloat16),  # w2 shard, bf16
        rand(rows, DIM),  # w3 shard, fp32
        rand(ROWS, 2 * DIM),  # x
        rand(ROWS, DIM),  # grad of the output
    ]


def step(groups: tuple[str, str]):
    """The traced step over process groups (world group name, second group name)."""
    ga, gb = groups

    def fn(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor, dy: torch.Tensor):
        full1 = funcol.all_gather_single(w1, 0, ga)  # (2D, D) fp32
        full2 = funcol.all_gather_single(w2, 0, ga)  # (2D, D) bf16
        full3 = funcol.all_gather_single(w3, 0, ga)  # (2D, D) fp32
        h1 = torch.relu(x @ full1)  # (R, D)
        h2 = torch.cat([h1, x[:, :DIM]], dim=1) @ full2.float()  # (R, D)
        y = torch.tanh(torch.cat([h2, h1], dim=1) @ full3)  # (R, D)
        g3 = torch.cat([h2, h1], dim=1).t() @ dy  # (2D, D) "gradient" of w3
        g1 = x.t() @ (dy * h1)  # (2D, D) "gradient" of w1
        rs3 = funcol.reduce_scatter_single(g3, "sum", 0, gb)
        rs1 = funcol.reduce_scatter_single(g1, "sum", 0, gb)
        loss = funcol.all_reduce(y.sum().reshape(1), "sum", ga)
        norm = funcol.all_reduce(h1.pow(2).sum(dim=0), "sum", ga)
        return y, full2, rs1 * 2, rs3 + 1, loss, norm

    return fn


def trace(groups: tuple[str, str], inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    """make_fx the step on fake tensors with Inductor's decompositions: a post-grad-like ATen graph
    with _c10d_functional collectives, which Inductor's ``compile_fx_inner`` accepts as is."""
    from torch._inductor.decomposition import select_decomp_table

    return make_fx(step(groups), decomposition_table=select_decomp_table(), tracing_mode="fake")(*inputs)


def second_group(world: int) -> str:
    """A second process group over all ranks (collective call: every rank must make it)."""
    pg = dist.new_group(list(range(world)))
    return str(pg.group_name)


def prefetch_order(problem: ScheduleProblem) -> tuple[str, ...]:
    """A topological order that issues collectives as early as possible and waits as late as possible.

    List scheduling: among ready ops pick a collective first, then any non-wait op, a wait only
    when nothing else is ready; ties by original index. Deterministic, independent of costs.
    """
    index = problem.index
    indeg = {op.name: len(op.deps) for op in problem.ops}
    users: dict[str, list[str]] = {op.name: [] for op in problem.ops}
    for op in problem.ops:
        for d in op.deps:
            users[d].append(op.name)
    ready = [n for n, k in indeg.items() if k == 0]
    out: list[str] = []

    def rank(name: str) -> tuple[int, int]:
        kind = problem.op_by_name[name].kind
        cls = 0 if kind is OpKind.COLLECTIVE else 2 if kind is OpKind.WAIT else 1
        return cls, index[name]

    while ready:
        ready.sort(key=rank)
        name = ready.pop(0)
        out.append(name)
        for u in users[name]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    assert len(out) == len(problem.ops), "the problem's dependencies have a cycle"
    return tuple(out)


def by_kind(problem: ScheduleProblem, kind: str, group: str | None = None) -> list[str]:
    """Collective op names of one kind (and group), in original order."""
    return [c.name for c in problem.collectives
            if c.collective.kind.value == kind and (group is None or c.collective.group == group)]


def bucketed_schedule(problem: ScheduleProblem) -> Schedule:
    """Prefetch order + one bucket per (kind, group): the three all_gathers (fp32 + bf16, so
    multi-dtype), the two reduce_scatters, the two all_reduces."""
    buckets = [tuple(b) for b in (by_kind(problem, "all_gather"), by_kind(problem, "reduce_scatter"),
                                  by_kind(problem, "all_reduce")) if len(b) >= 2]
    return Schedule(prefetch_order(problem), tuple(buckets), multi_dtype=True)


# ---- one rank of the gloo numerics test (top level so that spawned processes can import it) ----

OUTPUT_NAMES = ("y", "full2", "rs1", "rs3", "loss", "norm")
GATHERED = {"full2"}  # copies of gathered data: bitwise equal whatever the schedule


def compare(name: str, ref: torch.Tensor, got: torch.Tensor, exact: bool) -> None:
    """Bitwise equal (``exact``) or allclose; raises AssertionError naming the output."""
    if ref.dtype != got.dtype or ref.shape != got.shape:
        raise AssertionError(f"{name}: {ref.dtype}{tuple(ref.shape)} vs {got.dtype}{tuple(got.shape)}")
    if exact:
        if not torch.equal(ref, got):
            raise AssertionError(f"{name}: not bitwise equal (max diff {(ref.float() - got.float()).abs().max()})")
    else:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def compare_all(ref: Sequence[torch.Tensor], got: Sequence[torch.Tensor], exact_compute: bool) -> None:
    """Gathered outputs bitwise; reductions allclose; compute outputs bitwise when ``exact_compute``."""
    assert len(ref) == len(got) == len(OUTPUT_NAMES)
    for name, r, g in zip(OUTPUT_NAMES, ref, got):
        reduced = name in ("rs1", "rs3", "loss", "norm")
        compare(name, r, g, exact=name in GATHERED or (exact_compute and not reduced))


def source_order(source: str) -> list[str]:
    """The collective / wait / matmul calls of an Inductor wrapper's ``call``, in order, as short tags
    (the device check's reading of the wrapper code)."""
    from fxsched.benchmarks.device_check import code_order

    return code_order(source)


def run_rank(rank: int, world: int, port: int, inductor: bool, out_dir: str) -> None:
    """Trace, schedule, apply; run original and scheduled graphs (eager, then Inductor) on real data."""
    import json
    import time
    from datetime import timedelta

    from fxsched.fxbridge.apply import apply_schedule
    from fxsched.fxbridge.extract import extract_problem
    from fxsched.solver import check_schedule

    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    timings: dict[str, float] = {}
    report: dict[str, object] = {"rank": rank, "timings": timings}
    try:
        t0 = time.perf_counter()
        groups = (str(dist.group.WORLD.group_name), second_group(world))
        inputs = make_inputs(rank, world)
        gm = trace(groups, inputs)
        ext = extract_problem(gm)
        sched = bucketed_schedule(ext.problem)
        assert check_schedule(ext.problem, sched) == []
        applied = apply_schedule(ext, sched, inplace=False)
        report["buckets"] = [list(b.members) for b in applied.meta["fxsched"]["buckets"]]
        report["control_deps"] = applied.meta["fxsched"]["control_deps"]
        timings["trace_apply_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        ref = gm(*inputs)
        got = applied(*inputs)
        compare_all(ref, got, exact_compute=True)  # same kernels in eager: bitwise for all but reductions
        timings["eager_s"] = time.perf_counter() - t0
        if inductor:
            import torch._inductor.config as inductor_config
            from torch._inductor.compile_fx import compile_fx_inner

            inductor_config.compile_threads = 1  # no worker pool per rank on a small CI machine
            t0 = time.perf_counter()
            c_ref = compile_fx_inner(gm, list(inputs))  # compiles in place: eager runs are done
            c_got = compile_fx_inner(applied, list(inputs))
            timings["inductor_compile_s"] = time.perf_counter() - t0
            ref_c = c_ref(list(inputs))
            got_c = c_got(list(inputs))
            compare_all(ref_c, got_c, exact_compute=False)  # fusion may differ: allclose for compute
            compare_all(ref, got_c, exact_compute=False)
            report["inductor_order"] = source_order(c_got.source_code)  # type: ignore[attr-defined]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)
