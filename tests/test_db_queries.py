"""Queries: naming runs, resume sets, diffs by case id, and history aggregated in SQL."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from datetime import timedelta

import pytest
from db_fixtures import fake_meta, fake_result
from sqlalchemy import update

from convmatrix.core.errors import UsageError
from convmatrix.core.verdict import judged_dtype
from convmatrix.db import (
    ResultWriter,
    Session,
    case_pairs,
    done_case_ids,
    history,
    list_runs,
    resolve_run,
)
from convmatrix.db.models import Run


def _write(engine, results, **meta) -> int:
    with ResultWriter(engine, batch_size=16) as writer:
        run_id = writer.start_run(fake_meta(**meta))
        for result in results:
            writer.add(result)
    return run_id


@pytest.fixture
def three_runs(db_engine):
    ids = [
        _write(db_engine, [fake_result(0)], kernel_commit="aaaa1111", label="base"),
        _write(db_engine, [fake_result(0)], kernel_commit="aaaa2222", label="nightly"),
        _write(db_engine, [fake_result(0)], kernel_commit="bbbb3333", label="nightly"),
    ]
    return db_engine, ids


@pytest.mark.parametrize(
    ("spec", "index"),
    [("latest", 2), ("base", 0), ("aaaa2", 1), ("bbbb3333", 2), ("aaaa1111", 0)],
)
def test_resolve_run_by_label_commit_prefix_and_latest(three_runs, spec, index):
    engine, ids = three_runs
    with Session(engine) as session:
        assert resolve_run(session, spec).id == ids[index]
        assert resolve_run(session, ids[index]).id == ids[index]
        assert resolve_run(session, str(ids[index])).id == ids[index]


@pytest.mark.parametrize(("spec", "listed"), [("nightly", (1, 2)), ("aaaa", (0, 1))])
def test_ambiguous_run_specs_list_the_candidates(three_runs, spec, listed):
    engine, ids = three_runs
    with Session(engine) as session, pytest.raises(UsageError, match="ambiguous") as err:
        resolve_run(session, spec)
    for index in listed:
        assert f"run {ids[index]}:" in str(err.value)


def test_unknown_run_specs_name_the_newest_runs(three_runs):
    engine, ids = three_runs
    with Session(engine) as session, pytest.raises(UsageError, match="matches no run") as err:
        resolve_run(session, "zzz")
    assert f"run {ids[2]}:" in str(err.value)
    with Session(engine) as session:
        assert [r.id for r in list_runs(session)] == ids[::-1]


def test_latest_in_an_empty_database_is_a_usage_error(db_engine):
    with Session(db_engine) as session, pytest.raises(UsageError, match="no runs yet"):
        resolve_run(session, "latest")


def test_done_case_ids_and_case_pairs(db_engine):
    base = _write(db_engine, [fake_result(i) for i in range(4)])
    head = _write(db_engine, [fake_result(i, "failed") for i in range(2, 6)])
    with Session(db_engine) as session:
        assert done_case_ids(session, base) == {fake_result(i).case.id for i in range(4)}
        pairs = case_pairs(session, base, head)
    by_id = {p.case_id: p for p in pairs}
    assert len(pairs) == 6
    for i in range(6):
        pair = by_id[fake_result(i).case.id]
        assert (pair.base is not None) == (i < 4) and (pair.head is not None) == (i >= 2)
        assert pair.head is None or pair.head.outcome == "failed"
    assert [p.case_id for p in pairs[:4]] == [fake_result(i).case.id for i in range(2, 6)]


def _expected_history(runs_data, dtype):
    """The numbers history() must return, computed here in Python from what was written: the
    outputs judged in ``dtype`` (core.verdict.judged_dtype: dw/db by the weight dtype)."""
    expected = {}
    for run_id, results in runs_data.items():
        by_output = {}
        for r in results:
            for m in r.outputs:
                if judged_dtype(m.output, r.case) == dtype:
                    by_output.setdefault(m.output, []).append((r.case.id, m))
        for output, items in by_output.items():
            rel = [math.inf if math.isnan(m.e_rel) else m.e_rel for _, m in items]
            norm = [m.e_norm for _, m in items]
            usage = [m.bound_usage for _, m in items if m.bound_usage is not None]
            expected[run_id, output] = {
                "cases": len(items),
                "passed": sum(m.passed for _, m in items),
                "worst_rel": max(rel),
                "median_rel": statistics.median(rel),
                "worst_norm": max(norm),
                "median_norm": statistics.median(norm),
                "worst_case_id": items[rel.index(max(rel))][0],
                "worst_usage": max(usage) if usage else None,
                "median_usage": statistics.median(usage) if usage else None,
            }
    return expected


def test_history_matches_numbers_computed_from_the_inserted_data(db_engine):
    rng = random.Random(7)
    runs_data = {}
    for run in range(3):  # odd and even group sizes, two dtypes, failures and one NaN
        results = []
        for i in range(9 + run):
            outcome = "failed" if rng.random() < 0.3 else "passed"
            dtype = "bfloat16" if i % 3 == 0 else "float32"
            results.append(fake_result(i, outcome, ("y", "dx", "dw"), rng, x_dtype=dtype))
        if run == 1:
            broken = results[1].outputs[0]
            results[1].outputs[0] = replace(broken, e_rel=math.nan, passed=False)
        run_id = _write(db_engine, results, kernel="torch" if run < 2 else "other")
        runs_data[run_id] = results
    with Session(db_engine) as session:
        points = history(session, "float32")
        only_torch = history(session, "float32", kernel="torch", output="dx")
    expected = _expected_history(runs_data, "float32")
    assert {(p.run_id, p.output) for p in points} == set(expected)
    assert [p.run_id for p in points] == sorted(p.run_id for p in points)  # oldest run first
    assert [p.output for p in points[:3]] == ["y", "dx", "dw"]  # in OUTPUTS order
    for p in points:
        want = expected[p.run_id, p.output]
        assert (p.stats.cases, p.stats.passed, p.stats.worst_case_id) == (
            want["cases"],
            want["passed"],
            want["worst_case_id"],
        )
        assert p.stats.pass_rate == want["passed"] / want["cases"]
        for key in ("worst_rel", "median_rel", "worst_norm", "median_norm"):
            # The database averages the two middle doubles just as statistics.median does;
            # 1e-12 relative only allows for a different summation order.
            assert getattr(p.stats, key) == pytest.approx(want[key], rel=1e-12), key
    assert any(math.isinf(p.stats.worst_rel) for p in points)  # the NaN counted as the worst
    torch_runs = [rid for rid in runs_data if rid != max(runs_data)]
    assert [(p.run_id, p.output) for p in only_torch] == [(r, "dx") for r in torch_runs]


def test_history_since_filters_by_start_time(db_engine):
    old = _write(db_engine, [fake_result(0)])
    new = _write(db_engine, [fake_result(0)])
    with Session(db_engine) as session, session.begin():
        started = session.get(Run, new).started_at
        session.execute(
            update(Run).where(Run.id == old).values(started_at=started - timedelta(days=30))
        )
    with Session(db_engine) as session:
        since = resolve_run(session, new).started_at - timedelta(days=1)
        assert {p.run_id for p in history(session, "float32", since=since)} == {new}
        assert {p.run_id for p in history(session, "float32")} == {old, new}
        assert history(session, "float16") == []
