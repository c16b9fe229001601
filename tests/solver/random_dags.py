"""Random valid scheduling problems, topological orders and bucketings for property tests.

Every generator takes ``draw_or_rng``: either hypothesis' ``draw`` (inside an ``@st.composite``
strategy, so examples shrink) or a plain ``random.Random(seed)`` (for seeded loops in
heuristics / CP-SAT tests). For hypothesis use the ready strategies :func:`problems` and
:func:`problems_with_order`.

Generated problems follow the execution model's shape: a random DAG of compute and zero-cost
(view) ops over random storages, graph inputs and parameters, and collectives on 1-3 process
groups; each collective has exactly one wait placed after it, and its output is read only by ops
placed after that wait (they depend on the wait).

Usage from another test folder (tests/ has no ``__init__.py``): ``python -m pytest`` puts the
repository root on ``sys.path``, so ``from tests.solver.random_dags import random_problem``
works; inside tests/solver it is simply ``from random_dags import random_problem``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from fxsched.solver import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProcessGroup,
    ScheduleProblem,
    Storage,
)
from hypothesis import strategies as st

T = TypeVar("T")
Draw = Callable[[st.SearchStrategy[Any]], Any]
DrawOrRng = Union[Draw, random.Random]

ALL_KINDS: tuple[CollectiveKind, ...] = tuple(CollectiveKind)


class Chooser:
    """One interface over hypothesis' ``draw`` and ``random.Random``."""

    def __init__(self, draw_or_rng: DrawOrRng | Chooser) -> None:
        self._rng: random.Random | None
        self._draw: Draw | None
        if isinstance(draw_or_rng, Chooser):
            self._rng, self._draw = draw_or_rng._rng, draw_or_rng._draw
        elif isinstance(draw_or_rng, random.Random):
            self._rng, self._draw = draw_or_rng, None
        else:
            self._rng, self._draw = None, draw_or_rng

    def integer(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] (hypothesis shrinks towards ``lo``)."""
        if self._draw is not None:
            return int(self._draw(st.integers(lo, hi)))
        assert self._rng is not None
        return self._rng.randint(lo, hi)

    def chance(self, p: float) -> bool:
        """True with probability ``p`` (about; hypothesis favours, and shrinks towards, True)."""
        return self.integer(0, 999) < round(p * 1000)

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.integer(0, len(seq) - 1)]

    def sample(self, seq: Sequence[T], k: int) -> list[T]:
        pool, out = list(seq), []
        for _ in range(min(k, len(pool))):
            out.append(pool.pop(self.integer(0, len(pool) - 1)))
        return out


@dataclass
class _Value:
    """Something an op can read: produced by ``producer`` (None: graph input) in ``storage``."""

    producer: str | None
    storage: str | None


def _bytes_out(kind: CollectiveKind, bytes_in: int, size: int) -> int:
    if kind is CollectiveKind.ALL_GATHER:
        return bytes_in * size
    if kind is CollectiveKind.REDUCE_SCATTER:
        return bytes_in // size
    return bytes_in


def random_problem(
    draw_or_rng: DrawOrRng | Chooser,
    *,
    max_ops: int = 30,
    max_groups: int = 3,
    kinds: Sequence[CollectiveKind] = ALL_KINDS,
    dtypes: Sequence[str] = ("bf16", "f32"),
    reduce_ops: Sequence[str] = ("sum", "avg"),
    max_inputs: int = 4,
    name: str = "random",
) -> ScheduleProblem:
    """A random valid problem with up to ``max_ops`` build steps (plus the waits still pending).

    Narrow ``kinds``, ``dtypes``, ``reduce_ops`` and ``max_groups`` to get more collectives that
    share a bucket key.
    """
    ch = Chooser(draw_or_rng)
    groups = tuple(ProcessGroup(f"pg{g}", ch.choice((2, 4, 8))) for g in range(ch.integer(1, max_groups)))
    curves = []
    for g in groups:
        for k in ALL_KINDS:
            lat = ch.integer(0, 20_000)
            curves.append(CommCurve(g.name, k, ((0, lat), (1 << 16, lat + ch.integer(1, 200_000)))))
    curve_of = {(c.group, c.kind): c for c in curves}
    costs = BucketCosts(memory_bandwidth_gbps=ch.choice((1.0, 2.0, 3350.0)), launch_overhead_ns=ch.integer(0, 5000))

    storages: list[Storage] = []
    size_of: dict[str, int] = {}

    def new_storage(prefix: str, size: int, is_input: bool = False, never_freed: bool = False) -> str:
        sname = f"{prefix}{len(storages)}"
        storages.append(Storage(sname, size, is_input=is_input, never_freed=never_freed))
        size_of[sname] = size
        return sname

    values: list[_Value] = []
    for _ in range(ch.integer(0, max_inputs)):
        values.append(_Value(None, new_storage("in", ch.integer(0, 8192), True, ch.chance(0.4))))
    ops: list[Op] = []
    pending: list[tuple[str, str]] = []  # (collective, its output storage) not yet waited

    def add_wait(idx: int) -> None:
        cname, out = pending.pop(idx)
        wname = f"wait_{cname}"
        ops.append(Op(wname, OpKind.WAIT, deps=(cname,), uses=(out,), waits_on=cname))
        values.append(_Value(wname, out))

    for step in range(ch.integer(1, max_ops)):
        action = ch.integer(0, 9)
        if action >= 8 and pending:
            add_wait(ch.integer(0, len(pending) - 1))
            continue
        with_storage = [v for v in values if v.storage is not None]
        if action in (6, 7) and with_storage:
            src = ch.choice(with_storage)
            assert src.storage is not None
            group = ch.choice(groups)
            kind = ch.choice(kinds)
            b_in = size_of[src.storage]
            b_out = _bytes_out(kind, b_in, group.size)
            info = CollectiveInfo(
                kind, group.name, ch.choice(dtypes), b_in, b_out,
                ch.choice(reduce_ops) if kind in (CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_REDUCE) else None,
            )
            out = new_storage("co", b_out)
            cname = f"c{step}"
            ops.append(Op(
                cname, OpKind.COLLECTIVE, curve_of[(group.name, kind)].runtime_ns(info.size_bytes),
                deps=(src.producer,) if src.producer else (), allocates=(out,), uses=(src.storage,),
                collective=info,
            ))
            pending.append((cname, out))
            continue
        if action == 5 and values:
            src = ch.choice(values)
            vname = f"v{step}"
            ops.append(Op(vname, OpKind.ZERO, deps=(src.producer,) if src.producer else (),
                          uses=(src.storage,) if src.storage else ()))
            values.append(_Value(vname, src.storage))  # a view aliases its base's storage
            continue
        srcs = ch.sample(values, ch.integer(0, min(3, len(values))))
        deps = tuple(dict.fromkeys(v.producer for v in srcs if v.producer))
        uses = tuple(dict.fromkeys(v.storage for v in srcs if v.storage))
        opname = f"n{step}"
        allocates: tuple[str, ...] = ()
        if ch.chance(0.8):
            allocates = (new_storage("s", ch.integer(0, 8192), never_freed=ch.chance(0.1)),)
        ops.append(Op(opname, OpKind.COMPUTE, ch.integer(0, 20_000), deps, allocates, uses,
                      heavy=ch.chance(0.2)))
        values.append(_Value(opname, allocates[0] if allocates else None))
    while pending:
        add_wait(ch.integer(0, len(pending) - 1))
    return ScheduleProblem(tuple(ops), tuple(storages), groups, tuple(curves), costs, name=name)


def random_topological_order(
    problem: ScheduleProblem, draw_or_rng: DrawOrRng | Chooser, *, late_waits: bool = False
) -> tuple[str, ...]:
    """A random Kahn order: at each step any op whose dependencies are all placed.

    ``late_waits``: place a wait only when nothing else is ready (so more bucketings are valid).
    """
    ch = Chooser(draw_or_rng)
    ops = problem.op_by_name
    indeg = {op.name: len(set(op.deps)) for op in problem.ops}
    ready = [op.name for op in problem.ops if indeg[op.name] == 0]
    out: list[str] = []
    while ready:
        pick = ready
        if late_waits:
            pick = [n for n in ready if ops[n].kind is not OpKind.WAIT] or ready
        name = pick[ch.integer(0, len(pick) - 1)]
        ready.remove(name)
        out.append(name)
        for u in dict.fromkeys(problem.users[name]):
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    assert len(out) == len(problem.ops)
    return tuple(out)


def random_bucketing(
    problem: ScheduleProblem,
    order: Sequence[str],
    draw_or_rng: DrawOrRng | Chooser,
    *,
    multi_dtype: bool = False,
) -> tuple[tuple[str, ...], ...]:
    """Random valid buckets for ``order``: same key, pairwise independent members, and every
    member's wait after the last member's issue. Only keys with a comm curve are bucketed."""
    ch = Chooser(draw_or_rng)
    pos = {n: i for i, n in enumerate(order)}
    by_key: dict[tuple[str, str, str | None, str | None], list[str]] = {}
    for c in problem.collectives:
        assert c.collective is not None
        if (c.collective.group, c.collective.kind) in problem.curve_by_key:
            by_key.setdefault(c.collective.bucket_key(multi_dtype), []).append(c.name)
    used: set[str] = set()
    buckets: list[tuple[str, ...]] = []
    for names in by_key.values():
        names.sort(key=pos.__getitem__)
        for i, first in enumerate(names):
            if first in used or not ch.chance(0.6):
                continue
            members = [first]
            for cand in names[i + 1:]:
                if cand in used or not ch.chance(0.7):
                    continue
                trial = [*members, cand]
                independent = all(not problem.depends_on(cand, m) and not problem.depends_on(m, cand)
                                  for m in members)
                issue = max(pos[m] for m in trial)
                if independent and min(pos[problem.wait_of[m]] for m in trial) > issue:
                    members = trial
            if len(members) >= 2:
                buckets.append(tuple(members))
                used.update(members)
    return tuple(buckets)


@st.composite
def problems(draw: Draw, **kwargs: Any) -> ScheduleProblem:
    """Hypothesis strategy over :func:`random_problem` (same keyword arguments)."""
    return random_problem(draw, **kwargs)


@st.composite
def problems_with_order(draw: Draw, **kwargs: Any) -> tuple[ScheduleProblem, tuple[str, ...]]:
    """A random problem and a random topological order of it."""
    p = random_problem(draw, **kwargs)
    return p, random_topological_order(p, draw)
