"""The compile hook's pass in one process, called directly on FX graphs (no Inductor compile).

Graph: the FSDP-style step of :mod:`gloo_graphs`, traced on a fake group of 4 ranks (rank 1).
With ``memory_limit=2.0`` the solver buckets some of its collectives, so an applied schedule is
visible in the code. Inductor itself runs the pass in ``test_hook_gloo.py``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch._inductor import config as inductor_config
from torch.fx.experimental.proxy_tensor import make_fx

import gloo_graphs
import hook_helpers
from fxsched.fxbridge import hook as fxhook
from fxsched.fxbridge.cache import ScheduleCache, graph_fingerprint
from fxsched.fxbridge.extract import META_KEY, extract_problem
from fxsched.fxbridge.hook import FxschedPass, HookConfig
from fxsched.solver import Schedule

src = hook_helpers.src
LOGGER = "fxsched.fxbridge.hook"


def _config(tmp_path: Path, **kw) -> HookConfig:
    return HookConfig(**{"time_budget_s": 2.0, "memory_limit": 2.0, "cache_dir": tmp_path / "cache", **kw})


@pytest.fixture(scope="module", autouse=True)
def _release_fake_group():
    yield
    if dist.is_initialized() and str(dist.get_backend()) == "fake":
        dist.destroy_process_group()


def _fingerprint(gm: fx.GraphModule, config: HookConfig):
    ext = extract_problem(gm, profile=config.profile, fuse=config.fuse)
    return graph_fingerprint(gm, ext.problem, profile=config.profile, fuse=config.fuse), ext.problem


def _unchanged(fxpass: FxschedPass, gm: fx.GraphModule, caplog, match: str) -> dict:
    """Run the pass, expecting a warning that matches and the graph exactly as it was."""
    before = src(gm)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fxpass(gm.graph)
    rec = fxpass.records[-1]
    assert rec.outcome == "failed" and match in (rec.reason or ""), rec
    assert any("left unchanged" in r.getMessage() and match in r.getMessage() for r in caplog.records)
    assert src(gm) == before
    gm.graph.lint()
    assert gm.meta[META_KEY]["hook"]["outcome"] == "failed"
    return rec.to_dict()


def test_miss_then_hit(tmp_path: Path):
    config = _config(tmp_path)
    fxpass = FxschedPass(config)
    gm = hook_helpers.step_graph()
    before = src(gm)
    fxpass(gm.graph)
    (rec,) = fxpass.records
    assert (rec.outcome, rec.cache, rec.stored, rec.collectives) == ("solved", "miss", True, 7)
    assert rec.status in ("optimal", "feasible") and rec.objective_ns >= rec.lower_bound_ns > 0
    assert rec.buckets >= 1
    after = src(gm)
    assert after != before and "control_deps" in after
    assert gm.meta[META_KEY]["hook"] == rec.to_dict()
    assert len(gm.meta[META_KEY]["buckets"]) == rec.buckets
    assert (tmp_path / "cache" / f"{rec.fingerprint}.json").is_file()

    gm2 = hook_helpers.step_graph()  # the same graph, traced again: found in the cache
    fxpass(gm2.graph)
    hit = fxpass.records[-1]
    assert (hit.outcome, hit.cache, hit.fingerprint, hit.stored) == ("hit", "hit", rec.fingerprint, False)
    assert (hit.status, hit.objective_ns, hit.lower_bound_ns) == (rec.status, rec.objective_ns, rec.lower_bound_ns)
    assert src(gm2) == after


def test_no_cache_and_no_store(tmp_path: Path):
    fxpass = FxschedPass(_config(tmp_path, cache_dir=None))
    assert fxpass.cache is None
    gm = hook_helpers.step_graph()
    fxpass(gm.graph)
    assert (fxpass.records[-1].outcome, fxpass.records[-1].cache) == ("solved", "off")
    nostore = FxschedPass(_config(tmp_path, store=False))
    nostore(hook_helpers.step_graph().graph)
    assert nostore.records[-1].cache == "miss" and not nostore.records[-1].stored
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_graph_without_collectives_is_skipped(tmp_path: Path, caplog):
    gm = make_fx(lambda x: torch.relu(x @ x))(torch.randn(4, 4))
    before = src(gm)
    fxpass = FxschedPass(_config(tmp_path))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        fxpass(gm.graph)
    assert (fxpass.records[-1].outcome, fxpass.records[-1].collectives) == ("skipped", 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert src(gm) == before
    # a threshold above the graph's collective count skips it too
    gm2 = hook_helpers.step_graph()
    before2 = src(gm2)
    FxschedPass(_config(tmp_path, min_collectives=8))(gm2.graph)
    assert src(gm2) == before2


def test_uuid_tracks_config_and_cache_entries(tmp_path: Path):
    hook_helpers.fake_world()  # the rank is part of the uuid: the same group throughout
    config = _config(tmp_path)
    fxpass = FxschedPass(config)
    u0 = fxpass.uuid()
    assert isinstance(u0, str) and u0 == fxpass.uuid() == FxschedPass(config).uuid()
    for change in ({"time_budget_s": 3.0}, {"memory_limit": 1.5}, {"memory_limit": None}, {"seed": 1},
                   {"workers": 2}, {"mode": "free"}, {"profile": "a100"}, {"fuse": False},
                   {"cache_dir": tmp_path / "other"}, {"min_collectives": 2}):
        assert FxschedPass(_config(tmp_path, **change)).uuid() != u0, change
    assert FxschedPass(_config(tmp_path, broadcast_timeout_s=60.0)).uuid() == u0  # a wait limit, not code

    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "notes.txt").write_text("not an entry")
    assert fxpass.uuid() == u0  # files that are not entries do not count

    gm = hook_helpers.step_graph()
    fxpass(gm.graph)  # stores an entry
    u1 = fxpass.uuid()
    assert u1 != u0 and fxpass.uuid() == u1
    path = tmp_path / "cache" / f"{fxpass.records[-1].fingerprint}.json"
    doc = json.loads(path.read_text())
    doc["schedule"]["buckets"] = []  # another valid schedule for the same graph
    path.write_text(json.dumps(doc))
    assert fxpass.uuid() not in (u0, u1)
    path.unlink()
    assert fxpass.uuid() == u0


def test_uuid_changes_with_the_code(monkeypatch, tmp_path: Path):
    fxpass = FxschedPass(_config(tmp_path))
    u0 = fxpass.uuid()
    assert len(fxhook.fxsched_code_hash()) == 64
    monkeypatch.setattr(fxhook, "fxsched_code_hash", lambda: "0" * 64)
    assert fxpass.uuid() != u0


def test_uuid_depends_on_the_rank(tmp_path: Path):
    """An applied schedule is rank-specific (the all_gather bucket's copy-in offset)."""
    fxpass = FxschedPass(_config(tmp_path))
    hook_helpers.fake_world(4, 1)
    u1 = fxpass.uuid()
    hook_helpers.fake_world(4, 2)
    assert fxpass.uuid() != u1
    hook_helpers.fake_world(4, 1)
    assert fxpass.uuid() == u1


def test_corrupt_cache_entry(tmp_path: Path, caplog):
    config = _config(tmp_path)
    gm = hook_helpers.step_graph()
    fp, _ = _fingerprint(gm, config)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"{fp}.json").write_text("{not json")
    rec = _unchanged(FxschedPass(config), gm, caplog, "not valid JSON")
    assert rec["cache"] == "bad"
    assert (tmp_path / "cache" / f"{fp}.json").read_text() == "{not json"  # not overwritten


