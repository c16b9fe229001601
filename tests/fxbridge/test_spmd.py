"""SPMD safety of the compile hook (DESIGN.md, "SPMD safety").

* Deterministic mode: two separate Python processes (this one and a fresh interpreter with
  another ``PYTHONHASHSEED``, so set-order accidents show), as ranks 0 and 1 of 8, run the pass
  on the same graph in both solver modes and store byte-identical schedules.
* Broadcast mode: the protocol of :mod:`fxsched.fxbridge.spmd` in one process with a fake
  channel standing in for the other rank: all ranks apply rank 0's schedule or none does.
  Real gloo ranks run it in ``test_hook_gloo.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.fx.experimental.proxy_tensor import make_fx

import hook_helpers
from fxsched.fxbridge.hook import FxschedPass, HookConfig
from fxsched.fxbridge.spmd import Payload, agreement, deterministic_solve_config

HERE = Path(__file__).parent
MODES = ["fixed", "free"]
src = hook_helpers.src


# ---------------------------------------------------------------- deterministic mode, 2 processes


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Rank 1 in a fresh interpreter with another hash seed, rank 0 in this process meanwhile;
    each with its own cache directory."""
    tmp = tmp_path_factory.mktemp("spmd")
    seed = os.environ.get("PYTHONHASHSEED", "")
    env = {**os.environ, "PYTHONHASHSEED": "1" if seed != "1" else "2",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "hook_helpers", str(tmp / "out1.json"), str(tmp / "cache1"), "1", *MODES]
    child = subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        here = hook_helpers.spmd_run(str(tmp / "cache0"), 0, MODES)
        out, _ = child.communicate(timeout=180)
    except BaseException:
        child.kill()
        raise
    assert child.returncode == 0, out.decode()[-3000:]
    return [here, json.loads((tmp / "out1.json").read_text())]


@pytest.mark.parametrize("mode", MODES)
def test_two_processes_store_byte_identical_schedules(two_processes: list[dict], mode: str):
    a, b = (p[mode] for p in two_processes)
    assert a["record"]["outcome"] == b["record"]["outcome"] == "solved"
    assert a["record"]["fingerprint"] == b["record"]["fingerprint"]
    assert a["schedule"] is not None and a["schedule"] == b["schedule"]
    for key in ("status", "objective_ns", "lower_bound_ns", "buckets"):
        assert a["record"][key] == b["record"][key], key


def test_deterministic_solve_config():
    c = deterministic_solve_config(memory_budget=1.5, seed=7, workers=4)
    assert (c.deterministic, c.seed, c.workers, c.memory_budget) == (True, 7, 4, 1.5)
    assert HookConfig().solve_config() == deterministic_solve_config()


# ---------------------------------------------------------------- broadcast mode, fake channel


class FakeChannel:
    """This process is ``rank``; the other rank of 2 is simulated: what rank 0 broadcasts (seen
    by rank 1) is ``payload``, and the other rank's vote is ``peer_vote(my_vote)``."""

    def __init__(self, rank: int, payload: Any = None, peer_vote=None, fail: str | None = None):
        self.rank, self.world_size = rank, 2
        self.payload, self.fail = payload, fail
        self.peer_vote = peer_vote or (lambda mine: {"ok": True, "fingerprint": mine["fingerprint"], "reason": ""})
        self.calls: list[str] = []
        self.sent: Any = None
        self.vote: Any = None

    def broadcast(self, obj: Any) -> Any:
        self.calls.append("broadcast")
        if self.fail == "broadcast":
            raise RuntimeError("connection reset by peer")
        if self.rank == 0:
            self.sent = obj
            return obj
        return self.payload

    def all_gather(self, obj: Any) -> list[Any]:
        self.calls.append("all_gather")
        self.vote = obj
        peer = self.peer_vote(obj)
        return [obj, peer] if self.rank == 0 else [peer, obj]


def _broadcast_pass(tmp_path: Path, channel: FakeChannel, **kw) -> FxschedPass:
    config = HookConfig(time_budget_s=2.0, memory_limit=2.0, cache_dir=tmp_path / "cache", spmd="broadcast", **kw)
    return FxschedPass(config, channel=channel)


