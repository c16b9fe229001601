"""The torch-free half of a graph fingerprint: a canonical digest of a problem and its settings.

The schedule cache keys each schedule by a fingerprint of the graph it was solved for
(DESIGN.md, "Offline cache"). ``fxsched.fxbridge.cache.graph_fingerprint`` hashes the FX
graph's structure (torch) and combines it here with the digest of the extracted problem,
which carries every cost-model input that reached the solver: op runtimes, collective sizes
and cost curves, storages, process-group sizes and bucket copy prices.

Left out on purpose, so that every rank and every re-trace computes the same key:

* ``problem.name`` and ``problem.metadata`` (labels; the metadata holds the fingerprint itself);
* the global ranks of each process group (rank 0 and rank 2 of a 2-D mesh see different TP
  groups of the same size; NCCL needs them to share one schedule).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from .problem import ScheduleProblem
from .serialization import problem_to_dict

FINGERPRINT_VERSION = 1
METADATA_KEY = "fingerprint"  # where an exported problem records the fingerprint of its graph
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no spaces): the form every digest is taken of."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def problem_digest(problem: ScheduleProblem) -> str:
    """sha256 of the problem's canonical JSON, without its name, metadata and group ranks."""
    d = problem_to_dict(problem)
    d.pop("name", None)
    d.pop("metadata", None)
    d["groups"] = [{"name": g["name"], "size": g["size"]} for g in d["groups"]]
    return hashlib.sha256(canonical_json(d)).hexdigest()


def combine_fingerprint(graph_digest: str, problem: ScheduleProblem, settings: Mapping[str, Any]) -> str:
    """The fingerprint: sha256 over the scheme version, the graph's structural digest, the
    problem digest and the extraction settings (JSON-ready values, e.g. the hardware profile)."""
    payload = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "graph": graph_digest,
        "problem": problem_digest(problem),
        "settings": dict(settings),
    }
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def is_fingerprint(value: object) -> bool:
    """True for a well-formed fingerprint (64 lowercase hex digits); cache file names rely on it."""
    return isinstance(value, str) and bool(_HEX64.match(value))


def recorded_fingerprint(problem: ScheduleProblem) -> str | None:
    """The fingerprint an exported problem file recorded in its metadata, if any."""
    fp = problem.metadata.get(METADATA_KEY)
    return fp if is_fingerprint(fp) else None
