"""fxsched against Inductor's overlap scheduler, side by side, scored by the one simulator.

    python -m fxsched.benchmarks.compare [--graphs NAME ...] [--budgets 10 60] [--out benchmarks/RESULTS.md]

For every zoo graph (forward and backward) one table with a row for: the original order, each
heuristic of ``fxsched.heuristics.HEURISTICS``, Inductor's ``schedule_overlap_bucketing`` in
each variant of ``inductor_adapter.VARIANTS`` (its default pipeline, with its overlap-preserving
bucketer, and with bucketing off), and fxsched's CP-SAT ``solve`` at each budget. Inductor gets
fxsched's costs through its ``custom_runtime_estimation`` hook and its output is mapped back to
an fxsched schedule (``inductor_adapter`` says how, and which torch functions it patches).

Columns (DESIGN.md "What good means"): exposed comm time, makespan, hidden/hideable
collectives (hidden: its wait does not stall), the same counts in Inductor's sense
(``overlapped``: some compute ran beside it, :attr:`.SimResult.n_overlapped_hideable`; the 99%
target is checked on the stricter count, per graph collective, each bucket counted as its
members: :meth:`PartReport.hidden_target`), collectives after bucketing, peak memory
(absolute and vs the original order),
solve time (the scheduler's own wall time on this machine), a lower bound on the makespan and
the gap to it, how the row was scored, and for Inductor rows its own estimate (exposed time and
hidden/hideable counts as it logs them). Under each table, DESIGN.md's per-collective table of
the best CP-SAT schedule against the original order (initial and final exposed time and what
limits each collective, ``fxbridge.timeline``): counts per limiting factor, and the most exposed
collectives. The bound of a CP-SAT row is the larger of CP-SAT's
proven bound (which holds over its modelled space only: fixed heavy-compute order, its bucket
candidates, the memory budget) and ``makespan_lower_bound`` with the solve's memory budget
(valid for every schedule within it); other rows, which may exceed the budget (Inductor's
default allows +5%), show ``makespan_lower_bound`` without a budget (valid for every schedule).

With ``--offline-budget S``, a part whose summary row fails the 99% hidden target (or hides fewer
than a stall proof kept in benchmarks/certificates/ allows) gets one more
row: the offline recipe (:func:`.spine_rounds.offline`), a longer free-order solve and more spine
rounds, as the offline solve step would run it; the summary gives its verdicts after the online row's.

The section is written between ``<!-- compare:begin -->`` and ``<!-- compare:end -->`` of
``--out`` (replaced if present, appended if not); without ``--out`` it is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import platform
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..fxbridge.extract import Extraction
from ..fxbridge.timeline import CollectiveRow, collective_rows
from ..heuristics import HEURISTICS
from ..solver.bounds import exposed_after_compute, forced_exposed, makespan_lower_bound
from ..solver.cpsat import SolveConfig, resolve_budget, solve
from ..solver.problem import ScheduleProblem
from ..solver.schedule import Schedule
from ..solver.simulator import SimResult, simulate
from .sections import emit, replace_section, source_revision
from .stall_proof import certified_stalls
from .spine_rounds import (OFFLINE_CAP, OFFLINE_HIDE_SLACK, OFFLINE_MAX_RADIUS, OFFLINE_RADIUS, OFFLINE_ROUND_S,
                           OFFLINE_ROUNDS, OFFLINE_SOLVE_S, OFFLINE_SPINE_SHARE, offline)
from .inductor_adapter import (
    VARIANTS,
    InductorReport,
    InductorVariant,
    reextract,
    run_inductor,
    score_inductor,
)
from .zoo import ZOO, build

log = logging.getLogger(__name__)

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
MODULE = "python -m fxsched.benchmarks.compare"
PATCH_NOTE = (
    "Inductor runs under `fxsched.fxbridge.hardware.hardware_context({profile!r})`, which replaces "
    "`torch._inductor.comm_analysis.get_gpu_type`, `._has_nvlink` and its `torch` global "
    "(`cuda.is_available()`/`cuda.device_count()`), and `torch.utils._runtime_estimation."
    "get_gpu_dram_gbps`, `.get_device_tflops`, `.flops_to_ns` with that profile; on a CPU-only "
    "torch `torch.Tensor.copy_` is replaced by a direct `torch.ops.aten.copy_.default` call (its "
    "binding opens a CUDA device guard, which fails on fake CUDA tensors when the bucketer traces a "
    "copy-in). Inductor config: `custom_runtime_estimation` = fxsched's costs, `compute_estimator` "
    "= `collective_estimator` = `analytical`, `enable_fusion_regions` = False (fxsched's costs "
    "already price fusion), `insert_overlap_deps` = False; everything else at its default.")
CRITERION = "fxsched's exposed time at most half of Inductor's, or its makespan within 1% of the proven bound"
PER_COLLECTIVE_ROWS = 12  # exposed collectives listed per graph part (the most exposed first)
HIDDEN_TARGET = 0.99  # of the hideable collectives, where the bounds do not prove it out of reach
OFFLINE = "offline"  # the offline solve's row label starts so (not "cpsat": the summary's row stays the online one)


@dataclass(frozen=True)
class Row:
    """One scheduler's result on one problem, as the table shows it."""

    scheduler: str
    result: SimResult
    solve_s: float
    method: str = "simulated"  # how the simulator scored it (Inductor rows: mapped / re-extracted)
    bound_ns: int | None = None  # a lower bound on the makespan (see module docstring)
    inductor: InductorReport | None = None
    note: str = ""
    schedule: Schedule | None = None  # CP-SAT rows: for the per-collective table

    @property
    def gap(self) -> float | None:
        m = self.result.makespan_ns
        return None if self.bound_ns is None or m <= 0 else max(0.0, (m - self.bound_ns) / m)


