"""Cheap, valid lower bounds on exposed communication time (for schedules without bucketing).

Two arguments, both from the execution model:

* **Dependency bound.** A collective ``c`` cannot start before all compute it depends on has
  run, and everything that depends on it runs after it ends, all on the one compute stream. So
  ``makespan >= anc(c) + rt(c) + desc(c)``, i.e. ``exposed >= rt(c) - indep(c)`` where
  ``indep(c)`` is the compute independent of ``c``.
* **FIFO bound.** A group's collectives run one at a time. The first cannot start before the
  smallest ancestor compute of any of them, and after the last ends at least the smallest
  descendant compute of any of them remains. So ``makespan >= min anc + sum rt + min desc``.

Bucketing changes runtimes, so these bounds hold only for unbucketed schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .memory_cuts import MEMORY_HEAD_PEAKS, CutGraph, bucket_size_caps, memory_heads
from .problem import OpKind, ScheduleProblem, bit_mask
from .schedule import Schedule
from .simulator import memory_curve
from .stream_bound import stream_release_bound


STREAM_DROP_SHARE = 0.01  # bytes of a group's earliest-headed collectives the stream term may leave out


@dataclass(frozen=True)
class ExposedBound:
    exposed_ns: int
    dependency_ns: int  # best single-collective dependency bound
    fifo_ns: int  # best per-group FIFO bound
    limiting: str  # the collective or group that gives the bound


def _weights(problem: ScheduleProblem) -> np.ndarray:
    """Per op (in the problem's order): the compute-stream time it takes (compute and zero ops)."""
    return np.array([op.runtime_ns if op.kind in (OpKind.COMPUTE, OpKind.ZERO) else 0 for op in problem.ops],
                    dtype=np.int64)


def _bit_sum(bits: int, weights: np.ndarray) -> int:
    return int(weights[bit_mask(bits, len(weights))].sum())


def exposed_lower_bound(problem: ScheduleProblem) -> ExposedBound:
    """A lower bound on the exposed time of every valid unbucketed schedule of ``problem``."""
    weights = _weights(problem)
    total = int(weights.sum())
    best_dep, dep_name = 0, ""
    per_group: dict[str, list[tuple[int, int, int]]] = {}
    for c in problem.collectives:
        i = problem.index[c.name]
        anc = _bit_sum(problem.ancestors[i], weights)
        desc = _bit_sum(problem.descendants[i], weights)
        bound = anc + c.runtime_ns + desc - total
        if bound > best_dep:
            best_dep, dep_name = bound, c.name
        per_group.setdefault(c.collective.group, []).append((anc, c.runtime_ns, desc))  # type: ignore[union-attr]
    best_fifo, fifo_name = 0, ""
    for g, items in per_group.items():
        bound = min(a for a, _, _ in items) + sum(r for _, r, _ in items) + min(d for _, _, d in items) - total
        if bound > best_fifo:
            best_fifo, fifo_name = bound, g
    if best_dep >= best_fifo:
        return ExposedBound(best_dep, best_dep, best_fifo, f"collective {dep_name}" if dep_name else "none")
    return ExposedBound(best_fifo, best_dep, best_fifo, f"group {fifo_name}")


def forced_exposed(problem: ScheduleProblem) -> int:
    """How many collectives (lone or bucketed units) are exposed in every schedule, in any order.

    Take a hideable collective ``c`` whose least runtime (alone or in any bucket: the kind's curve
    minorant at its own size) exceeds the compute independent of it. Between its unit's issue and
    wait the compute stream runs only compute independent of it (a bucket's is no more), and the
    unit runs longer than that, so a wait in that window stalls: ``c``'s own, or one placed inside
    the window (which may hide ``c``, being exposed itself). Two such collectives one of which
    depends on the other cannot share a bucket, and their windows do not meet (the later one is
    issued after the earlier one's wait), so a longest dependency chain among them counts
    distinct stalled waits: distinct exposed units in every schedule.
    """
    weights = _weights(problem)
    total = int(weights.sum())
    least = _least_runtimes(problem)
    forced = []
    for c in problem.collectives:
        i = problem.index[c.name]
        indep = total - _bit_sum(problem.ancestors[i], weights) - _bit_sum(problem.descendants[i], weights)
        if 0 < indep < least[c.name]:
            forced.append(i)
    depth: dict[int, int] = {}
    for i in sorted(forced):  # the problem's order is topological
        depth[i] = 1 + max((d for j, d in depth.items() if problem.ancestors[i] >> j & 1), default=0)
    return max(depth.values(), default=0)


def exposed_after_compute(problem: ScheduleProblem) -> bool:
    """Whether every schedule, in any order and with any buckets, has an exposed collective whose
    wait comes after all compute.

    It holds when every op with compute-stream time feeds a collective (is one's ancestor), every
    collective takes time (its least runtime in any bucket, :func:`_comm_lb_fn`, is positive) and
    every all_gather or all_to_all (the kinds whose buckets copy out after their wait) has an op
    with compute time among its descendants. Take the unit (lone collective or bucket) issued
    last, at time ``t``. Each op with compute time runs before the issue of a collective it feeds,
    so by ``t`` all have run (a bucket's copy-in too, at its issue), and every copy-out has run:
    a copy-out follows its unit's wait, which precedes that unit's descendants with compute time.
    After ``t`` the program holds only waits and ops without compute time, so the clock stays at
    ``t`` until a wait stalls; the last unit ends after ``t`` and its wait comes after its issue,
    so some wait after ``t`` stalls. Hence a schedule with a single exposed collective runs all of
    its compute without a stall: every other wait is reached with its collective complete.

    On an FSDP backward every op feeds a gradient's reduce-scatter, so this holds there.
    """
    weights = _weights(problem)
    cols = problem.collectives
    if not cols:
        return False
    feeds = 0
    for c in cols:
        feeds |= problem.ancestors[problem.index[c.name]]
    if (weights[~bit_mask(feeds, len(weights))] > 0).any():
        return False
    least = _least_runtimes(problem)
    for c in cols:
        if least[c.name] <= 0:
            return False
        if c.collective.kind.bucket_copies_out and not weights[  # type: ignore[union-attr]
                bit_mask(problem.descendants[problem.index[c.name]], len(weights))].any():
            return False
    return True


def _least_runtimes(problem: ScheduleProblem) -> dict[str, float]:
    """Per collective: the least time it takes alone or in any bucket (its kind's curve minorant
    at its own size, :func:`_comm_lb_fn`)."""
    by_key: dict[tuple, list] = {}
    for c in problem.collectives:
        by_key.setdefault((c.collective.group, c.collective.kind), []).append(c)  # type: ignore[union-attr]
    out: dict[str, float] = {}
    for (group, kind), members in by_key.items():
        lb_fn, _ = _comm_lb_fn(problem, group, kind, members)
        for c in members:
            out[c.name] = lb_fn(1, float(c.collective.size_bytes))  # type: ignore[union-attr]
    return out


# --------------------------------------------------------------------------------------------
# A bound that holds with bucketing too: heads, tails and the cheapest possible comm per subset.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MakespanBound:
    """A lower bound on the makespan of every valid schedule, bucketed or not, in any compute order."""

    makespan_ns: int
    compute_ns: int
    limiting: str  # what gives the bound

    @property
    def exposed_ns(self) -> int:
        return self.makespan_ns - self.compute_ns


def _convex_minorant(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull of ``points`` (sorted by x), made non-decreasing.

    The result ``g`` is convex, non-decreasing and ``g <= `` every point and every segment between
    consecutive points (a piecewise-linear curve through the points lies above its hull).
    """
    pts = sorted(set(points))
    hull: list[tuple[float, float]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:  # hull[-1] on or above chord
                hull.pop()
            else:
                break
        hull.append(p)
    # non-decreasing: flatten the part left of the minimum
    i_min = min(range(len(hull)), key=lambda i: hull[i][1])
    return [(0.0, hull[i_min][1])] + hull[i_min:] if i_min else hull


def _eval_pl(hull: list[tuple[float, float]], x: np.ndarray) -> np.ndarray:
    """A convex piecewise-linear function given by hull points, extended linearly on the right."""
    xs = np.array([p[0] for p in hull], dtype=float)
    ys = np.array([p[1] for p in hull], dtype=float)
    if len(xs) == 1:
        return np.full_like(x, ys[0], dtype=float)
    y = np.interp(x, xs, ys)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    right = x > xs[-1]
    y[right] = ys[-1] + slope * (x[right] - xs[-1])
    return np.maximum(y, ys.min())


def _concave_minorant(curve, members: list) -> tuple[float, list[tuple[float, float]]] | None:
    """``(lam, lines)`` with ``g(x) = lam * min(a + b x)`` concave, non-decreasing, ``g(0) >= 0``, below the
    bucket curve everywhere and below every lone runtime; None when the curve does not allow one.

    The curve is linear between its points and extended with its end segments' lines, so the min
    of its segment lines is below it. NCCL's cost model is a min over algorithms of affine
    functions, hence concave, and this is the usual case.
    """
    pts = curve.points
    lines = [((y0 * x1 - y1 * x0) / (x1 - x0), (y1 - y0) / (x1 - x0)) for (x0, y0), (x1, y1) in zip(pts, pts[1:])]
    if any(b < 0 or a < 0 for a, b in lines):
        return None
    lam = 1.0
    for op in members:
        gx = min(a + b * op.collective.size_bytes for a, b in lines)
        if gx > 0:
            lam = min(lam, op.runtime_ns / gx)
    return lam, lines


def _minorant_at(conc: tuple[float, list[tuple[float, float]]], x: float) -> float:
    """``g(x)`` for ``conc = (lam, lines)`` from :func:`_concave_minorant`."""
    lam, lines = conc
    return lam * min(a + b * x for a, b in lines)


def _comm_lb_fn(problem: ScheduleProblem, group: str, kind, members: list):
    """``(f, s)``: ``f(count, bytes)`` is a lower bound on running ``count`` collectives of ``bytes`` in total, bucketed
    any way. Two valid arguments, the larger wins: with a concave minorant ``g`` (subadditive
    since ``g(0) >= 0``) one bucket is cheapest, ``g(bytes)``; with the convex minorant ``h`` of
    the curve and the lone runtimes, k buckets cost at least ``k h(bytes/k)`` (Jensen), min over k.
    ``s`` is a cost per byte that every bucketing pays at least (:func:`_linear_slope`).
    ``f.one(sizes)`` is ``f(1, size)`` for an array of sizes (one bucket each).
    """
    pts = [(float(op.collective.size_bytes), float(op.runtime_ns)) for op in members]
    curve = problem.curve_by_key.get((group, kind))
    conc = None
    if curve is not None:
        pts += [(float(x), float(y)) for x, y in curve.points]
        # the curve extends linearly past its last point: a far point on that line keeps the hull below it
        total = float(sum(op.collective.size_bytes for op in members)) + 1.0
        (x0, y0), (x1, y1) = curve.points[-2], curve.points[-1]
        far = max(total * 2, x1 * 2.0)
        pts.append((far, max(0.0, y1 + (y1 - y0) * (far - x1) / (x1 - x0))))
        conc = _concave_minorant(curve, members)
    hull = _convex_minorant(pts)

    def lb(count: int, size_bytes: float) -> float:
        ks = np.arange(1, count + 1, dtype=float)
        best = float(np.min(ks * _eval_pl(hull, size_bytes / ks)))
        if conc is not None:
            best = max(best, _minorant_at(conc, size_bytes))
        return best

    def one(sizes: np.ndarray) -> np.ndarray:  # lb(1, each size), vectorized
        out = _eval_pl(hull, sizes)
        if conc is not None:
            lam, lines = conc
            out = np.maximum(out, lam * np.min([a + b * sizes for a, b in lines], axis=0))
        return out

    lb.one = one  # type: ignore[attr-defined]
    return lb, _linear_slope(hull, conc)


def _linear_slope(hull: list[tuple[float, float]], conc) -> float:
    """The largest ``s`` with ``cost(any buckets of B bytes in all) >= s * B``.

    Convex minorant ``h`` (``h(0) >= 0``): each bucket of ``x`` bytes costs ``h(x) >= x * min h(x)/x``,
    and ``h(x)/x`` on a linear piece is monotone, so its minimum is at a knot or the right end's
    slope. Concave minorant ``lam * min(a + b x)`` with every ``a >= 0``: one bucket is cheapest,
    and it costs at least ``lam * min(b) * B``.
    """
    slopes = [y / x for x, y in hull if x > 0]
    if len(hull) >= 2:
        (x0, y0), (x1, y1) = hull[-2], hull[-1]
        slopes.append((y1 - y0) / (x1 - x0))
    s = max(0.0, min(slopes)) if slopes else 0.0
    if conc is not None:
        lam, lines = conc
        s = max(s, lam * min(b for _, b in lines))
    return s


def makespan_lower_bound(problem: ScheduleProblem, memory_budget_bytes: int | None = None) -> MakespanBound:
    """A lower bound valid for every schedule, with any bucketing and any compute order (within
    ``memory_budget_bytes`` when given).

    Each collective ``c`` has a head ``r(c)`` (the compute it depends on: it cannot start before
    that has run) and a tail ``q(c)`` (the compute that depends on it: it runs after ``c`` ends).
    A bucket starts after every member's head and ends before every member's tail. For a set
    ``S`` of one group's collectives, all of ``S`` runs one at a time on the group's stream, so
    ``makespan >= min r(S) + comm(S) + min q(S)``, where ``comm(S)`` is the cheapest way to run
    ``S`` in any buckets: per kind, with a convex non-decreasing minorant ``g`` of the bucket
    curve and the lone runtimes, k buckets of total size B cost at least ``k g(B/k)`` (Jensen),
    minimized over k. ``S`` ranges over every (head threshold, tail threshold) pair. A bucket
    that mixes members in and out of ``S`` still costs at least ``g`` of its ``S`` bytes, since
    ``g`` is non-decreasing (a concave minorant serves too: see :func:`_comm_lb_fn`). With the
    total compute and the chain bound (:func:`_chain_bound`) this is the bound.

    With a memory budget, a bucket holding ``c`` is at most ``cap(c)`` bytes
    (:func:`.memory_cuts.bucket_size_caps`), so ``c`` pays at least ``g(cap)/cap`` per byte,
    ``g`` the concave minorant (``g(x)/x`` falls as ``x`` grows): :func:`_budget_prices`. Then
    ``comm(S)`` is also at least the sum of its members' bytes at their prices.
    """
    weights = _weights(problem)
    total = int(weights.sum())
    best, limiting = total, "compute"
    n = len(weights)
    anc = {c.name: bit_mask(problem.ancestors[problem.index[c.name]], n) for c in problem.collectives}
    desc = {c.name: bit_mask(problem.descendants[problem.index[c.name]], n) for c in problem.collectives}
    rt_min: dict[str, int] = {}  # per collective: the least it can take, alone or in any bucket
    per_byte: dict[str, float] = {}  # per collective: a cost per byte every bucketing pays
    by_group: dict[str, list] = {}
    for c in problem.collectives:
        by_group.setdefault(c.collective.group, []).append(c)  # type: ignore[union-attr]
    graph = CutGraph(problem) if memory_budget_bytes is not None else None
    memory = None if graph is None else (graph, memory_budget_bytes)
    caps = bucket_size_caps(problem, memory_budget_bytes, graph=graph) if graph is not None else {}
    prices = _budget_prices(problem, caps)  # none without a budget (no caps)
    dep_heads = {name: int(weights[a].sum()) for name, a in anc.items()}  # compute each collective depends on
    mem_heads = {} if memory_budget_bytes is None else memory_heads(
        problem, memory_budget_bytes, weights, dep_heads, _memory_peaks(problem, MEMORY_HEAD_PEAKS))
    for g, cols in by_group.items():
        kinds = sorted({c.collective.kind for c in cols}, key=lambda k: k.value)  # type: ignore[union-attr]
        heads = np.array([max(dep_heads[c.name], mem_heads.get(c.name, 0)) for c in cols], dtype=np.int64)
        tails = np.array([weights[desc[c.name]].sum() for c in cols], dtype=np.int64)
        size = np.array([c.collective.size_bytes for c in cols], dtype=float)  # type: ignore[union-attr]
        kind_masks = [np.array([c.collective.kind == k for c in cols]) for k in kinds]  # type: ignore[union-attr]
        fns = [_comm_lb_fn(problem, g, k, [c for c, m in zip(cols, km) if m]) for k, km in zip(kinds, kind_masks)]
        lbs = [f for f, _ in fns]
        priced = np.array([prices.get(c.name, 0.0) for c in cols]) * size  # what each pays at least
        for c, sz in zip(cols, size):
            lb_fn, slope = fns[kinds.index(c.collective.kind)]  # type: ignore[union-attr]
            rt_min[c.name] = int(np.floor(lb_fn(1, float(sz))))
            per_byte[c.name] = max(slope, prices.get(c.name, 0.0))
        lb_of = dict(zip(kinds, lbs))
        for t in np.unique(heads):
            in_t = heads >= t
            for u in np.unique(tails[in_t]):
                s = in_t & (tails >= u)
                comm = 0.0
                for km, lb_fn in zip(kind_masks, lbs):
                    sel = s & km
                    cnt = int(sel.sum())
                    if cnt:
                        comm += max(lb_fn(cnt, float(size[sel].sum())), float(priced[sel].sum()))
                lb = int(heads[s].min()) + int(tails[s].min()) + int(np.floor(comm))
                if lb > best:
                    best, limiting = lb, f"group {g}: {int(s.sum())} collectives after {int(heads[s].min())} ns"
        # after the FIFO terms: the stream term's costlier parts give up below the best so far
        keep = _stream_set(heads, size) if any(c.name in mem_heads for c in cols) else np.arange(len(cols))
        stream, what = stream_release_bound(
            problem, weights, [cols[i] for i in keep], int(heads[keep].min()), int(tails[keep].min()),
            lambda members, lb_of=lb_of: _comm_of(members, lb_of, prices),
            {k: f.one for k, f in lb_of.items()}, prices, caps, best, memory)
        if stream > best:
            best, limiting = stream, what
    chain, last = _chain_bound(problem, weights, anc, desc, rt_min)
    if chain > best:
        best, limiting = chain, f"chain of collectives ending at {last}"
    for cols in by_group.values():
        exposed, name = _deferral_bound(problem, cols, weights, anc, desc, rt_min, per_byte, best - total)
        if total + exposed > best:
            best, limiting = total + exposed, f"compute deferred past {name}"
    return MakespanBound(best, total, limiting)


def _memory_peaks(problem: ScheduleProblem, count: int) -> list[int]:
    """The ``count`` ops at which the original order's memory is highest (ties: the earlier), as
    splits for :func:`.memory_cuts.memory_heads` (any ops would do: the choice only decides what
    it can prove)."""
    _, curve = memory_curve(problem, Schedule.original(problem))
    if not curve:
        return []
    return [int(i) for i in np.argsort(-np.array(curve), kind="stable")[:count]]


def _stream_set(heads: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Indices of the collectives (of one group) the stream term runs: all of them, less the ones
    with the least heads when those hold at most ``STREAM_DROP_SHARE`` of the bytes. Dropping
    collectives relaxes the problem (still a bound) and lets the stream start at the others' least
    head: on the 4-node FSDP backward the gathers of the 8 KB norm weights are the only ones a
    memory head (:func:`.memory_cuts.memory_heads`) leaves before the loss gradient."""
    order = np.argsort(heads, kind="stable")
    early = np.cumsum(size[order]) <= STREAM_DROP_SHARE * size.sum()  # a prefix of the order
    cut = int(early.sum())
    if cut == len(order):  # no bytes at all: keep them
        return np.arange(len(order))
    while cut > 0 and heads[order[cut]] == heads[order[cut - 1]]:  # drop whole head values only
        cut -= 1
    return np.sort(order[cut:])


def _comm_of(members, lb_of: dict, prices: dict[str, float]) -> float:
    """The FIFO term's least time to run ``members`` in any buckets: per kind, the larger of the
    bucket-curve bound and the members' memory prices."""
    out = 0.0
    for kind, lb_fn in lb_of.items():
        sel = [m for m in members if m.collective.kind is kind]
        if sel:
            out += max(lb_fn(len(sel), float(sum(m.collective.size_bytes for m in sel))),
                       sum(prices.get(m.name, 0.0) * m.collective.size_bytes for m in sel))
    return out


def _budget_prices(problem: ScheduleProblem, caps: dict[str, float]) -> dict[str, float]:
    """Per collective: a cost per byte of its own that every schedule within the budget pays,
    from the budget's bucket size ``caps`` (:func:`.memory_cuts.bucket_size_caps`).

    A bucket ``B`` holding ``c`` is no larger than ``cap(c)`` and costs at least
    ``g(size(B)) = size(B) * g(size(B))/size(B) >= sum of size(m) * g(cap(m))/cap(m)`` over its
    members, since ``g(x)/x`` does not grow with ``x`` (``g`` concave, ``g(0) >= 0``). Alone, ``c``
    costs its runtime, at least ``g(size(c))``: so the price is ``g(x)/x`` at
    ``x = max(cap(c), size(c))``. Kinds without a concave minorant get none.
    """
    by_key: dict[tuple, list] = {}
    for c in problem.collectives:
        by_key.setdefault((c.collective.group, c.collective.kind), []).append(c)  # type: ignore[union-attr]
    out: dict[str, float] = {}
    for (g, kind), cols in by_key.items():
        curve = problem.curve_by_key.get((g, kind))
        conc = _concave_minorant(curve, cols) if curve is not None else None
        if conc is None:
            continue
        lam, lines = conc
        for c in cols:
            x = max(caps.get(c.name, np.inf), float(c.collective.size_bytes))  # type: ignore[union-attr]
            if np.isfinite(x) and x > 0:
                out[c.name] = lam * min(a / x + b for a, b in lines)
    return out


def _deferral_bound(problem: ScheduleProblem, cols: list, weights: np.ndarray, anc: dict[str, np.ndarray],
                    desc: dict[str, np.ndarray], rt_min: dict[str, int], per_byte: dict[str, float],
                    beat_ns: int, max_candidates: int = 48) -> tuple[int, str]:
    """Compute that does not feed ``c`` may run after ``c`` is issued, but then what it feeds is
    issued after ``c`` too and queues behind it (DDP's last gradient reduction).

    For a collective ``c`` of a group (alone or in a bucket: that bucket is issued no earlier and
    takes at least ``rt_min(c)``), split the compute neither before nor after it by dependency,
    ``N``, into ``D`` (run after the issue) and the rest (run before). With ``K`` = ``rt_min(c)``
    plus every group collective depending on ``c`` (at its per-byte price), ``T`` the compute
    depending on ``c`` and ``R(D)`` the per-byte price of the group's collectives that depend on
    compute in ``D`` (issued after ``c``, so queued behind it), the time after the issue is at
    least ``max(K + R(D), A(D) + T, rt_min(c) + T)``. So
    ``exposed >= min over D of max(0, K - T + R(D) - A(D), rt_min(c) - A(D))``.

    Relaxation solved exactly: compute that feeds exactly one group collective ``e`` is bundled
    with it (taking it into ``D`` takes ``e`` after ``c``); compute feeding none or several is
    free to go in ``D``. The bundles form a fractional knapsack: those with ``r <= a`` always
    help, the rest are taken by increasing ``(r - a) / a`` until the two terms meet. Candidates
    are tried by their best possible value, largest first, at most ``max_candidates`` of them,
    and only while they can beat ``beat_ns``.
    """
    index = problem.index
    pos = np.array([index[e.name] for e in cols])
    heavy = np.flatnonzero(weights > 0)  # only ops that take time matter
    w_heavy = weights[heavy]
    lin = np.array([per_byte[e.name] * e.collective.size_bytes for e in cols], dtype=float)  # type: ignore[union-attr]
    # (collective, timed op): the compute each depends on; float64 products of 0/1 and integer ns
    # are exact below 2**53 and run in BLAS
    feeds = np.stack([anc[e.name][heavy] for e in cols]).astype(np.float64)
    cands = []
    for j, c in enumerate(cols):
        after = desc[c.name][pos]
        k = rt_min[c.name] + float(lin[after].sum())
        t = int(weights[desc[c.name]].sum())
        cands.append((max(k - t, rt_min[c.name]), j, k, t))
    cands.sort(key=lambda x: -x[0])
    best, best_name = 0, ""
    for ub, j, k, t in cands[:max_candidates]:
        if ub <= max(best, beat_ns):
            break
        c = cols[j]
        free_ops = ~anc[c.name][heavy] & ~desc[c.name][heavy]
        others = ~anc[c.name][pos] & ~desc[c.name][pos]
        others[j] = False
        once = free_ops & (others.astype(np.float64) @ feeds == 1)  # feeds exactly one of the others
        a = (feeds @ np.where(once, w_heavy, 0).astype(np.float64))[others]
        r = lin[others]
        free = float(w_heavy[free_ops & ~once].sum())
        good = r <= a
        u = k - t - free + float((r[good] - a[good]).sum())
        v = rt_min[c.name] - free - float(a[good].sum())
        bad = np.flatnonzero(~good & (a > 0))
        for i in bad[np.argsort((r[bad] - a[bad]) / a[bad], kind="stable")]:
            if u >= v:
                break
            frac = min(1.0, (v - u) / r[i])  # u rises by frac (r - a), v falls by frac a: they meet
            u += frac * (r[i] - a[i])
            v -= frac * a[i]
        value = int(np.floor(max(0.0, u, v)))
        if value > best:
            best, best_name = value, c.name
    return best, best_name


def _chain_bound(problem: ScheduleProblem, weights: np.ndarray, anc: dict[str, np.ndarray],
                 desc: dict[str, np.ndarray], rt_min: dict[str, int], max_preds: int = 16) -> tuple[int, str]:
    """Longest chain of dependent collectives (tensor parallelism's critical path).

    For collectives ``c1 -> c2 -> ... -> ck``, each depending on the previous, the compute sets
    ``anc(c1)``, ``desc(c1) & anc(c2)``, ..., ``desc(ck)`` are disjoint and must run, in that
    order, before c1 starts, between consecutive ones, and after ck ends; so the makespan is at
    least their compute plus every ``rt_min``. A DP over collectives in program order; each looks
    back at its ``max_preds`` latest ancestor collectives (fewer terms in a max: still a bound).
    """
    cols = problem.collectives
    pos = np.array([problem.index[c.name] for c in cols], dtype=np.int64)
    best_end: list[int] = []
    out, out_name = 0, ""
    for j, c in enumerate(cols):
        preds = np.flatnonzero(anc[c.name][pos[:j]])[::-1][:max_preds].tolist()
        start = int(weights[anc[c.name]].sum())
        for i in preds:
            start = max(start, best_end[i] + int(weights[desc[cols[i].name] & anc[c.name]].sum()))
        best_end.append(start + rt_min[c.name])
        total = best_end[j] + int(weights[desc[c.name]].sum())
        if total > out:
            out, out_name = total, c.name
    return out, out_name
