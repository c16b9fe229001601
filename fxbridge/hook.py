"""The compile hook: fxsched as an Inductor post-grad pass (DESIGN.md, "Compile hook").

One call turns it on for every later ``torch.compile``::

    import fxsched.fxbridge.hook as fxhook
    fxpass = fxhook.enable(time_budget_s=10, memory_limit=1.2, cache_dir="~/.cache/fxsched")
    model = torch.compile(model)          # each compiled graph goes through fxpass
    fxpass.records                        # what happened to each graph (GraphRecord)
    fxhook.disable()

Per graph (:meth:`FxschedPass.__call__`): count the collectives (a graph with fewer than
``min_collectives`` is skipped, logged at debug); extract the problem; compute its fingerprint
(before anything changes the graph); look it up in the schedule cache (a hit is applied as is);
on a miss solve within ``time_budget_s`` (CP-SAT's best schedule, or the greedy one when CP-SAT
found none: ``Status.HEURISTIC``), apply it, and store it (``store=True``). With
``spmd="broadcast"`` rank 0 does the lookup/solve and the ranks agree first (:mod:`.spmd`).

Never failing the compile: any problem (extraction, cache, solver, apply, an unexpected
exception) is logged with ``log.warning`` and the graph is left unchanged. The schedule is first
applied to a copy (which runs every check and torch's bucket merges); only then is the real graph
rewritten, and if that still raises, the graph is rebuilt from a snapshot taken just before. A
corrupt or stale cache entry for the graph also leaves it unchanged (it is not solved over and
not overwritten: someone put a schedule there on purpose, and ranks could disagree).

Inductor's FX graph cache: :meth:`FxschedPass.uuid` hashes the fxsched source files (solver/,
heuristics/, fxbridge/), the ortools version, the config, the cache directory's state token and
the rank, so a code change, a config change or any new or changed cache entry gives a new
Inductor cache key (the rank because an applied all_gather bucket bakes the rank's offset into
the graph). One consequence: the compile that *stores* a schedule was keyed on the cache state
before the store, so the next process misses Inductor's cache once more (our cache hits) and
later processes hit. With ``spmd="broadcast"`` on several ranks ``uuid()`` is None, which turns
the FX graph cache off: its hit/miss is decided per rank, and a rank that hits would skip the
pass and leave the others waiting for it (until ``broadcast_timeout_s``, then all fall back).

SPMD: in the default deterministic mode every rank must see the same graph, config and cache
contents (e.g. one shared cache directory, or identical copies); then they compute the same
schedule without talking to each other.

Results are recorded on the pass (``records``) and on the module (``gm.meta["fxsched"]["hook"]``,
a dict), never as node attributes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..solver.cpsat import Result, SolveConfig, Status, solve
from ..solver.fingerprint import canonical_json
from ..solver.schedule import Schedule
from .apply import apply_schedule, copy_graph_into
from .cache import CacheError, ScheduleCache, SolveInfo, graph_fingerprint, profile_settings
from .costs import collective_kind
from .extract import META_KEY, Extraction, extract_problem
from .hardware import HardwareProfile, get_profile
from .spmd import (
    Channel,
    Payload,
    Round,
    Vote,
    default_channel,
    deterministic_solve_config,
    schedule_json,
)

log = logging.getLogger(__name__)

__all__ = ["FxschedPass", "GraphRecord", "HookConfig", "HookError", "disable", "enable", "installed_passes"]

HOOK_VERSION = 1  # bump when the meaning of a uuid input changes
CACHE_DIR_ENV = "FXSCHED_CACHE_DIR"  # the cache directory when HookConfig.cache_dir is None
SPMD_MODES = ("deterministic", "broadcast")


class HookError(RuntimeError):
    """Why the hook leaves one graph unchanged (caught in the pass, logged as a warning)."""


@dataclass(frozen=True)
class HookConfig:
    """Settings of the compile hook (validated; part of :meth:`FxschedPass.uuid`).

    ``memory_limit``: peak-memory budget, bytes (int) or a ratio of the graph's original peak
    (float); None keeps the original peak (ratio 1.0). ``cache_dir``: the schedule cache; None
    reads ``$FXSCHED_CACHE_DIR`` and, without it, runs without a cache (solve every compile).
    ``deterministic`` must stay True with ``spmd="deterministic"`` (a wall-clock limit gives
    different schedules on different ranks); ``time_budget_s`` is then in CP-SAT's deterministic
    time units, which can take a few times longer in wall-clock time on a loaded machine.
    ``spmd="broadcast"``: rank 0 solves and broadcasts (see :mod:`.spmd`); in one process it
    solves locally and may use ``deterministic=False``. ``broadcast_timeout_s``: how long each
    wait of the broadcast protocol lasts (a non-zero rank waiting for rank 0's schedule, any
    rank waiting for the others' votes) before that rank gives up and every rank keeps its
    graph; it must cover rank 0's solve (``time_budget_s``, longer on a loaded machine) plus the
    ranks' compile skew, hence 30 minutes by default (and more than ``time_budget_s`` in
    broadcast mode). Not part of the uuid (it changes no compiled code).
    """

    time_budget_s: float = 10.0
    memory_limit: int | float | None = None
    cache_dir: str | Path | None = None
    mode: str = "fixed"
    workers: int = 1
    seed: int = 0
    deterministic: bool = True
    spmd: str = "deterministic"
    profile: str | HardwareProfile = "h100"
    fuse: bool = True
    store: bool = True
    min_collectives: int = 1
    broadcast_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        t = self.time_budget_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"HookConfig.time_budget_s must be a finite number of seconds > 0, got {t!r}")
        m = self.memory_limit
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
            raise ValueError(f"HookConfig.memory_limit must be bytes (int > 0), a ratio (float > 0) or None, got {m!r}")
        b = self.broadcast_timeout_s
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise ValueError(f"HookConfig.broadcast_timeout_s must be a finite number of seconds > 0, got {b!r}")
        if self.spmd == "broadcast" and b <= t:
            raise ValueError(f"HookConfig.broadcast_timeout_s ({b!r}) must exceed time_budget_s ({t!r}): the other "
                             "ranks wait that long for rank 0's solve")
        if self.spmd not in SPMD_MODES:
            raise ValueError(f"HookConfig.spmd must be one of {SPMD_MODES}, got {self.spmd!r}")
        if self.spmd == "deterministic" and not self.deterministic:
            raise ValueError("HookConfig: spmd='deterministic' needs deterministic=True (a wall-clock limit "
                             "gives different schedules on different ranks); use spmd='broadcast' instead")
        for name in ("workers", "seed", "min_collectives"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "workers" else 0):
                raise ValueError(f"HookConfig.{name} must be an int >= {1 if name == 'workers' else 0}, got {v!r}")
        for name in ("deterministic", "fuse", "store"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"HookConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, Path)):
            raise ValueError(f"HookConfig.cache_dir must be a path or None, got {self.cache_dir!r}")
        get_profile(self.profile)  # raises ValueError on an unknown name
        self.solve_config()  # raises ValueError on a bad mode

    def resolved_cache_dir(self) -> Path | None:
        """The cache directory in use (absolute), or None for no cache."""
        d = self.cache_dir if self.cache_dir is not None else os.environ.get(CACHE_DIR_ENV) or None
        return None if d is None else Path(d).expanduser().absolute()

    def solve_config(self) -> SolveConfig:
        """The solver configuration (:func:`.spmd.deterministic_solve_config` when deterministic)."""
        if self.deterministic:
            return deterministic_solve_config(mode=self.mode, memory_budget=self.memory_limit, seed=self.seed,
                                              workers=self.workers)
        return SolveConfig(mode=self.mode, memory_budget=self.memory_limit, seed=self.seed, workers=self.workers,
                           deterministic=False)

    def key(self) -> dict[str, Any]:
        """JSON-ready form for :meth:`FxschedPass.uuid`: every field, the profile by its numbers
        (the pass adds the cache directory it actually uses)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "broadcast_timeout_s"}
        d["profile"] = profile_settings(self.profile)
        d["cache_dir"] = None if self.cache_dir is None else str(self.cache_dir)
        return d


