"""Never-stall probe: an order whose compute stream never waits, and the peak it needs.

    fxsched export --graph llama_fsdp_32r_4n --part backward -o p.json
    python -m fxsched.benchmarks.never_stall p.json

Where every compute op feeds a collective (:func:`..solver.bounds.exposed_after_compute`), an
answer that hides all but one collective has a compute stream that never stalls. The solver ranks
schedules by makespan and, on a communication-bound graph, gathers its stalls into one at the head
(the makespan is the comm stream's either way), so its answers say nothing about whether such an
order exists. This probe builds one directly and reports the peak memory it took; it ignores the
memory budget, so the answer bounds the question from one side: within this peak a never-stalling
order exists, and a smaller budget is the only thing in its way.

The list scheduler, on the shared simulator's clocks (prefixes are scored exactly: what comes
after a prefix cannot change the prefix's clocks or memory):
- gathers are issued in their program order, one unit at a time (a module's gathers bucketed, the
  first ``singles`` of them alone), each just in time: once the comm stream would otherwise run
  dry before the next compute op in program order ends (``issue_pad_ns`` of slack), so a
  gathered weight is not held longer than it must be;
- reduce-scatters are bucketed by ``rs_depth`` levels of their module path, ``rs_span`` such
  groups to a bucket (fewer launches, a shorter comm stream), and a bucket is issued only when
  the gathers due next still arrive ``margin_ns`` before the compute that needs them (estimated
  from the program order), so it never delays them; the casts that only feed a reduce-scatter
  run when it is issued, so the smaller tensor they read stays live until then instead of their
  output;
- compute goes in program order; where the next op would wait on a gather, the op among the next
  ``window`` that can run without waiting and adds the least memory per nanosecond runs instead;
- reduce-scatter waits go where their collective has ended; the collective issued last is waited
  first, after all compute, so it alone can stall.

Two steps bring the probe closer to a memory budget without giving up a hidden collective:
``after`` pairs (``--after OP:FOLLOWS``) hold an op behind another where a memory argument says it
must be (a gather that cannot be in flight during a transient), and :func:`polish_peak`
(``--polish-rounds``) reorders windows of the probe's order with CP-SAT to lower its peak, each
window ending no later than before, so nothing stalls that did not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from ..solver import Schedule, simulate
from ..solver.problem import CollectiveKind, OpKind, ScheduleProblem
from ..solver.serialization import load_problem, save_schedule
from ..solver.simulator import SimResult, memory_curve, timed_clocks


@dataclass(frozen=True)
class ProbeConfig:
    """Knobs of the list scheduler (times in ns)."""

    singles: int = 20  # the first gathers (program order) issued alone, not in their module's bucket
    issue_pad_ns: int = 50_000  # a gather goes out once the comm stream has less than the next op's time + this queued
    margin_ns: int = 500_000  # a reduce-scatter may not push a due gather closer than this to its use
    horizon: int = 4  # gather units checked against a reduce-scatter issue
    window: int = 400  # program-order compute ops considered as fill
    rs_depth: int = 2  # module-path levels a reduce-scatter bucket shares ("layers.7")
    rs_span: int = 3  # consecutive such groups per reduce-scatter bucket

    def __post_init__(self) -> None:
        for name in ("singles", "issue_pad_ns", "margin_ns", "horizon", "window", "rs_depth", "rs_span"):
            if getattr(self, name) < 0:
                raise ValueError(f"ProbeConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.rs_span < 1:
            raise ValueError(f"ProbeConfig.rs_span must be >= 1, got {self.rs_span}")


def _units(problem: ScheduleProblem, kind: CollectiveKind, singles: int, depth: int = 3,
           span: int = 1) -> list[tuple[str, ...]]:
    """The collectives of ``kind`` in program order, grouped by the first ``depth`` levels of their
    module path, ``span`` consecutive groups of one process group and dtype to a unit; the first
    ``singles`` collectives alone."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for op in problem.collectives:
        info = op.collective
        if info.kind is kind:  # type: ignore[union-attr]
            path = ".".join((op.module or "").split(".")[:depth])
            groups.setdefault((path, info.group, info.dtype), []).append(op.name)  # type: ignore[union-attr]
    units: list[list[str]] = []
    count, prev = 0, None
    for (_, group, dtype), names in groups.items():
        if units and count < span and prev == (group, dtype):
            units[-1].extend(names)
            count += 1
        else:
            units.append(list(names))
            count, prev = 1, (group, dtype)
    alone = [m for u in units for m in u][:singles]
    rest = [tuple(m for m in u if m not in alone) for u in units]
    return [(m,) for m in alone] + [u for u in rest if u]


