"""The served pages of alerts and regressions, as view-models: the alerts index
(``/regressions``), one alert (``/alerts/{id}``) and one regression (``/regressions/{id}``).

An alert's page holds what a person needs to decide about it: its cases (one regression each,
with every failing output's bound usage before and after and what was allowed, and the failed
property checks), the dimension values that explain them, each case over the runs around the
alert (every point links to its run), the command that reruns the cases at the commit to check
out, what confirmation and bisection found, and each regression's events; apart from them,
the cases of the alert's run the machine failed to judge (timeouts, lost workers, harness
errors: no regression unless a rerun reproduces them) with their rerun's outcome. A
regression's page lists the case's other regressions (earlier and later causes, each in its
own alert: its lineage). Plain dataclasses read from the database; ``service.app`` renders
them and serves them as JSON.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from convmatrix.compare.infrastructure import Infrastructure, infrastructure
from convmatrix.core.errors import UsageError
from convmatrix.db.alert_queries import alert_kernels
from convmatrix.db.case_queries import (
    case_across_runs,
    case_metrics,
    case_outcomes,
    run_cases_with,
)
from convmatrix.db.engine import redact_url
from convmatrix.db.lineage import lineage_runs
from convmatrix.db.queries import resolve_run
from convmatrix.db.records import result_from_rows
from convmatrix.db.regression_queries import event_rows
from convmatrix.reports.run_view import rerun_command
from convmatrix.reports.viewmodel import run_header
from convmatrix.service.alerts import Alert, get_alert, list_alerts
from convmatrix.service.regressions import (
    NEEDS_REASON,
    TRANSITIONS,
    Regression,
    RegressionEvent,
    list_regressions,
)

__all__ = [
    "AlertHistoryPoint",
    "AlertHistoryRun",
    "AlertView",
    "AlertsView",
    "NotJudged",
    "RegressionDetail",
    "RegressionView",
    "TriageResult",
    "alert_page",
    "alerts_page",
    "events_of",
    "regression_page",
    "triage_result",
]

HISTORY_BEFORE = 6  # runs shown before the alert's run in each case's history
HISTORY_AFTER = 6  # and after it (did a later run fix it?)


@dataclass
class AlertHistoryRun:
    """One run of the alert's lineage (kernel, matrix, device): a column of the history."""

    run_id: int
    commit: str | None
    label: str | None
    started_at: str
    role: str  # "baseline", "alert" (the run that found it), or ""


@dataclass
class AlertHistoryPoint:
    """A case in one run of the history: its outcome (None: the run does not hold it) and
    its worst bound usage over its outputs (None: none recorded)."""

    run_id: int
    outcome: str | None
    usage: float | None


@dataclass(frozen=True)
class RegressionDetail(Regression):
    """A regression with what its pages show beside it: the states it may move to, its
    events (oldest first) and its case over the runs of the history."""

    allowed: list[str] = field(default_factory=list)
    events: list[RegressionEvent] = field(default_factory=list)
    history: list[AlertHistoryPoint] = field(default_factory=list)


@dataclass
class Rerun:
    """How to run the cases again where they failed: check out ``commit`` (None: the run
    recorded none), then ``command``."""

    commit: str | None
    command: str
    run_id: int

    @property
    def lines(self) -> str:
        checkout = f"git checkout {shlex.quote(self.commit)}\n" if self.commit else ""
        return checkout + self.command


@dataclass
class NotJudged:
    """A case of the alert's run the machine failed to judge, and what its confirmation
    rerun made of it (None: not rerun)."""

    case: Infrastructure
    rerun_outcome: str | None = None


@dataclass
class AlertsView:
    kind: str
    database: str
    states: list[str]
    kernel: str | None
    alerts: list[Alert]
    counts: dict[str, int]  # state -> regressions in the alerts shown
    kernels: list[str]  # every kernel that has an alert (the filter's choices)
    # Regressions older than alerts (schema 0006/0007), in no alert; filtered alike.
    unfiled: list[Regression] = field(default_factory=list)