@dataclass
class GraphRecord:
    """What the hook did with one graph.

    ``outcome``: "hit" (cached schedule applied), "solved" (solved and applied), "skipped" (too
    few collectives) or "failed" (left unchanged; ``reason`` says why). ``cache``: "hit", "miss",
    "off" (no cache dir), "bad" (unusable entry: the graph is left unchanged) or None (not looked
    up, e.g. a non-zero rank in broadcast mode).
    """

    index: int
    outcome: str = "failed"
    cache: str | None = None
    fingerprint: str | None = None
    status: str | None = None
    objective_ns: int | None = None
    lower_bound_ns: int | None = None
    method: str | None = None
    collectives: int = 0
    buckets: int | None = None
    stored: bool = False
    spmd: str = "local"  # "local" (this process decided) or "broadcast" (rank 0's schedule)
    reason: str | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class FxschedPass(CustomGraphPass):
    """The Inductor post-grad pass (install with :func:`enable`, or set it as
    ``torch._inductor.config.post_grad_custom_post_pass`` yourself).

    ``channel`` replaces the torch.distributed channel of broadcast mode (tests use a fake one).
    """

    def __init__(self, config: HookConfig | None = None, *, channel: Channel | None = None):
        self.config = config or HookConfig()
        self.records: list[GraphRecord] = []
        self._channel = channel
        cache_dir = self.config.resolved_cache_dir()
        self.cache = ScheduleCache(cache_dir) if cache_dir is not None else None

    def __repr__(self) -> str:
        return f"FxschedPass({self.config!r})"

    # ---------------------------------------------------------------- Inductor's cache key
    def uuid(self) -> str | None:
        """Changes whenever the fxsched code, the config or the schedule cache's contents change.

        None (Inductor then bypasses its FX graph cache) in broadcast mode on several ranks, and
        when the key cannot be computed (logged).
        """
        if self.config.spmd == "broadcast" and self._channel_or_none() is not None:
            return None
        try:
            import ortools

            payload = {
                "hook_version": HOOK_VERSION,
                "code": fxsched_code_hash(),
                "ortools": getattr(ortools, "__version__", "?"),
                "config": self.config.key(),
                "cache_dir": str(self.cache.dir) if self.cache is not None else None,
                "cache": self.cache.state_token() if self.cache is not None else None,
                "rank": _rank_and_world(),
            }
            return "fxsched-" + hashlib.sha256(canonical_json(payload)).hexdigest()
        except Exception as e:  # noqa: BLE001 - no key: Inductor just does not cache
            log.warning("fxsched: cannot compute the pass uuid (%s: %s); Inductor's FX graph cache is bypassed",
                        type(e).__name__, e)
            return None

    # ---------------------------------------------------------------- the pass
    def __call__(self, graph: fx.Graph) -> None:
        """Schedule ``graph`` in place, or leave it unchanged with a warning."""
        t0 = time.perf_counter()
        record = GraphRecord(index=len(self.records))
        self.records.append(record)
        gm = graph.owning_module
        try:
            if not isinstance(gm, fx.GraphModule):
                raise HookError("the graph has no owning GraphModule")
            self._run(gm, record)
        except Exception as e:  # noqa: BLE001 - never fail the compile
            record.outcome = "failed"
            record.reason = f"{type(e).__name__}: {e}"
            log.warning("fxsched: graph #%d left unchanged: %s", record.index, record.reason)
        finally:
            record.seconds = time.perf_counter() - t0
            if isinstance(gm, fx.GraphModule):
                meta = gm.meta.get(META_KEY)
                if not isinstance(meta, dict):
                    meta = gm.meta[META_KEY] = {}
                meta["hook"] = record.to_dict()

    def _run(self, gm: fx.GraphModule, record: GraphRecord) -> None:
        record.collectives = count_collectives(gm.graph)
        if record.collectives < self.config.min_collectives:
            record.outcome, record.reason = "skipped", f"{record.collectives} collective(s)"
            log.debug("fxsched: graph #%d skipped: %d collective(s), fewer than min_collectives=%d",
                      record.index, record.collectives, self.config.min_collectives)
            return
        channel = self._channel_or_none() if self.config.spmd == "broadcast" else None
        if channel is not None:
            self._run_broadcast(gm, record, channel)
            return
        ext, fp = self._extract(gm, record)
        schedule, result = self._obtain(ext, fp, record)
        self._apply(ext, schedule, record)
        record.outcome = "hit" if result is None else "solved"
        if result is not None:
            self._store(ext, fp, schedule, result, record)
        log.info("fxsched: graph #%d %s (%s, objective %s ns, bound %s ns, %s bucket(s))", record.index,
                 record.outcome, record.status, record.objective_ns, record.lower_bound_ns, record.buckets)

    def _extract(self, gm: fx.GraphModule, record: GraphRecord) -> tuple[Extraction, str]:
        cfg = self.config
        ext = extract_problem(gm, profile=cfg.profile, fuse=cfg.fuse, name=f"fxsched-hook/graph{record.index}")
        fp = graph_fingerprint(gm, ext.problem, profile=cfg.profile, fuse=cfg.fuse)  # before any change
        record.fingerprint = fp
        return ext, fp

    def _obtain(self, ext: Extraction, fp: str, record: GraphRecord) -> tuple[Schedule, Result | None]:
        """The cached schedule (result None) or a freshly solved one; raises HookError when the
        solver has no usable schedule (nothing fits the memory limit)."""
        if self.cache is None:
            record.cache = "off"
        else:
            try:
                entry = self.cache.get_entry(fp, ext.problem)
            except CacheError as e:
                # Someone put a schedule for this graph there; solving over it would hide (and
                # overwrite) their file, and ranks could then disagree. Leave the graph alone.
                record.cache = "bad"
                raise HookError(f"unusable schedule cache entry (fix or delete it): {e}") from e
            record.cache = "miss" if entry is None else "hit"
            if entry is not None:
                info = entry.solve
                record.status, record.method = info.status, info.method
                record.objective_ns, record.lower_bound_ns = info.objective_ns, info.lower_bound_ns
                return entry.schedule, None
        result = solve(ext.problem, self.config.time_budget_s, self.config.solve_config())
        record.status, record.method = result.status.value, result.method
        record.objective_ns, record.lower_bound_ns = int(result.objective), int(result.lower_bound)
        if result.status is Status.INFEASIBLE:
            raise HookError(f"no schedule fits the memory limit ({result.budget_bytes} bytes; the lowest peak "
                            f"found is {result.min_feasible_budget_bytes} bytes)")
        return result.schedule, result

    def _apply(self, ext: Extraction, schedule: Schedule, record: GraphRecord, *, dry_run: bool = True) -> _Snapshot:
        """Apply ``schedule`` to the real graph, all or nothing (see the module docstring); the
        snapshot taken before, to undo it (broadcast mode, when another rank failed)."""
        if dry_run:
            apply_schedule(ext, schedule, inplace=False)  # every check and merge, on a copy
        gm = ext.graph_module
        snapshot = _Snapshot(gm)
        try:
            apply_schedule(ext, schedule, inplace=True)
        except BaseException:
            _restore(snapshot, gm, record, "the in-place rewrite failed")
            raise
        record.buckets = len(schedule.buckets)
        return snapshot

    def _store(self, ext: Extraction, fp: str, schedule: Schedule, result: Result, record: GraphRecord) -> None:
        if self.cache is None or not self.config.store:
            return
        try:
            info = SolveInfo.from_result(result, self.config.solve_config())
            self.cache.put(fp, schedule, problem=ext.problem, solve=info)
            record.stored = True
        except Exception as e:  # noqa: BLE001 - the graph is scheduled; only the cache write failed
            log.warning("fxsched: graph #%d: could not store its schedule in %s: %s: %s", record.index,
                        self.cache.dir, type(e).__name__, e)

    # ---------------------------------------------------------------- broadcast mode
    def _channel_or_none(self) -> Channel | None:
        return self._channel if self._channel is not None else default_channel()

    def _run_broadcast(self, gm: fx.GraphModule, record: GraphRecord, channel: Channel) -> None:
        """Rank 0 looks up or solves and broadcasts; all ranks vote; all apply or none does
        (one :class:`.spmd.Round`, whose waits each end after ``broadcast_timeout_s``).

        Every rank goes through every phase whatever fails locally (a failure is a "no" vote),
        so no rank is left waiting; the decisions are the same on every rank.
        """
        record.spmd = "broadcast"
        rnd = Round(channel, self.config.broadcast_timeout_s)
        ext: Extraction | None = None
        fp: str | None = None
        local_error = ""
        try:
            ext, fp = self._extract(gm, record)
        except Exception as e:  # noqa: BLE001 - reported through the vote
            local_error = f"extraction failed: {type(e).__name__}: {e}"
        result: Result | None = None
        sent: Payload | None = None
        if channel.rank == 0:
            payload = Payload(fp, None, error=local_error or None)
            if ext is not None and fp is not None:
                try:
                    schedule, result = self._obtain(ext, fp, record)
                    payload = Payload(fp, schedule_json(schedule), "hit" if result is None else "solved",
                                      record.status, record.objective_ns, record.lower_bound_ns)
                except Exception as e:  # noqa: BLE001 - sent as the payload's error
                    payload = Payload(fp, None, error=f"{type(e).__name__}: {e}")
            sent = payload
        received = rnd.broadcast(sent)
        if channel.rank != 0:
            record.status, record.objective_ns, record.lower_bound_ns = (
                received.status, received.objective_ns, received.lower_bound_ns)
        record.extra["source"] = received.source

        ok, reason, schedule_in = False, local_error, None
        if ext is not None:
            try:
                if received.schedule is None:
                    raise HookError(f"no schedule from rank 0: {received.error or 'no reason given'}")
                if received.fingerprint != fp:
                    raise HookError(f"rank 0 compiled another graph (fingerprint {received.fingerprint}, "
                                    f"this rank {fp})")
                schedule_in = received.decode_schedule()
                apply_schedule(ext, schedule_in, inplace=False)  # the dry run, before voting yes
                ok = True
            except Exception as e:  # noqa: BLE001 - reported through the vote
                reason = f"{type(e).__name__}: {e}"
        agreed, why = rnd.settle("schedule", Vote(ok, fp, reason))
        if not agreed:
            raise HookError(f"ranks did not agree on a schedule, every rank keeps its graph: {why}")
        if channel.rank == 0:
            rnd.release()
        assert ext is not None and schedule_in is not None and fp is not None
        snapshot: _Snapshot | None = None
        try:
            snapshot, reason = self._apply(ext, schedule_in, record, dry_run=False), ""
        except Exception as e:  # noqa: BLE001 - reported through the vote (the graph is restored)
            reason = f"in-place apply failed: {type(e).__name__}: {e}"
        applied, why = rnd.settle("applied", Vote(snapshot is not None, fp, reason))
        if not applied:
            if snapshot is not None:
                _restore(snapshot, gm, record, "another rank could not apply the schedule")
                record.buckets = None
            raise HookError(f"the schedule was not applied on every rank, every rank keeps its graph: {why}")
        record.outcome = "hit" if received.source == "hit" else "solved"
        if result is not None:
            self._store(ext, fp, schedule_in, result, record)
        log.info("fxsched: graph #%d %s by rank 0 and applied on all %d ranks", record.index, record.outcome,
                 channel.world_size)


