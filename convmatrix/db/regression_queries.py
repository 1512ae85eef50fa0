"""What the regression lifecycle asks the database: regressions by filter, by lineage, by
alert, their events; each query written once, the policy (what counts as a regression, which
states may move where) left to ``service``.

Queries that hand back rows to change (``regression_rows``, ``lineage_regressions``) return
mapped ``RegressionRow`` objects and need an ORM session; the others are Core queries on the
tables and run on a connection or a session alike. Long ``IN`` lists go in ``chunks``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, func, select

from convmatrix.db.models import RegressionRow, Run
from convmatrix.db.queries import chunks
from convmatrix.db.tables import regression_events, regressions

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from convmatrix.db.engine import Reader

__all__ = [
    "alert_case_ids",
    "count_fixed_by",
    "event_rows",
    "find_regression",
    "lineage_case_ids",
    "lineage_regressions",
    "lock_alert_regressions",
    "regression_links",
    "regression_rows",
    "regressions_raised_by_scan",
]

_R, _E = regressions.c, regression_events.c


def regression_rows(
    session: Session,
    *,
    states: Sequence[str] = (),
    kernel: str | None = None,
    case_id: str | None = None,
    ids: Sequence[int] = (),
    alert_ids: Sequence[int] = (),
    first_bad_runs: Sequence[int] = (),
) -> list[RegressionRow]:
    """Regressions, newest first, filtered by state, kernel, case id (prefix), id, alert or
    first bad run (an empty filter filters nothing)."""
    query = select(RegressionRow).order_by(RegressionRow.id.desc())
    if states:
        query = query.where(RegressionRow.state.in_(list(states)))
    if kernel is not None:
        query = query.where(RegressionRow.kernel == kernel)
    if case_id is not None:
        query = query.where(RegressionRow.case_id.startswith(case_id, autoescape=True))
    for column, values in (
        (RegressionRow.id, ids), (RegressionRow.alert_id, alert_ids),
        (RegressionRow.first_bad_run, first_bad_runs),
    ):  # fmt: skip
        if values:
            query = query.where(column.in_(list(values)))
    return list(session.scalars(query))


def lineage_regressions(
    session: Session, kernel: str, matrix: str, device: str
) -> list[RegressionRow]:
    """Every regression of a lineage, ordered by when its first bad run started (regressions
    whose run is gone first), then by id: the last of each (case, kind) is its newest."""
    return list(session.scalars(
        select(RegressionRow)
        .outerjoin(Run, Run.id == RegressionRow.first_bad_run)
        .where(
            RegressionRow.kernel == kernel, RegressionRow.matrix == matrix,
            RegressionRow.device == device,
        )
        .order_by(Run.started_at.is_not(None), Run.started_at, Run.id, RegressionRow.id)
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