@dataclass
class AlertView:
    kind: str
    database: str
    alert: Alert  # its regressions as ``RegressionDetail``
    runs: list[AlertHistoryRun]  # the columns of each regression's ``history``
    rerun: Rerun | None  # every case of the alert (None: its run is gone)
    allowed: list[str]  # the states at least one of its regressions may move to
    needs_reason: list[str]  # states that need a note
    not_judged: list[NotJudged] = field(default_factory=list)  # infrastructure, listed apart


@dataclass
class RegressionView:
    kind: str
    database: str
    regression: RegressionDetail
    alert: Alert | None  # the alert that holds it, with its other regressions
    runs: list[AlertHistoryRun]
    rerun: Rerun | None
    needs_reason: list[str]
    lineage: list[Regression] = field(default_factory=list)  # the case's other regressions


@dataclass
class TriageResult:
    """What a write through the API did: the regressions as they are now, with their events,
    and those of an alert that could not make the move (id and why)."""

    regressions: list[RegressionDetail]
    skipped: list[dict[str, Any]] = field(default_factory=list)


def _iso(moment: Any) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else ""


def events_of(session: Session, ids: Iterable[int]) -> dict[int, list[RegressionEvent]]:
    """The events of several regressions at once, each list oldest first."""
    return {
        regression_id: [
            RegressionEvent(r.regression_id, _iso(r.at), r.by, r.from_state, r.to_state,
                            r.run_id, r.note)
            for r in rows
        ]
        for regression_id, rows in event_rows(session, ids).items()
    }  # fmt: skip


def _lineage_window(
    session: Session, kernel: str, matrix: str, device: str, around: int | None,
    roles: dict[int, str],
) -> list[AlertHistoryRun]:  # fmt: skip
    """The plain runs of a lineage around run ``around`` (the newest when it is gone)."""
    rows = lineage_runs(session, kernel, matrix, device)
    at = next((i for i, r in enumerate(rows) if r.id == around), len(rows) - 1)
    window = rows[max(0, at - HISTORY_BEFORE) : at + HISTORY_AFTER + 1]
    return [
        AlertHistoryRun(r.id, r.kernel_commit, r.label, _iso(r.started_at), roles.get(r.id, ""))
        for r in window
    ]


def _history(
    session: Session, runs: Sequence[AlertHistoryRun], case_ids: Iterable[str]
) -> dict[str, list[AlertHistoryPoint]]:
    """Each case over ``runs``: one point per run, in their order."""
    ids, run_ids = sorted(set(case_ids)), [r.run_id for r in runs]
    rows = case_across_runs(session, ids, run_ids=run_ids)
    usage = {  # a case's worst bound usage over its outputs (None: none recorded)
        pk: max((m.bound_usage for m in ms if m.bound_usage is not None), default=None)
        for pk, ms in case_metrics(session, [r.id for r in rows]).items()
    }
    seen = {
        (r.case_id, r.run_id): (r.outcome, None if usage.get(r.id) is None else float(usage[r.id]))
        for r in rows
    }
    return {
        cid: [AlertHistoryPoint(run, *seen.get((cid, run), (None, None))) for run in run_ids]
        for cid in ids
    }


def _details(
    session: Session, regressions: Sequence[Regression], runs: Sequence[AlertHistoryRun]
) -> list[RegressionDetail]:
    events = events_of(session, [r.id for r in regressions])
    history = _history(session, runs, [r.case_id for r in regressions])
    names = [f.name for f in dataclasses.fields(Regression)]
    return [
        RegressionDetail(
            **{name: getattr(r, name) for name in names},
            allowed=list(TRANSITIONS[r.state]),
            events=events[r.id],
            history=history.get(r.case_id, []),
        )
        for r in regressions
    ]


def _rerun(session: Session, url: str, run_id: int | None, case_ids: list[str]) -> Rerun | None:
    """The rerun of ``case_ids`` as run ``run_id`` ran them, at its commit."""
    if run_id is None:
        return None
    try:
        info = resolve_run(session, run_id)
    except UsageError:
        return None
    command = rerun_command(run_header(info, url), sorted(dict.fromkeys(case_ids)))
    return Rerun(commit=info.kernel_commit, command=command, run_id=info.id)


