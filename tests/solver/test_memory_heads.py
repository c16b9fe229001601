"""Memory heads (solver/memory_cuts.memory_heads): a collective whose outputs would not fit beside a
memory peak is issued after it. Hand-derived values, and the bound built on them never above the
brute-force optimum within the same budget."""

from __future__ import annotations

import random

import numpy as np
import pytest
from fxsched.solver import bounds
from fxsched.solver.bounds import _memory_peaks, _stream_set, _weights, makespan_lower_bound
from fxsched.solver.memory_cuts import MEMORY_HEAD_PEAKS, memory_heads
from fxsched.solver.problem import bit_mask
from oracle import brute_force, default_budget
from solver_builders import AG, coll, compute, loss_then_gather, make_problem, storage, wait


def _heads(p, budget: int) -> dict[str, int]:
    w = _weights(p)
    dep = {c.name: int(w[bit_mask(p.ancestors[p.index[c.name]], len(p.ops))].sum()) for c in p.collectives}
    return memory_heads(p, budget, w, dep, _memory_peaks(p, MEMORY_HEAD_PEAKS))


def test_a_gather_that_does_not_fit_beside_the_peak_waits_for_it() -> None:
    """The budget is the original peak, 100 + 1000 + 1 = 1101 B at b. Issued before b, g's 500 B
    would be live there too (y, which reads them, needs b): 1601 B. So g is issued after a and b
    (2010 ns of compute), and the makespan is at least 2010 + 700 + 1000 (y) = 3710, which the
    original order reaches. Without the memory head the bound is the compute, 3010 (g hides
    under a)."""
    p = loss_then_gather()
    budget = default_budget(p)
    assert budget == 1_101
    assert _heads(p, budget) == {"g": 2_010}
    assert makespan_lower_bound(p, budget).makespan_ns == 3_710
    assert brute_force(p, budget_bytes=budget).best_makespan_ns == 3_710


def test_room_beside_the_peak_proves_nothing() -> None:
    """With 500 B more budget g fits beside the peak: no head, and the bound is the compute."""
    p = loss_then_gather()
    assert _heads(p, 1_601) == {}
    assert makespan_lower_bound(p, 1_601).makespan_ns == 3_010
    assert brute_force(p, budget_bytes=1_601).best_makespan_ns == 3_010


def random_peaked(rng: random.Random):
    """A peak op b (reads a temporary of a) and two or three gathers of random sizes, each read by
    a compute op after b or before it; random runtimes. Small enough for the brute-force oracle."""
    n_g = rng.randint(2, 3)
    ops = [compute("a", rng.choice([500, 2_000, 4_000]), allocates=["T"], heavy=True),
           compute("b", rng.choice([0, 10, 300]), deps=["a"], uses=["T"], allocates=["U"])]
    stores = [storage("T", rng.choice([200, 1_000, 3_000])), storage("U", rng.choice([1, 400]))]
    prev = "b"
    for j in range(n_g):
        out = rng.choice([50, 300, 800, 2_000])
        ops += [coll(f"g{j}", "A", AG, runtime_ns=200 + out, bytes_in=100, bytes_out=out, uses=[f"p{j}"],
                     allocates=[f"G{j}"]),
                wait(f"w{j}", f"g{j}", uses=[f"G{j}"])]
        deps = [f"w{j}"] + ([prev] if rng.random() < 0.8 else [])
        ops.append(compute(f"y{j}", rng.choice([300, 1_000, 2_000]), deps=deps, uses=[f"G{j}", "U"] if j == 0
                           else [f"G{j}"], heavy=True))
        prev = f"y{j}"
        stores += [storage(f"p{j}", 100, param=True), storage(f"G{j}", out)]
    return make_problem(ops, stores, groups=("A",))


PEAKED = [random_peaked(random.Random(i)) for i in range(30)]


@pytest.mark.parametrize("idx", range(len(PEAKED)))
def test_memory_heads_never_exceed_the_optimum(idx: int) -> None:
    p = PEAKED[idx]
    budget = default_budget(p)
    assert makespan_lower_bound(p, budget).makespan_ns <= brute_force(p, budget_bytes=budget).best_makespan_ns


def test_memory_heads_bind_somewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: on many of the generated problems the memory heads raise the bound (23 of the 30
    at this writing; 12 of the 30 bounds then equal the optimum), and never lower it."""
    with_heads = [makespan_lower_bound(p, default_budget(p)).makespan_ns for p in PEAKED]
    monkeypatch.setattr(bounds, "memory_heads", lambda *args, **kwargs: {})
    without = [makespan_lower_bound(p, default_budget(p)).makespan_ns for p in PEAKED]
    assert all(a >= b for a, b in zip(with_heads, without))
    assert sum(a > b for a, b in zip(with_heads, without)) >= 5


def test_stream_set_leaves_out_only_whole_early_heads_within_one_percent() -> None:
    """Heads 5, 0, 1, 7 with 100, 0.5, 3, 100 bytes: the head-0 collective holds 0.25% of the bytes
    and goes; with the head-1 one the share would be 1.7%, so it stays. Two collectives sharing the
    least head go together or not at all, and a group of no bytes keeps everything."""
    assert _stream_set(np.array([5, 0, 1, 7]), np.array([100.0, 0.5, 3.0, 100.0])).tolist() == [0, 2, 3]
    assert _stream_set(np.array([5, 0, 0, 7]), np.array([100.0, 0.5, 0.5, 100.0])).tolist() == [0, 3]
    assert _stream_set(np.array([5, 0, 0, 7]), np.array([100.0, 0.5, 3.0, 100.0])).tolist() == [0, 1, 2, 3]
    assert _stream_set(np.array([5, 0, 7]), np.zeros(3)).tolist() == [0, 1, 2]