class _Snapshot:
    """A copy of a GraphModule's graph, meta and submodule names, to rebuild it after a failed
    in-place rewrite (same node names, targets, args and meta; new Node objects)."""

    def __init__(self, gm: fx.GraphModule):
        self.graph = fx.Graph(tracer_cls=gm.graph._tracer_cls)
        copy_graph_into(self.graph, gm.graph)
        self.modules = set(gm._modules)
        self.meta = copy.copy(gm.meta)

    def restore(self, gm: fx.GraphModule, why: str) -> None:
        from torch.fx.graph import _Namespace

        graph = gm.graph
        nodes = list(graph.nodes)
        for node in nodes:  # drop every use first, so the nodes can be erased in any order
            node.args, node.kwargs = (), {}
        for node in reversed(nodes):
            graph.erase_node(node)
        graph._graph_namespace = _Namespace()  # erased names stay reserved otherwise
        copy_graph_into(graph, self.graph)
        for name in set(gm._modules) - self.modules:  # e.g. control_deps subgraphs
            delattr(gm, name)
        gm.meta.clear()
        gm.meta.update(self.meta)
        gm.recompile()
        log.warning("fxsched: %s; the graph was rebuilt from its snapshot", why)


def _restore(snapshot: _Snapshot, gm: fx.GraphModule, record: GraphRecord, why: str) -> None:
    """Rebuild ``gm`` from ``snapshot``; a failure is logged (the caller's error says the rest)."""
    try:
        snapshot.restore(gm, why)
    except Exception as e:  # noqa: BLE001 - nothing more can be done
        log.error("fxsched: could not rebuild graph #%d from its snapshot (%s: %s)", record.index,
                  type(e).__name__, e)


