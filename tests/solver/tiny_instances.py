"""Deterministic tiny scheduling problems that the brute-force oracle (oracle.py) can solve.

Each problem comes from :func:`random_dags.random_problem` with narrow choices (all_gather and/or
reduce_scatter, mostly bf16, one reduce op, 1-2 groups) so that collectives often share a bucket
key, and is kept only when it is small enough to enumerate and interesting enough to schedule:
a heavy positive-cost compute op, and at least one hideable collective (some positive-cost
compute is independent of it, so its consumers can come late).

About half of the problems are *latency-dominated* (metadata ``latency_dominated == "1"``): their
collectives are small (inputs shrunk 8x, outputs resized to match) and priced on curves with a
large fixed latency and a small slope, and bucket copies are cheap, so that bucketing can pay:
with random_problem's own curves, 1-2 GB/s copies and collective buffers as large as the
activations, a bucket's flat buffers almost never fit the original order's peak.
"""

from __future__ import annotations

import dataclasses
import random

from fxsched.solver import (
    BucketCosts,
    CollectiveKind,
    CommCurve,
    OpKind,
    ScheduleProblem,
    simulate,
)

try:  # imported as tests.solver.tiny_instances (python -m ...)
    from .oracle import (
        canonical_assumptions_hold,
        count_orders,
        search,
        valid_bucketings,
    )
    from .random_dags import random_problem
except ImportError:  # imported with tests/solver on sys.path (pytest)
    from oracle import (  # type: ignore[no-redef]
        canonical_assumptions_hold,
        count_orders,
        search,
        valid_bucketings,
    )
    from random_dags import random_problem  # type: ignore[no-redef]

AG = CollectiveKind.ALL_GATHER
RS = CollectiveKind.REDUCE_SCATTER
KIND_CHOICES: tuple[tuple[CollectiveKind, ...], ...] = ((AG,), (RS,), (AG, RS))
LATENCY_KIND_CHOICES: tuple[tuple[CollectiveKind, ...], ...] = ((RS,), (AG, RS))
LATENCY_SHARE = 0.5
SHRINK = 8
BUCKET_WIN_EVERY = 4  # tiny_0, tiny_4, ...: bucketing strictly beats no bucketing (default budget)
MAX_ATTEMPTS_PER_PROBLEM = 500


def n_compute(problem: ScheduleProblem) -> int:
    """Ops that are neither collectives nor waits (compute and zero-cost)."""
    return sum(op.kind in (OpKind.COMPUTE, OpKind.ZERO) for op in problem.ops)


def has_size2_bucket(problem: ScheduleProblem) -> bool:
    """Whether some pair of collectives forms a valid bucket (free mode)."""
    return len(valid_bucketings(problem)) > 1


def free_orders(problem: ScheduleProblem) -> int:
    """Canonical free-mode schedules summed over the valid bucketings."""
    return sum(count_orders(problem, b, "free") for b in valid_bucketings(problem))


def _bytes_out(kind: CollectiveKind, bytes_in: int, group_size: int) -> int:
    """As random_dags prices outputs: all_gather multiplies, reduce_scatter divides."""
    if kind is AG:
        return bytes_in * group_size
    if kind is RS:
        return bytes_in // group_size
    return bytes_in


