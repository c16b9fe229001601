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

from .problem import OpKind, ScheduleProblem


@dataclass(frozen=True)
class ExposedBound:
    exposed_ns: int
    dependency_ns: int  # best single-collective dependency bound
    fifo_ns: int  # best per-group FIFO bound
    limiting: str  # the collective or group that gives the bound


def _mask(bits: int, n: int) -> np.ndarray:
    """The int bitset ``bits`` over ``n`` ops as a boolean array."""
    raw = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


def _bit_sum(bits: int, weights: np.ndarray) -> int:
    return int(weights[_mask(bits, len(weights))].sum())


def exposed_lower_bound(problem: ScheduleProblem) -> ExposedBound:
    """A lower bound on the exposed time of every valid unbucketed schedule of ``problem``."""
    weights = np.array(
        [op.runtime_ns if op.kind in (OpKind.COMPUTE, OpKind.ZERO) else 0 for op in problem.ops],
        dtype=np.int64,
    )
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


def _comm_lb_fn(problem: ScheduleProblem, group: str, kind, members: list):
    """``f(count, bytes)``: a lower bound on running ``count`` collectives of ``bytes`` in total, bucketed
    any way. Two valid arguments, the larger wins: with a concave minorant ``g`` (subadditive
    since ``g(0) >= 0``) one bucket is cheapest, ``g(bytes)``; with the convex minorant ``h`` of
    the curve and the lone runtimes, k buckets cost at least ``k h(bytes/k)`` (Jensen), min over k.
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
            lam, lines = conc
            best = max(best, lam * min(a + b * size_bytes for a, b in lines))
        return best

    return lb


def makespan_lower_bound(problem: ScheduleProblem) -> MakespanBound:
    """A lower bound valid for every schedule, with any bucketing and any compute order.

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
    """
    weights = np.array([op.runtime_ns if op.kind in (OpKind.COMPUTE, OpKind.ZERO) else 0 for op in problem.ops],
                       dtype=np.int64)
    total = int(weights.sum())
    best, limiting = total, "compute"
    n = len(weights)
    anc = {c.name: _mask(problem.ancestors[problem.index[c.name]], n) for c in problem.collectives}
    desc = {c.name: _mask(problem.descendants[problem.index[c.name]], n) for c in problem.collectives}
    rt_min: dict[str, int] = {}  # per collective: the least it can take, alone or in any bucket
    by_group: dict[str, list] = {}
    for c in problem.collectives:
        by_group.setdefault(c.collective.group, []).append(c)  # type: ignore[union-attr]
    for g, cols in by_group.items():
        kinds = sorted({c.collective.kind for c in cols}, key=lambda k: k.value)  # type: ignore[union-attr]
        heads = np.array([weights[anc[c.name]].sum() for c in cols], dtype=np.int64)
        tails = np.array([weights[desc[c.name]].sum() for c in cols], dtype=np.int64)
        size = np.array([c.collective.size_bytes for c in cols], dtype=float)  # type: ignore[union-attr]
        kind_masks = [np.array([c.collective.kind == k for c in cols]) for k in kinds]  # type: ignore[union-attr]
        lbs = [_comm_lb_fn(problem, g, k, [c for c, m in zip(cols, km) if m]) for k, km in zip(kinds, kind_masks)]
        for c, sz in zip(cols, size):
            lb_fn = lbs[kinds.index(c.collective.kind)]  # type: ignore[union-attr]
            rt_min[c.name] = int(np.floor(lb_fn(1, float(sz))))
        for t in np.unique(heads):
            in_t = heads >= t
            for u in np.unique(tails[in_t]):
                s = in_t & (tails >= u)
                comm = 0.0
                for km, lb_fn in zip(kind_masks, lbs):
                    sel = s & km
                    cnt = int(sel.sum())
                    if cnt:
                        comm += lb_fn(cnt, float(size[sel].sum()))
                lb = int(heads[s].min()) + int(tails[s].min()) + int(np.floor(comm))
                if lb > best:
                    best, limiting = lb, f"group {g}: {int(s.sum())} collectives after {int(heads[s].min())} ns"
    chain, last = _chain_bound(problem, weights, anc, desc, rt_min)
    if chain > best:
        best, limiting = chain, f"chain of collectives ending at {last}"
    return MakespanBound(best, total, limiting)


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
    best_end: list[int] = []
    out, out_name = 0, ""
    for j, c in enumerate(cols):
        bits = problem.ancestors[problem.index[c.name]]
        preds = [i for i in range(j - 1, -1, -1) if bits >> problem.index[cols[i].name] & 1][:max_preds]
        start = int(weights[anc[c.name]].sum())
        for i in preds:
            start = max(start, best_end[i] + int(weights[desc[cols[i].name] & anc[c.name]].sum()))
        best_end.append(start + rt_min[c.name])
        total = best_end[j] + int(weights[desc[c.name]].sum())
        if total > out:
            out, out_name = total, c.name
    return out, out_name
