"""Property tests of the greedy schedulers over random problems (tests/solver/random_dags.py).

What the code guarantees, and is checked here on every problem:
- every heuristic's schedule passes check_schedule (this includes collectives, or their chains,
  that read another collective's wait: HSDP-like; that pattern made every heuristic raise
  ValueError at commit e5ca129);
- overlap_schedule: when the original order's peak fits the budget (always for the default budget,
  the original peak), the result's peak fits it too and its makespan is no worse than the
  original's: overlap_schedule compares its best rung with the original order and keeps the
  original when it is strictly faster, and returns the original when no rung fits. When the
  original does not fit, the result fits, or a warning is logged and the result's peak is no
  higher than the original's (the original is the last rung);
- auto is no slower than any policy alone when the original fits (it tries every ladder);
- fixed-order mode: heavy ops and the backbone keep their relative order;
- each collective's producer-only chain sits right before it (unless the original order itself
  comes back);
- the classic passes move only what they say they move (hypothesis rarely makes a collective
  that reads another's wait, so that case runs on seeded problems at the end).

Each property runs under hypothesis (300 derandomized examples) and again on 150 problems from
plain seeded generators, which draw larger problems and the wait-fed pattern more often.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from fxsched.heuristics.classic import raise_and_sink, raise_collectives, sink_waits
from fxsched.heuristics.overlap import OverlapConfig, overlap_schedule
from fxsched.heuristics.placement import Placement
from fxsched.solver import OpKind, Schedule, ScheduleProblem, check_schedule, simulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.solver.random_dags import problems, random_problem

SETTINGS = settings(
    max_examples=300, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICIES = ("auto", "just_in_time", "early", "keep")
Heuristic = Callable[[ScheduleProblem], Schedule]


def _overlap(policy: str) -> Heuristic:
    return lambda p: overlap_schedule(p, config=OverlapConfig(policy=policy))


HEURISTICS: dict[str, Heuristic] = {
    **{f"overlap_{pol}": _overlap(pol) for pol in POLICIES},
    "sink_waits": sink_waits,
    "raise_collectives": raise_collectives,
    "raise_and_sink": raise_and_sink,
}


def reads_a_wait(p: ScheduleProblem) -> bool:
    """Some collective, or an op of its producer-only chain, reads a wait (HSDP-like)."""
    pl = Placement(p)
    return any(p.op_by_name[d].kind is OpKind.WAIT
               for u in pl.units.values() for m in (*u.chain, u.collective) for d in p.op_by_name[m].deps)


def subsequence(order: tuple[str, ...], keep: set[str]) -> list[str]:
    return [n for n in order if n in keep]


def slot_of(order: tuple[str, ...], name: str, backbone: set[str]) -> int:
    """How many backbone ops come before ``name``."""
    return sum(1 for n in order[:order.index(name)] if n in backbone)


def scaled(p: ScheduleProblem, permille: int | None) -> int | None:
    return None if permille is None else simulate(p).peak_memory_bytes * permille // 1000


@contextmanager
def overlap_warnings() -> Iterator[list[logging.LogRecord]]:
    """Collect the WARNING records of fxsched.heuristics.overlap (caplog does not mix with
    hypothesis' repeated calls)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("fxsched.heuristics.overlap")
    handler, old_level = Keep(logging.WARNING), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


# ---- the properties, as plain checks --------------------------------------------------------------

def check_valid(p: ScheduleProblem) -> None:
    for name, f in HEURISTICS.items():
        sched = f(p)
        assert check_schedule(p, sched) == [], name
        assert sched.buckets == ()


def check_default_budget(p: ScheduleProblem) -> None:
    r0 = simulate(p)
    makespans = {}
    for policy in POLICIES:
        r = simulate(p, overlap_schedule(p, config=OverlapConfig(policy=policy)))
        assert r.peak_memory_bytes <= r0.peak_memory_bytes, policy
        assert r.makespan_ns <= r0.makespan_ns, policy
        makespans[policy] = r.makespan_ns
    assert makespans["auto"] <= min(makespans[pol] for pol in POLICIES)


def check_budget(p: ScheduleProblem, permille: int) -> None:
    """Budget = original peak * permille / 1000."""
    r0 = simulate(p)
    budget = r0.peak_memory_bytes * permille // 1000
    for policy in POLICIES:
        with overlap_warnings() as warned:
            sched = overlap_schedule(p, config=OverlapConfig(policy=policy, memory_budget_bytes=budget))
        r = simulate(p, sched)
        if r0.peak_memory_bytes <= budget:
            assert r.peak_memory_bytes <= budget, policy
            assert r.makespan_ns <= r0.makespan_ns, policy
            assert not warned, policy
        elif r.peak_memory_bytes > budget:
            assert len(warned) == 1, policy
            assert r.peak_memory_bytes <= r0.peak_memory_bytes, policy


def check_fixed_order(p: ScheduleProblem, budget: int | None) -> None:
    original = Schedule.original(p).order
    heavy = {op.name for op in p.ops if op.heavy}
    backbone = Placement(p).backbone
    for policy in POLICIES:
        sched = overlap_schedule(p, config=OverlapConfig(policy=policy, memory_budget_bytes=budget))
        assert subsequence(sched.order, heavy) == subsequence(original, heavy), policy
        assert subsequence(sched.order, set(backbone)) == list(backbone), policy


def check_chains(p: ScheduleProblem, budget: int | None) -> None:
    """Each collective's producer-only chain sits right before it."""
    pl = Placement(p)
    original = Schedule.original(p).order
    for policy in POLICIES:
        order = overlap_schedule(p, config=OverlapConfig(policy=policy, memory_budget_bytes=budget)).order
        if order == original:  # the last rung: the original order as it is
            continue
        pos = {n: i for i, n in enumerate(order)}
        for c in p.collectives:
            chain = pl.units[c.name].chain
            k = pos[c.name]
            assert order[k - len(chain):k] == chain, (policy, c.name)


def check_classic(p: ScheduleProblem) -> None:
    """The module docstring's rules, in the frame without chains (backbone = every op but
    collectives and waits), with positions taken in the pass's own result:
    sink_waits: the order without waits is the original's; each wait sits right before its first
    user (slot = min over users of their slot; the end if none).
    raise_collectives: each wait keeps its original slot; each collective sits just after its
    inputs exist (slot = max over its deps of the dep's slot + 1 for a backbone op, the wait's
    slot for a wait; 0 if none). raise_and_sink: collectives as in raise_collectives, waits as in
    sink_waits. All keep the backbone order."""
    original = Schedule.original(p).order
    backbone = tuple(op.name for op in p.ops if op.kind not in (OpKind.COLLECTIVE, OpKind.WAIT))
    bb = set(backbone)
    bb_index = {n: i for i, n in enumerate(backbone)}

    def sunk(order: tuple[str, ...], c: str) -> int:
        users = p.users[p.wait_of[c]]
        return min((bb_index[u] if u in bb else slot_of(order, u, bb) for u in users), default=len(backbone))

    def raised(order: tuple[str, ...], c: str) -> int:
        return max((bb_index[d] + 1 if d in bb else slot_of(order, d, bb) for d in p.op_by_name[c].deps),
                   default=0)

    sink, up, both = sink_waits(p).order, raise_collectives(p).order, raise_and_sink(p).order
    for order in (sink, up, both):
        assert subsequence(order, bb) == list(backbone)
    assert [n for n in sink if p.op_by_name[n].kind is not OpKind.WAIT] == \
        [n for n in original if p.op_by_name[n].kind is not OpKind.WAIT]
    for c in p.collectives:
        w = p.wait_of[c.name]
        assert slot_of(sink, w, bb) == sunk(sink, c.name), c.name
        assert slot_of(up, c.name, bb) == raised(up, c.name), c.name
        assert slot_of(up, w, bb) == slot_of(original, w, bb), c.name
        assert slot_of(both, c.name, bb) == raised(both, c.name), c.name
        assert slot_of(both, w, bb) == sunk(both, c.name), c.name


# ---- hypothesis ---------------------------------------------------------------------------------

@SETTINGS
@given(problems())
def test_every_heuristic_gives_a_valid_schedule(p: ScheduleProblem) -> None:
    check_valid(p)


@SETTINGS
@given(problems())
def test_overlap_default_budget_fits_and_is_no_slower(p: ScheduleProblem) -> None:
    check_default_budget(p)


@SETTINGS
@given(problems(), st.integers(800, 1500))
def test_overlap_random_budget(p: ScheduleProblem, permille: int) -> None:
    check_budget(p, permille)


@SETTINGS
@given(problems(), st.integers(0, 999))
def test_overlap_budget_below_the_original(p: ScheduleProblem, permille: int) -> None:
    check_budget(p, permille)


@SETTINGS
@given(problems(), st.sampled_from([None, 800, 1000, 1500]))
def test_overlap_keeps_heavy_and_backbone_order(p: ScheduleProblem, permille: int | None) -> None:
    check_fixed_order(p, scaled(p, permille))


@SETTINGS
@given(problems(), st.sampled_from([None, 800, 1500]))
def test_overlap_chains_contiguous(p: ScheduleProblem, permille: int | None) -> None:
    check_chains(p, scaled(p, permille))


@SETTINGS
@given(problems())
def test_classic_passes_move_only_what_they_say(p: ScheduleProblem) -> None:
    check_classic(p)


# ---- seeded problems ----------------------------------------------------------------------------

def seeded(n: int) -> Iterator[tuple[ScheduleProblem, int]]:
    """(problem, budget permille) from plain seeded generators."""
    for seed in range(n):
        rng = random.Random(seed)
        yield random_problem(rng, name=f"seed{seed}"), rng.randint(500, 1500)


@pytest.mark.parametrize("check", ["valid", "default", "budget", "order", "chains", "classic"])
def test_properties_on_seeded_problems(check: str) -> None:
    for p, permille in seeded(150):
        if check == "valid":
            check_valid(p)
        elif check == "default":
            check_default_budget(p)
        elif check == "budget":
            check_budget(p, permille)
        elif check == "order":
            check_fixed_order(p, scaled(p, permille))
        elif check == "chains":
            check_chains(p, scaled(p, permille))
        elif not reads_a_wait(p):
            check_classic(p)


def test_classic_rules_hold_with_wait_fed_collectives() -> None:
    for p, _ in seeded(150):
        check_classic(p)
