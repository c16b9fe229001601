"""CP-SAT next to the heuristics on every zoo graph, at given time budgets.

    python -m fxsched.benchmarks.cpsat --budgets 10 60 --out benchmarks/RESULTS.md

Writes (or replaces) the section between the CP-SAT markers of the results file. Columns:
exposed and makespan (us, simulated H100), peak vs the original order, collectives after
bucketing, lower bound and gap as ``solve`` reports them, status, method and wall time.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

from ..fxbridge.extract import extract_problem
from ..heuristics import HEURISTICS
from ..solver import simulate
from ..solver.cpsat import SolveConfig, solve
from .zoo import ZOO, build

BEGIN, END = "<!-- cpsat:begin -->", "<!-- cpsat:end -->"
ROW_HEURISTICS = ("overlap", "bucket+overlap")


def _row(label: str, res, orig, extra: str = "") -> str:  # noqa: ANN001
    return (f"| {label} | {res.exposed_ns / 1e3:,.1f} | {res.makespan_ns / 1e3:,.1f} | "
            f"{res.peak_memory_bytes / orig.peak_memory_bytes:.3f} | {res.n_collectives} | {extra}")


def run(names: list[str], budgets: list[float], workers: int) -> str:
    out = [BEGIN, "## CP-SAT (issue 4)", "",
           f"Made by `python -m fxsched.benchmarks.cpsat --budgets {' '.join(map(str, budgets))} "
           f"--out benchmarks/RESULTS.md` on {platform.machine()} / Python {platform.python_version()}, "
           f"{workers} worker(s), deterministic mode. Times in us of simulated H100 time. `bound` is the "
           "lower bound on the makespan that `solve` reports (on large graphs, where it searches "
           "neighbourhoods of the incumbent, that is the total compute only).", ""]
    for name in names:
        zg = build(name)
        for part, gm in (("forward", zg.forward), ("backward", zg.backward)):
            p = extract_problem(gm, groups={g.name: g.size for g in zg.groups.values()}, name=f"{name}/{part}").problem
            orig = simulate(p)
            out += [f"### {p.name}", "", "| scheduler | exposed | makespan | peak vs orig | collectives | "
                    "bound / gap / status / method / wall s |", "|---|---|---|---|---|---|"]
            out.append(_row("original", orig, orig))
            for h in ROW_HEURISTICS:
                t0 = time.perf_counter()
                s = HEURISTICS[h](p)
                out.append(_row(h, simulate(p, s), orig, f"wall {time.perf_counter() - t0:.2f}"))
            for b in budgets:
                t0 = time.perf_counter()
                r = solve(p, b, SolveConfig(workers=workers))
                wall = time.perf_counter() - t0
                out.append(_row(f"cpsat {b:g}s", simulate(p, r.schedule), orig,
                                f"{r.lower_bound / 1e3:,.1f} / {r.gap:.2%} / {r.status.value} / {r.method} / {wall:.1f}"))
            out.append("")
    out.append(END)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budgets", nargs="*", type=float, default=[10.0, 60.0])
    ap.add_argument("--graphs", nargs="*", default=[n for n in ZOO if not n.endswith("_small")])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    text = run(args.graphs, args.budgets, args.workers)
    if not args.out:
        print(text)
        return 0
    path = Path(args.out)
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip() + "\n\n" + text + "\n"
    path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
