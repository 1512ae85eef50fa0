"""Schema migrations: Alembic scripts shipped in the package, applied on first use.

No ``alembic.ini`` is needed: the Alembic config is built here, pointing at
``convmatrix/db/migrations``, and handed the connection to migrate. The upgrade runs in one write
transaction that first takes a lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock),
so two runs that open a fresh database at the same moment create the schema once. Reaching the
newest revision, the same transaction also summarises the runs that stopped writing before
history summaries existed (``summaries.aggregate_pending``), with the code of that revision.

A database already at ``SCHEMA_HEAD`` is recognised by reading its ``alembic_version`` row:
Alembic itself (0.4 s of imports) is loaded only to upgrade, so ``convmatrix history`` starts
fast. A new migration moves ``SCHEMA_HEAD``; ``tests/test_db_schema.py`` checks the two agree.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, exc, inspect, text

from convmatrix.core.errors import ConvmatrixError
from convmatrix.db.aggregates import aggregate_pending
from convmatrix.db.engine import connection_error, make_engine, redact_url, write_connection

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "SCHEMA_HEAD",
    "current_revision",
    "ensure_schema",
    "head_revision",
    "open_database",
    "upgrade",
]

SCHEMA_HEAD = "0015"  # the newest revision under migrations/versions
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_ADVISORY_LOCK = 0x636F6E766D6174  # "convmat": any constant shared by every convmatrix process
_ready: weakref.WeakSet[Engine] = weakref.WeakSet()


def alembic_config(connection: Connection | None = None) -> Config:
    """The Alembic config for the shipped migrations (``connection``: the one to migrate)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision of the shipped migration scripts (read by Alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "convmatrix ships no migrations"
    return head


def _revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def current_revision(engine: Engine) -> str | None:
    """The database's revision; ``None`` for an empty database."""
    try:
        with engine.connect() as conn:
            return _revision(conn)
    except exc.DBAPIError as err:
        raise connection_error(engine, err) from err


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` under a database-wide lock."""
    from alembic import command

    try:
        with write_connection(engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK})")
            command.upgrade(alembic_config(conn), revision)
            if conn.dialect.name == "sqlite":
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise ConvmatrixError(f"migration left dangling references: {broken[:3]}")
            if _revision(conn) == SCHEMA_HEAD:
                aggregate_pending(conn)
    except exc.DBAPIError as err:
        raise connection_error(engine, err) from err
    _ready.discard(engine)


def ensure_schema(engine: Engine) -> None:
    """Bring the database to the newest schema once per engine; cheap after the first call."""
    if engine in _ready:
        return
    current = current_revision(engine)
    if current != SCHEMA_HEAD:
        from alembic.script import ScriptDirectory

        known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
        if current is not None and current not in known:
            raise ConvmatrixError(
                f"database {redact_url(engine.url)} is at schema revision {current}, which this "
                "convmatrix does not know (written by a newer version?): upgrade convmatrix"
            )
        upgrade(engine)
    _ready.add(engine)


def open_database(url: str | None = None) -> Engine:
    """``make_engine`` plus ``ensure_schema``: what commands use to read or write results."""
    engine = make_engine(url)
    ensure_schema(engine)
    return engine
