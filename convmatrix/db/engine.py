"""Opening the results database: URL defaults, SQLite settings, migrations on first use.

SQLite is the default (``sqlite:///convmatrix.db`` or ``CONVMATRIX_DB``) and must take two runs
writing to one file at once: WAL mode lets readers run beside the writer, a busy timeout makes a
writer wait for the other's short batch instead of failing, and write transactions start with
``BEGIN IMMEDIATE`` so they take the lock before reading (a deferred transaction that read first
gets SQLITE_BUSY without waiting). PostgreSQL works through any SQLAlchemy URL; plain
``postgresql://`` means psycopg 3, the driver convmatrix depends on.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, exc, pool
from sqlalchemy.engine import URL, make_url

from convmatrix.core.errors import ConvmatrixError, InfrastructureError, UsageError
from convmatrix.core.sanitise import redact_argv

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    # What queries read through: a Core connection (the reading commands, which never import
    # the ORM: docs/benchmarks.md) or a Session (the writers and the served app).
    Reader = Connection | Session

__all__ = [
    "DEFAULT_URL",
    "absolute_url",
    "connection_error",
    "default_url",
    "make_engine",
    "redact_url",
    "sqlite_file",
    "write_connection",
    "write_session",
]

DEFAULT_URL = "sqlite:///convmatrix.db"
ENV_VAR = "CONVMATRIX_DB"
BUSY_TIMEOUT_MS = 60_000
# scheme://user:PASSWORD@host: the password runs to the last "@" before the host's path, as
# a URL parser reads it (spaces, "%40" or a raw "@" included: all of it is the secret).
_WRITE = "convmatrix_write"  # execution option: this transaction will write


def default_url() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def redact_url(url: str | URL) -> str:
    """The URL with its password (and any password query parameter) replaced by ``***``."""
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError):
        return redact_argv([str(url)])[0]
    secret = {k: "***" for k in parsed.query if "password" in k.lower()}
    shown = parsed.update_query_dict(secret).render_as_string(hide_password=True)
    shown = shown.replace("%2A%2A%2A", "***")  # the query part comes back URL-quoted
    return redact_argv([shown])[0]  # and what a parser took for the host ("p@ss@h")


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError) as err:
        raise UsageError(
            f"--db / {ENV_VAR}: {redact_url(url)!r} is not a database URL "
            "(e.g. sqlite:///convmatrix.db or postgresql://user@host/dbname)"
        ) from err
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def absolute_url(url: str) -> str:
    """A SQLite URL with an absolute path (other URLs as they are): for a process started in
    another directory (a bisect step, a rerun in a worktree) to write the same file."""
    parsed = _parse(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return url
    return parsed.set(database=str(Path(path).expanduser().resolve())).render_as_string(
        hide_password=False
    )


def sqlite_file(url: str | None = None) -> Path | None:
    """The file a SQLite URL names (None: another backend, or an in-memory database)."""
    parsed = _parse(url or default_url())
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):  # a URI (?uri=true): file:path?mode=ro
        return Path(parsed.database[5:].split("?")[0]).expanduser()
    return Path(parsed.database).expanduser()


def _check_sqlite_file(path: Path, shown: str) -> None:
    """Refuse, without changing it, a file that is not a convmatrix database: not SQLite at
    all, or tables of something else and no ``alembic_version`` (its journal mode included:
    a refused file must not be switched to WAL)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as err:
        raise UsageError(f"--db / {ENV_VAR}: {shown} is not a usable SQLite file: {err}") from err
    ours = {"alembic_version", "runs"}
    if tables and not ours <= tables:
        some = ", ".join(sorted(tables)[:5])
        raise UsageError(
            f"--db / {ENV_VAR}: {shown} is not a convmatrix database (it holds {some}); "
            "give a new file or one convmatrix created"
        )


def make_engine(url: str | None = None) -> Engine:
    """An engine for ``url`` (default: ``CONVMATRIX_DB``, else ``sqlite:///convmatrix.db``)."""
    parsed = _parse(url or default_url())
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        memory = parsed.database in (None, "", ":memory:")
        if memory:
            kwargs["poolclass"] = pool.StaticPool  # one connection, or each sees its own db
        elif parsed.database:
            path = sqlite_file(str(url or default_url()))
            assert path is not None
            _check_sqlite_file(path, redact_url(parsed))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise UsageError(
                    f"--db / {ENV_VAR}: cannot create the directory of {redact_url(parsed)}: "
                    f"{err.strerror}"
                ) from err
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (exc.NoSuchModuleError, ImportError) as err:
        raise UsageError(f"--db / {ENV_VAR}: cannot use {redact_url(parsed)!r}: {err}") from err
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine, wal=not memory)
    return engine


def _configure_sqlite(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves (see below)
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if wal:
            _switch_to_wal(cursor)
            cursor.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; WAL-safe
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _switch_to_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode = WAL``, retried while the file is locked, up to the busy timeout.

    The busy handler does not cover this switch: on a database still in rollback mode (a new
    file stays so until its first write) whose write lock another connection holds, SQLite
    answers "database is locked" at once. Two runs opening one new file hit exactly that when
    the first is creating the schema as the second connects (tests/test_db_concurrency.py).
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.25)


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A session inside one write transaction: committed on exit, rolled back on error.

    On SQLite the transaction takes the write lock up front (waiting up to the busy timeout).
    """
    from sqlalchemy.orm import Session  # writers only: reading commands never import the ORM

    with Session(engine.execution_options(**{_WRITE: True})) as session, session.begin():
        yield session


@contextmanager
def write_connection(engine: Engine, *, foreign_keys: bool = False) -> Iterator[Connection]:
    """A connection inside one write transaction, for migrations; commits on exit.

    On SQLite foreign keys are off for this transaction unless ``foreign_keys`` (switched
    before it begins: the PRAGMA is ignored inside one): a migration that copies a table and
    drops the original must not cascade the drop to the rows that refer to it."""
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite and not foreign_keys:
            conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = OFF")
        try:
            conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn
        finally:
            if sqlite and not foreign_keys:
                conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = ON")


def connection_error(engine: Engine, err: Exception) -> ConvmatrixError:
    """A one-line error naming the database (without its password) for a failed connection:
    infrastructure (exit 3), as a server that went away under a run is, not a failing case."""
    reason = str(getattr(err, "orig", err)).strip().splitlines()[0]
    return InfrastructureError(f"cannot use database {redact_url(engine.url)}: {reason}")
