"""apply_schedule: order, buckets, control deps and refusals, single process on a fake process group.

Graphs: the FSDP-style step of :mod:`gloo_graphs` (traced on a fake group of 4 ranks, rank 1, so the
all_gather bucket's rank offset is not 0) and the CPU variant of the zoo's 2-layer Llama FSDP graphs.
Numerics live in ``test_apply_gloo.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch._inductor.fx_passes.control_dependencies import control_deps
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore

import gloo_graphs
from fxsched.benchmarks.zoo import ZOO
from fxsched.benchmarks.zoo.tracing import activate_groups, build_graphs
from fxsched.fxbridge.apply import ApplyError, UnsupportedBucketError, apply_schedule
from fxsched.fxbridge.extract import META_KEY, Extraction, extract_problem
from fxsched.heuristics import bucket_greedy, overlap_schedule
from fxsched.solver import Schedule, check_schedule
from fxsched.solver.schedule import ScheduleError

WORLD, RANK = 4, 1


def _fake_world(world: int = WORLD, rank: int = RANK) -> tuple[str, str]:
    """A fresh fake default group (replacing any fake one) and a second group over all ranks."""
    if dist.is_initialized():
        assert str(dist.get_backend()) == "fake", "a real process group is initialized"
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    return str(dist.group.WORLD.group_name), gloo_graphs.second_group(world)


@pytest.fixture
def step() -> Extraction:
    groups = _fake_world()
    return extract_problem(gloo_graphs.trace(groups, gloo_graphs.make_inputs(RANK, WORLD)))


@pytest.fixture(scope="module")
def zoo():
    """2-layer Llama FSDP on CPU fake tensors (torch's CPU-only build cannot trace the copy_ of
    an all_gather bucket on fake CUDA tensors: 'PyTorch is not linked with support for cuda')."""
    zg = build_graphs(ZOO["llama_fsdp_8r_small"], device="cpu")
    yield zg
    if dist.is_initialized():
        dist.destroy_process_group()


def _src(gm: fx.GraphModule) -> str:
    """The graph's code, generated now (``gm.code`` is only refreshed by recompile)."""
    return gm.graph.python_code(root_module="self").src


def _expected(ext: Extraction, sched: Schedule, applied: fx.GraphModule) -> list:
    """schedule.order with each bucket's members -> its collective (at the last member) and its
    members' waits -> its wait (at the first wait); folded casts disappear."""
    pos = {n: i for i, n in enumerate(sched.order)}
    at: dict[str, tuple] = {}
    replaced: set[str] = set()
    for b in applied.meta[META_KEY]["buckets"]:
        replaced.update(b.replaced)
        at[max(b.members, key=pos.__getitem__)] = ("bucket", b.index, "collective")
        at[min((ext.problem.wait_of[m] for m in b.members), key=pos.__getitem__)] = ("bucket", b.index, "wait")
    return [at.get(n, n) for n in sched.order if n in at or n not in replaced]


def _actual(gm: fx.GraphModule) -> list:
    out: list = []
    for node in gm.graph.nodes:
        meta = node.meta.get(META_KEY, {})
        if meta.get("bucket_role") in ("collective", "wait"):
            out.append(("bucket", meta["bucket"], meta["bucket_role"]))
        elif "op" in meta and "bucket" not in meta:
            out.append(meta["op"])
    return out


def _check_applied(ext: Extraction, sched: Schedule, gm: fx.GraphModule) -> None:
    gm.graph.lint()
    assert _actual(gm) == _expected(ext, sched, gm)
    roles = [n.meta[META_KEY].get("bucket_role") for n in gm.graph.nodes if META_KEY in n.meta]
    assert roles.count("collective") == roles.count("wait") == len(sched.buckets)
    assert [n.meta[META_KEY]["position"] for n in gm.graph.nodes] == list(range(len(gm.graph.nodes)))
    n_coll = sum(1 for n in gm.graph.nodes if n.op == "call_function"
                 and getattr(n.target, "namespace", None) == "_c10d_functional" and "wait" not in str(n.target))
    assert n_coll == len(ext.problem.collectives) - sum(map(len, sched.buckets)) + len(sched.buckets)


