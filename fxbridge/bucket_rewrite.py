"""The one thin adapter over torch's ``fx_passes/bucketing.py`` merge functions.

:func:`check_bucketable` says, before anything is mutated, whether torch's merge functions can
rewrite a bucket; :func:`merge_bucket` then rewrites it into real nodes:

* copy-in (flatten + concatenate into one flat buffer; all_gather writes its shard into its own
  rank's slot of the output, reduce_scatter interleaves per rank),
* one bucketed collective, inserted where the last member was issued,
* one ``wait_tensor`` and the copy-out (per-rank un-interleave for all_gather, split + views for
  the reductions), moved to where the first member's wait was.

Everything is torch's: ``merge_all_gather_bucket``, ``merge_reduce_scatter_bucket`` and
``merge_all_reduce_bucket`` with their ``insert_before`` / ``wait_insertion_point`` arguments.
Mixed-dtype all_gather buckets use torch's ``custom_ops_multidtype`` mode
(``bucketing::_pre_bucket_all_gather`` copies each member into a dtype view of one byte buffer).
torch has no mixed-dtype reduce_scatter / all_reduce merge (a reduction must run in one dtype),
so those raise :class:`UnsupportedBucketError`, as do all_to_all buckets and the ``_out`` /
coalesced / in-place forms, which torch's merge functions do not take.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._inductor.fx_passes import bucketing

log = logging.getLogger(__name__)

_C10D = torch.ops._c10d_functional
_MERGEABLE: dict[object, str] = {
    _C10D.all_gather_into_tensor.default: "all_gather",
    _C10D.reduce_scatter_tensor.default: "reduce_scatter",
    _C10D.all_reduce.default: "all_reduce",
}
_WAITS = (_C10D.wait_tensor.default, torch.ops.c10d_functional.wait_tensor.default)
_BUCKET_COLLECTIVES = (
    _C10D.all_gather_into_tensor_out.default,
    _C10D.all_gather_into_tensor.default,
    _C10D.reduce_scatter_tensor.default,
    _C10D.all_reduce.default,
)


class UnsupportedBucketError(NotImplementedError):
    """torch's merge functions cannot rewrite this bucket; the message names the op."""

    def __init__(self, op: str, message: str):
        self.op = op
        super().__init__(f"bucket member {op!r}: {message}")


@dataclass
class MergedBucket:
    """The nodes one bucket became, and the names of the nodes it replaced."""

    collective: fx.Node
    wait: fx.Node
    copy_in: list[fx.Node] = field(default_factory=list)
    copy_out: list[fx.Node] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # member collectives, their waits, folded casts


def is_wait(node: fx.Node) -> bool:
    """A ``wait_tensor`` (torch's traced merge functions emit the legacy ``c10d_functional`` one)."""
    return node.op == "call_function" and node.target in _WAITS


def merge_kind(node: fx.Node) -> str | None:
    """``all_gather`` / ``reduce_scatter`` / ``all_reduce`` when torch can merge ``node``, else None."""
    return _MERGEABLE.get(node.target) if node.op == "call_function" else None


def _val(node: fx.Node) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise UnsupportedBucketError(node.name, "has no tensor meta['val'] (trace under FakeTensorMode first)")
    return val


def _dtype_mode(members: list[fx.Node]) -> str:
    """``default`` for one dtype, ``custom_ops_multidtype`` for a mixed-dtype all_gather."""
    dtypes = {_val(n).dtype for n in members}
    return "default" if len(dtypes) == 1 else "custom_ops_multidtype"


