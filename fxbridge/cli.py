"""The ``fxsched`` command line. Subcommands: ``demo``, ``export``, ``simulate``."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ..solver.cpsat import SolveConfig, solve
from ..solver.serialization import load_problem, load_schedule, save_problem
from ..solver.simulator import simulate
from .report import Row, graph_summary, original_row, rows_table, scheduler_rows


def _trace(args: argparse.Namespace):  # noqa: ANN202 - returns (ZooGraph, Extraction, seconds)
    from ..benchmarks.zoo import build
    from .extract import extract_problem

    t0 = time.perf_counter()
    zg = build(args.graph, layers=args.layers)
    t_trace = time.perf_counter() - t0
    gm = zg.backward if args.part == "backward" else zg.forward
    t0 = time.perf_counter()
    ext = extract_problem(gm, groups={g.name: g.size for g in zg.groups.values()}, profile=args.profile,
                          fuse=not args.unfused, name=f"{zg.name}/{args.part}")
    return zg, ext, t_trace, time.perf_counter() - t0


def cmd_demo(args: argparse.Namespace) -> int:
    """Trace a built-in Llama graph on CPU with a fake process group, schedule it, print the table."""
    zg, ext, t_trace, t_extract = _trace(args)
    problem = ext.problem
    print(f"fxsched demo: {problem.name}  ({zg.config.layers} layers, world {zg.config.world_size}, "
          f"profile {args.profile}, {'unfused' if args.unfused else 'fused'} pointwise costs)")
    print(f"traced in {t_trace:.1f} s, extracted in {t_extract:.2f} s; "
          f"{len(ext.graph_module.graph.nodes)} FX nodes")
    for label, value in graph_summary(problem):
        print(f"  {label}: {value}")
    print()
    rows = scheduler_rows(problem)
    if args.time_limit > 0:
        t0 = time.perf_counter()
        # wall-clock limit: the demo is one process; ranks of a job use the deterministic default
        res = solve(problem, args.time_limit, SolveConfig(workers=args.workers, deterministic=False))
        rows.append(Row(f"cpsat {args.time_limit:g}s ({res.status.value})", simulate(problem, res.schedule),
                        time.perf_counter() - t0))
    print(rows_table(problem, rows))
    if args.time_limit > 0:
        print(f"cpsat: {res.method}, lower bound {res.lower_bound / 1e3:,.1f} us on the makespan, gap {res.gap:.2%}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a zoo graph's problem to a JSON file."""
    _, ext, _, _ = _trace(args)
    save_problem(ext.problem, args.output)
    print(f"wrote {args.output}: {len(ext.problem.ops)} ops, {len(ext.problem.collectives)} collectives")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Score a problem file (original order, or a schedule file) with the simulator."""
    problem = load_problem(args.problem)
    rows = [original_row(problem)]
    if args.schedule:
        rows.append(Row(args.schedule, simulate(problem, load_schedule(args.schedule))))
    print(rows_table(problem, rows))
    return 0


def _graph_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="llama_fsdp_8r", help="zoo graph name (default: %(default)s)")
    p.add_argument("--layers", type=int, default=None, help="override the zoo graph's layer count")
    p.add_argument("--part", choices=("forward", "backward"), default="backward")
    p.add_argument("--profile", default="h100", help="hardware profile (default: %(default)s)")
    p.add_argument("--unfused", action="store_true", help="charge each pointwise op its own memory traffic")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxsched", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help=cmd_demo.__doc__)
    p.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT budget in seconds (0: skip)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT workers (deterministic either way)")
    _graph_args(p)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("export", help=cmd_export.__doc__)
    _graph_args(p)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("simulate", help=cmd_simulate.__doc__)
    p.add_argument("problem")
    p.add_argument("--schedule", default=None)
    p.set_defaults(func=cmd_simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
