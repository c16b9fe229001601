"""Ask whether any order runs its compute stream without a stall within the original peak.

    fxsched export --graph llama_fsdp_32r_4n --part backward -o p.json
    python -m fxsched.benchmarks.stall_proof p.json --cuts sub_2 --least
    python -m fxsched.benchmarks.stall_proof p.json --chain div_9:mm_64 --min-mb 100 --sets-out sets.json

The command line of :func:`..solver.stall_free_cuts.stall_free_cuts`: cuts given by name
(``--cuts``), along the path between two ops that allocates most (``--chain``:
:func:`..solver.cut_memory.memory_chain`, every op on it allocating more than ``--min-mb`` a
cut), or both. ``infeasible`` is a proof that every
schedule within the budget stalls its compute stream before it has run every cut; where
``exposed_after_compute`` holds, such a schedule exposes two units or more. ``--least`` reports
the least memory that every stall-free order reaches at some cut (its bound, when not optimal).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..solver import ProblemError, Schedule, ScheduleProblem, simulate
from ..solver.bounds import exposed_after_compute
from ..solver.serialization import load_problem
from ..solver.cut_memory import memory_chain
from ..solver.stall_free_cuts import CutsConfig, stall_free_cuts

CERTIFICATES = Path(__file__).resolve().parent / "certificates"


def certified_stalls(problem: ScheduleProblem, budget_bytes: int,
                     directory: Path = CERTIFICATES) -> tuple[int, str]:
    """Units exposed in every schedule within ``budget_bytes``, by a stall proof kept for this
    graph part (``<graph>.<part>.stall_proof.json`` in ``directory``: its ``cuts``), checked
    again here: 2 where the relaxation is infeasible and every compute op feeds a collective,
    else 0. The text says what was proven, or why nothing was (a file that no longer proves is
    reported, never trusted); both empty where no proof is kept."""
    path = directory / (problem.name.replace("/", ".") + ".stall_proof.json")
    if not path.exists():
        return 0, ""
    try:
        spec = json.loads(path.read_text())
        cuts = spec["cuts"]
        if not isinstance(cuts, list) or not all(isinstance(c, str) for c in cuts):
            raise ValueError("'cuts' must be a list of op names")
        config = CutsConfig(time_limit_s=float(spec.get("deterministic_s", 30.0)), workers=1, deterministic=True)
        res = stall_free_cuts(problem, cuts, budget_bytes, config)
    except (OSError, ValueError, KeyError, ProblemError) as e:
        return 0, f"stall proof {path.name} unusable: {type(e).__name__}: {e}"
    where = f"the stall proof at cuts {', '.join(cuts)} ({path.name})"
    if not res.proves_stall or not exposed_after_compute(problem):
        return 0, f"{where} proves nothing here: status {res.status}"
    return 2, where


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fxsched.benchmarks.stall_proof", description=__doc__.splitlines()[0])
    ap.add_argument("problem", help="problem file from `fxsched export`")
    ap.add_argument("--chain", metavar="SRC:DST", help="cuts along the path from SRC to DST that allocates most")
    ap.add_argument("--cuts", help="comma-separated compute ops (after --chain's, when both are given)")
    ap.add_argument("--min-mb", type=float, default=100.0, help="--chain: ops allocating more than this are cuts")
    ap.add_argument("--budget", type=float, default=1.0, help="memory budget, a ratio of the original order's peak")
    ap.add_argument("--least", action="store_true", help="minimize the largest memory at the cuts")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds (deterministic time with --deterministic)")
    ap.add_argument("--workers", type=int, default=8,
                    help="CP-SAT workers: 8 runs the portfolio that proves these models, even on 2 cores")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--set-levels", type=int, default=CutsConfig.set_levels,
                    help="head levels per cut whose FIFO sums also take the set's cheapest buckets (0: none)")
    ap.add_argument("--sets-out", metavar="PATH", help="write the answer as JSON: status, cuts, and per cut the set "
                    "of ops before it, its memory and its compute clock (a lead for building an order)")
    a = ap.parse_args(argv)
    problem = load_problem(a.problem)
    if not (a.cuts or a.chain):
        ap.error("give --cuts, --chain or both")
    cuts = []
    if a.chain:
        src, sep, dst = a.chain.partition(":")
        if not sep:
            ap.error(f"--chain {a.chain!r}: expected SRC:DST")
        cuts = memory_chain(problem, src, dst, int(a.min_mb * 1e6))
    cuts += [c for c in (a.cuts or "").split(",") if c and c not in cuts]
    peak0 = simulate(problem, Schedule.original(problem)).peak_memory_bytes
    budget = int(peak0 * a.budget)
    config = CutsConfig(time_limit_s=a.time_limit, workers=a.workers, deterministic=a.deterministic, least=a.least,
                        set_levels=a.set_levels)
    res = stall_free_cuts(problem, cuts, budget, config)
    print(f"{problem.name}: {len(cuts)} cut(s) {','.join(cuts)}")
    print(f"  budget {a.budget:g}x the original peak ({budget:,} B); every compute op feeds a collective: "
          f"{exposed_after_compute(problem)}")
    print(f"  status {res.status} in {res.runtime:.1f} s")
    if res.lower_bound_bytes is not None:
        print(f"  least memory at the cuts: at least {res.lower_bound_bytes / peak0:.4f}x the original peak")
    if res.memory_bytes:
        top = max(range(len(cuts)), key=lambda k: res.memory_bytes[k])
        print(f"  found: largest memory {res.memory_bytes[top] / peak0:.4f}x at {cuts[top]}, "
              f"clock there {res.clocks_ns[top] / 1e3:,.1f} us")
    if res.proves_stall:
        print("  proof: every schedule within the budget stalls its compute stream before it has run every cut")
    if a.sets_out:
        with open(a.sets_out, "w") as fh:
            json.dump({"problem": problem.name, "status": res.status, "budget_bytes": budget, "cuts": cuts,
                       "sets": [list(s) for s in res.sets], "memory_bytes": list(res.memory_bytes),
                       "clocks_ns": list(res.clocks_ns), "lower_bound_bytes": res.lower_bound_bytes}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
