"""The CI outputs of a recorded run, or of one shard of it, read back from the database.

Two doors write them: the run pipeline's last step (``pipeline.steps.ci_outputs``: the run
just recorded, or this shard's part of it) and ``convmatrix ci-report RUN`` (the whole run,
once every shard has reported). Both go through ``write_ci_outputs``, so a shard's JUnit and
the merged one are the same document over different cases:

- **A shard answers for its own cases.** Its JUnit and summary hold the cases it owns
  (``Shard.owns``: by case id, so a shard retried by CI still lists what its first attempt
  recorded), and say where the whole run's outputs come from. It never scans a half run
  (the pipeline's scan waits for the run to be whole: the last shard to report scans it).
- **The whole run once it is whole.** ``ci-report`` reads every result of the run and the
  regressions its scan raised (the run's alert), and names the shards that never reported:
  an ``error`` testcase and the summary's first line, exit 1.
- **Nothing judged is no pass**: the run's ``RunAccount`` (rebuilt from what is stored for
  ``ci-report``) says so, and that line becomes an ``error`` testcase too (exit 4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convmatrix.core.records import OUTCOMES, CaseResult
from convmatrix.db.alert_queries import alert_of_run
from convmatrix.db.database import Database
from convmatrix.db.queries import RunInfo, load_results, missing_shards, resolve_run
from convmatrix.db.regression_queries import count_fixed_by
from convmatrix.reports.viewmodel import run_header
from convmatrix.runners.run.account import DEFAULT_MIN_JUDGED, RunAccount, exit_status, skip_reasons
from convmatrix.runners.run.store import Shard
from convmatrix.service.ci import JobSummary, RunProblem, job_summary_markdown, write_junit
from convmatrix.service.regressions import Regression, list_regressions
from convmatrix.service.scan import ScanResult, baseline_run

__all__ = ["CiOutputs", "CiWritten", "Found", "append_summary", "ci_report", "write_ci_outputs"]


@dataclass(frozen=True)
class CiOutputs:
    """Where the outputs go (None: not asked for) and how they judge."""

    junit: Path | None = None
    summary: Path | None = None  # appended to (GitHub's step summary takes every step's)
    base_url: str | None = None
    min_judged: float = DEFAULT_MIN_JUDGED
    fail_on: tuple[str, ...] = ()


@dataclass
class Found:
    """What the run's scan found, as the summary shows it (``scanned`` False: not scanned)."""

    scanned: bool = False
    baseline_id: int | None = None
    alert_id: int | None = None
    raised: list[Regression] = field(default_factory=list)  # new and reopened, less flaky
    known: int = 0  # open regressions the run still shows
    fixed: int = 0
    explanation: list[str] = field(default_factory=list)

    @classmethod
    def of_scan(cls, scan: ScanResult | None, raised: list[Regression]) -> Found:
        """From the scan the pipeline just ran (``raised``: its regressions less flaky)."""
        if scan is None or scan.skipped:
            return cls()
        return cls(True, scan.baseline_id, scan.alert_id, raised, len(scan.kept),
                   len(scan.fixed), list(scan.explanation))  # fmt: skip


@dataclass
class CiWritten:
    """What ``write_ci_outputs`` wrote and the exit status its account gives."""

    account: RunAccount
    exit_code: int
    junit: Path | None = None
    summary: Path | None = None
    missing: list[str] = field(default_factory=list)  # shards that never reported


def _stored_found(database: Database, run: RunInfo, failing: set[str]) -> Found:
    """The run's scan as the database keeps it: its alert's regressions (the ones it raised),
    those it fixed, and the open ones of its lineage its failing cases still show."""
    with database.session() as session:
        alert = alert_of_run(session, run.id)
        fixed = count_fixed_by(session, run.id)
        raised = list_regressions(session, alert_ids=[alert.id]) if alert else []
        lineage = list_regressions(session, kernel=run.kernel, case_id=None)
        base = baseline_run(session, run) if alert is None else None
    raised = [r for r in raised if r.state != "flaky"]
    named = {r.id for r in raised}
    known = [
        r for r in lineage
        if r.id not in named and r.state not in ("fixed", "flaky") and r.case_id in failing
        and (r.matrix, r.device) == (run.matrix, run.device_kind)
    ]  # fmt: skip
    explanation = [e.get("text", "") for e in (alert.explanation or [])] if alert else []
    baseline = alert.baseline_run if alert else (base.id if base else None)
    return Found(True, baseline, alert.id if alert else None, raised, len(known), fixed or 0,
                 explanation)  # fmt: skip


