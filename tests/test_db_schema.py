"""Migrations, engines and URLs: the schema on SQLite and PostgreSQL, for real."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from convmatrix.cli import main
from convmatrix.core.errors import ConvmatrixError, UsageError
from convmatrix.db import (
    current_revision,
    ensure_schema,
    head_revision,
    make_engine,
    open_database,
    redact_url,
)
from convmatrix.db.models import Base

TABLES = {"runs", "cases", "metrics", "properties", "timings", "alembic_version"}
TABLES |= {"run_summaries", "run_counts"}  # 0002: history summaries per run
TABLES |= {"run_shards"}  # 0005: the shards of a run written by several CI jobs
TABLES |= {"regressions", "regression_events"}  # 0006: the regression lifecycle
TABLES |= {"alerts"}  # 0008: the regressions one run found, grouped
TABLES |= {"run_pages"}  # 0011: stored pages of finished runs


def test_first_use_creates_the_schema_the_models_describe(db_url):
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    ensure_schema(engine)
    assert current_revision(engine) == head_revision()
    inspector = inspect(engine)
    assert set(inspector.get_table_names()) == TABLES
    indexes = {ix["name"] for ix in inspector.get_indexes("metrics")}
    assert "ix_metrics_x_dtype_output_run_id" in indexes  # history of dtype X
    uniques = {uq["name"] for uq in inspector.get_unique_constraints("cases")}
    assert "uq_cases_run_id_case_id" in uniques  # diff by case id
    # The migration and the models agree column by column, type by type.
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_ensure_schema_is_idempotent_across_engines(db_url):
    for _ in range(2):
        engine = open_database(db_url)
        assert current_revision(engine) == head_revision()
        engine.dispose()


def test_a_database_from_a_newer_convmatrix_is_refused(db_url):
    engine = open_database(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    engine.dispose()
    with pytest.raises(ConvmatrixError, match="revision ffff, which this convmatrix does not"):
        open_database(db_url)


def test_db_commands_upgrade_and_report_the_revision(db_url, capsys):
    assert main(["db", "current", "--db", db_url]) == 0
    assert "none (empty)" in capsys.readouterr().out
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert f"upgraded from empty to {head_revision()}" in capsys.readouterr().out
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert "already at revision" in capsys.readouterr().out
    assert main(["db", "current", "--db", db_url]) == 0
    assert f"revision {head_revision()} (newest)" in capsys.readouterr().out


def test_default_url_comes_from_the_environment(monkeypatch, sqlite_url):
    monkeypatch.setenv("CONVMATRIX_DB", sqlite_url)
    engine = make_engine(None)
    assert str(engine.url) == sqlite_url
    engine.dispose()
    monkeypatch.delenv("CONVMATRIX_DB")
    assert str(make_engine(None).url) == "sqlite:///convmatrix.db"  # no connection is made


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(sqlite_url):
    engine = open_database(sqlite_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_sqlite_parent_directories_are_created(tmp_path):
    engine = open_database(f"sqlite:///{tmp_path / 'a' / 'b' / 'results.db'}")
    assert (tmp_path / "a" / "b" / "results.db").exists()
    engine.dispose()


def test_plain_postgresql_urls_mean_psycopg3():
    engine = make_engine("postgresql://u@localhost/db")
    assert engine.url.drivername == "postgresql+psycopg"
    engine.dispose()


@pytest.mark.parametrize("url", ["not a url", "nosuchdialect://x/y", "postgresql://h:port/d"])
def test_bad_urls_are_usage_errors_naming_the_option(url):
    with pytest.raises(UsageError, match="--db / CONVMATRIX_DB"):
        make_engine(url)


def test_unreachable_server_is_one_line_without_the_password(capsys):
    url = "postgresql://alice:s3cret@127.0.0.1:1/results"
    assert main(["db", "current", "--db", url]) == 3  # infrastructure (core.errors.EXIT_CODES)
    err = capsys.readouterr().err
    assert "s3cret" not in err
    assert "alice:***@127.0.0.1:1/results" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://bob:pw@db:5432/r", "postgresql+psycopg://bob:***@db:5432/r"),
        ("postgresql://bob@db/r?password=pw", "postgresql://bob@db/r?password=***"),
        ("sqlite:///results.db", "sqlite:///results.db"),
        ("no scheme:pw@host", "no scheme:pw@host"),  # not a URL: nothing recognisable to hide
        ("weird://u:p@h:x/y", "weird://u:***@h:x/y"),  # unparsable port: hidden by pattern
    ],
)
def test_redact_url_hides_passwords(url, shown):
    assert redact_url(url) == shown
