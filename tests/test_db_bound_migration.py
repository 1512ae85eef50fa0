"""Migration 0003 on real SQLite and PostgreSQL: bound usage columns, dw/db rows moved to the
weight dtype (the dtype they are judged in) and summaries recomputed with the worst usage."""

from __future__ import annotations

from dataclasses import replace

import pytest
from alembic import command
from db_fixtures import fake_result
from sqlalchemy import inspect, select
from sqlalchemy.orm import Session
from test_db_queries import _write

from convmatrix.db import current_revision, make_engine, open_database
from convmatrix.db.engine import write_connection
from convmatrix.db.migrate import alembic_config
from convmatrix.db.models import MetricRow, RunAggregateRow


def _results():
    out = []
    for i in range(6):
        r = fake_result(i, "passed", ("y", "dw"), x_dtype="bfloat16", w_dtype="float32")
        r.outputs = [replace(m, bound_usage=0.1 * (i + 1)) for m in r.outputs]
        out.append(r)
    return out


def test_upgrade_to_0003_moves_dw_to_the_weight_dtype_and_resummarises(db_url):
    engine = open_database(db_url)
    run_id = _write(engine, _results())
    with write_connection(engine) as conn:
        command.downgrade(alembic_config(conn), "0002")
    engine.dispose()

    old = make_engine(db_url)
    assert current_revision(old) == "0002"
    assert "bound_usage" not in {c["name"] for c in inspect(old).get_columns("metrics")}
    with old.connect() as conn:  # before 0003, dw rows carried the x dtype
        rows = conn.execute(select(MetricRow.output, MetricRow.x_dtype)).all()
        assert {dt for out, dt in rows if out == "dw"} == {"bfloat16"}
    old.dispose()

    engine = open_database(db_url)  # upgrades to 0003 and summarises again
    with Session(engine) as session:
        rows = session.execute(select(MetricRow.output, MetricRow.x_dtype)).all()
        assert {dt for out, dt in rows if out == "dw"} == {"float32"}
        assert {dt for out, dt in rows if out == "y"} == {"bfloat16"}
        summaries = {
            (s.x_dtype, s.output): s
            for s in session.scalars(
                select(RunAggregateRow).where(RunAggregateRow.run_id == run_id)
            )
        }
        assert set(summaries) == {("bfloat16", "y"), ("float32", "dw")}
        # usage was dropped with the columns by the downgrade: NULL for rows written before
        assert summaries["float32", "dw"].worst_usage is None
    engine.dispose()


def test_bound_usage_is_stored_and_summarised(db_url):
    engine = open_database(db_url)
    run_id = _write(engine, _results())
    with Session(engine) as session:
        usage = session.scalars(select(MetricRow.bound_usage)).all()
        want = sorted(0.1 * (i + 1) for i in range(6) for _ in "yw")
        assert sorted(usage) == pytest.approx(want, rel=1e-12)
        worst = session.scalars(
            select(RunAggregateRow.worst_usage).where(RunAggregateRow.run_id == run_id)
        ).all()
        assert worst == pytest.approx([0.6, 0.6], rel=1e-12)  # y and dw: the largest usage
    engine.dispose()
