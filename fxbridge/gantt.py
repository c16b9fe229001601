"""Gantt chart (PNG) of one or more laid-out schedules, with their memory curves.

One panel per schedule: a row for the compute stream (heavy compute, other compute, bucket
copies, wait stalls in red) and a row per process group (collectives, green when hidden, orange
when their wait stalled). A last panel overlays the memory curves and the budget. All panels
share the time axis, so the original order and a schedule compare at a glance.

matplotlib is optional (``pip install 'fxsched[plot]'``) and imported only when drawing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .timeline import Timeline, group_tids

log = logging.getLogger(__name__)

COLORS = {
    "heavy": "#1f4e79",
    "compute": "#6fa8dc",
    "copy_in": "#8c8c8c",
    "copy_out": "#8c8c8c",
    "stall": "#d62728",
    "hidden": "#2ca02c",
    "exposed": "#ff7f0e",
}


class PlotUnavailable(ImportError):
    """matplotlib is not installed."""


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotUnavailable(
            "the Gantt chart needs matplotlib, which is not installed: pip install 'fxsched[plot]' "
            "(or pip install matplotlib)") from e
    return Figure


def _bars(ax: Any, spans: list[tuple[float, float]], y: float, colors: list[str]) -> None:
    if spans:
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors, linewidth=0)


def write_gantt(timelines: Sequence[tuple[str, Timeline]], path: str | Path, *,
                memory_budget_bytes: int | None = None, dpi: int = 110) -> Path:
    """Draw ``(label, timeline)`` panels and a memory panel into a PNG at ``path``.

    Raises :class:`PlotUnavailable` (an ImportError with the install hint) without matplotlib.
    """
    if not timelines:
        raise ValueError("write_gantt: no timeline to draw")
    Figure = _figure_class()
    from matplotlib.patches import Patch

    problem = timelines[0][1].problem
    tids = group_tids(problem)
    rows = 1 + len(tids)
    heights = [rows * 0.45 + 0.6 for _ in timelines] + [1.8]
    fig = Figure(figsize=(14, sum(heights) + 0.8), dpi=dpi)
    axes = fig.subplots(len(timelines) + 1, 1, sharex=True, gridspec_kw={"height_ratios": heights})
    ms = 1e-6  # ns -> ms
    ops = problem.op_by_name
    for ax, (label, tl) in zip(axes, timelines):
        spans, colors = [], []
        for s in tl.spans:
            kind = s.kind
            if kind == "compute":
                kind = "heavy" if ops[s.op].heavy else "compute"
            spans.append((s.start_ns * ms, s.dur_ns * ms))
            colors.append(COLORS[kind])
        _bars(ax, spans, 0, colors)
        for group, tid in tids.items():
            cs = [c for c in tl.collectives if c.group == group]
            _bars(ax, [(c.start_ns * ms, c.runtime_ns * ms) for c in cs], tid,
                  [COLORS["hidden" if c.hidden else "exposed"] for c in cs])
            # thin ticks at bar starts keep back-to-back collectives apart
            ax.vlines([c.start_ns * ms for c in cs], tid - 0.4, tid + 0.4, colors="white", linewidth=0.3)
        ax.set_yticks(range(rows))
        ax.set_yticklabels(["compute", *(f"pg {g}" for g in tids)])
        ax.set_ylim(rows - 0.4, -0.6)
        sim = tl.sim
        ax.set_title(f"{label}: makespan {sim.makespan_ns / 1e3:,.1f} us, exposed {sim.exposed_ns / 1e3:,.1f} us, "
                     f"{sim.n_hidden}/{sim.n_collectives} collectives hidden, peak {sim.peak_memory_bytes / 2**30:,.2f} GiB",
                     fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    mem_ax = axes[-1]
    for label, tl in timelines:
        xs = [t * ms for t in tl.position_ns] + [tl.sim.makespan_ns * ms]
        ys = [m / 2**30 for m in tl.sim.memory_curve]
        mem_ax.step(xs, [*ys, ys[-1] if ys else 0], where="post", label=label, linewidth=1)
    if memory_budget_bytes:
        mem_ax.axhline(memory_budget_bytes / 2**30, color="black", linestyle="--", linewidth=0.8, label="budget")
    mem_ax.set_ylabel("memory GiB")
    mem_ax.set_xlabel("time (ms)")
    mem_ax.legend(fontsize=8, loc="upper right")
    mem_ax.grid(alpha=0.3)
    handles = [Patch(color=COLORS[k], label=k.replace("_", " ")) for k in
               ("heavy", "compute", "copy_in", "stall", "hidden", "exposed")]
    handles[0].set_label("heavy compute")
    handles[2].set_label("bucket copy")
    handles[3].set_label("wait stall")
    handles[4].set_label("collective (hidden)")
    handles[5].set_label("collective (exposed)")
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(problem.name, x=0.01, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path = Path(path)
    fig.savefig(path, format="png")
    log.info("wrote %s", path)
    return path

