"""What the regression lifecycle asks the database: regressions by filter, by lineage, by
alert, their events; each query written once, the policy (what counts as a regression, which
states may move where) left to ``service``.

Queries that hand back rows to change (``regression_rows``, ``lineage_regressions``) return
mapped ``RegressionRow`` objects and need an ORM session; the others are Core queries on the
tables and run on a connection or a session alike (``regression_records`` is
``regression_rows`` for readers: the same filter, plain rows, no ORM import, which is a third
of a reading command's start-up). Long ``IN`` lists go in ``chunks``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Row, func, select

from convmatrix.db.queries import chunks
from convmatrix.db.tables import regression_events, regressions, runs

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from convmatrix.db.engine import Reader
    from convmatrix.db.models import RegressionRow

__all__ = [
    "alert_case_ids",
    "count_fixed_by",
    "event_rows",
    "find_regression",
    "lineage_case_ids",
    "lineage_regressions",
    "lock_alert_regressions",
    "regression_links",
    "regression_records",
    "regression_rows",
    "regressions_raised_by_scan",
]

_R, _E = regressions.c, regression_events.c


def _where(
    *,
    states: Sequence[str] = (),
    kernel: str | None = None,
    case_id: str | None = None,
    ids: Sequence[int] = (),
    alert_ids: Sequence[int] = (),
    first_bad_runs: Sequence[int] = (),
) -> list[ColumnElement[bool]]:
    """The filter of ``regression_rows`` and ``regression_records`` (an empty filter filters
    nothing)."""
    where = [_R.state.in_(list(states))] if states else []
    if kernel is not None:
        where.append(_R.kernel == kernel)
    if case_id is not None:
        where.append(_R.case_id.startswith(case_id, autoescape=True))
    by_value = ((_R.id, ids), (_R.alert_id, alert_ids), (_R.first_bad_run, first_bad_runs))
    for column, values in by_value:
        if values:
            where.append(column.in_(list(values)))
    return where


def regression_rows(session: Session, **filters: Any) -> list[RegressionRow]:
    """Regressions to change, newest first, filtered by state, kernel, case id (prefix), id,
    alert or first bad run (``_where``'s keywords)."""
    from convmatrix.db.models import RegressionRow  # the ORM: only for writers

    query = select(RegressionRow).where(*_where(**filters)).order_by(_R.id.desc())
    return list(session.scalars(query))


def regression_records(session: Reader, **filters: Any) -> list[Row[Any]]:
    """``regression_rows`` as plain rows (every ``regressions`` column), for readers."""
    query = select(regressions).where(*_where(**filters)).order_by(_R.id.desc())
    return list(session.execute(query))


def lineage_regressions(
    session: Session, kernel: str, matrix: str, device: str
) -> list[RegressionRow]:
    """Every regression of a lineage, ordered by when its first bad run started (regressions
    whose run is gone first), then by id: the last of each (case, kind) is its newest."""
    from convmatrix.db.models import RegressionRow  # the ORM: only for writers

    return list(session.scalars(
        select(RegressionRow)
        .outerjoin(runs, runs.c.id == _R.first_bad_run)
        .where(_R.kernel == kernel, _R.matrix == matrix, _R.device == device)
        .order_by(runs.c.started_at.is_not(None), runs.c.started_at, runs.c.id, _R.id)
    ))  # fmt: skip


def lineage_case_ids(session: Reader, kernel: str, matrix: str, device: str) -> list[str]:
    """The distinct case ids that have a regression in a lineage."""
    query = select(_R.case_id).where(_R.kernel == kernel, _R.matrix == matrix, _R.device == device)
    return list(session.scalars(query.distinct()))


def regression_links(
    session: Reader, kernel: str, matrix: str, device: str, case_ids: Iterable[str]
) -> list[Row[Any]]:
    """(id, alert_id, kind, state, case_id) of a lineage's regressions of these cases, newest
    first."""
    rows = [
        row
        for batch in chunks(dict.fromkeys(case_ids))
        for row in session.execute(
            select(_R.id, _R.alert_id, _R.kind, _R.state, _R.case_id)
            .where(_R.kernel == kernel, _R.matrix == matrix, _R.device == device,
                   _R.case_id.in_(batch))
        )
    ]  # fmt: skip
    return sorted(rows, key=lambda row: -row.id)


def event_rows(session: Reader, ids: Iterable[int]) -> dict[int, list[Row[Any]]]:
    """The events of these regressions (every ``regression_events`` column), each list oldest
    first; every id asked is a key."""
    wanted = list(ids)
    found: dict[int, list[Row[Any]]] = {i: [] for i in wanted}
    rows = [
        row
        for batch in chunks(wanted)
        for row in session.execute(select(regression_events).where(_E.regression_id.in_(batch)))
    ]
    for row in sorted(rows, key=lambda r: r.id):
        found[row.regression_id].append(row)
    return found


def regressions_raised_by_scan(session: Reader, run_id: int) -> list[int]:
    """Regressions the scan of ``run_id`` set ``detected`` (inserted or reopened) that are
    ``detected`` still."""
    return list(session.scalars(
        select(_R.id).distinct()
        .join(regression_events, _E.regression_id == _R.id)
        .where(_E.run_id == run_id, _E.by == "scan", _E.to_state == "detected",
               _R.state == "detected")
    ))  # fmt: skip


def lock_alert_regressions(session: Session, alert_id: int) -> list[int]:
    """Lock an alert's regressions (``SELECT ... FOR UPDATE``, in id order, as every writer
    takes them) until the transaction ends; their ids."""
    query = select(_R.id).where(_R.alert_id == alert_id).order_by(_R.id).with_for_update()
    return list(session.scalars(query).all())


def alert_case_ids(session: Reader, alert_id: int, *, excluding: Sequence[str]) -> set[str]:
    """The case ids of an alert's regressions whose state is none of ``excluding``."""
    query = select(_R.case_id).where(_R.alert_id == alert_id, _R.state.not_in(list(excluding)))
    return set(session.scalars(query))


def count_fixed_by(session: Reader, run_id: int) -> int:
    """How many regressions run ``run_id`` fixed."""
    query = select(func.count()).select_from(regressions).where(_R.fixed_run == run_id)
    return session.scalar(query) or 0


def find_regression(session: Reader, **key: Any) -> int | None:
    """The id of a regression whose columns equal ``key`` (column name -> value), if any."""
    return session.scalar(select(_R.id).where(*(_R[name] == value for name, value in key.items())))