def alerts_page(
    session: Session, url: str, states: list[str], kernel: str | None = None
) -> AlertsView:
    """The alerts, newest first (``states``: only those holding a regression in one of
    them; ``kernel``: only its), and the regressions that are in no alert."""
    alerts = list_alerts(session, states=states, kernel=kernel)
    counts: dict[str, int] = {}
    for alert in alerts:
        for reg in alert.regressions:
            counts[reg.state] = counts.get(reg.state, 0) + 1
    unfiled = [
        r for r in list_regressions(session, states=states, kernel=kernel) if r.alert_id is None
    ]
    kernels = alert_kernels(session)
    return AlertsView(
        kind="alerts", database=redact_url(url), states=list(states), kernel=kernel,
        alerts=alerts, counts=counts, kernels=kernels, unfiled=unfiled,
    )  # fmt: skip


def _id(text: str | int, what: str) -> int:
    value = str(text).strip()
    if not value.isdigit():
        raise UsageError(f"{what} {value!r}: give its number")
    return int(value)


_NOT_JUDGED = ("timeout", "lost", "crashed", "error")  # outcomes that may be the machine's


def _not_judged(session: Session, alert: Alert) -> list[NotJudged]:
    """The alert's run's cases the machine failed to judge, with their rerun's outcome."""
    if alert.run_id is None:
        return []
    rows = run_cases_with(session, alert.run_id, _NOT_JUDGED)
    found = infrastructure(result_from_rows(row, [], [], []) for row in rows)
    rerun: dict[str, str] = {}
    if alert.confirm_run is not None and found:
        rerun = case_outcomes(session, alert.confirm_run, [c.case_id for c in found])
    return [NotJudged(c, rerun.get(c.case_id)) for c in found]


def alert_page(session: Session, url: str, alert_id: str | int) -> AlertView:
    alert = get_alert(session, _id(alert_id, "alert"))
    roles = {alert.run_id: "alert"} if alert.run_id is not None else {}
    if alert.baseline_run is not None:
        roles[alert.baseline_run] = "baseline"
    runs = _lineage_window(session, alert.kernel, alert.matrix, alert.device, alert.run_id, roles)
    details = _details(session, alert.regressions, runs)
    allowed = sorted({s for r in details for s in r.allowed}, key=list(TRANSITIONS).index)
    return AlertView(
        kind="alert", database=redact_url(url),
        alert=dataclasses.replace(alert, regressions=details), runs=runs,
        rerun=_rerun(session, url, alert.run_id, [r.case_id for r in details]),
        allowed=allowed, needs_reason=list(NEEDS_REASON), not_judged=_not_judged(session, alert),
    )  # fmt: skip


def regression_page(session: Session, url: str, regression_id: str | int) -> RegressionView:
    wanted = _id(regression_id, "regression")
    found = list_regressions(session, ids=[wanted])
    if not found:
        raise UsageError(f"regression {wanted}: no such regression")
    reg = found[0]
    alert = get_alert(session, reg.alert_id) if reg.alert_id is not None else None
    roles = {reg.first_bad_run: "alert"} if reg.first_bad_run is not None else {}
    if reg.last_good_run is not None:
        roles[reg.last_good_run] = "baseline"
    runs = _lineage_window(session, reg.kernel, reg.matrix, reg.device, reg.first_bad_run, roles)
    detail = _details(session, [reg], runs)[0]
    lineage = [
        r for r in list_regressions(session, kernel=reg.kernel, case_id=reg.case_id)
        if (r.matrix, r.device, r.case_id) == (reg.matrix, reg.device, reg.case_id)
        and r.id != reg.id
    ]  # fmt: skip
    return RegressionView(
        kind="regression", database=redact_url(url), regression=detail, alert=alert, runs=runs,
        rerun=_rerun(session, url, reg.first_bad_run, [reg.case_id]),
        needs_reason=list(NEEDS_REASON), lineage=sorted(lineage, key=lambda r: r.id),
    )  # fmt: skip


def triage_result(
    session: Session, ids: Sequence[int], skipped: list[dict[str, Any]] | None = None
) -> TriageResult:
    """The regressions ``ids`` as they are now (after a write), with their events."""
    found = {r.id: r for r in list_regressions(session, ids=list(ids))} if ids else {}
    details = _details(session, [found[i] for i in ids if i in found], ())
    return TriageResult(regressions=details, skipped=list(skipped or []))
