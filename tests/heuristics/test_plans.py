"""Module bucket plans (fxsched.heuristics.plans): validation, honoured plans, splits, typos."""

from __future__ import annotations

import dataclasses

import pytest
from fxsched.heuristics.overlap import OverlapConfig, overlap_schedule
from fxsched.heuristics.placement import Placement
from fxsched.heuristics.plans import (
    ModulePlan,
    module_matches,
    plan_buckets,
    plan_members,
    plan_schedule,
)
from fxsched.solver import (
    BucketCosts,
    CollectiveKind,
    Op,
    ScheduleProblem,
    check_schedule,
    simulate,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.solver.random_dags import random_problem
from tests.solver.solver_builders import AG, RS, coll, compute, make_problem, wait

ROOMY = OverlapConfig(memory_budget_bytes=10**9)  # no storages: room for the bucket buffers


def with_module(op: Op, module: str | None) -> Op:
    return dataclasses.replace(op, module=module)


# ---------------------------------------------------------------- validation


def test_from_user_normalises() -> None:
    plan = ModulePlan.from_user(["tok_embeddings", ["layers.0.attention", "layers.0.feed_forward"], ("x", "x")])
    assert plan.entries == (("tok_embeddings",), ("layers.0.attention", "layers.0.feed_forward"), ("x",))
    assert plan.fqns == ("tok_embeddings", "layers.0.attention", "layers.0.feed_forward", "x")


@pytest.mark.parametrize(("plan", "named"), [
    (["a", ["b", "a"]], "'a'"),
    (["layers", "layers.0"], "layers.0"),
    ([["layers.0.attention"], "layers.0"], "layers.0.attention"),
    (["a", []], "entry 1 is empty"),
    ([], "no entries"),
    (["a..b"], "a..b"),
    (["a", ""], "''"),
])
def test_invalid_plans(plan, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ModulePlan.from_user(plan)


def test_wrong_types_rejected() -> None:
    with pytest.raises(TypeError, match="string"):
        ModulePlan.from_user("layers.0")
    with pytest.raises(TypeError, match="3"):
        ModulePlan.from_user([["a", 3]])
    with pytest.raises(TypeError, match="3"):
        ModulePlan.from_user(["a", 3])
    with pytest.raises(TypeError, match="string"):
        ModulePlan(("a",))  # entries must be tuples of FQNs


def test_prefix_match_is_per_path_component() -> None:
    assert module_matches("layers.1", "layers.1")
    assert module_matches("layers.1.attention.wq", "layers.1")
    assert not module_matches("layers.10", "layers.1")
    assert not module_matches(None, "layers.1")
    ModulePlan.from_user(["layers.1", "layers.10"])  # siblings, not nested: allowed


# ---------------------------------------------------------------- honoured plans


def layered_problem() -> ScheduleProblem:
    """Forward: all_gathers feed heavy compute n0 (layer 0), n1 (layer 1), n10 (layer 10), no
    (output). Backward: g1 then g0 produce the gradients that reduce_scatters scatter."""
    def ag(name: str, module: str) -> Op:
        return with_module(coll(name, "A", AG, bytes_in=10, bytes_out=20, runtime_ns=130), module)

    def rs(name: str, module: str, grad: str) -> Op:
        return with_module(coll(name, "A", RS, bytes_in=20, bytes_out=10, runtime_ns=130, deps=[grad]), module)

    ops = [ag("ag_q0", "layers.0.attention"), ag("ag_k0", "layers.0.attention"),
           ag("ag_f0", "layers.0.feed_forward"), ag("ag_a1", "layers.1.attention"),
           ag("ag_b1", "layers.1.feed_forward"), ag("ag_x", "layers.10"), ag("ag_o", "output")]
    ops += [wait(f"w_{o.name}", o.name) for o in list(ops)]
    ops += [compute("n0", 1000, deps=["w_ag_q0", "w_ag_k0", "w_ag_f0"], heavy=True),
            compute("n1", 1000, deps=["n0", "w_ag_a1", "w_ag_b1"], heavy=True),
            compute("n10", 1000, deps=["n1", "w_ag_x"], heavy=True),
            compute("no", 1000, deps=["n10", "w_ag_o"], heavy=True),
            compute("g1", 1000, deps=["no"], heavy=True),
            rs("rs_a1", "layers.1.attention", "g1"), rs("rs_b1", "layers.1.feed_forward", "g1"),
            compute("g0", 1000, deps=["g1"], heavy=True),
            rs("rs_q0", "layers.0.attention", "g0"), rs("rs_k0", "layers.0.attention", "g0"),
            rs("rs_f0", "layers.0.feed_forward", "g0")]
    ops += [wait(f"w_{n}", n) for n in ("rs_a1", "rs_b1", "rs_q0", "rs_k0", "rs_f0")]
    return make_problem(ops, groups=("A",))


PLAN = ModulePlan.from_user([["layers.0.attention", "layers.0.feed_forward"], "layers.1", "layers.10"])


def test_plan_honoured() -> None:
    """Entry 0 gives one all_gather and one reduce_scatter bucket, entry 1 likewise; layers.10
    has a single collective (no bucket; ``layers.1`` does not swallow it) and ``output`` is in
    no entry."""
    p = layered_problem()
    assert plan_members(p, PLAN) == (
        ("ag_q0", "ag_k0", "ag_f0", "rs_q0", "rs_k0", "rs_f0"), ("ag_a1", "ag_b1", "rs_a1", "rs_b1"), ("ag_x",))
    buckets = plan_buckets(p, PLAN)
    assert buckets == (("ag_q0", "ag_k0", "ag_f0"), ("rs_q0", "rs_k0", "rs_f0"),
                       ("ag_a1", "ag_b1"), ("rs_a1", "rs_b1"))
    sched = plan_schedule(p, PLAN, config=ROOMY)
    assert check_schedule(p, sched) == []
    assert sched.buckets == buckets
    assert simulate(p, sched).n_collectives == 6  # 4 buckets + ag_x + ag_o


def test_plan_typo_raises_unless_not_strict() -> None:
    p = layered_problem()
    typo = ModulePlan.from_user(["layers.0.atention", "layers.1"])
    with pytest.raises(ValueError, match="layers.0.atention"):
        plan_buckets(p, typo)
    with pytest.raises(ValueError, match="layers.0.atention"):
        plan_schedule(p, typo)
    assert plan_buckets(p, typo, strict=False) == (("ag_a1", "ag_b1"), ("rs_a1", "rs_b1"))


def test_dependent_members_split_into_runs() -> None:
    """All four collectives are in module ``m``. c2 reads heavy h, which reads c1's and c3's
    waits, so c2 depends on c1 and c3 and needs a later slot (3, before k) than their need
    (1, before h). Need order c1, c3, c2, c4: the run (c1, c3) cannot take c2, which starts
    the run (c2, c4)."""
    def m(op: Op) -> Op:
        return with_module(op, "m")

    def ag(name: str, deps: tuple[str, ...] = ()) -> Op:
        return m(coll(name, "A", AG, bytes_in=10, bytes_out=20, runtime_ns=130, deps=deps))

    ops = [ag("c1"), ag("c3"), wait("w1", "c1"), wait("w3", "c3"), compute("pre", 1000, heavy=True),
           compute("h", 100, deps=["w1", "w3"], heavy=True), ag("c2", ("h",)), ag("c4"),
           wait("w2", "c2"), wait("w4", "c4"), compute("mid", 1000, heavy=True),
           compute("k", 100, deps=["w2", "w4"], heavy=True)]
    # nearly free copies, so that the overlapped bucketed schedule beats the original order
    # (overlap_schedule keeps the original order when that simulates faster)
    p = make_problem(ops, groups=("A",), costs=BucketCosts(memory_bandwidth_gbps=1000.0, launch_overhead_ns=0))
    plan = ModulePlan.from_user(["m"])
    buckets = plan_buckets(p, plan)
    assert buckets == (("c1", "c3"), ("c2", "c4"))
    sched = plan_schedule(p, plan, config=ROOMY)
    assert check_schedule(p, sched) == []
    assert sched.buckets == buckets


def test_mixed_dtypes_bucket_per_key() -> None:
    """One entry, bf16 and f32 gathers: two buckets, or one in multi-dtype mode."""
    ops = [with_module(coll(f"c{i}", "A", AG, bytes_in=10, bytes_out=20, dtype=dt), "blk")
           for i, dt in enumerate(("bf16", "f32", "bf16", "f32"))]
    ops += [wait(f"w{i}", f"c{i}") for i in range(4)]
    ops.append(compute("h", 100, deps=[f"w{i}" for i in range(4)], heavy=True))
    p = make_problem(ops, groups=("A",))
    plan = ModulePlan.from_user(["blk"])
    assert plan_buckets(p, plan) == (("c0", "c2"), ("c1", "c3"))
    assert plan_buckets(p, plan, multi_dtype=True) == (("c0", "c1", "c2", "c3"),)
    sched = plan_schedule(p, plan, config=ROOMY, multi_dtype=True)
    assert check_schedule(p, sched) == []


# ---------------------------------------------------------------- properties

MODULES = (None, "a", "a.x", "a.x.y", "b", "b.y", "b.y.z", "c", "cc")
RANDOM_PLAN = ModulePlan.from_user([["a"], ["b.y", "c"]])


@st.composite
def labelled_problems(draw) -> ScheduleProblem:
    p = random_problem(draw, max_ops=40, max_groups=2,
                       kinds=(CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER), reduce_ops=("sum",))
    pl = Placement(p)
    assume(all(u.earliest <= u.need for u in pl.units.values()))
    ops = tuple(with_module(op, draw(st.sampled_from(MODULES))) if op.collective else op for op in p.ops)
    return ScheduleProblem(ops, p.storages, p.groups, p.comm_curves, p.bucket_costs, name=p.name)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(labelled_problems(), st.booleans())
def test_plan_buckets_valid(p: ScheduleProblem, multi_dtype: bool) -> None:
    buckets = plan_buckets(p, RANDOM_PLAN, strict=False, multi_dtype=multi_dtype)
    seen: set[str] = set()
    for b in buckets:
        assert len(b) >= 2 and not seen & set(b)
        seen |= set(b)
        ops = [p.op_by_name[m] for m in b]
        assert len({RANDOM_PLAN.entry_of(op.module) for op in ops}) == 1
        assert RANDOM_PLAN.entry_of(ops[0].module) is not None
        assert len({op.collective.bucket_key(multi_dtype) for op in ops}) == 1
    for cfg in (OverlapConfig(), ROOMY):
        sched = overlap_schedule(p, buckets, multi_dtype=multi_dtype, config=cfg)
        assert check_schedule(p, sched) == []
