"""More spine-fill rounds on a saved schedule (benchmarks/spine_rounds.py): a round is kept only
when it hides at least as many within the cap and the original order's peak."""

from __future__ import annotations

import dataclasses

import pytest
from fxsched.benchmarks import spine_rounds
from fxsched.solver import Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig
from fxsched.solver.serialization import save_problem, save_schedule

from tests.solver.test_spine_fill import _short_fillers

FREE = SolveConfig(mode="free")


def test_a_round_that_hides_more_is_kept_and_written(tmp_path, capsys) -> None:
    """tests/solver/test_spine_fill.py's chain: the given order (95 ns) hides 1 of 2; one round
    of the fill and the polish reach 65 ns with both hidden (total compute: the optimum)."""
    p = _short_fillers()
    save_problem(p, tmp_path / "p.json")
    save_schedule(Schedule.original(p), tmp_path / "s.json", p.name)
    assert spine_rounds.main([str(tmp_path / "p.json"), str(tmp_path / "s.json"), "--rounds", "1", "--round-s", "5",
                              "--radius", "4", "--cap", "0", "-o", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "start: 1/2 hidden at 0.1 us" in out and "round 0 (radius 4): 2/2 hidden at 0.1 us: kept" in out
    from fxsched.solver.serialization import load_schedule
    written = load_schedule(tmp_path / "out.json")
    assert not check_schedule(p, written)
    r = simulate(p, written)
    assert (r.makespan_ns, r.n_hidden_hideable_members) == (65, 2)


def test_a_round_past_the_cap_or_hiding_fewer_is_dropped(monkeypatch) -> None:
    """The fill and the polish (stubbed) return the given order (95 ns, 1 hidden), then c1, w1,
    a, b, d, x, c2, w2, z: w1 stalls 20 and w2 30, 115 ns, none hidden. With cap 0 the first is
    kept (as many hidden, no longer), the second dropped (longer, fewer): the start remains.
    Round k runs the fill with the config's seed plus k."""
    p = _short_fillers()
    base = Schedule.original(p)
    worse = Schedule(("c1", "w1", "a", "b", "d", "x", "c2", "w2", "z"))
    assert (simulate(p, worse).makespan_ns, simulate(p, worse).n_hidden_hideable_members) == (115, 0)
    outs = iter([base, worse])
    seeds = []

    def fill(problem, sched, budget, config, *a, **k):
        seeds.append(config.seed)
        return next(outs)

    monkeypatch.setattr(spine_rounds, "spine_fill", fill)
    monkeypatch.setattr(spine_rounds, "_polished", lambda problem, sched, *a: sched)
    cur, lines = spine_rounds.rounds(p, base, 2, 1.0, 4, 0.0, dataclasses.replace(FREE, seed=5))
    assert cur is base and seeds == [5, 6]  # a new seed each round
    assert lines == ["round 0: 1/2 hidden at 0.1 us: kept", "round 1: 0/2 hidden at 0.1 us: dropped"]


def test_a_round_that_gains_nothing_widens_the_next(monkeypatch) -> None:
    """Radius 4 up to 16: no order (next 8), the given order again (kept, no gain: next 16),
    another order as short and as hidden (16 again: the top), the optimum c1, d, w1, x, c2, a, b,
    w2, z (65 ns, both hidden: a gain, so back to 4), then 8. Lines name the radius."""
    p = _short_fillers()
    base = Schedule.original(p)
    same = Schedule(("c1", "b", "a", "d", "w1", "x", "c2", "w2", "z"))
    best = Schedule(("c1", "d", "w1", "x", "c2", "a", "b", "w2", "z"))
    assert [(simulate(p, s).makespan_ns, simulate(p, s).n_hidden_hideable_members) for s in (same, best)] == \
        [(95, 1), (65, 2)]
    outs = iter([None, base, same, best, best])
    radii = []

    def fill(problem, sched, budget, config, time_s, radius, solve_s):
        radii.append(radius)
        return next(outs)

    monkeypatch.setattr(spine_rounds, "spine_fill", fill)
    monkeypatch.setattr(spine_rounds, "_polished", lambda problem, sched, *a: sched)
    cur, lines = spine_rounds.rounds(p, base, 5, 1.0, 4, 0.0, FREE, max_radius=16)
    assert radii == [4, 8, 16, 16, 4] and cur is best
    assert lines[0] == "round 0 (radius 4): no order" and lines[3] == "round 3 (radius 16): 2/2 hidden at 0.1 us: kept"


@pytest.mark.parametrize("flag", [["--rounds", "0"], ["--radius", "0"], ["--round-s", "0"], ["--cap", "2"],
                                  ["--radius", "8", "--max-radius", "4"]])
def test_bad_arguments_are_refused(tmp_path, flag) -> None:
    with pytest.raises(SystemExit) as exc:
        spine_rounds.main(["p.json", "s.json", *flag, "-o", str(tmp_path / "o.json")])
    assert exc.value.code == 2


def test_the_offline_recipe_solves_then_runs_the_rounds() -> None:
    """On the chain above the recipe's solve already reaches the optimum (65 ns, total compute,
    both hidden); a round keeps it (no fewer hidden within the cap). One line for the solve, one
    per round; the schedule is valid."""
    p = _short_fillers()
    cfg = SolveConfig(seed=0, workers=1, deterministic=True)
    out, lines = spine_rounds.offline(p, 1.0, cfg, n_rounds=1, round_s=1.0)
    assert not check_schedule(p, out)
    r = simulate(p, out)
    assert (r.makespan_ns, r.n_hidden_hideable_members) == (65, 2)
    assert len(lines) == 2 and lines[0].startswith("solve 1 s: 2/2 hidden at 0.1 us (")
    assert lines[1].startswith("round 0 (radius 8): ")  # the rounds widen up to OFFLINE_MAX_RADIUS
    out0, lines0 = spine_rounds.offline(p, 1.0, cfg, n_rounds=0)
    assert len(lines0) == 1 and simulate(p, out0).n_hidden_hideable_members == 2