def _rank_and_world() -> tuple[int, int] | None:
    """(rank, world size) of the default group, or None without torch.distributed.

    Part of the uuid because an applied schedule is rank-specific: torch's all_gather bucket
    copies each rank's shard in at its own offset, a constant in the graph. Without it, an FX
    graph cache shared by several ranks (remote cache, shared file system) would serve rank 0's
    code to rank 1, since the cache key is taken before the pass runs.
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - no usable default group: nothing rank-specific
        pass
    return None


def count_collectives(graph: fx.Graph) -> int:
    """The number of ``_c10d_functional`` collectives (not waits) in ``graph``."""
    return sum(1 for n in graph.nodes if collective_kind(n) is not None)


@functools.lru_cache(maxsize=1)
def fxsched_code_hash() -> str:
    """sha256 over the relative path and bytes of every .py file of fxsched's solver, heuristics
    and fxbridge packages (what the pass runs). Computed once per process."""
    import fxsched.fxbridge
    import fxsched.heuristics
    import fxsched.solver

    h = hashlib.sha256()
    for pkg in (fxsched.solver, fxsched.heuristics, fxsched.fxbridge):
        root = Path(pkg.__file__).parent
        for path in sorted(root.rglob("*.py")):
            h.update(f"{pkg.__name__}/{path.relative_to(root).as_posix()}\n".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------- one-call install


def installed_passes() -> list[FxschedPass]:
    """The fxsched passes currently set as Inductor's ``post_grad_custom_post_pass``."""
    from torch._inductor import config as inductor_config
    from torch._inductor.custom_graph_pass import get_custom_graph_passes

    return [p for p in get_custom_graph_passes(inductor_config.post_grad_custom_post_pass)
            if isinstance(p, FxschedPass)]