def test_bucketed_schedule_is_applied_in_order(step: Extraction):
    sched = gloo_graphs.bucketed_schedule(step.problem)
    assert check_schedule(step.problem, sched) == [] and len(sched.buckets) == 3
    before = _src(step.graph_module)
    out = apply_schedule(step, sched, inplace=False)
    assert _src(step.graph_module) == before  # inplace=False leaves the original alone
    _check_applied(step, sched, out)
    buckets = out.meta[META_KEY]["buckets"]
    assert [len(b.members) for b in buckets] == [3, 2, 2]
    # the fp32 + bf16 all_gather bucket goes through torch's multi-dtype copy-in, at rank 1's offset
    (pre,) = [n for n in out.graph.nodes if n.target is torch.ops.bucketing._pre_bucket_all_gather.default]
    assert pre.args[2] is torch.bfloat16 and pre.args[4] == RANK
    assert out.code and "control_deps" in out.code


def test_exposed_bucket_waits_right_after_its_issue(step: Extraction):
    """The first wait straight after the last member: torch inserts before that wait, and moves
    the wait and copy-out onto the same spot."""
    sched = gloo_graphs.bucketed_schedule(step.problem)
    ag = gloo_graphs.by_kind(step.problem, "all_gather")
    order = list(sched.order)
    wait = step.problem.wait_of[ag[0]]
    order.remove(wait)
    order.insert(max(order.index(m) for m in ag) + 1, wait)
    exposed = Schedule(tuple(order), sched.buckets, multi_dtype=True)
    assert check_schedule(step.problem, exposed) == []
    out = apply_schedule(step, exposed, inplace=False)
    _check_applied(step, exposed, out)
    coll = next(n for n in out.graph.nodes if n.meta.get(META_KEY, {}).get("bucket_role") == "collective")
    assert coll.next.meta[META_KEY]["bucket_role"] == "wait"


def test_applied_graph_can_be_extracted_again(step: Extraction):
    sched = gloo_graphs.bucketed_schedule(step.problem)
    out = apply_schedule(step, sched, control_deps=False)
    assert out is step.graph_module  # in place by default
    again = extract_problem(out).problem
    assert len(again.collectives) == 3
    assert sorted(c.collective.kind.value for c in again.collectives) == ["all_gather", "all_reduce", "reduce_scatter"]
    assert check_schedule(again, Schedule.original(again)) == []


def test_original_order_is_a_no_op(step: Extraction):
    gm = step.graph_module
    before = _src(gm)
    names = [n.name for n in gm.graph.nodes]
    out = apply_schedule(step, Schedule.original(step.problem), control_deps=False, inplace=False)
    assert _src(out) == before
    pinned = apply_schedule(step, Schedule.original(step.problem), inplace=False)
    assert [n.name for n in pinned.graph.nodes if n.op != "get_attr"] == names


def test_control_deps_pin_each_window(step: Extraction):
    sched = gloo_graphs.bucketed_schedule(step.problem)
    out = apply_schedule(step, sched, inplace=False)
    wrapped = [n for n in out.graph.nodes if n.target is control_deps]
    assert wrapped and out.meta[META_KEY]["control_deps"] == sum(len(n.args[0]) for n in wrapped)
    index = {n: i for i, n in enumerate(out.graph.nodes)}
    for n in wrapped:
        assert all(index[d] < index[n] for d in n.args[0])  # every edge agrees with the order
        assert n.meta[META_KEY]["control_deps"] == [d.name for d in n.args[0]]
    # the reduce_scatter bucket is hidden behind a matmul: mm after its issue, its wait after the mm
    rs = next(n for n in out.graph.nodes if n.meta.get(META_KEY, {}).get("bucket_role") == "collective"
              and n.target is torch.ops._c10d_functional.reduce_scatter_tensor.default)
    hiding = [n for n in wrapped if rs in n.args[0]]
    assert any(n.meta[META_KEY]["op"].startswith("mm") for n in hiding)


@pytest.mark.parametrize("part", ["forward", "backward"])
def test_zoo_graph_bucketed_overlap(zoo, part: str):
    groups = activate_groups(zoo.config)  # names in the graphs resolve (all_gather reads the rank)
    ext = extract_problem(getattr(zoo, part), groups={g.name: g.size for g in groups.values()})
    sched = overlap_schedule(ext.problem, bucket_greedy(ext.problem))
    assert sched.buckets and sched.order != Schedule.original(ext.problem).order
    out = apply_schedule(ext, sched, inplace=False)
    _check_applied(ext, sched, out)


