"""Run Inductor's ``schedule_overlap_bucketing`` on a zoo graph with fxsched's costs, and map
its output back to an fxsched :class:`Schedule` so that the one simulator scores it.

Why: DESIGN.md's reference is Inductor's own overlap scheduler. A fair comparison gives
Inductor the costs fxsched optimizes against and scores both results with the same simulator.

**Costs.** :class:`FxschedEstimator` is passed as Inductor's
``config.aten_distributed_optimizations.custom_runtime_estimation`` (contract
``(node, override_size_bytes) -> ms | None``). An original node gets its op's ``runtime_ns``
from the extracted problem; a collective asked at another size (``override_size``, Inductor's
bucketing what-ifs) or a bucketed collective created by the pass gets the problem's comm curve
at that size, exactly what the simulator charges a bucket. Other new nodes (copy-in/out)
answer ``None``: Inductor prices them itself; the simulator charges its own bucket copies.

**What is patched, only while the pass runs** (see :func:`inductor_environment`):

* ``fxsched.fxbridge.hardware.hardware_context(profile)`` (H100 by default), which replaces
  ``torch._inductor.comm_analysis.get_gpu_type``, ``._has_nvlink`` and its ``torch`` global
  (``cuda.is_available() -> True``, ``cuda.device_count() -> 8``), and
  ``torch.utils._runtime_estimation.get_gpu_dram_gbps``, ``.get_device_tflops`` and
  ``.flops_to_ns``. Without it Inductor's roofline needs triton and its device queries give
  zeros (they still run: roofline logging, FSDP pre-bucketing's saturation size).
* ``torch.Tensor.copy_`` (only when ``torch.cuda.is_available()`` is False): the Python
  binding opens a CUDA device guard before dispatch, which a CPU-only build cannot do even on
  fake CUDA tensors ("PyTorch is not linked with support for cuda devices", raised when the
  bucketing pass traces an all_gather copy-in). The patch dispatches
  ``torch.ops.aten.copy_.default`` directly, which traces to the same node.
* ``torch._inductor.config.aten_distributed_optimizations`` (``config.patch``):
  ``custom_runtime_estimation`` = the estimator; ``compute_estimator`` and
  ``collective_estimator`` = ``"analytical"`` (``"benchmark"`` would run kernels on a GPU);
  ``enable_fusion_regions`` = False (its fused costs would overwrite the estimator's answers;
  fxsched's costs already price fusion regions once); ``insert_overlap_deps`` = False (it wraps
  nodes in ``control_deps`` ops that only pin the order for Inductor's later scheduler).
  Every other knob keeps its default; a variant sets bucketing knobs on top.

**Mapping back** (:func:`map_schedule`): the pass runs on a copy whose nodes keep their names.
Surviving original nodes keep their output position. A bucketed collective is traced back to
the original collectives it merged through ``node.meta["from_node"]`` (set by
``bucketing._populate_node_meta``; pre-bucketed nodes that are bucketed again are followed
recursively); all members are placed at its position and their waits at its wait's position,
which is exactly fxsched's bucket semantics (issue at the last member, wait at the first
wait). Original nodes the pass erased besides those (the casts folded into an all_gather
copy-in) go right before their first consumer. New copy-in/out nodes are dropped: the
simulator charges its own copies. When that fails, :func:`score_inductor` re-extracts the
output graph as its own problem with the same estimator and simulates its program order.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._inductor import config as inductor_config
from torch._inductor.fx_passes import fsdp as _fsdp  # noqa: F401 - imported first: it sets its logger to INFO
from torch._inductor.fx_passes import overlap_scheduling

from ..fxbridge.apply import copy_graph_module
from ..fxbridge.costs import collective_kind, collective_size_bytes
from ..fxbridge.extract import Extraction, extract_problem
from ..fxbridge.hardware import hardware_context
from ..solver.problem import CollectiveKind, OpKind, ScheduleProblem, topological_order
from ..solver.schedule import Schedule, check_schedule

log = logging.getLogger(__name__)

_WAITS = {torch.ops._c10d_functional.wait_tensor.default}
if hasattr(torch.ops, "c10d_functional") and hasattr(torch.ops.c10d_functional, "wait_tensor"):
    _WAITS.add(torch.ops.c10d_functional.wait_tensor.default)
_RESULTS_MSG = "Overlap scheduling results"


class MappingError(ValueError):
    """Inductor's output graph cannot be mapped back to a schedule of the original problem."""


