"""A makespan bound from one group's stream: gradients released as compute runs, gathers before.

Entry point: :func:`stream_release_bound`, one term of :func:`.bounds.makespan_lower_bound`. The
FIFO term there runs a set of collectives back to back after their least head, at the cheapest
price a bucket can reach. On a communication-bound backward that is far too kind: the
reduce-scatters are released one layer at a time as the weight gradients are computed, so the
stream can only bucket what has been released; large (cheap) buckets wait for late releases,
and small ones pay the latency. This term prices that trade-off exactly, in a relaxation.

**Relaxation** (one group, one kind ``K`` of its collectives as the *released* set ``R``, every
other kind as the set ``A``). Every collective of the group starts after the least head ``h`` of
the group and ends at least ``t`` (the least tail) before the end. Drop every other constraint
on ``A``; keep on ``R`` only that a bucket cannot start before the compute it and every ``R``
collective issued before it depend on has run (it is issued after them, and FIFO order is issue
order). With the ``R`` collectives in stream order, the bucket that ends at the ``x``-th byte
therefore starts no earlier than ``V(x)``, the least compute of an ancestor-closed set of ops
holding at least ``x`` bytes of ``R``.

* ``A`` first: in the relaxed problem an ``A`` bucket right after an ``R`` bucket can swap ahead of
  it (it has no release past ``h``, and the ``R`` bucket then ends when the ``A`` one did), so all
  of ``A`` runs first, taking at least ``comm(A)``: per kind, the FIFO term's price of the set,
  or its least time in buckets within the budget's caps (:func:`_capped_comm`), the larger.
* When ``A`` is one kind that compute needs (gathers before a forward or backward), its buckets
  also have deadlines: the one whose first byte is ``y`` must end before compute passes what
  needs none of ``A``'s bytes from ``y`` on, plus the compute stream's stall ``D``. Small early
  buckets then take longer than ``comm(A)``, or the stall delays every release of ``R`` by ``D``
  and the makespan is at least the compute plus ``D``: the least over ``D`` is the term
  (:func:`_stalled_term`). Taken in order of their own deadlines, ``A``'s bytes also come in
  buckets no larger than the memory budget lets a bucket holding them be
  (:func:`_member_limits`).
* ``R`` then runs from ``h + comm(A)`` in buckets over consecutive bytes of the stream order, a
  bucket of ``s`` bytes taking at least ``cost(s)``: one bucket's share of the kind's cost curve
  minorant, and at least the least per-byte memory price of ``R`` (both from
  :mod:`.bounds`). A bucket of more bytes than the kind's largest collective holds two or more,
  so it first copies its inputs in on the compute stream, after the compute that releases it:
  it starts at least that copy after its release (:func:`_copy_lead`; in the time-reversed
  bound, the copy-out of a kind that copies out); within a memory budget, a bucket of two or
  more reduce-scatters also waits for the compute that frees memory for its buffers
  (:func:`_memory_late`). A dynamic program over a byte grid gives the
  least end time (grid rounding only shrinks buckets and lowers releases: still a bound), and
  the makespan is at least that plus ``t``.

``V`` is bounded below by Lagrangian duality: for any ``mu >= 0``,
``V(x) >= min over closed D of (compute(D) - mu * bytes_R(D)) + mu * x``, one minimum cut per
``mu`` (a maximum-weight closure), solved in exact integers. The multipliers are ``MU_STEPS``
spread over the range, then between each two neighbouring closed sets found, the slope of the line
through their (bytes, compute) points, as long as that finds a set below the line (the lower
convex hull of the points, found edge by edge). That is the convex minorant of
``V``, loose where ``V`` is a staircase that climbs slowly and then fast (a layer's bytes come
with its compute; the loss's compute comes first). So ``V`` is also bounded by the collectives'
own closures (:meth:`_Closure.ordered_curve`). The mirror image (time reversed:
``R`` needed by compute, ``A`` last, descendants for ancestors) is a bound too, for gathers in a
backward pass or a forward one. The larger of all is the term.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np
from ortools.graph.python import max_flow

from .memory_cuts import CutGraph, spike_bytes
from .problem import Op, ScheduleProblem, bit_mask

GRID_MIN, GRID_MAX = 512, 4096  # byte cells of the dynamic program (see _grid)
MU_STEPS = 32  # Lagrange multipliers tried per curve (module doc)
MU_SPREAD = 100.0  # the least multiplier: the graph's compute per byte over this
HULL_PROBES = 256  # most multipliers tried beyond MU_STEPS while refining the convex hull (_release_curve)
HULL_TOLERANCE_NS = 1.0  # a closed set this far below a hull edge is a new vertex
STALL_STEPS = 8  # intervals of the compute stall tried when the first-run set is needed (_stalled_term)
STALL_BISECTIONS = 12  # halvings that find the least stall meeting the first-run set's deadlines
STALL_SPLITS = 4  # halvings of the stall interval that decides the term, after the first STALL_STEPS
MEM_RATES = 9  # compute prices of a byte of memory tried per released kind (_memory_late)
MEM_SHARES = 8  # memory prices of a released byte tried per compute price (the first: none)
MEM_CELLS = 16  # grid cells per cell of the memory release table (_memory_late)
MEM_ARC_WORK = 1_000_000  # cut arcs times price pairs per table: a fixed amount of work (_memory_late)
_CAP_TOTAL = 1 << 60  # every finite capacity of a cut sums below this (int64-safe), _BIG above it
_BIG = 1 << 62


class _Closure:
    """The dependency arcs of a problem, for maximum-weight closures (built once per problem)."""

    def __init__(self, problem: ScheduleProblem, reverse: bool):
        index = problem.index
        tails, heads = [], []
        for op in problem.ops:
            for d in op.deps:
                a, b = index[op.name], index[d]
                tails.append(b if reverse else a)  # an op on the closed side pulls its deps (users) in
                heads.append(a if reverse else b)
        self.n = len(problem.ops)
        self.tails = np.array(tails, dtype=np.int64)
        self.heads = np.array(heads, dtype=np.int64)
        self._closures = problem.descendants if reverse else problem.ancestors
        self._own: dict[int, float] = {}  # per op: its own closure's compute, for _own_weights
        self._own_weights: np.ndarray | None = None

    def ordered_curve(self, weights: np.ndarray, sizes: np.ndarray, xs: np.ndarray) -> np.ndarray:
        """Per byte count in ``xs``: a lower bound on the least compute of a closed set holding that
        many bytes of ``sizes``, from each sized op's own closure (it and its dependencies).

        A closed set holding ``x`` bytes holds sized ops of ``x`` bytes or more, and the closure of
        each, so its compute is at least the largest of their own closures' compute. With the
        sized ops in increasing order of that compute, the set's last one in that order comes no
        earlier than the op at which the running bytes first reach ``x``: its own closure's
        compute is the bound. Exact when the closures nest (one layer after another), where the
        Lagrangian minorant is not (:func:`_release_curve`)."""
        idx = np.flatnonzero(sizes > 0)
        out = np.zeros(len(xs))
        if len(idx) == 0:
            return out
        own = np.array([self.own_compute(weights, int(i)) for i in idx])
        order = np.argsort(own, kind="stable")
        reach = np.cumsum(sizes[idx][order].astype(float))  # bytes held once the first j ops are
        j = np.minimum(np.searchsorted(reach, xs, side="left"), len(idx) - 1)
        return np.where(xs > 0, own[order][j], 0.0)

    def own_compute(self, weights: np.ndarray, i: int) -> float:
        """The compute of op ``i``'s own closure: it and its dependencies (users, reversed), cached
        per ``weights`` array (the callers pass one per problem)."""
        if self._own_weights is not weights:
            self._own, self._own_weights = {}, weights
        if i not in self._own:
            self._own[i] = float(weights[bit_mask(self._closures[i], self.n)].sum() + weights[i])
        return self._own[i]

    def least(self, weights: np.ndarray, sizes: np.ndarray, m: int, scale: int) -> tuple[int, np.ndarray]:
        """``min over closed D of scale * weights(D) - m * sizes(D)`` (exact; the caller keeps
        ``scale * weights.sum() + m * sizes.sum()`` below ``_CAP_TOTAL``), and a closed set ``D``
        that reaches it (a mask over the ops)."""
        profit = m * sizes - scale * weights
        pos, neg = np.flatnonzero(profit > 0), np.flatnonzero(profit < 0)
        src, snk = self.n, self.n + 1
        flow = max_flow.SimpleMaxFlow()
        flow.add_arcs_with_capacity(
            np.concatenate([self.tails, np.full(len(pos), src), neg]),
            np.concatenate([self.heads, pos, np.full(len(neg), snk)]),
            np.concatenate([np.full(len(self.tails), _BIG), profit[pos], -profit[neg]]))
        if flow.solve(src, snk) != flow.OPTIMAL:  # pragma: no cover - integral capacities always solve
            raise RuntimeError("stream bound: max-flow failed")
        side = np.asarray(flow.get_source_side_min_cut(), dtype=np.int64)
        held = np.zeros(self.n, dtype=bool)
        held[side[side < self.n]] = True  # an op on the source side pulls its deps (users) there too
        return -(int(profit[pos].sum()) - int(flow.optimal_flow())), held


def _release_curve(closure: _Closure, weights: np.ndarray, sizes: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Per byte count in ``xs``: a lower bound on the least compute of a closed set holding that
    many bytes of ``sizes``: the larger of the Lagrangian dual (module doc) and the sized ops' own
    closures (:meth:`_Closure.ordered_curve`). On the 4-node FSDP forward the latter raises the
    bound from 65.78 to 66.70 ms. Refining the hull (module doc) takes 12 more cuts on the 4-node
    backward (268 in all, from 256) and raises its bound from 152,450.1 to 152,569.6 us (1,024
    spread multipliers give the same; 64 give 152,281.0: between spread points the lines miss
    the hull's vertices)."""
    total, compute = int(sizes.sum()), int(weights.sum())
    if total <= 0 or compute <= 0:
        return np.zeros(len(xs))
    out = closure.ordered_curve(weights, sizes, xs)

    def probe(mu: float) -> tuple[int, int] | None:
        """Raise ``out`` by the Lagrangian line at ``mu``; the (bytes, compute) of its closed set."""
        nonlocal out
        # mu = m / scale ns per byte, m an integer, so the cut is exact in int64: scale is a power
        # of two that keeps the capacities' sum (scale * (compute + mu * total)) below _CAP_TOTAL
        scale = 1 << max(0, min(30, int(np.log2(_CAP_TOTAL / (compute + mu * total)))))
        m = int(mu * scale)
        if m <= 0:
            return None
        val, held = closure.least(weights, sizes, m, scale)
        out = np.maximum(out, np.floor((val + m * xs) / scale))
        return int(sizes[held].sum()), int(weights[held].sum())

    # multipliers from well below the graph's compute per byte up to the steepest the curve can be
    # (all compute for the smallest collective's bytes), then the lower convex hull of the closed
    # sets' (bytes, compute) points between each two neighbouring ones found (the module doc)
    smallest = int(sizes[sizes > 0].min())
    points = {pt for mu in np.geomspace(compute / total / MU_SPREAD, compute / smallest, MU_STEPS)
              if (pt := probe(mu)) is not None}
    found = sorted(points)
    edges = list(zip(found, found[1:]))
    probes = 0
    while edges and probes < HULL_PROBES:
        (b1, c1), (b2, c2) = edges.pop()
        if b2 <= b1 or c2 <= c1:
            continue
        mu = (c2 - c1) / (b2 - b1)
        probes += 1
        pt = probe(mu)
        # a closed set strictly below the line through the two: a new hull vertex between them
        if pt is not None and pt[1] - c1 - mu * (pt[0] - b1) < -HULL_TOLERANCE_NS and b1 < pt[0] < b2:
            edges += [((b1, c1), pt), (pt, (b2, c2))]
    return out


