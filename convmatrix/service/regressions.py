"""Regressions as rows with a lifecycle: found by a scan of each run, closed by a later pass.

A scan compares a run with the previous comparable run (same kernel, matrix and device kind,
not a confirm or bisect run) by the rules of ``compare.runs.compare_runs``: every new
failure, error regression and timing regression is a key (case id, kind, output). A key that
already has a regression which is not fixed is kept as it is (a nightly that keeps failing the
same case reports it once); any other is inserted as ``detected``. A regression is closed by
itself (``fixed``, with an event by ``scan``) when a later run holds its case, the case passed,
and a diff of the regression's last good run against that run no longer flags the key.

Only the regressions a scan inserted are *new*: ``--fail-on new-regressions`` and the CI
summary look at those alone, so an acknowledged failure does not break every build.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from convmatrix.compare.runs import DiffOptions, RunComparison, compare_runs
from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult
from convmatrix.db.models import REGRESSION_STATES, RegressionEventRow, RegressionRow, utcnow
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.reports.source import earlier_runs

__all__ = [
    "OPEN_STATES",
    "TRANSITIONS",
    "Regression",
    "RegressionEvent",
    "ScanResult",
    "baseline_run",
    "compare_against",
    "flagged_keys",
    "is_side_run",
    "list_regressions",
    "regression_events",
    "scan_run",
    "set_state",
]

# Where a regression may go from each state (``regressions set``); a rerun sets confirmed or
# flaky, a scan sets fixed. Reopening a fixed one is ``detected`` again.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "detected": ("confirmed", "flaky", "acknowledged", "ignored", "fixed"),
    "confirmed": ("flaky", "acknowledged", "ignored", "fixed"),
    "flaky": ("confirmed", "acknowledged", "ignored", "fixed"),
    "acknowledged": ("confirmed", "ignored", "fixed"),
    "ignored": ("detected", "acknowledged", "fixed"),
    "fixed": ("detected",),
}
assert set(TRANSITIONS) == set(REGRESSION_STATES)
OPEN_STATES = tuple(s for s in REGRESSION_STATES if s != "fixed")
SIDE_LABELS = ("confirm:", "bisect:")  # runs of a few cases made to judge others

Key = tuple[str, str, str]  # case id, kind, output ("" for a new failure)


@dataclass(frozen=True)
class Regression:
    """One regression row as plain data (what commands print and pages show)."""

    id: int
    kernel: str
    matrix: str
    device: str
    case_id: str
    case_name: str
    output: str
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

    @property
    def key(self) -> Key:
        return (self.case_id, self.kind, self.output)

    def line(self) -> str:
        """One line for a terminal."""
        what = self.kind.replace("_", " ") + (f" {self.output}" if self.output else "")
        good = (self.last_good_commit or "-")[:10]
        bad = (self.first_bad_commit or "-")[:10]
        return (
            f"#{self.id} {self.state:<12} {what:<24} {self.case_name} "
            f"[{self.kernel} {self.device}, good {good} run {self.last_good_run}, "
            f"bad {bad} run {self.first_bad_run}]"
        )


@dataclass(frozen=True)
class RegressionEvent:
    regression_id: int
    at: str
    by: str
    from_state: str | None
    to_state: str
    run_id: int | None
    note: str | None


@dataclass
class ScanResult:
    """What one scan did: the run, its baseline, and the regressions by what happened."""

    run_id: int
    baseline_id: int | None
    new: list[Regression] = field(default_factory=list)  # inserted by this scan
    kept: list[Regression] = field(default_factory=list)  # known, and still there in this run
    fixed: list[Regression] = field(default_factory=list)  # closed by this run
    compared: RunComparison | None = None  # the run against its baseline


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def _plain(row: RegressionRow) -> Regression:
    return Regression(
        id=row.id, kernel=row.kernel, matrix=row.matrix, device=row.device,
        case_id=row.case_id, case_name=row.case_name, output=row.output, kind=row.kind,
        state=row.state, detail=row.detail, first_bad_run=row.first_bad_run,
        first_bad_commit=row.first_bad_commit, last_good_run=row.last_good_run,
        last_good_commit=row.last_good_commit, fixed_run=row.fixed_run,
        created_at=_iso(row.created_at), updated_at=_iso(row.updated_at),
        changed_by=row.changed_by, note=row.note,
    )  # fmt: skip


def is_side_run(run: RunInfo) -> bool:
    """A confirm or bisect run: a few cases rerun to judge another run, never a baseline."""
    return bool(run.label) and run.label.startswith(SIDE_LABELS)  # type: ignore[union-attr]


def baseline_run(session: Session, run: RunInfo) -> RunInfo | None:
    """The newest earlier run of the same kernel, matrix and device kind that is not a side
    run: what a nightly is compared with."""
    for earlier in earlier_runs(session, run, 50):
        if not is_side_run(earlier):
            return earlier
    return None


def flagged_keys(view: RunComparison) -> dict[Key, str]:
    """Every key the diff flags, with a line saying why."""
    keys: dict[Key, str] = {}
    for c in view.new_failures:
        was = c.base_outcome or "not in base"
        keys[(c.case_id, "new_failure", "")] = f"{was} -> {c.head_outcome}: {c.message or ''}"
    for e in view.error_regressions:
        keys[(e.case_id, "error_regression", e.output)] = (
            f"e_rel {e.base_rel:.3g} -> {e.head_rel:.3g}, e_norm {e.base_norm:.3g} -> "
            f"{e.head_norm:.3g} (x{e.growth:.3g})"
        )
    for t in view.timing.regressions:
        scope = t.scope + (f"/{t.mode}" if t.mode else "")
        keys[(t.case_id, "timing_regression", scope)] = (
            f"median {t.base_median_s:.3g}s -> {t.head_median_s:.3g}s (x{t.ratio:.3g})"
        )
    return keys


def compare_against(
    session: Session,
    base: RunInfo | None,
    head_results: list[CaseResult],
    options: DiffOptions,
) -> RunComparison:
    """A run's results against run ``base``; no base: every bad case is new."""
    base_results = load_results(session, base.id) if base is not None else []
    return compare_runs(base_results, head_results, options)


