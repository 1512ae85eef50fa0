"""Alerts: what one run found against its baseline, as people triage it.

An alert is one kernel, matrix and device between two runs (its baseline and the run that
found it), holding one regression per case (``service.regressions``), the dimension values
and facts of the call that explain them (``reports.explain``), and what was done to find the
cause: the confirmation rerun and the first bad commit a bisection found. Its state is its
regressions' (an alert is open while any of them is). A regression never leaves its alert:
a case that fails again after a fix is a new regression in a new alert.

The explanation is computed from every case of the alert (less those a rerun found flaky or
a person called invalid) against the run's passing cases, whenever its cases change (the
scan inserts them, a confirmation files the cases it reproduced, marks some flaky).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult
from convmatrix.db.alert_queries import alert_records
from convmatrix.db.queries import run_column
from convmatrix.db.regression_queries import alert_case_ids
from convmatrix.service.regressions import OPEN_STATES, Regression, list_regressions

if TYPE_CHECKING:
    from sqlalchemy import Row
    from sqlalchemy.orm import Session

    from convmatrix.db.engine import Reader
    from convmatrix.db.models import AlertRow

__all__ = [
    "Alert",
    "get_alert",
    "list_alerts",
    "record_bisection",
    "record_confirmation",
    "refresh_explanation",
]

NOT_THE_CAUSE = ("flaky", "invalid")  # regressions an explanation leaves out


@dataclass
class Alert:
    id: int
    kernel: str
    matrix: str
    device: str
    run_id: int | None
    baseline_run: int | None
    commit: str | None  # the run's kernel commit
    baseline_commit: str | None
    created_at: str
    explanation: list[dict[str, Any]]
    confirm_run: int | None
    bisect_commit: str | None  # the first bad commit, once bisected
    bisect_run: int | None
    regressions: list[Regression] = field(default_factory=list)

    @property
    def states(self) -> dict[str, int]:
        return dict(Counter(r.state for r in self.regressions))

    @property
    def open(self) -> bool:
        return any(r.state in OPEN_STATES for r in self.regressions)

    def lines(self) -> list[str]:
        """A terminal's view: the headline, why, and each regression."""
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
        good, bad = (self.baseline_commit or "-")[:10], (self.commit or "-")[:10]
        lines = [
            f"alert {self.id}: {self.kernel} {self.matrix} {self.device}, run {self.run_id} "
            f"({bad}) against run {self.baseline_run or '-'} ({good}): "
            f"{len(self.regressions)} regressions ({states or 'none'})"
        ]
        lines += [f"  where: {e['text']}" for e in self.explanation[:1]]
        if self.bisect_commit:
            lines.append(f"  first bad commit: {self.bisect_commit}")
        if self.confirm_run:
            lines.append(f"  confirmation rerun: run {self.confirm_run}")
        lines += ["  " + r.line() for r in self.regressions]
        return lines


def _commit(session: Reader, run_id: int | None) -> str | None:
    return run_column(session, run_id, "kernel_commit")  # type: ignore[no-any-return]


def _plain(session: Reader, row: Row[Any], regressions: list[Regression]) -> Alert:
    return Alert(
        id=row.id, kernel=row.kernel, matrix=row.matrix, device=row.device, run_id=row.run_id,
        baseline_run=row.baseline_run, commit=_commit(session, row.run_id),
        baseline_commit=_commit(session, row.baseline_run),
        created_at=row.created_at.isoformat(timespec="seconds"),
        explanation=list(row.explanation or []), confirm_run=row.confirm_run,
        bisect_commit=row.bisect_commit, bisect_run=row.bisect_run,
        regressions=sorted(regressions, key=lambda r: (r.case_name, r.kind)),
    )  # fmt: skip


def list_alerts(
    session: Reader,
    *,
    states: tuple[str, ...] | list[str] = (),
    kernel: str | None = None,
    ids: list[int] | None = None,
    limit: int = 200,
) -> list[Alert]:
    """Alerts, newest first, each with its regressions; ``states``: only alerts holding a
    regression in one of these states."""
    rows = alert_records(session, kernel=kernel, ids=ids, limit=limit)
    regressions = list_regressions(session, alert_ids=[r.id for r in rows]) if rows else []
    by_alert: dict[int, list[Regression]] = {}
    for reg in regressions:
        by_alert.setdefault(reg.alert_id or 0, []).append(reg)
    # Regressions never leave their alert; one with none (rows of older releases, moved to a
    # later alert when they reopened) is not shown.
    alerts = [_plain(session, row, by_alert[row.id]) for row in rows if row.id in by_alert]
    if states:
        alerts = [a for a in alerts if any(r.state in states for r in a.regressions)]
    return alerts


def get_alert(session: Reader, alert_id: int) -> Alert:
    found = list_alerts(session, ids=[alert_id])
    if not found:
        raise UsageError(f"alert {alert_id}: no such alert")
    return found[0]


def _row(session: Session, alert_id: int) -> AlertRow:
    from convmatrix.db.models import AlertRow  # the ORM: only for writers

    row = session.get(AlertRow, alert_id)
    if row is None:
        raise UsageError(f"alert {alert_id}: no such alert")
    return row


def record_confirmation(session: Session, alert_id: int, rerun_id: int) -> None:
    """The confirmation rerun that served this alert."""
    _row(session, alert_id).confirm_run = rerun_id


def record_bisection(session: Session, alert_id: int, commit: str, run_id: int | None) -> None:
    """The first bad commit a bisection found for this alert (and its step's run)."""
    row = _row(session, alert_id)
    row.bisect_commit, row.bisect_run = commit, run_id


def refresh_explanation(
    session: Session,
    alert: AlertRow,
    results: Sequence[CaseResult],
    geometry: Mapping[str, Any] | None,
) -> None:
    """Explain ``alert`` again from all its cases (``results``: its run's) against the run's
    passing cases; stored on the row."""
    from convmatrix.reports.explain import explain  # dimensions and facts: only when explaining

    failing = alert_case_ids(session, alert.id, excluding=NOT_THE_CAUSE)
    population = [r.case for r in results if r.case.id in failing or r.outcome == "passed"]
    found = explain(population, failing, geometry)
    alert.explanation = [vars(e) | {"text": e.text()} for e in found]
    session.flush()