@dataclass(frozen=True)
class InductorVariant:
    """One configuration of Inductor's pass: a label and the pass kwargs it sets."""

    label: str
    kwargs: Mapping[str, Any]
    description: str


VARIANTS: tuple[InductorVariant, ...] = (
    InductorVariant("inductor", {}, "config defaults: FSDP pre-bucketing on, overlap-preserving bucketing off"),
    InductorVariant("inductor+bucketing", {"collective_bucketing": True},
                    "defaults plus collective_bucketing=True (overlap-preserving bucketer)"),
    InductorVariant("inductor no-bucketing",
                    {"collective_bucketing": False, "pre_bucketing_fsdp_collectives": False},
                    "no bucketing at all: pre-bucketing and collective_bucketing off"),
)
"""The rows: Inductor's default pipeline, with its bucketer, and with bucketing off."""


class FxschedEstimator:
    """Inductor's ``custom_runtime_estimation`` answering with fxsched's costs (ms).

    ``nodes`` maps op names to the nodes of the graph Inductor runs on (a copy of the extracted
    graph); only those nodes are "original": identity, not name, decides.
    """

    def __init__(self, problem: ScheduleProblem, nodes: Mapping[str, fx.Node]):
        self.problem = problem
        self._name_of = {node: name for name, node in nodes.items()}
        self.calls = 0
        self.answered = 0

    def __call__(self, node: fx.Node, override_size: int | None = None) -> float | None:
        self.calls += 1
        ns = self.runtime_ns(node, override_size)
        if ns is not None:
            self.answered += 1
            return ns / 1e6
        return None

    def runtime_ns(self, node: fx.Node, override_size: int | None = None) -> int | None:
        name = self._name_of.get(node)
        op = self.problem.op_by_name.get(name) if name is not None else None
        if op is not None and (override_size is None or op.kind is not OpKind.COLLECTIVE):
            return op.runtime_ns
        kind = collective_kind(node)
        if kind is None:
            return None  # a node the pass created (copy-in/out): Inductor prices it itself
        curve = self.problem.curve_by_key.get((overlap_scheduling.get_group_name(node), CollectiveKind(kind)))
        if curve is None:
            return None
        return curve.runtime_ns(collective_size_bytes(node) if override_size is None else int(override_size))


