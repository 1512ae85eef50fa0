"""The scan of a recorded run: its regressions against its baseline, grouped into one alert.

A plain run is compared with its baseline, the newest earlier plain run of the same kernel,
matrix and device kind (confirm, bisect and adequacy runs are never one), by
``compare.runs.compare_runs``; each case it flags becomes one finding per kind
(``compare.findings``). Against the regressions the lineage already has, keyed by case and
kind:

- a finding with no regression is inserted ``detected``, into this run's alert;
- a finding whose regression is open (not fixed) is kept as it is: a nightly that keeps failing
  the same case reports it once;
- a finding whose regression was fixed (by a passing run, or by hand) reopens it: ``detected``
  again, moved to this run's alert, with an event saying so;
- an open regression this run does not flag is closed (``fixed``, by ``scan``) when the run
  holds its case, the case passed, and comparing the regression's last good run with this run
  no longer flags it.

The alert (one per run that found something) holds the new and reopened regressions and the
dimension values that explain them (``reports.explain``). Only a run newer than every other
plain run of its lineage changes regressions: an older run (an import filling history) takes
its place in history and baselines but opens, reopens and closes nothing. Idempotent: a run
scanned twice inserts nothing the second time. The caller commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from convmatrix.compare.errors import Declared
from convmatrix.compare.findings import Finding, findings
from convmatrix.compare.runs import DiffOptions, RunComparison, compare_runs
from convmatrix.core.records import BAD_OUTCOMES, CaseResult
from convmatrix.db.models import AlertRow, RegressionRow, Run
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.db.tables import utcnow
from convmatrix.reports.explain import explain
from convmatrix.reports.source import earlier_runs
from convmatrix.service.regressions import Regression, plain, record_event

__all__ = ["ScanResult", "baseline_run", "compare_against", "flagged_keys", "scan_run"]


@dataclass
class ScanResult:
    """What one scan did: the run, its baseline, its alert, and the regressions by fate."""

    run_id: int
    baseline_id: int | None
    alert_id: int | None = None
    new: list[Regression] = field(default_factory=list)  # inserted by this scan
    reopened: list[Regression] = field(default_factory=list)  # fixed before, failing again
    kept: list[Regression] = field(default_factory=list)  # known, and still there in this run
    fixed: list[Regression] = field(default_factory=list)  # closed by this run
    skipped: str | None = None  # why nothing was scanned (a side run, an older run)
    explanation: list[str] = field(default_factory=list)  # why the alert's cases fail
    compared: RunComparison | None = None  # the run against its baseline

    @property
    def alerting(self) -> list[Regression]:
        """The regressions this run raised: new and reopened (what ``--fail-on`` counts)."""
        return self.new + self.reopened


def baseline_run(session: Session, run: RunInfo) -> RunInfo | None:
    """The newest earlier plain run of the same kernel, matrix and device kind."""
    found = earlier_runs(session, run, 1)
    return found[0] if found else None


def _newer_run(session: Session, run: RunInfo) -> int | None:
    """A plain run of ``run``'s lineage that started after it, if any."""
    return session.scalar(
        select(Run.id)
        .where(
            Run.kind == "run", Run.kernel == run.kernel, Run.matrix == run.matrix,
            Run.device_kind == run.device_kind,
            or_(Run.started_at > run.started_at,
                and_(Run.started_at == run.started_at, Run.id > run.id)),
        )
        .limit(1)
    )  # fmt: skip


def declared_pair(base: RunInfo | None, head: RunInfo) -> tuple[Declared | None, ...]:
    """What the two runs' kernels declared their arithmetic to be (usage compares only under
    one bound: ``compare.errors``)."""
    return tuple(
        Declared.of(run.options.get("arithmetic")) if run is not None else None
        for run in (base, head)
    )


def compare_against(
    session: Session,
    base: RunInfo | None,
    head: RunInfo,
    head_results: list[CaseResult],
    options: DiffOptions,
) -> RunComparison:
    """Run ``head``'s results against run ``base``; no base: every bad case is new."""
    base_results = load_results(session, base.id) if base is not None else []
    return compare_runs(
        base_results,
        head_results,
        options,
        declared=declared_pair(base, head),  # type: ignore[arg-type]
    )


