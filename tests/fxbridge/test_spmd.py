"""SPMD safety of the compile hook (DESIGN.md, "SPMD safety").

* Deterministic mode: two separate Python processes (this one and a fresh interpreter with
  another ``PYTHONHASHSEED``, so set-order accidents show), as ranks 0 and 1 of 8, run the pass
  on the same graph in both solver modes and store byte-identical schedules.
* Broadcast mode: the protocol of :mod:`fxsched.fxbridge.spmd` in one process with a fake
  channel standing in for the other rank: all ranks apply rank 0's schedule or none does, also
  when a rank gives up waiting (``broadcast_timeout_s``) while another goes on. Real gloo ranks
  run it in ``test_hook_gloo.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.fx.experimental.proxy_tensor import make_fx

import hook_helpers
from fxsched.fxbridge.hook import FxschedPass, HookConfig
from fxsched.fxbridge.spmd import (
    ChannelTimeout,
    Payload,
    Round,
    StoreChannel,
    Vote,
    agreement,
    deterministic_solve_config,
)

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
    """Rank ``rank`` of 2 on an in-memory store (``store``: a dict two channels may share).

    A wait never blocks: keys still unset when it is called time out at once, as if the other
    rank were slower than ``broadcast_timeout_s``. ``peer(channel, keys)``, called first, may act
    for the other rank; ``fail`` makes every ``set`` raise. ``writes``: what this rank set.
    """

    def __init__(self, rank: int, store: dict[str, str] | None = None, peer=None, fail: bool = False):
        self.rank, self.world_size = rank, 2
        self.store = {} if store is None else store
        self.peer, self.fail = peer, fail
        self.rounds = 0
        self.writes: dict[str, Any] = {}

    def new_round(self) -> str:
        self.rounds += 1
        return f"r{self.rounds}"

    def set(self, key: str, value: str) -> None:
        if self.fail:
            raise RuntimeError("connection reset by peer")
        self.store[key] = value
        self.writes[key] = json.loads(value)

    def wait(self, keys, timeout_s: float) -> list[str]:
        if self.peer is not None:
            self.peer(self, keys)
        missing = [k for k in keys if k not in self.store]
        if missing:
            raise ChannelTimeout(missing, timeout_s)
        return [self.store[k] for k in keys]

    def set_once(self, key: str, value: str) -> str:
        return self.store.setdefault(key, value)

    def delete(self, key: str) -> None:
        self.store.pop(key, None)

    def vote(self, phase: str = "schedule") -> Any:
        """This rank's vote in the last round."""
        return self.writes.get(f"r{self.rounds}/{phase}/vote/{self.rank}")

    def decision(self, phase: str = "schedule") -> str | None:
        return self.store.get(f"r{self.rounds}/{phase}/decision")


def _yes(phase: str, mine: dict) -> dict:
    return {"ok": True, "fingerprint": mine["fingerprint"], "reason": ""}


def peer(payload: Any = None, vote=_yes):
    """The other rank, acting when this one waits: rank 0 publishing ``payload`` (None: not yet),
    and in each phase voting ``vote(phase, this rank's vote)`` (None: not yet)."""

    def act(channel: FakeChannel, keys) -> None:
        for key in keys:
            rnd, *rest = key.split("/")
            if rest == ["payload"] and payload is not None:
                channel.store.setdefault(key, json.dumps(payload))
            elif len(rest) == 3 and rest[1] == "vote" and int(rest[2]) != channel.rank:
                theirs = vote(rest[0], json.loads(channel.store[f"{rnd}/{rest[0]}/vote/{channel.rank}"]))
                if theirs is not None:
                    channel.store.setdefault(key, json.dumps(theirs))

    return act


def _broadcast_pass(tmp_path: Path, channel: FakeChannel, **kw) -> FxschedPass:
    config = HookConfig(time_budget_s=2.0, memory_limit=2.0, cache_dir=tmp_path / "cache", spmd="broadcast", **kw)
    return FxschedPass(config, channel=channel)