def _set_passes(fxpass: FxschedPass | None) -> None:
    from torch._inductor import config as inductor_config
    from torch._inductor.custom_graph_pass import get_custom_graph_passes

    others = [p for p in get_custom_graph_passes(inductor_config.post_grad_custom_post_pass)
              if not isinstance(p, FxschedPass)]
    passes = others + ([fxpass] if fxpass is not None else [])  # ours last: it schedules the final graph
    inductor_config.post_grad_custom_post_pass = None if not passes else passes[0] if len(passes) == 1 else passes


# Inductor's scheduler reorders the nodes of every graph for peak memory by default
# (``config.reorder_for_peak_memory``), after the post-grad passes. On an H100 (torch 2.11) it
# moved the reduce_scatters and waits of an applied schedule (benchmarks/device_check.py), so
# the hook turns it off while enabled, as torch's own "lite mode" does to keep a given order;
# the schedule already keeps within its memory budget. The user's value is restored on disable.
_saved_peak_memory_reorder: list[bool] = []


def _keep_inductor_order(keep: bool) -> None:
    from torch._inductor import config as inductor_config

    if keep and not _saved_peak_memory_reorder:
        _saved_peak_memory_reorder.append(bool(inductor_config.reorder_for_peak_memory))
        inductor_config.reorder_for_peak_memory = False
    elif not keep and _saved_peak_memory_reorder:
        inductor_config.reorder_for_peak_memory = _saved_peak_memory_reorder.pop()


