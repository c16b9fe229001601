"""Hand-computed memory curves (DESIGN.md, "Execution model", Memory).

The curve holds, for each program position, the bytes live after that op's allocations and
before its frees: a storage is live from its allocation to its last use (inclusive). Graph
inputs are live before the first op; ``never_freed`` storages (parameters, outputs) stay live.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxsched.solver import Schedule, ScheduleProblem, SimResult, check_schedule, simulate

from solver_builders import AG, RS, coll, compute, make_problem, storage, wait, zero


def mem(p: ScheduleProblem, order: Sequence[str] | None = None,
        buckets: Sequence[Sequence[str]] = ()) -> SimResult:
    names = tuple(order) if order is not None else tuple(op.name for op in p.ops)
    sched = Schedule(names, tuple(tuple(b) for b in buckets))
    assert check_schedule(p, sched) == []
    r = simulate(p, sched)
    assert len(r.memory_curve) == len(names)
    assert r.peak_memory_bytes == max([r.initial_memory_bytes, *r.memory_curve])
    return r


def test_views_params_inputs_and_outputs() -> None:
    """W param 1000, X input 100, U input 7 (unused), Y 50 (mm), Z 20 (relu), O 30 (output, kept).
    initial = 1000 + 100 + 7 = 1107.
    0 v (view of X): W + X = 1100 (U has no use: freed before the first op; a view adds nothing)
    1 mm allocates Y: 1100 + 50 = 1150 (last use of X: freed after)
    2 v2 (view of Y): W + Y = 1050
    3 relu allocates Z: 1050 + 20 = 1070 (last use of Y)
    4 out allocates O: W + Z + O = 1050; W was last used at 1 but is never freed.
    peak = 1150."""
    p = make_problem([
        zero("v", uses=["X"]),
        compute("mm", 10, deps=["v"], uses=["W", "X"], allocates=["Y"]),
        zero("v2", deps=["mm"], uses=["Y"]),
        compute("relu", 5, deps=["v2"], uses=["Y"], allocates=["Z"]),
        compute("out", 1, deps=["relu"], uses=["Z"], allocates=["O"]),
    ], [storage("W", 1000, param=True), storage("X", 100, inp=True), storage("U", 7, inp=True),
        storage("Y", 50), storage("Z", 20), storage("O", 30, keep=True)])
    r = mem(p)
    assert r.initial_memory_bytes == 1107
    assert r.memory_curve == (1100, 1150, 1050, 1070, 1050)
    assert r.peak_memory_bytes == 1150


def test_view_use_extends_its_base_storage() -> None:
    """X input 100; a reads X and allocates Y (10); b reads Y; view v of X.
    Order v a b: X last used at 1 -> (100, 110, 10).
    Order a b v: the view at 2 keeps X live -> (110, 110, 100)."""
    p = make_problem([
        compute("a", 1, uses=["X"], allocates=["Y"]),
        compute("b", 1, deps=["a"], uses=["Y"]),
        zero("v", uses=["X"]),
    ], [storage("X", 100, inp=True), storage("Y", 10)])
    assert mem(p, ["v", "a", "b"]).memory_curve == (100, 110, 10)
    r = mem(p, ["a", "b", "v"])
    assert r.memory_curve == (110, 110, 100)
    assert (r.initial_memory_bytes, r.peak_memory_bytes) == (100, 110)


def test_never_freed_output_stays_live() -> None:
    """a allocates S (5), b allocates T (3); neither is used. Kept S: (5, 8). Freed S: (5, 3)."""
    for keep, curve in ((True, (5, 8)), (False, (5, 3))):
        p = make_problem([compute("a", 1, allocates=["S"]), compute("b", 1, allocates=["T"])],
                         [storage("S", 5, keep=keep), storage("T", 3)])
        assert mem(p).memory_curve == curve


def test_peak_can_be_the_initial_memory() -> None:
    """Unused input U 1000 counts in initial memory only; a allocates 10: curve (10,), peak 1000."""
    p = make_problem([compute("a", 1, allocates=["S"])], [storage("U", 1000, inp=True), storage("S", 10)])
    r = mem(p)
    assert (r.initial_memory_bytes, r.memory_curve, r.peak_memory_bytes) == (1000, (10,), 1000)


def test_collective_input_live_until_wait_output_allocated_at_issue() -> None:
    """G input 100, c all_gathers G into O (200), h allocates H (40), k reads O and H into K (10,
    kept). 0 c: G + O = 300; 1 h: 340; 2 w: G still live (input lives until the wait): 340;
    3 k: O + H + K = 250. peak 340."""
    p = make_problem([
        coll("c", kind=AG, runtime_ns=50, bytes_in=100, bytes_out=200, uses=["G"], allocates=["O"]),
        compute("h", 20, allocates=["H"]),
        wait("w", "c", uses=["O"]),
        compute("k", 5, deps=["w", "h"], uses=["O", "H"], allocates=["K"]),
    ], [storage("G", 100, inp=True), storage("O", 200), storage("H", 40), storage("K", 10, keep=True)])
    r = mem(p)
    assert r.memory_curve == (300, 340, 340, 250)
    assert (r.initial_memory_bytes, r.peak_memory_bytes) == (100, 340)


def _ag_problem() -> ScheduleProblem:
    return make_problem([
        coll("c1", kind=AG, runtime_ns=10, bytes_in=100, bytes_out=200, uses=["I1"], allocates=["O1"]),
        compute("r", 7, allocates=["R"]),
        coll("c2", kind=AG, runtime_ns=10, bytes_in=200, bytes_out=400, uses=["I2"], allocates=["O2"]),
        wait("w1", "c1", uses=["O1"]),
        wait("w2", "c2", uses=["O2"]),
        compute("u", 3, deps=["w1", "w2", "r"], uses=["O1", "O2", "R"]),
    ], [storage("I1", 100, inp=True), storage("I2", 200, inp=True), storage("O1", 200),
        storage("O2", 400), storage("R", 10)])


def test_all_gather_unbucketed_memory() -> None:
    """I1 live to w1 (3), I2 to w2 (4), O1 from 0, O2 from 2, R from 1, all three to 5.
    0: I1+I2+O1 = 500; 1: +R = 510; 2: +O2 = 910; 3: 910; 4: I2+O1+O2+R = 810; 5: 610."""
    r = mem(_ag_problem())
    assert r.memory_curve == (500, 510, 910, 910, 810, 610)
    assert r.peak_memory_bytes == 910


def test_all_gather_bucket_memory() -> None:
    """Bucket (c1, c2): issue 2, wait 3. The copy-in reads I1, I2 at 2 (freed after 2); the flat
    input (300) and the flat gathered output (600) live 2..3; the copy-out at the wait allocates
    O1, O2 at 3. 0: I1+I2 = 300; 1: +R = 310; 2: 300+10+300+600 = 1210; 3: R + 300 + 600 + O1 + O2
    = 1510; 4: R+O1+O2 = 610; 5: 610."""
    r = mem(_ag_problem(), buckets=[("c1", "c2")])
    assert r.memory_curve == (300, 310, 1210, 1510, 610, 610)
    assert (r.initial_memory_bytes, r.peak_memory_bytes) == (300, 1510)


def _rs_problem() -> ScheduleProblem:
    return make_problem([
        coll("c1", kind=RS, runtime_ns=10, bytes_in=400, bytes_out=200, uses=["I1"], allocates=["O1"]),
        coll("c2", kind=RS, runtime_ns=10, bytes_in=200, bytes_out=100, uses=["I2"], allocates=["O2"]),
        wait("w1", "c1", uses=["O1"]),
        compute("u1", 1, deps=["w1"], uses=["O1"], allocates=["X1"]),
        wait("w2", "c2", uses=["O2"]),
        compute("u2", 1, deps=["w2"], uses=["O2"], allocates=["X2"]),
        compute("f", 1, deps=["u1", "u2"], uses=["X1", "X2"]),
    ], [storage("I1", 400, inp=True), storage("I2", 200, inp=True), storage("O1", 200),
        storage("O2", 100), storage("X1", 5), storage("X2", 3)])


def test_reduce_scatter_unbucketed_memory() -> None:
    """I1 live to w1 (2), I2 to w2 (4); O1 0..3, O2 1..5, X1 3..6, X2 5..6.
    0: 600+200 = 800; 1: +100 = 900; 2: 900; 3: I2+O1+O2+X1 = 505; 4: I2+O2+X1 = 305;
    5: O2+X1+X2 = 108; 6: X1+X2 = 8."""
    r = mem(_rs_problem())
    assert r.memory_curve == (800, 900, 900, 505, 305, 108, 8)
    assert r.peak_memory_bytes == 900


def test_reduce_scatter_bucket_outputs_freed_together() -> None:
    """Bucket (c1, c2): issue 1, wait 2 (w1). I1, I2 read by the copy-in at 1; flat input 600 live
    1..2; O1, O2 (views of the flat output) allocated at 1 and freed together after O2's last use
    (5), though O1 is last used at 3. 0: 600; 1: 600+600+300 = 1500; 2: 600+300 = 900;
    3: 300+5 = 305; 4: 305; 5: 300+5+3 = 308; 6: 8."""
    r = mem(_rs_problem(), buckets=[("c1", "c2")])
    assert r.memory_curve == (600, 1500, 900, 305, 305, 308, 8)
    assert (r.initial_memory_bytes, r.peak_memory_bytes) == (600, 1500)
