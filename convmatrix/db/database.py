"""A results database opened once: its engine, the URL it was opened by, and connections and
sessions on it.

Every command, the run pipeline and the served pages open the database here, and through one
``Database`` for as long as they work (a run scans, confirms and reports on the engine that
recorded it). Reading never creates a database: a mistyped SQLite path is an error naming the
file (``existing=True``), not a fresh empty database that then "holds no runs".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine

from convmatrix.core.errors import UsageError
from convmatrix.db.engine import ENV_VAR, default_url, make_engine, redact_url, sqlite_file
from convmatrix.db.engine import write_session as _write_session
from convmatrix.db.migrate import SCHEMA_HEAD, current_revision, ensure_schema

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["Database", "require_existing"]


def require_existing(url: str | None, what: str = "--db") -> str:
    """``url`` (or the default), after checking that a SQLite file it names exists."""
    url = url or default_url()
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise UsageError(
            f"{what}: database file {path} does not exist (give --db URL or set {ENV_VAR})"
        )
    return url


class Database:
    """``with Database(url) as database:`` then ``database.reading()`` / ``writing()``.

    The engine opens on first use, so a run refused before it starts (a bad matrix, kernel or
    option) touches no database. ``existing``: refuse a SQLite file that is not there.
    ``upgrade=False``: never migrate (``serve``); a database behind the newest schema is refused.
    """

    def __init__(
        self, url: str | None = None, *, existing: bool = False, upgrade: bool = True
    ) -> None:
        self.url = url or default_url()
        self.existing = existing
        self.upgrade = upgrade
        self._engine: Engine | None = None

    @classmethod
    def open(
        cls, url: str | None = None, *, existing: bool = False, upgrade: bool = True
    ) -> Database:
        """A database opened now (its errors raised here, not at first use)."""
        database = cls(url, existing=existing, upgrade=upgrade)
        database.engine  # noqa: B018 - open it
        return database

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            if self.existing:
                require_existing(self.url)
            engine = make_engine(self.url)
            try:
                if self.upgrade:
                    ensure_schema(engine)
                elif (revision := current_revision(engine)) != SCHEMA_HEAD:
                    raise UsageError(
                        f"--db {redact_url(self.url)} is at schema revision {revision or 'none'},"
                        f" not {SCHEMA_HEAD}: run `convmatrix db upgrade --db URL` first"
                    )
            except BaseException:
                engine.dispose()
                raise
            self._engine = engine
        return self._engine

    @property
    def shown(self) -> str:
        """The URL for people: its password redacted."""
        return redact_url(self.url)

    def reading(self) -> Connection:
        """A Core connection for reading (use it as a context manager): what the queries of
        ``db.queries`` and the reports take. It never imports the ORM, whose import and
        mapping were a fifth of a reading command's start-up (docs/benchmarks.md)."""
        return self.engine.connect()

    def session(self) -> Session:
        """An ORM session, for code that reads or changes mapped rows (regressions, alerts);
        use it as a context manager."""
        from sqlalchemy.orm import Session

        return Session(self.engine)

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A session in one write transaction, committed on exit (SQLite: the write lock
        taken up front)."""
        with _write_session(self.engine) as session:
            yield session

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