class _Builder:
    """The growing prefix and its exact clocks and memory (see the module doc)."""

    def __init__(self, problem: ScheduleProblem, buckets: list[tuple[str, ...]]):
        self.p, self.buckets = problem, buckets
        self.placed: set[str] = set()
        self.prefix: list[str] = []

    def closure(self, targets: list[str] | tuple[str, ...]) -> list[str]:
        """``targets`` and their unplaced ancestors, in program order."""
        seen: set[str] = set()
        stack = list(targets)
        while stack:
            n = stack.pop()
            if n in self.placed or n in seen:
                continue
            seen.add(n)
            stack.extend(self.p.op_by_name[n].deps)
        return sorted(seen, key=self.p.index.__getitem__)

    def score(self, extra: list[str]) -> tuple[dict[str, int], list[int], list[int], int]:
        """Collective ends, compute clocks and memory of prefix + ``extra`` (completed in program order)."""
        order = self.prefix + extra
        inside = set(order)
        full = order + [o.name for o in self.p.ops if o.name not in inside]
        buckets = tuple(b for b in self.buckets if len(b) > 1 and all(m in inside for m in b))
        sched = Schedule(tuple(full), buckets)
        timings, clocks = timed_clocks(self.p, sched)
        _, curve = memory_curve(self.p, sched)
        ends = {m: t.end_ns for t in timings for m in t.members}
        return ends, clocks, curve, len(order)

    def place(self, names: list[str]) -> None:
        for n in names:
            self.placed.add(n)
            self.prefix.append(n)


