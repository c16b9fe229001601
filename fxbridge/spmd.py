"""SPMD safety for the compile hook: every rank applies the byte-identical schedule, or none does.

DESIGN.md ("SPMD safety"): if two ranks issue a process group's collectives in different orders
or buckets, NCCL hangs or silently mixes up data. The hook offers two ways to rule that out:

* ``spmd="deterministic"`` (default): every rank solves on its own with a deterministic
  configuration (:func:`deterministic_solve_config`: fixed seed, CP-SAT's deterministic time
  limit, a fixed worker count with ``interleave_search``). Identical graphs, settings and cache
  contents give identical schedules; no communication at compile time.
* ``spmd="broadcast"``: rank 0 looks up or solves, and the ranks agree in one :class:`Round`
  per graph, on the process group's key-value store (:class:`TorchChannel`):

  1. rank 0 publishes a :class:`Payload`; every other rank waits for it;
  2. each rank checks that rank 0's fingerprint is its own, dry-runs the schedule and votes;
     the phase is settled (:meth:`Round.settle`); on commit every rank applies in place;
  3. each rank votes on whether its in-place apply worked; unless all did, every rank restores
     its graph.

  Settling a phase: each rank publishes its vote; a rank that voted yes waits for all votes and
  proposes to commit iff all are yes for one fingerprint; a rank that voted no, or gave up
  waiting, proposes to abort. The first proposal stored (an atomic ``compare_set``) is every
  rank's decision. Say rank 0 is slow to solve and rank 1 gives up waiting for the schedule:
  rank 1 votes no, so when rank 0 publishes later it finds rank 1's "no" (or the abort decision)
  and keeps its graph too. If rank 1 gave up waiting for the *votes* after voting yes, rank 0
  sees only yes votes but its commit proposal loses to rank 1's abort. Either way no rank
  applies alone.

Timeouts: every wait of a round ends after ``HookConfig.broadcast_timeout_s`` (default 30 min,
torch's default gloo timeout), which must cover rank 0's solve and the ranks' compile skew; a
rank that gives up logs a warning naming it, and every rank keeps its graph. No rank waits
forever, and the process group's own timeout plays no part.

Why a store and not collectives on the group (the first version broadcast with
``broadcast_object_list``): a collective that times out breaks the group (gloo closes the
connection: "Application timeout caused pair closure", so the training step's next collective
fails) and leaves the ranks' collective sequences misaligned; and no exchange of messages with
time-outs can make every rank decide alike (the last message may always be the one that came too
late), while an atomic compare-and-set can. The store also needs no device work at compile time.

The protocol talks to a :class:`Channel` so it can be tested in one process with a fake one.
This module never solves or applies anything itself.
"""

from __future__ import annotations

import json
import logging
import time
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
        """Plain JSON-ready data (what :meth:`Round.broadcast` publishes)."""
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


class ChannelTimeout(TimeoutError):
    """A wait on a :class:`Channel` ran out of time; ``missing`` are the keys still unset."""

    def __init__(self, missing: Sequence[str], timeout_s: float):
        super().__init__(f"{len(missing)} key(s) still unset after {timeout_s:g} s: {', '.join(missing[:4])}")
        self.missing = list(missing)


class Channel(Protocol):
    """A key-value store shared by one group of ranks (what a :class:`Round` runs on).

    Values are text. ``set_once`` must be atomic: whichever rank stores first, every rank gets
    that value back. :class:`StoreChannel` is the real one; tests use an in-memory fake.
    """

    rank: int
    world_size: int

    def new_round(self) -> str:
        """A fresh key prefix; the n-th call on each rank returns the same prefix."""
        ...

    def set(self, key: str, value: str) -> None:
        ...

    def wait(self, keys: Sequence[str], timeout_s: float) -> list[str]:
        """The values of ``keys`` once all are set; :class:`ChannelTimeout` after ``timeout_s``."""
        ...

    def set_once(self, key: str, value: str) -> str:
        """Store ``value`` unless ``key`` holds one already; return what ``key`` holds."""
        ...

    def delete(self, key: str) -> None:
        ...


class StoreChannel:
    """:class:`Channel` on a c10d ``Store`` (keys under ``fxsched/spmd/``).

    ``wait`` polls ``check`` (every 2 ms at first, then at most every 0.2 s) rather than using
    ``Store.wait``, so giving up leaves nothing pending on the store's connection.
    """

    PREFIX = "fxsched/spmd"
    POLL_S = (0.002, 0.2)

    def __init__(self, store: Any, rank: int, world_size: int):
        import torch.distributed as dist

        self.store = dist.PrefixStore(self.PREFIX, store)
        self.rank, self.world_size = rank, world_size

    def new_round(self) -> str:
        # a per-rank counter kept in the store: a new process group (new store) starts again at 1
        return f"r{self.store.add(f'rounds/{self.rank}', 1)}"

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def wait(self, keys: Sequence[str], timeout_s: float) -> list[str]:
        keys = list(keys)
        deadline = time.monotonic() + timeout_s
        delay = self.POLL_S[0]
        while not self.store.check(keys):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelTimeout([k for k in keys if not self.store.check([k])], timeout_s)
            time.sleep(min(delay, left))
            delay = min(2 * delay, self.POLL_S[1])
        return [self.store.get(k).decode() for k in keys]

    def set_once(self, key: str, value: str) -> str:
        return self.store.compare_set(key, "", value).decode()

    def delete(self, key: str) -> None:
        self.store.delete_key(key)


