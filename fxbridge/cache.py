"""Offline schedule cache: one JSON file per graph fingerprint (DESIGN.md, "Offline cache").

Flow. ``fxsched export`` extracts a graph's problem and records its fingerprint in the problem
file's metadata; ``fxsched solve --cache-dir DIR`` solves it and stores the schedule as
``DIR/<fingerprint>.json``. A later compile sees only the FX graph: it extracts the problem with
the same settings, calls :func:`graph_fingerprint`, and :meth:`ScheduleCache.lookup` finds the
schedule. A changed graph, shape, dtype, process-group size or cost model changes the
fingerprint, so the old entry is simply not found.

Entry file::

    {"format": "fxsched.cache-entry", "version": 1, "fingerprint": "<hex>", "problem": "<name>",
     "schedule": {<schedule_to_dict>}, "solve": {"status": ..., "objective_ns": ...,
     "lower_bound_ns": ..., "method": ..., "config": {...}, ...}}

A bad entry raises :class:`CacheError` (subclasses :class:`CorruptCacheEntry`,
:class:`StaleCacheEntry`) whose message names the file and the field; :meth:`ScheduleCache.lookup`
turns that into a warning and a miss, for compile hooks that must never fail.

Only :func:`graph_fingerprint` needs torch (imported when called), so solving and installing
schedules works on a machine without it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..solver.fingerprint import METADATA_KEY, combine_fingerprint, is_fingerprint, recorded_fingerprint
from ..solver.problem import ProblemError, ScheduleProblem
from ..solver.schedule import Schedule, check_schedule
from ..solver.serialization import load_problem, load_schedule, schedule_from_dict, schedule_to_dict
from ..solver.simulator import simulate

if TYPE_CHECKING:  # pragma: no cover
    import torch.fx

    from .hardware import HardwareProfile

log = logging.getLogger(__name__)

ENTRY_FORMAT = "fxsched.cache-entry"
ENTRY_VERSION = 1


# ---------------------------------------------------------------- fingerprint (FX side)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _canon(x: Any) -> str:
    """A stable text form of one node argument: nodes by name, devices by type only."""
    import torch
    from torch import fx

    if isinstance(x, fx.Node):
        return "%" + x.name
    if x is None or isinstance(x, (bool, int)):
        return repr(x)
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, str):
        return json.dumps(x)
    if isinstance(x, (list, tuple)):
        inner = ",".join(_canon(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    if isinstance(x, dict):
        return "{" + ",".join(f"{_canon(k)}:{_canon(v)}" for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(x, slice):
        return f"slice({_canon(x.start)},{_canon(x.stop)},{_canon(x.step)})"
    if isinstance(x, torch.device):  # cuda:3 on rank 3, cuda:0 on rank 0: one schedule for both
        return f"device({x.type})"
    if isinstance(x, torch.Tensor):
        return _val(x)
    if isinstance(x, (torch.dtype, torch.layout, torch.memory_format)):
        return str(x)
    return f"{type(x).__qualname__}:{_ADDRESS.sub('', repr(x))}"


def _val(v: Any) -> str:
    """Shape, dtype and device type of a node's ``meta['val']`` (recursively for tuples)."""
    import torch

    if isinstance(v, torch.Tensor):
        shape = ",".join(str(s) for s in v.shape)
        return f"T({str(v.dtype).removeprefix('torch.')};{shape};{v.device.type})"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_val(x) for x in v) + ")"
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    return type(v).__qualname__ + ":" + str(v)  # SymInt/SymFloat print their expression


def _target(node: torch.fx.Node) -> str:
    from torch.fx.node import _get_qualified_name

    t = node.target
    if isinstance(t, str):
        return t
    try:
        return _get_qualified_name(t)  # type: ignore[arg-type]
    except Exception:
        return str(t)