def flagged_keys(compared: RunComparison) -> set[tuple[str, str]]:
    """The (case id, kind) of every case the comparison flags."""
    keys = {(c.case_id, "new_failure") for c in compared.new_failures}
    keys |= {(e.case_id, "error_regression") for e in compared.error_regressions}
    keys |= {(t.case_id, "timing_regression") for t in compared.timing.regressions}
    return keys


def _lineage_rows(session: Session, run: RunInfo) -> dict[tuple[str, str], RegressionRow]:
    """The newest regression of each (case, kind) of the run's kernel, matrix and device."""
    rows = session.scalars(
        select(RegressionRow)
        .where(
            RegressionRow.kernel == run.kernel, RegressionRow.matrix == run.matrix,
            RegressionRow.device == run.device_kind,
        )
        .order_by(RegressionRow.id)
    )  # fmt: skip
    return {(row.case_id, row.kind): row for row in rows}


def _fill(row: RegressionRow, found: Finding, run: RunInfo, base: RunInfo | None) -> None:
    row.detail, row.outputs, row.properties = found.detail, found.outputs, found.properties
    row.first_bad_run, row.first_bad_commit = run.id, run.kernel_commit
    row.last_good_run = base.id if base else None
    row.last_good_commit = base.kernel_commit if base else None


class _Scan:
    """One scan's working state (``scan_run`` is the entry)."""

    def __init__(self, session: Session, run: RunInfo, base: RunInfo | None) -> None:
        self.session, self.run, self.base = session, run, base
        self.alert: AlertRow | None = None

    def alert_id(self) -> int:
        if self.alert is None:
            run, base = self.run, self.base
            self.alert = AlertRow(
                kernel=run.kernel, matrix=run.matrix, device=run.device_kind, run_id=run.id,
                baseline_run=base.id if base else None, created_at=utcnow(),
            )  # fmt: skip
            self.session.add(self.alert)
            self.session.flush()
        return self.alert.id

    def insert(self, found: Finding) -> Regression:
        now = utcnow()
        row = RegressionRow(
            alert_id=self.alert_id(), kernel=self.run.kernel, matrix=self.run.matrix,
            device=self.run.device_kind, case_id=found.case_id, case_name=found.name,
            output="", kind=found.kind, state="detected", created_at=now, updated_at=now,
            changed_by="scan",
        )  # fmt: skip
        _fill(row, found, self.run, self.base)
        self.session.add(row)
        self.session.flush()
        record_event(self.session, row, "detected", "scan", self.run.id, found.detail, new=True)
        return plain(row)

    def reopen(self, row: RegressionRow, found: Finding, *, keep_pair: bool = False) -> Regression:
        """Reopen a closed regression this run shows again (``keep_pair``: against its own last
        good run, which stays its baseline)."""
        was = row.fixed_run
        note = f"failed again in run {self.run.id}" + (f" (fixed in run {was})" if was else "")
        record_event(self.session, row, "detected", "scan", self.run.id, note)
        good = None if row.last_good_run is None else (row.last_good_run, row.last_good_commit)
        _fill(row, found, self.run, self.base)
        if keep_pair and good is not None:
            row.last_good_run, row.last_good_commit = good
        row.alert_id, row.state, row.fixed_run = self.alert_id(), "detected", None
        row.changed_by, row.updated_at = "scan", utcnow()
        self.session.flush()
        return plain(row)


def _close_fixed(
    session: Session,
    run: RunInfo,
    results: list[CaseResult],
    rows: list[RegressionRow],
    options: DiffOptions,
) -> tuple[list[Regression], list[Regression]]:
    """(fixed, still there) among open ``rows`` whose case ``run`` holds: fixed when the case
    passed and comparing the regression's last good run with ``run`` no longer flags it."""
    outcome = {r.case.id: r.outcome for r in results}
    by_good: dict[int | None, list[RegressionRow]] = {}
    for row in rows:
        if row.case_id in outcome:
            by_good.setdefault(row.last_good_run, []).append(row)
    fixed: list[Regression] = []
    still: list[Regression] = []
    for good_id, group in by_good.items():
        if all(outcome[row.case_id] != "passed" for row in group):
            still += [plain(row) for row in group]
            continue
        good = resolve_run(session, good_id) if good_id is not None else None
        flagged = flagged_keys(compare_against(session, good, run, results, options))
        for row in group:
            if outcome[row.case_id] != "passed" or (row.case_id, row.kind) in flagged:
                still.append(plain(row))
                continue
            record_event(session, row, "fixed", "scan", run.id, f"passed in run {run.id}")
            row.state, row.fixed_run, row.changed_by = "fixed", run.id, "scan"
            row.updated_at = utcnow()
            fixed.append(plain(row))
    session.flush()
    return fixed, still


