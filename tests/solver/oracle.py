"""Brute-force optimality oracle for tiny scheduling problems (tests only; independent of CP-SAT).

The oracle enumerates every valid bucketing and, for each, every schedule in a *canonical form*,
scores each one with the simulator (the normative scorer), and keeps the smallest makespan whose
peak memory fits the budget (ties: smaller peak, then first found).

Canonical form, mode ``"free"`` (any topological order): every op that is neither a collective
nor a wait is its own item; each bucket (or lone collective) is ONE issue item, its members
listed in original order; each bucket has ONE wait item, its members' waits in original order.
The schedules are all linear extensions of the item graph.

Why free-mode canonical forms lose no optimum. Take any valid schedule (``check_schedule``) with
buckets. The simulator never looks at a bucketed member's own program position:

* time: the bucket is issued (copy-in, then one collective) at its LAST member's position and
  waited (stall, then copy-out for all_gather/all_to_all) at its FIRST member's wait; a
  non-last member and a non-first member wait cost nothing where they stand;
* memory: member inputs are read by the copy-in at the bucket issue; member outputs are
  allocated at the bucket issue, or for all_gather/all_to_all buckets at the bucket wait, and
  the bucket buffers live from issue to wait. A non-last member allocates and frees nothing at
  its own position. A member wait only *reads* its output storage there.

So move every non-last member to just before the last one, and every other member wait to just
after the first member wait. The other ops keep their relative order, so every compute, issue
and wait event happens at the same time: the makespan is unchanged. The moved ops allocate
nothing where they now stand and a moved wait reads its storage earlier, so the memory at every
remaining op is the same or lower and the moved ops add no higher point: the peak does not rise.
The move keeps the order topological because (A1) only its wait depends directly on a
collective and (A2) a wait depends only on its collective (:func:`canonical_assumptions_hold`;
``random_dags`` problems satisfy both). Members are independent, so sorting them, and their
waits, into original order inside the block is free too. Hence the minimum over canonical forms
equals the minimum over all valid schedules with that bucketing; ``test_oracle`` checks this
empirically against every raw topological order of a few problems.

Mode ``"fixed"`` is the fixed-compute-order frame of :class:`~fxsched.heuristics.placement.Placement`,
taken as the definition of the search space (not a lossless reduction): backbone ops keep their
original relative order, and each bucket issue item carries, per member in original order, the
member's producer-only chain followed by the member. It is a subset of the valid schedules, so
its optimum is never below the free one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from fxsched.heuristics.placement import Placement
from fxsched.solver import OpKind, Schedule, ScheduleProblem, check_schedule, simulate

Bucketing = tuple[tuple[str, ...], ...]
MODES = ("free", "fixed")


@dataclass(frozen=True)
class OracleResult:
    """The optimum found (``None`` fields when no schedule fits the budget) and search counts."""

    best_makespan_ns: int | None
    best_peak_bytes: int | None
    witness: Schedule | None
    n_schedules: int  # canonical schedules enumerated, over all bucketings searched
    n_feasible: int  # of those, the ones whose peak memory fits the budget


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def canonical_assumptions_hold(problem: ScheduleProblem) -> bool:
    """(A1) only its wait depends directly on a collective; (A2) a wait depends only on its collective."""
    ops = problem.op_by_name
    for op in problem.ops:
        if op.kind is OpKind.WAIT and tuple(op.deps) != (op.waits_on,):
            return False
        for d in op.deps:
            if ops[d].kind is OpKind.COLLECTIVE and op.waits_on != d:
                return False
    return True


def default_budget(problem: ScheduleProblem) -> int:
    """The default memory budget: the peak of the original order, unbucketed."""
    return simulate(problem).peak_memory_bytes


# ---- bucketings ----

def valid_bucketings(
    problem: ScheduleProblem, *, multi_dtype: bool = False, cap_bytes: int | None = None, mode: str = "free"
) -> list[Bucketing]:
    """Every partition of the collectives into buckets (only buckets of 2+ listed, members in
    original order; ``()`` first) whose buckets share a bucket key, have a comm curve, hold no
    dependent pair, fit ``cap_bytes`` (sum of max(bytes_in, bytes_out)) and, in fixed mode,
    fit the Placement frame (max earliest <= min need)."""
    _check_mode(mode)
    ops = problem.op_by_name
    names = [c.name for c in problem.collectives]
    units = Placement(problem).units if mode == "fixed" else None

    def size(c: str) -> int:
        info = ops[c].collective
        assert info is not None
        return max(info.bytes_in, info.bytes_out)

    def can_join(block: list[str], c: str) -> bool:
        info, first = ops[c].collective, ops[block[0]].collective
        assert info is not None and first is not None
        if (info.group, info.kind) not in problem.curve_by_key:
            return False
        if info.bucket_key(multi_dtype) != first.bucket_key(multi_dtype):
            return False
        if any(problem.depends_on(c, m) or problem.depends_on(m, c) for m in block):
            return False
        if cap_bytes is not None and sum(map(size, block)) + size(c) > cap_bytes:
            return False
        if units is not None:
            members = [*block, c]
            return max(units[m].earliest for m in members) <= min(units[m].need for m in members)
        return True

    out: list[Bucketing] = []
    blocks: list[list[str]] = []

    def rec(i: int) -> None:  # restricted growth: each partition once
        if i == len(names):
            out.append(tuple(tuple(b) for b in blocks if len(b) >= 2))
            return
        c = names[i]
        blocks.append([c])
        rec(i + 1)
        blocks.pop()
        for b in blocks:
            if can_join(b, c):
                b.append(c)
                rec(i + 1)
                b.pop()

    rec(0)
    return out


# ---- items and their linear extensions ----

def _items(problem: ScheduleProblem, buckets: Bucketing, mode: str) -> tuple[list[tuple[str, ...]], list[int]]:
    """Canonical items (each a tuple of op names) and, per item, the bitset of its predecessors."""
    _check_mode(mode)
    idx = problem.index
    bucketed = {m for b in buckets for m in b}
    groups = [tuple(sorted(b, key=idx.__getitem__)) for b in buckets]
    groups += [(c.name,) for c in problem.collectives if c.name not in bucketed]
    items: list[tuple[str, ...]] = []
    chain_pairs: list[tuple[str, str]] = []  # (before, after) edges beyond data dependencies
    if mode == "free":
        items += [(op.name,) for op in problem.ops if op.kind not in (OpKind.COLLECTIVE, OpKind.WAIT)]
        items += groups
    else:
        pl = Placement(problem)
        items += [(n,) for n in pl.backbone]
        chain_pairs = list(zip(pl.backbone, pl.backbone[1:]))
        items += [tuple(x for m in g for x in (*pl.units[m].chain, m)) for g in groups]
    items += [tuple(problem.wait_of[m] for m in g) for g in groups]
    items.sort(key=lambda it: min(idx[n] for n in it))
    item_of = {n: i for i, it in enumerate(items) for n in it}
    assert len(item_of) == sum(map(len, items)) == len(problem.ops), "items must cover each op once"
    preds = [0] * len(items)
    for i, it in enumerate(items):
        for n in it:
            for d in problem.op_by_name[n].deps:
                if item_of[d] != i:
                    preds[i] |= 1 << item_of[d]
    for a, b in chain_pairs:
        preds[item_of[b]] |= 1 << item_of[a]
    return items, preds


def _extensions(preds: Sequence[int]) -> Iterator[list[int]]:
    """Every linear extension of the item graph (DFS over ready items, lowest index first).
    Yields one shared list: copy it before the next step. Nothing when the graph is cyclic."""
    n = len(preds)
    full = (1 << n) - 1
    seq: list[int] = []

    def rec(done: int) -> Iterator[list[int]]:
        if done == full:
            yield seq
            return
        for i in range(n):
            if not done >> i & 1 and not preds[i] & ~done:
                seq.append(i)
                yield from rec(done | 1 << i)
                seq.pop()

    yield from rec(0)


def _count(preds: Sequence[int]) -> int:
    """Number of linear extensions, by a DP over the sets of items already placed."""
    n = len(preds)
    full = (1 << n) - 1
    memo: dict[int, int] = {full: 1}

    def rec(done: int) -> int:
        if done in memo:
            return memo[done]
        total = sum(rec(done | 1 << i) for i in range(n) if not done >> i & 1 and not preds[i] & ~done)
        memo[done] = total
        return total

    return rec(0)


def enumerate_schedules(
    problem: ScheduleProblem, buckets: Bucketing, *, mode: str = "free", multi_dtype: bool = False
) -> Iterator[Schedule]:
    """Every canonical schedule for ``buckets`` (see the module docstring)."""
    items, preds = _items(problem, buckets, mode)
    for seq in _extensions(preds):
        order = tuple(n for i in seq for n in items[i])
        yield Schedule(order=order, buckets=buckets, multi_dtype=multi_dtype)


def count_orders(problem: ScheduleProblem, buckets: Bucketing, mode: str = "free") -> int:
    """How many schedules :func:`enumerate_schedules` yields, without enumerating them."""
    return _count(_items(problem, buckets, mode)[1])


def total_orders(problem: ScheduleProblem, *, mode: str = "free", bucketing: bool = True,
                 multi_dtype: bool = False, cap_bytes: int | None = None) -> int:
    """Schedules :func:`brute_force` would simulate with the same arguments."""
    bucketings = valid_bucketings(problem, multi_dtype=multi_dtype, cap_bytes=cap_bytes, mode=mode) \
        if bucketing else [()]
    return sum(count_orders(problem, b, mode) for b in bucketings)


def _raw_preds(problem: ScheduleProblem) -> list[int]:
    preds = [0] * len(problem.ops)
    for i, op in enumerate(problem.ops):
        for d in op.deps:
            preds[i] |= 1 << problem.index[d]
    return preds


def raw_orders(problem: ScheduleProblem) -> Iterator[tuple[str, ...]]:
    """Every topological order of the raw ops (no grouping at all)."""
    names = [op.name for op in problem.ops]
    for seq in _extensions(_raw_preds(problem)):
        yield tuple(names[i] for i in seq)


def count_raw_orders(problem: ScheduleProblem) -> int:
    """How many orders :func:`raw_orders` yields."""
    return _count(_raw_preds(problem))


# ---- the oracle ----

def search(
    problem: ScheduleProblem,
    bucketings: Iterable[Bucketing],
    *,
    mode: str = "free",
    multi_dtype: bool = False,
    budget_bytes: int | None = None,
) -> OracleResult:
    """The best canonical schedule over the given bucketings (see :func:`brute_force`)."""
    budget = default_budget(problem) if budget_bytes is None else budget_bytes
    best: tuple[tuple[int, int], Schedule] | None = None
    n = feasible = 0
    for buckets in bucketings:
        for s in enumerate_schedules(problem, buckets, mode=mode, multi_dtype=multi_dtype):
            r = simulate(problem, s, check=False)
            n += 1
            if r.peak_memory_bytes > budget:
                continue
            feasible += 1
            key = (r.makespan_ns, r.peak_memory_bytes)
            if best is None or key < best[0]:
                best = (key, s)
    if best is None:
        return OracleResult(None, None, None, n, 0)
    (makespan, peak), witness = best
    violations = check_schedule(problem, witness)
    assert not violations, f"oracle witness for {problem.name!r} is invalid: {violations}"
    return OracleResult(makespan, peak, witness, n, feasible)


def brute_force(
    problem: ScheduleProblem,
    *,
    mode: str = "free",
    bucketing: bool = True,
    multi_dtype: bool = False,
    cap_bytes: int | None = None,
    budget_bytes: int | None = None,
) -> OracleResult:
    """Minimum simulated makespan over every canonical schedule of every valid bucketing (only
    the empty one unless ``bucketing``) whose peak memory is <= ``budget_bytes`` (default: the
    original order's peak). Ties go to the smaller peak. Check :func:`total_orders` first."""
    bucketings = valid_bucketings(problem, multi_dtype=multi_dtype, cap_bytes=cap_bytes, mode=mode) \
        if bucketing else [()]
    return search(problem, bucketings, mode=mode, multi_dtype=multi_dtype, budget_bytes=budget_bytes)
