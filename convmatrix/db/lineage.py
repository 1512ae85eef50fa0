"""The runs of one lineage: the plain runs of one kernel, matrix and device kind, in the order
they started (ties broken by id). A run's baseline, the history a timing is judged against,
whether a newer run exists (only that one's scan changes regressions) and the columns of an
alert's history are all slices of it, read by ``lineage_runs``: one query, written once.

Core only (the ``runs`` table): ``report`` and ``diff`` read a baseline without the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import and_, or_, select

from convmatrix.core.records import JUDGED
from convmatrix.db.tables import runs

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = ["LineageRun", "Position", "lineage_runs"]


class Position(Protocol):
    """A run's place in its lineage (a ``RunInfo`` is one): when it started, and its id for
    runs started at once."""

    @property
    def started_at(self) -> datetime: ...

    @property
    def id(self) -> int: ...


@dataclass(frozen=True)
class LineageRun:
    """One run of a lineage, with what a history column shows of it."""

    id: int
    kernel_commit: str | None
    label: str | None
    started_at: datetime


def lineage_runs(
    session: Reader,
    kernel: str,
    matrix: str,
    device: str,
    *,
    before: Position | None = None,
    after: Position | None = None,
    judged: bool = False,
    newest_first: bool = False,
    limit: int | None = None,
) -> list[LineageRun]:
    """The plain runs of the lineage, oldest first (``newest_first``: the reverse), only those
    that started before ``before`` / after ``after`` when given, and with ``judged`` only runs
    that judged at least one case (a kernel that did not load judged none: never a baseline)."""
    r = runs.c
    conditions: list[Any] = [
        r.kind == "run", r.kernel == kernel, r.matrix == matrix, r.device_kind == device,
    ]  # fmt: skip
    if judged:
        conditions.append(sum((r[f"n_{o}"] for o in JUDGED[1:]), r[f"n_{JUDGED[0]}"]) > 0)
    if before is not None:
        conditions.append(or_(
            r.started_at < before.started_at,
            and_(r.started_at == before.started_at, r.id < before.id),
        ))  # fmt: skip
    if after is not None:
        conditions.append(or_(
            r.started_at > after.started_at,
            and_(r.started_at == after.started_at, r.id > after.id),
        ))  # fmt: skip
    order = (r.started_at.desc(), r.id.desc()) if newest_first else (r.started_at, r.id)
    query = select(r.id, r.kernel_commit, r.label, r.started_at).where(*conditions)
    query = query.order_by(*order)
    if limit is not None:
        query = query.limit(limit)
    return [LineageRun(*row) for row in session.execute(query)]