def graph_structure_digest(gm: torch.fx.GraphModule) -> str:
    """sha256 over every node in order: kind, name, target, argument topology, kwargs, and the
    shape/dtype/device type of ``meta['val']``. Names are included because schedules name nodes."""
    h = hashlib.sha256()
    for node in gm.graph.nodes:
        line = "|".join((node.op, node.name, _target(node), _canon(node.args), _canon(node.kwargs),
                         _val(node.meta.get("val"))))
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def profile_settings(profile: str | HardwareProfile) -> dict[str, Any]:
    """The hardware profile's parameters as JSON-ready data (name and every number)."""
    from .hardware import get_profile

    hw = get_profile(profile)
    return {
        "name": hw.name,
        "peak_tflops": dict(sorted(hw.peak_tflops.items())),
        "memory_bandwidth_gbps": hw.memory_bandwidth_gbps,
        "kernel_launch_overhead_ns": hw.kernel_launch_overhead_ns,
        "gpus_per_node": hw.gpus_per_node,
        "gpu_generation": hw.gpu_generation,
        "intra_node_bw_gbps": hw.intra_node_bw_gbps,
        "inter_node_bw_gbps": hw.inter_node_bw_gbps,
    }


def graph_fingerprint(
    gm: torch.fx.GraphModule,
    problem: ScheduleProblem,
    *,
    profile: str | HardwareProfile = "h100",
    fuse: bool = True,
) -> str:
    """The cache key of ``gm``: its structure, shapes, dtypes, PG names and sizes, and the
    cost-model inputs (``problem`` is ``extract_problem(gm, profile=profile, fuse=fuse, ...).problem``).

    Export and compile must pass the same settings; the problem's name, metadata and group
    ranks are not part of the key (see :mod:`fxsched.solver.fingerprint`).
    """
    settings = {"profile": profile_settings(profile), "fuse": bool(fuse)}
    return combine_fingerprint(graph_structure_digest(gm), problem, settings)


def with_fingerprint(problem: ScheduleProblem, fingerprint: str) -> ScheduleProblem:
    """A copy of ``problem`` that records ``fingerprint`` in its metadata (saved with the file)."""
    if not is_fingerprint(fingerprint):
        raise ValueError(f"not a fingerprint (64 hex digits): {fingerprint!r}")
    return dataclasses.replace(problem, metadata={**problem.metadata, METADATA_KEY: fingerprint})


# ---------------------------------------------------------------- cache entries


class CacheError(ValueError):
    """A cache entry that cannot be used; names the file and the offending field."""

    def __init__(self, path: str | Path, field_name: str, reason: str):
        self.path, self.field, self.reason = Path(path), field_name, reason
        super().__init__(f"{path}: field {field_name!r}: {reason}")


class CorruptCacheEntry(CacheError):
    """Unreadable file, bad JSON, wrong format or version, missing or mistyped field."""


class StaleCacheEntry(CacheError):
    """A readable entry for another graph: fingerprint mismatch, or a schedule that does not fit
    the problem."""


@dataclass(frozen=True)
class SolveInfo:
    """How a cached schedule was obtained (stored beside it, informational)."""

    status: str
    objective_ns: int | None = None
    lower_bound_ns: int | None = None
    method: str = ""
    runtime_s: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    exposed_ns: int | None = None
    peak_memory_bytes: int | None = None
    created: str = ""

    @property
    def gap(self) -> float | None:
        if self.objective_ns is None or self.lower_bound_ns is None or self.objective_ns <= 0:
            return None
        return max(0.0, (self.objective_ns - self.lower_bound_ns) / self.objective_ns)

    @classmethod
    def from_result(cls, result: Any, config: Any = None) -> SolveInfo:
        """From a ``solver.cpsat.Result`` (and the ``SolveConfig`` it was solved with)."""
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            cfg = dataclasses.asdict(config)
        else:
            cfg = dict(config or {})
        return cls(status=str(getattr(result.status, "value", result.status)), objective_ns=int(result.objective),
                   lower_bound_ns=int(result.lower_bound), method=result.method, runtime_s=float(result.runtime),
                   config=cfg, peak_memory_bytes=int(result.peak_memory_bytes))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gap"] = self.gap
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SolveInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class CacheEntry:
    """One loaded cache file."""

    path: Path
    fingerprint: str
    problem_name: str
    schedule: Schedule
    solve: SolveInfo