def _grid(empty_ns: float, all_ns: float) -> int:
    """Cells for the dynamic program. A bucket there is charged only for the cells it covers
    whole, so a run of buckets each crossing one cell boundary pays ``empty_ns`` (a bucket's
    least cost) per cell: with cells enough that a run across all of them costs four times one
    bucket of everything, that loophole never pays, and each bucket loses at most two cells."""
    if empty_ns <= 0:
        return GRID_MAX
    return int(min(GRID_MAX, max(GRID_MIN, np.ceil(4 * all_ns / empty_ns))))


def _cells(total: float, cost: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The byte grid over ``total`` bytes (:func:`_grid` cells) and, per number of cells covered,
    the least cost of a bucket covering them."""
    ends = cost(np.array([0.0, total]))
    xs = np.linspace(0.0, total, _grid(float(ends[0]), float(ends[1])) + 1)
    return xs, cost(xs)


def _least_cover_cost(cell_cost: np.ndarray) -> np.ndarray:
    """Per number of cells: the least cost of a bucket covering at least that many (the cell
    costs made non-decreasing from above, so each stays a lower bound)."""
    return np.minimum.accumulate(cell_cost[::-1])[::-1]


def _least_end(start: float, releases: np.ndarray, cell_cost: np.ndarray, lead: np.ndarray | None = None,
               late: Callable[[int], np.ndarray] | None = None) -> float:
    """Least end of running every byte after ``start`` in buckets over consecutive bytes, on a
    grid of equal cells: ``f[b]`` bounds the end of any bucket sequence whose last byte lies in
    cell ``b`` (``[x_b, x_{b+1})``; ``b = K`` is the last byte). A bucket from cell ``i`` to cell
    ``b`` starts after ``releases[b]`` (releases grow with bytes) plus ``lead[c]`` (None: 0), and
    covers at least the ``c = b - i - 1`` cells strictly between, so it takes at least
    ``cell_cost[max(0, c)]``. ``late(i)`` (None: none), per ``b`` from ``i + 1``, may raise
    the release of the bucket from cell ``i`` to cell ``b`` (the memory its issue needs,
    :func:`_memory_late`). Each state relaxes every later one at once (one vector operation per
    state); a state that ends no earlier than the last state's best so far is skipped (no bucket
    ends before it starts, so nothing through it can end the last state earlier)."""
    k = len(releases) - 1
    cost = _least_cover_cost(cell_cost)
    ready = np.zeros(k) if lead is None else lead
    f = np.full(k + 1, np.inf)
    f[0] = start
    for i in range(k):
        if f[i] >= f[k]:
            continue
        rel = releases[i + 1:] if late is None else np.maximum(releases[i + 1:], late(i))
        np.minimum(f[i + 1:], np.maximum(f[i], rel + ready[:k - i]) + cost[:k - i], out=f[i + 1:])
    return float(f[k])


def _memory_late(problem: ScheduleProblem, graph: CutGraph, budget_bytes: int, weights: np.ndarray,
                 sizes: np.ndarray, members: Sequence[Op], xs: np.ndarray) -> Callable[[int], np.ndarray] | None:
    """For :func:`_least_end` over the grid ``xs`` of ``members``' bytes (one kind whose buckets peak
    at their issue: reduce_scatter, all_reduce; ``sizes`` per op): per bucket, the least compute
    before its issue that frees the memory the bucket needs within ``budget_bytes``; None when
    the kind peaks at its wait or no bucket of two or more is on the grid.

    At the issue of a bucket of ``s`` bytes ending at byte ``x`` (in stream order), the ops run
    so far form a closed set ``E`` holding at least ``x`` bytes of the kind, with compute at most
    the issue's time, and the memory live then, at least ``live(E)`` (:mod:`.memory_cuts`' cut)
    plus the bucket's buffers (at least ``ratio * s``, ``ratio`` the kind's least
    :func:`.memory_cuts.spike_bytes` per byte; a bucket of one has no flat buffers, so only a
    bucket holding more than the largest member counts), fits the budget. For any prices
    ``p, m >= 0`` of compute and released bytes per byte of memory, every such ``E`` has
    ``p * compute(E) >= G - (budget - ratio * s) + m * x`` with ``G`` the least of
    ``live + p * compute - m * bytes`` over closed sets (one cut: :meth:`CutGraph.least_priced`).
    The table takes the largest such plane over a grid of prices (``p`` around the budget over
    the compute, ``m`` around the budget over the kind's bytes; spread evenly over the grid when
    :data:`MEM_ARC_WORK` allows fewer cuts), at the grid's points below each bucket (``x`` and
    ``s`` rounded down to :data:`MEM_CELLS` cells), so it stays a bound.

    On the 4-node FSDP backward this raises the bound by 0.37 ms (150.34 to 150.71 ms): most of
    the activations are freed by the time a large bucket of gradients is released."""
    if not members or members[0].collective.kind.bucket_copies_out:  # type: ignore[union-attr]
        return None
    k = len(xs) - 1
    cell = xs[-1] / k
    largest = max(c.collective.size_bytes for c in members)  # type: ignore[union-attr]
    ratio = min((spike_bytes(problem, c, graph.readers) / c.collective.size_bytes  # type: ignore[union-attr]
                 for c in members if c.collective.size_bytes > 0), default=0.0)  # type: ignore[union-attr]
    compute, total = float(weights.sum()), float(sizes.sum())
    if k < 2 or ratio <= 0 or compute <= 0 or total <= largest:
        return None
    prices = [(rate, share) for rate in (budget_bytes / compute) * np.geomspace(1 / 16, 16, MEM_RATES)
              for share in np.append(0.0, (budget_bytes / total) * np.geomspace(1 / 8, 8, MEM_SHARES - 1))]
    n_cuts = min(len(prices), MEM_ARC_WORK // max(graph.n_arcs, 1))
    if n_cuts < 2:
        return None
    q = MEM_CELLS
    bx = xs[np.minimum(np.arange(0, k + q, q), k)]  # the table's end bytes (rows) ...
    bs = np.arange(0, k + q, q) * cell  # ... and covered bytes (columns)
    table = np.full((len(bx), len(bs)), -np.inf)
    multi = bs > largest
    for j in np.linspace(0, len(prices) - 1, n_cuts).round().astype(int):
        rate, share = prices[j]
        # integer prices: memory at scale, compute at rate * scale, bytes at share * scale, the
        # capacities' sum below 2**50 (exact in floats too)
        scale = 1 << max(0, min(20, int(np.log2(2.0 ** 50 / (graph.storage_bytes + rate * compute + share * total)))))
        per_ns, m_num = int(rate * scale), int(share * scale)
        if per_ns <= 0:
            continue
        g = graph.least_priced(weights, sizes, scale, per_ns, m_num)
        plane = (g - scale * budget_bytes + scale * ratio * bs[None, :] + m_num * bx[:, None]) / per_ns
        table = np.maximum(table, np.where(multi[None, :], np.floor(plane) - 1, -np.inf))  # -1: float rounding

    rows, cols = np.arange(k + 1) // q, np.arange(k) // q  # per end cell / per cells covered

    def late(i: int) -> np.ndarray:
        return table[rows[i + 1:], cols[:k - i]]
    return late


def _copy_lead(problem: ScheduleProblem, members: Sequence[Op], xs: np.ndarray, copy_out: bool) -> np.ndarray:
    """Per number ``c`` of whole cells of the grid ``xs`` a bucket of ``members`` (one kind) covers:
    the least compute-stream copy between its release and its start (:func:`_least_end`'s
    ``lead``). A bucket holding more bytes than the largest member has two or more members, so
    it copies its inputs in at its issue, after the compute that releases them (DESIGN.md); in
    the time-reversed problem (``copy_out``: needed by compute) it copies its outputs out at its
    wait, before the compute that needs them, where the kind copies out (else 0). The copy moves
    at least the least in (out) share of the bucket's bytes over its members."""
    k = len(xs) - 1
    out = np.zeros(k)
    infos = [c.collective for c in members]
    sizes = [i.size_bytes for i in infos]  # type: ignore[union-attr]
    if k == 0 or not infos or (copy_out and not infos[0].kind.bucket_copies_out) or max(sizes) <= 0:  # type: ignore[union-attr]
        return out
    share = min((i.bytes_out if copy_out else i.bytes_in) / s for i, s in zip(infos, sizes) if s > 0)  # type: ignore[union-attr]
    covered = np.arange(k) * (xs[-1] / k)  # the least bytes of a bucket covering c whole cells
    multi = covered > max(sizes)
    costs = problem.bucket_costs
    out[multi] = [costs.copy_ns(int(b)) for b in np.floor(covered[multi] * share)]
    return out


