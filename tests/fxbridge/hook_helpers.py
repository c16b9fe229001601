"""Shared pieces of the compile-hook tests: graphs on a fake process group, and the code that runs
in other processes (``test_spmd.py``'s solver processes, ``test_hook_gloo.py``'s gloo ranks).

Top-level functions only, so that spawned and forkserver processes can import them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.testing._internal.distributed.fake_pg import FakeStore

import gloo_graphs

WORLD, RANK = 4, 1


def fake_world(world: int = WORLD, rank: int = RANK) -> tuple[str, str]:
    """A fresh fake default group (replacing any fake one) and a second group over all ranks."""
    if dist.is_initialized():
        assert str(dist.get_backend()) == "fake", "a real process group is initialized"
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    return str(dist.group.WORLD.group_name), gloo_graphs.second_group(world)


def step_graph(world: int = WORLD, rank: int = RANK) -> fx.GraphModule:
    """The FSDP-style step of :mod:`gloo_graphs` on a fresh fake group: 7 collectives, and with a
    generous memory limit CP-SAT buckets the reduce_scatters (and the all_gathers at world 4)."""
    groups = fake_world(world, rank)
    return gloo_graphs.trace(groups, gloo_graphs.make_inputs(rank, world))


def src(gm: fx.GraphModule) -> str:
    """The graph's code, generated now (``gm.code`` is only refreshed by recompile)."""
    return gm.graph.python_code(root_module="self").src


# ---------------------------------------------------------------- test_spmd: one solver process


def spmd_run(cache_dir: str, rank: int, modes: list[str]) -> dict[str, Any]:
    """Run the pass on the step graph of 8 ranks as ``rank`` would (deterministic default config,
    solver mode each of ``modes``); per mode, the record and the canonical JSON of the schedule
    it stored."""
    from fxsched.fxbridge.cache import ScheduleCache
    from fxsched.fxbridge.hook import FxschedPass, HookConfig
    from fxsched.fxbridge.spmd import schedule_json

    result: dict[str, Any] = {}
    for mode in modes:
        gm = step_graph(8, rank)
        fxpass = FxschedPass(HookConfig(time_budget_s=0.5, memory_limit=2.0, cache_dir=f"{cache_dir}/{mode}",
                                        mode=mode))
        fxpass(gm.graph)
        rec = fxpass.records[-1]
        entry = ScheduleCache(f"{cache_dir}/{mode}").get_entry(rec.fingerprint) if rec.fingerprint else None
        result[mode] = {"record": rec.to_dict(), "schedule": schedule_json(entry.schedule) if entry else None}
    return result


def spmd_main(argv: list[str]) -> None:
    """``python -m hook_helpers OUT.json CACHE_DIR RANK MODE...``: :func:`spmd_run`, to a file."""
    out, cache_dir, rank, modes = argv[0], argv[1], int(argv[2]), argv[3:]
    Path(out).write_text(json.dumps(spmd_run(cache_dir, rank, modes)))


# ---------------------------------------------------------------- test_hook_gloo: one gloo rank

CHAIN_DIM, CHAIN_ROWS, CHAIN_LAYERS = 8, 4, 4
# The group's timeout bounds how far one rank's compile (C++ included) may run ahead of the other's
# before a collective of the compiled step gives up. Compiles take ~4x longer with both cores of
# a 2-core machine busy (the cold step: 24 s -> 100 s), so keep it well above that. (The hook's
# broadcast protocol does not use it: it waits on the store, up to broadcast_timeout_s.)
GLOO_TIMEOUT_S = 300


def chain_model(group: str):
    """A tiny FSDP-like chain: each layer all_gathers its weight shard and applies it. Every
    all_gather is on one group and waited right before its layer, so the solver buckets them
    (one collective latency instead of four) when memory allows."""
    import torch.distributed._functional_collectives as funcol

    def fn(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        *shards, x = args
        h = x
        for w in shards:
            h = torch.tanh(h @ funcol.all_gather_single(w, 0, group))
        return h, funcol.all_reduce(h.sum(0), "sum", group)

    return fn


def chain_inputs(rank: int, world: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    shards = [torch.randn(CHAIN_DIM // world, CHAIN_DIM, generator=gen) for _ in range(CHAIN_LAYERS)]
    return shards + [torch.randn(CHAIN_ROWS, CHAIN_DIM, generator=gen)]


def _resolved(outs: Any) -> list[torch.Tensor]:
    return [t.wait() if hasattr(t, "wait") else t for t in outs]


def _compile_once(fn, inputs: list[torch.Tensor]) -> tuple[Any, str]:
    """torch.compile ``fn`` from a clean Dynamo state, run it once; the outputs and the wrapper code."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="inductor")
    with torch.no_grad():
        out, codes = run_and_get_code(compiled, *inputs)
    return out, "\n".join(codes)


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}


def run_compile_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """One gloo rank of ``test_hook_gloo``: compile :func:`chain_model` with the hook, through
    Inductor's FX graph cache, and compare with eager each time. Writes ``rank{r}.json``."""
    import os
    from datetime import timedelta

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{out_dir}/inductor"
    import torch._inductor.config as inductor_config

    import fxsched.fxbridge.hook as fxhook
    from fxsched.fxbridge.cache import ScheduleCache
    from fxsched.solver import Schedule

    inductor_config.compile_threads = 1
    inductor_config.fx_graph_cache = True
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    report: dict[str, Any] = {"rank": rank, "steps": []}
    try:
        fn = chain_model(str(dist.group.WORLD.group_name))
        inputs = chain_inputs(rank, world)
        with torch.no_grad():
            ref = _resolved(fn(*inputs))
        cache_dir = f"{out_dir}/schedules/rank{rank}"
        fxpass = fxhook.enable(time_budget_s=2.0, memory_limit=2.0, cache_dir=cache_dir)

        def step(label: str) -> str:
            before = len(fxpass.records)
            c0 = _counters()
            out, code = _compile_once(fn, inputs)
            for r, o in zip(ref, _resolved(out), strict=True):
                torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
            c1 = _counters()
            report["steps"].append({
                "label": label,
                "records": [r.to_dict() for r in fxpass.records[before:]],
                "fx": {k: c1.get(k, 0) - c0.get(k, 0) for k in set(c0) | set(c1)},
                "order": gloo_graphs.source_order(code),
                "uuid": fxpass.uuid(),
            })
            return code

        step("cold")  # our miss: solved, stored
        step("warm")  # our cache changed since: FX graph cache miss, our hit
        step("fx-hit")  # nothing changed: FX graph cache hit, the pass does not run
        # a different valid schedule for the same fingerprint: the solved order without buckets
        cache = ScheduleCache(cache_dir)
        (fp,) = cache.fingerprints()
        entry = cache.get_entry(fp)
        assert entry is not None and entry.schedule.buckets, "the solver bucketed nothing"
        cache.put(fp, Schedule(entry.schedule.order), problem_name=entry.problem_name, solve=entry.solve)
        step("changed")  # uuid changed: FX graph cache miss, the pass applies the new entry
        fxhook.disable()

        # broadcast mode: rank 0 solves (no cache), every rank applies its schedule. The default
        # broadcast_timeout_s (30 min) outlasts the test's own limit: rank 1 never gives up on a
        # slow rank 0 here, so the outcome does not depend on the machine's load.
        fxpass = fxhook.enable(time_budget_s=2.0, memory_limit=2.0, cache_dir=None, spmd="broadcast",
                               deterministic=False)
        step("broadcast")
        fxhook.disable()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    spmd_main(sys.argv[1:])