def _open_rows(session: Session, run: RunInfo) -> list[RegressionRow]:
    return list(
        session.scalars(
            select(RegressionRow)
            .where(
                RegressionRow.kernel == run.kernel,
                RegressionRow.matrix == run.matrix,
                RegressionRow.device == run.device_kind,
                RegressionRow.state != "fixed",
            )
            .order_by(RegressionRow.id)
        )
    )


def _event(
    session: Session,
    row: RegressionRow,
    to: str,
    by: str,
    run_id: int | None,
    note: str | None,
    *,
    new: bool = False,
) -> None:
    session.add(
        RegressionEventRow(
            regression_id=row.id, at=utcnow(), by=by, from_state=None if new else row.state,
            to_state=to, run_id=run_id, note=note,
        )
    )  # fmt: skip


def _close_fixed(
    session: Session,
    run: RunInfo,
    results: list[CaseResult],
    rows: list[RegressionRow],
    options: DiffOptions,
) -> tuple[list[Regression], list[Regression]]:
    """(fixed, still there) among ``rows`` whose case ``run`` holds: fixed (by ``scan``) when
    the case passed and a diff of the regression's last good run against ``run`` no longer
    flags its key."""
    outcome = {r.case.id: r.outcome for r in results}
    held = [row for row in rows if row.case_id in outcome]
    by_good: dict[int | None, list[RegressionRow]] = {}
    for row in held:
        by_good.setdefault(row.last_good_run, []).append(row)
    fixed: list[Regression] = []
    still: list[Regression] = []
    for good_id, group in by_good.items():
        if all(outcome[row.case_id] != "passed" for row in group):
            still += [_plain(row) for row in group]
            continue
        good = resolve_run(session, good_id) if good_id is not None else None
        flagged = flagged_keys(compare_against(session, good, results, options))
        for row in group:
            if outcome[row.case_id] != "passed" or (row.case_id, row.kind, row.output) in flagged:
                still.append(_plain(row))
                continue
            _event(session, row, "fixed", "scan", run.id, f"passed in run {run.id}")
            row.state, row.fixed_run, row.changed_by = "fixed", run.id, "scan"
            row.updated_at = utcnow()
            fixed.append(_plain(row))
    session.flush()
    return fixed, still


