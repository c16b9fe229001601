"""Apply a :class:`Schedule` to the FX graph it was extracted from (DESIGN.md, "Applying a schedule").

Entry point: :func:`apply_schedule`. Steps, in this order:

1. Validate, before anything is touched: :func:`check_schedule` (an invalid schedule raises
   :class:`ScheduleError`, whose message names each offending op), the graph still matches the
   extraction (:class:`ApplyError`), and torch can merge every bucket
   (:class:`UnsupportedBucketError`). A failed call leaves the graph exactly as it was.
2. Reorder: placeholders, then ``get_attr`` nodes (they have no inputs), then every op in
   ``schedule.order``, then the output. The order is topological because the schedule is.
3. Bucket: each bucket becomes one collective through torch's merge functions
   (:mod:`.bucket_rewrite`), issued where its last member was and waited where its first wait
   was (the execution model's bucket semantics, ``solver.schedule.placements``).
4. Control dependencies, last: for every collective (bucket or lone) and every compute node
   the schedule places between its issue and its wait ("hiding" nodes, as Inductor's
   ``overlap_preserving_bucketer`` calls them), ``hiding -> after issue`` and
   ``wait -> after hiding``, inserted with torch's ``control_dependencies.preserve_node_ordering``.
   Without them Inductor's scheduler reorders for memory and undoes prefetches. Hiding nodes are
   the FLOP-heavy ops in the window (Inductor's choice); a window without one uses its compute ops.
5. ``graph.lint()``, ``gm.recompile()``.

Per-node results go to ``node.meta["fxsched"]`` (``position``: index in the final graph;
``op``/``schedule_pos`` for ops of the schedule; ``bucket``/``bucket_role`` for the nodes a bucket
became; ``control_deps``: names a node was made to wait for). ``gm.meta["fxsched"]["buckets"]``
lists each bucket's members and the nodes it became.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from torch import fx
from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
from torch.utils._ordered_set import OrderedSet

from ..solver.problem import OpKind
from ..solver.schedule import Schedule, ScheduleError, check_schedule
from .bucket_rewrite import (
    MergedBucket,
    UnsupportedBucketError,
    check_bucketable,
    merge_bucket,
)
from .extract import META_KEY, Extraction

log = logging.getLogger(__name__)

__all__ = ["AppliedBucket", "ApplyError", "ScheduleError", "UnsupportedBucketError", "apply_schedule",
           "copy_graph_into", "copy_graph_module"]


class ApplyError(ValueError):
    """The graph no longer matches the extraction the schedule was made for; names the node."""

    def __init__(self, op: str, message: str):
        self.op = op
        super().__init__(f"{op!r}: {message}")


@dataclass(frozen=True)
class AppliedBucket:
    """What one bucket of the schedule became in the graph (node names)."""

    index: int
    members: tuple[str, ...]  # in issue order; the last one's position is the bucket's issue
    collective: str
    wait: str
    replaced: tuple[str, ...]  # members, their waits, and the casts torch folded into the copy-in


def apply_schedule(
    extraction: Extraction,
    schedule: Schedule,
    *,
    control_deps: bool = True,
    inplace: bool = True,
) -> fx.GraphModule:
    """Reorder, bucket and pin ``extraction.graph_module`` to ``schedule``; return the module.

    ``inplace=True`` (what a compile pass wants) rewrites ``extraction.graph_module`` itself, after
    which ``extraction.nodes`` names erased nodes for the bucketed collectives; ``inplace=False``
    rewrites a copy and leaves the original module and its nodes' meta as they were.
    ``control_deps=False`` skips step 4 (the graph then runs the schedule's order only as long as
    nobody reorders it). Raises :class:`ScheduleError`, :class:`ApplyError` or
    :class:`UnsupportedBucketError` (a ``NotImplementedError``) before any mutation.
    """
    problem = extraction.problem
    violations = check_schedule(problem, schedule)
    if violations:
        raise ScheduleError(violations)
    gm = extraction.graph_module
    nodes = _resolve_nodes(extraction)
    pos = {name: i for i, name in enumerate(schedule.order)}
    buckets = [tuple(sorted(b, key=pos.__getitem__)) for b in schedule.buckets]
    for members in buckets:
        check_bucketable([nodes[m] for m in members])

    if not inplace:
        gm, nodes = _copy(gm, nodes)
    graph = gm.graph
    _reorder(graph, [nodes[name] for name in schedule.order])
    for name, i in pos.items():
        _meta(nodes[name]).update(op=name, schedule_pos=i)

    bucketed = {m for b in buckets for m in b}
    windows = [(nodes[c.name], nodes[problem.wait_of[c.name]]) for c in problem.collectives
               if c.name not in bucketed]
    applied: list[AppliedBucket] = []
    for b, members in enumerate(buckets):
        first_wait = min((problem.wait_of[m] for m in members), key=pos.__getitem__)
        merged = merge_bucket(graph, [nodes[m] for m in members], nodes[first_wait])
        _tag_bucket(merged, b, members)
        windows.append((merged.collective, merged.wait))
        applied.append(AppliedBucket(b, members, merged.collective.name, merged.wait.name, tuple(merged.replaced)))

    n_deps = 0
    if control_deps:
        heavy = {nodes[o.name] for o in problem.ops if o.heavy and o.kind is OpKind.COMPUTE}
        compute = {nodes[o.name] for o in problem.ops if o.kind is OpKind.COMPUTE and o.runtime_ns > 0}
        deps = overlap_deps(windows, heavy, compute)
        n_deps = sum(len(d) for d in deps.values())
        for node, ds in deps.items():
            _meta(node)["control_deps"] = [d.name for d in ds]
        preserve_node_ordering(graph, deps)

    for i, node in enumerate(graph.nodes):
        _meta(node)["position"] = i
    graph.lint()
    gm.recompile()
    gm.meta[META_KEY] = {"buckets": applied, "control_deps": n_deps, "schedule_len": len(schedule.order)}
    log.info("applied schedule: %d ops, %d buckets, %d control deps", len(schedule.order), len(applied), n_deps)
    return gm


def overlap_deps(
    windows: Iterable[tuple[fx.Node, fx.Node]],
    heavy: set[fx.Node],
    compute: set[fx.Node],
) -> dict[fx.Node, OrderedSet[fx.Node]]:
    """Extra edges that pin each (issue, wait) window: ``hiding -> issue`` and ``wait -> hiding``.

    The hiding nodes of a window are the ``heavy`` nodes strictly between issue and wait in the
    current graph order, or its ``compute`` nodes when it has no heavy one. Every edge agrees with
    the current (topological) order, so no cycle can form. Collective-to-collective edges are never
    made (NCCL stream order already serializes them), as in Inductor.
    """
    deps: dict[fx.Node, OrderedSet[fx.Node]] = {}
    for issue, wait in windows:
        between: list[fx.Node] = []
        cur = issue.next
        while cur is not wait:
            if cur.op == "output":
                raise AssertionError(f"wait {wait.name!r} does not follow its collective {issue.name!r}")
            between.append(cur)
            cur = cur.next
        hiding = [n for n in between if n in heavy] or [n for n in between if n in compute]
        for hn in hiding:
            deps.setdefault(hn, OrderedSet()).add(issue)
            deps.setdefault(wait, OrderedSet()).add(hn)
    return deps


def _resolve_nodes(extraction: Extraction) -> dict[str, fx.Node]:
    """The extraction's op nodes, checked to still be the graph's call_function nodes."""
    graph = extraction.graph_module.graph
    nodes = dict(extraction.nodes)
    for op in extraction.problem.ops:
        node = nodes.get(op.name)
        if node is None:
            raise ApplyError(op.name, "op of the problem has no node in the extraction")
        if node.graph is not graph or getattr(node, "_erased", False):
            raise ApplyError(op.name, "node is no longer in the graph (was the schedule already applied?)")
    known = set(nodes.values())
    for node in graph.nodes:
        if node.op in ("call_function", "call_module", "call_method") and node not in known:
            raise ApplyError(node.name, "node is not in the extracted problem (graph changed since extraction)")
    return nodes


def copy_graph_into(dst: fx.Graph, src: fx.Graph) -> dict[fx.Node, fx.Node]:
    """Copy every node of ``src``, the output too, into the empty ``dst`` (same names; meta dicts
    shallow-copied, our meta entry copied; FakeTensors shared) and its codegen; old -> new nodes.

    As ``fx.Graph.__deepcopy__``, but keeping the node map (its ``memo`` cannot be an empty dict
    we own) and into a graph we choose.
    """
    val_map: dict[fx.Node, fx.Node] = {}
    out = dst.graph_copy(src, val_map, return_output_node=True)  # type: ignore[arg-type]
    dst._codegen = copy.deepcopy(src._codegen)
    if out is not None:
        out_val, old_out = out  # type: ignore[misc]
        assert isinstance(old_out, fx.Node)
        new_out = dst.output(out_val, type_expr=getattr(old_out, "type", None))
        new_out.meta = copy.copy(old_out.meta)
        val_map[old_out] = new_out
    for node in val_map.values():
        if isinstance(node.meta.get(META_KEY), dict):
            node.meta[META_KEY] = dict(node.meta[META_KEY])
    return val_map


def copy_graph_module(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict[str, fx.Node]]:
    """A structural copy of ``gm`` (see :func:`copy_graph_into`) and the name -> new node map."""
    new = fx.Graph(tracer_cls=gm.graph._tracer_cls)
    val_map = copy_graph_into(new, gm.graph)
    copied = fx.GraphModule(gm, new, class_name=type(gm).__name__)
    copied.meta = copy.copy(gm.meta)
    return copied, {old.name: n for old, n in val_map.items()}


def _copy(gm: fx.GraphModule, nodes: dict[str, fx.Node]) -> tuple[fx.GraphModule, dict[str, fx.Node]]:
    """A copy of ``gm`` and the extraction's op-name -> node map into it."""
    copied, by_name = copy_graph_module(gm)
    return copied, {name: by_name[n.name] for name, n in nodes.items()}


def _reorder(graph: fx.Graph, ordered_ops: list[fx.Node]) -> None:
    """Placeholders, get_attrs, ``ordered_ops``, output; other nodes are rejected up front."""
    all_nodes = list(graph.nodes)
    order = [n for n in all_nodes if n.op == "placeholder"] + [n for n in all_nodes if n.op == "get_attr"]
    order += ordered_ops + [n for n in all_nodes if n.op == "output"]
    assert len(order) == len(all_nodes), "every node is a placeholder, get_attr, op or output"
    cursor = graph._root
    for node in order:
        if cursor.next is not node:
            cursor.append(node)
        cursor = node


def _meta(node: fx.Node) -> dict:
    return node.meta.setdefault(META_KEY, {})


def _tag_bucket(merged: MergedBucket, b: int, members: tuple[str, ...]) -> None:
    roles = [(merged.copy_in, "copy_in"), ([merged.collective], "collective"), ([merged.wait], "wait"),
             (merged.copy_out, "copy_out")]
    for nodes, role in roles:
        for n in nodes:
            m = n.meta[META_KEY] = {}  # fresh: torch's merge may copy a member's meta dict
            m.update(bucket=b, bucket_role=role)
    _meta(merged.collective)["bucket_members"] = list(members)

