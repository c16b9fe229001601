"""Repeated layers of a problem (identical transformer blocks), found from the ops' modules.

An op belongs to a **layer** when its module FQN matches ``pattern`` (default: ``layers.<i>``
and its submodules); the layer is named by the pattern's first group. Ops without a module
(``module`` None) whose neighbours in layers (deps and users) are all in one layer, or else
whose users in layers are, are **attached** to it: FX gives residual adds and other glue code
no module of their own, and without them the layers of a Llama graph would not be closed under
their dependencies (the glue between two layers goes to the layer it feeds). Ops of other
modules (norm, output, embeddings) stay outside. Layers are ranked by their median op in the
problem order (a backward graph runs ``layers.79`` first; the median, not the first op, since
shared values such as RoPE tables sit in the first layer's module).

Two layers are **isomorphic** when their op lists, in problem order, match position by
position (op ``k`` of one corresponds to op ``k`` of the other) in everything the execution
model and the schedulers read:

* kind, target, runtime, ``heavy``, collective info (kind, group, dtype, sizes, reduce op);
* the storages each op allocates and uses: a storage allocated inside the layer must be the
  corresponding one (same op position, same index); one from outside must have the same size
  and flags;
* dependencies, in order: an inside dependency maps to the corresponding op; an outside one
  must be either the very same op (shared values: RoPE tables, constants), or an op of the
  same signature in the layer at the same rank offset (the neighbouring layer the activations
  or gradients come from) and, when both neighbours are isomorphic too, the corresponding op
  of the two (a refinement pass, repeated until the classes no longer shrink: the first and
  last layers differ from the rest, so their neighbours are matched by signature only);
* users outside the layer, as a multiset of the same descriptors (the same op outside every
  layer, or the rank offset and signature).

So the map between two isomorphic layers is an isomorphism of the layers' own dependency graphs
that also matches their boundaries (the same shared ops; ops of the same signature at the same
layer offset, the corresponding ones where those neighbours are isomorphic too): it preserves
dependencies (a topological order of one maps to one of the other), costs, collective keys and
memory. That is what makes "the same change in another layer" (``solver/layer_replay.py``)
meaningful; that module still checks and simulates every replayed schedule, so soundness never
rests on this test alone.

Isomorphism is tested against each class's **template** (its first layer in rank order), first
fit; layers that match no other layer form no class.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from .problem import Op, ScheduleProblem

log = logging.getLogger(__name__)

DEFAULT_LAYER_PATTERN = r"^(layers\.\d+)(?:\.|$)"


@dataclass(frozen=True)
class Layer:
    """One layer: its name (the pattern's group), rank (by median op) and ops in problem order."""

    name: str
    rank: int
    ops: tuple[str, ...]


@dataclass(frozen=True)
class LayerClass:
    """Isomorphic layers; ``to_template[layer][op]`` is the template op that ``op`` corresponds to."""

    template: str
    layers: tuple[str, ...]  # rank order, template first
    to_template: dict[str, dict[str, str]]
    from_template: dict[str, dict[str, str]]


@dataclass(frozen=True)
class LayerStructure:
    """Every layer of a problem, the op -> layer map and the classes of isomorphic layers."""

    layers: tuple[Layer, ...]  # rank order
    layer_of: dict[str, str]  # op -> layer name (attached ops included)
    classes: tuple[LayerClass, ...]  # largest first (ties: earliest template)
    class_of: dict[str, int] = field(default_factory=dict)  # layer name -> index in classes

    @cached_property
    def rank(self) -> dict[str, int]:
        """Layer name -> rank."""
        return {lay.name: lay.rank for lay in self.layers}

    def layer_at(self, rank: int) -> Layer | None:
        return self.layers[rank] if 0 <= rank < len(self.layers) else None

    def map_op(self, op: str, src: str, dst: str) -> str | None:
        """The op of layer ``dst + (layer(op) - src)`` that corresponds to ``op`` (by rank shift),
        or None when ``op`` is in no layer or the shifted layers are not isomorphic."""
        lay = self.layer_of.get(op)
        if lay is None:
            return None
        target = self.layer_at(self.rank[lay] + self.rank[dst] - self.rank[src])
        if target is None:
            return None
        k = self.class_of.get(lay)
        if k is None or self.class_of.get(target.name) != k:
            return None
        cls = self.classes[k]
        return cls.from_template[target.name][cls.to_template[lay][op]]


def detect_layers(problem: ScheduleProblem, pattern: str = DEFAULT_LAYER_PATTERN,
                  attach: bool = True) -> LayerStructure:
    """The layers of ``problem`` (module FQNs matching ``pattern``, group 1 = layer name) and
    their isomorphism classes (see module docstring). Empty when no op matches."""
    rx = re.compile(pattern)
    layer_of: dict[str, str] = {}
    for op in problem.ops:
        m = rx.match(op.module or "")
        if m:
            layer_of[op.name] = m.group(1)
    if attach:
        _attach(problem, layer_of)
    members: dict[str, list[str]] = {}
    for op in problem.ops:  # problem order
        if op.name in layer_of:
            members.setdefault(layer_of[op.name], []).append(op.name)
    idx = problem.index
    ranked = sorted(members.items(), key=lambda kv: (idx[kv[1][len(kv[1]) // 2]], kv[0]))  # median op
    layers = tuple(Layer(name, r, tuple(ops)) for r, (name, ops) in enumerate(ranked))
    ctx = _Context(problem, layers, layer_of)
    found = _classes(ctx, layers)
    while True:  # refine: deps into classed neighbours must be at the same template position
        ctx.template_pos = {o: (k, ctx.pos[t]) for k, (tmpl, ms) in enumerate(found)
                            for _, m in ms for o, t in m.items()}
        refined = [[(lay, m) for lay, m in ms if ctx.match(tmpl, lay) is not None] for tmpl, ms in found]
        refined_found = [(tmpl, ms) for (tmpl, _), ms in zip(found, refined) if len(ms) >= 2]
        if [len(ms) for _, ms in refined_found] == [len(ms) for _, ms in found]:
            break
        found = refined_found
    classes = []
    for template, ms in sorted(found, key=lambda g: (-len(g[1]), g[0].rank)):
        to_t = {lay.name: m for lay, m in ms}
        classes.append(LayerClass(template.name, tuple(lay.name for lay, _ in ms), to_t,
                                  {n: {t: o for o, t in m.items()} for n, m in to_t.items()}))
    class_of = {n: k for k, c in enumerate(classes) for n in c.layers}
    log.info("layers of %s: %d layers, classes %s", problem.name, len(layers),
             [len(c.layers) for c in classes])
    return LayerStructure(layers, layer_of, tuple(classes), class_of)


def _classes(ctx: _Context, layers: Sequence[Layer]) -> list[tuple[Layer, list[tuple[Layer, dict[str, str]]]]]:
    """First-fit classes of 2+ layers: (template, [(layer, op -> template op)])."""
    groups: list[tuple[Layer, list[tuple[Layer, dict[str, str]]]]] = []
    for lay in layers:
        for template, found in groups:
            mapping = ctx.match(template, lay)
            if mapping is not None:
                found.append((lay, mapping))
                break
        else:
            groups.append((lay, [(lay, {o: o for o in lay.ops})]))
    return [g for g in groups if len(g[1]) >= 2]


def _attach(problem: ScheduleProblem, layer_of: dict[str, str]) -> None:
    """Attach each op without a module whose labelled neighbours (deps and users) are all in one layer,
    or else whose labelled users are (the glue between two layers goes to the layer it feeds)."""
    labelled = dict(layer_of)
    for op in problem.ops:
        if op.name in labelled or op.module:
            continue
        users = {labelled[n] for n in problem.users[op.name] if n in labelled}
        near = users | {labelled[n] for n in op.deps if n in labelled}
        if len(near) == 1 or len(users) == 1:
            layer_of[op.name] = (near if len(near) == 1 else users).pop()


class _Context:
    """What the isomorphism test reads: positions, ranks, storage owners."""

    def __init__(self, problem: ScheduleProblem, layers: Sequence[Layer], layer_of: dict[str, str]):
        self.p = problem
        self.layer_of = layer_of
        self.rank = {lay.name: lay.rank for lay in layers}
        self.pos = {o: k for lay in layers for k, o in enumerate(lay.ops)}
        self.template_pos: dict[str, tuple[int, int]] = {}  # op -> (class, template position)
        self._cache: dict[str, tuple] = {}
        self.owner: dict[str, tuple[str, int]] = {}  # storage -> (allocating op, index)
        for op in problem.ops:
            for i, s in enumerate(op.allocates):
                self.owner[s] = (op.name, i)

    def _ref(self, lay: Layer, other: str) -> tuple:
        """How an op outside ``lay`` is seen from it: the op itself if it is in no layer, else
        the rank offset of its layer and its signature."""
        m = self.layer_of.get(other)
        if m is None:
            return ("op", other)
        return ("layer", self.rank[m] - lay.rank, _signature(self.p.op_by_name[other]))

    def _storage(self, lay: Layer, s: str) -> tuple:
        st = self.p.storage_by_name[s]
        own = self.owner.get(s)
        if own is not None and self.layer_of.get(own[0]) == lay.name:
            return ("in", self.pos[own[0]], own[1])
        return ("out", st.size_bytes, st.is_input, st.never_freed)

    def _dep_ok(self, ta: Layer, tb: Layer, da: str, db: str) -> bool:
        """Whether dependency ``da`` of an op of ``ta`` corresponds to ``db`` of ``tb``'s op."""
        ina, inb = self.layer_of.get(da) == ta.name, self.layer_of.get(db) == tb.name
        if ina or inb:
            return ina and inb and self.pos[da] == self.pos[db]
        if da == db:
            return True
        if self._ref(ta, da) != self._ref(tb, db):
            return False
        pa, pb = self.template_pos.get(da), self.template_pos.get(db)
        return pa is None or pb is None or pa == pb

    def match(self, t: Layer, lay: Layer) -> dict[str, str] | None:
        """``lay``'s op -> ``t``'s op when the two layers are isomorphic, else None."""
        if len(t.ops) != len(lay.ops) or self._local(t) != self._local(lay):
            return None
        ops = self.p.op_by_name
        for a, b in zip(t.ops, lay.ops):
            if any(not self._dep_ok(t, lay, x, y) for x, y in zip(ops[a].deps, ops[b].deps)):
                return None
        return dict(zip(lay.ops, t.ops))

    def _local(self, lay: Layer) -> tuple:
        """Per op (cached): signature, dependency count, storages and outside users."""
        got = self._cache.get(lay.name)
        if got is None:
            ops = self.p.op_by_name
            got = tuple((_signature(ops[o]), len(ops[o].deps),
                         tuple(self._storage(lay, s) for s in (*ops[o].allocates, *ops[o].uses)),
                         frozenset(Counter(self._ref(lay, u) for u in self.p.users[o]
                                           if self.layer_of.get(u) != lay.name).items()))
                        for o in lay.ops)
            self._cache[lay.name] = got
        return got


def _signature(op: Op) -> tuple:
    """What must be equal for two ops to correspond (besides deps and storages)."""
    return (op.kind, op.target, op.runtime_ns, op.heavy, op.collective, len(op.allocates), len(op.uses),
            op.waits_on is not None)


__all__ = ["DEFAULT_LAYER_PATTERN", "Layer", "LayerClass", "LayerStructure", "detect_layers"]
