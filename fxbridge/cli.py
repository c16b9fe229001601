"""The ``fxsched`` command line: demo, export, simulate, solve, install, report.

Offline workflow (DESIGN.md, "Offline solve step")::

    fxsched export --script model.py -o problem.json      # records the graph's fingerprint
    fxsched solve problem.json --time-limit 600 --workers 16 -o schedule.json --cache-dir ~/.fxsched
    fxsched report problem.json --schedule schedule.json --out-dir report/

The next compile extracts the same graph with the same settings, computes the same fingerprint
(``fxsched.fxbridge.cache.graph_fingerprint``) and finds the schedule in the cache directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ..solver.cpsat import Progress, SolveConfig, Status, solve
from ..solver.cpsat_config import SPINE_RADIUS
from ..solver.fingerprint import METADATA_KEY, is_fingerprint, recorded_fingerprint
from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.serialization import load_problem, load_schedule, save_problem, save_schedule
from ..solver.simulator import simulate
from .report import Row, fmt_mib, fmt_us, graph_summary, original_row, rows_table, scheduler_rows

log = logging.getLogger(__name__)


class CliError(Exception):
    """A user error: printed as ``fxsched: error: ...`` with exit status 2."""


def _trace(args: argparse.Namespace):
    from ..benchmarks.zoo import build

    t0 = time.perf_counter()
    zg = build(args.graph, layers=args.layers)
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    ext = zg.extract(args.part, profile=args.profile, fuse=not args.unfused)
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
    results = []
    for mode in args.modes if args.time_limit > 0 else ():
        t0 = time.perf_counter()
        # wall-clock limit: the demo is one process; ranks of a job use the deterministic default
        res = solve(problem, args.time_limit, SolveConfig(mode=mode, workers=args.workers, deterministic=False))
        rows.append(Row(f"cpsat {mode} {args.time_limit:g}s ({res.status.value})", simulate(problem, res.schedule),
                        time.perf_counter() - t0))
        results.append((mode, res))
    print(rows_table(problem, rows))
    for mode, res in results:
        print(f"cpsat {mode}: {res.method}, lower bound {res.lower_bound / 1e3:,.1f} us on the makespan, "
              f"gap {res.gap:.2%}")
    return 0


# ---------------------------------------------------------------- export

SCRIPT_HELP = """\
A user graph: --script PATH.py[:FUNCTION] (FUNCTION defaults to make_graph). The file is run as
a module and FUNCTION() is called with no arguments. It must return a post-grad ATen
torch.fx.GraphModule whose nodes carry meta["val"] (FakeTensors, e.g. from make_fx or
aot_function), or a tuple (graph_module, {group_name: group_size}). Process groups whose size is
not returned are looked up in the live c10d registry (e.g. a fake process group the script
initialised). The problem file records the graph's fingerprint, which a later compile of the same
graph (same --profile and --unfused) computes again to find the solved schedule in the cache.
"""


def load_script_graph(spec: str) -> tuple[Any, dict[str, int] | None, str]:
    """(graph_module, group sizes or None, problem name) from ``PATH.py[:FUNCTION]``."""
    from torch import fx

    path_s, fn_name = spec, "make_graph"
    if ":" in spec and not Path(spec).exists():
        path_s, fn_name = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise CliError(f"--script {spec}: no such file {path}")
    mod_spec = importlib.util.spec_from_file_location(f"fxsched_user_script_{path.stem}", path)
    if mod_spec is None or mod_spec.loader is None:
        raise CliError(f"--script {spec}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(path.resolve().parent))  # the script may import its neighbours
    try:
        mod_spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.resolve().parent))
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise CliError(f"--script {spec}: {path} defines no function {fn_name!r}")
    out = fn()
    groups = None
    if isinstance(out, tuple) and len(out) == 2:
        out, groups = out
        if not isinstance(groups, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in groups.items()):
            raise CliError(f"--script {spec}: {fn_name}() returned groups that are not {{group_name: size}}: {groups!r}")
    if not isinstance(out, fx.GraphModule):
        raise CliError(f"--script {spec}: {fn_name}() returned {type(out).__name__}, expected a "
                       "torch.fx.GraphModule or (GraphModule, {group_name: size})")
    return out, groups, f"{path.stem}:{fn_name}"


def cmd_export(args: argparse.Namespace) -> int:
    """Write a graph's problem (zoo graph, or --script) to a JSON file, with its cache fingerprint."""
    from .cache import graph_fingerprint, with_fingerprint
    from .extract import extract_problem

    fuse = not args.unfused
    if args.script:
        gm, groups, name = load_script_graph(args.script)
        problem = extract_problem(gm, groups=groups, profile=args.profile, fuse=fuse, name=name).problem
    else:
        _, ext, _, _ = _trace(args)
        gm, problem = ext.graph_module, ext.problem
    fp = graph_fingerprint(gm, problem, profile=args.profile, fuse=fuse)
    problem = with_fingerprint(problem, fp)
    save_problem(problem, args.output)
    print(f"wrote {args.output}: {len(problem.ops)} ops, {len(problem.collectives)} collectives")
    print(f"fingerprint {fp}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Score a problem file (original order, or a schedule file) with the simulator."""
    problem = load_problem(args.problem)
    rows = [original_row(problem)]
    if args.schedule:
        rows.append(Row(args.schedule, simulate(problem, load_schedule(args.schedule))))
    print(rows_table(problem, rows))
    return 0


# ---------------------------------------------------------------- solve


class ProgressLine:
    """Prints CP-SAT progress to ``stream``: one line rewritten in place (``\\r``) on a terminal,
    one line per change of objective or bound otherwise (logs, CI)."""

    def __init__(self, stream: TextIO, tty: bool | None = None):
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.last: tuple[int, int] | None = None
        self.dirty = False

    def __call__(self, p: Progress) -> None:
        if (p.objective_ns, p.bound_ns) == self.last:
            return
        self.last = (p.objective_ns, p.bound_ns)
        gap = max(0.0, (p.objective_ns - p.bound_ns) / p.objective_ns) if p.objective_ns > 0 else 0.0
        line = (f"[{p.time_s:7.1f} s] makespan {fmt_us(p.objective_ns)} us  bound {fmt_us(p.bound_ns)} us  "
                f"gap {gap:.2%}")
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
            self.dirty = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.dirty:
            self.stream.write("\n")
            self.stream.flush()
            self.dirty = False


def _share(text: str, top: float = 1.0, closed: bool = True) -> float:
    """--hide-slack: a share of the makespan in [0, 1]; --spine-share (``top`` 0.5, open): of the budget."""
    span = f"[0, {top:g}{']' if closed else ')'}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}") from None
    if not (0.0 <= value <= top if closed else 0.0 <= value < top):
        raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}")
    return value