@pytest.mark.parametrize("how", ["other_fingerprint", "other_graph_schedule"])
def test_stale_cache_entry(tmp_path: Path, caplog, how: str):
    config = _config(tmp_path)
    other = hook_helpers.step_graph(world=2, rank=1)  # another graph (shapes, sizes): another fingerprint
    FxschedPass(config)(other.graph)
    cache = ScheduleCache(tmp_path / "cache")
    (other_fp,) = cache.fingerprints()
    gm = hook_helpers.step_graph()
    fp, _ = _fingerprint(gm, config)
    assert fp != other_fp
    doc = json.loads(cache.path_for(other_fp).read_text())
    if how == "other_graph_schedule":  # the right key, but a schedule that names unknown ops
        doc["fingerprint"] = fp
        doc["schedule"]["order"] = [*doc["schedule"]["order"], "no_such_op"]
    cache.path_for(fp).write_text(json.dumps(doc))
    match = "holds an entry for" if how == "other_fingerprint" else "does not fit"
    _unchanged(FxschedPass(config), gm, caplog, match)


def test_unsupported_collective_is_rejected(tmp_path: Path, caplog):
    group, _ = hook_helpers.fake_world()

    def fn(a, b):
        return funcol.all_reduce(a, "sum", group) + 1, funcol.broadcast(b, 0, group) * 2

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4), torch.randn(4))
    _unchanged(FxschedPass(_config(tmp_path)), gm, caplog, "unsupported collective")


def test_unmergeable_bucket_from_the_cache(tmp_path: Path, caplog):
    """A cached schedule that the model accepts but torch cannot merge (an all_to_all bucket):
    refused by the dry run on a copy."""
    group, _ = hook_helpers.fake_world()

    def fn(c, d):
        xc = funcol.all_to_all_single(c, None, None, group)
        xd = funcol.all_to_all_single(d, None, None, group)
        return xc + 1, xd + 1

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(8), torch.randn(8))
    config = _config(tmp_path)
    fp, problem = _fingerprint(gm, config)
    members = tuple(gloo_graphs.by_kind(problem, "all_to_all"))
    ScheduleCache(tmp_path / "cache").put(
        fp, Schedule(gloo_graphs.prefetch_order(problem), (members,)), problem=problem)
    _unchanged(FxschedPass(config), gm, caplog, "cannot be bucketed")