def test_zoo_graph_cpsat_schedule(zoo):
    from fxsched.solver.cpsat import SolveConfig, solve

    groups = activate_groups(zoo.config)
    ext = extract_problem(zoo.forward, groups={g.name: g.size for g in groups.values()})
    sched = solve(ext.problem, 5.0, SolveConfig(seed=0, workers=1, deterministic=True)).schedule
    out = apply_schedule(ext, sched, inplace=False)
    _check_applied(ext, sched, out)


# ---- refusals: a clear error naming the op, and the graph left exactly as it was ----

def _refused(ext: Extraction, sched: Schedule, error: type[Exception], op: str) -> Exception:
    before = _src(ext.graph_module)
    with pytest.raises(error) as info:
        apply_schedule(ext, sched)
    assert repr(op) in str(info.value), str(info.value)
    assert _src(ext.graph_module) == before
    return info.value


def test_non_topological_order_is_refused(step: Extraction):
    order = list(Schedule.original(step.problem).order)
    i = order.index("mm")
    order.insert(0, order.pop(i))  # mm before the wait it reads
    _refused(step, Schedule(tuple(order)), ScheduleError, "mm")


def test_unknown_op_is_refused(step: Extraction):
    order = Schedule.original(step.problem).order + ("no_such_op",)
    err = _refused(step, Schedule(order), ScheduleError, "no_such_op")
    assert "unknown_op" in str(err)


def test_bucket_of_mixed_kinds_is_refused(step: Extraction):
    sched = gloo_graphs.bucketed_schedule(step.problem)
    ag = gloo_graphs.by_kind(step.problem, "all_gather")
    rs = gloo_graphs.by_kind(step.problem, "reduce_scatter")
    mixed = Schedule(sched.order, ((ag[0], rs[0]),) + sched.buckets[2:], multi_dtype=True)
    err = _refused(step, mixed, ScheduleError, rs[0])
    assert "mixed_bucket_key" in str(err)


def test_wait_before_bucket_issue_is_refused(step: Extraction):
    """The original order waits each all_gather before the next is issued: no bucket can form."""
    ag = gloo_graphs.by_kind(step.problem, "all_gather")
    bad = Schedule(Schedule.original(step.problem).order, (tuple(ag[:2]),), multi_dtype=True)
    err = _refused(step, bad, ScheduleError, step.problem.wait_of[ag[0]])
    assert "wait_before_collective" in str(err)


def test_stale_extraction_is_refused(step: Extraction):
    sched = gloo_graphs.bucketed_schedule(step.problem)
    apply_schedule(step, sched)  # in place: the bucket members are gone
    with pytest.raises(ApplyError, match="no longer in the graph"):
        apply_schedule(step, sched)


def _mixed_forms() -> Extraction:
    """Two reduce_scatters (fp32, bf16) and two all_to_alls on the world group."""
    group, _ = _fake_world()

    def fn(a, b, c, d):
        ra = funcol.reduce_scatter_single(a, "sum", 0, group)
        rb = funcol.reduce_scatter_single(b, "sum", 0, group)
        xc = funcol.all_to_all_single(c, None, None, group)
        xd = funcol.all_to_all_single(d, None, None, group)
        return ra + 1, rb + 1, xc + 1, xd + 1

    ins = [torch.randn(8, 2), torch.randn(8, 2, dtype=torch.bfloat16), torch.randn(8), torch.randn(8)]
    return extract_problem(make_fx(fn, tracing_mode="fake")(*ins))


@pytest.mark.parametrize(("kind", "message"), [("reduce_scatter", "multi-dtype reduce_scatter"),
                                               ("all_to_all", "cannot be bucketed")])
def test_unsupported_buckets_are_refused(kind: str, message: str):
    ext = _mixed_forms()
    members = tuple(gloo_graphs.by_kind(ext.problem, kind))
    sched = Schedule(gloo_graphs.prefetch_order(ext.problem), (members,), multi_dtype=True)
    assert check_schedule(ext.problem, sched) == []  # valid for the model, but torch cannot merge it
    err = _refused(ext, sched, UnsupportedBucketError, members[0])
    assert isinstance(err, NotImplementedError) and message in str(err)