def _spine_share(text: str) -> float:
    """--spine-share: a share of the time budget in [0, 0.5)."""
    return _share(text, 0.5, closed=False)


def _radius(text: str) -> int:
    """--spine-radius: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _hint(problem: ScheduleProblem, path: str) -> Schedule:
    """--hint: a schedule file for ``problem``, checked (the first violation names the op)."""
    hint = load_schedule(path)
    bad = check_schedule(problem, hint)
    if bad:
        raise CliError(f"--hint {path}: not a valid schedule of {problem.name}: {bad[0]} "
                       f"({len(bad)} violation(s))")
    return hint


def _budget(value: str | None) -> int | float | None:
    """--memory-budget: a ratio of the original peak (e.g. 1.1) or bytes (an integer >= 1024)."""
    if value is None:
        return None
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if x <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return int(x) if x >= 1024 else x


def cmd_solve(args: argparse.Namespace) -> int:
    """Solve a problem file with CP-SAT; write the schedule and/or install it in the cache."""
    from .cache import ScheduleCache, SolveInfo

    if not args.output and not args.cache_dir:
        raise CliError("solve: give -o/--output, --cache-dir, or both")
    problem = load_problem(args.problem)
    fp = args.fingerprint or recorded_fingerprint(problem)
    if args.cache_dir and fp is None:
        raise CliError(f"{args.problem}: records no fingerprint (metadata.{METADATA_KEY}); re-export it "
                       "with `fxsched export`, or pass --fingerprint")
    if fp is not None and not is_fingerprint(fp):
        raise CliError(f"--fingerprint {fp!r}: expected 64 lowercase hex digits")
    config = SolveConfig(mode=args.mode, workers=args.workers, seed=args.seed, deterministic=args.deterministic,
                         memory_budget=args.memory_budget, processes=args.processes, hide_slack=args.hide_slack,
                         spine_share=args.spine_share, spine_radius=args.spine_radius)
    hint = _hint(problem, args.hint) if args.hint else None
    base = simulate(problem)
    clock = "deterministic time units" if args.deterministic else "s wall clock"
    print(f"solving {problem.name}: {len(problem.ops)} ops, {len(problem.collectives)} collectives; original "
          f"makespan {fmt_us(base.makespan_ns)} us, exposed {fmt_us(base.exposed_ns)} us; budget {args.time_limit:g} "
          f"{clock}, {args.workers} worker(s), {args.processes} process(es), seed {args.seed}", file=sys.stderr)
    line = ProgressLine(sys.stderr)
    try:
        res = solve(problem, args.time_limit, config, hint=hint, progress=line)
    finally:
        line.close()
    sim = simulate(problem, res.schedule)
    print(f"status {res.status.value} ({res.method}) in {res.runtime:.1f} s")
    print(f"makespan {fmt_us(sim.makespan_ns)} us (original {fmt_us(base.makespan_ns)} us), exposed "
          f"{fmt_us(sim.exposed_ns)} us (original {fmt_us(base.exposed_ns)} us), {sim.n_collectives} collectives")
    print(f"lower bound {fmt_us(res.lower_bound)} us, gap {res.gap:.2%}")
    print(f"peak memory {fmt_mib(sim.peak_memory_bytes)} MiB (budget {fmt_mib(res.budget_bytes)} MiB)")
    if args.output:
        save_schedule(res.schedule, args.output, problem.name)
        print(f"wrote {args.output}")
    if res.status is Status.INFEASIBLE:
        print(f"fxsched: no schedule fits the memory budget (smallest found: "
              f"{fmt_mib(res.min_feasible_budget_bytes or sim.peak_memory_bytes)} MiB); not cached", file=sys.stderr)
        return 1
    if args.cache_dir:
        assert fp is not None
        info = dataclasses.replace(SolveInfo.from_result(res, config), exposed_ns=sim.exposed_ns)
        path = ScheduleCache(args.cache_dir).put(fp, res.schedule, problem=problem, solve=info)
        print(f"cached {path}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """Install a schedule file into the cache under its problem file's fingerprint."""
    from .cache import install

    try:
        path = install(args.schedule, args.problem, args.cache_dir, fingerprint=args.fingerprint)
    except ValueError as e:
        raise CliError(str(e)) from e
    print(f"cached {path}")
    return 0