def _account(run: RunInfo, results: Sequence[CaseResult], min_judged: float) -> RunAccount:
    """The whole run as stored, judged as a run judges itself at its end."""
    counts = dict.fromkeys(OUTCOMES, 0) | Counter(r.outcome for r in results)
    return RunAccount(
        run_id=run.id, status=run.status, counts=counts, session=counts,
        planned=run.n_planned or len(results), min_judged=min_judged,
        skipped=skip_reasons(results),
    )  # fmt: skip


def write_ci_outputs(
    database: Database,
    run_id: int,
    outputs: CiOutputs,
    *,
    shard: Shard | None = None,
    account: RunAccount | None = None,
    found: Found | None = None,
) -> CiWritten:
    """Write the JUnit XML and the job summary of run ``run_id`` (of its ``shard`` only:
    that shard's cases). ``account`` and ``found``: the run's as the pipeline holds them;
    else rebuilt from the database (``ci-report``)."""
    with database.reading() as conn:
        run = resolve_run(conn, run_id)
        results = load_results(conn, run_id)
        missing = [] if shard else missing_shards(conn, run_id, run.shard_count)
    if shard is not None:
        results = [r for r in results if shard.owns(r.case.id)]
    if account is None:
        account = _account(run, results, outputs.min_judged)
        account.missing_shards = missing
    if found is None:  # scanned: a plain run, whole, that judged enough (pipeline.steps.scan)
        scanned = run.kind == "run" and not missing and account.not_judged is None
        failing = {r.case.id for r in results if r.outcome != "passed"}
        found = _stored_found(database, run, failing) if scanned else Found()
    raised = [r for r in found.raised if shard is None or shard.owns(r.case_id)]
    header = run_header(run, database.url, results, missing)
    problems = _problems(account, missing)
    written = CiWritten(
        account, exit_status(account, outputs.fail_on, len(raised)), missing=missing
    )
    title = header.title if shard is None else f"{header.title}, shard {shard}"
    if outputs.junit is not None:
        written.junit = write_junit(outputs.junit, title, results, problems)
    if outputs.summary is not None:
        summary = JobSummary(
            run.id, title, header.counts, results, recorded=found.scanned,
            baseline_id=found.baseline_id, alert_id=found.alert_id, raised=raised,
            known=found.known, fixed=found.fixed, explanation=found.explanation,
            problems=problems, skipped=skip_reasons(results), scope=_scope(shard),
        )  # fmt: skip
        written.summary = append_summary(outputs.summary, summary, outputs.base_url)
    return written


def append_summary(path: Path, summary: JobSummary, base_url: str | None) -> Path:
    """Append the summary's markdown to ``path`` (GitHub's step summary takes every step's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(job_summary_markdown(summary, base_url=base_url))
    return path


def _problems(account: RunAccount, missing: Iterable[str]) -> list[RunProblem]:
    problems = []
    if account.not_judged:
        problems.append(RunProblem("nothing-judged", account.not_judged))
    missing = list(missing)
    if missing:
        problems.append(RunProblem("shards-missing", f"shard(s) missing: {', '.join(missing)}"))
    return problems


def _scope(shard: Shard | None) -> str | None:
    if shard is None:
        return None
    return (
        f"Shard {shard}: this shard's cases only. The whole run: `convmatrix ci-report "
        f"{shard.label}` once every shard has reported."
    )


def ci_report(database: Database, run: str, outputs: CiOutputs) -> CiWritten:
    """``convmatrix ci-report RUN``: the whole run's JUnit and summary, its shards missing
    named; the exit status is the run's (1 with shards missing)."""
    with database.reading() as conn:
        run_id = resolve_run(conn, run).id
    return write_ci_outputs(database, run_id, outputs)
