"""Memory that must be live when a bucket's buffers peak, and the bucket sizes a budget allows.

A bucket of two or more collectives has one moment where all of its buffers are live at once
(DESIGN.md, "Memory"; :func:`simulator.memory_curve`):

* all_gather / all_to_all: at the bucket's wait, the flat input and output buffers (from the
  issue) and the members' outputs (copied out there);
* reduce_scatter / all_reduce: at its issue, the members' inputs (the copy-in reads them), the
  flat input buffer and the members' outputs (views of the flat output).

Whatever else is live then comes on top. For a member ``j``, every op ``j`` depends on runs
before that moment and everything after ``j``'s wait runs after it, whatever the order. The
least memory over all such splits of the program is a minimum cut (a closure problem): a
storage counts when something that proves it allocated runs before the split and one of its
users after it. So a bucket holding ``j`` fits only if ``cut(j) + spike(bucket) <= budget``,
which caps the size of every bucket ``j`` can join. :func:`bucket_size_caps` computes the caps;
:mod:`.bounds` turns them into a cost per byte every schedule pays.

Why not torch's ``memory_estimator``: it follows one given order, and this needs the least
memory over every order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ortools.graph.python import max_flow

from .problem import Op, OpKind, ScheduleProblem, bit_mask

_INF = 1 << 55  # above any sum of storage sizes


def spike_bytes(problem: ScheduleProblem, op: Op, users: dict[str, list[str]] | None = None) -> int:
    """What collective ``op`` adds to its bucket's buffer peak (see the module doc).

    An input storage counts only when ``op`` (or its wait) is its one user, so the cut, which
    counts it only while a user is still to run, never counts it twice.
    """
    info = op.collective
    assert info is not None
    sizes = problem.storage_by_name
    out = info.bytes_in + sum(sizes[s].size_bytes for s in op.allocates)
    if info.kind.bucket_copies_out:
        return out + info.bytes_out
    own = {op.name, problem.wait_of.get(op.name)}
    users = storage_users(problem) if users is None else users
    return out + sum(
        sizes[s].size_bytes for s in op.uses
        if not sizes[s].never_freed and set(users.get(s, ())) <= own
    )


def storage_users(problem: ScheduleProblem) -> dict[str, list[str]]:
    """Storage name -> the ops that read it."""
    out: dict[str, list[str]] = {}
    for op in problem.ops:
        for s in op.uses:
            out.setdefault(s, []).append(op.name)
    return out


class CutGraph:
    """The closure-problem network of one problem, built once; :meth:`live_bytes` solves one cut.

    Nodes: ops, a source (runs before the split), a sink (after it), and two nodes per storage
    joined by an arc of the storage's size. An op on the source side pulls its dependencies
    there; a storage's arc is cut when one of its witnesses runs before the split (its
    allocator, or for a collective's output a consumer or the wait, which come after the
    output exists) and one of its users after it.
    """

    def __init__(self, problem: ScheduleProblem, collective_outputs: bool = True):
        """``collective_outputs``: False leaves collectives' outputs out of every cut
        (:func:`memory_heads` counts them itself)."""
        n = len(problem.ops)
        self.source, self.sink = n, n + 1
        index = problem.index
        tails: list[int] = []
        heads: list[int] = []
        caps: list[int] = []

        def arc(a: int, b: int, c: int) -> None:
            tails.append(a)
            heads.append(b)
            caps.append(c)

        for op in problem.ops:
            for d in op.deps:
                arc(index[op.name], index[d], _INF)
        allocator: dict[str, Op] = {s: op for op in problem.ops for s in op.allocates}
        self.readers = readers = storage_users(problem)
        node = n + 2
        for st in problem.storages:
            users = [index[u] for u in readers.get(st.name, ())]
            maker = allocator.get(st.name)
            if maker is not None and maker.kind is OpKind.COLLECTIVE:
                users = [u for u in users if u != index[maker.name]]
                witnesses = users if collective_outputs else []  # the output exists once a consumer or the wait has run
            elif st.is_input or maker is None:
                witnesses = [self.source]
            else:
                witnesses = [index[maker.name]]
            if st.size_bytes == 0 or not witnesses or (not users and not st.never_freed):
                continue
            into, out = node, node + 1
            node += 2
            for w in witnesses:
                arc(w, into, _INF)
            arc(into, out, st.size_bytes)
            if st.never_freed:
                arc(out, self.sink, _INF)
            for u in users:
                arc(out, u, _INF)
        self.tails = np.array(tails, dtype=np.int64)
        self.heads = np.array(heads, dtype=np.int64)
        self.caps = np.array(caps, dtype=np.int64)

    @property
    def n_arcs(self) -> int:
        return len(self.caps)

    def least_priced(self, weights: np.ndarray, sizes: np.ndarray, mem_scale: int, per_ns: int, m_num: int) -> int:
        """``min over closed E of mem_scale * live(E) + per_ns * weights(E) - m_num * sizes(E)``, ``E``
        a set of ops closed under dependencies (those run so far) and ``live(E)`` the memory live
        after them (as :meth:`live_bytes`), exact; per-op ``weights`` and ``sizes``. The caller
        keeps ``mem_scale * storage bytes + per_ns * weights.sum() + m_num * sizes.sum()`` below
        ``2**55`` (:attr:`storage_bytes`)."""
        src, snk = self.source, self.sink
        ops = np.arange(len(weights))
        heavy, sized = weights > 0, sizes > 0
        flow = max_flow.SimpleMaxFlow()
        flow.add_arcs_with_capacity(
            np.concatenate([self.tails, ops[heavy], np.full(int(sized.sum()), src)]),
            np.concatenate([self.heads, np.full(int(heavy.sum()), snk), ops[sized]]),
            np.concatenate([np.where(self.caps >= _INF, _INF, self.caps * mem_scale), per_ns * weights[heavy],
                            m_num * sizes[sized]]))
        if flow.solve(src, snk) != flow.OPTIMAL:  # pragma: no cover - integral capacities always solve
            raise RuntimeError("min cut: max-flow failed")
        return int(flow.optimal_flow()) - m_num * int(sizes.sum())

    @property
    def storage_bytes(self) -> int:
        """The sum of the finite (storage) capacities."""
        return int(self.caps[self.caps < _INF].sum())

    def live_bytes(self, before: np.ndarray, after: np.ndarray) -> int:
        """Least memory live across any split with the ops ``before`` on one side and ``after``
        on the other (ops given as index arrays)."""
        flow = max_flow.SimpleMaxFlow()
        tails = np.concatenate([self.tails, np.full(len(before), self.source), after])
        heads = np.concatenate([self.heads, before, np.full(len(after), self.sink)])
        caps = np.concatenate([self.caps, np.full(len(before) + len(after), _INF)])
        flow.add_arcs_with_capacity(tails, heads, caps)
        status = flow.solve(self.source, self.sink)
        if status != flow.OPTIMAL:  # pragma: no cover - integral capacities always solve
            raise RuntimeError(f"min cut: max-flow status {status}")
        return int(flow.optimal_flow())


def bucket_size_caps(problem: ScheduleProblem, budget_bytes: int, *, max_arc_work: int = 4_000_000,
                     graph: CutGraph | None = None) -> dict[str, float]:
    """Per collective: the largest summed ``size_bytes`` of a bucket of two or more that holds it
    and fits ``budget_bytes`` (see the module doc); 0 when no such bucket fits.

    The spike of a bucket is at least ``r * size`` with ``r`` the least spike-to-size ratio of
    its bucket key. Each cut is one max-flow; collectives are cut, evenly spread in program
    order, while ``cuts * arcs <= max_arc_work`` (a fixed amount of work, so the result does not
    depend on the machine); the others get no cap (``inf``). ``graph``: the problem's cut graph,
    when the caller has built it.
    """
    cols = problem.collectives
    if not cols:
        return {}
    graph = CutGraph(problem) if graph is None else graph
    ratio: dict[tuple, float] = {}
    for c in cols:
        key = c.collective.bucket_key()  # type: ignore[union-attr]
        size = c.collective.size_bytes  # type: ignore[union-attr]
        if size > 0:
            ratio[key] = min(ratio.get(key, np.inf), spike_bytes(problem, c, graph.readers) / size)
    n_cuts = min(len(cols), max_arc_work // max(graph.n_arcs, 1))
    chosen = set(np.linspace(0, len(cols) - 1, n_cuts).round().astype(int).tolist()) if n_cuts else set()
    n = len(problem.ops)
    index = problem.index
    caps: dict[str, float] = {}
    for k, c in enumerate(cols):
        r = ratio.get(c.collective.bucket_key(), 0.0)  # type: ignore[union-attr]
        if k not in chosen or r <= 0:
            caps[c.name] = float("inf")
            continue
        i, w = index[c.name], index[problem.wait_of[c.name]]
        before = np.append(np.flatnonzero(bit_mask(problem.ancestors[i], n)), i)
        after = np.append(np.flatnonzero(bit_mask(problem.descendants[w], n)), w)
        live = graph.live_bytes(before, after)
        caps[c.name] = max(0.0, (budget_bytes - live) / r)
    return caps


MEMORY_HEAD_PEAKS = 8  # ops where the original order's memory is highest, tried as splits (memory_heads)


def memory_heads(problem: ScheduleProblem, budget_bytes: int, weights: np.ndarray, dep_heads: dict[str, int],
                 peaks: Sequence[int]) -> dict[str, int]:
    """Per collective: compute that runs before its issue in every schedule within ``budget_bytes``,
    when that is more than ``dep_heads`` gives (its ancestors' compute; none listed otherwise).
    ``weights``: per op, its compute-stream time; ``peaks``: op indices to try as splits (the ops
    where the original order's memory is highest: the loss gradient's temporaries at the start of
    a backward).

    A collective's outputs are live from its issue (a bucket's flat buffers hold as many bytes until
    its wait; a gather bucket's, its members' output bytes) until their last reader. Take an op
    ``x``. The ops run before it form a closed set holding its ancestors and none of ``x`` and its
    descendants, so what is live at ``x``, collective outputs left out, is at least the least cut
    over such splits (one cut, in a graph without collective outputs), plus ``x``'s own outputs.
    A collective ``c`` that ``x`` does not depend on (nor ``c`` on ``x``), one of whose readers
    depends on ``x``, and that is issued before ``x``, adds its outputs there. When that exceeds
    the budget, ``c`` is issued after ``x``: after the compute of ``x`` and its ancestors. The
    splits are tried by that compute, largest first; each collective keeps the first proven.

    On the 4-node FSDP backward the loss gradient's temporaries peak at the budget (the original
    order's peak) after 0.47 ms of compute: 57 of the 74 gathers (all but the 8 KB norm weights)
    are issued after them."""
    n = len(problem.ops)
    graph = CutGraph(problem, collective_outputs=False)
    sizes = problem.storage_by_name
    index = problem.index
    readers = graph.readers
    splits = []
    for x in peaks:
        anc = np.flatnonzero(bit_mask(problem.ancestors[x], n))
        after = np.append(np.flatnonzero(bit_mask(problem.descendants[x], n)), x)
        own = sum(sizes[s].size_bytes for s in problem.ops[x].allocates)
        splits.append((int(weights[anc].sum() + weights[x]), x, graph.live_bytes(anc, after) + own))
    splits.sort(key=lambda t: -t[0])
    heads: dict[str, int] = {}
    for c in problem.collectives:
        i = index[c.name]
        info = c.collective
        assert info is not None
        out = sum(sizes[s].size_bytes for s in c.allocates)
        if info.kind.bucket_copies_out:
            out = min(out, info.bytes_out)
        users = [index[u] for s in c.allocates for u in readers.get(s, ()) if u != i]
        for h_x, x, live in splits:
            if h_x <= dep_heads[c.name]:
                break
            related = (problem.descendants[i] | problem.ancestors[i]) >> x & 1
            needed = any(u == x or problem.ancestors[u] >> x & 1 for u in users)  # a reader runs after x
            if not related and needed and live + out > budget_bytes:
                heads[c.name] = h_x
                break
    return heads
