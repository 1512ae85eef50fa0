"""History summaries: stored when a run stops, equal to the live computation, live while a run
writes, refreshed on resume, and filled for runs stored before they existed (migration 0002).

Every check runs on a SQLite file and on PostgreSQL. Numbers are compared two ways: stored
against live (the same SELECT, so bit-identical doubles: exact equality), and against values
computed here in Python from the records written (``_expected_history``, 1e-12 relative).
"""

from __future__ import annotations

import math
import random
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
from alembic import command
from db_fixtures import fake_meta, fake_result
from sqlalchemy import event, func, inspect, select, update
from test_db_queries import _expected_history, _write

from convmatrix.core.records import OUTCOMES
from convmatrix.db import (
    ResultWriter,
    Session,
    aggregate_pending,
    case_counts,
    current_revision,
    history,
    make_engine,
    open_database,
)
from convmatrix.db.engine import write_connection
from convmatrix.db.migrate import alembic_config
from convmatrix.db.models import CaseRow, MetricRow, Run, RunAggregateRow

DTYPES = ("float32", "bfloat16", "float16")


def _results(seed: int, n: int) -> list:
    """``n`` results over three dtypes with failures, a crash without outputs, a NaN, an inf
    e_norm and a tie for the worst e_rel (the first case written must be named); bound usage
    on most outputs (none on every fifth, as rows written before 0003; an infinite one, as a
    non-finite output records)."""
    rng = random.Random(seed)
    results = []
    for i in range(n):
        outcome = "failed" if rng.random() < 0.3 else "passed"
        dtype = DTYPES[i % 3]
        result = fake_result(i, outcome, ("y", "dx", "dw"), rng, x_dtype=dtype)
        result.outputs = [
            replace(m, bound_usage=None if (i + k) % 5 == 0 else 10 ** rng.uniform(-3, 0.5))
            for k, m in enumerate(result.outputs)
        ]
        results.append(result)
    results[2].outputs[1] = replace(results[2].outputs[1], bound_usage=math.inf, passed=False)
    results[1].outputs[0] = replace(results[1].outputs[0], e_rel=math.nan, passed=False)
    results[4].outputs[1] = replace(results[4].outputs[1], e_norm=math.inf, passed=False)
    for i in (6, 9):  # both float32: equal worst e_rel of output y
        results[i].outputs[0] = replace(results[i].outputs[0], e_rel=0.5, passed=False)
    results.append(fake_result(n, "crashed", outputs=(), x_dtype="bfloat16"))
    return results


def _expected_counts(runs_data, dtype):
    return {
        run_id: {o: Counter(r.outcome for r in mine)[o] for o in OUTCOMES}
        for run_id, results in runs_data.items()
        if (mine := [r for r in results if r.case.x_dtype == dtype])
    }


def _check_against_records(session, runs_data) -> None:
    """history() and case_counts() against numbers computed here from what was written."""
    for dtype in DTYPES:
        expected = _expected_history(runs_data, dtype)
        points = history(session, dtype)
        assert {(p.run_id, p.output) for p in points} == set(expected)
        assert len(points) == len(expected)  # no run both stored and live
        for p in points:
            want = expected[p.run_id, p.output]
            assert (p.stats.cases, p.stats.passed, p.stats.worst_case_id) == (
                want["cases"],
                want["passed"],
                want["worst_case_id"],
            )
            keys = ("worst_rel", "median_rel", "worst_norm", "median_norm", "worst_usage",
                    "median_usage")  # fmt: skip
            for key in keys:
                # Medians average two doubles in SQL as statistics.median does; 1e-12
                # relative only allows for a different summation order.
                if want[key] is None:  # no row of the group recorded a usage
                    assert getattr(p.stats, key) is None, key
                else:
                    assert getattr(p.stats, key) == pytest.approx(want[key], rel=1e-12), key
        assert case_counts(session, dtype, list(runs_data)) == _expected_counts(runs_data, dtype)


def _snapshot(session) -> tuple:
    """Everything history shows, over every dtype and the filters that change the SQL."""
    run_ids = list(session.scalars(select(Run.id)))
    return tuple(
        (
            history(session, d),
            history(session, d, output="dx"),
            history(session, d, kernel="x"),
            case_counts(session, d, run_ids),
        )
        for d in DTYPES
    )


