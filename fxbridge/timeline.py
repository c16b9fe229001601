"""Timelines of a schedule: per-op spans, a per-collective table, and a Chrome/Perfetto trace.

Every number comes from the one simulator (``solver.simulator.simulate``): its per-collective
timings (issue, start, end, wait, stall) and its memory curve. :func:`build_timeline` only lays
the compute stream out op by op around those timings, so that a trace can show each op; it
re-derives the compute clock from op runtimes and bucket copy prices and raises if that clock
disagrees with the simulator anywhere (at any wait, any issue, or the makespan).

The per-collective table compares the original order ("initial") with a schedule ("final") and
names what limits each collective's hiding in the final schedule, in this order:

* ``hidden``: its wait does not stall;
* ``no independent compute``: every positive-cost compute op depends on it or feeds it, so no
  order can hide it (the simulator's ``hideable`` flag);
* ``FIFO behind <c>``: it queued behind collective ``<c>`` of its group, and would have stalled
  less had it started when issued;
* ``data dependency``: the compute between its last producer and its first consumer in this
  order is shorter than the collective, so no placement of its issue and wait hides it;
* ``memory budget``: there is room to issue it earlier or wait on it later, but doing so (as far
  as needed) would lift the memory curve above the budget (default: the original order's peak);
* ``placement``: there is room and memory for a better placement that this schedule did not take
  (other collectives may compete for the same window).

For each hideable exposed one, "to fill its stall" says what running more compute before its
wait, moved in from later in the order, would take without exposing another collective
(:func:`..solver.stall_fill.stall_fill`): the later wait with too little slack that the compute
must come from beyond, how much, and how much there depends on no wait in between. Where the
movable compute falls short, no move of compute alone hides it: a wait, a bucket or the issue
order has to change too.

Nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..solver.problem import OpKind, ScheduleProblem
from ..solver.schedule import Schedule, placements
from ..solver.simulator import CollectiveTiming, SimResult, simulate
from ..solver.stall_fill import StallFill, stall_fills


class TimelineError(RuntimeError):
    """The op-by-op layout disagrees with the simulator (a bug, never a user error)."""


@dataclass(frozen=True)
class Span:
    """One interval on the compute stream: an op, a bucket copy, or a wait stall."""

    name: str
    kind: str  # "compute" | "copy_in" | "copy_out" | "stall"
    start_ns: int
    end_ns: int
    op: str  # the op (compute), or the collective (copies, stalls)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Timeline:
    """A schedule laid out in time. ``position_ns[i]``: compute clock when position i begins."""

    problem: ScheduleProblem
    schedule: Schedule
    sim: SimResult
    spans: tuple[Span, ...]
    position_ns: tuple[int, ...]

    @property
    def collectives(self) -> tuple[CollectiveTiming, ...]:
        return self.sim.collectives


def display_name(members: Sequence[str]) -> str:
    """A collective's name, or a bucket's first member and how many more it carries."""
    return members[0] if len(members) == 1 else f"{members[0]} (+{len(members) - 1})"


def build_timeline(problem: ScheduleProblem, schedule: Schedule | None = None,
                   sim: SimResult | None = None) -> Timeline:
    """Lay ``schedule`` (default: the original order) out op by op, checked against the simulator."""
    schedule = schedule or Schedule.original(problem)
    sim = sim or simulate(problem, schedule)
    ops, costs = problem.op_by_name, problem.bucket_costs
    places = placements(problem, schedule)
    issue_at = {p.issue_pos: p for p in places}
    wait_at = {p.wait_pos: p for p in places}
    timing = {c.members: c for c in sim.collectives}
    spans: list[Span] = []
    starts: list[int] = []
    t = 0

    def check(what: str, expected: int) -> None:
        if t != expected:
            raise TimelineError(f"{problem.name}: {what}: layout clock {t} ns, simulator {expected} ns")

    for i, name in enumerate(schedule.order):
        starts.append(t)
        op = ops[name]
        if op.kind in (OpKind.COMPUTE, OpKind.ZERO):
            if op.runtime_ns:
                spans.append(Span(name, "compute", t, t + op.runtime_ns, name))
                t += op.runtime_ns
        elif i in issue_at:
            p = issue_at[i]
            label = display_name(p.members)
            if len(p.members) > 1:
                copy = costs.copy_ns(sum(ops[m].collective.bytes_in for m in p.members))  # type: ignore[union-attr]
                spans.append(Span(f"copy-in {label}", "copy_in", t, t + copy, p.members[0]))
                t += copy
            check(f"issue of {label}", timing[p.members].issue_ns)
        elif i in wait_at:
            p = wait_at[i]
            c = timing[p.members]
            label = display_name(p.members)
            check(f"wait on {label}", c.wait_ns)
            if c.exposed_ns:
                spans.append(Span(f"wait {label}", "stall", t, t + c.exposed_ns, p.members[0]))
                t += c.exposed_ns
            info = ops[p.members[0]].collective
            assert info is not None
            if len(p.members) > 1 and info.kind.bucket_copies_out:
                copy = costs.copy_ns(sum(ops[m].collective.bytes_out for m in p.members))  # type: ignore[union-attr]
                spans.append(Span(f"copy-out {label}", "copy_out", t, t + copy, p.members[0]))
                t += copy
    check("makespan", sim.makespan_ns)
    return Timeline(problem, schedule, sim, tuple(spans), tuple(starts))


# ---------------------------------------------------------------- per-collective table


@dataclass(frozen=True)
class CollectiveRow:
    """One collective (or bucket) of the final schedule, against the original order."""

    name: str
    members: tuple[str, ...]
    kind: str
    group: str
    size_bytes: int  # larger of input and output, summed over members
    runtime_ns: int
    initial_exposed_ns: int
    final_exposed_ns: int
    fifo_delay_ns: int
    hideable: bool
    limiting: str
    detail: str = ""
    fill: str = ""  # what filling its stall with compute from later takes (solver.stall_fill)


def collective_rows(problem: ScheduleProblem, schedule: Schedule | None = None, *,
                    memory_budget_bytes: int | None = None, initial: Timeline | None = None,
                    final: Timeline | None = None) -> list[CollectiveRow]:
    """The per-collective table of ``schedule`` (default: the original order), by issue order."""
    initial = initial or build_timeline(problem)
    final = final or (initial if schedule is None else build_timeline(problem, schedule))
    budget = initial.sim.peak_memory_bytes if memory_budget_bytes is None else memory_budget_bytes
    init_of = {m: c for c in initial.collectives for m in c.members}
    analysis = _Analysis(problem, final, budget)
    fills = {id(c): f for c, f in zip(final.sim.collectives, stall_fills(problem, final.sim, final.schedule.order))}
    prev_in_group: dict[str, CollectiveTiming] = {}
    rows = []
    for c in final.collectives:  # sorted by issue position: FIFO order per group
        prev = prev_in_group.get(c.group)
        prev_in_group[c.group] = c
        infos = [problem.op_by_name[m].collective for m in c.members]
        initial_exposed = sum({id(init_of[m]): init_of[m].exposed_ns for m in c.members}.values())
        limiting, detail = analysis.limiting(c, prev)
        fill = fills[id(c)]
        rows.append(CollectiveRow(
            name=display_name(c.members), members=c.members, kind=infos[0].kind.value, group=c.group,  # type: ignore[union-attr]
            size_bytes=sum(max(i.bytes_in, i.bytes_out) for i in infos),  # type: ignore[union-attr]
            runtime_ns=c.runtime_ns, initial_exposed_ns=initial_exposed, final_exposed_ns=c.exposed_ns,
            fifo_delay_ns=c.fifo_delay_ns, hideable=c.hideable, limiting=limiting, detail=detail,
            fill="" if fill is None or not c.hideable else fill_text(fill),
        ))
    return rows


class _Analysis:
    """What stops one collective of a laid-out schedule from being hidden (see module doc)."""

    def __init__(self, problem: ScheduleProblem, tl: Timeline, budget: int):
        self.p, self.tl, self.budget = problem, tl, budget
        self.order = tl.schedule.order
        self.pos = {n: i for i, n in enumerate(self.order)}
        ops = problem.op_by_name
        # ops that pin a window edge: positive-cost compute, collectives and waits
        self.fixed = [ops[n].kind is not OpKind.ZERO and not (ops[n].kind is OpKind.COMPUTE and not ops[n].runtime_ns)
                      for n in self.order]
        self.rt = [ops[n].runtime_ns if ops[n].kind is OpKind.COMPUTE else 0 for n in self.order]
        last_use: dict[str, int] = {}
        for i, n in enumerate(self.order):
            for s in ops[n].uses:
                last_use[s] = i
        self.last_use = last_use
        self.curve = tl.sim.memory_curve

    def _related(self, members: tuple[str, ...], bits: list[int]) -> int:
        mask = 0
        for m in members:
            mask |= bits[self.p.index[m]]
        return mask

    def _edge(self, mask: int, positions: range) -> int | None:
        """First position in ``positions`` holding a pinned op whose bit is in ``mask``."""
        idx = self.p.index
        for i in positions:
            if self.fixed[i] and mask >> idx[self.order[i]] & 1:
                return i
        return None

    def limiting(self, c: CollectiveTiming, prev: CollectiveTiming | None) -> tuple[str, str]:
        if c.exposed_ns == 0:
            return "hidden", ""
        if not c.hideable:
            return "no independent compute", "every compute op depends on it or feeds it"
        without_fifo = max(0, c.issue_ns + c.runtime_ns - c.wait_ns)
        if c.fifo_delay_ns > 0 and prev is not None and without_fifo < c.exposed_ns:
            return (f"FIFO behind {display_name(prev.members)}",
                    f"queued {_us(c.fifo_delay_ns)} us; {_us(without_fifo)} us exposed without the queue")
        p, n = self.p, len(self.order)
        waits = tuple(p.wait_of[m] for m in c.members)
        producer = self._edge(self._related(c.members, p.ancestors), range(c.issue_pos - 1, -1, -1))
        consumer = self._edge(self._related(waits, p.descendants), range(c.wait_pos + 1, n))
        lo = -1 if producer is None else producer
        hi = n if consumer is None else consumer
        before = sum(self.rt[lo + 1:c.issue_pos])
        inside = sum(self.rt[c.issue_pos + 1:c.wait_pos])
        after = sum(self.rt[c.wait_pos + 1:hi])
        if before + inside + after < c.runtime_ns:
            src = "graph start" if producer is None else self.order[producer]
            dst = "graph end" if consumer is None else self.order[consumer]
            return "data dependency", f"{_us(before + inside + after)} us of compute between {src} and {dst}"
        need = c.exposed_ns
        ops = p.op_by_name
        out_bytes = sum(p.storage_by_name[s].size_bytes for m in c.members for s in ops[m].allocates)
        in_bytes = sum(p.storage_by_name[s].size_bytes for m in c.members for s in ops[m].uses
                       if not p.storage_by_name[s].never_freed and self.last_use.get(s, -1) <= c.wait_pos)
        peaks = []
        for side, rng, extra in (("issue earlier", range(c.issue_pos - 1, lo, -1), out_bytes),
                                 ("wait later", range(c.wait_pos + 1, hi), in_bytes)):
            gain, peak, moved = 0, 0, False
            for i in rng:
                if gain >= need:
                    break
                gain += self.rt[i]
                peak = max(peak, self.curve[i] + extra)
                moved = True
            if not moved or gain == 0:
                continue
            if peak <= self.budget:
                return "placement", f"{side} by {_us(gain)} us of compute would fit in memory"
            peaks.append((side, peak))
        if peaks:
            side, peak = min(peaks, key=lambda x: x[1])
            return "memory budget", (f"{side}: peak {_mib(peak)} MiB > budget {_mib(self.budget)} MiB")
        return "placement", "room in the window, not used by this schedule"


def fill_text(f: StallFill) -> str:
    """One line for the table's "to fill its stall" column: the later wait where filling the stall
    with compute moved in from later is hardest, what it needs and how much could move."""
    est = "" if f.exact else " (an upper estimate: later collectives released by compute)"
    where = "its wait" if f.tightest is None else f"{display_name(f.tightest)} ({_us(f.tightest_slack_ns)} us slack)"
    return f"needs {_us(f.need_ns)} us of compute from after {where}, {_us(f.movable_ns)} us movable{est}"


def _us(ns: int) -> str:
    return f"{ns / 1e3:,.1f}"


def _mib(b: int) -> str:
    return f"{b / 2**20:,.2f}"


def collective_table(rows: Sequence[CollectiveRow]) -> str:
    """A fixed-width text table of :func:`collective_rows`, with a total line."""
    head = ["collective", "kind", "group", "MiB", "runtime us", "initial exposed us", "final exposed us",
            "fifo wait us", "limiting factor", "to fill its stall"]
    body = [[r.name, r.kind, r.group, _mib(r.size_bytes), _us(r.runtime_ns), _us(r.initial_exposed_ns),
             _us(r.final_exposed_ns), _us(r.fifo_delay_ns), r.limiting, r.fill] for r in rows]
    total = ["total", "", "", _mib(sum(r.size_bytes for r in rows)), _us(sum(r.runtime_ns for r in rows)),
             _us(sum(r.initial_exposed_ns for r in rows)), _us(sum(r.final_exposed_ns for r in rows)),
             _us(sum(r.fifo_delay_ns for r in rows)), "", ""]
    widths = [max(len(x) for x in col) for col in zip(head, *body, total)]
    left = {0, 1, 2, 8, 9}

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body), line(total)])


def rows_to_json(rows: Sequence[CollectiveRow]) -> list[dict[str, Any]]:
    return [{**r.__dict__, "members": list(r.members)} for r in rows]


# ---------------------------------------------------------------- Chrome / Perfetto trace

PID = 1
COMPUTE_TID = 0


def group_tids(problem: ScheduleProblem) -> dict[str, int]:
    """Track id of each process group (compute is track 0)."""
    return {g: i + 1 for i, g in enumerate(sorted(g.name for g in problem.groups))}


def chrome_trace(tl: Timeline, rows: Sequence[CollectiveRow] | None = None, label: str = "") -> dict[str, Any]:
    """Trace-event JSON (``chrome://tracing``, ui.perfetto.dev): one track for the compute
    stream (ops, bucket copies, wait stalls as ``stall`` events), one per process group, and a
    memory counter. Times are microseconds; exact nanoseconds are in ``args``."""
    p = tl.problem
    tids = group_tids(p)
    sizes = {g.name: g.size for g in p.groups}
    by_members = {r.members: r for r in rows or ()}
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "tid": COMPUTE_TID, "name": "process_name",
         "args": {"name": f"fxsched {p.name}" + (f" ({label})" if label else "")}},
        {"ph": "M", "pid": PID, "tid": COMPUTE_TID, "name": "thread_name", "args": {"name": "compute"}},
        {"ph": "M", "pid": PID, "tid": COMPUTE_TID, "name": "thread_sort_index", "args": {"sort_index": 0}},
    ]
    for g, tid in tids.items():
        ev.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name",
                   "args": {"name": f"pg {g} (size {sizes[g]})"}})
        ev.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    ops = p.op_by_name
    for s in tl.spans:
        args: dict[str, Any] = {"dur_ns": s.dur_ns}
        if s.kind == "compute":
            op = ops[s.op]
            args.update(target=op.target, heavy=op.heavy)
            if op.module:
                args["module"] = op.module
        else:
            args["collective"] = s.op
        ev.append({"ph": "X", "pid": PID, "tid": COMPUTE_TID, "name": s.name, "cat": s.kind,
                   "ts": s.start_ns / 1e3, "dur": s.dur_ns / 1e3, "args": args})
    for c in tl.collectives:
        info = ops[c.members[0]].collective
        assert info is not None
        name = display_name(c.members)
        args = {"members": list(c.members), "kind": info.kind.value,
                "bytes": sum(ops[m].collective.size_bytes for m in c.members),  # type: ignore[union-attr]
                "dur_ns": c.runtime_ns, "issue_ns": c.issue_ns, "fifo_delay_ns": c.fifo_delay_ns,
                "wait_ns": c.wait_ns, "exposed_ns": c.exposed_ns, "hideable": c.hideable}
        row = by_members.get(c.members)
        if row is not None:
            args["limiting"] = row.limiting
        tid = tids[c.group]
        ev.append({"ph": "i", "s": "t", "pid": PID, "tid": tid, "name": f"issue {name}", "cat": "issue",
                   "ts": c.issue_ns / 1e3})
        ev.append({"ph": "X", "pid": PID, "tid": tid, "name": name, "cat": "collective",
                   "ts": c.start_ns / 1e3, "dur": c.runtime_ns / 1e3, "args": args})
    last = None
    for i, mem in enumerate(tl.sim.memory_curve):
        mib = round(mem / 2**20, 3)
        if mib != last:
            ev.append({"ph": "C", "pid": PID, "tid": COMPUTE_TID, "name": "memory", "ts": tl.position_ns[i] / 1e3,
                       "args": {"MiB": mib}})
            last = mib
    sim = tl.sim
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ns",
        "otherData": {"problem": p.name, "schedule": label, "makespan_ns": sim.makespan_ns,
                      "exposed_ns": sim.exposed_ns, "compute_ns": sim.compute_ns, "comm_ns": sim.comm_ns,
                      "peak_memory_bytes": sim.peak_memory_bytes, "collectives": sim.n_collectives},
    }


def write_trace(tl: Timeline, path: str | Path, rows: Sequence[CollectiveRow] | None = None,
                label: str = "") -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(tl, rows, label), separators=(",", ":")))
    return path
