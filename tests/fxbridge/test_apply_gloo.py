"""Numerics of apply_schedule: several gloo processes on CPU run the original and the scheduled graph.

Each rank traces the FSDP-style step of :mod:`gloo_graphs` (all_gathers of fp32 and bf16 shards on
the world group, reduce_scatters on a second group, all_reduces), applies a schedule that moves
every collective and makes three buckets (one of them multi-dtype), and compares outputs on the
same random data: gathered values bitwise, reductions allclose. With ``inductor`` both graphs are
also compiled by Inductor's ``compile_fx_inner`` (C++ on CPU) and compared, and the compiled
wrapper code is checked to keep the scheduled overlap (a matmul between the reduce_scatter and
its wait, which Inductor's own reordering removes without the control dependencies).

Without a C++ compiler the Inductor part is left out (eager only). Measured on a loaded 2-core
machine: ~45 s for both world sizes with a cold Inductor cache, ~25 s warm.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch.distributed as dist

import gloo_graphs
from gloo_runner import free_port, run_ranks

TIMEOUT_S = 240  # a hung collective fails the test instead of blocking CI

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")


def _run(world: int, inductor: bool, out_dir: Path) -> list[dict]:
    """Run :func:`gloo_graphs.run_rank` on ``world`` ranks (see :mod:`gloo_runner`)."""
    return run_ranks(gloo_graphs.run_rank, world, (world, free_port(), inductor, str(out_dir)), out_dir,
                     ["gloo_graphs", "fxsched.fxbridge.apply", "torch._inductor.compile_fx"], TIMEOUT_S)


INDUCTOR = bool(shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++"))  # Inductor CPU needs C++


@pytest.mark.parametrize("world", [2, 4])
def test_scheduled_graph_computes_the_same_values(world: int, tmp_path: Path):
    inductor = INDUCTOR
    reports = _run(world, inductor, tmp_path)
    assert all("inductor_compile_s" in r["timings"] for r in reports) == inductor
    for rep in reports:
        # every rank made the same buckets (SPMD): all_gather (fp32 + bf16), reduce_scatter, all_reduce
        assert rep["buckets"] == reports[0]["buckets"]
        assert [len(b) for b in rep["buckets"]] == [3, 2, 2]
        assert [b[0].rstrip("_0123456789") for b in rep["buckets"]] == [
            "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"]
        assert rep["control_deps"] > 0
        if inductor:
            order = rep["inductor_order"]
            # Inductor kept the bucketed collectives and the overlap the control deps pin:
            # some matmul runs between the bucketed reduce_scatter's issue and its wait
            assert order.count("all_gather_into_tensor_out") == 1
            assert order.count("reduce_scatter_tensor") == 1
            rs = order.index("reduce_scatter_tensor")
            rs_wait = order.index("wait_tensor", rs)
            assert "mm" in order[rs:rs_wait], order
