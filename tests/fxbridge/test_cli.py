"""The command line: demo, export and simulate on a small zoo graph."""

from __future__ import annotations

import re

from fxsched.fxbridge.cli import main
from fxsched.solver import load_problem, simulate


def test_export_then_simulate_round_trip(tmp_path, capsys):
    path = tmp_path / "p.json"
    assert main(["export", "--graph", "llama_fsdp_8r_small", "-o", str(path)]) == 0
    problem = load_problem(path)
    assert len(problem.collectives) == 9 * 2 + 3 + 9 * 2 + 2  # reduce_scatters + re-gathers (2 layers)
    capsys.readouterr()
    assert main(["simulate", str(path)]) == 0
    table = capsys.readouterr().out
    expected = simulate(problem)
    row = next(line for line in table.splitlines() if line.startswith("original order"))
    assert f"{expected.makespan_ns / 1e3:,.1f}" in row


def test_demo_prints_table(capsys):
    assert main(["demo", "--graph", "llama_ddp_small", "--time-limit", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^cpsat 1s \(\w+\)\s", out, re.M)
    assert "cpsat: " in out and "gap" in out
    assert "all_reduce on group" in out
    assert re.search(r"^original order\s", out, re.M)
    assert "lower bound on exposed time" in out