def latency_dominated(p: ScheduleProblem, rng: random.Random, shrink: int = 8) -> ScheduleProblem:
    """``p`` with small collectives on latency-bound curves: collective inputs shrunk ``shrink``x
    (outputs resized to match), curves 8-25 us + up to 20 us per 64 KiB, collectives repriced,
    and cheap bucket copies. Activations keep their size, so the memory budget has headroom."""
    curves = tuple(
        CommCurve(c.group, c.kind, ((0, lat), (1 << 16, lat + rng.randint(1, 20_000))))
        for c in p.comm_curves for lat in [rng.randint(8_000, 25_000)]
    )
    curve_of = {(c.group, c.kind): c for c in curves}
    group_size = {g.name: g.size for g in p.groups}
    size = {st.name: st.size_bytes for st in p.storages}
    for name in {u for c in p.collectives for u in c.uses}:
        size[name] //= shrink
    ops = []
    for op in p.ops:  # original order is topological: an input is resized before it is read
        info = op.collective
        if info is not None:
            b_in = size[op.uses[0]]
            info = dataclasses.replace(info, bytes_in=b_in, bytes_out=_bytes_out(info.kind, b_in, group_size[info.group]))
            for out in op.allocates:
                size[out] = info.bytes_out
            op = dataclasses.replace(op, collective=info,
                                     runtime_ns=curve_of[(info.group, info.kind)].runtime_ns(info.size_bytes))
        ops.append(op)
    return dataclasses.replace(
        p, ops=tuple(ops), comm_curves=curves,
        storages=tuple(dataclasses.replace(st, size_bytes=size[st.name]) for st in p.storages),
        bucket_costs=BucketCosts(3350.0, rng.randint(0, 2_000)),
        metadata={**p.metadata, "latency_dominated": "1"})


def _shape_ok(p: ScheduleProblem, max_compute: int, max_collectives: int) -> bool:
    return (2 <= len(p.collectives) <= max_collectives and n_compute(p) <= max_compute
            and any(op.heavy and op.runtime_ns > 0 for op in p.ops) and canonical_assumptions_hold(p))


def bucketing_pays(p: ScheduleProblem) -> bool:
    """Whether the free-mode optimum with some bucket beats the one without (default budget)."""
    bucketings = valid_bucketings(p)
    with_b = search(p, bucketings[1:]).best_makespan_ns
    return with_b is not None and with_b < search(p, [()]).best_makespan_ns  # type: ignore[operator]


def _interesting(p: ScheduleProblem, k: int, max_orders: int) -> bool:
    """Problem ``k`` may be hidden; even ``k`` has a bucket; every BUCKET_WIN_EVERY-th one's pays."""
    if simulate(p).n_hideable == 0:  # nothing can overlap any collective
        return False
    if k % 2 == 0 and not has_size2_bucket(p):
        return False
    if free_orders(p) > max_orders:
        return False
    return k % BUCKET_WIN_EVERY != 0 or bucketing_pays(p)


def tiny_problems(
    n: int,
    seed: int = 0,
    *,
    max_compute: int = 8,
    max_collectives: int = 4,
    max_groups: int = 2,
    max_orders: int = 20000,
) -> list[ScheduleProblem]:
    """``n`` deterministic tiny problems named ``tiny_0`` .. ``tiny_<n-1>``.

    Every even-numbered problem has at least one valid bucket of two collectives, and in every
    ``BUCKET_WIN_EVERY``-th one (``tiny_0`` first) bucketing strictly pays; all have
    2..``max_collectives`` collectives, at most ``max_compute`` compute/zero ops, a heavy
    positive-cost compute op, a hideable collective, and at most ``max_orders`` canonical
    free-mode schedules over all valid bucketings.
    """
    out: list[ScheduleProblem] = []
    attempt = 0
    while len(out) < n:
        if attempt > MAX_ATTEMPTS_PER_PROBLEM * (n + 1):
            raise RuntimeError(f"tiny_problems: only {len(out)} of {n} found in {attempt} attempts")
        rng = random.Random(seed * 1_000_003 + attempt)
        attempt += 1
        latency = rng.random() < LATENCY_SHARE
        p = random_problem(
            rng,
            max_ops=rng.randint(6, max_compute + 2 * max_collectives),
            max_groups=max_groups,
            kinds=rng.choice(LATENCY_KIND_CHOICES if latency else KIND_CHOICES),
            dtypes=("bf16",) if rng.random() < 0.85 else ("bf16", "f32"),
            reduce_ops=("sum",),
            max_inputs=3,
            name=f"tiny_{len(out)}",
        )
        if not _shape_ok(p, max_compute, max_collectives):
            continue
        if latency:
            p = latency_dominated(p, rng, SHRINK)
        if _interesting(p, len(out), max_orders):
            out.append(p)
    return out
