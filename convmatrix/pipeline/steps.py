"""The steps of a run and the state they pass along (``pipeline.run`` puts them in order).

Each step is a function of the run's ``RunState`` that reads what the steps before it left
there and adds its own part; a step with nothing to do (no database, no ``--report``) passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convmatrix.db.database import Database
from convmatrix.db.queries import load_results, resolve_run
from convmatrix.db.run_store import DatabaseStore
from convmatrix.reports.publish import write_run_report
from convmatrix.reports.viewmodel import run_header
from convmatrix.runners.account import RunAccount
from convmatrix.runners.controller import Setup
from convmatrix.runners.executors import Executor, make_executor
from convmatrix.runners.options import RunOptions
from convmatrix.runners.store import MemoryStore, RunStore
from convmatrix.service.ci import JobSummary, job_summary_markdown, write_junit
from convmatrix.service.confirm import Confirmation
from convmatrix.service.regressions import Regression
from convmatrix.service.scan import ScanResult, scan_run

__all__ = [
    "RunEnd",
    "RunState",
    "Step",
    "ci_outputs",
    "execute",
    "prepare",
    "report",
    "scan",
    "walk",
]


@dataclass
class RunEnd:
    """What a run ended with, after every step: its account, and what the steps after the
    execution found or wrote (None: that step had nothing to do)."""

    account: RunAccount
    scan: ScanResult | None = None
    confirmation: Confirmation | None = None
    shrunk: list[Any] = field(default_factory=list)  # pipeline.shrink.Shrunk, --shrink
    report: Path | None = None
    junit: Path | None = None
    summary: Path | None = None
    fail_on: tuple[str, ...] = ()

    @property
    def new_regressions(self) -> list[Regression]:
        """The regressions this run raised (new and reopened), less those a rerun found
        flaky, plus the cases the machine had not judged that its rerun reproduced."""
        if self.scan is None:
            return []
        flaky = {r.id for r in self.confirmation.flaky} if self.confirmation else set()
        reproduced = self.confirmation.reproduced if self.confirmation else []
        return [r for r in self.scan.alerting if r.id not in flaky] + reproduced

    @property
    def exit_code(self) -> int:
        """The run's (0, 1, 3, 130); with ``--fail-on new-regressions`` 1 only for a new
        regression (or a run that stopped early), so a failure already known passes CI; an
        infrastructure failure (3) stays 3."""
        code = self.account.exit_code
        if "new-regressions" not in self.fail_on:
            return code
        if self.account.status != "finished" or code == 130:
            return code or 1
        return 1 if self.new_regressions else 0


@dataclass
class RunState:
    """One run going through the steps."""

    options: RunOptions  # checked
    database: Database | None  # None: --no-db
    executor: Executor
    setup: Setup | None = None
    end: RunEnd | None = None
    steps_done: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> int | None:
        """The recorded run, for the steps after the execution: None when nothing was
        recorded, or when the database failed under the run (its results are in the run's
        journal: nothing to scan, report or export until ``--resume`` replays it)."""
        if self.end is None or self.end.account.infrastructure:
            return None
        return self.end.account.run_id


def prepare(state: RunState) -> None:
    """Resolve the options (kernel, matrix, device, cases, ``--resume``) and open the run's
    store; a bad kernel or matrix stops here with a usage error."""
    store: RunStore = MemoryStore() if state.database is None else DatabaseStore(state.database)
    state.setup = Setup.of(state.options, store)


def execute(state: RunState) -> None:
    """Run every selected case on the executor; the controller records each result once as
    it arrives and closes the run into its account."""
    assert state.setup is not None
    cache = state.setup.prepared.cache()  # says what the reference cache keeps, and damage
    with cache.watching() if cache is not None else contextlib.nullcontext():
        account = state.executor.run(state.setup)
    state.end = RunEnd(account, fail_on=tuple(state.options.fail_on))


def scan(state: RunState) -> None:
    """Compare the run with its baseline: new regressions inserted, fixed ones closed."""
    if state.database is None or state.run_id is None or not state.options.scan:
        return
    assert state.end is not None
    with state.database.writing() as session:
        state.end.scan = scan_run(session, state.run_id)


def report(state: RunState) -> None:
    """Write the run's HTML report and its JSON (``--report DIR``)."""
    if state.options.report is None or state.database is None or state.run_id is None:
        return
    assert state.end is not None
    with state.database.reading() as session:
        state.end.report = write_run_report(
            session, state.run_id, state.database.url, state.options.report
        ).html


def ci_outputs(state: RunState) -> None:
    """JUnit XML (``--junit``) and the CI job summary (``--summary``, GitHub's by default)."""
    options, end = state.options, state.end
    if (options.junit is None and options.summary is None) or state.run_id is None:
        return
    assert state.database is not None and end is not None
    with state.database.reading() as session:
        results = load_results(session, state.run_id)
        header = run_header(resolve_run(session, state.run_id), state.database.url, results)
    if options.junit is not None:
        end.junit = write_junit(options.junit, header.title, results)
    if options.summary is not None:
        scan = end.scan
        summary = JobSummary(
            state.run_id, header.title, header.counts, results, recorded=scan is not None,
            baseline_id=scan.baseline_id if scan else None,
            alert_id=scan.alert_id if scan else None, raised=end.new_regressions,
            known=len(scan.kept) if scan else 0, fixed=len(scan.fixed) if scan else 0,
            explanation=scan.explanation if scan else [],
        )  # fmt: skip
        text = job_summary_markdown(summary, base_url=options.base_url)
        options.summary.parent.mkdir(parents=True, exist_ok=True)
        with options.summary.open("a", encoding="utf-8") as out:  # GitHub appends steps
            out.write(text)
        end.summary = options.summary


Step = Callable[[RunState], None]


def walk(
    options: RunOptions, database: Database | None, steps: Sequence[tuple[str, Step]]
) -> RunEnd:
    """Check ``options`` and take the run through ``steps`` in order. ``database``: an open
    one to record into; else the options' own, opened here (lazily) and closed after."""
    options = options.checked()
    executor = make_executor(options.executor, verbose=options.verbose, address=options.address)
    owned = database is None and not options.no_db
    if owned:
        database = Database(options.db, existing=bool(options.resume))
    state = RunState(options, None if options.no_db else database, executor)
    try:
        for name, step in steps:
            step(state)
            state.steps_done.append(name)
    finally:
        if owned and database is not None:
            database.close()
    assert state.end is not None
    return state.end