def never_stall(problem: ScheduleProblem, config: ProbeConfig = ProbeConfig(),
                after: dict[str, str] | None = None) -> tuple[Schedule, SimResult]:
    """Build an order whose compute stream tries never to wait (see the module doc); memory is not
    capped. Returns the schedule and its simulation.

    ``after`` maps an op to one it must follow: a memory argument the list scheduler cannot make
    itself (on the 4-node backward, the lm_head's gather cannot be in flight while the loss
    gradient holds three logits-sized buffers, so it goes after ``sub_2``). Such an op is not
    issued or run as fill before its op; where the gather due next waits on one, what that op
    needs runs first. :func:`broken_after` says whether each held in the result."""
    p = problem
    after = after or {}
    for a, b_ in after.items():
        for name in (a, b_):
            if name not in p.op_by_name:
                raise ValueError(f"never_stall: after names an op the problem does not have: {name!r}")
    kind = {o.name: o.kind for o in p.ops}
    rt = {o.name: o.runtime_ns for o in p.ops}
    ags = _units(p, CollectiveKind.ALL_GATHER, config.singles)
    rss = _units(p, CollectiveKind.REDUCE_SCATTER, 0, config.rs_depth, config.rs_span)
    if rss:  # the reduce-scatter last in program order goes alone, last: the one unit left to stall
        tail = max((m for u in rss for m in u), key=p.index.__getitem__)
        rss = [u for u in (tuple(m for m in u if m != tail) for u in rss) if u] + [(tail,)]
    last = rss[-1] if rss else ()
    rs_units = set(rss)
    b = _Builder(p, ags + rss)

    def pending(seq: list[str]) -> list[str]:  # what ops of seq must follow and is not placed yet
        return [after[x] for x in seq if x in after and after[x] not in b.placed]

    def blocked(seq: list[str]) -> bool:
        return bool(pending(seq))

    feeds_rs = _feeds_only_reduce_scatters(p)
    timed = [o.name for o in p.ops if o.kind is OpKind.COMPUTE and o.runtime_ns > 0 and o.name not in feeds_rs]
    rank = {n: i for i, n in enumerate(timed)}
    first_use = {}
    for u in ags:
        desc = 0
        for m in u:
            desc |= p.descendants[p.index[p.wait_of[m]]]
        first_use[u] = next((n for n in timed if desc >> p.index[n] & 1), None)

    def due_in(u: tuple[str, ...]) -> int:  # compute left before the gather's first use
        use = first_use[u]
        return sum(rt[n] for n in (timed[:rank[use]] if use else timed) if n not in b.placed)

    issued: list[tuple[str, ...]] = []
    next_ag = 0
    while True:
        ends, clocks, curve, n_placed = b.score([])
        now = clocks[n_placed - 1] if n_placed else 0
        comm_end = max([ends[u[0]] for u in issued] or [0])
        done = [p.wait_of[m] for u in issued if u in rs_units
                and p.wait_of[u[0]] not in b.placed and ends[u[0]] <= now for m in u]
        if done:
            b.place(b.closure(done))
            continue
        nxt = next((n for n in timed if n not in b.placed), None)
        if next_ag < len(ags) and comm_end - now <= (rt[nxt] if nxt else 0) + config.issue_pad_ns:
            seq = b.closure(ags[next_ag])
            if not any(kind[n] is OpKind.WAIT for n in seq) and not blocked(seq):
                b.place(seq)
                issued.append(ags[next_ag])
                next_ag += 1
                continue
            first = b.closure(pending(seq))
            if first and not any(kind[n] is OpKind.WAIT or kind[n] is OpKind.COLLECTIVE for n in first):
                b.place(first)  # run what the gather must follow, then issue it
                continue
        # a reduce-scatter is ready when placing it runs no compute but its deferred up-casts
        ready = [u for u in rss if u != last and u not in issued
                 and all(n in u or kind[n] is OpKind.ZERO or kind[n] is OpKind.COMPUTE and (rt[n] == 0 or n in feeds_rs)
                         for n in b.closure(u))]
        if ready:
            fits = next_ag >= len(ags)
            if not fits:
                end, fits = max(comm_end, now) + p.bucket_runtime_ns(ready[0]), True
                for u in ags[next_ag:next_ag + config.horizon]:
                    end += p.bucket_runtime_ns(u)
                    if end > now + due_in(u) - config.margin_ns:
                        fits = False
                        break
            if fits:
                b.place(b.closure(ready[0]))
                issued.append(ready[0])
                continue
        pick = _pick_compute(b, timed, ends, now, curve, n_placed, config.window, blocked)
        if pick is None:
            if next_ag < len(ags):  # everything left waits on a gather not yet issued
                b.place(b.closure(ags[next_ag]))
                issued.append(ags[next_ag])
                next_ag += 1
                continue
            break
        b.place(pick)
    for u in rss:
        if u not in issued and u != last:
            b.place(b.closure(u))
    if last:
        b.place(b.closure(last))
        b.place(b.closure([p.wait_of[last[0]]]))
    b.place(b.closure([o.name for o in p.ops if o.name not in b.placed]))
    sched = Schedule(tuple(b.prefix), tuple(u for u in ags + rss if len(u) > 1))
    return sched, simulate(p, sched)