def enable(
    time_budget_s: float = 10.0,
    memory_limit: int | float | None = None,
    cache_dir: str | Path | None = None,
    **kw: Any,
) -> FxschedPass:
    """Install fxsched as Inductor's post-grad pass for every later compile; return the pass.
    Turns Inductor's ``reorder_for_peak_memory`` off until :func:`disable`, which would reorder
    the applied schedule.

    ``kw`` are the other :class:`HookConfig` fields (``spmd``, ``mode``, ``workers``, ``seed``,
    ``profile``, ...). Replaces an earlier fxsched pass and keeps other custom passes (ours runs
    last). Invalid settings raise ValueError here, not during a compile.
    """
    fxpass = FxschedPass(HookConfig(time_budget_s=time_budget_s, memory_limit=memory_limit, cache_dir=cache_dir,
                                    **kw))
    _set_passes(fxpass)
    _keep_inductor_order(True)
    log.info("fxsched: compile hook enabled (Inductor's reorder_for_peak_memory off): %s", fxpass.config)
    return fxpass


def disable() -> None:
    """Remove every fxsched pass from Inductor's post-grad passes (others stay), and give
    Inductor's ``reorder_for_peak_memory`` back the value it had before :func:`enable`."""
    _set_passes(None)
    _keep_inductor_order(False)
