"""More hidden collectives at no greater makespan: a count-first local search.

Entry point: :func:`hide_collectives`. The searches before it rank schedules by makespan alone,
so an answer keeps stalls of a few microseconds wherever closing one would delay something
else by as much. DESIGN.md also counts the collectives whose wait stalls ("hidden/hideable"):
a stall closed while the makespan stays makes one more collective hidden, and its runtime then
has slack, so it still hides when it runs a little longer than the cost model says. Here each
move is scored by the number of hidden hideable collectives first and the makespan second, and
kept only while the makespan stays within ``max_makespan_ns`` (by default the input's: never
longer) and the peak memory within ``budget_bytes`` (by default the input's: never higher). A
larger makespan cap trades makespan for hidden collectives on purpose (``SolveConfig.hide_slack``).

Six moves per stalled lone collective or bucket, each valid by construction (in the fixed mode
no compute op passes another, so the answer stays in the fixed mode's space: only waits, issues
and the ops a collective's chain carries move relative to the compute):

* **pull**: a compute op after the wait (within ``reach`` positions) that does not depend on the
  unit and whose inputs all exist before the wait moves to just before it (into the window);
* **gathered pull**: where no single op lasts the stall, the first ops after the wait that can
  run before it, in their order, until they last it together (:func:`.concentrate.pulled`; the
  start of a comm-bound backward: its first gathers stall for milliseconds while microsecond ops
  that need none of them wait behind);
* **defer**: a compute op before the issue (within ``reach``) that is no ancestor of the unit
  moves to just after the issue, with every op between them that depends on it
  (:class:`.reorder.Deferrals`: its cast and its own collective go with it);
* **sink**: the wait of a lone collective moves later, never past its first user;
* **jump**: a lone collective that waits in its group's queue behind lone units issued before it
  is issued before one of them, with its ancestors between (the FIFO order, not the compute, changes);
* **merge**: the wait of a later stalled unit that is already issued moves to just before this
  one's wait, which then finds its collective done. Where no compute runs between the two waits
  (two reduce-scatters waited back to back at the end of a backward) the compute stream idles
  until the later one ends either way, so the makespan stays and one stall goes: the waits of
  one idle stretch belong together, the one that ends last first (on one group, the one issued
  last: FIFO ends them in issue order). :func:`.concentrate.reordered_runs` does this for runs
  of waits and zero-cost ops before this search; a merge also crosses a bucket's issue, and
  where compute runs between, that compute now runs after the longer stall, which only a
  makespan cap above the answer's admits.

A pull or a deferral that moves less compute than the stall cannot close it alone, so only
those that move at least the stall are tried. Each round keeps the best move found over every
stalled unit, least exposed first; the search stops when no move gains, after ``max_evals``
candidates, or at ``deadline``. Candidates are ranked by :func:`..solver.simulator.makespan_hidden_at`
and the memory of the best checked (:func:`..solver.simulator.peak_at`). On the tp_2x4
backward's 60 s answer (176 of 198 hidden, 31,195.2 us) it hid 9 more and ended 2.6 us shorter.
On a 60 s answer of the 4-node FSDP backward (5 of 9 units hidden, 160,588.2 us) a merge and a
gathered pull hid 2 more units (54 to 115 of its 149 collectives) at the same makespan and peak.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from itertools import chain

import numpy as np

from ..solver.problem import OpKind, ScheduleProblem, bit_mask
from ..solver.schedule import Schedule
from ..solver.sim_tables import sim_tables
from ..solver.simulator import CollectiveTiming, SimResult, makespan_hidden_at, peak_at, simulate
from .concentrate import pulled
from .reorder import Deferrals, named

log = logging.getLogger(__name__)

SINK_STEPS = (2, 5, 10, 20, 50, 100, 200, 400)  # positions a wait may move later
JUMP_UNITS = 8  # the units of its queue a jump may pass, the latest issued first (a candidate each)


def _spent(evals: int, max_evals: int | None, deadline: float | None) -> bool:
    return (max_evals is not None and evals >= max_evals) or (deadline is not None and time.perf_counter() > deadline)


class _Moves:
    """The candidate orders (op index per position) of one schedule's stalled units."""

    def __init__(self, problem: ScheduleProblem, sched: Schedule, res: SimResult, reach: int,
                 compute: np.ndarray | None):
        """``res``: ``sched`` simulated; ``compute``: the compute-op mask when no compute op may pass
        another (fixed mode), else None."""
        self.problem, self.reach, self.compute = problem, reach, compute
        self.stalled = [(c.issue_pos, c.wait_pos) for c in res.collectives if c.exposed_ns > 0]
        self.queued = [(c.issue_pos, c.group, c.end_ns, len(c.members)) for c in res.collectives]  # for _jumps
        self.sync = np.array([op.kind in (OpKind.WAIT, OpKind.COLLECTIVE) for op in problem.ops], dtype=bool)
        self.defer = Deferrals(problem, sched)
        self.at, self.pos = self.defer.at, self.defer.pos
        self.runtime = sim_tables(problem).runtime  # compute-stream time per op (0 for views, issues, waits)

    def of(self, t: CollectiveTiming) -> Iterator[np.ndarray]:
        p = self.problem
        anc = rel = 0
        for m in t.members:
            i = p.index[m]
            anc |= p.ancestors[i]
            rel |= p.ancestors[i] | p.descendants[i] | (1 << i)
        return chain(self._merges(t), self._pulls(t, rel), self._gathers(t), self._defers(t, anc),
                     self._sinks(t), self._jumps(t, anc))

    def _jumps(self, t: CollectiveTiming, anc: int) -> Iterator[np.ndarray]:
        """A lone collective that queues behind lone units of its group issued before it, issued just
        before one of them instead (the latest first, up to JUMP_UNITS), with its ancestors between
        the two issues.

        Every dependency of an ancestor is an ancestor, so the moved ops (in their order) find
        their inputs before them, and what stays keeps its own; in the fixed mode no compute
        ancestor may pass other compute. The group's queue order changes: ``t`` runs first and the
        units it passes start later by its runtime (the tp_2x4 backward's last small reduce-scatter
        stalled half a millisecond behind the big ones issued with it). It passes lone units only:
        passing a bucket delays every member, and on the 4-node backward jumps past buckets left a
        deterministic 60 s solve's polish at 137 of 149 members hidden (168.9 ms), where it ends
        at 147 (165.1 ms) without them, the search counting units."""
        if len(t.members) != 1 or t.start_ns <= t.issue_ns:
            return
        at, i, p = self.at, t.issue_pos, self.problem
        ahead = sorted((u for u in self.queued if u[1] == t.group and u[0] < i and u[2] > t.issue_ns),
                       reverse=True)[:JUMP_UNITS]
        mask = bit_mask(anc, len(p.ops))
        for q, _, _, members in ahead:
            if members > 1:  # no jump passes a bucket, nor what was issued before it
                break
            seg = at[q:i]
            moved = mask[seg]
            if self.sync[seg[moved]].any():  # a wait or another issue would move: not this move
                continue
            if self.compute is not None and self.compute[seg[moved]].any() and self.compute[seg[~moved]].any():
                continue
            yield np.concatenate((at[:q], seg[moved], at[i:i + 1], seg[~moved], at[i + 1:]))

    def _merges(self, t: CollectiveTiming) -> Iterator[np.ndarray]:
        """The wait of each later stalled unit issued before ``t``'s wait, just before ``t``'s wait.

        A unit's wait is its first member's wait op (a bucket's other members' waits come later and
        find it done), and every member is issued by the unit's issue, so the moved op stays after
        its collective; its users all come after its old place, so after its new one too."""
        at, w = self.at, t.wait_pos
        for issue, wait in self.stalled:
            if wait > w and issue < w:
                yield np.concatenate((at[:w], at[wait:wait + 1], at[w:wait], at[wait + 1:]))

    def _pulls(self, t: CollectiveTiming, rel: int) -> Iterator[np.ndarray]:
        """One independent compute op from after the wait, lasting at least the stall, just before it."""
        at, w, p = self.at, t.wait_pos, self.problem
        for q in range(w + 1, min(len(at), w + 1 + self.reach)):
            j = int(at[q])
            if self.runtime[j] < t.exposed_ns or rel >> j & 1:
                continue
            if any(self.pos[p.index[d]] >= w for d in p.ops[j].deps):
                continue
            if self.compute is not None and self.compute[at[w:q]].any():
                continue
            yield np.concatenate((at[:w], at[q:q + 1], at[w:q], at[q + 1:]))

    def _gathers(self, t: CollectiveTiming) -> Iterator[np.ndarray]:
        """Where no single op lasts the stall, the first ops after the wait that can run before it,
        until they last the stall together, just before it (:func:`.concentrate.pulled` with
        ``accumulate``; in the fixed mode no compute op passes another)."""
        w, p = t.wait_pos, self.problem
        out = pulled(p, self.defer.sched, w, t.exposed_ns, self.reach, accumulate=True,
                     keep_compute_order=self.compute is not None)
        if out is None:
            return
        at = sim_tables(p).positions(p, out.order)[0]
        ahead = at[w:int(np.flatnonzero(at == self.at[w])[0])]  # what now runs before the wait
        if np.count_nonzero(self.runtime[ahead]) > 1:  # one op alone is a single pull (_pulls)
            yield at

    def _defers(self, t: CollectiveTiming, anc: int) -> Iterator[np.ndarray]:
        """One compute op from before the issue (no ancestor), with what depends on it up to the
        issue, just after the issue, when that moves at least the stall's worth of compute."""
        at, i, p = self.at, t.issue_pos, self.problem
        for q in range(max(0, i - self.reach), i):
            j = int(at[q])
            if self.runtime[j] <= 0 or anc >> j & 1:
                continue
            seg = at[q:i]
            moved = bit_mask(p.descendants[j] | (1 << j), len(p.ops))[seg]
            if int(self.runtime[seg[moved]].sum()) < t.exposed_ns:
                continue
            if self.compute is not None and self.compute[seg[~moved]].any():
                continue
            new = self.defer.valid_order(i, {p.ops[j].name})
            if new is not None:
                yield new

    def _sinks(self, t: CollectiveTiming) -> Iterator[np.ndarray]:
        """A lone collective's wait later, never past its first user."""
        if len(t.members) != 1:
            return
        at, w, p = self.at, t.wait_pos, self.problem
        first_user = min((int(self.pos[p.index[u]]) for u in p.users[p.ops[int(at[w])].name]), default=len(at))
        for step in SINK_STEPS:
            to = min(first_user, w + step)
            if to > w + 1:
                yield np.concatenate((at[:w], at[w + 1:to], at[w:w + 1], at[to:]))
            if to == first_user:
                break