# ---------------------------------------------------------------- report


def cmd_report(args: argparse.Namespace) -> int:
    """Per-collective table, Chrome/Perfetto trace.json and gantt.png of a schedule vs the original order."""
    from .timeline import build_timeline, collective_rows, collective_table, rows_to_json, write_trace

    problem = load_problem(args.problem)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    initial = build_timeline(problem)
    budget = args.memory_budget
    budget_bytes = budget if isinstance(budget, int) else int(initial.sim.peak_memory_bytes * (budget or 1.0))
    if args.schedule:
        final = build_timeline(problem, load_schedule(args.schedule))
        label = Path(args.schedule).name
    else:
        final, label = initial, "original order"
    rows = collective_rows(problem, None if final is initial else final.schedule,
                           memory_budget_bytes=budget_bytes, initial=initial, final=final)
    table = collective_table(rows)
    (out / "collectives.txt").write_text(table + "\n")
    (out / "collectives.json").write_text(json.dumps(rows_to_json(rows), indent=1))
    write_trace(final, out / "trace.json", rows, label)
    written = ["collectives.txt", "collectives.json", "trace.json"]
    if final is not initial:
        write_trace(initial, out / "trace_original.json", label="original order")
        written.append("trace_original.json")
    summary = [Row("original order", initial.sim)] + ([Row(label, final.sim)] if final is not initial else [])
    print(rows_table(problem, summary))
    print()
    print(table)
    if not args.no_gantt:
        from .gantt import PlotUnavailable, write_gantt

        panels = [("original order", initial)] + ([(label, final)] if final is not initial else [])
        try:
            write_gantt(panels, out / "gantt.png", memory_budget_bytes=budget_bytes)
            written.append("gantt.png")
        except PlotUnavailable as e:
            print(f"fxsched: gantt.png skipped: {e}", file=sys.stderr)
    print(f"\nwrote {', '.join(str(out / w) for w in written)}")
    return 0


# ---------------------------------------------------------------- parser