class _ResultsCapture(logging.Handler):
    """Keeps the args of overlap_scheduling's "Overlap scheduling results" log record."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.args: tuple[Any, ...] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith(_RESULTS_MSG):
            self.args = tuple(record.args) if isinstance(record.args, tuple) else None


@contextmanager
def _tensor_copy_patch() -> Iterator[None]:
    if torch.cuda.is_available():
        yield
        return
    original = torch.Tensor.copy_

    def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        return torch.ops.aten.copy_.default(self, src, non_blocking)

    torch.Tensor.copy_ = copy_  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.copy_ = original  # type: ignore[method-assign]


@contextmanager
def inductor_environment(estimator: FxschedEstimator, profile: str = "h100") -> Iterator[_ResultsCapture]:
    """Every patch listed in the module docstring, undone on exit; yields the log capture."""
    capture = _ResultsCapture()
    logger = overlap_scheduling.log
    with ExitStack() as stack:
        stack.enter_context(hardware_context(profile))
        stack.enter_context(_tensor_copy_patch())
        stack.enter_context(inductor_config.patch({
            "aten_distributed_optimizations.custom_runtime_estimation": estimator,
            "aten_distributed_optimizations.compute_estimator": "analytical",
            "aten_distributed_optimizations.collective_estimator": "analytical",
            "aten_distributed_optimizations.enable_fusion_regions": False,
            "aten_distributed_optimizations.insert_overlap_deps": False,
        }))
        # Inductor's INFO lines go to our capture only (not torch's stderr handler); the FSDP
        # pre-bucketing logger, which forces INFO on itself, is held at WARNING meanwhile.
        fsdp_logger = logging.getLogger("torch._inductor.fx_passes.fsdp")
        saved = (logger.level, logger.propagate, fsdp_logger.level)
        logger.addHandler(capture)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        fsdp_logger.setLevel(logging.WARNING)

        def restore() -> None:
            logger.removeHandler(capture)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
            fsdp_logger.setLevel(saved[2])

        stack.callback(restore)
        yield capture


@dataclass(frozen=True)
class InductorReport:
    """Inductor's own view of its schedule, from its "Overlap scheduling results" log line (its
    counts are of the collectives it scheduled, after FSDP pre-bucketing, before its bucketer)."""

    exposed: int  # collectives it left fully exposed
    bad_exposed: int  # fully exposed although some compute was independent of them
    potentially_hidden: int  # collectives with independent compute (its "hideable")
    total_exposed_ms: float
    total_potential_ms: float

    @property
    def hidden_hideable(self) -> int:
        """Hideable collectives not left fully exposed (Inductor tracks partial hiding only)."""
        return self.potentially_hidden - self.bad_exposed


@dataclass
class InductorRun:
    """The output of one variant of the pass on a copy of an extracted graph."""

    variant: InductorVariant
    graph_module: fx.GraphModule
    nodes: dict[str, fx.Node]  # op name -> the node in the copy (may be erased now)
    estimator: FxschedEstimator
    seconds: float
    report: InductorReport | None = None


def run_inductor(ext: Extraction, variant: InductorVariant = VARIANTS[0], profile: str = "h100") -> InductorRun:
    """Run ``schedule_overlap_bucketing_from_inductor_configs`` (plus the variant's kwargs) on a
    copy of ``ext.graph_module`` under :func:`inductor_environment`."""
    gm, nodes = copy_graph_module(ext.graph_module)
    estimator = FxschedEstimator(ext.problem, nodes)
    overlap_scheduling.get_group_name.cache_clear()  # functools.cache keyed by node: holds graphs alive
    try:
        with inductor_environment(estimator, profile) as capture:
            patch = {f"aten_distributed_optimizations.{k}": v for k, v in variant.kwargs.items()}
            t0 = time.perf_counter()
            with inductor_config.patch(patch):
                out = overlap_scheduling.schedule_overlap_bucketing_from_inductor_configs(gm)
            seconds = time.perf_counter() - t0
    finally:
        overlap_scheduling.get_group_name.cache_clear()
    out.graph.lint()
    report = None
    if capture.args and len(capture.args) >= 8:
        a = capture.args
        report = InductorReport(int(a[0]), int(a[1]), int(a[2]), float(a[5]), float(a[7]))
    log.info("inductor %s on %s: %.2fs, estimator answered %d of %d calls", variant.label, ext.problem.name,
             seconds, estimator.answered, estimator.calls)
    return InductorRun(variant, out, nodes, estimator, seconds, report)


def _is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in _WAITS


def _members(node: fx.Node, graph_id: int, originals: set[str]) -> list[str]:
    """Original collectives a bucketed collective merged, through ``meta["from_node"]``."""
    out: list[str] = []
    stack = list(reversed(node.meta.get("from_node") or []))
    while stack:
        src = stack.pop()
        info = getattr(src, "node_info", None)
        if info is None or info.graph_id != graph_id:
            continue
        if src.name in originals:
            out.append(src.name)
        else:
            stack.extend(reversed(src.from_node or []))
    return list(dict.fromkeys(out))


def map_schedule(problem: ScheduleProblem, run: InductorRun) -> Schedule:
    """The fxsched schedule Inductor's output graph encodes (see module docstring).

    Raises :class:`MappingError` when a bucketed collective cannot be traced to its members,
    or when the result is not a valid schedule of ``problem``.
    """
    graph = run.graph_module.graph
    alive = {node: name for name, node in run.nodes.items() if name in problem.op_by_name}
    collectives = {c.name for c in problem.collectives}
    key: dict[str, float] = {}
    buckets: list[tuple[str, ...]] = []
    members_of: dict[fx.Node, list[str]] = {}
    for i, node in enumerate(graph.nodes):
        name = alive.get(node)
        if name is not None:
            key[name] = i
            continue
        if node.op != "call_function":
            continue
        if collective_kind(node) is not None:
            members = _members(node, id(graph), collectives)
            if not members:
                raise MappingError(f"new collective {node.name!r}: no original collective in its meta['from_node']")
            for m in members:
                if m in key:
                    raise MappingError(f"collective {m!r} is in two places ({node.name!r} and the original)")
                key[m] = i
            members_of[node] = members
            if len(members) > 1:
                buckets.append(tuple(sorted(members, key=problem.index.__getitem__)))
        elif _is_wait(node):
            src = node.args[0]
            if isinstance(src, fx.Node) and src.target is operator.getitem:
                src = src.args[0]
            waited = members_of.get(src) if isinstance(src, fx.Node) else None
            if waited is None:
                raise MappingError(f"new wait {node.name!r} waits on {src!r}, which is no bucketed collective")
            for m in waited:
                key.setdefault(problem.wait_of[m], i)
    # Erased originals besides bucket members and their waits (casts folded into a copy-in):
    # right before their first consumer, else right after their last dependency.
    missing = [op.name for op in problem.ops if op.name not in key]
    for name in reversed(missing):
        users = [key[u] for u in problem.users[name] if u in key]
        if users:
            key[name] = min(users) - 0.5
    for name in missing:
        if name not in key:
            key[name] = max((key[d] for d in problem.op_by_name[name].deps if d in key), default=-1) + 0.5
    if missing:
        log.info("map_schedule %s: %d erased ops placed by their consumers: %s", problem.name, len(missing),
                 ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
    names = [op.name for op in problem.ops]
    order = topological_order(names, {op.name: op.deps for op in problem.ops},
                              key=lambda n: (key[n], problem.index[n]))
    multi = any(len({problem.op_by_name[m].collective.bucket_key() for m in b}) > 1  # type: ignore[union-attr]
                for b in buckets)
    schedule = Schedule(order=tuple(order), buckets=tuple(buckets), multi_dtype=multi)
    violations = check_schedule(problem, schedule)
    if violations:
        raise MappingError(f"mapped schedule is invalid: {'; '.join(map(str, violations[:3]))}")
    return schedule


@dataclass
class ScoredInductor:
    """What the simulator scores for an Inductor run: ``problem`` with ``schedule``."""

    problem: ScheduleProblem
    schedule: Schedule
    method: str  # "mapped" (original problem) or "re-extracted" (the output graph's own problem)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def reextract(run: InductorRun, groups: Mapping[str, int], profile: str = "h100") -> ScheduleProblem:
    """The output graph as its own problem, priced by the same estimator (fxsched's model for the
    nodes the pass created)."""
    return extract_problem(run.graph_module, groups=groups, profile=profile, estimator=run.estimator,
                           name=f"{run.estimator.problem.name}/{run.variant.label}").problem


def score_inductor(ext: Extraction, run: InductorRun, groups: Mapping[str, int], profile: str = "h100") -> ScoredInductor:
    """Map back when possible, else re-extract (the note says why)."""
    try:
        return ScoredInductor(ext.problem, map_schedule(ext.problem, run), "mapped")
    except MappingError as e:
        log.warning("inductor %s on %s: %s; re-extracting its output graph", run.variant.label, ext.problem.name, e)
        problem = reextract(run, groups, profile)
        return ScoredInductor(problem, Schedule.original(problem), "re-extracted", note=str(e))