@pytest.fixture(scope="module")
def rank0_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What rank 0 broadcasts for the step graph (also checks rank 0's side)."""
    channel = FakeChannel(0, peer=peer())
    fxpass = _broadcast_pass(tmp_path_factory.mktemp("rank0"), channel)
    gm = hook_helpers.step_graph(rank=0)
    before = src(gm)
    fxpass(gm.graph)
    rec = fxpass.records[-1]
    assert (rec.outcome, rec.spmd, rec.cache, rec.stored) == ("solved", "broadcast", "miss", True)
    assert channel.vote()["ok"] is True and channel.vote("applied")["ok"] is True
    assert channel.decision() == channel.decision("applied") == "commit"
    assert "r1/payload" not in channel.store  # released once every rank had it
    assert src(gm) != before and rec.buckets >= 1
    sent = channel.writes["r1/payload"]
    payload = Payload.from_obj(sent)
    assert payload.fingerprint == rec.fingerprint and payload.source == "solved" and payload.schedule
    return sent


def test_uuid_is_none_with_several_ranks(tmp_path: Path):
    assert _broadcast_pass(tmp_path, FakeChannel(0)).uuid() is None  # FX graph cache bypassed
    if dist.is_initialized():
        dist.destroy_process_group()  # one process, no group: solved locally, cacheable
    assert FxschedPass(HookConfig(spmd="broadcast", cache_dir=tmp_path)).uuid() is not None


def test_rank1_applies_rank0_schedule(tmp_path: Path, rank0_payload: dict):
    channel = FakeChannel(1, peer=peer(rank0_payload))
    fxpass = _broadcast_pass(tmp_path, channel)
    gm = hook_helpers.step_graph(rank=1)
    fxpass(gm.graph)
    rec = fxpass.records[-1]
    assert (rec.outcome, rec.cache, rec.stored) == ("solved", None, False)  # rank 1 neither looks up nor stores
    assert rec.fingerprint == rank0_payload["fingerprint"] and rec.objective_ns == rank0_payload["objective_ns"]
    assert rec.buckets == len(json.loads(rank0_payload["schedule"])["buckets"])
    assert channel.decision() == channel.decision("applied") == "commit"
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
    channel = FakeChannel(1, peer=peer(payload))
    _refused(_broadcast_pass(tmp_path, channel), hook_helpers.step_graph(rank=1), caplog, "another graph")
    assert channel.vote()["ok"] is False and channel.decision().startswith("abort:")
    assert channel.vote("applied") is None  # the round ended at the schedule phase


def test_peer_that_votes_no_keeps_rank0_graph(tmp_path: Path, caplog):
    channel = FakeChannel(0, peer=peer(vote=lambda phase, mine: {"ok": False, "fingerprint": mine["fingerprint"],
                                                                 "reason": "dry run failed"}))
    fxpass = _broadcast_pass(tmp_path, channel)
    _refused(fxpass, hook_helpers.step_graph(rank=0), caplog, "rank 1: dry run failed")
    assert channel.vote()["ok"] is True and not fxpass.records[-1].stored
    assert not list((tmp_path / "cache").glob("*.json"))  # nothing stored without agreement


def test_peer_on_another_graph_keeps_rank0_graph(tmp_path: Path, caplog):
    channel = FakeChannel(0, peer=peer(vote=lambda phase, mine: {"ok": True, "fingerprint": "e" * 64, "reason": ""}))
    _refused(_broadcast_pass(tmp_path, channel), hook_helpers.step_graph(rank=0), caplog, "different graphs")


def test_rank0_without_schedule(tmp_path: Path, rank0_payload: dict, caplog):
    payload = Payload(rank0_payload["fingerprint"], None, error="RuntimeError: solver exploded").to_obj()
    channel = FakeChannel(1, peer=peer(payload))
    _refused(_broadcast_pass(tmp_path, channel), hook_helpers.step_graph(rank=1), caplog, "solver exploded")
    assert channel.vote()["ok"] is False


def test_local_extraction_failure_still_takes_part(tmp_path: Path, rank0_payload: dict, caplog):
    """A rank whose extraction fails still publishes (rank 0) and votes no (else the others wait)."""
    group, _ = hook_helpers.fake_world()

    def fn(a, b):
        return funcol.all_reduce(a, "sum", group) + 1, funcol.broadcast(b, 0, group) * 2

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4), torch.randn(4))
    for rank in (0, 1):
        channel = FakeChannel(rank, peer=peer(rank0_payload))
        _refused(_broadcast_pass(tmp_path, channel), gm, caplog, "unsupported collective")
        assert channel.vote()["ok"] is False and channel.decision().startswith("abort:")
        if rank == 0:
            sent = channel.writes["r1/payload"]
            assert sent["schedule"] is None and "unsupported collective" in sent["error"]


def test_channel_error_keeps_the_graph(tmp_path: Path, caplog):
    _refused(_broadcast_pass(tmp_path, FakeChannel(0, fail=True)), hook_helpers.step_graph(rank=0), caplog,
             "connection reset by peer")


# ---------------------------------------------------------------- broadcast mode: time-outs


def test_rank0_too_slow_every_rank_keeps_its_graph(tmp_path: Path, caplog):
    """The CI flake: rank 1 gives up waiting for rank 0's schedule (broadcast_timeout_s) and keeps
    its graph; rank 0 publishes a good schedule later. Rank 0 must keep its graph too."""
    store: dict[str, str] = {}
    ch1 = FakeChannel(1, store)  # rank 0 has published nothing yet
    _refused(_broadcast_pass(tmp_path / "1", ch1), hook_helpers.step_graph(rank=1), caplog,
             "no schedule from rank 0: none came within broadcast_timeout_s=1800 s")
    assert ch1.vote()["ok"] is False
    assert any("no schedule from rank 0 within broadcast_timeout_s=1800 s" in r.getMessage()
               for r in caplog.records if r.name == "fxsched.fxbridge.spmd")
    ch0 = FakeChannel(0, store)  # rank 0 arrives, with its schedule
    fxpass0 = _broadcast_pass(tmp_path / "0", ch0)
    _refused(fxpass0, hook_helpers.step_graph(rank=0), caplog, "rank 1: HookError: no schedule from rank 0")
    assert ch0.writes["r1/payload"]["schedule"] and ch0.vote()["ok"] is True  # rank 0 had a good schedule
    assert not fxpass0.records[-1].stored