def _feeds_only_reduce_scatters(p: ScheduleProblem) -> set[str]:
    """Up-casts (compute ops that write more bytes than they read) whose every use, through views,
    is a reduce-scatter's input: placed with their collective, so the smaller tensor they read stays
    live until then instead of their output."""
    users = p.users
    out: set[str] = set()
    for op in reversed(p.ops):
        if op.kind is OpKind.COLLECTIVE or not users[op.name]:
            continue
        ok = True
        for u in users[op.name]:
            uop = p.op_by_name[u]
            if uop.kind is OpKind.COLLECTIVE and uop.collective.kind is CollectiveKind.REDUCE_SCATTER:  # type: ignore[union-attr]
                continue
            if uop.kind is OpKind.ZERO and u in out:
                continue
            ok = False
            break
        if ok and (op.kind is OpKind.ZERO or op.kind is OpKind.COMPUTE):
            out.add(op.name)
    size = p.storage_by_name

    def grows(name: str) -> bool:  # writes more than it reads: an up-cast
        op = p.op_by_name[name]
        return sum(size[st].size_bytes for st in op.allocates) > sum(size[st].size_bytes for st in set(op.uses))

    return {n for n in out if p.op_by_name[n].kind is OpKind.COMPUTE and grows(n)}


def _pick_compute(b: _Builder, timed: list[str], ends: dict[str, int], now: int, curve: list[int],
                  n_placed: int, window: int, blocked: Callable[[list[str]], bool]) -> list[str] | None:
    """The next program-order compute op with its unplaced ancestors, or, where it would wait on a
    gather (or is ``blocked``), the fill among the next ``window`` that waits on nothing, is not
    blocked and adds the least memory per nanosecond of compute; else the first not blocked."""
    p = b.p
    cands = []
    for n in timed:
        if n in b.placed:
            continue
        seq = b.closure([n])
        if any(p.op_by_name[x].kind is OpKind.COLLECTIVE for x in seq):
            continue
        stall = max([ends[p.op_by_name[x].waits_on] - now for x in seq  # type: ignore[index]
                     if p.op_by_name[x].waits_on] + [0])
        cands.append((n, seq, stall))
        if len(cands) >= window:
            break
    if not cands:
        return None
    if cands[0][2] <= 0 and not blocked(cands[0][1]):
        return cands[0][1]
    base = curve[n_placed - 1] if n_placed else 0
    best: tuple[float, list[str]] | None = None
    for n, seq, stall in cands:
        if stall > 0 or blocked(seq):
            continue
        _, _, c2, l2 = b.score(seq)
        work = sum(p.op_by_name[x].runtime_ns for x in seq) or 1
        key = (c2[l2 - 1] - base) / work
        if best is None or key < best[0]:
            best = (key, seq)
    if best:
        return best[1]
    return next((seq for _, seq, _ in cands if not blocked(seq)), cands[0][1])


@dataclass(frozen=True)
class OverRun:
    """A run of program positions whose memory exceeds a budget: where an order needs more."""

    first: int
    last: int
    peak_bytes: int
    at: str  # the op at the run's highest position


def over_budget_runs(order: tuple[str, ...], curve: tuple[int, ...] | list[int], budget_bytes: int,
                     gap: int = 3) -> list[OverRun]:
    """The runs of positions of a simulated order (``curve``: its memory per position) over
    ``budget_bytes`` (runs closer than ``gap`` positions merged), in program order."""
    runs: list[list[int]] = []
    for i, m in enumerate(curve):
        if m > budget_bytes:
            if runs and i - runs[-1][-1] <= gap:
                runs[-1].append(i)
            else:
                runs.append([i])
    out = []
    for r in runs:
        top = max(r, key=lambda i: curve[i])
        out.append(OverRun(r[0], r[-1], curve[top], order[top]))
    return out


def _excess(curve: list[int] | tuple[int, ...], budget_bytes: int) -> int:
    """Bytes over the budget, summed over the positions."""
    return sum(m - budget_bytes for m in curve if m > budget_bytes)


