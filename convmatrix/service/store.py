"""Opening the database for the service's commands: read for pages, write for the lifecycle."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

from convmatrix.db.engine import write_session
from convmatrix.reports.source import open_for_reading

__all__ = ["reading", "writing"]


@contextmanager
def reading(db: str | None) -> Iterator[tuple[Session, str]]:
    """A session on ``db`` (the default database when None) and the URL used."""
    engine, url = open_for_reading(db)
    try:
        with Session(engine) as session:
            yield session, url
    finally:
        engine.dispose()


@contextmanager
def writing(db: str | None) -> Iterator[tuple[Session, str]]:
    """A session in one write transaction on ``db``, committed on exit."""
    engine, url = open_for_reading(db)
    try:
        with write_session(engine) as session:
            yield session, url
    finally:
        engine.dispose()