@dataclass
class PartReport:
    """The rows of one graph part and the summary verdict."""

    problem: ScheduleProblem
    rows: list[Row]
    global_bound_ns: int
    notes: list[str]
    budget_bound_ns: int | None = None  # the same within the solves' memory budget
    forced_exposed: int = 0  # collectives exposed in every schedule (bounds.forced_exposed)
    budget_bytes: int | None = None  # the solves' memory budget (the per-collective table's "memory budget")
    tail_exposed: bool = False  # a collective is exposed after all compute in every schedule (bounds.exposed_after_compute)
    stall_exposed: int = 0  # units exposed in every schedule within the budget, by a kept stall proof
    stall_proof: str = ""  # which (stall_proof.certified_stalls)

    def best(self, prefix: str) -> Row | None:
        """The row with the least exposed time among rows whose label starts with ``prefix``."""
        rows = [r for r in self.rows if r.scheduler.startswith(prefix)]
        return min(rows, key=lambda r: (r.result.exposed_ns, r.result.makespan_ns)) if rows else None

    def fxsched_row(self) -> Row | None:
        """The best CP-SAT row (either mode) at the largest budget."""
        rows = [r for r in self.rows if r.scheduler.startswith("cpsat")]
        if not rows:
            return None
        last = rows[-1].scheduler.rsplit(" ", 1)[-1]  # the budget, e.g. "60s"
        return min((r for r in rows if r.scheduler.endswith(" " + last)), key=lambda r: r.result.makespan_ns)

    def summary(self) -> str:
        """One line: fxsched exposed / Inductor exposed, and whether the criterion holds."""
        fx_row, ind_row = self.fxsched_row(), self.best("inductor")
        if fx_row is None or ind_row is None:
            return f"**{self.problem.name}**: no CP-SAT or no Inductor row; nothing to compare."
        fx_e, ind_e = fx_row.result.exposed_ns, ind_row.result.exposed_ns
        ratio = fx_e / ind_e if ind_e else (0.0 if fx_e == 0 else float("inf"))
        bound = fx_row.bound_ns or self.global_bound_ns
        within = fx_row.result.makespan_ns <= 1.01 * bound
        half = ind_e > 0 and fx_e <= 0.5 * ind_e or fx_e == 0
        verdict = "HOLDS" if half or within else "FAILS"
        why = [f"exposed {'<=' if half else '>'} half of Inductor's",
               (f"makespan {'within' if within else 'not within'} 1% of the bound "
                f"({fx_row.result.makespan_ns / 1e3:,.1f} vs {bound / 1e3:,.1f} us, gap {fx_row.gap or 0.0:.2%})")]
        base = self.rows[0].result.peak_memory_bytes or 1
        return (f"**{self.problem.name}**: {fx_row.scheduler} exposed {fx_e / 1e3:,.1f} us / best Inductor "
                f"({ind_row.scheduler}) {ind_e / 1e3:,.1f} us = **{ratio:.2f}x**; criterion {verdict} "
                f"({'; '.join(why)}); peak vs original: fxsched {fx_row.result.peak_memory_bytes / base:.3f}, "
                f"Inductor {ind_row.result.peak_memory_bytes / base:.3f}; {self.hidden_target(fx_row)}"
                + self._offline_clause() + ".")

    def _offline_clause(self) -> str:
        """The offline solve's row, when it ran: its exposed time against the best Inductor row's,
        peak and the hidden target (``; offline ...``)."""
        off, ind_row = self.offline_row(), self.best("inductor")
        if off is None:
            return ""
        ratio = (f" = {off.result.exposed_ns / ind_row.result.exposed_ns:.2f}x Inductor's"
                 if ind_row is not None and ind_row.result.exposed_ns else "")
        base = self.rows[0].result.peak_memory_bytes or 1
        fx_row = self.fxsched_row()
        why = ("fails the hidden target" if fx_row is None or self.hidden_verdict(fx_row) == "FAILS"
               else "hides fewer than the stall proof allows")
        return (f"; **{off.scheduler}** (the offline solve, where the {fx_row.scheduler if fx_row else 'CP-SAT'} row "
                f"{why}): exposed {off.result.exposed_ns / 1e3:,.1f} us{ratio}, makespan "
                f"{off.result.makespan_ns / 1e3:,.1f} us, peak vs original {off.result.peak_memory_bytes / base:.3f}, "
                f"{self.hidden_target(off)}")

    def offline_row(self) -> Row | None:
        """The offline solve's row (``--offline-budget``), if it ran."""
        return next((r for r in self.rows if r.scheduler.startswith(OFFLINE)), None)

    def short_of_proof(self, row: Row) -> bool:
        """Whether a kept stall proof waives the hidden target and ``row`` hides fewer of the graph's
        collectives than the proof leaves room for (the offline row then runs as where it fails)."""
        most = self.rows[0].result.n_hideable
        return bool(self.stall_exposed) and row.result.n_hidden_hideable_members < most - self.stall_exposed

    def hidden_target(self, row: Row) -> str:
        """The "99% of hideable collectives hidden wherever the bound allows" check for ``row``:
        what it counts, then the verdict (:meth:`hidden_verdict`)."""
        return self._hidden(row)[0]

    def hidden_verdict(self, row: Row) -> str:
        """``HOLDS``, ``FAILS``, ``not applicable`` (the bounds put 99% out of reach) or ``none``
        (no hideable collectives) for ``row``."""
        return self._hidden(row)[1]

    def _hidden(self, row: Row) -> tuple[str, str]:
        """It is waived only where the bounds prove that more than 1% of the hideable collectives
        are exposed in every schedule: ``forced_exposed`` of them (:func:`.bounds.forced_exposed`),
        or at least one where every collective is hideable and the makespan bound proves exposed
        time. The share is taken of the unbucketed graph's hideable collectives, the most any
        schedule has. A bound that proves a few microseconds exposed does not waive it. It holds
        when 99% of the graph's collectives in the row's hideable units are hidden, each bucket
        counted as its members: a stalled bucket of 27 leaves 27 collectives waited on, a hidden one
        hides 27. The units' share (Inductor's sense, where a bucket is one collective) is shown but
        not required: where one collective is exposed in every schedule, an answer of U units hides
        at most (U - 1) / U of them, under 99% whenever U < 100, however few of the graph's
        collectives it leaves exposed (the 4-node backward's offline answer has 10 units). A kept
        stall proof (:func:`.stall_proof.certified_stalls`) waives it too, within the memory budget.
        """
        hid, able = row.result.n_hidden_hideable, row.result.n_hideable
        if able == 0:
            return "no hideable collectives", "none"
        over = row.result.n_overlapped_hideable
        text = (f"hidden {hid}/{able} hideable ({hid / able:.1%}; in Inductor's sense, not fully exposed: "
                f"{over}/{able}, {over / able:.1%})")
        members, hid_members = row.result.n_hideable_members, row.result.n_hidden_hideable_members
        if members != able:  # buckets: say how many of the graph's collectives the stalled ones carry
            text += f"; counting each bucket's members: {hid_members}/{members} ({hid_members / members:.1%})"
        base = self.rows[0].result
        proven = self.forced_exposed
        if proven == 0 and self.global_bound_ns > base.compute_ns and base.n_hideable == base.n_collectives:
            proven = 1
        most = base.n_hideable
        if self.stall_exposed > proven and most - self.stall_exposed < HIDDEN_TARGET * most:
            return (f"{text}; 99% target not applicable ({self.stall_proof} proves {self.stall_exposed} of the "
                    f"{most} hideable collectives exposed in every schedule within the memory budget)",
                    "not applicable")
        if most - proven < HIDDEN_TARGET * most:
            return (f"{text}; 99% target not applicable (the bounds prove {proven} of the {most} hideable "
                    f"collectives exposed in every schedule)", "not applicable")
        verdict = "HOLDS" if hid_members >= HIDDEN_TARGET * members else "FAILS"
        if verdict == "FAILS" and self.tail_exposed:
            return (f"{text}; 99% target FAILS (every compute op feeds a collective, so one is exposed after all "
                    "compute in every schedule: hiding all but one takes a compute stream that never stalls)"), verdict
        return f"{text}; 99% target {verdict}", verdict