def _graph_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="llama_fsdp_8r", help="zoo graph name (default: %(default)s)")
    p.add_argument("--layers", type=int, default=None, help="override the zoo graph's layer count")
    p.add_argument("--part", choices=("forward", "backward"), default="backward")
    p.add_argument("--profile", default="h100", help="hardware profile (default: %(default)s)")
    p.add_argument("--unfused", action="store_true", help="charge each pointwise op its own memory traffic")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxsched", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="-v: progress of the solve's steps (INFO); -vv: each step's time and result (DEBUG)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help=cmd_demo.__doc__)
    p.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT budget in seconds (0: skip)")
    p.add_argument("--modes", nargs="+", choices=("fixed", "free"), default=["fixed", "free"],
                   help="CP-SAT rows: fixed heavy-compute order and/or free order (default: both)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT workers (deterministic either way)")
    _graph_args(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("export", help=cmd_export.__doc__, description=f"{cmd_export.__doc__}\n\n{SCRIPT_HELP}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _graph_args(p)
    p.add_argument("--script", metavar="PATH.py[:FUNCTION]", default=None,
                   help="export a user graph instead of a zoo graph (contract above; --graph, --layers and --part are ignored)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("simulate", help=cmd_simulate.__doc__)
    p.add_argument("problem")
    p.add_argument("--schedule", default=None)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("solve", help=cmd_solve.__doc__, description=cmd_solve.__doc__)
    p.add_argument("problem", help="problem file from `fxsched export`")
    p.add_argument("--time-limit", type=float, default=600.0,
                   help="seconds (wall clock), or CP-SAT deterministic time units with --deterministic "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="CP-SAT workers (default: %(default)s)")
    p.add_argument("--processes", type=int, default=1,
                   help="heuristic searches side by side, one process each: the stream plan search from seeds "
                        "seed, seed + 1, ... (communication-bound graphs; default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", action="store_true",
                   help="reproducible search: deterministic time limit, fixed seed and worker count")
    p.add_argument("--mode", choices=("fixed", "free"), default="fixed",
                   help="fixed heavy-compute order (default) or any topological order")
    p.add_argument("--memory-budget", type=_budget, default=None,
                   help="peak-memory budget: ratio of the original peak (e.g. 1.1) or bytes (default: 1.0)")
    p.add_argument("--hide-slack", type=_share, default=0.0,
                   help="share the makespan may grow by to hide more collectives in the final polish, e.g. 0.01 "
                        "(default: %(default)s, never longer)")
    p.add_argument("--spine-share", type=_spine_share, default=0.0,
                   help="free mode: share of the budget for the spine fill, which moves compute into the windows of "
                        "the longest collective chain at once, e.g. 0.25 (default: %(default)s, off)")
    p.add_argument("--spine-radius", type=_radius, default=SPINE_RADIUS,
                   help="slots an op may move in the spine fill; wider lets compute cascade across more windows "
                        "(default: %(default)s)")
    p.add_argument("--hint", default=None,
                   help="schedule file to start the search from instead of the warm start (a longer offline solve "
                        "continued from an earlier one's schedule; one over the memory budget is set aside, "
                        "with a warning)")
    p.add_argument("-o", "--output", default=None, help="schedule file to write")
    p.add_argument("--cache-dir", default=None, help="install the schedule into this cache under the problem's fingerprint")
    p.add_argument("--fingerprint", default=None, help="cache key to use instead of the one the problem file records")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("install", help=cmd_install.__doc__, description=cmd_install.__doc__)
    p.add_argument("schedule")
    p.add_argument("problem")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--fingerprint", default=None, help="cache key to use instead of the one the problem file records")
    p.set_defaults(func=cmd_install)

    p = sub.add_parser("report", help=cmd_report.__doc__, description=cmd_report.__doc__)
    p.add_argument("problem")
    p.add_argument("--schedule", default=None, help="schedule file (default: report the original order)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--memory-budget", type=_budget, default=None,
                   help="budget the limiting-factor analysis uses: ratio of the original peak or bytes (default: 1.0)")
    p.add_argument("--no-gantt", action="store_true", help="skip gantt.png (it needs matplotlib)")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (CliError, ValueError) as e:  # ProblemError, CacheError, ExtractionError: user-facing
        if args.verbose and not isinstance(e, CliError):
            raise
        print(f"fxsched: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
