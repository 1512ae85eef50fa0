"""The scan of a recorded run: its regressions against its baseline, grouped into one alert.

A plain run is compared with its baseline, the newest earlier plain run of the same kernel,
matrix and device kind (confirm, bisect and adequacy runs are never one), by
``compare.runs.compare_runs``; each case it flags becomes one finding per kind
(``compare.findings``). A case the machine failed to judge (a timeout, a lost worker, a
harness error: ``compare.infrastructure``) is no finding: it is listed apart
(``ScanResult.infrastructure``) for ``confirm`` to rerun with a longer limit.

A regression is one cause: (case, kind, the run it first failed in). Against the newest
regression of each (case, kind) of the lineage:

- a finding with none, or whose regression a run has fixed (``fixed_run``), is a new
  regression, ``detected``, in this run's alert; the fixed one stays as it is, in its alert;
- a finding whose regression is open is kept as it is: a nightly failing the same case
  reports it once;
- a finding whose regression a person set fixed while no run has passed the case since is the
  same cause still there: that regression is reopened (``detected`` again, in its own alert,
  with an event saying so);
- an open regression this run does not flag is closed (``fixed``, by ``scan``) when the run
  holds its case, the case passed, and comparing the regression's last good run with this run
  no longer flags it; a regression set fixed by hand gets its ``fixed_run`` the same way.

The alert (one per run that found something) holds the new regressions and the dimension
values and facts that explain them (``service.alerts.refresh_explanation``). Only a run newer
than every other plain run of its lineage changes regressions: an older run (an import filling
history) takes its place in history and baselines but opens, reopens and closes nothing.
Idempotent: a run scanned twice inserts nothing the second time. A pure function of the
database and its options: the caller commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from convmatrix.compare.errors import Declared
from convmatrix.compare.findings import Finding, findings
from convmatrix.compare.infrastructure import (
    Infrastructure,
    infrastructure,
    infrastructure_cause,
    infrastructure_lines,
)
from convmatrix.compare.runs import DiffOptions, RunComparison, compare_runs
from convmatrix.core.recorded import Recorded
from convmatrix.core.records import BAD_OUTCOMES, CaseResult
from convmatrix.db.alert_queries import alert_of_run
from convmatrix.db.lineage import lineage_runs
from convmatrix.db.models import AlertRow, RegressionRow
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.db.regression_queries import lineage_regressions
from convmatrix.db.tables import utcnow
from convmatrix.reports.source import earlier_runs
from convmatrix.service.alerts import refresh_explanation
from convmatrix.service.regressions import Regression, plain, record_event

__all__ = [
    "ScanResult",
    "baseline_run",
    "by_id",
    "compare_against",
    "file_findings",
    "flagged_keys",
    "scan_run",
]


@dataclass
class ScanResult:
    """What one scan did: the run, its baseline, its alert, and the regressions by fate."""

    run_id: int
    baseline_id: int | None
    alert_id: int | None = None
    new: list[Regression] = field(default_factory=list)  # inserted by this scan
    reopened: list[Regression] = field(default_factory=list)  # set fixed by hand, still failing
    kept: list[Regression] = field(default_factory=list)  # known, and still there in this run
    fixed: list[Regression] = field(default_factory=list)  # closed by this run
    skipped: str | None = None  # why nothing was scanned (a side run, an older run)
    explanation: list[str] = field(default_factory=list)  # why the alert's cases fail
    compared: RunComparison | None = None  # the run against its baseline
    # cases the machine failed to judge (timeouts, lost workers, harness errors): no regression
    infrastructure: list[Infrastructure] = field(default_factory=list)

    @property
    def alerting(self) -> list[Regression]:
        """The regressions this run raised: new and reopened (what ``--fail-on`` counts)."""
        return self.new + self.reopened

    def infrastructure_lines(self) -> list[str]:
        """The cases not judged, apart from the regressions (for a terminal)."""
        return infrastructure_lines(self.infrastructure)


def baseline_run(session: Session, run: RunInfo) -> RunInfo | None:
    """The newest earlier plain run of the same kernel, matrix and device kind."""
    found = earlier_runs(session, run, 1)
    return found[0] if found else None


def _newer_run(session: Session, run: RunInfo) -> int | None:
    """A plain run of ``run``'s lineage that started after it, if any."""
    newer = lineage_runs(session, run.kernel, run.matrix, run.device_kind, after=run, limit=1)
    return newer[0].id if newer else None


