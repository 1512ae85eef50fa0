"""Opening the database for the service's commands: read for pages, write for the lifecycle."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy.orm import Session

from convmatrix.db.engine import write_session
from convmatrix.reports.source import open_for_reading

__all__ = ["reading", "writing"]


@contextmanager
def _session(db: str | None, write: bool) -> Iterator[tuple[Session, str]]:
    engine, url = open_for_reading(db)
    try:
        if write:
            with write_session(engine) as session:
                yield session, url
        else:
            with Session(engine) as session:
                yield session, url
    finally:
        engine.dispose()


def reading(db: str | None) -> AbstractContextManager[tuple[Session, str]]:
    """A session on ``db`` (the default database when None) and the URL used."""
    return _session(db, write=False)


def writing(db: str | None) -> AbstractContextManager[tuple[Session, str]]:
    """A session in one write transaction on ``db``, committed on exit."""
    return _session(db, write=True)