@pytest.fixture(scope="module")
def rank0_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What rank 0 broadcasts for the step graph (also checks rank 0's side)."""
    channel = FakeChannel(0)
    fxpass = _broadcast_pass(tmp_path_factory.mktemp("rank0"), channel)
    gm = hook_helpers.step_graph(rank=0)
    before = src(gm)
    fxpass(gm.graph)
    rec = fxpass.records[-1]
    assert (rec.outcome, rec.spmd, rec.cache, rec.stored) == ("solved", "broadcast", "miss", True)
    assert channel.calls == ["broadcast", "all_gather"] and channel.vote["ok"] is True
    assert src(gm) != before and rec.buckets >= 1
    payload = Payload.from_obj(channel.sent)
    assert payload.fingerprint == rec.fingerprint and payload.source == "solved" and payload.schedule
    return channel.sent


def test_uuid_is_none_with_several_ranks(tmp_path: Path):
    assert _broadcast_pass(tmp_path, FakeChannel(0)).uuid() is None  # FX graph cache bypassed
    if dist.is_initialized():
        dist.destroy_process_group()  # one process, no group: solved locally, cacheable
    assert FxschedPass(HookConfig(spmd="broadcast", cache_dir=tmp_path)).uuid() is not None


def test_rank1_applies_rank0_schedule(tmp_path: Path, rank0_payload: dict):
    channel = FakeChannel(1, payload=rank0_payload)
    fxpass = _broadcast_pass(tmp_path, channel)
    gm = hook_helpers.step_graph(rank=1)
    fxpass(gm.graph)
    rec = fxpass.records[-1]
    assert (rec.outcome, rec.cache, rec.stored) == ("solved", None, False)  # rank 1 neither looks up nor stores
    assert rec.fingerprint == rank0_payload["fingerprint"] and rec.objective_ns == rank0_payload["objective_ns"]
    assert rec.buckets == len(json.loads(rank0_payload["schedule"])["buckets"])
    assert not (tmp_path / "cache").exists()


def _refused(fxpass: FxschedPass, gm, caplog, match: str) -> None:
    before = src(gm)
    with caplog.at_level(logging.WARNING, logger="fxsched.fxbridge.hook"):
        fxpass(gm.graph)
    rec = fxpass.records[-1]
    assert rec.outcome == "failed" and match in rec.reason, rec.reason
    assert src(gm) == before
    assert any("left unchanged" in r.getMessage() for r in caplog.records)


def test_fingerprint_mismatch_keeps_every_graph(tmp_path: Path, rank0_payload: dict, caplog):
    """Rank 0 compiled another graph: rank 1 votes no, so nobody applies."""
    payload = {**rank0_payload, "fingerprint": "f" * 64}
    channel = FakeChannel(1, payload=payload)
    _refused(_broadcast_pass(tmp_path, channel), hook_helpers.step_graph(rank=1), caplog, "another graph")
    assert channel.vote["ok"] is False and channel.calls == ["broadcast", "all_gather"]


def test_peer_that_votes_no_keeps_rank0_graph(tmp_path: Path, caplog):
    channel = FakeChannel(0, peer_vote=lambda mine: {"ok": False, "fingerprint": mine["fingerprint"],
                                                     "reason": "dry run failed"})
    fxpass = _broadcast_pass(tmp_path, channel)
    _refused(fxpass, hook_helpers.step_graph(rank=0), caplog, "rank 1: dry run failed")
    assert channel.vote["ok"] is True and not fxpass.records[-1].stored
    assert not list((tmp_path / "cache").glob("*.json"))  # nothing stored without agreement


def test_peer_on_another_graph_keeps_rank0_graph(tmp_path: Path, caplog):
    channel = FakeChannel(0, peer_vote=lambda mine: {"ok": True, "fingerprint": "e" * 64, "reason": ""})
    _refused(_broadcast_pass(tmp_path, channel), hook_helpers.step_graph(rank=0), caplog, "different graphs")


def test_rank0_without_schedule(tmp_path: Path, rank0_payload: dict, caplog):
    payload = Payload(rank0_payload["fingerprint"], None, error="RuntimeError: solver exploded").to_obj()
    channel = FakeChannel(1, payload=payload)
    _refused(_broadcast_pass(tmp_path, channel), hook_helpers.step_graph(rank=1), caplog, "solver exploded")
    assert channel.vote["ok"] is False


def test_local_extraction_failure_still_takes_part(tmp_path: Path, rank0_payload: dict, caplog):
    """A rank whose extraction fails still calls both collectives (else the others hang) and votes no."""
    group, _ = hook_helpers.fake_world()

    def fn(a, b):
        return funcol.all_reduce(a, "sum", group) + 1, funcol.broadcast(b, 0, group) * 2

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4), torch.randn(4))
    for rank in (0, 1):
        channel = FakeChannel(rank, payload=rank0_payload)
        _refused(_broadcast_pass(tmp_path, channel), gm, caplog, "unsupported collective")
        assert channel.calls == ["broadcast", "all_gather"] and channel.vote["ok"] is False
        if rank == 0:
            assert channel.sent["schedule"] is None and "unsupported collective" in channel.sent["error"]


def test_channel_error_keeps_the_graph(tmp_path: Path, caplog):
    _refused(_broadcast_pass(tmp_path, FakeChannel(0, fail="broadcast")), hook_helpers.step_graph(rank=0), caplog,
             "connection reset by peer")


def test_agreement_rules():
    fp = "a" * 64
    yes = {"ok": True, "fingerprint": fp, "reason": ""}
    assert agreement([yes, yes]) == (True, "")
    assert agreement([yes, {**yes, "ok": False, "reason": "x"}]) == (False, "rank 1: x")
    assert not agreement([yes, {**yes, "fingerprint": "b" * 64}])[0]
    assert not agreement([yes, "garbage"])[0]
    assert Payload.from_obj("garbage").error and Payload.from_obj(None).schedule is None