def check_bucketable(members: list[fx.Node]) -> None:
    """Raise :class:`UnsupportedBucketError` (naming the op) unless torch can merge ``members``.

    Run before any mutation, so an unsupported bucket leaves the graph untouched.
    """
    kinds = {merge_kind(n) for n in members}
    for n in members:
        if merge_kind(n) is None:
            raise UnsupportedBucketError(
                n.name, f"{n.target} cannot be bucketed: torch's merge functions take only "
                "all_gather_into_tensor, reduce_scatter_tensor and all_reduce (functional, not _out/coalesced)")
        users = list(n.users)
        if len(users) != 1 or not is_wait(users[0]):
            raise UnsupportedBucketError(
                n.name, f"needs exactly one user, its wait_tensor (has {[u.name for u in users]})")
    if len(kinds) != 1:
        raise UnsupportedBucketError(members[0].name, f"bucket mixes collective kinds {sorted(map(str, kinds))}")
    kind = kinds.pop()
    vals = [_val(n) for n in members]
    if len({v.device for v in vals}) != 1:
        raise UnsupportedBucketError(members[0].name, "bucket members live on different devices")
    dtypes = {v.dtype for v in vals}
    if len(dtypes) == 1:
        return
    if kind != "all_gather":
        raise UnsupportedBucketError(
            members[0].name, f"a multi-dtype {kind} bucket ({sorted(map(str, dtypes))}) is not supported: "
            "torch's bucketing.py merges mixed dtypes only for all_gather (a reduction runs in one dtype)")
    # _pre_bucket_all_gather views byte slices of one buffer as each member's dtype; a slice
    # whose byte offset is not a multiple of the widest itemsize cannot be viewed that way.
    widest = max(d.itemsize for d in dtypes)
    for n, v in zip(members, vals):
        nbytes = int(v.numel()) * v.element_size() // _group_size(n)
        if nbytes % widest:
            raise UnsupportedBucketError(
                n.name, f"shard of {nbytes} bytes is not a multiple of {widest} bytes, so it cannot share a "
                "multi-dtype all_gather buffer (dtype views need aligned offsets)")


def _group_size(node: fx.Node) -> int:
    size = node.args[1] if merge_kind(node) == "all_gather" else 1
    assert isinstance(size, int), f"{node.name}: group size {size!r}"
    return size


def _arg0(node: fx.Node) -> fx.Node:
    arg = node.args[0]
    assert isinstance(arg, fx.Node)
    return arg


def merge_bucket(graph: fx.Graph, members: list[fx.Node], first_wait: fx.Node) -> MergedBucket:
    """Rewrite ``members`` (issue order; the last is where the bucket is issued) into one collective.

    The copy-in and the collective go right after the last member, the wait and the copy-out
    right before ``first_wait`` (the earliest member wait); the members, their waits and the
    casts torch folds into the copy-in (``has_mergeable_all_gather_convert_dtype``) are erased.
    Call :func:`check_bucketable` first.
    """
    kind = merge_kind(members[0])
    last = members[-1]
    replaced = [n.name for n in members] + [next(iter(n.users)).name for n in members]
    if kind == "all_gather":
        replaced += [_arg0(n).name for n in members if bucketing.has_mergeable_all_gather_convert_dtype(n)]
    insert_before, wait_at = last.next, first_wait
    if kind == "all_gather":
        new_nodes, _ = bucketing.merge_all_gather_bucket(
            graph, members, mode=_dtype_mode(members),  # type: ignore[arg-type]
            insert_before=insert_before, wait_insertion_point=wait_at)
    elif kind == "reduce_scatter":
        new_nodes, _ = bucketing.merge_reduce_scatter_bucket(
            graph, members, mode="default", insert_before=insert_before, wait_insertion_point=wait_at)
    else:
        new_nodes, _ = bucketing.merge_all_reduce_bucket(
            graph, members, mode="default", insert_before=insert_before, wait_insertion_point=wait_at)
    coll = next(n for n in new_nodes if n.op == "call_function" and n.target in _BUCKET_COLLECTIVES)
    wait = next(n for n in new_nodes if is_wait(n))
    i_coll, i_wait = new_nodes.index(coll), new_nodes.index(wait)
    log.debug("bucket %s -> %s (%d nodes)", replaced, coll.name, len(new_nodes))
    return MergedBucket(coll, wait, copy_in=new_nodes[:i_coll], copy_out=new_nodes[i_wait + 1:],
                        replaced=replaced)
