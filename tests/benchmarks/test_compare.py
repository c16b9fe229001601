"""Tests of the Inductor comparison (``benchmarks/compare.py``, ``benchmarks/inductor_adapter.py``).

On the 1-layer variant of ``llama_fsdp_8r_small`` (fake process group, CPU-only torch): Inductor's
``schedule_overlap_bucketing`` runs under the adapter with fxsched's costs, its output maps back
to a valid fxsched schedule, the simulator's score of it is consistent (with Inductor's own
estimate, with a re-extraction of its output graph, and with the bucketing it did), and the
markdown section renders. CP-SAT runs deterministic with a tiny budget; nothing here is timed.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from fxsched.benchmarks import compare
from fxsched.benchmarks.inductor_adapter import (
    VARIANTS,
    FxschedEstimator,
    InductorRun,
    InductorVariant,
    MappingError,
    copy_graph_module,
    map_schedule,
    reextract,
    run_inductor,
    score_inductor,
)
from fxsched.benchmarks.zoo import ZooGraph, build
from fxsched.fxbridge.costs import collective_kind, collective_size_bytes
from fxsched.fxbridge.extract import Extraction, extract_problem
from fxsched.solver import BucketCosts, OpKind, Schedule, check_schedule, simulate
from fxsched.solver.cpsat import SolveConfig

NAME, LAYERS = "llama_fsdp_8r_small", 1
DEFAULT, BUCKETING, NO_BUCKETING = VARIANTS


@pytest.fixture(scope="module")
def zoo() -> Iterator[ZooGraph]:
    zg = build(NAME, layers=LAYERS)
    yield zg
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=["forward", "backward"])
def ext(request: pytest.FixtureRequest, zoo: ZooGraph) -> Extraction:
    ext = zoo.extract(request.param)
    direct = extract_problem(getattr(zoo, request.param), groups={g.name: g.size for g in zoo.groups.values()},
                             name=f"{zoo.name}/{request.param}")
    assert ext.problem == direct.problem and ext.problem.name == f"{zoo.name}/{request.param}"
    return ext


@pytest.fixture(scope="module")
def runs(ext: Extraction) -> dict[str, InductorRun]:
    """Each Inductor variant run once on ``ext`` (tests must not mutate these)."""
    before = [n.name for n in ext.graph_module.graph.nodes]
    out = {v.label: run_inductor(ext, v) for v in VARIANTS}
    assert [n.name for n in ext.graph_module.graph.nodes] == before, "the pass must run on a copy"
    return out


def test_estimator_answers_with_the_problem_costs(ext: Extraction) -> None:
    gm, nodes = copy_graph_module(ext.graph_module)
    assert [n.name for n in gm.graph.nodes] == [n.name for n in ext.graph_module.graph.nodes]
    est = FxschedEstimator(ext.problem, nodes)
    for op in ext.problem.ops:
        assert est(nodes[op.name], None) == pytest.approx(op.runtime_ns / 1e6)
    coll = ext.problem.collectives[0]
    node = nodes[coll.name]
    curve = ext.problem.curve_by_key[(coll.collective.group, coll.collective.kind)]
    size = collective_size_bytes(node)
    assert est(node, 3 * size) == pytest.approx(curve.runtime_ns(3 * size) / 1e6)
    assert est(node, 0) == pytest.approx(curve.runtime_ns(0) / 1e6)
    # identity, not name: the node of the same name in the uncopied graph is not "original"
    compute = next(op for op in ext.problem.ops if op.kind is OpKind.COMPUTE)
    assert est.runtime_ns(ext.nodes[compute.name]) is None


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.label for v in VARIANTS])
def test_inductor_maps_back_to_a_valid_schedule(ext: Extraction, zoo: ZooGraph, runs: dict[str, InductorRun],
                                                variant: InductorVariant) -> None:
    run = runs[variant.label]
    assert run.estimator.answered > 0
    sched = map_schedule(ext.problem, run)
    assert check_schedule(ext.problem, sched) == []
    res = simulate(ext.problem, sched)
    orig = simulate(ext.problem)
    assert res.compute_ns >= orig.compute_ns
    assert res.exposed_ns < orig.exposed_ns, "Inductor hides something on a Llama FSDP step"
    new_colls = [n for n in run.graph_module.graph.nodes
                 if n.name not in ext.problem.op_by_name and collective_kind(n) is not None]
    if variant is NO_BUCKETING:
        assert sched.buckets == () and not new_colls
        assert res.n_collectives == len(ext.problem.collectives)
        # without buckets the output graph's own problem is the same problem in another order
        alt = simulate(reextract(run, zoo.group_sizes))
        assert (alt.exposed_ns, alt.makespan_ns, alt.n_collectives) == (res.exposed_ns, res.makespan_ns,
                                                                        res.n_collectives)
    else:
        assert sched.buckets, "FSDP pre-bucketing merges all_gathers"
        merged = sum(len(b) for b in sched.buckets)
        assert res.n_collectives == len(ext.problem.collectives) - merged + len(sched.buckets)
        assert res.n_collectives == sum(1 for n in run.graph_module.graph.nodes
                                        if n.op == "call_function" and "wait_tensor" in str(n.target))
    # same costs: the simulator's exposed time agrees with Inductor's own estimate
    assert run.report is not None
    assert res.exposed_ns / 1e6 == pytest.approx(run.report.total_exposed_ms, rel=0.15)


def test_bucketing_variant_buckets_more(ext: Extraction, runs: dict[str, InductorRun]) -> None:
    default = map_schedule(ext.problem, runs[DEFAULT.label])
    bucketed = map_schedule(ext.problem, runs[BUCKETING.label])
    counts = [simulate(ext.problem, s).n_collectives for s in (bucketed, default)]
    assert counts[0] <= counts[1] < len(ext.problem.collectives)


def test_unmappable_output_is_reextracted(ext: Extraction, zoo: ZooGraph) -> None:
    run = run_inductor(ext, DEFAULT)
    for node in run.graph_module.graph.nodes:
        node.meta.pop("from_node", None)
    with pytest.raises(MappingError, match="from_node"):
        map_schedule(ext.problem, run)
    scored = score_inductor(ext, run, zoo.group_sizes)
    assert scored.method == "re-extracted" and "from_node" in scored.note
    assert scored.problem is not ext.problem
    res = simulate(scored.problem, scored.schedule)
    assert res.n_collectives < len(ext.problem.collectives)


def test_write_section_replaces_or_appends(tmp_path: Path) -> None:
    path = tmp_path / "r.md"
    compare.write_section(path, f"{compare.BEGIN}\none\n{compare.END}")
    assert path.read_text() == f"{compare.BEGIN}\none\n{compare.END}\n"
    path.write_text(f"# head\n\n{compare.BEGIN}\nold\n{compare.END}\ntail\n")
    compare.write_section(path, f"{compare.BEGIN}\nnew\n{compare.END}")
    assert path.read_text() == f"# head\n\n{compare.BEGIN}\nnew\n{compare.END}\ntail\n"
    path.write_text("# other\n")
    compare.write_section(path, f"{compare.BEGIN}\nx\n{compare.END}")
    assert path.read_text() == f"# other\n\n{compare.BEGIN}\nx\n{compare.END}\n"


def test_section_renders(zoo: ZooGraph, tmp_path: Path) -> None:
    argv = ["--graphs", NAME, "--layers", str(LAYERS), "--budgets", "0.05"]
    text, reports = compare.run([NAME], [0.05], layers=LAYERS, parts=("forward",), argv=argv,
                                solve_config=SolveConfig(seed=0, workers=1, deterministic=True),
                                heuristics=["overlap"], cross_check=False)
    assert text.startswith(compare.BEGIN) and text.rstrip().endswith(compare.END)
    assert f"`python -m fxsched.benchmarks.compare {' '.join(argv)}`" in text
    assert "torch.Tensor.copy_" in text and "get_gpu_dram_gbps" in text
    (report,) = reports
    labels = [r.scheduler for r in report.rows]
    assert labels[:2] == ["original order", "overlap"] and labels[-2:] == ["cpsat fixed 0.05s", "cpsat free 0.05s"]
    assert [v.label for v in VARIANTS] == [lab for lab in labels if lab.startswith("inductor")]
    for row in report.rows:
        assert f"| {row.scheduler} |" in text
        if row.scheduler.startswith("inductor"):
            assert row.method == "mapped" and row.inductor is not None
        assert row.bound_ns is not None and row.bound_ns <= row.result.makespan_ns
    cp = report.fxsched_row()
    assert cp is not None and cp.result.makespan_ns <= report.rows[0].result.makespan_ns
    assert cp.result.makespan_ns == min(r.result.makespan_ns for r in report.rows if r.scheduler.startswith("cpsat"))
    summary = report.summary()
    assert "best Inductor" in summary and ("HOLDS" in summary or "FAILS" in summary)
    assert summary in text
    assert f"Per collective, `{cp.scheduler}` against the original order" in text
    out = tmp_path / "cmp.md"
    compare.write_section(out, text)
    assert out.read_text().count(compare.BEGIN) == 1


def test_schedule_of_original_problem_is_unchanged_by_mapping(ext: Extraction) -> None:
    """Mapping a run with no reordering at all gives the original order back."""
    gm, nodes = copy_graph_module(ext.graph_module)
    run = InductorRun(NO_BUCKETING, gm, nodes, FxschedEstimator(ext.problem, nodes), 0.0)
    assert map_schedule(ext.problem, run) == Schedule.original(ext.problem)


def _gathers_beside(n: int, x_ns: int):
    """``n`` gathers of 200 B on group A (5020 ns each alone, curve 5000 ns + 0.1 ns/B, copies of
    1 ns at 100,000 GB/s) and one compute op x of ``x_ns``, independent of them all."""
    from tests.solver.solver_builders import coll, compute, curves_for, make_problem, wait

    p = make_problem([op for k in range(n) for op in (
        coll(f"c{k}", runtime_ns=5_020, bytes_in=100, bytes_out=100), wait(f"w{k}", f"c{k}"))]
        + [compute("x", x_ns, heavy=True)], groups=("A",))
    return dataclasses.replace(p, comm_curves=curves_for(("A",), ((0, 5_000), (1_000, 5_100))),
                               bucket_costs=BucketCosts(memory_bandwidth_gbps=100_000.0, launch_overhead_ns=0))


def test_hidden_target_is_waived_only_where_the_bounds_put_it_out_of_reach() -> None:
    """Hand-derived. ``free``: two collectives on one group, 100 ns each, under 200 ns of
    independent compute: the bound's exposed part is 0, so the 99% target applies; the original
    order issues and waits each at once (both exposed): 0/2 hidden, FAILS; overlap hides both:
    HOLDS. ``forced``: x (2000) needs c1 (1100 ns, on the problem's comm curve too) and only z
    (500) is independent of it, so c1 is hideable but exposed in every schedule: 1 of 1, the
    target is out of reach and waived. ``queue``: 100 gathers of 200 B on one group whose curve is
    5000 ns + 0.1 ns/B (5020 ns alone), all independent of x (6000 ns): none is exposed on its
    own, but the cheapest bucketing (one bucket, 5000 + 0.1 * 20,000, with copies of 1 ns at the
    fast memory given here) takes 7000 ns, so the bound
    proves 1000 ns exposed: at least one collective is exposed in every schedule, and 99 of 100
    hidden is still allowed, so the target applies (original order: FAILS)."""
    from fxsched.heuristics import overlap_schedule
    from fxsched.solver.bounds import forced_exposed, makespan_lower_bound

    from tests.solver.solver_builders import coll, compute, make_problem, wait

    free = make_problem([coll("c1", runtime_ns=100), wait("w1", "c1"), coll("c2", runtime_ns=100), wait("w2", "c2"),
                         compute("x", 200, heavy=True), compute("y", 200, deps=["x"], heavy=True)])
    forced = make_problem([coll("c1", runtime_ns=1100, bytes_in=500, bytes_out=500), wait("w1", "c1"),
                           compute("x", 2000, deps=["w1"], heavy=True),
                           compute("z", 500, heavy=True)])
    queue = _gathers_beside(100, 6000)

    def report(p, sched):
        rows = [compare.Row("original order", simulate(p), 0.0), compare.Row("cpsat", simulate(p, sched), 0.0)]
        return compare.PartReport(p, rows, makespan_lower_bound(p).makespan_ns, [], forced_exposed=forced_exposed(p))

    r = report(free, Schedule.original(free))
    assert r.global_bound_ns == 400
    assert r.hidden_target(r.rows[1]) == ("hidden 0/2 hideable (0.0%; in Inductor's sense, not fully exposed: 0/2, "
                                          "0.0%); 99% target FAILS")
    r = report(free, overlap_schedule(free))
    assert r.hidden_target(r.rows[1]) == ("hidden 2/2 hideable (100.0%; in Inductor's sense, not fully exposed: 2/2, "
                                          "100.0%); 99% target HOLDS")
    r = report(forced, Schedule.original(forced))
    assert r.forced_exposed == 1
    assert r.hidden_target(r.rows[1]) == ("hidden 0/1 hideable (0.0%; in Inductor's sense, not fully exposed: 0/1, "
                                          "0.0%); 99% target not applicable "
                                          "(the bounds prove 1 of the 1 hideable collectives exposed in every schedule)")
    r = report(queue, Schedule.original(queue))
    assert (r.forced_exposed, r.global_bound_ns) == (0, 7_000)
    assert r.hidden_target(r.rows[1]) == ("hidden 0/100 hideable (0.0%; in Inductor's sense, not fully exposed: 0/100, "
                                          "0.0%); 99% target FAILS")


def test_hidden_target_counts_a_stalled_buckets_members_too() -> None:
    """Hand-derived. 102 gathers of 200 B on group A (5020 ns each alone, curve 5000 ns + 0.1 ns/B)
    and x (6000 ns) independent of them all. The order issues c0..c99 alone, then the bucket
    (c100, c101), waits the bucket at once (it queues behind the 100 lone ones: a stall), runs x,
    then waits c0..c99 (ended before the bucket: hidden). Units: 100 of 101 hidden, 99.0%, which
    alone would pass; the graph's collectives: 100 of 102, 98.0%, so the target FAILS. The bound
    proves one collective exposed (every schedule takes more than x: one bucket of all 102 takes
    5000 + 0.1 * 20,400 ns), and 101 of 102 hidden is still allowed: not waived. In Inductor's
    sense only c0 was overlapped: the lone ones run while the compute stream stalls, except for
    the bucket's 1 ns copy-in (copy_ns(200 B) at 100,000 GB/s), which runs during c0."""
    from fxsched.solver.bounds import forced_exposed, makespan_lower_bound

    n = 102
    p = _gathers_beside(n, 6000)
    order = ([f"c{k}" for k in range(n)] + ["w100", "w101", "x"] + [f"w{k}" for k in range(100)])
    res = simulate(p, Schedule(tuple(order), (("c100", "c101"),)))
    assert (res.n_hidden_hideable, res.n_hideable, res.n_hidden_hideable_members, res.n_hideable_members) == (
        100, 101, 100, 102)
    rows = [compare.Row("original order", simulate(p), 0.0), compare.Row("cpsat", res, 0.0)]
    r = compare.PartReport(p, rows, makespan_lower_bound(p).makespan_ns, [], forced_exposed=forced_exposed(p))
    assert r.global_bound_ns > 6000 and r.forced_exposed == 0
    assert r.hidden_target(r.rows[1]) == (
        "hidden 100/101 hideable (99.0%; in Inductor's sense, not fully exposed: 1/101, 1.0%); counting "
        "each bucket's members: 100/102 (98.0%); 99% target FAILS")


def test_hidden_target_counts_a_hidden_buckets_members_not_its_unit() -> None:
    """Hand-derived, the converse of the test above. 101 gathers of 200 B on group A (5020 ns each
    alone, curve 5000 ns + 0.1 ns/B) and x (20,000 ns) independent of them all. The order issues
    c100 alone and waits it at once (a 5020 ns stall), then issues the bucket c0..c99 (7000 ns,
    after its 1 ns copy-in), runs x (5021 to 25,021 ns) and waits the bucket, which ended at
    12,021 ns: hidden (then its 1 ns copy-out: 25,022 ns in all). Units: 1 of 2 hidden, 50%; the
    graph's collectives: 100 of 101, 99.0%, so the target HOLDS (in Inductor's sense too, c100 ran
    beside no compute). The bound proves none exposed (one bucket of all 101 takes 7020 ns, under
    x), so it applies."""
    from fxsched.solver.bounds import forced_exposed, makespan_lower_bound

    p = _gathers_beside(101, 20_000)
    order = ["c100", "w100"] + [f"c{k}" for k in range(100)] + ["x"] + [f"w{k}" for k in range(100)]
    res = simulate(p, Schedule(tuple(order), (tuple(f"c{k}" for k in range(100)),)))
    assert (res.n_hidden_hideable, res.n_hideable, res.n_hidden_hideable_members, res.n_hideable_members) == (
        1, 2, 100, 101)
    assert res.exposed_ns == 5_020 and res.makespan_ns == 25_022
    rows = [compare.Row("original order", simulate(p), 0.0), compare.Row("cpsat", res, 0.0)]
    r = compare.PartReport(p, rows, makespan_lower_bound(p).makespan_ns, [], forced_exposed=forced_exposed(p))
    assert r.global_bound_ns == 20_000 and r.forced_exposed == 0
    assert r.hidden_target(r.rows[1]) == (
        "hidden 1/2 hideable (50.0%; in Inductor's sense, not fully exposed: 1/2, 50.0%); counting "
        "each bucket's members: 100/101 (99.0%); 99% target HOLDS")


def test_per_collective_table_lists_the_exposed_by_what_limits_them() -> None:
    """Hand-derived. c1 (300 ns) feeds x (200); c2 (100 ns) is independent of x and y (200 each).
    In the original order each is issued and waited at once: exposed 300 and 100 ns. Waiting on
    c2 after x and y hides it; c1 stays exposed (300 ns), and no order can hide it, since x and
    y both depend on it: one exposed row, c1, limited by "no independent compute". With one row
    allowed of the original order's two, the most exposed (c1) is listed and the other summed. The
    last column says what filling a hideable one's stall with later compute takes (c2: its 100 ns
    from after w2, where x and y, 400 ns, need only w1)."""
    from tests.solver.solver_builders import coll, compute, make_problem, wait

    p = make_problem([coll("c1", runtime_ns=300), wait("w1", "c1"), coll("c2", runtime_ns=100), wait("w2", "c2"),
                      compute("x", 200, deps=["w1"], heavy=True), compute("y", 200, deps=["x"], heavy=True)])
    original = compare.render_collectives("original", compare.collective_rows(p))
    assert original[0].startswith("Per collective, `original` against the original order (2 collectives after "
                                  "bucketing; exposed 0.4 us before, 0.4 us after): ")
    table = [line for line in original if line.startswith(("| c1 ", "| c2 "))]
    assert [line.split(" | ")[0] for line in table] == ["| c1", "| c2"]  # most exposed first
    # c2's 100 ns stall: no wait after w2, and x and y (400 ns) need only w1, before it: movable
    assert table[0].endswith("| no independent compute |  |")
    assert table[1].endswith("| needs 0.1 us of compute from after its wait, 0.4 us movable |")
    short = compare.render_collectives("original", compare.collective_rows(p), most=1)
    assert [line.split(" | ")[0] for line in short if line.startswith(("| c1 ", "| c2 "))] == ["| c1"]
    assert "| (1 more exposed, 0.1 us in all) |" in short[-2]
    order = ["c1", "w1", "c2", "x", "y", "w2"]
    sched = Schedule(order=tuple(order), buckets=())
    assert check_schedule(p, sched) == []
    rows = compare.collective_rows(p, sched)
    text = compare.render_collectives("moved", rows)
    assert text[0].endswith("exposed 0.4 us before, 0.3 us after): no independent compute 1, hidden 1.")
    assert [line.split(" | ")[0] for line in text if line.startswith(("| c1 ", "| c2 "))] == ["| c1"]
    assert compare.render_collectives("none", []) == []  # a graph part without collectives gets no block


@pytest.mark.parametrize("verdict", ["FAILS", "HOLDS", "not applicable"])
def test_the_offline_row_runs_only_where_the_hidden_target_fails(zoo: ZooGraph, monkeypatch, verdict: str) -> None:
    """``--offline-budget``: the offline recipe runs (once) only where the summary's CP-SAT row
    fails the hidden target, its row is labelled apart from the CP-SAT rows (the summary's row
    stays the online one), scored by the simulator within the original peak, and its lines become
    a note. The verdict is stubbed here; the recipe (tiny budgets) is real."""
    calls = []
    real = compare.offline

    def spy(problem, budget_s, config, **kw):
        calls.append((budget_s, kw))
        return real(problem, budget_s, config, **kw)

    monkeypatch.setattr(compare, "offline", spy)
    monkeypatch.setattr(compare.PartReport, "hidden_verdict", lambda self, row: verdict)
    report = compare.compare_part(zoo.extract("forward"), {g.name: g.size for g in zoo.groups.values()}, [0.05],
                                  SolveConfig(seed=0, workers=1, deterministic=True), variants=(), heuristics=[],
                                  modes=("free",), offline_s=0.05, offline_rounds=1, offline_round_s=0.05)
    labels = [r.scheduler for r in report.rows]
    if verdict != "FAILS":
        assert calls == [] and labels == ["original order", "cpsat free 0.05s"] and report.offline_row() is None
        return
    assert calls == [(0.05, {"n_rounds": 1, "round_s": 0.05})]
    assert labels == ["original order", "cpsat free 0.05s", "offline free 0.05s+1x0.05s"]
    off = report.offline_row()
    assert off is report.rows[-1] and report.fxsched_row() is report.rows[1]
    assert off.schedule is not None and not check_schedule(report.problem, off.schedule)
    assert off.result == simulate(report.problem, off.schedule)
    assert off.result.peak_memory_bytes <= report.rows[0].result.peak_memory_bytes
    assert off.bound_ns == report.budget_bound_ns
    (note,) = [n for n in report.notes if n.startswith("`offline free 0.05s+1x0.05s`: solve 0.05 s: ")]
    assert "round 0 (radius 8): " in note  # the offline rounds widen up to OFFLINE_MAX_RADIUS


def test_the_summary_gives_the_offline_rows_verdict_after_the_online_ones() -> None:
    """Hand-derived, on the ``free`` problem of the waiver test (two 100 ns collectives, 400 ns of
    compute independent of them): the CP-SAT row keeps the original order (both exposed, 0/2:
    FAILS), the offline row hides both (``overlap``: 2/2, HOLDS, makespan 400 ns, no exposed). No
    storages: every peak is 0, and the ratio prints as 0.000 (as the online clause's does)."""
    from fxsched.heuristics import overlap_schedule
    from fxsched.solver.bounds import makespan_lower_bound

    from tests.solver.solver_builders import coll, compute, make_problem, wait

    p = make_problem([coll("c1", runtime_ns=100), wait("w1", "c1"), coll("c2", runtime_ns=100), wait("w2", "c2"),
                      compute("x", 200, heavy=True), compute("y", 200, deps=["x"], heavy=True)])
    orig, hidden = simulate(p), simulate(p, overlap_schedule(p))
    assert (orig.exposed_ns, orig.n_hidden_hideable, hidden.exposed_ns, hidden.n_hidden_hideable) == (200, 0, 0, 2)
    rows = [compare.Row("original order", orig, 0.0), compare.Row("inductor", orig, 0.0),
            compare.Row("cpsat free 60s", orig, 0.0), compare.Row("offline free 240s+3x60s", hidden, 0.0)]
    r = compare.PartReport(p, rows, makespan_lower_bound(p).makespan_ns, [])
    assert r.fxsched_row() is rows[2] and r.offline_row() is rows[3]
    assert r.hidden_verdict(rows[2]) == "FAILS" and r.hidden_verdict(rows[3]) == "HOLDS"
    summary = r.summary()
    online, offline = summary.split("; **offline free 240s+3x60s**")
    assert online.endswith("hidden 0/2 hideable (0.0%; in Inductor's sense, not fully exposed: 0/2, 0.0%); "
                           "99% target FAILS")
    assert offline == (" (the offline solve, where the cpsat free 60s row fails the hidden target): exposed 0.0 us "
                       "= 0.00x Inductor's, makespan 0.4 us, peak vs original 0.000, hidden 2/2 hideable (100.0%; in "
                       "Inductor's sense, not fully exposed: 2/2, 100.0%); 99% target HOLDS.")


def test_a_kept_stall_proof_waives_the_target_and_the_offline_row_still_runs_where_short_of_it() -> None:
    """The problem above, with a kept stall proof of 1 unit exposed (as ``certified_stalls`` would
    give; the proof itself is tested in test_certificates): 2 - 1 < 99% of 2, so every row's target
    is waived, naming the proof. The CP-SAT row hides 0, fewer than the 1 the proof leaves room
    for, so it is short of it (the compare runs the offline row), and the offline clause says so;
    the offline row hides 2 and is not short."""
    from fxsched.heuristics import overlap_schedule
    from fxsched.solver.bounds import makespan_lower_bound

    from tests.solver.solver_builders import coll, compute, make_problem, wait

    p = make_problem([coll("c1", runtime_ns=100), wait("w1", "c1"), coll("c2", runtime_ns=100), wait("w2", "c2"),
                      compute("x", 200, heavy=True), compute("y", 200, deps=["x"], heavy=True)])
    orig, hidden = simulate(p), simulate(p, overlap_schedule(p))
    rows = [compare.Row("original order", orig, 0.0), compare.Row("inductor", orig, 0.0),
            compare.Row("cpsat free 60s", orig, 0.0), compare.Row("offline free 240s+3x60s", hidden, 0.0)]
    r = compare.PartReport(p, rows, makespan_lower_bound(p).makespan_ns, [], stall_exposed=1,
                           stall_proof="the stall proof at cuts y (p.stall_proof.json)")
    assert r.hidden_verdict(rows[2]) == r.hidden_verdict(rows[3]) == "not applicable"
    assert r.short_of_proof(rows[2]) and not r.short_of_proof(rows[3])
    assert r.hidden_target(rows[2]).endswith(
        "99% target not applicable (the stall proof at cuts y (p.stall_proof.json) proves 1 of the 2 hideable "
        "collectives exposed in every schedule within the memory budget)")
    assert "(the offline solve, where the cpsat free 60s row hides fewer than the stall proof allows)" in r.summary()


def test_hidden_target_says_what_hiding_all_but_one_takes_where_all_compute_feeds_collectives() -> None:
    """Hand-derived. a (100) feeds c1 (300 ns); a and x (500) feed b (100), which feeds c2 (300 ns):
    every compute op feeds a collective (bounds.exposed_after_compute). c1 is hideable (x is
    independent of it, 500 ns against its 300) and c2 is not (all compute feeds it). The original
    order waits each at once: c1 stalls 300 (0/1 hidden, nothing beside it), so the target FAILS,
    and the verdict says that a collective is exposed after all compute in every schedule, so that
    hiding all but one takes a compute stream that never stalls. Where some compute feeds no
    collective (the other hidden-target tests), it says nothing of the kind."""
    from fxsched.solver.bounds import exposed_after_compute, forced_exposed, makespan_lower_bound

    from tests.solver.solver_builders import RS, coll, compute, make_problem, wait

    p = make_problem([compute("a", 100), coll("c1", kind=RS, runtime_ns=300, deps=["a"]), wait("w1", "c1"),
                      compute("x", 500), compute("b", 100, deps=["a", "x"]),
                      coll("c2", kind=RS, runtime_ns=300, deps=["b"]), wait("w2", "c2")])
    rows = [compare.Row("original order", simulate(p), 0.0), compare.Row("cpsat", simulate(p), 0.0)]
    r = compare.PartReport(p, rows, makespan_lower_bound(p).makespan_ns, [], forced_exposed=forced_exposed(p),
                           tail_exposed=exposed_after_compute(p))
    assert r.tail_exposed and r.forced_exposed == 0
    assert r.hidden_target(r.rows[1]) == (
        "hidden 0/1 hideable (0.0%; in Inductor's sense, not fully exposed: 0/1, 0.0%); 99% target FAILS "
        "(every compute op feeds a collective, so one is exposed after all compute in every schedule: "
        "hiding all but one takes a compute stream that never stalls)")