def _timed(fn: Callable[[ScheduleProblem], Schedule], problem: ScheduleProblem) -> tuple[Schedule, float]:
    t0 = time.perf_counter()
    out = fn(problem)
    return out, time.perf_counter() - t0


def compare_part(
    ext: Extraction,
    groups: dict[str, int],
    budgets: Sequence[float],
    solve_config: SolveConfig,
    *,
    variants: Sequence[InductorVariant] = VARIANTS,
    heuristics: Sequence[str] | None = None,
    profile: str = "h100",
    cross_check: bool = True,
    modes: Sequence[str] = ("fixed", "free"),
    offline_s: float = 0.0,
    offline_rounds: int = OFFLINE_ROUNDS,
    offline_round_s: float = OFFLINE_ROUND_S,
) -> PartReport:
    """Every row for one extracted graph part (see module docstring). With ``offline_s`` (> 0),
    where the summary's CP-SAT row fails the hidden target (or hides fewer than a kept stall proof
    allows), one more row: the offline recipe
    (:func:`.spine_rounds.offline`: a free-order solve of ``offline_s`` then ``offline_rounds``
    spine rounds of ``offline_round_s``), as an offline solve whose cached schedule a later
    compile applies would run it."""
    problem = ext.problem
    global_bound = makespan_lower_bound(problem).makespan_ns
    rows = [Row("original order", simulate(problem), 0.0, bound_ns=global_bound)]
    notes: list[str] = []
    for name in heuristics if heuristics is not None else HEURISTICS:
        sched, secs = _timed(HEURISTICS[name], problem)
        rows.append(Row(name, simulate(problem, sched), secs, bound_ns=global_bound))
    for variant in variants:
        try:
            run = run_inductor(ext, variant, profile)
            scored = score_inductor(ext, run, groups, profile)
            res = simulate(scored.problem, scored.schedule)
        except Exception as e:  # a failing variant is reported, not fatal
            log.exception("inductor %s on %s failed", variant.label, problem.name)
            notes.append(f"`{variant.label}` failed: `{type(e).__name__}: {e}`")
            continue
        rows.append(Row(variant.label, res, run.seconds, scored.method, global_bound, run.report, scored.note))
        if scored.note:
            notes.append(f"`{variant.label}` was re-extracted because: {scored.note}")
        if cross_check and scored.method == "mapped":
            try:
                alt = simulate(reextract(run, groups, profile))
                notes.append(f"`{variant.label}` cross-check, output graph re-extracted as its own problem: "
                             f"exposed {alt.exposed_ns / 1e3:,.1f} us, makespan {alt.makespan_ns / 1e3:,.1f} us, "
                             f"{alt.n_collectives} collectives, peak {alt.peak_memory_bytes / 2**20:,.1f} MiB.")
            except Exception as e:  # noqa: BLE001 - reported as a note
                notes.append(f"`{variant.label}` cross-check (re-extraction) failed: `{type(e).__name__}: {e}`")
    budget_bytes = resolve_budget(problem, solve_config.memory_budget)
    budget_bound = makespan_lower_bound(problem, budget_bytes).makespan_ns
    for budget, mode in ((b, m) for b in budgets for m in modes):
        t0 = time.perf_counter()
        r = solve(problem, budget, dataclasses.replace(solve_config, mode=mode))
        wall = time.perf_counter() - t0
        rows.append(Row(f"cpsat {mode} {budget:g}s", simulate(problem, r.schedule), wall,
                        f"simulated ({r.status.value}, {r.method})", max(r.lower_bound, global_bound),
                        schedule=r.schedule))
    stall_units, stall_text = certified_stalls(problem, budget_bytes)
    if stall_text:  # what a kept proof proves, or why it proves nothing
        proven = f": {stall_units} units exposed in every schedule within the memory budget" if stall_units else ""
        notes.append(f"{stall_text[0].upper()}{stall_text[1:]}{proven}.")
    report = PartReport(problem, rows, global_bound, notes, budget_bound, forced_exposed(problem), budget_bytes,
                        exposed_after_compute(problem), stall_units, stall_text)
    fx_row = report.fxsched_row()
    short = fx_row is not None and (report.hidden_verdict(fx_row) == "FAILS" or report.short_of_proof(fx_row))
    if offline_s > 0 and short:
        t0 = time.perf_counter()
        sched, lines = offline(problem, offline_s, solve_config, n_rounds=offline_rounds, round_s=offline_round_s)
        wall = time.perf_counter() - t0
        label = f"{OFFLINE} free {offline_s:g}s+{offline_rounds}x{offline_round_s:g}s"
        rows.append(Row(label, simulate(problem, sched), wall, "simulated (offline recipe)", budget_bound,
                        schedule=sched))
        notes.append(f"`{label}`: " + "; ".join(lines) + ".")
    return report