class TorchChannel(StoreChannel):
    """:class:`StoreChannel` on the store of a ``torch.distributed`` process group (default:
    the default group), with the group's ranks. Every process group has one (a TCPStore under
    torchrun); nothing runs on the group itself, so no device work at compile time."""

    def __init__(self, group: Any = None):
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_process_group_store

        pg = group if group is not None else dist.group.WORLD
        super().__init__(_get_process_group_store(pg), dist.get_rank(group), dist.get_world_size(group))


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


COMMIT, ABORT = "commit", "abort:"  # a phase's decision: COMMIT, or ABORT followed by why


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class Round:
    """One graph's agreement among the ranks of ``channel`` (see the module docstring).

    Every rank opens one round per graph, in the same order. Each wait (:meth:`broadcast` on a
    non-zero rank, the vote wait of each :meth:`settle`) gives up after ``timeout_s`` seconds
    (``HookConfig.broadcast_timeout_s``); a rank that gives up proposes to abort, which then
    either is every rank's decision or loses to a commit that this rank can still follow.
    Neither method raises: problems become "no" votes and abort proposals.
    """

    def __init__(self, channel: Channel, timeout_s: float):
        self.channel, self.timeout_s = channel, timeout_s
        self.prefix = channel.new_round()

    def key(self, *parts: object) -> str:
        return "/".join((self.prefix, *map(str, parts)))

    def broadcast(self, payload: Payload | None) -> Payload:
        """Rank 0 publishes ``payload`` and gets it back; another rank waits for it. A rank that
        gets none (time-out, store error, garbage) gets a payload with ``error`` set: it votes no."""
        ch, key = self.channel, self.key("payload")
        try:
            if ch.rank == 0:
                assert payload is not None, "rank 0 must publish a payload"
                ch.set(key, json.dumps(payload.to_obj()))
                return payload
            (text,) = ch.wait([key], self.timeout_s)
            return Payload.from_obj(_loads(text))
        except ChannelTimeout:
            log.warning("fxsched: no schedule from rank 0 within broadcast_timeout_s=%g s (round %s); this rank "
                        "votes to keep every graph unchanged. Raise HookConfig.broadcast_timeout_s if rank 0 is "
                        "just slow to compile and solve", self.timeout_s, self.prefix)
            return Payload(None, None, error=f"none came within broadcast_timeout_s={self.timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - becomes a "no" vote
            return Payload(None, None, error=f"broadcast failed: {type(e).__name__}: {e}")

    def release(self) -> None:
        """Rank 0 drops the payload from the store once the schedule phase commits (every rank
        voted yes, so every rank has read it); best effort."""
        try:
            self.channel.delete(self.key("payload"))
        except Exception as e:  # noqa: BLE001 - only memory on the store's host
            log.debug("fxsched: could not delete %s: %s", self.key("payload"), e)

    def settle(self, phase: str, vote: Vote) -> tuple[bool, str]:
        """Publish this rank's ``vote`` for ``phase`` and return the phase's decision, the same on
        every rank: ``(True, "")`` to go ahead, ``(False, why)`` when every rank must keep (or
        restore) its graph.

        A rank that votes yes waits for every vote and proposes to commit iff all are yes for one
        fingerprint; one that votes no, or gives up waiting, proposes to abort. The first proposal
        stored (``set_once``) is the decision. Commit needs every rank's yes, so a rank that voted
        no never has to apply. Only when the store fails here can ranks disagree (logged as an
        error; the job's rendezvous is then gone anyway).
        """
        ch = self.channel
        proposal = ""
        try:
            ch.set(self.key(phase, "vote", ch.rank), json.dumps(vote_obj(vote)))
            if not vote.ok:
                proposal = f"rank {ch.rank}: {vote.reason}"
            else:
                keys = [self.key(phase, "vote", r) for r in range(ch.world_size)]
                ok, why = agreement([_loads(t) for t in ch.wait(keys, self.timeout_s)])
                proposal = "" if ok else why
        except ChannelTimeout as e:
            ranks = sorted(int(k.rsplit("/", 1)[1]) for k in e.missing)
            proposal = (f"rank {ch.rank}: no {phase} vote from rank(s) {ranks[:8]} within "
                        f"broadcast_timeout_s={self.timeout_s:g} s")
            log.warning("fxsched: %s (round %s); every rank keeps its graph unchanged", proposal, self.prefix)
        except Exception as e:  # noqa: BLE001 - an abort proposal
            proposal = f"rank {ch.rank}: {phase} vote failed: {type(e).__name__}: {e}"
        try:
            decision = ch.set_once(self.key(phase, "decision"), ABORT + proposal if proposal else COMMIT)
        except Exception as e:  # noqa: BLE001 - cannot learn the decision: keep the graph
            log.error("fxsched: round %s: could not read the %s decision (%s: %s); this rank keeps its graph, "
                      "other ranks may not", self.prefix, phase, type(e).__name__, e)
            return False, f"no {phase} decision: {type(e).__name__}: {e}"
        if decision == COMMIT and vote.ok:
            return True, ""
        if decision == COMMIT:  # impossible unless something else writes these keys
            log.error("fxsched: round %s: %s committed without this rank's yes", self.prefix, phase)
            return False, f"{phase} committed without rank {ch.rank}'s yes"
        return False, decision[len(ABORT):] if decision.startswith(ABORT) else f"bad decision {decision!r}"
