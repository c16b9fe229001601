"""The search space of the CP-SAT model as plain data (no ortools here): items, candidates, keys.

A schedule is modelled as a sequence of **items**, each a fixed run of ops:

* ``FIXED`` items (fixed-order mode): one backbone op each, at a constant key. Runs of them
  between two allowed slots form **segments**, the compute intervals of the clock (coarsening).
* ``COMPUTE`` items (free-order mode): one op each (a zero-cost op that reads a single item's
  output is folded into that item: coarsening), at a variable key.
* ``ISSUE`` items: one per **candidate** (a lone collective or a bucket); it runs, for each
  member in original order, the member's producer-only chain (fixed mode) then the member. A
  bucket is issued at its last op, so every member sits in one contiguous block: the
  simulator never uses a bucketed member's own position, so this loses nothing.
* ``WAIT`` items: one per candidate, the member waits in original order (the bucket is waited
  at the first one).

Every op gets a **key**: its item's key plus its offset in the item. Keys order the program, so
the memory at each program position is a cumulative over the key axis (see cpsat_model).
In fixed mode, slot ``k`` (the gap before backbone op ``k``) owns keys ``[k*M, k*M + M - 1)``
and backbone op ``k`` has key ``k*M + M - 1``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..heuristics.placement import Placement
from .problem import OpKind, ProblemError, ScheduleProblem
from .simulator import copy_in_ns, copy_out_ns


class ItemKind(str, Enum):
    FIXED = "fixed"
    COMPUTE = "compute"
    ISSUE = "issue"
    WAIT = "wait"


@dataclass(frozen=True)
class Candidate:
    """A lone collective or a bucket the model may choose."""

    index: int
    members: tuple[str, ...]  # original order
    group: str
    runtime_ns: int
    copy_in_ns: int
    copy_out_ns: int
    copies_out: bool  # all_gather / all_to_all bucket: outputs appear at the wait

    @property
    def is_bucket(self) -> bool:
        return len(self.members) > 1


@dataclass
class Item:
    """A contiguous run of ops placed as one unit."""

    index: int
    kind: ItemKind
    ops: tuple[str, ...]
    cost_ns: int  # compute-stream time of the item (chains + copy-in for issues; copy-out for waits)
    candidate: int | None = None  # ISSUE / WAIT: the candidate whose presence it follows
    key: int | None = None  # FIXED, and frozen items of a free window: constant key
    slots: tuple[int, ...] = ()  # fixed mode, ISSUE / WAIT: allowed slots
    deps: set[int] = field(default_factory=set)  # items that must precede it (when both present)
    anchor: int | None = None  # frozen items: the incumbent's position, which fixes their mutual order
    times: tuple[int, int] | None = None  # window rounds, items before the window: (start, end), constant


@dataclass
class Frame:
    """Items, candidates and the key layout of one model."""

    problem: ScheduleProblem
    mode: str
    items: list[Item]
    candidates: list[Candidate]
    cands_of: dict[str, list[int]]  # collective -> candidates holding it
    issue_item: dict[int, int]  # candidate -> its ISSUE item
    wait_item: dict[int, int]  # candidate -> its WAIT item
    op_items: dict[str, list[tuple[int, int]]]  # op -> [(item, offset)] over every item holding it
    key_span: int  # M in fixed mode (keys per slot); total key range in free mode
    n_keys: int  # keys are in [0, n_keys)
    segments: list[tuple[int, int]] = field(default_factory=list)  # fixed: [a, b) backbone ranges
    backbone: tuple[str, ...] = ()
    multi_dtype: bool = False
    # free mode, window rounds (cpsat_window.py): the key range [lo, hi) of the free items; every
    # other item is frozen at its constant ``key``
    window: tuple[int, int] | None = None
    comm_times: dict[int, tuple[int, int]] = field(default_factory=dict)  # window rounds: candidates
    # issued before the window: (start, end), constant
    # window rounds: the incumbent as simulated once (per position the compute clock after it, per
    # placement its comm (start, end)), for the frozen items and the time hints alike
    clocks: list[int] = field(default_factory=list)
    comm_timing: dict[frozenset[str], tuple[int, int]] = field(default_factory=dict)
    # truncated window rounds: the incumbent's compute clock at the window's last position, which
    # the free items must end by (where no frozen item follows them to say so)
    window_end_ns: int | None = None


@dataclass(frozen=True)
class FrameOptions:
    mode: str = "fixed"
    bucketing: bool = True
    multi_dtype: bool = False
    bucket_cap_bytes: int | None = None
    max_bucket_size: int = 4
    bucket_window: int = 4
    coarsen: bool = True
    coarsen_threshold_ns: int = 20_000
    max_ahead: int | None = None  # issue no earlier than the need of the max_ahead-th earlier unit
    plan: tuple[tuple[str, ...], ...] = ()  # buckets that must be chosen
    # neighbourhood search (large graphs): per collective the (issue, wait) slots of a known
    # schedule; items keep only the allowed slots within ``radius`` of them (by slot rank)
    extra: tuple[tuple[str, ...], ...] = ()  # optional buckets added to the candidates
    centers: tuple[tuple[str, int, int], ...] = ()
    radius: int | None = None
    frozen: frozenset[str] = frozenset()  # collectives held at their centers (radius 0)
    contiguous_chains: bool = False  # fixed mode: chains as the problem's order runs them (Placement)
    bucketed_only: frozenset[str] = frozenset()  # collectives with no lone candidate (in extra buckets)
    positions: tuple[tuple[str, int, int], ...] = ()  # per collective: incumbent issue and wait positions


def build_frame(problem: ScheduleProblem, opts: FrameOptions) -> Frame:
    """The items and candidates of ``problem`` under ``opts`` (see module docstring)."""
    if opts.mode not in ("fixed", "free"):
        raise ValueError(f"mode must be 'fixed' or 'free', got {opts.mode!r}")
    pl = Placement(problem, move_chains=opts.mode == "fixed", contiguous_chains=opts.contiguous_chains)
    cands = _candidates(problem, pl, opts)
    frame = _fixed_frame(problem, pl, cands, opts) if opts.mode == "fixed" else _free_frame(problem, cands)
    frame.multi_dtype = opts.multi_dtype
    return frame


def _candidates(problem: ScheduleProblem, pl: Placement, opts: FrameOptions) -> list[Candidate]:
    ops = problem.op_by_name
    out: list[Candidate] = []
    seen: set[tuple[str, ...]] = set()

    def add(members: tuple[str, ...]) -> None:
        if members in seen:
            return
        seen.add(members)
        infos = [ops[m].collective for m in members]
        first = infos[0]
        assert first is not None
        bucket = len(members) > 1
        out.append(Candidate(
            index=len(out), members=members, group=first.group,
            runtime_ns=problem.bucket_runtime_ns(members),
            copy_in_ns=copy_in_ns(problem, members),
            copy_out_ns=copy_out_ns(problem, members),
            copies_out=bucket and first.kind.bucket_copies_out,
        ))

    forced = {m for b in opts.plan for m in b}
    for c in problem.collectives:
        if c.name not in forced and c.name not in opts.bucketed_only:
            add((c.name,))
    for b in opts.plan:
        members = tuple(sorted(b, key=problem.index.__getitem__))
        problem_err = _bucket_error(problem, pl, members, opts, check_cap=False)
        if problem_err:
            raise ProblemError(f"plan bucket {members}: {problem_err}")
        add(members)
    for b in opts.extra:
        members = tuple(sorted(b, key=problem.index.__getitem__))
        if not _bucket_error(problem, pl, members, opts, check_cap=False):
            add(members)
    if not opts.bucketing:
        return out
    by_key: dict[tuple, list[str]] = {}
    for c in problem.collectives:
        if c.name in forced or (c.collective.group, c.collective.kind) not in problem.curve_by_key:  # type: ignore[union-attr]
            continue
        by_key.setdefault(c.collective.bucket_key(opts.multi_dtype), []).append(c.name)  # type: ignore[union-attr]
    for names in by_key.values():
        for start in range(len(names)):
            window = names[start:start + opts.bucket_window]
            for size in range(2, min(opts.max_bucket_size, len(window)) + 1):
                for rest in itertools.combinations(window[1:], size - 1):
                    members = (window[0], *rest)
                    if not _bucket_error(problem, pl, members, opts):
                        add(members)
    return out


def bucket_size_bytes(problem: ScheduleProblem, members: tuple[str, ...]) -> int:
    """The size a bucket cap limits: per member the larger of its input and output."""
    ops = problem.op_by_name
    return sum(max(ops[m].collective.bytes_in, ops[m].collective.bytes_out) for m in members)  # type: ignore[union-attr]


def _bucket_error(problem: ScheduleProblem, pl: Placement, members: tuple[str, ...],
                  opts: FrameOptions, check_cap: bool = True) -> str:
    """Why ``members`` cannot form a bucket ('' when they can)."""
    ops = problem.op_by_name
    keys = {ops[m].collective.bucket_key(opts.multi_dtype) for m in members}  # type: ignore[union-attr]
    if len(keys) > 1:
        return "members have different bucket keys"
    for a, b in itertools.combinations(members, 2):
        if problem.depends_on(a, b) or problem.depends_on(b, a):
            return f"{a!r} and {b!r} depend on each other"
    if opts.mode == "fixed":
        earliest, need = pl.slot_bounds(members)
        if earliest > need:
            return "no slot where every member's inputs exist before the first member is needed"
    if check_cap and opts.bucket_cap_bytes is not None and bucket_size_bytes(problem, members) > opts.bucket_cap_bytes:
        return "over the size cap"
    return ""


def _candidate_items(problem: ScheduleProblem, cands: list[Candidate], chains: dict[str, tuple[str, ...]],
                     items: list[Item]) -> tuple[dict[int, int], dict[int, int]]:
    issue_item, wait_item = {}, {}
    ops = problem.op_by_name
    for c in cands:
        seq = tuple(op for m in c.members for op in (*chains.get(m, ()), m))
        chain_ns = sum(ops[o].runtime_ns for o in seq if ops[o].kind is OpKind.COMPUTE)
        issue_item[c.index] = len(items)
        items.append(Item(len(items), ItemKind.ISSUE, seq, chain_ns + c.copy_in_ns, candidate=c.index))
        wait_item[c.index] = len(items)
        items.append(Item(len(items), ItemKind.WAIT, tuple(problem.wait_of[m] for m in c.members),
                          c.copy_out_ns, candidate=c.index))
    return issue_item, wait_item


def _op_items(items: list[Item]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for it in items:
        for off, op in enumerate(it.ops):
            out.setdefault(op, []).append((it.index, off))
    return out


def _item_deps(problem: ScheduleProblem, items: list[Item], op_items: dict[str, list[tuple[int, int]]]) -> None:
    """Item y depends on item x when an op of y reads an op of x (x != y)."""
    ops = problem.op_by_name
    for it in items:
        for o in it.ops:
            for d in ops[o].deps:
                for x, _ in op_items[d]:
                    if x != it.index:
                        it.deps.add(x)


def _fixed_frame(problem: ScheduleProblem, pl: Placement, cands: list[Candidate], opts: FrameOptions) -> Frame:
    ops = problem.op_by_name
    n = len(pl.backbone)
    chains = {c: u.chain for c, u in pl.units.items()}
    allowed = {0, n}
    for k, name in enumerate(pl.backbone):
        op = ops[name]
        if not opts.coarsen or op.heavy or op.runtime_ns >= opts.coarsen_threshold_ns:
            allowed.update((k, k + 1))
    for u in pl.units.values():
        allowed.update((u.earliest, u.need))
    for _, issue_slot, wait_slot in opts.centers:  # the incumbent stays exactly representable
        allowed.update((issue_slot, wait_slot))
    slots = sorted(allowed)
    segments = [(a, b) for a, b in zip(slots, slots[1:])]
    items: list[Item] = []
    n_cand_ops = sum(len(chains[m]) + 2 for c in cands for m in c.members)
    span = n_cand_ops + 1
    for k, name in enumerate(pl.backbone):
        items.append(Item(len(items), ItemKind.FIXED, (name,), ops[name].runtime_ns, key=k * span + span - 1))
    issue_item, wait_item = _candidate_items(problem, cands, chains, items)
    windows = _windows(problem, pl, opts)
    centers = {c: (i, w) for c, i, w in opts.centers}
    positions = {c: (i, w) for c, i, w in opts.positions}
    for c in cands:
        lo = max(pl.units[m].earliest for m in c.members)
        hi = min(pl.units[m].need for m in c.members)
        lo_issue = max(lo, min(windows[m] for m in c.members))
        ok = _between(slots, lo_issue, hi) or _between(slots, lo, hi)
        issue_ok, wait_ok = ok, ok
        if opts.radius is not None and all(m in centers for m in c.members):
            frozen = any(m in opts.frozen for m in c.members)
            radius = 0 if frozen else opts.radius
            issue_ok = _near(ok, max(centers[m][0] for m in c.members), radius)
            wait_ok = _near(ok[bisect.bisect_left(ok, issue_ok[0]):], min(centers[m][1] for m in c.members), radius)
            if frozen and all(m in positions for m in c.members):
                items[issue_item[c.index]].anchor = max(positions[m][0] for m in c.members)
                items[wait_item[c.index]].anchor = min(positions[m][1] for m in c.members)
        items[issue_item[c.index]].slots = tuple(issue_ok)
        items[wait_item[c.index]].slots = tuple(wait_ok)
    op_items = _op_items(items)
    _item_deps(problem, items, op_items)
    return Frame(problem, "fixed", items, cands, _cands_of(cands), issue_item, wait_item, op_items,
                 key_span=span, n_keys=(n + 1) * span, segments=segments, backbone=pl.backbone)


def _between(slots: list[int], lo: int, hi: int) -> list[int]:
    """The sorted ``slots`` in ``[lo, hi]``."""
    return slots[bisect.bisect_left(slots, lo):bisect.bisect_right(slots, hi)]


def _near(slots: list[int], center: int, radius: int) -> list[int]:
    """The slots within ``radius`` ranks of the one nearest ``center`` (never empty; sorted input)."""
    j = bisect.bisect_left(slots, center)
    i = min((k for k in (j - 1, j) if 0 <= k < len(slots)), key=lambda k: (abs(slots[k] - center), k))
    return slots[max(0, i - radius): i + radius + 1]


def order_pairs(frame: Frame) -> int:
    """How many pairs of movable items may share a slot (the order literals a model needs)."""
    spans = sorted((min(it.slots), max(it.slots)) for it in frame.items if it.slots)
    if frame.mode == "free":
        n = sum(1 for it in frame.items if it.kind is not ItemKind.FIXED)
        return n * (n - 1) // 2
    ends: list[int] = []
    total = 0
    for lo, hi in spans:  # count earlier spans still open at lo
        total += len(ends) - bisect.bisect_left(ends, lo)
        bisect.insort(ends, hi)
    return total


def _windows(problem: ScheduleProblem, pl: Placement, opts: FrameOptions) -> dict[str, int]:
    """Per collective, the first slot its issue may take under ``max_ahead`` (0: no limit)."""
    out = {c: 0 for c in pl.units}
    if opts.max_ahead is None:
        return out
    by_group: dict[str, list[str]] = {}
    for c in pl.units:
        by_group.setdefault(problem.op_by_name[c].collective.group, []).append(c)  # type: ignore[union-attr]
    for names in by_group.values():
        names.sort(key=lambda c: (pl.units[c].need, problem.index[c]))
        for i, c in enumerate(names):
            if i >= opts.max_ahead:
                out[c] = pl.units[names[i - opts.max_ahead]].need
    return out


def _free_frame(problem: ScheduleProblem, cands: list[Candidate]) -> Frame:
    items: list[Item] = []
    owner: dict[str, int] = {}
    for op in problem.ops:
        if op.kind in (OpKind.COLLECTIVE, OpKind.WAIT):
            continue
        # coarsening: a zero-cost op that reads one compute item only runs right after it
        srcs = {owner.get(d) for d in op.deps}
        src = srcs.pop() if len(srcs) == 1 else None
        if op.kind is OpKind.ZERO and src is not None and items[src].kind is ItemKind.COMPUTE:
            it = items[src]
            it.ops = (*it.ops, op.name)
            owner[op.name] = it.index
            continue
        owner[op.name] = len(items)
        items.append(Item(len(items), ItemKind.COMPUTE, (op.name,), op.runtime_ns))
    issue_item, wait_item = _candidate_items(problem, cands, {}, items)
    op_items = _op_items(items)
    _item_deps(problem, items, op_items)
    n_keys = sum(len(it.ops) for it in items) + 1
    return Frame(problem, "free", items, cands, _cands_of(cands), issue_item, wait_item, op_items,
                 key_span=n_keys, n_keys=n_keys)


def _cands_of(cands: Sequence[Candidate]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for c in cands:
        for m in c.members:
            out.setdefault(m, []).append(c.index)
    return out
