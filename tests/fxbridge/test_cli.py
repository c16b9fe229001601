"""The command line: demo, export (zoo graph or user script), simulate, solve, install, report."""

from __future__ import annotations

import io
import json
import re
import textwrap

import pytest

from fxsched.fxbridge.cache import ScheduleCache, graph_fingerprint
from fxsched.fxbridge.cli import ProgressLine, build_parser, load_script_graph, main
from fxsched.solver import check_schedule, load_problem, load_schedule, simulate
from fxsched.solver.cpsat import Progress
from fxsched.solver.fingerprint import recorded_fingerprint


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The small FSDP backward graph exported once for the whole module (tracing takes seconds)."""
    path = tmp_path_factory.mktemp("export") / "p.json"
    assert main(["export", "--graph", "llama_fsdp_8r_small", "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def solved(exported, tmp_path_factory):
    """``fxsched solve`` on it, deterministic, 2 units of CP-SAT time, one worker."""
    out = tmp_path_factory.mktemp("solve")
    capture = pytest.MonkeyPatch()
    err = io.StringIO()
    capture.setattr("sys.stderr", err)
    try:
        rc = main(["solve", str(exported), "--time-limit", "2", "--deterministic", "--workers", "1",
                   "-o", str(out / "s.json"), "--cache-dir", str(out / "cache")])
    finally:
        capture.undo()
    return rc, out, err.getvalue()


def test_export_then_simulate_round_trip(exported, capsys):
    problem = load_problem(exported)
    assert len(problem.collectives) == 9 * 2 + 3 + 9 * 2 + 2  # reduce_scatters + re-gathers (2 layers)
    assert recorded_fingerprint(problem) is not None  # what `solve --cache-dir` keys the schedule by
    assert main(["simulate", str(exported)]) == 0
    table = capsys.readouterr().out
    expected = simulate(problem)
    row = next(line for line in table.splitlines() if line.startswith("original order"))
    assert f"{expected.makespan_ns / 1e3:,.1f}" in row


def test_demo_prints_table(capsys):
    assert main(["demo", "--graph", "llama_ddp_small", "--time-limit", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    for mode in ("fixed", "free"):
        assert re.search(rf"^cpsat {mode} 1s \(\w+\)\s", out, re.M)
        assert f"cpsat {mode}: " in out
    assert "gap" in out
    assert "all_reduce on group" in out
    assert re.search(r"^original order\s", out, re.M)
    assert "lower bound on exposed time" in out


def test_solve_writes_a_valid_schedule_and_caches_it(exported, solved):
    rc, out, err = solved
    assert rc == 0
    problem = load_problem(exported)
    schedule = load_schedule(out / "s.json")
    assert check_schedule(problem, schedule) == []
    assert simulate(problem, schedule).makespan_ns <= simulate(problem).makespan_ns
    assert err.startswith("solving llama_fsdp_8r_small/backward") and "\r" not in err  # not a tty: plain lines
    fp = recorded_fingerprint(problem)
    entry = ScheduleCache(out / "cache").get_entry(fp, problem)
    assert entry.schedule == schedule and entry.solve.config["deterministic"] is True
    assert entry.solve.objective_ns == simulate(problem, schedule).makespan_ns


def test_solve_needs_an_output(exported, capsys):
    assert main(["solve", str(exported), "--time-limit", "1"]) == 2
    assert "-o/--output" in capsys.readouterr().err


def test_report_writes_table_trace_and_gantt(exported, solved, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _, out, _ = solved
    assert main(["report", str(exported), "--schedule", str(out / "s.json"), "--out-dir", str(tmp_path)]) == 0
    stdout = capsys.readouterr().out
    assert "limiting factor" in stdout and "initial exposed us" in stdout
    problem = load_problem(exported)
    sim = simulate(problem, load_schedule(out / "s.json"))
    trace = json.loads((tmp_path / "trace.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sum(e["dur"] for e in xs if e["tid"] == 0) * 1e3 == pytest.approx(sim.makespan_ns)
    assert sum(e["args"]["dur_ns"] for e in xs if e["cat"] == "stall") == sim.exposed_ns
    assert sum(e["args"]["dur_ns"] for e in xs if e["cat"] == "collective") == sim.comm_ns
    original = json.loads((tmp_path / "trace_original.json").read_text())
    assert original["otherData"]["makespan_ns"] == simulate(problem).makespan_ns
    rows = json.loads((tmp_path / "collectives.json").read_text())
    assert len(rows) == sim.n_collectives
    assert sum(r["final_exposed_ns"] for r in rows) == sim.exposed_ns
    assert sum(r["initial_exposed_ns"] for r in rows) == simulate(problem).exposed_ns
    assert all(r["limiting"] for r in rows)
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- user scripts

SCRIPT = textwrap.dedent('''
    import torch
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    c10d = torch.ops._c10d_functional


    def make_graph():
        """x -> all_gather(w) -> mm, with an independent mm to hide the gather behind."""
        with FakeTensorMode():
            shard, full, full_w = torch.empty(512, 2048), torch.empty(2048, 2048), torch.empty(2048, 2048)
            x, y = torch.empty(2048, 2048), torch.empty(2048, 2048)
        g = fx.Graph()
        vals = {}
        def node(target, args, val):
            n = g.call_function(target, args)
            n.meta["val"] = val
            return n
        p, px = g.placeholder("primals_1"), g.placeholder("primals_2")
        p.meta["val"], px.meta["val"] = shard, x
        ag = node(c10d.all_gather_into_tensor.default, (p, 4, "dp"), full)
        indep = node(torch.ops.aten.mm.default, (px, px), y)
        w = node(c10d.wait_tensor.default, (ag,), full_w)
        mm = node(torch.ops.aten.mm.default, (indep, w), y)
        g.output((mm,))
        return fx.GraphModule(torch.nn.Module(), g), {"dp": 4}


    def not_a_graph():
        return 42
''')


def test_script_export_solve_and_compile_side_lookup(tmp_path, capsys):
    """The offline flow end to end: export a user graph, solve into a cache, then find the schedule
    again from a fresh trace of the graph alone, as a compile would."""
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    assert main(["export", "--script", str(script), "-o", str(tmp_path / "p.json")]) == 0
    printed = capsys.readouterr().out
    problem = load_problem(tmp_path / "p.json")
    fp = recorded_fingerprint(problem)
    assert fp is not None and f"fingerprint {fp}" in printed and problem.name == "model:make_graph"
    assert main(["solve", str(tmp_path / "p.json"), "--time-limit", "1", "--deterministic",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    # compile side: a re-trace, extracted with the same settings
    from fxsched.fxbridge.extract import extract_problem

    gm, groups, _ = load_script_graph(str(script))
    fresh = extract_problem(gm, groups=groups, profile="h100", fuse=True, name="graph").problem
    assert graph_fingerprint(gm, fresh, profile="h100", fuse=True) == fp
    schedule = ScheduleCache(tmp_path / "cache").lookup(fp, fresh)
    assert schedule is not None and check_schedule(fresh, schedule) == []
    # another profile is another cache key: a miss, not a wrong schedule
    other = extract_problem(gm, groups=groups, profile="a100").problem
    assert ScheduleCache(tmp_path / "cache").lookup(graph_fingerprint(gm, other, profile="a100"), other) is None


def test_script_errors_are_clear(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    for spec, msg in [(f"{script}:not_a_graph", "returned int"), (f"{script}:nope", "no function 'nope'"),
                      (str(tmp_path / "missing.py"), "no such file")]:
        assert main(["export", "--script", spec, "-o", str(tmp_path / "p.json")]) == 2
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_install_command(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    assert main(["export", "--script", str(script), "-o", str(tmp_path / "p.json")]) == 0
    problem = load_problem(tmp_path / "p.json")
    from fxsched.solver import Schedule, save_schedule

    save_schedule(Schedule.original(problem), tmp_path / "s.json")
    assert main(["install", str(tmp_path / "s.json"), str(tmp_path / "p.json"), "--cache-dir", str(tmp_path / "c")]) == 0
    assert ScheduleCache(tmp_path / "c").get(recorded_fingerprint(problem), problem) == Schedule.original(problem)
    assert main(["install", str(tmp_path / "s.json"), str(tmp_path / "p.json"), "--cache-dir", str(tmp_path / "c"),
                 "--fingerprint", "0" * 64]) == 2
    assert "records fingerprint" in capsys.readouterr().err


# ---------------------------------------------------------------- progress line


def test_progress_line_tty_and_plain():
    tty = io.StringIO()
    line = ProgressLine(tty, tty=True)
    line(Progress(0.5, 2000, 1000))
    line(Progress(0.6, 2000, 1000))  # no change: nothing printed
    line(Progress(1.0, 1500, 1200))
    line.close()
    text = tty.getvalue()
    assert text.count("\r") == 2 and text.count("\x1b[K") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "gap 50.00%" in text and "gap 20.00%" in text
    plain = io.StringIO()
    line = ProgressLine(plain, tty=False)
    line(Progress(0.5, 2000, 1000))
    line(Progress(0.6, 2000, 1000))
    line(Progress(1.0, 1500, 1200))
    line.close()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in plain.getvalue()
    assert re.search(r"makespan 1\.5 us\s+bound 1\.2 us\s+gap 20\.00%", lines[1])


def test_cli_verbosity_counts() -> None:
    """``-v`` asks for INFO, ``-vv`` for DEBUG (each warm-start step's makespan)."""
    assert [build_parser().parse_args([*v, "simulate", "p.json"]).verbose for v in ([], ["-v"], ["-vv"])] == [0, 1, 2]


@pytest.mark.parametrize(("flag", "value"), [("--hide-slack", "-0.1"), ("--hide-slack", "2"), ("--hide-slack", "a lot"),
                                           ("--spine-radius", "0"), ("--spine-radius", "-2"), ("--spine-radius", "wide")])
def test_solve_refuses_a_slack_outside_its_share_or_a_radius_below_one(exported, tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        main(["solve", str(exported), flag, value, "-o", str(tmp_path / "s.json")])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.1", "0.5", "many"])
def test_solve_spine_share_must_be_under_half(exported, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["solve", str(exported), "--spine-share", value, "-o", str(tmp_path / "s.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--spine-share" in err and "[0, 0.5)" in err


def test_solve_passes_the_spine_share(monkeypatch, exported, tmp_path):
    import fxsched.fxbridge.cli as cli

    seen = []
    real = cli.solve
    monkeypatch.setattr(cli, "solve", lambda p, t, config, **k: seen.append(config.spine_share) or real(p, t, config, **k))
    main(["solve", str(exported), "--mode", "free", "--spine-share", "0.25", "--time-limit", "1", "-o", str(tmp_path / "s.json")])
    assert seen == [0.25]


def test_solve_starts_from_the_hint_with_the_spine_radius(monkeypatch, exported, tmp_path):
    """``--hint``: the schedule file reaches ``solve`` as its hint; ``--spine-radius`` its config."""
    import fxsched.fxbridge.cli as cli
    from fxsched.solver import Schedule
    from fxsched.solver.serialization import load_problem, save_schedule

    problem = load_problem(exported)
    hint_file = tmp_path / "hint.json"
    save_schedule(Schedule.original(problem), hint_file, problem.name)
    seen = []
    real = cli.solve
    monkeypatch.setattr(cli, "solve", lambda p, t, config, **k: seen.append((config.spine_radius, k["hint"]))
                        or real(p, t, config, **k))
    main(["solve", str(exported), "--mode", "free", "--hint", str(hint_file), "--spine-radius", "8",
          "--time-limit", "1", "-o", str(tmp_path / "s.json")])
    assert seen == [(8, Schedule.original(problem))]


def test_solve_rejects_a_hint_that_is_no_schedule_of_the_problem(exported, tmp_path, capsys):
    """A hint in reverse program order: the error names the flag, the file and the first violation."""
    from fxsched.solver import Schedule
    from fxsched.solver.serialization import load_problem, save_schedule

    problem = load_problem(exported)
    hint_file = tmp_path / "reversed.json"
    save_schedule(Schedule(tuple(reversed(Schedule.original(problem).order))), hint_file, problem.name)
    assert main(["solve", str(exported), "--hint", str(hint_file), "-o", str(tmp_path / "s.json")]) != 0
    err = capsys.readouterr().err
    assert f"--hint {hint_file}: not a valid schedule of {problem.name}: wait_before_collective: 'wait_tensor_" in err
    assert "violation(s)" in err
    assert not (tmp_path / "s.json").exists()