def _fmt_us(ns: int) -> str:
    return f"{ns / 1e3:,.1f}"


def render_table(report: PartReport) -> str:
    """A markdown table, one row per scheduler, original order first."""
    base = report.rows[0].result.peak_memory_bytes if report.rows else 0
    head = ["scheduler", "exposed us", "makespan us", "hidden/hideable", "overlapped/hideable", "collectives",
            "peak MiB", "peak vs orig", "solve s", "bound us", "gap", "scored", "Inductor's own view"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * 10 + ["---", "---"]) + "|"]
    for r in report.rows:
        res = r.result
        own = ""
        if r.inductor is not None:
            i = r.inductor
            own = (f"exposed {i.total_exposed_ms * 1e3:,.1f} us, hidden {i.hidden_hideable}/{i.potentially_hidden}, "
                   f"fully exposed {i.exposed}")
        cells = [r.scheduler, _fmt_us(res.exposed_ns), _fmt_us(res.makespan_ns),
                 f"{res.n_hidden_hideable}/{res.n_hideable}", f"{res.n_overlapped_hideable}/{res.n_hideable}",
                 str(res.n_collectives),
                 f"{res.peak_memory_bytes / 2**20:,.1f}", f"{res.peak_memory_bytes / base:.3f}" if base else "-",
                 f"{r.solve_s:.2f}", _fmt_us(r.bound_ns) if r.bound_ns is not None else "-",
                 f"{r.gap:.2%}" if r.gap is not None else "-", r.method, own]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_part(report: PartReport, extract_s: float, n_nodes: int) -> list[str]:
    p = report.problem
    title = (f"#### {p.name}: {n_nodes} FX nodes, {len(p.ops)} ops, {len(p.collectives)} collectives "
             f"(extracted in {extract_s:.2f} s)")
    out = [title, "", render_table(report), ""]
    out.append(f"Lower bound on the makespan over every schedule: {_fmt_us(report.global_bound_ns)} us "
               f"(exposed >= {_fmt_us(report.global_bound_ns - report.rows[0].result.compute_ns)} us)"
               + (f"; within the solves' memory budget: {_fmt_us(report.budget_bound_ns)} us."
                  if report.budget_bound_ns is not None else "."))
    out += [f"- {n}" for n in report.notes]
    out += ["", report.summary(), ""]
    fx_row = report.fxsched_row()
    if fx_row is not None and fx_row.schedule is not None:
        out += render_collectives(fx_row.scheduler, collective_rows(
            p, fx_row.schedule, memory_budget_bytes=report.budget_bytes))
    off = report.offline_row()
    if off is not None and off.schedule is not None:
        out += render_collectives(off.scheduler, collective_rows(p, off.schedule, memory_budget_bytes=report.budget_bytes))
    return out


