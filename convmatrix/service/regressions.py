"""Regressions as rows with a lifecycle that cannot lie: states, who changed them, and why.

A regression is one cause: one case of one kernel, matrix and device that went bad in one way
(a new failure, an error regression, a timing regression) in one run, inside the alert of that
run (``service.scan``, ``service.alerts``), which it never leaves. Its state moves only along
``TRANSITIONS``, and every change (a state, an assignee, a bug link, a note) is an event saying
who and when:

- a scan inserts ``detected``; a confirmation rerun sets ``confirmed`` or ``flaky``;
- people ``acknowledge`` it, ``ignore`` it (with a reason), call it ``invalid``, assign it,
  link a bug, note something, or reopen it (``detected``);
- a later run that passes the case closes it (``fixed``, by ``scan``, its ``fixed_run``
  recorded); a case failing again after that is a new regression, not this one. One a person
  set ``fixed`` while no run had passed the case is reopened (``detected``, by ``scan``) by a
  run that still fails it: the same cause, still there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from convmatrix.core.errors import InputError, UsageError
from convmatrix.db.regression_queries import event_rows, regression_records
from convmatrix.db.tables import REGRESSION_STATES, utcnow

if TYPE_CHECKING:
    from sqlalchemy import Row
    from sqlalchemy.orm import Session

    from convmatrix.db.engine import Reader
    from convmatrix.db.models import RegressionRow

__all__ = [
    "OPEN_STATES",
    "TRANSITIONS",
    "Regression",
    "RegressionEvent",
    "list_regressions",
    "plain",
    "record_event",
    "regression_events",
    "set_state",
    "triage",
]

# Where a regression may go from each state; ``detected`` again is a reopening.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "detected": ("confirmed", "flaky", "acknowledged", "ignored", "invalid", "fixed"),
    "confirmed": ("flaky", "acknowledged", "ignored", "invalid", "fixed"),
    "flaky": ("confirmed", "acknowledged", "ignored", "invalid", "fixed"),
    "acknowledged": ("detected", "confirmed", "ignored", "invalid", "fixed"),
    "ignored": ("detected", "acknowledged", "invalid", "fixed"),
    "invalid": ("detected",),
    "fixed": ("detected",),
}
assert set(TRANSITIONS) == set(REGRESSION_STATES)
OPEN_STATES = tuple(s for s in REGRESSION_STATES if s != "fixed")
NEEDS_REASON = ("ignored", "invalid")  # a person saying "not a problem" says why


@dataclass(frozen=True)
class Regression:
    """One regression row as plain data (what commands print and pages show)."""

    id: int
    alert_id: int | None
    kernel: str
    matrix: str
    device: str
    case_id: str
    case_name: str
    output: str  # "" (rows before alerts named one output each)
    kind: str
    state: str
    detail: str | None
    first_bad_run: int | None
    first_bad_commit: str | None
    last_good_run: int | None
    last_good_commit: str | None
    fixed_run: int | None
    created_at: str
    updated_at: str
    changed_by: str
    note: str | None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    properties: list[dict[str, Any]] = field(default_factory=list)
    assignee: str | None = None
    bug: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.case_id, self.kind)

    def line(self) -> str:
        """One line for a terminal: what, where, and the detail."""
        what = self.kind.replace("_", " ") + (f" {self.output}" if self.output else "")
        good = (self.last_good_commit or "-")[:10]
        bad = (self.first_bad_commit or "-")[:10]
        good_run, bad_run = self.last_good_run or "-", self.first_bad_run or "-"
        line = (
            f"#{self.id} {self.state:<12} {what:<18} {self.case_name} "
            f"[good {good} run {good_run}, bad {bad} run {bad_run}]"
        )
        return line + (f"\n      {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class RegressionEvent:
    regression_id: int
    at: str
    by: str
    from_state: str | None
    to_state: str
    run_id: int | None
    note: str | None


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def plain(row: RegressionRow | Row[Any]) -> Regression:
    """The plain record of a mapped row or a Core row of ``regressions`` (same names)."""
    return Regression(
        id=row.id, alert_id=row.alert_id, kernel=row.kernel, matrix=row.matrix,
        device=row.device, case_id=row.case_id, case_name=row.case_name, output=row.output,
        kind=row.kind, state=row.state, detail=row.detail, first_bad_run=row.first_bad_run,
        first_bad_commit=row.first_bad_commit, last_good_run=row.last_good_run,
        last_good_commit=row.last_good_commit, fixed_run=row.fixed_run,
        created_at=_iso(row.created_at), updated_at=_iso(row.updated_at),
        changed_by=row.changed_by, note=row.note, outputs=list(row.outputs or []),
        properties=list(row.properties or []), assignee=row.assignee, bug=row.bug,
    )  # fmt: skip


def record_event(
    session: Session,
    row: RegressionRow,
    to: str,
    by: str,
    run_id: int | None,
    note: str | None,
    *,
    new: bool = False,
) -> None:
    """An event for ``row`` going to ``to`` (before the row's own state is changed)."""
    from convmatrix.db.models import RegressionEventRow  # the ORM: only for writers

    session.add(
        RegressionEventRow(
            regression_id=row.id, at=utcnow(), by=by, from_state=None if new else row.state,
            to_state=to, run_id=run_id, note=note,
        )
    )  # fmt: skip


def _row(session: Session, regression_id: int) -> RegressionRow:
    """The row, locked until the transaction ends and read afresh under the lock: a change is
    checked against the state it applies to, and its event's ``from`` is that state, however
    many people triage it at once. PostgreSQL: ``SELECT ... FOR UPDATE`` (a second writer
    waits for the first to commit, then reads what it wrote); SQLite: the write transaction
    holds the database's one write lock from its start (``db.engine``: ``BEGIN IMMEDIATE``)."""
    from convmatrix.db.models import RegressionRow  # the ORM: only for writers

    row = session.get(RegressionRow, regression_id, with_for_update=True, populate_existing=True)
    if row is None:
        raise UsageError(f"regression {regression_id}: no such regression")
    return row


def set_state(
    session: Session,
    regression_id: int,
    state: str,
    *,
    by: str,
    note: str | None = None,
    run_id: int | None = None,
) -> Regression:
    """Move a regression to ``state`` (one of ``TRANSITIONS[current]``), with an event.
    ``ignored`` and ``invalid`` need a ``note`` saying why."""
    if state not in TRANSITIONS:
        raise UsageError(f"state {state!r}: choose from {', '.join(TRANSITIONS)}")
    row = _row(session, regression_id)
    if state != row.state and state not in TRANSITIONS[row.state]:
        allowed = ", ".join(TRANSITIONS[row.state])
        raise UsageError(
            f"regression {regression_id} is {row.state}: it can become {allowed}, not {state}"
        )
    if state in NEEDS_REASON and state != row.state and not (note or "").strip():
        raise UsageError(f"regression {regression_id}: say why it is {state} (a note)")
    if state == row.state and note is None:
        return plain(row)
    record_event(session, row, state, by, run_id, note)
    row.state, row.changed_by, row.updated_at = state, by, utcnow()
    if note is not None:
        row.note = note
    if state == "detected":
        row.fixed_run = None
    session.flush()
    return plain(row)


def triage(
    session: Session,
    regression_id: int,
    *,
    by: str,
    state: str | None = None,
    note: str | None = None,
    assignee: str | None = None,
    bug: str | None = None,
) -> Regression:
    """A person's change: a state (``set_state``), an assignee, a bug link or a note; each
    change is an event (a change that keeps the state is an event from it to itself)."""
    if state is not None:
        set_state(session, regression_id, state, by=by, note=note)
        note = None  # kept with the state's event
    row = _row(session, regression_id)
    changes = []
    if assignee is not None and assignee != (row.assignee or ""):
        row.assignee = assignee or None
        changes.append(f"assigned to {assignee}" if assignee else "unassigned")
    if bug is not None and bug != (row.bug or ""):
        row.bug = bug or None
        changes.append(f"bug {bug}" if bug else "bug link removed")
    if note is not None:
        row.note = note
        changes.append(note)
    if changes:
        record_event(session, row, row.state, by, None, "; ".join(changes))
        row.changed_by, row.updated_at = by, utcnow()
        session.flush()
    return plain(row)


def list_regressions(
    session: Reader,
    *,
    states: Sequence[str] = (),
    kernel: str | None = None,
    case_id: str | None = None,
    ids: Iterable[int] = (),
    alert_ids: Iterable[int] = (),
) -> list[Regression]:
    """Regressions, newest first, filtered by state, kernel, case id (prefix), id or alert."""
    unknown = [s for s in states if s not in TRANSITIONS]
    if unknown:
        raise InputError(f"--state {unknown[0]!r}: choose from {', '.join(TRANSITIONS)}")
    rows = regression_records(
        session, states=list(states), kernel=kernel, case_id=case_id, ids=list(ids),
        alert_ids=list(alert_ids),
    )  # fmt: skip
    return [plain(row) for row in rows]


def regression_events(session: Reader, regression_id: int) -> list[RegressionEvent]:
    """The history of one regression, oldest first."""
    return [
        RegressionEvent(
            r.regression_id, _iso(r.at), r.by, r.from_state, r.to_state, r.run_id, r.note
        )
        for r in event_rows(session, [regression_id])[regression_id]
    ]