def scan_run(
    session: Session, spec: str | int, *, options: DiffOptions | None = None
) -> ScanResult:
    """Find the regressions of run ``spec`` against its baseline, insert the new ones, close
    the fixed ones. Idempotent: scanning a run twice inserts nothing the second time. The
    caller commits. A side run (confirm, bisect) is not scanned."""
    options = options or DiffOptions()
    run = resolve_run(session, spec)
    if is_side_run(run):
        return ScanResult(run_id=run.id, baseline_id=None)
    base = baseline_run(session, run)
    results = load_results(session, run.id)
    view = compare_against(session, base, results, options)
    scan = ScanResult(run_id=run.id, baseline_id=base.id if base else None, compared=view)
    rows = _open_rows(session, run)
    known = {(row.case_id, row.kind, row.output): row for row in rows}
    names = {r.case.id: r.case.pytest_id for r in results}
    for key, detail in flagged_keys(view).items():
        if key in known:
            scan.kept.append(_plain(known[key]))
            continue
        now = utcnow()
        row = RegressionRow(
            kernel=run.kernel, matrix=run.matrix, device=run.device_kind, case_id=key[0],
            case_name=names.get(key[0], key[0]), kind=key[1], output=key[2], state="detected",
            detail=detail, first_bad_run=run.id, first_bad_commit=run.kernel_commit,
            last_good_run=base.id if base else None,
            last_good_commit=base.kernel_commit if base else None,
            created_at=now, updated_at=now, changed_by="scan",
        )  # fmt: skip
        session.add(row)
        session.flush()
        _event(session, row, "detected", "scan", run.id, detail, new=True)
        scan.new.append(_plain(row))
    session.flush()
    flagged = set(flagged_keys(view))
    unflagged = [row for row in rows if (row.case_id, row.kind, row.output) not in flagged]
    scan.fixed, still = _close_fixed(session, run, results, unflagged, options)
    scan.kept += still
    return scan


def set_state(
    session: Session,
    regression_id: int,
    state: str,
    *,
    by: str,
    note: str | None = None,
    run_id: int | None = None,
) -> Regression:
    """Move a regression to ``state`` (one of ``TRANSITIONS[current]``), with an event."""
    if state not in TRANSITIONS:
        raise UsageError(f"state {state!r}: choose from {', '.join(TRANSITIONS)}")
    row = session.get(RegressionRow, regression_id)
    if row is None:
        raise UsageError(f"regression {regression_id}: no such regression")
    if state != row.state and state not in TRANSITIONS[row.state]:
        allowed = ", ".join(TRANSITIONS[row.state])
        raise UsageError(
            f"regression {regression_id} is {row.state}: it can become {allowed}, not {state}"
        )
    if state == row.state and note is None:
        return _plain(row)
    _event(session, row, state, by, run_id, note)
    row.state, row.changed_by, row.updated_at = state, by, utcnow()
    if note is not None:
        row.note = note
    if state == "detected":
        row.fixed_run = None
    session.flush()
    return _plain(row)


def list_regressions(
    session: Session,
    *,
    states: Sequence[str] = (),
    kernel: str | None = None,
    case_id: str | None = None,
    ids: Iterable[int] = (),
) -> list[Regression]:
    """Regressions, newest first, filtered by state, kernel, case id (prefix) or id."""
    unknown = [s for s in states if s not in TRANSITIONS]
    if unknown:
        raise UsageError(f"--state {unknown[0]!r}: choose from {', '.join(TRANSITIONS)}")
    query = select(RegressionRow).order_by(RegressionRow.id.desc())
    if states:
        query = query.where(RegressionRow.state.in_(list(states)))
    if kernel is not None:
        query = query.where(RegressionRow.kernel == kernel)
    if case_id is not None:
        query = query.where(RegressionRow.case_id.startswith(case_id, autoescape=True))
    wanted = list(ids)
    if wanted:
        query = query.where(RegressionRow.id.in_(wanted))
    return [_plain(row) for row in session.scalars(query)]


def regression_events(session: Session, regression_id: int) -> list[RegressionEvent]:
    """The history of one regression, oldest first."""
    rows = session.scalars(
        select(RegressionEventRow)
        .where(RegressionEventRow.regression_id == regression_id)
        .order_by(RegressionEventRow.id)
    )
    return [
        RegressionEvent(
            r.regression_id, _iso(r.at), r.by, r.from_state, r.to_state, r.run_id, r.note
        )
        for r in rows
    ]
