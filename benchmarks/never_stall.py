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
"""

from __future__ import annotations

import argparse
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


def never_stall(problem: ScheduleProblem, config: ProbeConfig = ProbeConfig()) -> tuple[Schedule, SimResult]:
    """Build an order whose compute stream tries never to wait (see the module doc); memory is not
    capped. Returns the schedule and its simulation."""
    p = problem
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
            if not any(kind[n] is OpKind.WAIT for n in seq):
                b.place(seq)
                issued.append(ags[next_ag])
                next_ag += 1
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
        pick = _pick_compute(b, timed, ends, now, curve, n_placed, config.window)
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
                  n_placed: int, window: int) -> list[str] | None:
    """The next program-order compute op with its unplaced ancestors, or, where it would wait on a
    gather, the fill among the next ``window`` that waits on nothing and adds the least memory per
    nanosecond of compute."""
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
    if cands[0][2] <= 0:
        return cands[0][1]
    base = curve[n_placed - 1] if n_placed else 0
    best: tuple[float, list[str]] | None = None
    for n, seq, stall in cands:
        if stall > 0:
            continue
        _, _, c2, l2 = b.score(seq)
        work = sum(p.op_by_name[x].runtime_ns for x in seq) or 1
        key = (c2[l2 - 1] - base) / work
        if best is None or key < best[0]:
            best = (key, seq)
    return best[1] if best else cands[0][1]


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fxsched.benchmarks.never_stall", description=__doc__.splitlines()[0])
    ap.add_argument("problem", help="problem file from `fxsched export`")
    ap.add_argument("--singles", type=int, default=ProbeConfig.singles)
    ap.add_argument("--issue-pad-us", type=float, default=ProbeConfig.issue_pad_ns / 1e3)
    ap.add_argument("--margin-us", type=float, default=ProbeConfig.margin_ns / 1e3)
    ap.add_argument("-o", "--output", help="schedule file to write")
    ap.add_argument("--rs-depth", type=int, default=ProbeConfig.rs_depth)
    ap.add_argument("--rs-span", type=int, default=ProbeConfig.rs_span)
    a = ap.parse_args(argv)
    config = ProbeConfig(singles=a.singles, issue_pad_ns=int(a.issue_pad_us * 1e3), margin_ns=int(a.margin_us * 1e3),
                         rs_depth=a.rs_depth, rs_span=a.rs_span)
    problem = load_problem(a.problem)
    sched, r = never_stall(problem, config)
    peak0 = simulate(problem, Schedule.original(problem)).peak_memory_bytes
    stalled = [c for c in r.collectives if c.exposed_ns]
    print(f"{problem.name}: hidden {r.n_hidden_hideable_members}/{r.n_hideable_members} collectives, "
          f"exposed units {len(stalled)}, peak {r.peak_memory_bytes / peak0:.3f}x the original order's, "
          f"makespan {r.makespan_ns / 1e3:,.1f} us")
    for c in stalled:
        print(f"  stalls: {c.name} ({len(c.members)} member(s)) {c.exposed_ns / 1e3:,.1f} us")
    for run in over_budget_runs(sched.order, r.memory_curve, peak0):
        print(f"  over the original peak at positions {run.first}-{run.last}: "
              f"{run.peak_bytes / peak0:.3f}x at {run.at}")
    if a.output:
        save_schedule(sched, a.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
