"""Start gloo ranks for the multi-process tests, from a forkserver, and fail (not hang) on timeout.

The ranks fork from one fresh forkserver that imported torch, Inductor and fxsched once (a
spawned rank pays ~5-10 s of imports on a loaded 2-core machine). The forkserver has run no
torch op, so forking it is safe, unlike forking pytest's own process.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(fn: Callable, world: int, args: tuple, out_dir: Path, preload: Sequence[str],
              timeout_s: float) -> list[dict]:
    """Run ``fn(rank, *args)`` on ``world`` ranks; each writes ``out_dir / f"rank{r}.json"``, returned
    in rank order. A rank that raises fails the test; ranks still running at the timeout are killed."""
    mp.get_context("forkserver").set_forkserver_preload(list(preload))
    ctx = mp.start_processes(fn, args=args, nprocs=world, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):  # raises ProcessRaisedException when a rank raised
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"gloo ranks did not finish in {timeout_s} s (hang?)")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
