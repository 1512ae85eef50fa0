"""What alerts are read by: the alerts of a run, of several runs, by filter, by identity.

``alert_rows`` and ``alert_of_run`` return mapped ``AlertRow`` objects (a scan and a
confirmation change them) and need an ORM session; the rest are Core queries on ``alerts``
(``alert_records`` is ``alert_rows`` for readers, with no ORM import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Row, select

from convmatrix.db.tables import alerts

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from convmatrix.db.engine import Reader
    from convmatrix.db.models import AlertRow

__all__ = ["alert_kernels", "alert_of_run", "alert_records", "alert_rows", "find_alert"]

_A = alerts.c


def _where(
    *,
    kernel: str | None = None,
    ids: Sequence[int] | None = None,
    run_ids: Sequence[int] | None = None,
) -> list[ColumnElement[bool]]:
    """The filter of ``alert_rows`` and ``alert_records`` (each part when given)."""
    where = [] if kernel is None else [_A.kernel == kernel]
    where += [] if ids is None else [_A.id.in_(list(ids))]
    return where + ([] if run_ids is None else [_A.run_id.in_(list(run_ids))])


def alert_rows(session: Session, *, limit: int | None = None, **filters: Any) -> list[AlertRow]:
    """Alerts to change, newest first, of this kernel, among these ids, raised by these runs
    (``_where``'s keywords, each when given)."""
    from convmatrix.db.models import AlertRow  # the ORM: only for writers

    query = select(AlertRow).where(*_where(**filters)).order_by(_A.id.desc()).limit(limit)
    return list(session.scalars(query))


def alert_records(session: Reader, *, limit: int | None = None, **filters: Any) -> list[Row[Any]]:
    """``alert_rows`` as plain rows (every ``alerts`` column), for readers."""
    query = select(alerts).where(*_where(**filters)).order_by(_A.id.desc()).limit(limit)
    return list(session.execute(query))


def alert_of_run(session: Session, run_id: int) -> AlertRow | None:
    """The alert run ``run_id`` raised (the first, should there be several), if any."""
    from convmatrix.db.models import AlertRow  # the ORM: only for writers

    return session.scalar(select(AlertRow).where(_A.run_id == run_id).order_by(_A.id).limit(1))


def alert_kernels(session: Reader) -> list[str]:
    """Every kernel that has an alert, sorted."""
    return sorted(session.scalars(select(alerts.c.kernel).distinct()))


def find_alert(session: Reader, run_id: int, kernel: str, matrix: str, device: str) -> int | None:
    """The id of run ``run_id``'s alert of this kernel, matrix and device, if any."""
    return session.scalar(
        select(_A.id).where(
            _A.run_id == run_id, _A.kernel == kernel, _A.matrix == matrix, _A.device == device
        )
    )
