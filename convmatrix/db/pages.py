"""Pages of finished runs, stored once and read back: the ``run_pages`` table.

A run that finished never changes, so its report and served pages are built once (seconds for
10,000 cases) and kept here, compressed. Each page carries a stamp: a hash of the run's state
(``run_state``: its row, with status, counts, and when its results were last summarised,
and its shards) and of
whatever else the caller says the page shows (the code's version, the database URL, the
regressions linked from it). A page is read only under the stamp it was stored with, so a run
that is resumed, gains a journal's results, or whose linked regressions are triaged is built
afresh, never served stale; a run still being written (``run_state`` None) is never stored.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from convmatrix.db.engine import write_connection
from convmatrix.db.tables import run_pages, run_shards, runs

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = ["keep_page", "page_stamp", "read_page", "run_state"]

_PAGES = run_pages
# Every column of the run's row but the writing process's signs of life: what a page may show
# of the run (status, counts, label, versions, ...) and when its results last changed.
_STATE = tuple(c for c in runs.c if c.name not in ("heartbeat_at", "pid"))


def run_state(session: Reader, run_id: int) -> str | None:
    """What a stored page of run ``run_id`` depends on, as text; ``None`` while the run can
    still change: not finished, results written since its summary, or a shard missing."""
    row = session.execute(select(*_STATE).where(runs.c.id == run_id)).one_or_none()
    if row is None or row.status != "finished" or row.summarised_at is None:
        return None
    shards = ""
    if row.shard_count:
        done = session.scalars(
            select(run_shards.c.shard).where(
                run_shards.c.run_id == run_id, run_shards.c.status == "finished"
            )
        ).all()
        if len(done) < row.shard_count:
            return None
        shards = ",".join(map(str, sorted(done)))
    return repr((*row, shards))


def page_stamp(state: str, parts: Iterable[object]) -> str:
    """The stamp of a page: the run's state and every other thing the page shows."""
    digest = hashlib.sha256(state.encode())
    for part in parts:
        digest.update(b"\x00" + repr(part).encode())
    return digest.hexdigest()


def read_page(session: Reader, run_id: int, name: str, stamp: str) -> str | None:
    """The stored page, if one was stored under this stamp."""
    body = session.scalar(
        select(_PAGES.c.body).where(
            _PAGES.c.run_id == run_id, _PAGES.c.name == name, _PAGES.c.stamp == stamp
        )
    )
    return None if body is None else zlib.decompress(body).decode()


def keep_page(engine: Engine, run_id: int, name: str, stamp: str, text: str) -> bool:
    """Store a page (replacing an older one of that name) in its own short transaction;
    whether it was stored. A database that refuses (read-only, locked past the busy timeout,
    another request storing the same page at once) costs the next reader a rebuild, nothing
    more: the caller serves the page it built either way."""
    body = zlib.compress(text.encode(), 1)  # level 1: a 4 MB page in ~20 ms, ~8x smaller
    try:
        with write_connection(engine, foreign_keys=True) as conn:
            where = (_PAGES.c.run_id == run_id, _PAGES.c.name == name)
            conn.execute(delete(_PAGES).where(*where))
            conn.execute(insert(_PAGES).values(run_id=run_id, name=name, stamp=stamp, body=body))
    except SQLAlchemyError:
        return False
    return True