class ScheduleCache:
    """A directory of ``<fingerprint>.json`` schedule files."""

    def __init__(self, cache_dir: str | Path):
        self.dir = Path(cache_dir).expanduser()

    def path_for(self, fingerprint: str) -> Path:
        if not is_fingerprint(fingerprint):
            raise ValueError(f"not a fingerprint (64 hex digits): {fingerprint!r}")
        return self.dir / f"{fingerprint}.json"

    def fingerprints(self) -> list[str]:
        """Fingerprints of the entries present (by file name; contents not checked)."""
        if not self.dir.is_dir():
            return []
        return sorted(p.stem for p in self.dir.glob("*.json") if is_fingerprint(p.stem))

    # ---- read
    def get_entry(self, fingerprint: str, problem: ScheduleProblem | None = None) -> CacheEntry | None:
        """The entry for ``fingerprint``, or None on a miss. Raises CacheError on a corrupt or
        stale entry; with ``problem``, the schedule must also pass ``check_schedule`` against it."""
        path = self.path_for(fingerprint)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CorruptCacheEntry(path, "<file>", f"cannot read ({e.strerror or e})") from e
        entry = parse_entry(raw, path)
        if entry.fingerprint != fingerprint:
            raise StaleCacheEntry(path, "fingerprint",
                                  f"entry is for {entry.fingerprint}, requested {fingerprint}")
        if problem is not None:
            violations = check_schedule(problem, entry.schedule)
            if violations:
                shown = "; ".join(str(v) for v in violations[:3])
                more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
                raise StaleCacheEntry(path, "schedule", f"does not fit problem {problem.name!r}: {shown}{more}")
        return entry

    def get(self, fingerprint: str, problem: ScheduleProblem | None = None) -> Schedule | None:
        """The cached schedule, or None on a miss; raises CacheError on a bad entry."""
        entry = self.get_entry(fingerprint, problem)
        return None if entry is None else entry.schedule

    def lookup(self, fingerprint: str, problem: ScheduleProblem | None = None) -> Schedule | None:
        """As :meth:`get`, but a bad entry is logged as a warning and treated as a miss
        (what a compile hook wants: never fail the compile because of the cache)."""
        try:
            return self.get(fingerprint, problem)
        except CacheError as e:
            log.warning("schedule cache: ignoring unusable entry: %s", e)
            return None

    def entry_token(self, fingerprint: str) -> str | None:
        """sha256 of the entry file's bytes (None when absent): changes whenever the entry does,
        e.g. for a compile hook's ``uuid()``."""
        try:
            return hashlib.sha256(self.path_for(fingerprint).read_bytes()).hexdigest()
        except OSError:
            return None

    def state_token(self) -> str:
        """sha256 over every entry's name and bytes: changes whenever any entry changes."""
        h = hashlib.sha256()
        for fp in self.fingerprints():
            h.update(fp.encode())
            h.update((self.entry_token(fp) or "-").encode())
        return h.hexdigest()

    # ---- write
    def put(
        self,
        fingerprint: str,
        schedule: Schedule,
        *,
        problem: ScheduleProblem | None = None,
        problem_name: str | None = None,
        solve: SolveInfo | None = None,
    ) -> Path:
        """Store ``schedule`` under ``fingerprint`` atomically (temporary file, then ``os.replace``).

        With ``problem``, the schedule must pass ``check_schedule`` against it, and a fingerprint
        the problem recorded must equal ``fingerprint`` (ValueError otherwise).
        """
        path = self.path_for(fingerprint)
        if problem is not None:
            recorded = recorded_fingerprint(problem)
            if recorded is not None and recorded != fingerprint:
                raise ValueError(f"problem {problem.name!r} records fingerprint {recorded}, not {fingerprint}")
            violations = check_schedule(problem, schedule)
            if violations:
                raise ValueError(f"refusing to cache an invalid schedule for {problem.name!r}: "
                                 + "; ".join(str(v) for v in violations[:3]))
            problem_name = problem_name or problem.name
        solve = solve or SolveInfo(status="unknown")
        if not solve.created:
            solve = dataclasses.replace(solve, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        doc = {
            "format": ENTRY_FORMAT,
            "version": ENTRY_VERSION,
            "fingerprint": fingerprint,
            "problem": problem_name or "",
            "schedule": schedule_to_dict(schedule, problem_name),
            "solve": solve.to_dict(),
        }
        atomic_write_text(path, json.dumps(doc, indent=1))
        log.info("schedule cache: wrote %s", path)
        return path


def parse_entry(raw: bytes | str, path: str | Path) -> CacheEntry:
    """Validate one entry file's contents; raise CorruptCacheEntry/StaleCacheEntry naming ``path``."""
    path = Path(path)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCacheEntry(path, "<json>", f"not valid JSON ({e})") from e
    if not isinstance(doc, dict):
        raise CorruptCacheEntry(path, "<json>", f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != ENTRY_FORMAT:
        raise CorruptCacheEntry(path, "format", f"expected {ENTRY_FORMAT!r}, got {doc.get('format')!r}")
    if doc.get("version") != ENTRY_VERSION:
        raise CorruptCacheEntry(path, "version",
                                f"version {doc.get('version')!r} is not supported (this fxsched reads {ENTRY_VERSION})")
    for name, typ in (("fingerprint", str), ("problem", str), ("schedule", dict), ("solve", dict)):
        if name not in doc:
            raise CorruptCacheEntry(path, name, "missing")
        if not isinstance(doc[name], typ):
            raise CorruptCacheEntry(path, name, f"expected {typ.__name__}, got {type(doc[name]).__name__}")
    fp = doc["fingerprint"]
    if not is_fingerprint(fp):
        raise CorruptCacheEntry(path, "fingerprint", f"not a fingerprint (64 hex digits): {fp!r}")
    if is_fingerprint(path.stem) and path.stem != fp:
        raise StaleCacheEntry(path, "fingerprint", f"file is named {path.stem} but holds an entry for {fp}")
    try:
        schedule = schedule_from_dict(doc["schedule"], f"{path} (field 'schedule')")
    except ProblemError as e:
        raise CorruptCacheEntry(path, "schedule", str(e).split(": ", 1)[-1]) from e
    try:
        solve = SolveInfo.from_dict(doc["solve"])
    except (TypeError, ValueError) as e:
        raise CorruptCacheEntry(path, "solve", str(e)) from e
    return CacheEntry(path, fp, doc["problem"], schedule, solve)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part:
    a temporary file in the same directory, fsync, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def install(
    schedule_file: str | Path,
    problem_file: str | Path,
    cache_dir: str | Path,
    *,
    fingerprint: str | None = None,
    solve: SolveInfo | None = None,
) -> Path:
    """Install a solved schedule file into the cache under its problem's fingerprint.

    The fingerprint is the one ``fxsched export`` recorded in the problem file (or the given one).
    The schedule is checked against the problem and scored by the simulator first.
    """
    problem = load_problem(problem_file)
    schedule = load_schedule(schedule_file)
    fp = fingerprint or recorded_fingerprint(problem)
    if fp is None:
        raise ValueError(f"{problem_file}: field 'metadata.{METADATA_KEY}': missing; re-export the problem "
                         "with `fxsched export` (which records it) or give the fingerprint explicitly")
    violations = check_schedule(problem, schedule)
    if violations:
        raise ValueError(f"{schedule_file}: does not fit {problem_file}: "
                         + "; ".join(str(v) for v in violations[:3]))
    sim = simulate(problem, schedule, check=False)
    if solve is None:
        solve = SolveInfo(status="installed", method=f"file:{Path(schedule_file).name}")
    solve = dataclasses.replace(solve, objective_ns=solve.objective_ns or sim.makespan_ns,
                                exposed_ns=sim.exposed_ns, peak_memory_bytes=sim.peak_memory_bytes)
    return ScheduleCache(cache_dir).put(fp, schedule, problem=problem, solve=solve)
