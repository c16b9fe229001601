"""Scheduler benchmark: every full zoo graph, every scheduler, scored by the one simulator.

Run: ``python -m fxsched.benchmarks.schedulers [--out benchmarks/RESULTS.md]``. Writes one
table per graph and part (forward/backward): the problem summary, a row for the original
order and for each heuristic (with its run time), and the lower bound on exposed time.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

from ..fxbridge.report import graph_summary, rows_table, scheduler_rows
from .zoo import ZOO, build

COMMAND = "python -m fxsched.benchmarks.schedulers --out benchmarks/RESULTS.md"


def run(names: list[str], profile: str = "h100") -> str:
    """Markdown report of the original order of each graph in ``names``."""
    out = [
        "# fxsched benchmark results",
        "",
        f"Made by `{COMMAND}` on {platform.machine()} / Python {platform.python_version()}, "
        f"hardware profile `{profile}`, fused pointwise costs. All times in microseconds of "
        "simulated H100 time; every row is scored by the one simulator. `solve s` is the "
        "scheduler's own run time on this 2-core machine. `peak vs orig` is relative to the "
        "original order. The lower bound holds for unbucketed schedules in any compute order.",
        "",
    ]
    for name in names:
        t0 = time.perf_counter()
        zg = build(name)
        trace_s = time.perf_counter() - t0
        cfg = zg.config
        out += [f"## {name}", "",
                f"{cfg.layers} layers, dim {cfg.dim}, ffn {cfg.ffn_dim}, seq {cfg.seq_len}, "
                f"world {cfg.world_size} ({cfg.parallelism}, tp {cfg.tp_size}, "
                f"{cfg.gpus_per_node} GPUs/node); traced in {trace_s:.1f} s.", ""]
        for part in ("forward", "backward"):
            t0 = time.perf_counter()
            ext = zg.extract(part, profile=profile)
            extract_s = time.perf_counter() - t0
            problem = ext.problem
            out += [f"### {part}: {len(getattr(zg, part).graph.nodes)} FX nodes, extracted in {extract_s:.2f} s", ""]
            out += [f"- {label.strip()}: {value}" for label, value in graph_summary(problem)]
            out += ["", "```", rows_table(problem, scheduler_rows(problem)), "```", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="write the markdown here (default: stdout)")
    parser.add_argument("--graphs", nargs="*", default=[n for n in ZOO if not n.endswith("_small")])
    parser.add_argument("--profile", default="h100")
    args = parser.parse_args(argv)
    text = run(args.graphs, args.profile)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
