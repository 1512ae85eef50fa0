"""What alerts are read by: the alerts of a run, of several runs, by filter, by identity.

``alert_rows`` and ``alert_of_run`` return mapped ``AlertRow`` objects (a scan and a
confirmation change them) and need an ORM session; the rest are Core queries on ``alerts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select

from convmatrix.db.models import AlertRow
from convmatrix.db.tables import alerts

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from convmatrix.db.engine import Reader

__all__ = ["alert_kernels", "alert_of_run", "alert_rows", "find_alert"]


def alert_rows(
    session: Session,
    *,
    kernel: str | None = None,
    ids: Sequence[int] | None = None,
    run_ids: Sequence[int] | None = None,
    limit: int | None = None,
) -> list[AlertRow]:
    """Alerts, newest first, of this kernel, among these ids, raised by these runs (each
    when given)."""
    query = select(AlertRow).order_by(AlertRow.id.desc())
    if kernel is not None:
        query = query.where(AlertRow.kernel == kernel)
    if ids is not None:
        query = query.where(AlertRow.id.in_(list(ids)))
    if run_ids is not None:
        query = query.where(AlertRow.run_id.in_(list(run_ids)))
    if limit is not None:
        query = query.limit(limit)
    return list(session.scalars(query))


def alert_of_run(session: Session, run_id: int) -> AlertRow | None:
    """The alert run ``run_id`` raised (the first, should there be several), if any."""
    return session.scalar(
        select(AlertRow).where(AlertRow.run_id == run_id).order_by(AlertRow.id).limit(1)
    )


def alert_kernels(session: Reader) -> list[str]:
    """Every kernel that has an alert, sorted."""
    return sorted(session.scalars(select(alerts.c.kernel).distinct()))


def find_alert(session: Reader, run_id: int, kernel: str, matrix: str, device: str) -> int | None:
    """The id of run ``run_id``'s alert of this kernel, matrix and device, if any."""
    a = alerts.c
    return session.scalar(
        select(a.id).where(
            a.run_id == run_id, a.kernel == kernel, a.matrix == matrix, a.device == device
        )
    )
