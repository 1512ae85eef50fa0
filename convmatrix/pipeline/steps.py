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

from convmatrix.core.errors import NotJudgedError
from convmatrix.db.database import Database
from convmatrix.db.run_store import DatabaseStore
from convmatrix.reports.publish import write_run_report
from convmatrix.runners.executors import Executor, make_executor
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.account import UNJUDGED_BAD, RunAccount, exit_status
from convmatrix.runners.run.controller import Setup
from convmatrix.runners.run.store import MemoryStore, RunStore, Shard
from convmatrix.service.ci import RunProblem, write_junit
from convmatrix.service.ci_report import CiOutputs, Found, write_ci_outputs
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
    shard: Shard | None = None  # this session ran one shard: it answers for its own cases

    @property
    def new_regressions(self) -> list[Regression]:
        """The regressions this run raised (new and reopened), less those a rerun found
        flaky, plus the cases the machine had not judged that its rerun reproduced (a shard's:
        of its own cases)."""
        if self.scan is None:
            return []
        flaky = {r.id for r in self.confirmation.flaky} if self.confirmation else set()
        reproduced = self.confirmation.reproduced if self.confirmation else []
        return [
            r for r in [*self.scan.alerting, *reproduced]
            if r.id not in flaky and (self.shard is None or self.shard.owns(r.case_id))
        ]  # fmt: skip

    @property
    def exit_code(self) -> int:
        """The run's (``runners.run.account.exit_status``: 0, 1, 3, 4, 130); with ``--fail-on
        new-regressions`` 1 only for a new regression (or a run that stopped early)."""
        return exit_status(self.account, self.fail_on, len(self.new_regressions))


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
    shard = state.options.sharding
    state.end = RunEnd(account, fail_on=tuple(state.options.fail_on), shard=shard)


def scan(state: RunState) -> None:
    """Compare the run with its baseline: new regressions inserted, fixed ones closed. Not a
    run that judged nothing (its skips would look like a kernel's new state), unless
    ``--confirm`` may yet judge it (its unjudged cases include the machine's: a timeout
    under load; the scan lists them for the rerun, and finds nothing else in a run without
    verdicts); nor a sharded run before its last shard reported (half a run is not the run:
    that shard scans it)."""
    if state.database is None or state.run_id is None or not state.options.scan:
        return
    end = state.end
    assert end is not None
    account = end.account
    rerunnable = state.options.confirm and any(account.own.get(o) for o in UNJUDGED_BAD)
    if account.exit_code == NotJudgedError.exit_code and not rerunnable:
        end.scan = ScanResult(state.run_id, None, skipped="nothing judged")
    elif account.shard and account.run_status != "finished":
        why = f"shard {account.shard}: the run is not whole yet; its last shard scans it"
        end.scan = ScanResult(state.run_id, None, skipped=why)
    else:
        with state.database.writing() as session:
            end.scan = scan_run(session, state.run_id)


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
    """JUnit XML (``--junit``) and the CI job summary (``--summary``, GitHub's by default)
    of the run, or of this shard's cases (``service.ci_report``)."""
    options, end = state.options, state.end
    if (options.junit is None and options.summary is None) or state.run_id is None:
        return
    assert state.database is not None and end is not None
    outputs = _outputs(options)
    found = Found.of_scan(end.scan, end.new_regressions)
    written = write_ci_outputs(
        state.database, state.run_id, outputs, shard=end.shard, account=end.account, found=found
    )
    end.junit, end.summary = written.junit, written.summary


def _outputs(options: RunOptions) -> CiOutputs:
    return CiOutputs(options.junit, options.summary, options.base_url, options.min_judged,
                     tuple(options.fail_on))  # fmt: skip


def not_loaded(options: RunOptions, error: NotJudgedError) -> None:
    """A kernel that could not be loaded judged nothing: its JUnit holds one ``error``
    testcase saying so (never a pass, nor nothing at all), the summary its line."""
    problem = RunProblem("nothing-judged", str(error))
    name = f"{options.kernel or 'kernel'} (not recorded)"
    if options.junit is not None:
        write_junit(options.junit, name, [], [problem])
    if options.summary is not None:
        options.summary.parent.mkdir(parents=True, exist_ok=True)
        with options.summary.open("a", encoding="utf-8") as out:
            out.write(f"## convmatrix: {name} NOTHING JUDGED\n\n**{problem.message}**\n")


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
    except NotJudgedError as error:  # the kernel did not load: say so where CI looks
        not_loaded(options, error)
        raise
    finally:
        if owned and database is not None:
            database.close()
    assert state.end is not None
    return state.end