def render_collectives(label: str, rows: Sequence[CollectiveRow], most: int = PER_COLLECTIVE_ROWS) -> list[str]:
    """DESIGN.md's per-collective table for ``label``'s schedule against the original order
    (``fxbridge.timeline.collective_rows``, as ``fxsched report`` writes it): every collective
    summed up by what limits it, then the exposed ones, the ``most`` most exposed first."""
    if not rows:  # no collectives: nothing to tabulate
        return []
    exposed = sorted((r for r in rows if r.final_exposed_ns > 0), key=lambda r: -r.final_exposed_ns)
    counts: dict[str, int] = {}
    for r in rows:
        key = "FIFO" if r.limiting.startswith("FIFO") else r.limiting
        counts[key] = counts.get(key, 0) + 1
    lines = [f"Per collective, `{label}` against the original order ({len(rows)} collectives after "
             f"bucketing; exposed {_fmt_us(sum(r.initial_exposed_ns for r in rows))} us before, "
             f"{_fmt_us(sum(r.final_exposed_ns for r in rows))} us after): "
             + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) + ".", ""]
    if not exposed:
        return lines
    head = ["collective", "kind", "group", "MiB", "runtime us", "initial exposed us", "final exposed us",
            "FIFO wait us", "limiting factor", "to fill its stall"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * 5 + ["---"] * 2) + "|"]
    for r in exposed[:most]:
        cells = [r.name, r.kind, r.group, f"{r.size_bytes / 2**20:,.1f}", _fmt_us(r.runtime_ns),
                 _fmt_us(r.initial_exposed_ns), _fmt_us(r.final_exposed_ns), _fmt_us(r.fifo_delay_ns), r.limiting,
                 r.fill]
        lines.append("| " + " | ".join(cells) + " |")
    if len(exposed) > most:
        lines.append(f"| ({len(exposed) - most} more exposed, {_fmt_us(sum(r.final_exposed_ns for r in exposed[most:]))}"
                     " us in all) |" + " |" * 9)
    return lines + [""]


