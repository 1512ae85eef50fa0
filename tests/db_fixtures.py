"""Database fixtures (registered from conftest.py) and builders of fake results.

``db_url`` runs a test twice: against a fresh SQLite file and against a fresh database on the
real PostgreSQL server at ``CONVMATRIX_TEST_PG_URL`` (when that is unset: skipped with the
reason locally, failed under CI; tests/components.py). Each test session (each xdist worker)
creates its own database and drops it at the end; each test gets a fresh schema in it, so no
two tests ever share tables.
"""

from __future__ import annotations

import math
import os
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from components import PG_ENV, require
from sqlalchemy import Engine, create_engine, pool
from sqlalchemy.engine import make_url

from convmatrix.core.case import Case
from convmatrix.core.records import CaseResult, OutputMetrics, PropertyResult, RunMeta, TimingResult
from convmatrix.db import open_database


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


@contextmanager
def fresh_postgres_database(server: str) -> Iterator[str]:
    """A new, uniquely named database on ``server`` (any URL on it), dropped on exit."""
    url = make_url(server)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    name = f"convmatrix_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(
        url.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=pool.NullPool
    )
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="session")
def _postgres_session_database() -> Iterator[str]:
    """One database per test session (per xdist worker); tests get schemas inside it."""
    require("postgresql")
    with fresh_postgres_database(os.environ[PG_ENV]) as url:
        yield url


@pytest.fixture
def postgres_url(_postgres_session_database) -> Iterator[str]:
    """A fresh, empty schema that connections through this URL use (``search_path``).

    ``CREATE SCHEMA`` takes milliseconds where ``CREATE DATABASE`` takes up to a second on a
    loaded machine; each test still sees nothing of any other.
    """
    schema = f"t_{uuid.uuid4().hex[:12]}"
    url = make_url(_postgres_session_database)
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        scoped = url.update_query_dict({"options": f"-csearch_path={schema}"})
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request) -> str:
    """A fresh, empty database: a SQLite file, then a PostgreSQL database."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def db_engine(db_url) -> Iterator[Engine]:
    """An engine on a fresh database with the schema migrated."""
    engine = open_database(db_url)
    yield engine
    engine.dispose()


# -- fake results ----------------------------------------------------------------------------
def fake_case(i: int, **overrides) -> Case:
    """A distinct, valid forward case per ``i`` (its dims vary so ids differ)."""
    params = dict(suite="fake", op="fwd", width=2 + i % 3, dim=8 + i, batch=1 + i % 2, seqlen=16)
    params.update(overrides)
    return Case(**params)


def fake_meta(**overrides) -> RunMeta:
    params = dict(kernel="torch", matrix="smoke", matrix_hash="0" * 64, argv=["convmatrix"])
    params.update(overrides)
    return RunMeta(**params)


def fake_result(
    i: int,
    outcome: str = "passed",
    outputs: tuple[str, ...] = ("y", "dx"),
    rng: random.Random | None = None,
    **case_overrides,
) -> CaseResult:
    """A result with random (seeded) errors for ``outputs``, one property and one timing."""
    rng = rng or random.Random(i)
    metrics = []
    for name in outputs:
        metrics.append(
            OutputMetrics(
                output=name,
                e_abs=rng.uniform(0, 1e-5),
                e_rel=10 ** rng.uniform(-8, -3),
                e_norm=10 ** rng.uniform(-9, -4),
                tau=1e-3,
                scale=rng.uniform(0.5, 2.0),
                worst_index=[0, i % 5, rng.randrange(16)],
                fw_abs=rng.uniform(0, 1e-5),
                fw_rel=10 ** rng.uniform(-8, -3),
                fw_norm=None if i % 4 == 0 else 10 ** rng.uniform(-9, -4),
                limit_rel=1.9e-6,
                limit_norm=4.8e-7,
                passed=outcome == "passed",
            )
        )
    return CaseResult(
        case=fake_case(i, **case_overrides),
        outcome=outcome,
        duration_s=rng.uniform(0.001, 0.5),
        message=None if outcome == "passed" else f"{outcome}: detail {i}",
        outputs=metrics,
        properties=[PropertyResult("causality", outcome == "passed", f"checked {i}")],
        timings=[
            TimingResult(
                scope="kernel",
                median_s=1e-4,
                min_s=9e-5,
                iqr_s=1e-5,
                n=3,
                cold_s=2e-3,
                samples=[1e-4, 9e-5, 1.1e-4],
                flops=1e6,
                bytes_moved=4e6,
                floor_s=5e-5,
                efficiency=0.5,
            )
        ],
        worker=f"gw{i % 2}",
    )


def same_float(a: float | None, b: float | None) -> bool:
    """Equal, or both NaN: stored doubles must come back bit-identical."""
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))