def _deadline_end(start: float, deadlines: np.ndarray, cell_cost: np.ndarray, most: np.ndarray | None = None) -> float:
    """Least end of running every byte from ``start`` in buckets over consecutive bytes when the
    bucket after a last byte in cell ``i`` (state 0: nothing run yet) must end by
    ``deadlines[i]`` (inf when no order meets them) and cover at most ``most[i]`` whole cells
    (None: any): :func:`_least_end`'s grid, with deadlines in place of releases. From a state,
    the buckets that meet its deadline and its size limit cover a prefix of the cell counts
    (their cost does not fall as they grow). A state that ends no earlier than the last state's
    best so far relaxes nothing that could end the last one earlier: it only marks how far the
    states reach."""
    k = len(deadlines) - 1
    cost = _least_cover_cost(cell_cost)
    f = np.full(k + 1, np.inf)
    f[0] = start
    reach = 0  # the farthest state any state so far reaches
    for i in range(k):
        if i > reach:  # nothing reaches this state or any later one
            return float("inf")
        if not np.isfinite(f[i]):
            continue
        hi = min(k, i + int(np.searchsorted(cost, deadlines[i] - f[i], side="right")))
        if most is not None:
            hi = min(hi, i + 1 + int(most[i]))
        reach = max(reach, hi)
        if f[i] < f[k]:
            np.minimum(f[i + 1:hi + 1], f[i] + cost[:hi - i], out=f[i + 1:hi + 1])
    return float(f[k])