def test_solver_that_raises(tmp_path: Path, caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(fxhook, "solve", broken)
    _unchanged(FxschedPass(_config(tmp_path)), hook_helpers.step_graph(), caplog, "solver exploded")


def test_memory_limit_nothing_fits(tmp_path: Path, caplog):
    _unchanged(FxschedPass(_config(tmp_path, memory_limit=1, time_budget_s=0.5)), hook_helpers.step_graph(),
               caplog, "no schedule fits the memory limit")


def test_failure_in_the_middle_of_the_in_place_rewrite(tmp_path: Path, caplog, monkeypatch):
    """The dry run on a copy passes, then the in-place rewrite raises after bucketing and reordering:
    the graph is rebuilt from its snapshot (same code, same names) and stays usable."""
    import fxsched.fxbridge.apply as apply_mod

    gm = hook_helpers.step_graph()
    real = apply_mod.preserve_node_ordering
    calls = []

    def flaky(graph, deps, *a, **kw):
        calls.append(graph)
        real(graph, deps, *a, **kw)  # half of the work is done: control_deps wrappers exist
        if graph is gm.graph:
            raise RuntimeError("boom in the middle")

    monkeypatch.setattr(apply_mod, "preserve_node_ordering", flaky)
    modules = set(gm._modules)
    names = [n.name for n in gm.graph.nodes]
    rec = _unchanged(FxschedPass(_config(tmp_path)), gm, caplog, "boom in the middle")
    assert len(calls) == 2 and calls[1] is gm.graph  # the dry run, then the real graph
    assert [n.name for n in gm.graph.nodes] == names and set(gm._modules) == modules
    assert rec["fingerprint"] and not rec["stored"]
    assert any("rebuilt from its snapshot" in r.getMessage() for r in caplog.records)
    # the rebuilt graph is a normal graph: the pass schedules it once the fault is gone
    monkeypatch.setattr(apply_mod, "preserve_node_ordering", real)
    fxpass = FxschedPass(_config(tmp_path))
    fxpass(gm.graph)
    assert fxpass.records[-1].outcome == "solved"


def test_config_validation():
    for bad in ({"time_budget_s": 0}, {"time_budget_s": float("inf")}, {"memory_limit": 0}, {"memory_limit": True},
                {"memory_limit": -1.0}, {"spmd": "rank0"}, {"deterministic": False}, {"workers": 0},
                {"seed": -1}, {"mode": "any"}, {"profile": "no-such-gpu"}, {"min_collectives": -1},
                {"store": "yes"}, {"cache_dir": 3}, {"broadcast_timeout_s": 0}, {"broadcast_timeout_s": float("nan")},
                {"spmd": "broadcast", "deterministic": False, "time_budget_s": 10.0, "broadcast_timeout_s": 5.0}):
        with pytest.raises(ValueError):
            HookConfig(**bad)
    assert HookConfig(spmd="broadcast", deterministic=False).solve_config().deterministic is False
    sc = HookConfig(seed=3, workers=2, memory_limit=123).solve_config()
    assert (sc.seed, sc.workers, sc.deterministic, sc.memory_budget) == (3, 2, True, 123)


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(fxhook.CACHE_DIR_ENV, str(tmp_path / "env"))
    assert FxschedPass(HookConfig()).cache.dir == tmp_path / "env"
    monkeypatch.delenv(fxhook.CACHE_DIR_ENV)
    assert FxschedPass(HookConfig()).cache is None


def test_enable_and_disable(monkeypatch):
    class Other(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __call__(self, graph):
            pass

        def uuid(self):
            return "other"

    other = Other()
    monkeypatch.setattr(inductor_config, "post_grad_custom_post_pass", other)
    monkeypatch.setattr(inductor_config, "reorder_for_peak_memory", True)
    first = fxhook.enable(time_budget_s=1.0)
    assert inductor_config.reorder_for_peak_memory is False  # it would reorder the schedule
    assert inductor_config.post_grad_custom_post_pass == [other, first]
    second = fxhook.enable(time_budget_s=2.0, spmd="broadcast", deterministic=False)
    assert inductor_config.post_grad_custom_post_pass == [other, second]
    assert fxhook.installed_passes() == [second] and second.config.time_budget_s == 2.0
    fxhook.disable()
    assert inductor_config.post_grad_custom_post_pass is other
    assert inductor_config.reorder_for_peak_memory is True  # the user's value back
    monkeypatch.setattr(inductor_config, "post_grad_custom_post_pass", None)
    only = fxhook.enable()
    assert inductor_config.post_grad_custom_post_pass is only
    fxhook.disable()
    assert inductor_config.post_grad_custom_post_pass is None
    with pytest.raises(ValueError):
        fxhook.enable(memory_limit=-3)
