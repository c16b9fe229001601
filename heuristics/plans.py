"""Module bucket plans, as SimpleFSDP's ``module_bucket_plans``.

The user names module FQNs, or lists of FQNs, whose collectives form buckets, e.g.
``["tok_embeddings", ["layers.0.attention", "layers.0.feed_forward"], "layers.1"]``.
``Op.module`` holds each op's innermost module FQN; a collective belongs to plan entry E when
its module equals one of E's FQNs or lies below one (``module.startswith(fqn + ".")``: a
prefix match on whole path components, so ``layers.1`` does not match ``layers.10``).

:func:`plan_buckets` is a pure function of (problem, plan) returning explicit member tuples,
so the same plan can later constrain the CP-SAT model. :func:`plan_schedule` hands those
buckets to the overlap scheduler, which prefetches each bucket under the neighbouring
entries' compute (all_gathers before their module, reduce_scatters after it).

Nothing here imports torch or ortools.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from .bucketing import DEFAULT_OVERLAP, BucketFeasibility, bucketable, need_order
from .overlap import OverlapConfig, overlap_schedule
from .placement import Placement

log = logging.getLogger(__name__)


def module_matches(module: str | None, fqn: str) -> bool:
    """Whether an op in ``module`` lies in module ``fqn`` (equal, or below it)."""
    return module is not None and (module == fqn or module.startswith(fqn + "."))


def _check_fqn(fqn: object) -> str:
    if not isinstance(fqn, str):
        raise TypeError(f"module plan: FQN {fqn!r} is not a string")
    if not fqn or any(part == "" for part in fqn.split(".")):
        raise ValueError(f"module plan: malformed FQN {fqn!r} (empty path component)")
    return fqn


@dataclass(frozen=True)
class ModulePlan:
    """Normalised plan: each entry is a tuple of module FQNs whose collectives bucket together.

    Validation (ValueError naming the offending FQN; TypeError for a non-string FQN or a
    string where a list of FQNs belongs): the plan and every entry are non-empty, FQNs are
    non-empty dotted paths, and no FQN is in two entries. Since the modules of two
    entries must not overlap (torch's ``ManualOverlapScheduler`` asserts the same), an FQN
    that contains, or lies inside, an FQN of another entry is rejected too. An FQN repeated
    within one entry is kept once.
    """

    entries: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("module plan: no entries")
        entries: list[tuple[str, ...]] = []
        owner: dict[str, int] = {}
        for e, entry in enumerate(self.entries):
            if isinstance(entry, str):
                raise TypeError(f"module plan: entry {e} must be a tuple of FQNs, got the string {entry!r}")
            if not entry:
                raise ValueError(f"module plan: entry {e} is empty")
            fqns = tuple(dict.fromkeys(_check_fqn(f) for f in entry))
            for f in fqns:
                if f in owner:
                    raise ValueError(f"module plan: FQN {f!r} is in entries {owner[f]} and {e}")
                owner[f] = e
            entries.append(fqns)
        for f, e in owner.items():
            for g, h in owner.items():
                if e != h and module_matches(g, f):
                    raise ValueError(f"module plan: FQN {g!r} (entry {h}) lies inside {f!r} (entry {e}); "
                                     "entries must name disjoint modules")
        object.__setattr__(self, "entries", tuple(entries))

    @classmethod
    def from_user(cls, plan: Sequence[str | Sequence[str]]) -> ModulePlan:
        """Normalise a user plan: a string entry is one FQN, a sequence entry a group of FQNs."""
        if isinstance(plan, str):
            raise TypeError(f"module plan: expected a list of FQNs or FQN lists, got the string {plan!r}")
        entries: list[tuple[str, ...]] = []
        for entry in plan:
            if isinstance(entry, str):
                entries.append((entry,))
            elif isinstance(entry, Sequence):
                entries.append(tuple(entry))
            else:
                raise TypeError(f"module plan: entry {entry!r} is neither an FQN nor a list of FQNs")
        return cls(tuple(entries))

    @property
    def fqns(self) -> tuple[str, ...]:
        return tuple(f for entry in self.entries for f in entry)

    def entry_of(self, module: str | None) -> int | None:
        """Index of the entry whose modules contain ``module`` (None: no entry)."""
        for e, entry in enumerate(self.entries):
            if any(module_matches(module, f) for f in entry):
                return e
        return None


def plan_members(problem: ScheduleProblem, plan: ModulePlan, *, strict: bool = True) -> tuple[tuple[str, ...], ...]:
    """The collectives of each plan entry, in original order (entries in plan order).

    ``strict``: an FQN that matches no collective raises ValueError naming it (typo
    protection); with ``strict=False`` it is only logged.
    """
    members: list[list[str]] = [[] for _ in plan.entries]
    for c in problem.collectives:
        e = plan.entry_of(c.module)
        if e is not None:
            members[e].append(c.name)
    missing = [f for f in plan.fqns if not any(module_matches(c.module, f) for c in problem.collectives)]
    if missing:
        msg = (f"module plan: FQN {missing[0]!r} matches no collective"
               + (f" (nor do {missing[1:]})" if len(missing) > 1 else ""))
        if strict:
            raise ValueError(msg)
        log.warning("%s; ignored", msg)
    return tuple(tuple(m) for m in members)


def plan_buckets(
    problem: ScheduleProblem,
    plan: ModulePlan,
    *,
    strict: bool = True,
    multi_dtype: bool = False,
    placement: Placement | None = None,
) -> tuple[tuple[str, ...], ...]:
    """Buckets that honour ``plan``: per entry, one bucket per bucket key.

    For each entry (in plan order) its collectives are grouped by
    :meth:`CollectiveInfo.bucket_key` (so its all_gathers and its reduce_scatters, and any
    other kind, bucket separately). A would-be bucket whose members cannot all share one
    bucket (:class:`BucketFeasibility`: dependent members, infeasible in the
    fixed-compute-order :class:`Placement` frame, or a cycle with buckets formed before it)
    is split into maximal runs in need order: walk the members by (``unit.need``, original
    index), and start a new run whenever the next member cannot join the current one. Runs
    of one member, collectives without a comm curve for their (group, kind), and
    collectives whose module matches no entry stay unbucketed. Members are listed in
    original order; buckets by entry, then key (first appearance in need order), then run.

    ``strict``: see :func:`plan_members`. ``placement`` defaults to ``Placement(problem)``.
    """
    pl = placement or Placement(problem)
    feas = BucketFeasibility(problem, pl)
    rank = {c: i for i, c in enumerate(need_order(problem, pl))}
    idx, ops = problem.index, problem.op_by_name
    out: list[tuple[str, ...]] = []
    for e, names in enumerate(plan_members(problem, plan, strict=strict)):
        by_key: dict[tuple, list[str]] = {}
        for c in sorted(names, key=rank.__getitem__):
            if bucketable(problem, c):
                by_key.setdefault(ops[c].collective.bucket_key(multi_dtype), []).append(c)  # type: ignore[union-attr]
        for key, cands in by_key.items():
            runs: list[list[str]] = []
            for c in cands:
                if runs and feas.can_join(runs[-1], c):
                    runs[-1].append(c)
                    feas.join(runs[-1])
                else:
                    runs.append([c])
            kept = [r for r in runs if len(r) >= 2]
            if len(runs) > 1:
                log.info("module plan entry %d %s: key %s split into %d runs", e, plan.entries[e], key, len(runs))
            out.extend(tuple(sorted(r, key=idx.__getitem__)) for r in kept)
    return tuple(out)


def plan_schedule(
    problem: ScheduleProblem,
    plan: ModulePlan,
    *,
    config: OverlapConfig = DEFAULT_OVERLAP,
    strict: bool = True,
    multi_dtype: bool = False,
) -> Schedule:
    """:func:`plan_buckets`, then :func:`overlap_schedule` places the buckets: each entry's
    bucket is prefetched (or, for reductions, overlapped) with neighbouring entries' compute,
    under ``config``'s memory budget. overlap_schedule returns the original order, without
    buckets, when no bucketed schedule fits the budget or when the original simulates faster;
    that is logged as a warning."""
    pl = Placement(problem, config.move_chains)
    buckets = plan_buckets(problem, plan, strict=strict, multi_dtype=multi_dtype, placement=pl)
    sched = overlap_schedule(problem, buckets, multi_dtype=multi_dtype, config=config, placement=pl)
    if buckets and not sched.buckets:
        log.warning("plan_schedule: overlap_schedule kept the original order (no bucketed schedule "
                    "fits the memory budget or beats it); the plan's %d buckets are not applied",
                    len(buckets))
    return sched


def per_block_plan(problem: ScheduleProblem) -> ModulePlan | None:
    """One plan entry per model block, derived from the collectives' module FQNs: an FQN is cut
    after its first numeric component (``layers.3.attention`` -> ``layers.3``, the
    ``nn.ModuleList`` convention), or kept to its first component (``tok_embeddings``). None
    when no collective carries a module."""
    entries: dict[str, None] = {}
    for c in problem.collectives:
        if not c.module:
            continue
        parts = c.module.split(".")
        cut = next((i + 1 for i, part in enumerate(parts) if part.isdigit()), 1)
        entries[".".join(parts[:cut])] = None
    return ModulePlan.from_user(list(entries)) if entries else None
