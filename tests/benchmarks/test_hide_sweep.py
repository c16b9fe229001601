"""The slack sweep (benchmarks/hide_sweep.py) on a hand-derived problem where a hidden collective
costs makespan."""

from __future__ import annotations

from fxsched.benchmarks.hide_sweep import sweep, table
from tests.heuristics.test_hide import _filler_or_feed


def test_each_slack_buys_what_the_oracle_allows() -> None:
    """``_filler_or_feed``: the 66 ns order exposes both collectives; hiding c1 delays the end to
    68 ns (brute force agrees: test_hide). At 0% and 3% (67.98 ns) nothing changes; at 5% (69.3
    ns) c1 is hidden at 68 ns."""
    p, base = _filler_or_feed()
    rows = sweep(p, base, [0.0, 0.03, 0.05])
    assert [(r.slack, r.result.makespan_ns, r.result.n_hidden_hideable) for r in rows] == [
        (0.0, 66, 0), (0.03, 66, 0), (0.05, 68, 1)]
    text = "\n".join(table(p, rows))
    assert "| 0.0% | 0.1 | 0.0 | 0/2 | 0.0% |" in text and "| 5.0% | 0.1 | 0.0 | 1/2 | 50.0% |" in text
    assert text.count("| fails |") == 3


def test_spine_rows_follow_the_answer_rows() -> None:
    """tests/solver/test_spine_fill.py's chain: the given order (95 ns) hides 1 of 2 at any slack;
    the spine fill's order hides both at 65 ns (total compute, the optimum)."""
    from fxsched.solver import Schedule
    from fxsched.solver.cpsat import SolveConfig
    from fxsched.solver.spine_fill import spine_fill
    from tests.solver.test_spine_fill import _short_fillers

    p = _short_fillers()
    base = Schedule.original(p)
    spine = spine_fill(p, base, 10**9, SolveConfig(mode="free"), 5.0)
    rows = sweep(p, base, [0.0, 0.05], spine)
    assert [(r.spine, r.slack, r.result.makespan_ns, r.result.n_hidden_hideable) for r in rows] == [
        (False, 0.0, 95, 1), (False, 0.05, 95, 1), (True, 0.0, 65, 2), (True, 0.05, 65, 2)]
    text = "\n".join(table(p, rows))
    assert "| spine fill, 0.0% | 0.1 | 0.0 | 2/2 | 100.0% |" in text


def test_a_slack_splits_a_bucket_and_the_members_column_counts_it() -> None:
    """tests/heuristics/test_split_buckets.py's ``_early_and_late``: bucketed, 240 ns with both
    members exposed; split, 250 ns with c2 hidden (the most any schedule hides within 250 ns,
    the oracle there). At 4% (249.6 ns) the bucket stays; at 5% (252 ns) it is split."""
    from tests.heuristics.test_split_buckets import _early_and_late

    p, bucketed = _early_and_late()
    rows = sweep(p, bucketed, [0.0, 0.04, 0.05])
    assert [(r.result.makespan_ns, r.result.n_hidden_hideable, r.result.n_hideable,
             r.result.n_hidden_hideable_members) for r in rows] == [(240, 0, 1, 0), (240, 0, 1, 0), (250, 1, 2, 1)]
    text = "\n".join(table(p, rows))
    assert "| 0.0% | 0.2 | 0.0 | 0/1 | 0.0% | 0/2 |" in text and "| 5.0% | 0.2 | 0.1 | 1/2 | 50.0% | 1/2 |" in text