def declared_pair(base: RunInfo | None, head: RunInfo) -> tuple[Declared | None, ...]:
    """What the two runs' kernels declared their arithmetic to be (usage compares only under
    one bound: ``compare.errors``)."""
    return tuple(
        Declared.of(Recorded.of(run.options).arithmetic) if run is not None else None
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


def _lineage_rows(
    session: Session, run: RunInfo
) -> tuple[dict[tuple[str, str], RegressionRow], list[RegressionRow]]:
    """The newest regression of each (case, kind) of the run's kernel, matrix and device: the
    one whose first bad run started last (not the highest id: an import inserts rows in
    whatever order its file has them); and the older ones still open. Those are the rows a
    release before per-case regressions kept per output (migration 0015 files them into
    alerts): a run that passes their case closes them too, or they stay open for good."""
    rows = lineage_regressions(session, run.kernel, run.matrix, run.device_kind)
    newest = {(row.case_id, row.kind): row for row in rows}
    shadowed = [r for r in rows if r is not newest[(r.case_id, r.kind)] and r.state != "fixed"]
    return newest, shadowed


Good = tuple[int | None, str | None]  # a regression's last good run and its commit


def _good_of(base: RunInfo | None) -> Good:
    return (base.id, base.kernel_commit) if base is not None else (None, None)


class _Scan:
    """One scan's working state (``scan_run`` is the entry): the run, its baseline, the
    run's alert (found, or made when the first regression is inserted)."""

    def __init__(self, session: Session, run: RunInfo, base: RunInfo | None) -> None:
        self.session, self.run, self.base = session, run, base
        self.alert: AlertRow | None = alert_of_run(session, run.id)
        self.touched = False  # whether this scan changed the alert's regressions

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

    def insert(
        self, found: Finding, good: Good | None = None, note: str | None = None
    ) -> Regression:
        """A new regression of ``found`` in the run's alert; ``good``: its last good run when
        it is not the baseline (a cause shown against an older run)."""
        now = utcnow()
        row = RegressionRow(
            alert_id=self.alert_id(), kernel=self.run.kernel, matrix=self.run.matrix,
            device=self.run.device_kind, case_id=found.case_id, case_name=found.name,
            output="", kind=found.kind, state="detected", created_at=now, updated_at=now,
            changed_by="scan", detail=found.detail, outputs=found.outputs,
            properties=found.properties, first_bad_run=self.run.id,
            first_bad_commit=self.run.kernel_commit,
        )  # fmt: skip
        row.last_good_run, row.last_good_commit = good or _good_of(self.base)
        self.session.add(row)
        self.session.flush()
        note = found.detail if note is None else f"{note}: {found.detail}"
        record_event(self.session, row, "detected", "scan", self.run.id, note, new=True)
        self.touched = True
        return plain(row)

    def reopen(self, row: RegressionRow) -> Regression:
        """A regression set fixed by hand whose case no run has passed since, failing here:
        the same cause, still there. It stays in its alert with its first bad run, detail and
        links; an event says where it failed again."""
        by = row.changed_by or "a person"
        note = f"still failing in run {self.run.id} (set fixed by {by}; no run passed it since)"
        record_event(self.session, row, "detected", "scan", self.run.id, note)
        row.state, row.fixed_run, row.changed_by = "detected", None, "scan"
        row.updated_at = utcnow()
        self.session.flush()
        return plain(row)


def _fixed_by_a_run(row: RegressionRow) -> bool:
    """A fixed regression whose case a later run passed: its cause is gone, and a new failure
    of the case is a new regression."""
    return row.state == "fixed" and row.fixed_run is not None


def _close_fixed(
    session: Session,
    run: RunInfo,
    results: list[CaseResult],
    rows: list[RegressionRow],
    options: DiffOptions,
) -> tuple[list[Regression], list[Regression]]:
    """(fixed, still there) among ``rows`` (open ones, and ones set fixed by hand that no run
    has passed yet) whose case ``run`` holds: fixed when the case passed and comparing the
    regression's last good run with ``run`` no longer flags it. A row set fixed by hand only
    gets its ``fixed_run`` (and an event), and is in neither list."""
    outcome = {r.case.id: r.outcome for r in results}
    by_good: dict[int | None, list[RegressionRow]] = {}
    for row in rows:
        if row.case_id in outcome:
            by_good.setdefault(row.last_good_run, []).append(row)
    fixed: list[Regression] = []
    still: list[Regression] = []
    for good_id, group in by_good.items():
        flagged: set[tuple[str, str]] = set()
        if any(outcome[row.case_id] == "passed" for row in group):
            good = resolve_run(session, good_id) if good_id is not None else None
            flagged = flagged_keys(compare_against(session, good, run, results, options))
        for row in group:
            if outcome[row.case_id] != "passed" or (row.case_id, row.kind) in flagged:
                if row.state != "fixed":
                    still.append(plain(row))
                continue
            record_event(session, row, "fixed", "scan", run.id, f"passed in run {run.id}")
            row.fixed_run, row.updated_at = run.id, utcnow()
            if row.state != "fixed":  # (one set fixed by hand keeps who did it)
                row.state, row.changed_by = "fixed", "scan"
                fixed.append(plain(row))
    session.flush()
    return fixed, still


def _still_bad(
    session: Session,
    run: RunInfo,
    results: list[CaseResult],
    rows: list[RegressionRow],
    options: DiffOptions,
    work: _Scan,
) -> tuple[list[Regression], list[Regression]]:
    """(reopened, new): fixed regressions this run does not flag against its baseline (bad
    too) compared with their own last good run: those set fixed by hand (no run passed them
    since), and those a run fixed whose case fails here. One set fixed by hand that still
    shows is reopened; one a run had fixed that shows again is a new regression, against the
    same last good run. Cases the machine failed to judge here are left alone."""
    outcome = {r.case.id: r for r in results}
    by_good: dict[int | None, list[RegressionRow]] = {}
    for row in rows:
        result = outcome.get(row.case_id)
        if result is None or infrastructure_cause(result) is not None:
            continue
        if not _fixed_by_a_run(row) or result.outcome in BAD_OUTCOMES:
            by_good.setdefault(row.last_good_run, []).append(row)
    reopened, new = [], []
    for good_id, group in by_good.items():
        good = resolve_run(session, good_id) if good_id is not None else None
        good_results = load_results(session, good_id) if good_id is not None else []
        compared = compare_against(session, good, run, results, options)
        again = findings(compared, by_id(results), by_id(good_results))
        for row in group:
            found = again.get((row.case_id, row.kind))
            if found is None:
                continue
            if _fixed_by_a_run(row):
                note = f"failing again after run {row.fixed_run} fixed regression {row.id}"
                new.append(work.insert(found, (row.last_good_run, row.last_good_commit), note))
            else:
                reopened.append(work.reopen(row))
    return reopened, new


def _file(
    scan: ScanResult,
    work: _Scan,
    found: Mapping[tuple[str, str], Finding],
    known: Mapping[tuple[str, str], RegressionRow],
) -> None:
    """Each finding against the newest regression of its case and kind: new, reopened or
    kept (see the module's text)."""
    for key, finding in sorted(found.items()):
        row = known.get(key)
        if row is None or _fixed_by_a_run(row):
            scan.new.append(work.insert(finding))
        elif row.state == "fixed":
            scan.reopened.append(work.reopen(row))
        else:
            scan.kept.append(plain(row))


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
    found = findings(compared, by_id(results), by_id(base_results))
    scan = ScanResult(run.id, base.id if base else None, compared=compared)
    scan.infrastructure = infrastructure(results)
    known, shadowed = _lineage_rows(session, run)
    work = _Scan(session, run, base)
    _file(scan, work, found, known)
    unflagged = [
        row for key, row in known.items() if key not in found and row.first_bad_run != run.id
        and (row.state != "fixed" or row.fixed_run is None)
    ]  # fmt: skip
    unflagged += [r for r in shadowed if (r.case_id, r.kind) not in found]
    scan.fixed, still = _close_fixed(session, run, results, unflagged, options)
    scan.kept += still
    closed = [row for key, row in known.items() if row.state == "fixed" and key not in found]
    reopened, new = _still_bad(session, run, results, closed, options, work)
    scan.reopened += reopened
    scan.new += new
    if work.alert is not None:
        scan.alert_id = work.alert.id
        if work.touched:
            refresh_explanation(session, work.alert, results, run.geometry)
        scan.explanation = [e["text"] for e in work.alert.explanation or []]
    return scan


def file_findings(
    session: Session, run: RunInfo, found: list[Finding], note: str
) -> list[Regression]:
    """Regressions of ``found`` (what a confirmation rerun showed of cases the machine had
    failed to judge in ``run``) inserted into ``run``'s alert against its baseline, unless
    the case already has an open one; the alert's explanation is computed again."""
    base = baseline_run(session, run)
    known, _ = _lineage_rows(session, run)
    work = _Scan(session, run, base)
    filed = []
    for finding in found:
        row = known.get(finding.key)
        if row is None or _fixed_by_a_run(row):
            filed.append(work.insert(finding, note=note))
    if work.alert is not None and work.touched:
        results = load_results(session, run.id)
        refresh_explanation(session, work.alert, results, run.geometry)
    return filed


def by_id(results: list[CaseResult]) -> Mapping[str, CaseResult]:
    """Results by case id."""
    return {r.case.id: r for r in results}
