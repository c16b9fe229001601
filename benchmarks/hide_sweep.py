"""What hiding costs: hidden collectives against makespan, from one answer, at several slacks.

    python -m fxsched.benchmarks.hide_sweep --graphs llama_fsdp_tp_2x4 llama_fsdp_32r_4n \\
        --slacks 0 0.005 0.01 0.02 0.05 --time-limit 60 --out benchmarks/RESULTS.md

The issue asks for 99% of hideable collectives hidden (DESIGN.md: their waits never stall) next
to the makespan targets. The solver ranks schedules by makespan; its last polish hides more
collectives only where the makespan stays (:func:`..heuristics.hide.hide_collectives`, then
:func:`..heuristics.split_buckets.split_buckets`). Here
the free-order answer of one solve within the original order's peak is polished again with the
makespan allowed to grow by each slack (a share of the answer's makespan; ``SolveConfig.hide_slack``
in a solve), so the table shows how many more collectives each microsecond buys. Writes the
section between the hide markers.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass

from ..heuristics.concentrate import concentrate_stalls
from ..heuristics.hide import hide_collectives
from ..heuristics.split_buckets import split_buckets
from ..solver import Schedule, simulate
from ..solver.cpsat import SolveConfig, solve
from ..solver.problem import ScheduleProblem
from ..solver.simulator import SimResult
from ..solver.spine_fill import spine_fill
from .sections import emit, source_revision
from .zoo import ZOO, problems

BEGIN, END = "<!-- hide:begin -->", "<!-- hide:end -->"
TARGET = 0.99  # the share of hideable collectives hidden


@dataclass(frozen=True)
class SlackRow:
    """The answer polished with the makespan allowed ``slack`` above its own."""

    slack: float
    result: SimResult
    wall_s: float
    spine: bool = False  # polished from the spine fill's order (solver/spine_fill.py), not the answer's


def sweep(problem: ScheduleProblem, answer: Schedule, slacks: list[float],
          spine: Schedule | None = None) -> list[SlackRow]:
    """``answer`` polished once per slack (each from ``answer`` itself, within its peak); with
    ``spine`` (the spine fill's order from ``answer``) that order too, its stalls concentrated
    first, with the same caps (shares of the answer's makespan, the answer's peak)."""
    res = simulate(problem, answer)
    starts = [(answer, False)] + ([(concentrate_stalls(problem, spine), True)] if spine is not None else [])
    rows = []
    for start, from_spine in starts:
        for slack in slacks:
            t0 = time.perf_counter()
            cap = int(res.makespan_ns * (1 + slack))
            out = hide_collectives(problem, start, max_makespan_ns=cap, budget_bytes=res.peak_memory_bytes)
            out = split_buckets(problem, out, max_makespan_ns=cap, budget_bytes=res.peak_memory_bytes)
            rows.append(SlackRow(slack, simulate(problem, out), time.perf_counter() - t0, from_spine))
    return rows


def table(problem: ScheduleProblem, rows: list[SlackRow]) -> list[str]:
    """The markdown table of one problem's sweep."""
    orig = simulate(problem)
    out = [f"#### {problem.name}", "",
           "| slack | makespan us | exposed us | hidden/hideable | share | members hidden | not fully exposed | "
           "peak vs orig | 99% | polish s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in rows:
        r = row.result
        share = r.n_hidden_hideable / max(1, r.n_hideable)
        members = r.n_hidden_hideable_members / max(1, r.n_hideable_members)
        peak = r.peak_memory_bytes / max(1, orig.peak_memory_bytes)
        out.append(f"| {'spine fill, ' if row.spine else ''}{row.slack:.1%} | {r.makespan_ns / 1e3:,.1f} | {r.exposed_ns / 1e3:,.1f} | "
                   f"{r.n_hidden_hideable}/{r.n_hideable} | {share:.1%} | "
                   f"{r.n_hidden_hideable_members}/{r.n_hideable_members} | {r.n_overlapped_hideable}/{r.n_hideable} | "
                   f"{peak:.3f} | {'holds' if members >= TARGET else 'fails'} | {row.wall_s:.1f} |")
    return out + [""]


def run(names: list[str], parts: list[str], slacks: list[float], time_limit_s: float, workers: int,
        processes: int, spine_s: float = 0.0) -> str:
    cmd = (f"python -m fxsched.benchmarks.hide_sweep --graphs {' '.join(names)} --parts {' '.join(parts)} "
           f"--slacks {' '.join(f'{s:g}' for s in slacks)} --time-limit {time_limit_s:g} --workers {workers} "
           f"--processes {processes}{f' --spine-s {spine_s:g}' if spine_s else ''} --out benchmarks/RESULTS.md")
    out = [BEGIN, "## What hiding costs (slack sweep)", "",
           f"Made by `{cmd}` at {source_revision()} on {platform.machine()} / Python {platform.python_version()}. "
           f"One free-order solve per graph ({time_limit_s:g} s wall clock, within the original order's peak, "
           "its own polish at no slack included), then its answer polished again with the makespan allowed "
           "to grow by each slack (`slack`: a share of the answer's makespan) and the peak held to the "
           "answer's; each polish is the solver's own: the count-first search, then bucket splits "
           "(`heuristics/split_buckets.py`). `hidden`: units (a bucket or a lone collective) whose waits never stall "
           "(DESIGN.md); `members hidden`: the collectives in them; `99%`: the members' share at least 99%, as "
           "in the compare's summary; `not fully exposed`: Inductor's count. "
           "Times in us of simulated H100 time." + (
               f" `spine fill, x%` rows: the answer's order after {spine_s:g} s of the spine fill "
               "(`solver/spine_fill.py`, `SolveConfig.spine_share`), polished with the same caps "
               "(none when it found nothing within the peak)." if spine_s else ""), ""]
    for p in problems(names, parts):
        config = SolveConfig(mode="free", workers=workers, processes=processes, deterministic=False)
        answer = solve(p, time_limit_s, config).schedule
        t0 = time.perf_counter()
        spine = spine_fill(p, answer, simulate(p, answer).peak_memory_bytes, config, spine_s) if spine_s else None
        if spine_s:
            out += [f"Spine fill on {p.name}: {'an order' if spine is not None else 'nothing'} in "
                    f"{time.perf_counter() - t0:.1f} s.", ""]
        out += table(p, sweep(p, answer, slacks, spine))
    out.append(END)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="*", default=["llama_fsdp_tp_2x4", "llama_fsdp_32r_4n"], choices=sorted(ZOO))
    ap.add_argument("--parts", nargs="*", default=["backward"], choices=["forward", "backward"])
    ap.add_argument("--slacks", nargs="*", type=float, default=[0.0, 0.005, 0.01, 0.02, 0.05],
                    help="shares of the answer's makespan the polish may add")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds of the one solve per graph")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2, help="plan searches side by side (SolveConfig.processes)")
    ap.add_argument("--spine-s", type=float, default=0.0,
                    help="seconds of the spine fill from each answer, polished the same way (default: none)")
    ap.add_argument("--out", default=None, help="write the section into this markdown file (default: stdout)")
    args = ap.parse_args(argv)
    if any(not 0 <= s <= 1 for s in args.slacks):
        ap.error("--slacks must be shares in [0, 1]")
    emit(args.out, BEGIN, END, run(args.graphs, args.parts, args.slacks, args.time_limit, args.workers,
                                   args.processes, args.spine_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
