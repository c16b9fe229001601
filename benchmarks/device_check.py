"""Device check: Inductor, compiling an fxsched-scheduled graph for a real device, keeps its order.

``python -m fxsched.benchmarks.device_check --device cuda`` (one GPU: NCCL, world size 1), or
``--device cpu`` (gloo, world size 1; what the tests run). One process:

1. An FSDP-style step is traced with ``make_fx`` (fake tensors, Inductor's decompositions, as
   :mod:`fxsched.benchmarks.zoo` does): per layer a weight shard is all_gathered and multiplied
   in; then each layer's "weight gradient" is reduce_scattered and the loss all_reduced.
2. :func:`fxsched.fxbridge.extract.extract_problem` prices it as if the group had
   ``--price-ranks`` ranks (at world size 1 every collective would be free and nothing would
   move), :func:`fxsched.solver.solve` schedules it (buckets, prefetches, waits) within
   ``--memory`` times the original peak, and :func:`fxsched.fxbridge.apply.apply_schedule`
   applies it with control dependencies.
3. Inductor's ``compile_fx_inner`` compiles the traced graph for the device, with the schedule
   applied in its post-grad custom pass (where the compile hook applies it: after Inductor's
   fake-tensor propagation), and it runs on the same inputs as the eager original.

Checks (each a line of the JSON report; the exit status is 1 when one fails): the scheduled
graph lints; the compiled scheduled graph's outputs equal the eager original's (allclose); the
collectives, waits and matmuls in Inductor's wrapper code come in the scheduled graph's order,
so Inductor's own scheduler reordered nothing the schedule placed; the schedule moved something
(buckets or a prefetch), so that the order check is not vacuous.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx

_MM = ("mm", "addmm", "bmm")  # matmuls Inductor leaves to extern kernels, all tagged "mm"
_CALL = re.compile(r"\s*(?:buf\w+ = )?(?:torch\.ops\._c10d_functional\.(\w+)\.default|extern_kernels\.(?:"
                   + "|".join(_MM) + r"))\(")


def step(group: str):
    """The traced step: ``shards`` all_gathered and multiplied in, one reduce_scatter per layer of
    ``h_i^T h_i`` (a weight gradient's shape), and the loss all_reduced."""

    def fn(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        *shards, x = args
        h, grads = x, []
        for w in shards:
            h = torch.tanh(h @ funcol.all_gather_tensor(w, 0, group))
            grads.append(funcol.reduce_scatter_tensor(h.t() @ h, "sum", 0, group))
        loss = funcol.all_reduce(h.float().pow(2).sum().reshape(1), "sum", group)
        return (h, loss, *grads)

    return fn


def make_inputs(layers: int, dim: int, rows: int, world: int, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shards = [torch.randn(dim // world, dim, generator=gen) / dim ** 0.5 for _ in range(layers)]
    return [t.to(device=device, dtype=dtype) for t in (*shards, torch.randn(rows, dim, generator=gen))]


def trace(fn, inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*inputs)


def _target(gm: fx.GraphModule, node: fx.Node) -> Any:
    """The op ``node`` runs: for a ``control_deps`` node (control_dependencies.py), the one call
    of the subgraph it wraps (its second argument, a ``get_attr``)."""
    if getattr(node.target, "__name__", "") == "control_deps":
        sub = getattr(gm, node.args[1].target)  # type: ignore[union-attr,arg-type]
        (call,) = [n for n in sub.graph.nodes if n.op == "call_function"]
        return call.target
    return node.target


def graph_order(gm: fx.GraphModule) -> list[str]:
    """The collectives, waits and matmuls of ``gm``, in graph order, as :func:`code_order` tags them."""
    tags = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = _target(gm, node)
        op = getattr(target, "__name__", "").split(".")[0]  # "all_gather_into_tensor.default" -> its op
        ns = getattr(target, "namespace", "")
        if ns == "_c10d_functional" or (ns == "aten" and op in _MM):
            tags.append("mm" if op in _MM else op)
    return tags


def code_order(source: str) -> list[str]:
    """The collective, wait and matmul calls of an Inductor wrapper's ``call``, in order (an
    in-place variant, which Inductor lowers ``all_reduce`` to, tagged as its functional op)."""
    tags = []
    for line in source[source.index("def call("):].splitlines():
        m = _CALL.match(line)
        if m:
            tags.append(m.group(1).removesuffix("_") if m.group(1) else "mm")
    return tags


def _untargeted(problem: Any) -> Any:
    """``problem`` with its ops' ``target`` labels cleared: Inductor's ``view_to_reshape`` turns
    views into reshapes before its post-grad passes, which changes a label and no cost or edge."""
    import dataclasses

    return dataclasses.replace(problem, ops=tuple(dataclasses.replace(op, target=None) for op in problem.ops))


def _post_grad_apply(ext: Any, schedule: Any, group: str, price_ranks: int, control_deps: bool,
                     seen: dict[str, Any]) -> Any:
    """An Inductor post-grad pass that applies ``schedule`` where the compile hook does: to the
    graph Inductor compiles, re-extracted (it must give ``ext``'s problem, else the schedule
    would not fit it), after Inductor's own fake-tensor propagation. Records in ``seen`` that the
    applied graph linted, its order and its number of control dependencies."""
    from ..fxbridge.apply import apply_schedule
    from ..fxbridge.extract import extract_problem

    def post_grad_pass(graph: fx.Graph) -> None:
        gm = graph.owning_module
        again = extract_problem(gm, groups={group: price_ranks}, name="device_check")
        if _untargeted(again.problem) != _untargeted(ext.problem):
            raise RuntimeError("the graph Inductor compiles extracts to another problem than the traced one")
        apply_schedule(again, schedule, inplace=True, control_deps=control_deps)
        graph.lint()
        seen.update(lint=True, order=graph_order(gm), control_deps=gm.meta["fxsched"]["control_deps"])

    return post_grad_pass


def run_check(device: str = "cpu", layers: int = 4, dim: int = 64, rows: int = 16, price_ranks: int = 8,
              budget_s: float = 2.0, memory: float = 2.0, control_deps: bool = True,
              peak_memory_reorder: bool = False) -> dict[str, Any]:
    """Steps 1-3 of the module doc in this process (which must have a world-size-1 default
    group on ``device``'s backend); the report. ``peak_memory_reorder=True`` leaves Inductor's
    ``reorder_for_peak_memory`` on (the compile hook turns it off). ``control_deps=False`` applies the schedule
    without them, to see what Inductor does with the order alone."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    from ..fxbridge.extract import extract_problem
    from ..solver import simulate
    from ..solver.cpsat import SolveConfig, solve

    group = str(dist.group.WORLD.group_name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    inputs = make_inputs(layers, dim, rows, dist.get_world_size(), device, dtype)
    report: dict[str, Any] = {"device": device, "torch": torch.__version__, "layers": layers, "dim": dim,
                              "control_deps": control_deps, "peak_memory_reorder": peak_memory_reorder, "checks": {}}
    checks = report["checks"]
    t0 = time.perf_counter()
    gm = trace(step(group), inputs)
    ext = extract_problem(gm, groups={group: price_ranks}, name="device_check")
    res = solve(ext.problem, budget_s, SolveConfig(mode="free", memory_budget=memory))
    in_pass: dict[str, Any] = {}
    report["solve"] = {"status": res.status.value, "makespan_ns": res.objective, "lower_bound_ns": res.lower_bound,
                       "original_ns": simulate(ext.problem).makespan_ns, "buckets": len(res.schedule.buckets)}
    inductor_config.compile_threads = 1
    with torch.no_grad():
        ref = [t.wait() if hasattr(t, "wait") else t for t in gm(*inputs)]
        with inductor_config.patch(post_grad_custom_post_pass=_post_grad_apply(ext, res.schedule, group, price_ranks,
                                                                                control_deps, in_pass),
                                   fx_graph_cache=False, reorder_for_peak_memory=peak_memory_reorder):
            compiled = compile_fx_inner(copy.deepcopy(gm), list(inputs))
        got = compiled(list(inputs))
    report["seconds"] = round(time.perf_counter() - t0, 1)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    checks["outputs_match"] = len(ref) == len(got) and all(
        torch.allclose(g.float(), r.float(), rtol=tol, atol=tol) for r, g in zip(ref, got))
    checks["applied_in_post_grad_pass"] = "order" in in_pass
    checks["lint"] = in_pass.get("lint", False)
    expected = in_pass.get("order", [])
    report["solve"]["control_deps"] = in_pass.get("control_deps", 0)
    checks["schedule_moved_something"] = expected != graph_order(gm) or bool(res.schedule.buckets)
    found = code_order(compiled.source_code)  # type: ignore[attr-defined]
    report["order"] = {"scheduled": expected, "inductor": found}
    checks["inductor_keeps_order"] = found == expected
    report["ok"] = all(checks.values())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=None, help="feature size (default: 4096 on cuda, 64 on cpu)")
    ap.add_argument("--rows", type=int, default=None, help="batch rows (default: 8192 on cuda, 16 on cpu)")
    ap.add_argument("--price-ranks", type=int, default=8)
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--memory", type=float, default=2.0, help="memory budget, a ratio of the original peak")
    ap.add_argument("--no-control-deps", action="store_true", help="apply without control dependencies")
    ap.add_argument("--peak-memory-reorder", action="store_true",
                    help="leave Inductor's reorder_for_peak_memory on (the compile hook turns it off)")
    ap.add_argument("--out", default=None, help="also write the JSON report here")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_check: no CUDA device", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0) if cuda else None)
        try:
            report = run_check(args.device, args.layers, args.dim or (4096 if cuda else 64),
                               args.rows or (8192 if cuda else 16), args.price_ranks, args.budget, args.memory,
                               not args.no_control_deps, args.peak_memory_reorder)
        finally:
            dist.destroy_process_group()
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