def _reopen_still_bad(
    session: Session,
    run: RunInfo,
    results: list[CaseResult],
    rows: list[RegressionRow],
    options: DiffOptions,
    work: _Scan,
) -> list[Regression]:
    """Closed regressions this run still shows against their own last good run, though its
    baseline (bad too) does not: one set fixed by hand while the case kept failing. Only rows
    closed by a person, or whose case failed here, are compared (a row the scan closed was
    compared then; its next change shows against the baseline)."""
    outcome = {r.case.id: r.outcome for r in results}
    candidates = [
        row for row in rows if row.case_id in outcome
        and (row.changed_by != "scan" or outcome[row.case_id] in BAD_OUTCOMES)
    ]  # fmt: skip
    by_good: dict[int | None, list[RegressionRow]] = {}
    for row in candidates:
        by_good.setdefault(row.last_good_run, []).append(row)
    reopened = []
    for good_id, group in by_good.items():
        good = resolve_run(session, good_id) if good_id is not None else None
        compared = compare_against(session, good, run, results, options)
        again = findings(compared, _by_id(results), _by_id(
            load_results(session, good_id) if good_id is not None else []))  # fmt: skip
        for row in group:
            found = again.get((row.case_id, row.kind))
            if found is not None:
                reopened.append(work.reopen(row, found, keep_pair=True))
    return reopened


def _explanation(results: list[CaseResult], failing: set[str], run: RunInfo) -> list[dict]:
    """Why this alert's cases fail, against the run's passing cases (others set aside)."""
    population = [r.case for r in results if r.case.id in failing or r.outcome == "passed"]
    return [vars(e) | {"text": e.text()} for e in explain(population, failing, run.geometry)]


def scan_run(
    session: Session, spec: str | int, *, options: DiffOptions | None = None
) -> ScanResult:
    """Find the regressions of run ``spec`` against its baseline (see the module's text)."""
    options = options or DiffOptions()
    run = resolve_run(session, spec)
    if run.kind != "run":
        return ScanResult(run.id, None, skipped=f"a {run.kind} run is never scanned")
    newer = _newer_run(session, run)
    if newer is not None:
        return ScanResult(
            run.id, None, skipped=f"run {newer} is newer: this run fills history only"
        )
    base = baseline_run(session, run)
    results = load_results(session, run.id)
    base_results = load_results(session, base.id) if base is not None else []
    compared = compare_runs(
        base_results,
        results,
        options,
        declared=declared_pair(base, run),  # type: ignore[arg-type]
    )
    found = findings(compared, _by_id(results), _by_id(base_results))
    scan = ScanResult(run.id, base.id if base else None, compared=compared)
    known = _lineage_rows(session, run)
    work = _Scan(session, run, base)
    for key, finding in sorted(found.items()):
        row = known.get(key)
        if row is None:
            scan.new.append(work.insert(finding))
        elif row.state == "fixed":
            scan.reopened.append(work.reopen(row, finding))
        else:
            scan.kept.append(plain(row))
    unflagged = [
        row for key, row in known.items() if row.state != "fixed" and key not in found
        and row.first_bad_run != run.id
    ]  # fmt: skip
    scan.fixed, still = _close_fixed(session, run, results, unflagged, options)
    scan.kept += still
    closed = [row for key, row in known.items() if row.state == "fixed" and key not in found]
    scan.reopened += _reopen_still_bad(session, run, results, closed, options, work)
    if work.alert is not None:
        failing = {r.case_id for r in scan.alerting}
        work.alert.explanation = _explanation(results, failing, run)
        scan.alert_id = work.alert.id
        scan.explanation = [e["text"] for e in work.alert.explanation]
        session.flush()
    return scan


def _by_id(results: list[CaseResult]) -> Mapping[str, CaseResult]:
    return {r.case.id: r for r in results}