def _budget_text(config: SolveConfig) -> str:
    b = config.memory_budget
    if b is None:
        return "the original peak"
    return f"{b:,} bytes" if isinstance(b, int) else f"{b:g}x the original peak"


def offline_text(offline_s: float, rounds: int, round_s: float) -> str:
    """What the offline row runs, for the header."""
    return (f"Where the summary's CP-SAT row fails the 99% hidden target (or hides fewer than a kept stall "
            f"proof allows), one more row, `{OFFLINE} free "
            f"{offline_s:g}s+{rounds}x{round_s:g}s`: the offline recipe (`fxsched.benchmarks.spine_rounds.offline`, "
            f"the steps that made benchmarks/certificates/), as an offline solve whose cached schedule a later "
            f"compile applies would run it: `solve` in free order for {offline_s:g} s with spine_share="
            f"{OFFLINE_SPINE_SHARE:g} and hide_slack={OFFLINE_HIDE_SLACK:g}, then {rounds} rounds of the spine "
            f"fill of {round_s:g} s each at radius {OFFLINE_RADIUS} (doubled after a round that gains nothing, up "
            f"to {OFFLINE_MAX_RADIUS}; at most {OFFLINE_SOLVE_S:g} s a solve, "
            f"the memory cuts kept from solve to solve), each polished and kept when it hides no "
            f"fewer within {OFFLINE_CAP:.0%} of the solve's makespan and the original peak. The summary keeps "
            f"the online row's verdicts and adds the offline row's.")


