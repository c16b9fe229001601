"""``assemble`` as it was written first: every dependency inside a slot an explicit edge (a
bucket's wait after each of its members: ``k**2`` edges for a bucket of ``k``), the keys lowered
edge by edge and the slot ordered by :func:`fxsched.solver.problem.topological_order`. The oracle
that heuristics/placement.py's grouped form is checked against (test_placement_assemble.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fxsched.heuristics.placement import Placement
from fxsched.solver.problem import OpKind, topological_order
from fxsched.solver.schedule import Schedule


def reference_assemble(placement: Placement, issue: Mapping[str, int], wait: Mapping[str, int],
                       buckets: Sequence[Sequence[str]] = (), multi_dtype: bool = False,
                       priority: Mapping[str, int] | None = None,
                       issue_after: Mapping[str, Sequence[str]] | None = None) -> Schedule:
    p = placement.problem
    prio = priority or {}
    issue, wait = dict(issue), dict(wait)
    placement.reconcile(issue, wait, buckets)
    at: list[list[str]] = [[] for _ in range(placement.n_slots)]
    for c, unit in placement.units.items():
        s, w = issue[c], wait[c]
        if not unit.earliest <= s <= w <= unit.need:
            raise ValueError(f"collective {c!r}: slots issue {s}, wait {w} outside [{unit.earliest}, {unit.need}]")
        at[s].append(c)
        at[w].append(p.wait_of[c])
    before: dict[str, set[str]] = {n: set(d) for n, d in placement.block_deps.items()}
    for b in buckets:
        for m in b:
            before[p.wait_of[m]].update(b)

    def own_key(n: str) -> tuple[bool, int, int]:
        return (p.op_by_name[n].kind is OpKind.WAIT, prio.get(p.op_by_name[n].waits_on or n, 0), p.index[n])

    def local_topo(items: list[str], deps: Mapping[str, set[str]], key) -> list[str]:  # noqa: ANN001
        present = set(items)
        return topological_order(items, {n: [d for d in deps.get(n, ()) if d in present] for n in items}, key)

    order: list[str] = []
    for k, items in enumerate(at):
        if len(items) == 1:
            n = items[0]
            order.extend((*placement.units[n].chain, n) if n in placement.units else (n,))
        elif items:
            key = {n: own_key(n) for n in items}
            changed = True
            while changed:
                changed = False
                for n in items:
                    for d in before.get(n, ()):
                        if d in key and key[n] < key[d]:
                            key[d], changed = key[n], True
            soft = {n: set(issue_after.get(n, ())) for n in items} if issue_after else {}
            try:
                ordered = local_topo(items, {n: before.get(n, set()) | soft.get(n, set()) for n in items},
                                     key.__getitem__)
            except ValueError:
                ordered = local_topo(items, before, key.__getitem__)
            for n in ordered:
                order.extend((*placement.units[n].chain, n) if n in placement.units else (n,))
        if k < len(placement.backbone):
            order.append(placement.backbone[k])
    return Schedule(order=tuple(order), buckets=tuple(tuple(b) for b in buckets), multi_dtype=multi_dtype)