def test_rank_that_gave_up_on_the_votes_stops_rank0(tmp_path: Path, rank0_payload: dict, caplog):
    """Rank 1 had the schedule and voted yes, then gave up waiting for rank 0's vote (and kept its
    graph). Rank 0, later, finds two yes votes, yet must keep its graph: rank 1's abort was
    stored first. Deciding from the votes alone would apply on rank 0 only."""
    store = {"r1/payload": json.dumps(rank0_payload)}  # rank 0 published, then was slow to vote
    ch1 = FakeChannel(1, store)
    _refused(_broadcast_pass(tmp_path / "1", ch1), hook_helpers.step_graph(rank=1), caplog,
             "rank 1: no schedule vote from rank(s) [0] within broadcast_timeout_s=1800 s")
    assert ch1.vote()["ok"] is True
    ch0 = FakeChannel(0, store)
    fxpass0 = _broadcast_pass(tmp_path / "0", ch0)
    _refused(fxpass0, hook_helpers.step_graph(rank=0), caplog, "no schedule vote from rank(s) [0]")
    votes = [json.loads(store[f"r1/schedule/vote/{r}"]) for r in (0, 1)]
    assert agreement(votes) == (True, "")  # every rank voted yes ...
    assert ch0.decision().startswith("abort:") and not fxpass0.records[-1].stored  # ... and none applied
    assert ch0.vote("applied") is None  # rank 0 never rewrote its graph


def test_peer_that_cannot_apply_makes_every_rank_restore(tmp_path: Path, caplog):
    """After the commit, the other rank's in-place apply fails (it restores its graph): this rank
    undoes its own apply."""

    def vote(phase: str, mine: dict) -> dict:
        failed = phase == "applied"
        return {"ok": not failed, "fingerprint": mine["fingerprint"], "reason": "in-place apply failed: boom" * failed}

    channel = FakeChannel(0, peer=peer(vote=vote))
    fxpass = _broadcast_pass(tmp_path, channel)
    _refused(fxpass, hook_helpers.step_graph(rank=0), caplog, "rank 1: in-place apply failed: boom")
    assert channel.decision() == "commit" and channel.vote("applied")["ok"] is True
    rec = fxpass.records[-1]
    assert rec.buckets is None and not rec.stored
    assert any("another rank could not apply the schedule; the graph was rebuilt" in r.getMessage()
               for r in caplog.records)


def test_store_channel_rounds():
    """The real channel on a c10d store (a HashStore here): a rank that timed out makes the late
    rank 0 abort; two ranks on time both commit."""
    store = dist.HashStore()
    ch0, ch1 = StoreChannel(store, 0, 2), StoreChannel(store, 1, 2)
    late = Round(ch1, 0.05)
    got = late.broadcast(None)
    assert got.schedule is None and "broadcast_timeout_s=0.05 s" in got.error
    assert late.settle("schedule", Vote(False, "fp", got.error)) == (False, f"rank 1: {got.error}")
    rnd0 = Round(ch0, 0.05)
    assert rnd0.prefix == late.prefix == "r1"
    rnd0.broadcast(Payload("fp", "{}"))
    assert rnd0.settle("schedule", Vote(True, "fp")) == (False, f"rank 1: {got.error}")

    results: dict[int, tuple[bool, str]] = {}

    def rank(ch: StoreChannel) -> None:
        rnd = Round(ch, 60.0)
        p = rnd.broadcast(Payload("fp2", "{}") if ch.rank == 0 else None)
        results[ch.rank] = rnd.settle("schedule", Vote(p.fingerprint == "fp2", p.fingerprint))

    threads = [threading.Thread(target=rank, args=(ch,)) for ch in (ch1, ch0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {0: (True, ""), 1: (True, "")}


def test_agreement_rules():
    fp = "a" * 64
    yes = {"ok": True, "fingerprint": fp, "reason": ""}
    assert agreement([yes, yes]) == (True, "")
    assert agreement([yes, {**yes, "ok": False, "reason": "x"}]) == (False, "rank 1: x")
    assert not agreement([yes, {**yes, "fingerprint": "b" * 64}])[0]
    assert not agreement([yes, "garbage"])[0]
    assert Payload.from_obj("garbage").error and Payload.from_obj(None).schedule is None