def test_stored_summaries_equal_the_live_computation(db_engine):
    runs_data = {}
    for k in range(3):
        results = _results(k, 15 + k)  # odd and even group sizes
        runs_data[_write(db_engine, results, kernel="x" if k else "y")] = results
    with Session(db_engine) as session:
        assert None not in session.scalars(select(Run.summarised_at)).all()
        assert session.scalar(select(func.count()).select_from(RunAggregateRow)) == sum(
            len(_expected_history(runs_data, d)) for d in DTYPES
        )
        stored = _snapshot(session)
        _check_against_records(session, runs_data)
    with Session(db_engine) as session, session.begin():  # forget the summaries
        session.execute(update(Run).values(summarised_at=None))
    with Session(db_engine) as session:
        live = _snapshot(session)
        _check_against_records(session, runs_data)
    assert live == stored  # the same SELECT: exactly the same doubles
    with Session(db_engine) as session, session.begin():
        assert sorted(aggregate_pending(session)) == sorted(runs_data)
    with Session(db_engine) as session:
        assert _snapshot(session) == stored


def test_history_of_summarised_runs_reads_no_metric_row(db_engine):
    """The point of the summaries: with no run writing, history never touches ``metrics``."""
    run_ids = [_write(db_engine, _results(k, 12)) for k in range(2)]
    statements: list[str] = []
    event.listen(db_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with Session(db_engine) as session:
        points = history(session, "float32")
        case_counts(session, "float32", run_ids)
    assert {p.run_id for p in points} == set(run_ids)
    read = [t for s in statements for t in re.findall(r"(?:FROM|JOIN) (\w+)", s)]
    assert set(read) == {"runs", "run_summaries", "run_counts"}


def test_a_running_run_appears_with_live_numbers(db_engine):
    runs_data = {}
    done = _results(1, 12)
    runs_data[_write(db_engine, done)] = done
    writer = ResultWriter(db_engine, batch_size=1000)
    running = writer.start_run(fake_meta(label="running"))
    first = _results(2, 10)
    for result in first:
        writer.add(result)
    writer.flush()
    runs_data[running] = first
    with Session(db_engine) as session:
        assert session.get(Run, running).summarised_at is None
        _check_against_records(session, runs_data)
    # More results, one replacing a stored case with a new worst error: still live, up to date.
    worse = _results(2, 10)[3]
    worse.outputs[0] = replace(worse.outputs[0], e_rel=7.0, passed=False)
    more = _results(3, 14)[11:]  # new case ids
    for result in [worse, *more]:
        writer.add(result)
    writer.finish_run()
    runs_data[running] = [worse if r.case.id == worse.case.id else r for r in first] + more
    with Session(db_engine) as session:
        assert session.get(Run, running).summarised_at is not None
        _check_against_records(session, runs_data)
    # Resumed and written again: the stale summary is ignored, the finish stores a new one.
    again = ResultWriter(db_engine)
    again.resume_run(running)
    extra = fake_result(50, "failed", ("y",), random.Random(5))
    again.add(extra)
    again.flush()
    runs_data[running] = [*runs_data[running], extra]
    with Session(db_engine) as session:
        assert session.get(Run, running).summarised_at is None
        _check_against_records(session, runs_data)
        live = _snapshot(session)
    again.finish_run(status="interrupted")
    with Session(db_engine) as session:
        assert session.get(Run, running).summarised_at is not None
        assert _snapshot(session) == live


def test_interrupted_and_reaped_runs_are_summarised(db_engine):
    with pytest.raises(KeyboardInterrupt), ResultWriter(db_engine) as writer:
        interrupted = writer.start_run(fake_meta())
        writer.add(fake_result(0))
        raise KeyboardInterrupt
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    orphan_writer = ResultWriter(db_engine)
    orphan = orphan_writer.start_run(fake_meta(label="orphan"))
    orphan_writer.add(fake_result(1))
    orphan_writer.flush()
    with Session(db_engine) as session, session.begin():
        session.get(Run, orphan).pid = int(dead.stdout)  # as if SIGKILLed mid-run
    ResultWriter(db_engine).start_run(fake_meta(label="next"))  # reaps the orphan
    with Session(db_engine) as session:
        for run_id, status in ((interrupted, "interrupted"), (orphan, "abandoned")):
            run = session.get(Run, run_id)
            assert run.status == status and run.summarised_at is not None
        stored = session.scalars(select(RunAggregateRow.run_id)).all()
    assert sorted(set(stored)) == sorted((interrupted, orphan))


def _before_0003(seed: int, n: int) -> list:
    """``_results`` as written before bound usage existed (the downgrade drops it)."""
    results = _results(seed, n)
    for r in results:
        r.outputs = [replace(m, bound_usage=None) for m in r.outputs]
    return results


def test_upgrade_from_0001_summarises_the_runs_stored_before(db_url):
    engine = open_database(db_url)
    runs_data = {}
    for k, meta in enumerate(({}, {"kernel": "x"})):
        results = _before_0003(10 + k, 13)
        runs_data[_write(engine, results, **meta)] = results
    writer = ResultWriter(engine)  # a run still writing (this process: not reaped)
    running = writer.start_run(fake_meta(label="running"))
    for result in _before_0003(20, 12):
        writer.add(result)
    writer.flush()
    runs_data[running] = _before_0003(20, 12)
    with Session(engine) as session:
        before = _snapshot(session)
        n_cases = session.scalar(select(func.count()).select_from(CaseRow))
    with write_connection(engine) as conn:
        command.downgrade(alembic_config(conn), "0001")
    engine.dispose()

    old = make_engine(db_url)  # no upgrade on opening
    assert current_revision(old) == "0001"
    assert "summarised_at" not in {c["name"] for c in inspect(old).get_columns("runs")}
    assert "run_summaries" not in inspect(old).get_table_names()
    with old.connect() as conn:  # the downgrade kept every case (no cascade from runs)
        assert conn.scalar(select(func.count()).select_from(CaseRow)) == n_cases
    old.dispose()

    engine = open_database(db_url)  # upgrades to 0002 and summarises the stopped runs
    with Session(engine) as session:
        stamped = dict(session.execute(select(Run.id, Run.summarised_at)).all())
        assert {rid for rid, at in stamped.items() if at is not None} == set(runs_data) - {running}
        assert _snapshot(session) == before
        _check_against_records(session, runs_data)
        assert session.get(Run, running).status == "running"  # still live, left alone
    engine.dispose()


def test_upgrade_to_0008_adds_median_usage_and_broken_zeros_and_resummarises(db_url):
    """0008 on a database of 0007: the summaries are recomputed with the median usage of the
    rows written before, and those rows' ``broken_zeros`` stay NULL (never counted)."""
    engine = open_database(db_url)
    results = _results(30, 14)
    run_id = _write(engine, results)
    with write_connection(engine) as conn:
        command.downgrade(alembic_config(conn), "0007")
    engine.dispose()

    old = make_engine(db_url)
    assert current_revision(old) == "0007"
    assert "broken_zeros" not in {c["name"] for c in inspect(old).get_columns("metrics")}
    assert "median_usage" not in {c["name"] for c in inspect(old).get_columns("run_summaries")}
    old.dispose()

    engine = open_database(db_url)
    with Session(engine) as session:
        assert session.get(Run, run_id).summarised_at is not None  # summarised again
        assert set(session.scalars(select(MetricRow.broken_zeros))) == {None}
        _check_against_records(session, {run_id: results})
        medians = session.scalars(select(RunAggregateRow.median_usage)).all()
        assert medians and None not in medians
    engine.dispose()


def test_broken_zeros_are_stored_and_read_back(db_engine):
    from convmatrix.db.queries import load_results

    result = fake_result(0, "failed", ("y", "dx"))
    result.outputs = [
        replace(result.outputs[0], bound_usage=0.5, broken_zeros=3, passed=False),
        replace(result.outputs[1], bound_usage=0.25, broken_zeros=0),
    ]
    run_id = _write(db_engine, [result])
    with Session(db_engine) as session:
        (back,) = load_results(session, run_id)
    assert [(m.output, m.broken_zeros) for m in back.outputs] == [("y", 3), ("dx", 0)]
    assert isinstance(back.outputs[0].broken_zeros, int)