def _needs(closure: _Closure, weights: np.ndarray, sizes: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Per state of the grid ``xs`` over the bytes of ``sizes`` (state 0: nothing run, state ``i``:
    the last byte run lies in cell ``i``, so the next bucket's first byte is at most
    ``xs[i + 1]``): at least the most compute that needs none of the bytes from that first byte
    on, the graph's compute less the least compute holding them (``closure``: the users' side)."""
    total = float(sizes.sum())
    return float(weights.sum()) - _release_curve(closure, weights, sizes, total - _first_bytes(xs, total))


def _first_bytes(xs: np.ndarray, total: float) -> np.ndarray:
    """Per state of the grid ``xs`` (as :func:`_needs`): a bound on the first byte of the bucket
    from it (state 0: byte 0; state ``i``: ``xs[i + 1]``; the last state: ``total``)."""
    return np.append(np.append(0.0, xs[2:]), total)


def _member_limits(problem: ScheduleProblem, weights: np.ndarray, members: Sequence[Op], caps: dict[str, float],
                   xs: np.ndarray, closure: _Closure) -> tuple[np.ndarray, np.ndarray]:
    """For :func:`_deadline_end` over the grid ``xs`` of ``members``' bytes (one kind, needed by
    compute; ``closure``: the users' side, as :func:`_needs`), per state as :func:`_needs`: the most
    compute before the bucket from it must end, and the most whole cells it may cover.

    A bucket holding ``c`` ends before compute passes ``d(c)``, the compute that does not need
    ``c`` (plus the stall), and holds at most ``cap(c)`` bytes when it holds two collectives or
    more (:func:`.memory_cuts.bucket_size_caps`; one may be as large as itself). Take the bytes in
    order of ``d``, ties by cap, and the caps as their running largest (larger caps only relax):
    both grow along the bytes, so each bucket can take any byte from some point on. Any
    schedule's buckets then take the bytes in one run each, in order of those points (the
    earliest bytes to the bucket with the earliest point: an exchange keeps every bucket
    within its limits), and in stream order too: two buckets out of that order swap places on
    the stream, the one that moves up ends earlier and the other ends where its pair did, no
    later than the deadline of its own, later, bytes. So the bucket from a state ends by ``d`` of
    its first byte (at most the state's bound on it, as :func:`_needs`) and holds at most the cap
    there: what :func:`_needs` gives, with the caps. On the 4-node FSDP backward within the
    original peak this raises the bound from 151.91 to 152.45 ms: the gathers the backward needs
    first must come in buckets of at most 1.3-1.8 GiB."""
    compute = float(weights.sum())
    dl = np.array([compute - closure.own_compute(weights, problem.index[c.name]) for c in members])
    cap = np.array([caps.get(c.name, np.inf) for c in members])
    order = np.lexsort((cap, dl))
    sizes = np.array([c.collective.size_bytes for c in members], dtype=float)[order]  # type: ignore[union-attr]
    ends = np.cumsum(sizes)
    total, k = float(ends[-1]), len(xs) - 1
    owner = np.minimum(np.searchsorted(ends, _first_bytes(xs, total), side="right"), len(order) - 1)
    allowed = np.maximum(np.maximum.accumulate(cap[order])[owner], sizes.max())
    return dl[order][owner], np.minimum(np.floor(allowed / (total / k) + 1e-9), k)


def _stalled_term(weights: np.ndarray, start: float, base: float, last: float, needs: np.ndarray,
                  a_cost: np.ndarray, releases: np.ndarray, r_cost: np.ndarray, floor: float,
                  r_lead: np.ndarray | None = None, r_late: Callable[[int], np.ndarray] | None = None,
                  a_most: np.ndarray | None = None) -> float:
    """The stream term when the first-run set ``A`` (one kind) is needed by compute: a makespan
    bound at least ``least_end(base, releases, r_cost, r_lead, r_late) + last`` (the term without it, which the caller
    has; ``base``: the least end of ``A``), or 0 when it adds nothing to that or is sure not to
    beat ``floor``.

    Run ``A`` first from ``start`` in buckets; the bucket whose first byte is ``y`` must end before
    compute passes ``needs`` there (the most compute that needs none of ``A``'s bytes from ``y``
    on), so with ``D`` the compute stream's stall up to the end of ``A``, it ends by ``needs + D``
    (the compute clock never runs ahead of the wall clock less its stalls). The released set then
    runs from ``A``'s end with its releases ``D`` later, and the makespan is at least
    ``compute + D`` too. The swap that puts ``A`` first keeps one compute clock for every
    schedule, so it still holds. Over ``D`` on a grid of intervals ``[Da, Db]``, finer near the
    least stall that meets the deadlines at all (found by bisection when a stall is needed):
    ``A``'s least end falls as ``D`` grows (taken at ``Db``) and the rest grows with ``D`` (taken
    at ``Da``). The interval with the least bound is then halved, :data:`STALL_SPLITS` times: on the
    4-node FSDP backward the least stall was near 10.6 ms, inside the grid's [5.7, 11.4] ms, and four
    halvings raised the term from 150.71 to 151.41 ms (the least over single stalls: 151.42); with
    the collectives' own closures in the releases, from 151.20 to 151.91 ms.
    """
    compute = float(weights.sum())

    def a_end(d: float) -> float:
        return max(base, _deadline_end(start, needs + d, a_cost, a_most))

    def at(d: float, end: float) -> float:  # the bound for stalls from d on, A ending at end or later
        late = None if r_late is None else (lambda i: r_late(i) + d)
        return max(compute + d, _least_end(end, releases + d, r_cost, r_lead, late) + last)

    end0 = a_end(0.0)
    if end0 <= base:  # the deadlines cost A nothing: a stall only delays the releases, and with
        return 0.0  # none the term is the caller's
    lo, hi = 0.0, 0.0  # no stall below lo meets A's deadlines; hi does
    if not np.isfinite(end0):  # one bucket of all of A from the start (or its least run within the
        # size limits, a_most) meets them after this stall
        hi = max(start + float(a_cost[-1]), _deadline_end(start, np.full(len(needs), np.inf), a_cost, a_most))
        if at(hi, a_end(hi)) <= floor:  # the least over stalls is no higher
            return 0.0
        for _ in range(STALL_BISECTIONS):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if np.isfinite(a_end(mid)) else (mid, hi)
    top = at(hi, a_end(hi))
    if top <= floor:
        return 0.0
    if top <= compute + lo:
        return top
    span = top - compute - lo  # past lo + span the compute alone reaches top
    ds = lo + np.append(0.0, span * np.geomspace(2.0 ** (1 - STALL_STEPS), 1.0, STALL_STEPS))
    parts: list[tuple[float, float, float]] = []  # (bound for stalls in [da, db], da, db)
    for da, db in zip(ds[:-1], ds[1:]):
        v = at(da, a_end(db))
        if v <= floor:
            return 0.0
        parts.append((v, da, db))
    # the least part decides the term: halve it (each half's bound is at least the whole's, as A's
    # end falls and the rest grows with the stall), STALL_SPLITS times
    heapq.heapify(parts)
    for _ in range(STALL_SPLITS):
        v, da, db = heapq.heappop(parts)
        if v >= top:
            heapq.heappush(parts, (v, da, db))
            break
        mid = 0.5 * (da + db)
        heapq.heappush(parts, (max(v, at(da, a_end(mid))), da, mid))
        heapq.heappush(parts, (max(v, at(mid, a_end(db))), mid, db))
    return min(top, parts[0][0])


def _capped_comm(members: Sequence[Op], caps: dict[str, float], cost: Callable[[np.ndarray], np.ndarray]) -> float:
    """Least time to run ``members`` (one kind) in buckets no larger than the least cap of their
    members (a bucket of one may be as large as its member): a lower bound on their stream time.

    Relaxed to buckets of any bytes of the members (a member's bytes may be split), the cheapest
    buckets take the bytes in increasing order of cap, each a run of consecutive bytes: given any
    buckets, refilling them (same sizes, in increasing order of their own least caps) with the
    bytes in that order keeps every one within its cap, since the bytes with cap at most ``c``
    sat in buckets whose least cap is at most ``c``. A dynamic program over a byte grid (as
    :func:`_least_end`: a bucket is charged for the cells it covers whole, and may be as large as
    the largest cap in its first cell) gives the least total.
    """
    order = sorted(members, key=lambda c: caps.get(c.name, np.inf))
    sizes = np.array([c.collective.size_bytes for c in order], dtype=float)  # type: ignore[union-attr]
    total = float(sizes.sum())
    cap_of = np.array([caps.get(c.name, np.inf) for c in order])
    if total <= 0 or not np.isfinite(cap_of).any():
        return 0.0
    xs, cell_cost = _cells(total, cost)
    # per cell: the largest cap among its bytes (that of the member holding its last byte)
    owner = np.minimum(np.searchsorted(np.cumsum(sizes), xs[1:], side="left"), len(order) - 1)
    allowed = np.maximum(cap_of[owner], sizes.max())
    k = len(xs) - 1
    cost = _least_cover_cost(cell_cost)
    most = np.minimum(k, np.floor(allowed / (total / k)))  # per first cell: the most cells a bucket may cover
    t = np.full(k + 1, np.inf)
    t[0] = 0.0
    for i in range(k):
        if np.isfinite(t[i]):
            hi = min(k, i + 1 + int(most[i]))
            np.minimum(t[i + 1:hi + 1], t[i] + cost[:hi - i], out=t[i + 1:hi + 1])
    return float(t[k]) if np.isfinite(t[k]) else 0.0


def _byte_grid(problem: ScheduleProblem, members: Sequence[Op], bucket_cost: Callable[[np.ndarray], np.ndarray],
               price_of: dict[str, float]) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """``members``' bytes per op of ``problem``, and :func:`_cells` over them with a bucket costing
    at least ``bucket_cost`` and the least per-byte price among them."""
    sizes = np.zeros(len(problem.ops), dtype=np.int64)
    for c in members:
        sizes[problem.index[c.name]] = c.collective.size_bytes  # type: ignore[union-attr]
    price = min((price_of.get(c.name, 0.0) for c in members), default=0.0)
    return sizes, _cells(float(sizes.sum()), lambda x: np.maximum(bucket_cost(x), price * x))


def stream_release_bound(problem: ScheduleProblem, weights: np.ndarray, cols: Sequence[Op], head: int, tail: int,
                         comm_of: Callable[[Sequence[Op]], float],
                         bucket_cost: dict[object, Callable[[np.ndarray], np.ndarray]],
                         price_of: dict[str, float], caps: dict[str, float] | None = None,
                         floor: int = 0, memory: tuple[CutGraph, int] | None = None) -> tuple[int, str]:
    """The stream term for one group's collectives ``cols`` (module doc): ``(makespan bound, what)``.

    ``head``/``tail``: the least, over them, of the compute one depends on / that depends on one;
    ``comm_of(members)``: the least time to run ``members`` in any buckets (the FIFO term's);
    ``bucket_cost[kind](sizes)``: per size, a lower bound on one bucket of that many bytes of the kind;
    ``price_of[name]``: a per-byte cost every bucket holding that collective pays (0: none);
    ``caps[name]``: the largest bucket of two or more that may hold it (none: no limit), which
    the first-run set's time also honours (:func:`_capped_comm`); ``floor``: the best bound so
    far, below which the stalled parts (:func:`_stalled_term`) give up early; ``memory``: the
    problem's cut graph and the memory budget, when there is one (:func:`_memory_late`).
    """
    kinds = sorted({c.collective.kind for c in cols}, key=lambda k: k.value)  # type: ignore[union-attr]
    best, what = 0, ""
    closures = {rev: _Closure(problem, rev) for rev in (False, True)}
    stalls: list[tuple[float, str, tuple]] = []
    for kind in kinds:
        released = [c for c in cols if c.collective.kind is kind]  # type: ignore[union-attr]
        others = [c for c in cols if c.collective.kind is not kind]  # type: ignore[union-attr]
        sizes, (xs, cell_cost) = _byte_grid(problem, released, bucket_cost[kind], price_of)
        if len(released) < 2 or sizes.sum() == 0:
            continue
        comm_others = 0.0
        other_kinds = {c.collective.kind for c in others}  # type: ignore[union-attr]
        for other in other_kinds:
            sel = [c for c in others if c.collective.kind is other]  # type: ignore[union-attr]
            capped = _capped_comm(sel, caps, bucket_cost[other]) if caps else 0.0
            comm_others += max(comm_of(sel), capped)
        a_grid = None
        if len(other_kinds) == 1:
            (other,) = other_kinds
            a_sizes, a_grid = _byte_grid(problem, others, bucket_cost[other], price_of)
            if a_sizes.sum() == 0:
                a_grid = None
        for reverse, (first, last) in ((False, (head, tail)), (True, (tail, head))):
            releases = np.maximum(first, _release_curve(closures[reverse], weights, sizes, xs))
            lead = _copy_lead(problem, released, xs, copy_out=reverse)
            late = None if reverse or memory is None else _memory_late(problem, *memory, weights, sizes, released, xs)
            end = _least_end(first + comm_others, releases, cell_cost, lead, late) + last
            label = (f"group {released[0].collective.group}: {kind.value} "  # type: ignore[union-attr]
                     f"{'needed by compute' if reverse else 'released by compute'}")
            if int(end) > best:
                best, what = int(end), label
            if a_grid is not None:  # A (one kind) needed by compute: its deadlines stall the compute stream
                stalls.append((end, label, (first, first + comm_others, last, closures[not reverse], a_sizes,
                                            a_grid, releases, cell_cost, lead, late, others)))
    # the stalled terms last, most promising first: each gives up once it cannot beat the best so far
    for _, label, (first, base, last, closure, a_sizes, a_grid, releases, cell_cost, lead, late, others) in sorted(
            stalls, key=lambda s: -s[0]):
        deadlines, most = _member_limits(problem, weights, others, caps or {}, a_grid[0], closure)
        needs = np.minimum(_needs(closure, weights, a_sizes, a_grid[0]), deadlines)
        end = _stalled_term(weights, first, base, last, needs, a_grid[1], releases, cell_cost, max(floor, best),
                            lead, late, most)
        if int(end) > best:
            best, what = int(end), label
    return best, what
