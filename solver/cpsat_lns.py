"""The neighbourhood search of :func:`.cpsat.solve` on graphs too large for one model.

Rounds of CP-SAT over windows of the incumbent (see :func:`neighbourhood_solve`): fixed-order
windows that move collectives, waits and buckets around the most exposed placement, and in free
mode free-order windows (cpsat_window.py) that reorder compute too; gains are replayed in
isomorphic layers (layer_replay.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from ..heuristics.bucket_shift import shift_bucket_members
from ..heuristics.concentrate import concentrate_stalls
from ..heuristics.far_defer import defer_far_fillers
from ..heuristics.single_pull import pull_single_fillers
from .cpsat_config import (
    Progress,
    Result,
    SolutionReporter,
    SolveConfig,
    Status,
    make_solver,
    model_stats,
    proven,
    reordered,
    solve_patiently,
)
from .cpsat_frame import Frame, FrameOptions, bucket_size_bytes, build_frame
from .cpsat_hint import add_hint, decode
from .cpsat_model import ModelBuilder
from .cpsat_window import free_window, paid_rate, round_cost, window_frame
from .layer_replay import LayerReplayer
from .layers import LayerStructure
from .problem import ScheduleProblem
from .schedule import Schedule, placements
from .simulator import SimResult, makespan_ns, simulate
from .warm_start import MOVE_MIN_GAIN_NS, POLISH_TRIES, far_seeds, pull_evals, shift_evals, size_scale

log = logging.getLogger(__name__)


def lns_frame_options(config: SolveConfig) -> FrameOptions:
    """The frame options of the neighbourhood rounds: fixed order around the incumbent's, whose
    chains stay where it runs them (contiguous chains), so that it is exactly representable."""
    return dataclasses.replace(config.frame_options(), contiguous_chains=True)


def positions_of(problem: ScheduleProblem, sched: Schedule) -> tuple[tuple[str, int, int], ...]:
    """Per collective, the program positions where ``sched`` issues and waits it (its bucket's)."""
    pos = {op: i for i, op in enumerate(sched.order)}
    wait_of = problem.wait_of
    return tuple((c.name, pos[c.name], pos[wait_of[c.name]]) for c in problem.collectives)


def centers_of(problem: ScheduleProblem, frame: Frame, sched: Schedule) -> tuple[tuple[str, int, int], ...]:
    """Per collective, the backbone slots where ``sched`` issues and waits it (its bucket's)."""
    pos = {op: i for i, op in enumerate(sched.order)}
    bb = sorted(pos[b] for b in frame.backbone)
    out = []
    for p in placements(problem, sched):
        i, w = bisect.bisect_left(bb, p.issue_pos), bisect.bisect_left(bb, p.wait_pos)
        out.extend((m, i, w) for m in p.members)
    return tuple(out)


def neighbourhood_solve(problem: ScheduleProblem, config: SolveConfig, budget: int, heur: tuple,
                         time_budget_s: float, t0: float, floor_ns: int,  # the whole budget, from t0
                         progress: Callable[[Progress], None] | None, full: Frame, full_pairs: int,
                         layers: LayerStructure | None = None, free_windows: bool = False) -> Result:
    """Large graphs: rounds of CP-SAT over windows of the incumbent (first: the heuristic's).

    Each round frees the collectives (lone or bucketed) around the incumbent's most exposed one
    that has not been tried yet: they may move within ``lns_radius`` slots and their buckets may
    be split or merged with the next one (``bucket_moves``); every other bucket is forced as it
    is and held at its slots. An improved incumbent restarts the list; when every window has been
    tried without a gain, windows and radius double. The model's bound covers
    only the window, so the reported bound is the structural one (``bounds.makespan_lower_bound``),
    valid for every schedule. With ``layers`` (isomorphic layers of the problem), a gain local to
    one layer is replayed in the others and the first windows sit in one of them (layer_replay.py).
    With ``free_windows`` (free mode), a round may be a free-order window instead
    (:func:`_free_round`): whichever kind has paid more for its time so far
    (:func:`.cpsat_window.paid_rate`), free first on an unbucketed incumbent, fixed first on a
    bucketed one; a gain there changes the heavy-compute order the fixed rounds keep. After each
    gain of a window in free mode, cheap rounds of one move each (:func:`_move_round`: a far filler
    deferral, else a single pull) run while they find one.
    """
    h_name, best, best_res = heur
    method = f"heuristic:{h_name}"
    stats: dict[str, int] = {"full_order_pairs": full_pairs, "rounds": 0, "improved": 0}
    # a round has a fixed cost (model build, presolve, reaching the hint) that grows with the
    # graph: about ROUND_S_PER_ITEM seconds per item of the full frame (44 s a round on the
    # 80-layer backward's 15k items). Deterministic: lns_rounds, but no more than the budget has
    # rounds of that cost, or of MIN_ROUND_S, and none when one round costs more than the whole
    # budget (decided from the budget and the size, not the clock); a round's deterministic time
    # shrinks past LNS_REF_ITEMS items, where CP-SAT's units take longer (about 19 s each on the
    # 80-layer backward, 4-5 s on 2k items). Wall clock: rounds until the time or the windows run out.
    n_items = len(full.items)
    if config.deterministic:
        rounds, round_s = deterministic_rounds(config.lns_rounds, time_budget_s, n_items)
    else:
        rounds = max(1, len(problem.collectives))
    tried: set[tuple[str, ...]] = set()
    size, radius = config.lns_window, config.lns_radius
    replayer = None
    deadline = None if config.deterministic else t0 + time_budget_s
    if layers is not None and layers.classes:
        replayer = LayerReplayer(problem, layers, budget, config.layer_replay_evals, deadline)
        stats["layers_in_classes"] = len(layers.class_of)
    free_mode = free_windows  # free_windows turns off once they are exhausted
    free_size, free_tried = config.free_window, set()
    # free mode: each round is of the kind that has paid more for its work so far (paid_rate);
    # free windows keep the incumbent's buckets and fixed rounds split and merge them, so on a
    # bucketed incumbent free windows start as if one round had already failed, else fixed ones
    free_first = not best.buckets
    paid = {True: [0.0 if free_first else MIN_ROUND_S, 0], False: [MIN_ROUND_S if free_first else 0.0, 0]}
    fixed_done = False
    built: dict[int, float] = {}  # free window size -> longest model build seen (s)
    # free mode: after each gain of a window, and first on graphs of up to DEFER_REF_OPS ops, cheap
    # rounds of one move each (_move_round) while they find one: a move takes a fraction of a second
    # where a window takes seconds, and on a wall clock the warm start's passes stop at its deadline
    # with moves left (on the tp backward, five moves gained 164 us after a window's 2 us; without
    # them, eight windows gained nothing). Larger graphs start with windows: there a sweep
    # simulates the whole graph per try, and on 80 layers the first one took the 9 s left of a 30 s
    # solve
    moves_on = free_windows and size_scale(problem) >= 1.0
    stale = False  # a gain changed the incumbent's order: rebase before the next round uses it

    def announce() -> None:
        """The progress callback sees the incumbent's makespan and the structural bound: a window
        model's own objective and bound speak of the window only (a free window's is a sub-problem's
        makespan, and a fixed window that cannot improve proves nothing about the graph)."""
        if progress is not None:
            progress(Progress(time.perf_counter() - t0, best_res.makespan_ns, min(floor_ns, best_res.makespan_ns)))

    announce()
    for rnd in itertools.count():
        if rnd >= rounds:
            break
        rates = (paid_rate(paid[True]), paid_rate(paid[False]))
        if not moves_on and stale:
            # rebased only when a window round follows (moves work on any topological order): on a
            # wall clock, a gain just before the deadline would otherwise spend a second past it
            # building frames no round uses
            if deadline is not None and time.perf_counter() >= deadline:
                break
            problem, full, replayer = _rebased(problem, best, config, budget, layers, replayer, deadline)
            stale = False
        if moves_on:
            moved = _move_round(problem, config, budget, best, deadline)
            if moved is None:
                moves_on = False  # no move left until a window changes the incumbent
                rounds += 1  # a sweep that finds nothing is not a round
                continue
            best, best_res = _polished(problem, moved, simulate(problem, moved), config.polish, False, deadline)
            method = "cpsat-lns"
            stats["improved"] += 1
            stats["cheap_moves"] = stats.get("cheap_moves", 0) + 1
            tried.clear()
            stale = True
            log.info("solve %s: round %d (cheap move): makespan %d ns", problem.name, rnd, best_res.makespan_ns)
            announce()
            continue
        if free_windows and (fixed_done or rates[0] > rates[1] or (rates[0] == rates[1] and free_first)):
            left = time_budget_s - (time.perf_counter() - t0)
            if not config.deterministic and left <= 0:
                break
            # a window's model takes seconds to build, about twice as long at twice the size
            build_s = built.get(free_size, 2 * max(built.values(), default=0.0))
            if not config.deterministic and left <= build_s:
                free_windows = False  # no time to search once it is built: fixed rounds (built in a
                continue  # fraction of that) may use the rest
            got = _free_round(problem, config, budget, best, best_res, free_size, free_tried,
                              round_s if config.deterministic else min(left, FREE_ROUND_S),
                              deadline, t0, stats, built)
            if got is None:  # every exposed collective tried at this size: widen (up to 4x), then stop
                if free_size >= 4 * config.free_window:
                    free_windows = False
                    if fixed_done:
                        break
                free_size, free_tried = min(2 * free_size, 4 * config.free_window), set()
                continue
            paid[True][0] += got[2]
            if got[1].peak_memory_bytes <= budget and (got[1].makespan_ns, got[1].peak_memory_bytes) < (
                    best_res.makespan_ns, best_res.peak_memory_bytes):
                before_ns = best_res.makespan_ns
                best, best_res = _polished(problem, got[0], got[1], config.polish, False, deadline)
                method = "cpsat-lns"
                stats["improved"] += 1
                paid[True][1] += before_ns - best_res.makespan_ns
                tried.clear()  # (free windows are tried again where the stall changed: free_window)
                moves_on = True
                stale = True  # the fixed rounds keep the new heavy-compute order
                log.info("solve %s: round %d (free window): makespan %d ns", problem.name, rnd, best_res.makespan_ns)
                announce()
            continue
        window = replayer.seed_window(best_res, size, tried) if replayer and rnd < config.layer_seed_rounds else None
        window = window or _window(best_res, size, tried)
        if window is None:  # every window tried without a gain: widen them while they can still grow
            if size >= len(best_res.collectives) and radius >= MAX_RADIUS_FACTOR * config.lns_radius:
                if not free_windows:
                    break
                fixed_done = True
                continue
            size, radius, tried = 2 * size, 2 * radius, set()
            window = _window(best_res, size, tried)
            if window is None:  # no collectives at all
                break
        if not config.deterministic and time_budget_s - (time.perf_counter() - t0) <= stats.get("build_ms", 0) / 1000:
            break  # the time left would go on building the model
        tried.add(window[0])
        centers = centers_of(problem, full, best)
        moves = bucket_moves(problem, Schedule(best.order, tuple(b for b in best.buckets if set(b) & window[1]),
                                               best.multi_dtype), config)
        opts = dataclasses.replace(
            lns_frame_options(config), centers=centers, radius=radius, bucketing=False,
            plan=tuple(dict.fromkeys((*(b for b in best.buckets if not set(b) & window[1]), *config.plan))),
            extra=moves, frozen=frozenset(c.name for c in problem.collectives if c.name not in window[1]),
            bucketed_only=frozenset(m for b in best.buckets if len(b) >= 4 and set(b) & window[1] for m in b),
            positions=positions_of(problem, best))
        t_round = time.perf_counter()
        frame = build_frame(problem, opts)
        builder = ModelBuilder(frame, budget, config.pinned)
        builder.build()
        builder.minimize_makespan()
        add_hint(builder, best)
        stats.update(model_stats(builder, time.perf_counter() - t_round))
        stats["rounds"] += 1
        left = time_budget_s - (time.perf_counter() - t0)
        if not config.deterministic and left <= 0:
            break
        # wall clock: rounds of at least MIN_ROUND_S (a window model needs ~1-3 s to reach its hint),
        # up to half the time left, stopped early once they stop improving (_run)
        if not config.deterministic:
            round_s = min(left, max(MIN_ROUND_S, left / 2))
        solver = make_solver(config, round_s, lns=True)
        status = _run(solver, builder, config, t0)
        paid[False][0] += round_cost(config.deterministic, solver, round_s)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        sched = decode(builder, solver)
        res = simulate(problem, sched)
        if res.peak_memory_bytes <= budget and (res.makespan_ns, res.peak_memory_bytes) < (
                best_res.makespan_ns, best_res.peak_memory_bytes):
            if replayer is not None:
                sched, res = replayer.improve(best, sched, res, stats)
            before_ns = best_res.makespan_ns
            best, best_res = _polished(problem, sched, res, config.polish, not free_mode, deadline)
            stale = stale or best is not sched  # compute moved into stalls: the fixed rounds keep its new order
            method = "cpsat-lns"
            stats["improved"] += 1
            paid[False][1] += before_ns - best_res.makespan_ns
            tried.clear()
            moves_on = free_mode
            log.info("solve %s: round %d: makespan %d ns", problem.name, rnd, res.makespan_ns)
            announce()
    st = proven(Status.FEASIBLE if method == "cpsat-lns" else Status.HEURISTIC, best_res.makespan_ns, floor_ns)
    if best_res.peak_memory_bytes > budget:
        st = Status.INFEASIBLE
    return Result(st, best_res.makespan_ns, min(floor_ns, best_res.makespan_ns), time.perf_counter() - t0, best,
                  method, best_res.peak_memory_bytes, budget,
                  min_feasible_budget_bytes=best_res.peak_memory_bytes if st is Status.INFEASIBLE else None,
                  exact=not problem.link_contention, stats=stats)


def _free_round(problem: ScheduleProblem, config: SolveConfig, budget: int, best: Schedule, best_res: SimResult,
                size: int, tried: set[tuple[tuple[str, ...], int]], round_s: float, deadline: float | None, t0: float,
                stats: dict[str, int], built: dict[int, float]) -> tuple[Schedule, SimResult, float] | None:
    """One free-order window round around the incumbent's most exposed untried collective
    (:func:`.cpsat_window.free_window`): its simulated answer (the incumbent when CP-SAT found
    nothing) and its cost (:func:`.cpsat_window.round_cost`); None when every exposed collective
    was tried at this size. On a wall clock the search gets ``round_s`` but ends by ``deadline``
    (building a large window's model takes seconds: the longest build per size goes in ``built``)."""
    window = free_window(problem, best, best_res, size, tried)
    if window is None:
        return None
    tried.add((window[0], next(t.exposed_ns for t in best_res.collectives if t.members == window[0])))
    t_build = time.perf_counter()
    frame = window_frame(problem, best, window[1], window[2], truncate=True)
    if frame is None:
        return best, best_res, 0.0
    builder = ModelBuilder(frame, budget, config.pinned)
    builder.build()
    builder.minimize_window_end()
    add_hint(builder, best)
    stats["free_rounds"] = stats.get("free_rounds", 0) + 1
    built[size] = max(built.get(size, 0.0), time.perf_counter() - t_build)
    if deadline is not None:
        round_s = min(round_s, deadline - time.perf_counter())
        if round_s <= 0:
            return best, best_res, 0.0
    # no presolve: on a 120-op window of the tp backward it looped for 8.6 s before the search
    # started; without it the hint came at 1.7 s
    solver = make_solver(config, round_s, lns=True, presolve=False)
    status = _run(solver, builder, config, t0, FREE_PATIENCE_S)
    work = round_cost(config.deterministic, solver, round_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return best, best_res, work
    sched = decode(builder, solver)
    res = simulate(problem, sched)
    log.info("solve %s: free window %d..%d around %s: %d ns", problem.name, window[1], window[2], window[0][0],
             res.makespan_ns)
    return sched, res, work


def _move_round(problem: ScheduleProblem, config: SolveConfig, budget: int, best: Schedule,
                deadline: float | None) -> Schedule | None:
    """One cheap move from the incumbent (None when it found none): a far filler deferral, else a
    single pull into a stall (heuristics/single_pull.py), else (when the model may bucket) a
    collective shifted between neighbouring buckets (heuristics/bucket_shift.py), each gaining more
    than MOVE_MIN_GAIN_NS; else a walk of up to WALK_MOVES far deferrals that gain anything at all,
    which together must gain more than that; on a wall clock within MOVE_ROUND_S (a sweep that
    finds nothing tries every exposed queue's fillers)."""
    if deadline is not None:
        deadline = min(deadline, time.perf_counter() + MOVE_ROUND_S)
    new = defer_far_fillers(problem, best, budget_bytes=budget, max_moves=1, max_seeds=far_seeds(problem),
                            deadline=deadline, min_gain_ns=MOVE_MIN_GAIN_NS)
    if new is best:
        new = pull_single_fillers(problem, best, budget_bytes=budget, max_moves=1, deadline=deadline,
                                  min_gain_ns=MOVE_MIN_GAIN_NS, max_evals=pull_evals(problem))
    if new is best and config.bucketing and not config.plan:
        new = shift_bucket_members(problem, best, budget_bytes=budget, max_moves=1, max_evals=shift_evals(problem),
                                   cap_bytes=config.bucket_cap_bytes, deadline=deadline, min_gain_ns=MOVE_MIN_GAIN_NS)
    if new is best:  # a walk over far deferrals that gain anything, kept when it gains enough in all
        walk = defer_far_fillers(problem, best, budget_bytes=budget, max_moves=WALK_MOVES, max_seeds=far_seeds(problem),
                                 deadline=deadline, max_evals=WALK_SWEEPS * far_seeds(problem))
        if walk is not best and makespan_ns(problem, walk) < makespan_ns(problem, best) - MOVE_MIN_GAIN_NS:
            new = walk
    return None if new is best else new


def _run(solver: cp_model.CpSolver, builder: ModelBuilder, config: SolveConfig, t0: float,
         patience_s: float | None = None) -> int:
    """Solve a round's model: on a wall clock, stopped once it stops improving for ``patience_s``
    (default MIN_ROUND_S; solve_patiently)."""
    reporter = SolutionReporter(None, t0)
    if config.deterministic:
        return solver.Solve(builder.model, reporter)
    return solve_patiently(solver, builder.model, reporter, MIN_ROUND_S if patience_s is None else patience_s)


def _rebased(problem: ScheduleProblem, best: Schedule, config: SolveConfig, budget: int,
             layers: LayerStructure | None, replayer: LayerReplayer | None, deadline: float | None
             ) -> tuple[ScheduleProblem, Frame, LayerReplayer | None]:
    """``problem`` in ``best``'s order (the fixed rounds' backbone), its full frame and replayer."""
    problem = reordered(problem, best.order)
    full = build_frame(problem, lns_frame_options(config))
    if replayer is not None and layers is not None:
        replayer = LayerReplayer(problem, layers, budget, config.layer_replay_evals, deadline)
    return problem, full, replayer


def _polished(problem: ScheduleProblem, sched: Schedule, res: SimResult, polish: bool, keep_heavy_order: bool,
              deadline: float | None = None) -> tuple[Schedule, SimResult]:
    """A round's gain with its small stalls filled (:func:`..heuristics.concentrate.concentrate_stalls`,
    a few tries): a round stops on time and leaves stalls of a few microseconds that compute just
    after them could fill, and the next windows should start from the better incumbent."""
    if not polish:
        return sched, res
    out = concentrate_stalls(problem, sched, max_tries=POLISH_TRIES, deadline=deadline,
                             keep_heavy_order=keep_heavy_order, jump=False)
    return (sched, res) if out is sched else (out, simulate(problem, out))


def deterministic_rounds(max_rounds: int, time_budget_s: float, n_items: int) -> tuple[int, float]:
    """``(rounds, seconds of budget per round)`` for a deterministic neighbourhood search over a
    frame of ``n_items`` (see :func:`neighbourhood_solve`); 0 rounds when one would cost more
    than the budget, unless the graph is small (a round of ``MIN_ROUND_S``)."""
    round_cost_s = max(MIN_ROUND_S, ROUND_S_PER_ITEM * n_items)
    rounds = min(max_rounds, int(time_budget_s // round_cost_s))
    if rounds == 0 and round_cost_s == MIN_ROUND_S:
        rounds = 1
    return rounds, (time_budget_s / rounds * min(1.0, LNS_REF_ITEMS / n_items) if rounds else 0.0)


MIN_ROUND_S = 4.0
FREE_PATIENCE_S = 3.0  # free windows (truncated: small models): how long a round runs on without a gain
MOVE_ROUND_S = 4.0  # cheap move rounds (_move_round): at most this long
# the walk of _move_round: far deferrals gaining a few ns each (rounding) often lead to one that gains
# much (on the tp_2x4 backward, where every single move of 1 us or more had been taken: seven 2 ns
# moves, then 11.7 us, and 156 us in 40 moves); WALK_SWEEPS heads' worth of fillers bound its work
WALK_MOVES = 32
WALK_SWEEPS = 16
FREE_ROUND_S = 8.0  # free window rounds: at most this long (on the tp backward 5 s rounds gained 13-180 us each)
ROUND_S_PER_ITEM = 0.003  # deterministic rounds: measured wall cost of a window round per frame item
LNS_REF_ITEMS = 2000  # deterministic rounds: their units shrink in proportion past this many items
MAX_RADIUS_FACTOR = 8  # windows stop widening at this multiple of lns_radius


def _window(res: SimResult, size: int, tried: set[tuple[str, ...]]) -> tuple[tuple[str, ...], set[str]] | None:
    """The untried most exposed placement of the simulated schedule ``res`` (else the untried one
    with the least slack) and the collectives of the ``size`` placements nearest it in issue order."""
    timings = sorted(res.collectives, key=lambda t: t.issue_pos)
    order = sorted(range(len(timings)), key=lambda i: (-timings[i].exposed_ns, timings[i].wait_ns - timings[i].end_ns))
    for i in order:
        if timings[i].members in tried:
            continue
        lo = max(0, i - size // 2)
        near = timings[lo:lo + size]
        return timings[i].members, {m for t in near for m in t.members}
    return None


def bucket_moves(problem: ScheduleProblem, sched: Schedule, config: SolveConfig) -> tuple[tuple[str, ...], ...]:
    """The neighbourhood's bucket candidates: the incumbent's buckets, each split in halves, and
    each merged with the next one of its key, so a round can refine the bucketing as well as move
    it (members of buckets of 4 or more get no lone candidate: splitting them to single
    collectives is never the move that pays at scale). Infeasible ones are dropped by the frame."""
    if not config.bucketing or config.plan:  # module plans fix the buckets
        return sched.buckets
    idx = problem.index
    buckets = sorted((tuple(sorted(b, key=idx.__getitem__)) for b in sched.buckets), key=lambda b: idx[b[0]])
    out = list(buckets)
    by_key: dict[tuple, list[tuple[str, ...]]] = {}
    for b in buckets:
        if len(b) >= 4:
            out += [b[:len(b) // 2], b[len(b) // 2:]]
        key = problem.op_by_name[b[0]].collective.bucket_key(config.multi_dtype)  # type: ignore[union-attr]
        by_key.setdefault(key, []).append(b)
    for same in by_key.values():
        for a, b in zip(same, same[1:]):
            if config.bucket_cap_bytes is None or bucket_size_bytes(problem, a + b) <= config.bucket_cap_bytes:
                out.append(a + b)
    return tuple(dict.fromkeys(out))


