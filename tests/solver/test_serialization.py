"""JSON round trips of problems and schedules; bad files raise ProblemError naming the file."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fxsched.solver import (
    ProblemError,
    Schedule,
    ScheduleProblem,
    load_problem,
    load_schedule,
    save_problem,
    save_schedule,
    simulate,
)
from fxsched.solver.serialization import (
    SCHEMA_VERSION,
    problem_from_dict,
    problem_to_dict,
    schedule_from_dict,
    schedule_to_dict,
)

from random_dags import random_bucketing, random_problem, random_topological_order
from solver_builders import AG, RS, coll, compute, make_problem, storage, wait, zero


def _hand_problem() -> ScheduleProblem:
    """Every field set somewhere: heavy, target, module, reduce_op, ranks, metadata, params."""
    p = make_problem([
        compute("mm", 10, uses=["W"], allocates=["X"], heavy=True),
        zero("v", deps=["mm"], uses=["X"]),
        coll("c1", kind=AG, runtime_ns=30, bytes_in=8, bytes_out=16, deps=["v"], uses=["X"], allocates=["G"]),
        coll("c2", "B", kind=RS, reduce_op="avg", dtype="f32", runtime_ns=7, bytes_in=8, bytes_out=4,
             deps=["v"], uses=["X"], allocates=["R"]),
        wait("w1", "c1", uses=["G"]),
        wait("w2", "c2", uses=["R"]),
        compute("out", 3, deps=["w1", "w2"], uses=["G", "R"], allocates=["O"]),
    ], [storage("W", 64, param=True), storage("X", 8), storage("G", 16), storage("R", 4),
        storage("O", 2, keep=True)])
    ops = tuple(replace(op, target="aten.mm.default", module="layers.0.mlp") if op.name == "mm" else op
                for op in p.ops)
    return ScheduleProblem(ops=ops, storages=p.storages, groups=p.groups, comm_curves=p.comm_curves,
                           bucket_costs=p.bucket_costs, name="hand", metadata={"model": "tiny", "layers": "1"})


def _problems() -> list[ScheduleProblem]:
    return [_hand_problem(), *(random_problem(random.Random(seed), name=f"r{seed}") for seed in range(20))]


@pytest.mark.parametrize("p", _problems(), ids=lambda p: p.name)
def test_problem_round_trip_dict_and_file(p: ScheduleProblem, tmp_path: Path) -> None:
    d = problem_to_dict(p)
    assert json.loads(json.dumps(d)) == d
    back = problem_from_dict(d)
    assert back == p and back.metadata == p.metadata and back.name == p.name
    assert back.ops == p.ops and back.bucket_costs == p.bucket_costs
    path = tmp_path / "p.json"
    save_problem(p, path)
    loaded = load_problem(path)
    assert loaded == p and loaded.metadata == p.metadata
    assert simulate(loaded) == simulate(p)


def test_round_trip_keeps_simulation_of_a_bucketed_reordered_schedule(tmp_path: Path) -> None:
    rng = random.Random(7)
    for i in range(10):
        p = random_problem(rng)
        order = random_topological_order(p, rng, late_waits=True)
        sched = Schedule(order, random_bucketing(p, order, rng, multi_dtype=True), multi_dtype=True)
        save_problem(p, tmp_path / f"p{i}.json")
        save_schedule(sched, tmp_path / f"s{i}.json", problem_name=p.name)
        p2, s2 = load_problem(tmp_path / f"p{i}.json"), load_schedule(tmp_path / f"s{i}.json")
        assert (p2, s2) == (p, sched)
        assert simulate(p2, s2) == simulate(p, sched)


def test_schedule_round_trip(tmp_path: Path) -> None:
    s = Schedule(("a", "c1", "c2", "w1", "w2"), (("c1", "c2"),), multi_dtype=True)
    d = schedule_to_dict(s, "prob")
    assert d["problem"] == "prob" and d["schema_version"] == SCHEMA_VERSION
    assert schedule_from_dict(json.loads(json.dumps(d))) == s
    save_schedule(s, tmp_path / "s.json")
    assert load_schedule(tmp_path / "s.json") == s
    plain = Schedule(("a", "b"))
    save_schedule(plain, tmp_path / "plain.json")
    assert load_schedule(tmp_path / "plain.json") == plain


def _write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _problem_dict() -> dict[str, Any]:
    return problem_to_dict(_hand_problem())


def _expect_error(path: Path, loader: Any = load_problem, match: str | None = None) -> str:
    with pytest.raises(ProblemError, match=match) as err:
        loader(path)
    assert str(path) in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("version", [0, 2, SCHEMA_VERSION + 1, None, "1"])
def test_other_schema_version(tmp_path: Path, version: object) -> None:
    d = _problem_dict()
    d["schema_version"] = version
    _expect_error(_write(tmp_path / "v.json", d), match="schema_version")
    s = schedule_to_dict(Schedule(("a",)))
    s["schema_version"] = version
    _expect_error(_write(tmp_path / "sv.json", s), load_schedule, match="schema_version")


def test_missing_schema_version(tmp_path: Path) -> None:
    d = _problem_dict()
    del d["schema_version"]
    _expect_error(_write(tmp_path / "nov.json", d), match="schema_version")


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps(_problem_dict())
    _expect_error(_write(tmp_path / "t.json", text[: len(text) // 2]), match="JSON")
    _expect_error(_write(tmp_path / "empty.json", ""), match="JSON")
    sched = json.dumps(schedule_to_dict(Schedule(("a", "b"))))
    _expect_error(_write(tmp_path / "ts.json", sched[:-3]), load_schedule, match="JSON")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00\x81garbage")
    _expect_error(path)


def test_wrong_format(tmp_path: Path) -> None:
    sched_file = _write(tmp_path / "s.json", schedule_to_dict(Schedule(("a",))))
    _expect_error(sched_file, match="not an fxsched.problem file")
    prob_file = _write(tmp_path / "p.json", _problem_dict())
    _expect_error(prob_file, load_schedule, match="not an fxsched.schedule file")
    _expect_error(_write(tmp_path / "list.json", [1, 2]), match="not an fxsched.problem file")
    _expect_error(_write(tmp_path / "other.json", {"hello": "world"}), match="not an fxsched")


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("ops"),
    lambda d: d.pop("storages"),
    lambda d: d.pop("groups"),
    lambda d: d["ops"][0].pop("name"),
    lambda d: d["ops"][0].pop("kind"),
    lambda d: d["ops"][2]["collective"].pop("bytes_in"),
    lambda d: d["storages"][0].pop("size_bytes"),
    lambda d: d["groups"][0].pop("size"),
    lambda d: d["comm_curves"][0].pop("points"),
], ids=["ops", "storages", "groups", "op.name", "op.kind", "collective.bytes_in", "storage.size",
        "group.size", "curve.points"])
def test_missing_field(tmp_path: Path, mutate: Any) -> None:
    d = _problem_dict()
    mutate(d)
    _expect_error(_write(tmp_path / "m.json", d))


@pytest.mark.parametrize("mutate", [
    lambda d: d["ops"][0].update(kind="bogus"),
    lambda d: d["ops"][0].update(runtime_ns=[1]),
    lambda d: d["ops"][0].update(extra=1) or d["ops"][2]["collective"].update(color="red"),
    lambda d: d["storages"][0].update(size_bytes="big"),
    lambda d: d.update(ops=None),
    lambda d: d.update(bucket_costs=[1, 2]),
    lambda d: d["comm_curves"][0].update(points=[[0, 1, 2], [3, 4, 5]]),
], ids=["kind", "runtime", "collective-field", "size-type", "ops-null", "costs-list", "points"])
def test_corrupt_values(tmp_path: Path, mutate: Any) -> None:
    d = _problem_dict()
    mutate(d)
    _expect_error(_write(tmp_path / "c.json", d))


def test_invalid_problem_in_file_names_file_and_item(tmp_path: Path) -> None:
    d = _problem_dict()
    d["ops"][0]["runtime_ns"] = -4
    assert "'mm'" in _expect_error(_write(tmp_path / "neg.json", d), match="negative")
    d = _problem_dict()
    d["ops"][1]["deps"] = ["ghost"]
    assert "'ghost'" in _expect_error(_write(tmp_path / "dep.json", d), match="unknown dependency")


def test_corrupt_schedule(tmp_path: Path) -> None:
    base = schedule_to_dict(Schedule(("a", "b"), (("a", "b"),)))
    changes: list[dict[str, Any]] = [{"order": [1, 2]}, {"buckets": [["a", 3]]}, {"buckets": ["ab"]}]
    for i, change in enumerate(changes):
        _expect_error(_write(tmp_path / f"s{i}.json", {**base, **change}), load_schedule, match="corrupt")
    missing = dict(base)
    del missing["order"]
    _expect_error(_write(tmp_path / "no_order.json", missing), load_schedule, match="corrupt")


def test_infinite_number_is_problem_error(tmp_path: Path) -> None:
    text = json.dumps(_problem_dict()).replace('"runtime_ns": 10', '"runtime_ns": Infinity', 1)
    assert "Infinity" in text
    _expect_error(_write(tmp_path / "inf.json", text))