def hide_collectives(problem: ScheduleProblem, schedule: Schedule, *, max_makespan_ns: int | None = None,
                     budget_bytes: int | None = None, reach: int = 400, max_evals: int | None = None,
                     deadline: float | None = None, keep_compute_order: bool = False) -> Schedule:
    """``schedule`` with more hidden hideable collectives, no longer than ``max_makespan_ns`` (None:
    the input's makespan) and peaking no higher than ``budget_bytes`` (None: the input's peak).

    See the module doc for the moves. ``max_evals`` (None: no bound) caps the candidates scored, a
    bound on the work that does not depend on the machine; ``deadline`` (a ``time.perf_counter()``
    value; None: none) stops the search early. With ``keep_compute_order`` (the fixed mode) no
    compute op passes another. The result never hides fewer than the input.
    """
    res: SimResult = simulate(problem, schedule)
    cap = res.makespan_ns if max_makespan_ns is None else max_makespan_ns
    peak = res.peak_memory_bytes if budget_bytes is None else budget_bytes
    best, evals, start = schedule, 0, res.n_hidden_hideable
    compute = np.array([op.kind is OpKind.COMPUTE for op in problem.ops], dtype=bool) if keep_compute_order else None
    while not _spent(evals, max_evals, deadline):
        current = (res.n_hidden_hideable, -res.makespan_ns)
        found: tuple[tuple[int, int], np.ndarray] | None = None
        moves = _Moves(problem, best, res, reach, compute)
        for t in sorted((t for t in res.collectives if t.exposed_ns > 0 and t.hideable), key=lambda t: t.exposed_ns):
            for at in moves.of(t):
                if _spent(evals, max_evals, deadline):
                    break
                evals += 1
                makespan, hidden = makespan_hidden_at(problem, at, best.buckets)
                key = (hidden, -makespan)
                if makespan > cap or key <= current or (found is not None and key <= found[0]):
                    continue
                if peak_at(problem, at, best.buckets) <= peak:
                    found = (key, at)
        if found is None:
            break
        best = named(problem, found[1], best)
        res = simulate(problem, best)
    if best is not schedule:
        log.debug("hide_collectives %s: %d to %d of %d hideable collectives hidden (%d candidates)",
                  problem.name, start, res.n_hidden_hideable, res.n_hideable, evals)
    return best