def header(argv: Sequence[str], budgets: Sequence[float], solve_config: SolveConfig, profile: str = "h100",
           offline: str = "") -> list[str]:
    """The section's opening lines: the exact command, the machine and what was patched (and
    ``offline``: :func:`offline_text`, when that row may run)."""
    command = " ".join([MODULE, *map(shlex.quote, argv)]).strip()
    return [BEGIN, "## fxsched vs Inductor (issue 6)", "",
            f"Command: `{command}` (at commit {source_revision()})", "",
            f"On {platform.machine()} / Python {platform.python_version()}; times in us of simulated H100 time, "
            f"every row scored by the one simulator with the same costs. CP-SAT: `solve(problem, budget, "
            f"SolveConfig(workers={solve_config.workers}, processes={solve_config.processes}, "
            f"deterministic={solve_config.deterministic}, seed={solve_config.seed}))` at budgets "
            f"{', '.join(f'{b:g}' for b in budgets) or 'none'} s "
            f"(memory budget: {_budget_text(solve_config)}). Inductor variants: "
            + "; ".join(f"`{v.label}` = {v.description}" for v in VARIANTS) + ".", "",
            ("`scored`: `mapped` = Inductor's output graph mapped back to a schedule of the original problem "
            "(bucketed collectives traced to their members through `meta['from_node']`); `re-extracted` = "
            "its output graph extracted as its own problem with the same costs. `bound us`: CP-SAT rows, the "
            "larger of CP-SAT's bound over its modelled space and the bound over every schedule; other rows, "
            "the latter. `Inductor's own view`: what its pass logs (its counts are of collectives after its "
             "FSDP pre-bucketing; `hidden` = hideable and not fully exposed)."), "",
            PATCH_NOTE.format(profile=profile), "", f"Criterion: {CRITERION}.", ""] + ([offline, ""] if offline else [])


