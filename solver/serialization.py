"""JSON round trip for problems and schedules, with a schema version.

Files carry ``{"format": "fxsched.problem" | "fxsched.schedule", "schema_version": N, ...}``.
Loading a file of another version, or a corrupt or truncated file, raises ProblemError naming
the file and what is wrong, never a bare KeyError or JSONDecodeError.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .problem import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProblemError,
    ProcessGroup,
    ScheduleProblem,
    Storage,
)
from .schedule import Schedule

SCHEMA_VERSION = 1
PROBLEM_FORMAT = "fxsched.problem"
SCHEDULE_FORMAT = "fxsched.schedule"


def problem_to_dict(p: ScheduleProblem) -> dict[str, Any]:
    """A JSON-ready dict; default-valued op fields are left out to keep files small."""
    ops = []
    for op in p.ops:
        d: dict[str, Any] = {"name": op.name, "kind": op.kind.value}
        for key in ("runtime_ns", "heavy", "target", "module", "waits_on"):
            val = getattr(op, key)
            if val:
                d[key] = val
        for key in ("deps", "allocates", "uses"):
            val = getattr(op, key)
            if val:
                d[key] = list(val)
        if op.collective is not None:
            d["collective"] = {**asdict(op.collective), "kind": op.collective.kind.value}
        ops.append(d)
    return {
        "format": PROBLEM_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "name": p.name,
        "metadata": dict(p.metadata),
        "groups": [{"name": g.name, "size": g.size, "ranks": list(g.ranks)} for g in p.groups],
        "storages": [asdict(s) for s in p.storages],
        "comm_curves": [
            {"group": c.group, "kind": c.kind.value, "points": [list(x) for x in c.points]}
            for c in p.comm_curves
        ],
        "bucket_costs": asdict(p.bucket_costs),
        "link_contention": p.link_contention,
        "ops": ops,
    }


def problem_from_dict(d: dict[str, Any], source: str = "<dict>") -> ScheduleProblem:
    """Inverse of :func:`problem_to_dict`; raises ProblemError naming ``source`` on bad data."""
    _check_header(d, PROBLEM_FORMAT, source)
    try:
        ops = []
        for o in d["ops"]:
            coll = None
            if "collective" in o:
                c = dict(o["collective"])
                c["kind"] = CollectiveKind(c["kind"])
                coll = CollectiveInfo(**c)
            ops.append(Op(
                name=o["name"], kind=OpKind(o["kind"]), runtime_ns=o.get("runtime_ns", 0),
                deps=tuple(o.get("deps", ())), allocates=tuple(o.get("allocates", ())),
                uses=tuple(o.get("uses", ())), collective=coll, waits_on=o.get("waits_on"),
                heavy=bool(o.get("heavy", False)), target=o.get("target", ""), module=o.get("module"),
            ))
        return ScheduleProblem(
            ops=tuple(ops),
            storages=tuple(Storage(**s) for s in d["storages"]),
            groups=tuple(ProcessGroup(g["name"], g["size"], tuple(g.get("ranks", ()))) for g in d["groups"]),
            comm_curves=tuple(
                CommCurve(c["group"], CollectiveKind(c["kind"]), tuple((a, b) for a, b in c["points"]))
                for c in d.get("comm_curves", ())
            ),
            bucket_costs=BucketCosts(**d.get("bucket_costs", {})),
            link_contention=float(d.get("link_contention", 0.0)),
            name=d.get("name", "problem"),
            metadata=dict(d.get("metadata", {})),
        )
    except ProblemError as e:
        raise ProblemError(f"{source}: {e}") from e
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise ProblemError(f"{source}: corrupt problem data ({type(e).__name__}: {e})") from e


def schedule_to_dict(s: Schedule, problem_name: str | None = None) -> dict[str, Any]:
    return {
        "format": SCHEDULE_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "problem": problem_name,
        "order": list(s.order),
        "buckets": [list(b) for b in s.buckets],
        "multi_dtype": s.multi_dtype,
    }


def schedule_from_dict(d: dict[str, Any], source: str = "<dict>") -> Schedule:
    _check_header(d, SCHEDULE_FORMAT, source)
    try:
        order = d["order"]
        buckets = d.get("buckets", [])
        if not all(isinstance(x, str) for x in order) or not all(
            isinstance(b, list) and all(isinstance(x, str) for x in b) for b in buckets
        ):
            raise TypeError("order and buckets must hold op names (strings)")
        return Schedule(order=tuple(order), buckets=tuple(tuple(b) for b in buckets),
                        multi_dtype=bool(d.get("multi_dtype", False)))
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ProblemError(f"{source}: corrupt schedule data ({type(e).__name__}: {e})") from e


def _check_header(d: Any, fmt: str, source: str) -> None:
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise ProblemError(f"{source}: not an {fmt} file")
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProblemError(
            f"{source}: schema_version {version!r} is not supported (this fxsched reads {SCHEMA_VERSION})"
        )


def _read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ProblemError(f"{path}: corrupt JSON ({e})") from e
    except UnicodeDecodeError as e:
        raise ProblemError(f"{path}: not a text file ({e})") from e
    except OSError as e:
        raise ProblemError(f"{path}: cannot read ({e.strerror or e})") from e


def save_problem(p: ScheduleProblem, path: str | Path) -> None:
    Path(path).write_text(json.dumps(problem_to_dict(p), separators=(",", ":")))


def load_problem(path: str | Path) -> ScheduleProblem:
    return problem_from_dict(_read_json(path), str(path))


def save_schedule(s: Schedule, path: str | Path, problem_name: str | None = None) -> None:
    Path(path).write_text(json.dumps(schedule_to_dict(s, problem_name), indent=1))


def load_schedule(path: str | Path) -> Schedule:
    return schedule_from_dict(_read_json(path), str(path))
