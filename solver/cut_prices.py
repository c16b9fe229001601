"""What the comm stream costs in the stall-free cut relaxation (:mod:`.stall_free_cuts`).

Two lower bounds on the comm time of a set of one group's collectives that every bucketing of
every schedule within the budget pays, both linear in the relaxation's literals:

- :func:`byte_prices`: a cost per byte of each collective's own, so a set costs at least the sum
  of its members' prices times their bytes; :func:`cut_byte_prices` the same for what runs
  before a cut;
- :func:`set_chords`: lines whose minimum is at most the cheapest bucketing of a set's total
  bytes, for sets that are unions of whole buckets (what ended before a clock, what was issued
  before a cut), so a set whose members could not fill the budget's largest bucket pays for the
  buckets it can form.

Why not :func:`.bounds._comm_of` alone: it needs the set, and here the set is the model's choice.
"""

from __future__ import annotations

import functools
import math

from .bounds import _budget_prices, _concave_minorant, _minorant_at
from .memory_cuts import bucket_size_caps
from .problem import Op, ScheduleProblem

__all__ = ["byte_prices", "cut_byte_prices", "set_chords"]


def byte_prices(problem: ScheduleProblem, budget_bytes: int, by: dict[tuple, list[Op]],
                slopes: dict[tuple, float]) -> dict[str, float]:
    """Per collective: a cost per byte of its own that it pays in every bucketing of every schedule
    within ``budget_bytes``, so that a set's comm time is at least the sum of its members' prices
    times their bytes (linear, for the FIFO sums). The larger of two valid prices:

    - the slope every bucketing pays (:func:`.bounds._linear_slope`, the curve's asymptote);
    - :func:`.bounds._budget_prices`, ``g(x)/x`` with ``g`` the concave minorant, at the largest
      bucket that can hold the collective: within the budget at most ``cap(c)`` bytes
      (:func:`.memory_cuts.bucket_size_caps`), and never more than the ``T`` bytes of its group
      and kind in all. ``g(x)/x`` does not grow with ``x`` (``g`` concave, ``g(0) >= 0``), so the
      smaller bound gives the higher price.

    Each member may take its own price: a bucket of ``S`` bytes (``S <= T`` and ``S <= cap(m)``
    for each member ``m``) costs at least ``max(g(S), h(S)) >= S * max(slope, g(S)/S)``, and
    ``g(S)/S`` is at least every member's budget price, so the bucket pays the sum of its members'
    prices times their bytes. A lone collective costs its runtime, at least ``g`` of its size.
    """
    caps = bucket_size_caps(problem, budget_bytes)
    bounded: dict[str, float] = {}
    for members in by.values():
        total = float(sum(c.collective.size_bytes for c in members))  # type: ignore[union-attr]
        bounded.update((c.name, min(caps.get(c.name, math.inf), total)) for c in members)
    prices = _budget_prices(problem, bounded)
    return {c.name: max(slopes[key], prices.get(c.name, 0.0)) for key, members in by.items() for c in members}


def cut_byte_prices(problem: ScheduleProblem, budget_bytes: int, by: dict[tuple, list[Op]],
                    slopes: dict[tuple, float], cut: int) -> dict[str, float]:
    """:func:`byte_prices` for the buckets issued before compute op ``cut`` (index): those hold only
    collectives that do not descend from it, so a bucket's bytes are at most theirs per key, a
    bound that may be far below the key's total early in a backward (a weight gradient's
    reduce-scatter cannot share a bucket with those of layers below the cut). Collectives that
    descend from ``cut`` get none."""
    desc, index = problem.descendants[cut], problem.index
    before = {key: [c for c in members if not desc >> index[c.name] & 1] for key, members in by.items()}
    return byte_prices(problem, budget_bytes, {key: m for key, m in before.items() if m}, slopes)


def set_chords(problem: ScheduleProblem, key: tuple, members: list[Op],
               ratio: float = 2.0) -> list[tuple[float, float]]:
    """Lines ``(a, b)`` (ns, ns per byte) with ``min(a + b B) <= `` the least comm time of any
    buckets of ``members`` holding ``B`` bytes in all, for ``0 < B <= T`` (their total); empty
    where the kind has no concave minorant.

    With the concave minorant ``g`` (:func:`.bounds._concave_minorant`: below the bucket curve and
    every lone runtime, ``g(0) >= 0``, so subadditive), buckets of ``B`` bytes in all cost at least
    ``g(B)``, however many there are. The lines are ``g``'s chords between knots ``0``, the
    smallest member's size and on by ``ratio`` up to ``T``: ``g`` is concave, so their minimum is
    the interpolation of ``g`` at the knots, below ``g`` on ``[0, T]``. Where no member holds, the
    set costs 0, which the lines do not say (``g(0)`` may be a launch): callers guard them.
    """
    curve = problem.curve_by_key.get(key)
    conc = _concave_minorant(curve, members) if curve is not None else None
    sizes = [float(m.collective.size_bytes) for m in members if m.collective.size_bytes > 0]  # type: ignore[union-attr]
    if conc is None or not sizes:
        return []
    g = functools.partial(_minorant_at, conc)
    total = sum(sizes)
    knots = [0.0]
    x = min(sizes)
    while x < total:
        knots.append(x)
        x *= ratio
    knots.append(total)
    out = []
    for x0, x1 in zip(knots, knots[1:]):
        if x1 > x0:
            slope = (g(x1) - g(x0)) / (x1 - x0)
            out.append((g(x0) - slope * x0, slope))
    return out