def run(
    names: Sequence[str],
    budgets: Sequence[float],
    *,
    layers: int | None = None,
    parts: Sequence[str] = ("forward", "backward"),
    solve_config: SolveConfig | None = None,
    profile: str = "h100",
    argv: Sequence[str] = (),
    variants: Sequence[InductorVariant] = VARIANTS,
    heuristics: Sequence[str] | None = None,
    cross_check: bool = True,
    modes: Sequence[str] = ("fixed", "free"),
    offline_s: float = 0.0,
    offline_rounds: int = OFFLINE_ROUNDS,
    offline_round_s: float = OFFLINE_ROUND_S,
) -> tuple[str, list[PartReport]]:
    """The markdown section (markers included) and the part reports, for ``names``.

    ``solve_config`` defaults to ``SolveConfig(workers=2)`` (deterministic, seed 0). ``offline_s``
    (> 0): the offline row where the hidden target fails (:func:`compare_part`).
    """
    solve_config = solve_config or SolveConfig(workers=2)
    out = header(argv, budgets, solve_config, profile,
                 offline_text(offline_s, offline_rounds, offline_round_s) if offline_s > 0 else "")
    reports: list[PartReport] = []
    for name in names:
        t0 = time.perf_counter()
        zg = build(name, layers=layers)
        cfg = zg.config
        groups = zg.group_sizes
        shape = (f"{cfg.layers} layers, dim {cfg.dim}, ffn {cfg.ffn_dim}, seq {cfg.seq_len}, world "
                 f"{cfg.world_size} ({cfg.parallelism}, tp {cfg.tp_size}); traced in {time.perf_counter() - t0:.1f} s.")
        out += [f"### {zg.name}", "", shape, ""]
        for part in parts:
            t0 = time.perf_counter()
            ext = zg.extract(part, profile=profile)
            extract_s = time.perf_counter() - t0
            log.info("compare %s: %d ops", ext.problem.name, len(ext.problem.ops))
            report = compare_part(ext, groups, budgets, solve_config, variants=variants, heuristics=heuristics,
                                  profile=profile, cross_check=cross_check, modes=modes, offline_s=offline_s,
                                  offline_rounds=offline_rounds, offline_round_s=offline_round_s)
            reports.append(report)
            out += render_part(report, extract_s, len(getattr(zg, part).graph.nodes))
    out += ["### Summary", ""] + [f"- {r.summary()}" for r in reports] + ["", END]
    return "\n".join(out), reports


def write_section(path: Path, text: str) -> None:
    """Replace the marked section of ``path`` with ``text`` (markers included), or append it."""
    replace_section(path, BEGIN, END, text)


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog=MODULE, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", nargs="*", default=[n for n in ZOO if not n.endswith("_small")])
    ap.add_argument("--budgets", nargs="*", type=float, default=[10.0, 60.0], help="CP-SAT budgets (s)")
    ap.add_argument("--layers", type=int, default=None, help="override the zoo graphs' layer count")
    ap.add_argument("--parts", nargs="*", default=["forward", "backward"], choices=["forward", "backward"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--processes", type=int, default=1,
                    help="plan searches side by side, one process each (SolveConfig.processes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", nargs="*", default=["fixed", "free"], choices=["fixed", "free"],
                    help="CP-SAT modes: fixed heavy-compute order and/or free order")
    ap.add_argument("--wall-clock", action="store_true", help="CP-SAT wall-clock limit (default: deterministic)")
    ap.add_argument("--memory-budget", type=float, default=None,
                    help="CP-SAT peak-memory budget as a ratio of the original peak (default 1.0)")
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--no-cross-check", action="store_true", help="skip re-extracting mapped Inductor outputs")
    ap.add_argument("--out", default=None, help="write the section into this markdown file (default: stdout)")
    ap.add_argument("--offline-budget", type=float, default=0.0,
                    help="seconds of the offline recipe's solve, run where the hidden target fails (0: none)")
    ap.add_argument("--offline-rounds", type=int, default=OFFLINE_ROUNDS, help="its spine rounds")
    ap.add_argument("--offline-round-s", type=float, default=OFFLINE_ROUND_S, help="seconds per spine round")
    args = ap.parse_args(argv)
    if args.offline_budget < 0 or args.offline_rounds < 0 or args.offline_round_s <= 0:
        ap.error("--offline-budget and --offline-rounds must be >= 0, --offline-round-s > 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = SolveConfig(workers=args.workers, seed=args.seed, deterministic=not args.wall_clock,
                         memory_budget=args.memory_budget, processes=args.processes)
    text, _ = run(args.graphs, args.budgets, layers=args.layers, parts=args.parts, solve_config=config,
                  profile=args.profile, argv=argv, cross_check=not args.no_cross_check, modes=args.modes,
                  offline_s=args.offline_budget, offline_rounds=args.offline_rounds,
                  offline_round_s=args.offline_round_s)
    emit(args.out, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
