"""Timelines, the per-collective table and the Chrome trace, on hand-built problems whose
numbers are derived by hand (no torch)."""

from __future__ import annotations

import json
import sys

import pytest

from fxsched.fxbridge.gantt import PlotUnavailable, write_gantt
from fxsched.fxbridge.timeline import (
    COMPUTE_TID,
    TimelineError,
    build_timeline,
    collective_rows,
    collective_table,
    group_tids,
    write_trace,
)
from fxsched.solver import (
    BucketCosts,
    CollectiveInfo,
    CollectiveKind,
    CommCurve,
    Op,
    OpKind,
    ProcessGroup,
    Schedule,
    ScheduleProblem,
    Storage,
    simulate,
)

AG, RS = CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER


def C(name, rt, deps=(), alloc=(), uses=(), heavy=False) -> Op:
    return Op(name, OpKind.COMPUTE, rt, tuple(deps), tuple(alloc), tuple(uses), heavy=heavy)


def coll(name, rt, deps=(), group="A", kind=AG, alloc=(), uses=(), nbytes=100) -> Op:
    info = CollectiveInfo(kind, group, "bf16", nbytes, 2 * nbytes, "sum" if kind is RS else None)
    return Op(name, OpKind.COLLECTIVE, rt, tuple(deps), tuple(alloc), tuple(uses), collective=info)


def W(name, on, deps=()) -> Op:
    return Op(name, OpKind.WAIT, 0, (on, *deps), waits_on=on)


def problem(ops, storages=(), groups=("A",)) -> ScheduleProblem:
    return ScheduleProblem(
        ops=tuple(ops), storages=tuple(storages), groups=tuple(ProcessGroup(g, 2) for g in groups),
        comm_curves=tuple(CommCurve(g, k, ((0, 100), (1000, 1100))) for g in groups for k in CollectiveKind),
        bucket_costs=BucketCosts(memory_bandwidth_gbps=2.0, launch_overhead_ns=100), name="hand",
    )


def two_group_problem() -> ScheduleProblem:
    """Two independent all_gathers on A (bucketable), a reduce_scatter on B, compute between."""
    return problem([
        C("x", 100, heavy=True),
        coll("a1", 300, ["x"]), coll("a2", 300, ["x"]),
        C("y", 250, ["x"]),
        W("w1", "a1"), W("w2", "a2"),
        C("z", 400, ["w1", "w2"], heavy=True),
        coll("r", 500, ["z"], group="B", kind=RS),
        C("u", 200, ["x"]),
        W("wr", "r"),
        C("v", 50, ["wr"]),
    ], groups=("A", "B"))


BUCKETED = Schedule(("x", "a1", "a2", "y", "w1", "w2", "z", "r", "u", "wr", "v"), buckets=(("a1", "a2"),))


@pytest.mark.parametrize("schedule", [None, BUCKETED])
def test_timeline_adds_up_to_the_simulator(schedule):
    p = two_group_problem()
    tl = build_timeline(p, schedule)
    sim = simulate(p, schedule)
    by_kind = lambda k: sum(s.dur_ns for s in tl.spans if s.kind == k)
    assert by_kind("compute") + by_kind("copy_in") + by_kind("copy_out") == sim.compute_ns
    assert by_kind("stall") == sim.exposed_ns
    assert tl.spans[-1].end_ns == sim.makespan_ns
    assert all(a.end_ns <= b.start_ns for a, b in zip(tl.spans, tl.spans[1:]))  # one stream, no overlap
    if schedule is not None:  # bucket: copy-in 100 + 2*200/2 = 300, copy-out 100 + 2*400/2 = 500
        assert by_kind("copy_in") == 300 and by_kind("copy_out") == 500
        # the bucket runs at 100 + 600 bytes = 700 ns
        assert {c.members: c.runtime_ns for c in tl.collectives}[("a1", "a2")] == 700


def test_timeline_rejects_a_simulator_it_disagrees_with():
    p = two_group_problem()
    sim = simulate(p)
    import dataclasses
    with pytest.raises(TimelineError, match="makespan"):
        build_timeline(p, sim=dataclasses.replace(sim, makespan_ns=sim.makespan_ns + 1))


