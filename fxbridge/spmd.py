"""SPMD safety for the compile hook: every rank applies the byte-identical schedule, or none does.

DESIGN.md ("SPMD safety"): if two ranks issue a process group's collectives in different orders
or buckets, NCCL hangs or silently mixes up data. The hook offers two ways to rule that out:

* ``spmd="deterministic"`` (default): every rank solves on its own with a deterministic
  configuration (:func:`deterministic_solve_config`: fixed seed, CP-SAT's deterministic time
  limit, a fixed worker count with ``interleave_search``). Identical graphs, settings and cache
  contents give identical schedules; no communication at compile time.
* ``spmd="broadcast"``: rank 0 looks up or solves, then broadcasts a :class:`Payload` on the
  default group. Each rank checks that rank 0's fingerprint is its own and dry-runs the schedule,
  then all ranks vote (an all-gather of ``(ok, fingerprint)``); the schedule is applied only if
  every rank voted yes for the same fingerprint, otherwise every rank keeps its graph unchanged.

Communication goes through a :class:`Channel` so the protocol can be tested in one process with a
fake channel; :class:`TorchChannel` is the real one (``torch.distributed`` object collectives).
This module never solves or applies anything itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..solver.cpsat import SolveConfig
from ..solver.schedule import Schedule
from ..solver.serialization import schedule_from_dict, schedule_to_dict

log = logging.getLogger(__name__)

PAYLOAD_FORMAT = "fxsched.spmd-payload"


def deterministic_solve_config(
    *,
    mode: str = "fixed",
    memory_budget: int | float | None = None,
    seed: int = 0,
    workers: int = 1,
) -> SolveConfig:
    """The solver configuration under which every rank computes the same schedule.

    ``deterministic=True`` makes :func:`fxsched.solver.cpsat.solve` stop on CP-SAT's
    ``max_deterministic_time`` (not the wall clock) with ``random_seed=seed`` and a fixed
    ``num_workers`` (``interleave_search`` when more than one), so the result depends only on
    the problem and these values, not on how loaded each rank's machine is.
    """
    return SolveConfig(mode=mode, memory_budget=memory_budget, seed=seed, workers=workers, deterministic=True)


def schedule_json(schedule: Schedule) -> str:
    """The canonical JSON text of a schedule (sorted keys, no spaces): equal on two ranks iff
    the schedules are equal, so it is what ranks compare and tests diff."""
    return json.dumps(schedule_to_dict(schedule), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Payload:
    """What rank 0 broadcasts for one graph: its fingerprint and schedule (or why it has none)."""

    fingerprint: str | None
    schedule: str | None  # schedule_json(...) or None when rank 0 has no schedule
    source: str = ""  # "hit" (from rank 0's cache) or "solved"
    status: str | None = None
    objective_ns: int | None = None
    lower_bound_ns: int | None = None
    error: str | None = None

    def to_obj(self) -> dict[str, Any]:
        """Plain data (what goes through pickle in ``broadcast_object_list``)."""
        return {"format": PAYLOAD_FORMAT, **self.__dict__}

    @classmethod
    def from_obj(cls, obj: Any) -> Payload:
        """Parse a received object; a malformed one becomes a payload with ``error`` set."""
        if not isinstance(obj, dict) or obj.get("format") != PAYLOAD_FORMAT:
            return cls(None, None, error=f"malformed broadcast payload: {type(obj).__name__}")
        names = {"fingerprint", "schedule", "source", "status", "objective_ns", "lower_bound_ns", "error"}
        return cls(**{k: v for k, v in obj.items() if k in names})

    def decode_schedule(self) -> Schedule:
        """The schedule; raises ValueError when there is none or it does not parse."""
        if self.schedule is None:
            raise ValueError(f"rank 0 sent no schedule ({self.error or 'no reason given'})")
        return schedule_from_dict(json.loads(self.schedule), "broadcast schedule")


class Channel(Protocol):
    """The two collectives the broadcast protocol needs, on one group of ranks."""

    rank: int
    world_size: int

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (other ranks pass None)."""
        ...

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        ...


class TorchChannel:
    """:class:`Channel` over ``torch.distributed`` object collectives on ``group`` (default: WORLD).

    The collectives run with every dispatch mode (FakeTensorMode, ...) switched off: the hook runs
    inside Inductor's compile, where object collectives must still move real bytes.
    """

    def __init__(self, group: Any = None):
        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._src = dist.get_global_rank(group, 0) if group is not None else 0

    def broadcast(self, obj: Any) -> Any:
        import torch.distributed as dist
        from torch.utils._python_dispatch import _disable_current_modes

        box = [obj if self.rank == 0 else None]
        with _disable_current_modes():
            dist.broadcast_object_list(box, src=self._src, group=self.group)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist
        from torch.utils._python_dispatch import _disable_current_modes

        out: list[Any] = [None] * self.world_size
        with _disable_current_modes():
            dist.all_gather_object(out, obj, group=self.group)
        return out


def default_channel() -> TorchChannel | None:
    """A channel on the default group when torch.distributed runs more than one rank, else None
    (one process: nothing to agree on, the hook solves locally)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return TorchChannel()
    except Exception as e:  # noqa: BLE001 - an unusable default group means: no channel
        log.warning("fxsched: torch.distributed is initialized but unusable (%s); solving locally", e)
    return None


@dataclass(frozen=True)
class Vote:
    """One rank's answer after the broadcast: can it apply rank 0's schedule to its graph?"""

    ok: bool
    fingerprint: str | None
    reason: str = ""


def agreement(votes: Sequence[Any]) -> tuple[bool, str]:
    """``(True, "")`` when every rank voted yes for one fingerprint, else ``(False, why)``."""
    parsed: list[Vote] = []
    for r, v in enumerate(votes):
        if not isinstance(v, dict) or not {"ok", "fingerprint"} <= set(v):
            return False, f"rank {r} sent a malformed vote"
        parsed.append(Vote(bool(v["ok"]), v["fingerprint"], str(v.get("reason", ""))))
    no = [(r, v.reason) for r, v in enumerate(parsed) if not v.ok]
    if no:
        return False, "; ".join(f"rank {r}: {why}" for r, why in no[:4])
    fps = {v.fingerprint for v in parsed}
    if len(fps) != 1:
        return False, f"ranks compiled different graphs ({len(fps)} distinct fingerprints)"
    return True, ""


def vote_obj(vote: Vote) -> dict[str, Any]:
    return {"ok": vote.ok, "fingerprint": vote.fingerprint, "reason": vote.reason}
