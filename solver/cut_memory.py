"""Memory at a cut for the stall-free cut relaxation (:mod:`.stall_free_cuts`).

The ops before a cut fix what the simulator counts there (:func:`.simulator.memory_curve`): a
storage is live when what allocates it ran (or it is an input) and one of its readers has not (or
it is never freed), and the cut's own outputs. A lone collective's wait reads its inputs and
outputs. A collective that may share a bucket counts the least of both cases: its inputs read at
its issue, with ``min(size, bytes_in)`` held while it is in flight and nothing else reads them
(alone it holds the input, in a bucket the flat copy holds ``bytes_in``); a gather's outputs, while
in flight, at most its ``bytes_out`` (a gather bucket copies them out at its wait). So the count is
the simulator's where every collective is alone and could not share a bucket, and never more.
:func:`memory_chain` picks cuts where memory can peak: along the path that allocates most.

Why not torch's ``memory_estimator``: it follows one order; this counts for a set of ops.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

from .problem import Op, OpKind, ProblemError, ScheduleProblem

__all__ = ["Term", "bucket_partners", "bucketable", "memory_at", "memory_chain", "memory_terms"]


class Term(NamedTuple):
    """A storage's bytes at one cut: ``size`` counts when every op of ``pos`` is before the cut,
    (``neg`` is None: always) some op of ``neg`` is not, and term ``unless`` (an index into the
    same list) does not count."""

    size: int
    pos: tuple[int, ...]
    neg: tuple[int, ...] | None
    unless: int | None = None


def bucketable(problem: ScheduleProblem) -> set[int]:
    """Collectives that some bucket could hold: another independent one shares a key (any dtype)."""
    return set(bucket_partners(problem))


def bucket_partners(problem: ScheduleProblem) -> dict[int, list[int]]:
    """Per collective that some bucket could hold, the others that could share one with it: the
    same key (any dtype) and neither depends on the other."""
    cols = problem.collectives
    index = problem.index
    out: dict[int, list[int]] = {}
    for a, b in itertools.combinations(cols, 2):
        if a.collective.bucket_key(True) == b.collective.bucket_key(True) and not (  # type: ignore[union-attr]
                problem.depends_on(a.name, b.name) or problem.depends_on(b.name, a.name)):
            out.setdefault(index[a.name], []).append(index[b.name])
            out.setdefault(index[b.name], []).append(index[a.name])
    return out


def memory_terms(problem: ScheduleProblem) -> list[Term]:
    """The storages' terms (see the module doc), the same at every cut."""
    index = problem.index
    alloc = {s: index[op.name] for op in problem.ops for s in op.allocates}
    readers: dict[str, list[int]] = {}
    col_readers: dict[str, list[int]] = {}
    for i, op in enumerate(problem.ops):
        for s in op.uses:
            readers.setdefault(s, []).append(i)
            if op.kind is OpKind.COLLECTIVE:
                col_readers.setdefault(s, []).append(i)
    wait = {index[c]: index[w] for c, w in problem.wait_of.items()}
    shared = bucketable(problem)
    terms: list[Term] = []
    for st in problem.storages:
        if st.size_bytes == 0:
            continue
        a = alloc.get(st.name)
        pos = () if a is None else (a,)
        if st.never_freed:
            terms.append(Term(st.size_bytes, pos, None))
            continue
        maker = None if a is None else problem.ops[a]
        if maker is not None and maker.kind is OpKind.COLLECTIVE:
            terms.extend(_output_terms(st.size_bytes, a, wait[a], maker, readers.get(st.name, []), a in shared))
            continue
        rd = readers.get(st.name, [])
        cols = col_readers.get(st.name, [])
        lone = [c for c in cols if c not in shared]
        neg = tuple(sorted(set([r for r in rd if r not in lone] + [wait[c] for c in lone])))  # a lone one's wait reads it
        terms.append(Term(st.size_bytes, pos, neg))
        c = cols[0] if len(cols) == 1 else -1
        if c in shared and (a is None or problem.ancestors[c] >> a & 1):
            # in flight with no other reader left: alone it holds the input, in a bucket the flat
            # copy holds bytes_in: the least of the two, where the term above does not count
            held = min(st.size_bytes, problem.ops[c].collective.bytes_in)  # type: ignore[union-attr]
            terms.append(Term(held, (c,), (wait[c],), len(terms) - 1))
    return terms


def _output_terms(size: int, c: int, w: int, maker: Op, rd: list[int], shared: bool) -> list[Term]:
    """A collective output: allocated at the issue, live until its wait and its last reader; a
    gather that may share a bucket holds at most ``bytes_out`` of it until its wait."""
    after = tuple(sorted(set(r for r in rd if r != c)))
    info = maker.collective
    assert info is not None
    if shared and info.kind.bucket_copies_out:
        out = [Term(min(size, info.bytes_out), (c,), (w,))]  # in flight
        if after:
            out.append(Term(size, (w,), after))  # copied out at the wait, live until its last reader
        return out
    return [Term(size, (c,), tuple(sorted(set(after) | {w})))]


def memory_at(problem: ScheduleProblem, terms: Sequence[Term], cut: int, before: set[int]) -> int:
    """The relaxation's memory at op ``cut`` when ``before`` are the ops before it."""
    total = sum(problem.storage_by_name[s].size_bytes for s in problem.ops[cut].allocates)
    live: list[bool] = []
    for t in terms:
        on = (not (t.pos and t.pos[0] == cut)  # the cut's own outputs: counted above
              and all(p in before for p in t.pos)
              and (t.neg is None or any(n not in before for n in t.neg))
              and (t.unless is None or not live[t.unless]))
        live.append(on)
        total += t.size * on
    return total


def memory_chain(problem: ScheduleProblem, src: str, dst: str, min_bytes: int) -> list[str]:
    """Cuts along the dependency path from ``src`` to ``dst`` that allocates the most: ``src``,
    the ops on it allocating more than ``min_bytes`` (where a memory peak can be), ``dst``."""
    index = problem.index
    for name in (src, dst):
        if name not in index:
            raise ProblemError(f"cut {name!r}: no such op")
    a, b = index[src], index[dst]
    if not problem.ancestors[b] >> a & 1:
        raise ProblemError(f"cut {dst!r}: does not depend on {src!r}")
    sizes = problem.storage_by_name

    def alloc(i: int) -> int:
        return sum(sizes[s].size_bytes for s in problem.ops[i].allocates)

    between = [i for i in range(a + 1, b) if problem.descendants[a] >> i & 1 and problem.ancestors[b] >> i & 1]
    best: dict[int, tuple[int, int | None]] = {a: (0, None)}
    for i in [*between, b]:  # the problem's order is topological
        prev = [(best[index[d]][0], index[d]) for d in problem.ops[i].deps if index[d] in best]
        if prev:
            v, j = max(prev)
            best[i] = (v + (alloc(i) if alloc(i) > min_bytes else 0), j)
    path, i = [], best[b][1]
    while i is not None and i != a:
        path.append(i)
        i = best[i][1]
    keep = [problem.ops[i].name for i in reversed(path)
            if alloc(i) > min_bytes and problem.ops[i].kind not in (OpKind.COLLECTIVE, OpKind.WAIT)]
    return [src, *keep, dst]