def test_chrome_trace_structure(tmp_path):
    p = two_group_problem()
    tl = build_timeline(p, BUCKETED)
    rows = collective_rows(p, BUCKETED)
    path = write_trace(tl, tmp_path / "trace.json", rows, "bucketed")
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    tids = group_tids(p)
    assert names == {COMPUTE_TID: "compute", tids["A"]: "pg A (size 2)", tids["B"]: "pg B (size 2)"}
    xs = [e for e in ev if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and e["pid"] == 1 for e in xs)
    sim = tl.sim
    on = lambda tid, cat=None: [e for e in xs if e["tid"] == tid and (cat is None or e["cat"] == cat)]
    # compute track: busy or stalled the whole makespan; stalls add up to the exposed time
    assert sum(e["dur"] for e in on(COMPUTE_TID)) * 1e3 == pytest.approx(sim.makespan_ns)
    assert sum(e["dur"] for e in on(COMPUTE_TID, "stall")) * 1e3 == pytest.approx(sim.exposed_ns)
    assert sum(e["args"]["dur_ns"] for e in on(COMPUTE_TID) if e["cat"] != "stall") == sim.compute_ns
    assert {e["cat"] for e in on(COMPUTE_TID)} == {"compute", "copy_in", "copy_out", "stall"}
    # one event per issued collective on its group's track, durations = the simulator's comm time
    assert len(on(tids["A"])) == 1 and len(on(tids["B"])) == 1
    assert sum(e["args"]["dur_ns"] for e in on(tids["A"]) + on(tids["B"])) == sim.comm_ns
    bucket = on(tids["A"])[0]
    assert bucket["args"]["members"] == ["a1", "a2"] and bucket["name"] == "a1 (+1)"
    assert "limiting" in bucket["args"]
    assert doc["otherData"]["makespan_ns"] == sim.makespan_ns and doc["otherData"]["schedule"] == "bucketed"
    counters = [e for e in ev if e["ph"] == "C"]
    assert max(e["args"]["MiB"] for e in counters) == pytest.approx(sim.peak_memory_bytes / 2**20, abs=1e-3)


# ---------------------------------------------------------------- limiting factors


def limiting(p: ScheduleProblem, schedule: Schedule | None = None, **kw) -> dict[str, tuple[str, str, int, int]]:
    return {r.name: (r.limiting, r.detail, r.initial_exposed_ns, r.final_exposed_ns)
            for r in collective_rows(p, schedule, **kw)}


def test_limiting_no_independent_compute():
    p = problem([C("x", 100), coll("c", 500, ["x"]), W("w", "c"), C("z", 100, ["w"])])
    assert limiting(p)["c"][:1] == ("no independent compute",)
    assert limiting(p)["c"][3] == 500


def test_limiting_fifo_behind_the_previous_collective():
    """c1 (500) and c2 (300) both issued at 100; c2 queues until 600, ends 900; wait at 700 stalls 200.
    Started when issued, it would have ended at 400: FIFO is what exposes it."""
    p = problem([C("x", 100), coll("c1", 500, ["x"]), coll("c2", 300, ["x"]), C("y", 600, ["x"]),
                 W("w1", "c1"), W("w2", "c2"), C("z", 10, ["w1", "w2"])])
    lim = limiting(p)
    assert lim["c1"][0] == "hidden"
    assert lim["c2"][0] == "FIFO behind c1" and lim["c2"][3] == 200


def test_limiting_data_dependency():
    """z is independent (so c is hideable) but comes before c's producer x in this order."""
    p = problem([C("z", 1000), C("x", 100), coll("c", 500, ["x"]), W("w", "c"), C("y", 100, ["w"])])
    lim = limiting(p)
    assert lim["c"][0] == "data dependency" and "between x and y" in lim["c"][1]


def memory_problem() -> ScheduleProblem:
    """c could be issued before a and b (800 ns of compute), but a's 1000 B temporary is live there:
    issuing c earlier would add its 1000 B output on top (2100 B > 1100 B, the original peak)."""
    return problem([
        C("x", 100, alloc=["in"]),
        C("a", 400, alloc=["tmp"]),
        C("b", 400, ["a"], uses=["tmp"]),
        coll("c", 500, ["x"], alloc=["out"], uses=["in"]),
        W("w", "c"),
        C("y", 100, ["w", "b"], uses=["out"]),
    ], storages=[Storage("in", 100), Storage("tmp", 1000), Storage("out", 1000)])


def test_limiting_memory_budget_and_placement():
    p = memory_problem()
    assert simulate(p).peak_memory_bytes == 1100
    lim = limiting(p)
    assert lim["c"][0] == "memory budget" and "issue earlier" in lim["c"][1] and lim["c"][3] == 500
    lim = limiting(p, memory_budget_bytes=5000)
    assert lim["c"][0] == "placement" and "issue earlier" in lim["c"][1]
    early = Schedule(("x", "c", "a", "b", "w", "y"))
    assert limiting(p, early)["c"] == ("hidden", "", 500, 0)


def test_collective_table_text():
    p = two_group_problem()
    text = collective_table(collective_rows(p, BUCKETED))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["collective", "kind", "group"] and "limiting factor" in lines[0]
    assert any(line.startswith("a1 (+1)") for line in lines) and lines[-1].startswith("total")


# ---------------------------------------------------------------- Gantt


def test_gantt_png(tmp_path):
    pytest.importorskip("matplotlib")
    p = two_group_problem()
    path = write_gantt([("original", build_timeline(p)), ("bucketed", build_timeline(p, BUCKETED))],
                       tmp_path / "gantt.png", memory_budget_bytes=1000)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_gantt_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(PlotUnavailable, match=r"fxsched\[plot\]"):
        write_gantt([("original", build_timeline(two_group_problem()))], tmp_path / "g.png")
    assert not (tmp_path / "g.png").exists()