def broken_after(order: tuple[str, ...], after: dict[str, str]) -> list[tuple[str, str]]:
    """The ``(op, must follow)`` pairs of ``after`` that ``order`` breaks."""
    pos = {n: i for i, n in enumerate(order)}
    return [(a, b) for a, b in after.items() if pos[a] < pos[b]]


@dataclass(frozen=True)
class PolishConfig:
    """Knobs of :func:`polish_peak`."""

    rounds: int = 8  # window models solved at most
    window: int = 100  # ops that take time (compute, issues, waits) per window
    time_s: float = 60.0  # per window: wall-clock seconds, or deterministic units when deterministic
    deterministic: bool = False
    seed: int = 0
    workers: int = 2

    def __post_init__(self) -> None:
        if self.rounds < 0 or self.window < 1 or self.time_s <= 0 or self.workers < 1:
            raise ValueError(f"PolishConfig: rounds >= 0, window >= 1, time_s > 0, workers >= 1; got {self}")


def polish_peak(problem: ScheduleProblem, sched: Schedule, budget_bytes: int, config: PolishConfig = PolishConfig(),
                after: dict[str, str] | None = None) -> tuple[Schedule, SimResult, list[str]]:
    """Lower ``sched``'s peak where it exceeds ``budget_bytes`` without slowing any of it: rounds of
    truncated free windows (solver/cpsat_window.py) around the highest run over the budget,
    three quarters of the window before the run's top (the fill that costs memory comes before
    it). A truncated window ends no later than the incumbent's and holds everything after it at
    the incumbent's times, so no collective ends later and no wait stalls longer (the list
    scheduler's probe order stays stall-free); its model here minimizes the peak. The ``after`` pairs that
    ``sched`` keeps hold in it as pins (a pair it breaks would leave no window a solution). The
    simulator then scores the answer, kept when it hides no fewer collectives at a lower peak,
    or at the same peak with less memory over the budget in all (runs of one height go down one
    at a time). Stops when the order fits, after ``config.rounds`` windows, or when a window
    around every run was tried since the last gain. Returns the schedule, its simulation and a
    line per round."""
    from ortools.sat.python import cp_model

    from ..solver.cpsat_hint import add_hint, decode
    from ..solver.cpsat_model import ModelBuilder
    from ..solver.cpsat_window import window_around, window_frame

    kept_pairs = set((after or {}).items()) - set(broken_after(sched.order, after or {}))
    pins = tuple((b, a) for a, b in sorted(kept_pairs))  # ModelBuilder's pin (a, b): a runs before b
    res = simulate(problem, sched)
    log: list[str] = []
    tried: set[str] = set()  # the runs' tops windowed since the last kept round
    for _ in range(config.rounds):
        runs = sorted(over_budget_runs(sched.order, res.memory_curve, budget_bytes), key=lambda r: -r.peak_bytes)
        run = next((r for r in runs if r.at not in tried), None)
        if run is None:
            break
        tried.add(run.at)
        lo, hi = window_around(problem, sched, sched.order.index(run.at), config.window, config.window * 3 // 4)
        frame = window_frame(problem, sched, lo, hi, truncate=True)
        if frame is None:
            continue
        builder = ModelBuilder(frame, None, pins)
        builder.build()
        builder.model.Minimize(builder.v.peak)
        add_hint(builder, sched)
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.random_seed, prm.num_workers = config.seed, config.workers
        if config.deterministic:
            prm.max_deterministic_time = config.time_s
        else:
            prm.max_time_in_seconds = config.time_s
        status = solver.Solve(builder.model)
        line = f"window {lo}..{hi} around {run.at} ({run.peak_bytes / budget_bytes:.4f}x the budget): "
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            log.append(line + solver.StatusName(status))
            continue
        new = decode(builder, solver)
        new_res = simulate(problem, new)
        kept = (new_res.n_hidden_hideable_members >= res.n_hidden_hideable_members
                and (new_res.peak_memory_bytes, _excess(new_res.memory_curve, budget_bytes))
                < (res.peak_memory_bytes, _excess(res.memory_curve, budget_bytes)))
        log.append(line + f"peak {new_res.peak_memory_bytes / budget_bytes:.4f}x, hidden "
                   f"{new_res.n_hidden_hideable_members}: " + ("kept" if kept else "dropped"))
        if kept:
            sched, res = new, new_res
            tried.clear()
            if res.peak_memory_bytes <= budget_bytes:
                break
    return sched, res, log


def _after_pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise argparse.ArgumentTypeError(f"--after wants OP:FOLLOWS, got {text!r}")
    return a, b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fxsched.benchmarks.never_stall", description=__doc__.splitlines()[0])
    ap.add_argument("problem", help="problem file from `fxsched export`")
    ap.add_argument("--singles", type=int, default=ProbeConfig.singles)
    ap.add_argument("--issue-pad-us", type=float, default=ProbeConfig.issue_pad_ns / 1e3)
    ap.add_argument("--margin-us", type=float, default=ProbeConfig.margin_ns / 1e3)
    ap.add_argument("-o", "--output", help="schedule file to write")
    ap.add_argument("--rs-depth", type=int, default=ProbeConfig.rs_depth)
    ap.add_argument("--rs-span", type=int, default=ProbeConfig.rs_span)
    ap.add_argument("--after", type=_after_pair, action="append", default=[], metavar="OP:FOLLOWS",
                    help="OP goes after FOLLOWS (repeatable; see never_stall's `after`)")
    ap.add_argument("--polish-rounds", type=int, default=0,
                    help="CP-SAT windows that lower the peak without slowing the order (polish_peak)")
    ap.add_argument("--polish-window", type=int, default=PolishConfig.window)
    ap.add_argument("--polish-s", type=float, default=PolishConfig.time_s, help="seconds per window model")
    a = ap.parse_args(argv)
    config = ProbeConfig(singles=a.singles, issue_pad_ns=int(a.issue_pad_us * 1e3), margin_ns=int(a.margin_us * 1e3),
                         rs_depth=a.rs_depth, rs_span=a.rs_span)
    problem = load_problem(a.problem)
    after = dict(a.after)
    sched, r = never_stall(problem, config, after)
    peak0 = simulate(problem, Schedule.original(problem)).peak_memory_bytes
    if a.polish_rounds:
        _report(problem, sched, r, peak0, after)
        sched, r, log = polish_peak(problem, sched, peak0, PolishConfig(rounds=a.polish_rounds, window=a.polish_window,
                                                                        time_s=a.polish_s), after)
        for line in log:
            print(f"  polish: {line}")
    _report(problem, sched, r, peak0, after)
    if a.output:
        save_schedule(sched, a.output)
    return 0


def _report(problem: ScheduleProblem, sched: Schedule, r: SimResult, peak0: int, after: dict[str, str]) -> None:
    stalled = [c for c in r.collectives if c.exposed_ns]
    print(f"{problem.name}: hidden {r.n_hidden_hideable_members}/{r.n_hideable_members} collectives, "
          f"exposed units {len(stalled)}, peak {r.peak_memory_bytes / peak0:.3f}x the original order's, "
          f"makespan {r.makespan_ns / 1e3:,.1f} us")
    for c in stalled:
        print(f"  stalls: {c.name} ({len(c.members)} member(s)) {c.exposed_ns / 1e3:,.1f} us")
    for run in over_budget_runs(sched.order, r.memory_curve, peak0):
        print(f"  over the original peak at positions {run.first}-{run.last}: "
              f"{run.peak_bytes / peak0:.3f}x at {run.at}")
    for op, follows in broken_after(sched.order, after):
        print(f"  broken: {op} runs before {follows}")


if __name__ == "__main__":
    raise SystemExit(main())
