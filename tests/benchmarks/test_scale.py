"""The scaling benchmark's measurement on a 1-layer graph: consistent numbers, a table, a plot."""

from __future__ import annotations

from pathlib import Path

from fxsched.benchmarks import scale


def test_one_layer_row_table_and_plot(tmp_path: Path) -> None:
    row = scale.measure(1, 1.0, 1, "free", deterministic=True)
    assert row.fx_nodes > 100 and row.collectives > 0
    assert row.compute_ns <= row.bound_ns <= row.cpsat_ns  # the bound holds for every schedule
    assert row.apply_s > 0 and row.extract_s > 0
    assert row.inductor_s is not None and row.inductor_s > 0  # Inductor's pass ran on the same graph
    text = scale.table([row], "--layers 1")
    assert text.startswith(scale.BEGIN) and text.rstrip().endswith(scale.END)
    assert f"| 1 | {row.fx_nodes:,} |" in text
    png = tmp_path / "scale.png"
    scale.plot([row], png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
