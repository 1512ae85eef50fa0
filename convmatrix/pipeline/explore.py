"""``convmatrix explore``: the search of ``search.explore`` on the run's own executors and database.

Every round is written as a matrix of explicit cases (``search.space.matrix_text``) and run
by ``pipeline.run.run``, the whole of ``convmatrix run``: the same executors (xdist or Ray),
runner, verdict and database. Each round is a recorded run of kind ``explore``, labelled
``explore:<kernel>:<seed>:<round>`` and never scanned: like confirm and bisect runs, explore
runs are no baseline, no ``latest`` and no history point, so a search never pollutes the
nightly history. A failure is shrunk by a ``search.probe.Probe`` built from the first
round's matrix (the same tolerances, policy, timeout and memory budget), each candidate run
in the isolated child process the Ray executor uses (a crashing kernel ends no search).

The budget bounds each round (``round_limits``): with workers, each case's time limit is the
budget left (a hung case becomes a ``timeout`` failure) and the round is cut a grace after
the budget's end (worker start-up); in one process (``-n 0``) a timeout would end this very
process (``runners.executors.xdist.watchdog``), so the round is cut at the budget's end, the case
in flight with it. SIGINT and SIGTERM end the search within seconds (``search.stop``). Whatever ends
it, the findings so far are written to ``out``, after every round that found a failure too
(a process killed outright keeps them), and an infrastructure fault (no thread or process
to start, the database failing) is an ``InfrastructureError`` in the report (exit 3).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from convmatrix.core.case import Case
from convmatrix.core.errors import InfrastructureError
from convmatrix.core.records import BAD_OUTCOMES
from convmatrix.db.database import Database
from convmatrix.db.queries import load_results, newest_run_id
from convmatrix.matrix.build import MAX_ELEMENTS
from convmatrix.pipeline.run import run
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import load_kernel
from convmatrix.search.explore import (
    ExploreProgress,
    ExploreReport,
    ExploreSettings,
    RoundResult,
    explore,
    findings_matrix,
)
from convmatrix.search.probe import signature_of
from convmatrix.search.space import CaseSpace, Drawn, matrix_text
from convmatrix.search.stop import Stopping, stoppable

__all__ = [
    "ExploreOptions",
    "explore_kernel",
    "round_limits",
    "round_matrix_settings",
    "write_findings",
]

GRACE_S = 10.0  # past the budget, for workers to start and record a case cut at its end
IN_PROCESS_MARGIN_S = 5.0  # -n 0: the case limit past the round's cut, so the cut comes first
# What the machine ran out of: no thread, process, file or memory to start the next round.
_EXHAUSTED = {errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC}


@dataclass(frozen=True)
class ExploreOptions:
    """``convmatrix explore``'s options: the kernel and executor as ``run`` takes them, the
    search's budget, and where its findings go (``out``: a matrix file)."""

    kernel: str
    settings: ExploreSettings
    max_elements: int = 1 << 20
    device: str = "auto"
    workers: int | str = "auto"
    executor: str = "xdist"
    address: str | None = None
    db: str | None = None
    out: Path | None = None
    shrink: bool = True


def round_matrix_settings(max_elements: int) -> dict[str, float]:
    """Per-case timeout and memory budget for cases up to ``max_elements``: the defaults
    (120 s, 8 GiB) are a matrix author's for small cases; a 5e7-element fwd_bwd case takes
    minutes on a CPU core and its float64 reference and guards about 200 bytes an element."""
    return {
        "timeout_s": max(120.0, 2e-5 * max_elements),
        "memory_budget_mb": max(8192.0, 200.0 * max_elements / 2**20),
    }


def round_limits(
    max_elements: int, left_s: float, budget_s: float, in_process: bool
) -> tuple[float, float]:
    """(each case's time limit, seconds until the round is cut) for a round starting with
    ``left_s`` of the budget left. With workers a case may take the budget left at most
    (a hung case is a ``timeout`` failure) and the round is cut a grace later (its workers'
    start-up: up to 10 s and 10% of the budget, at most a minute). In one process the round
    is cut at the budget's end and no case limit comes before it: a timeout there ends the
    process itself."""
    limit = round_matrix_settings(max_elements)["timeout_s"]
    if in_process:
        return left_s + IN_PROCESS_MARGIN_S, left_s
    return min(limit, max(left_s, 1.0)), left_s + min(60.0, GRACE_S + 0.1 * budget_s)


@contextlib.contextmanager
def _faults(what: str) -> Iterator[None]:
    """The machine or the database failing under ``what``: an ``InfrastructureError``, also
    when a layer below said so in its own words (a ``UsageError`` "cannot use database"
    raised from the driver's error: the database served the rounds before this one)."""
    try:
        yield
    except InfrastructureError:
        raise
    except Exception as exc:
        reason = _fault(exc)
        if reason is None:
            raise
        raise InfrastructureError(f"{what}: {reason}") from exc


def _fault(exc: BaseException) -> str | None:
    """One line saying what failed when ``exc``, or an exception behind it, is a fault of
    the machine (no thread, process, file or memory left) or of the database; else None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SQLAlchemyError):
            cause = str(getattr(seen, "orig", None) or seen).strip().splitlines()[0]
            return str(exc) if exc is not seen else f"database failure: {cause}"
        if isinstance(seen, RuntimeError) and "can't start new thread" in str(seen):
            return f"{seen} (no thread left to start)"
        if isinstance(seen, OSError) and seen.errno in _EXHAUSTED:
            return str(seen)
        seen = seen.__cause__
    return None


class _Rounds:
    """The round runner: each round a matrix file in ``folder`` and one recorded run."""

    def __init__(
        self, options: ExploreOptions, database: Database, folder: Path, stopping: Stopping
    ) -> None:
        self.options, self.database, self.folder = options, database, folder
        self.stopping = stopping
        self.first: Path | None = None

    def _matrix(self, number: int, drawn: Sequence[Drawn], timeout_s: float) -> Path:
        o = self.options
        name = f"explore-round-{number}"
        path = self.folder / f"{name}.yaml"
        settings = {**round_matrix_settings(o.max_elements), "timeout_s": timeout_s}
        text = matrix_text(
            [(d.op, d.entry) for d in drawn], name,
            description=f"explore --kernel {o.kernel} --seed {o.settings.seed}, round {number}",
            **settings,
        )  # fmt: skip
        path.write_text(text, encoding="utf-8")
        self.first = self.first or path
        return path

    def __call__(self, number: int, drawn: Sequence[Drawn], left_s: float) -> RoundResult:
        o = self.options
        in_process = str(o.workers) == "0"
        timeout_s, cut_s = round_limits(o.max_elements, left_s, o.settings.budget_s, in_process)
        label = f"explore:{o.kernel}:{o.settings.seed}:{number}"
        options = RunOptions(
            matrix=str(self._matrix(number, drawn, timeout_s)), kernel=o.kernel,
            device=o.device, workers=o.workers, db=self.database.url, executor=o.executor,
            address=o.address, label=label, kind="explore", scan=False,
            reference_cache="off",  # drawn cases hardly repeat: hashing big ones costs
        )  # fmt: skip
        output = io.StringIO()
        run_id = None
        with _faults(f"round {number}"):
            newest = self._newest()
            try:
                with self.stopping.alarm(cut_s), contextlib.redirect_stdout(output):
                    end = run(options, self.database)  # the progress line is the output
                run_id = end.account.run_id
                if end.account.infrastructure:
                    raise InfrastructureError(f"round {number}: {end.account.infrastructure}")
            except (KeyboardInterrupt, InfrastructureError):
                # A signal or the budget's end outside pytest's session, or one that ended
                # the session before it recorded anything (the executor's "run ended before
                # it was recorded"): the round is cut, nothing failed.
                if self.stopping.signum is None and not self.stopping.budget_spent:
                    raise
            self.stopping.settle()  # whatever stopped the round was taken
            _internal_error(number, output.getvalue())
            return self._result(run_id or self._labelled(label, newest))

    def _newest(self) -> int:
        with self.database.reading() as session:
            return newest_run_id(session) or 0

    def _labelled(self, label: str, newest: int) -> int | None:
        """The run of ``label`` this round recorded, if it did (a round cut outside its
        session has no account): one newer than ``newest``, so never an earlier search's
        round of the same kernel and seed."""
        with self.database.reading() as session:
            return newest_run_id(session, label=label, after=newest)

    def _result(self, run_id: int | None) -> RoundResult:
        failures: dict[str, str] = {}
        judged: set[str] = set()
        seconds = 0.0
        if run_id is not None:
            with self.database.reading() as session:
                for result in load_results(session, run_id):
                    judged.add(result.case.id)
                    seconds += result.duration_s
                    if result.outcome in BAD_OUTCOMES:
                        failures[result.case.id] = signature_of(result)
        stop = self.stopping
        return RoundResult(
            run_id, failures, seconds, frozenset(judged),
            cut=stop.budget_spent, interrupted=stop.signum is not None,
        )  # fmt: skip


def _internal_error(number: int, output: str) -> None:
    """pytest's INTERNALERROR (a thread or process that could not start) ends its session
    with a run that merely looks cut short: an infrastructure failure, named by its last
    line."""
    lines = [line for line in output.splitlines() if line.startswith("INTERNALERROR>")]
    if lines:
        raise InfrastructureError(f"round {number}: the executor failed: {lines[-1][14:].strip()}")


class _Shrinker:
    """``shrink(case, seconds)`` on a probe made once, on the first call (no failure: no
    probe), candidates in an isolated child. Within ``seconds``: no candidate's limit is
    longer, and the shrink is cut then (``BudgetSpent``: it keeps the smallest case so far)."""

    def __init__(self, options: ExploreOptions, rounds: _Rounds, stopping: Stopping) -> None:
        self.options, self.rounds, self.stopping = options, rounds, stopping
        self.probe: Any = None  # search.probe.Probe
        self.limit_s: float | None = None  # the round matrix's own case limit

    def __call__(self, case: Case, seconds: float) -> Any:
        from convmatrix.search.probe import Probe
        from convmatrix.search.shrink import shrink

        with self.stopping.alarm(seconds):
            if self.probe is None:
                run_options = RunOptions(
                    matrix=str(self.rounds.first), kernel=self.options.kernel,
                    device=self.options.device, workers=0, no_db=True,
                )  # fmt: skip
                self.probe = Probe(run_options, isolate=True)
                self.limit_s = self.probe.timeout_s
            self.probe.timeout_s = min(self.limit_s or seconds, seconds)
            return shrink(case, self.probe, max_runs=self.options.settings.shrink_runs)

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()


def write_findings(report: ExploreReport, kernel: str, out: Path) -> None:
    """The findings as a matrix at ``out`` (nothing when there are none), replaced whole: a
    process killed while writing leaves the previous findings."""
    if not report.findings:
        return
    name = out.name.split(".")[0] or "explore"
    scratch = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_text(findings_matrix(report, kernel, name), encoding="utf-8")
        os.replace(scratch, out)
    except OSError as exc:
        raise InfrastructureError(f"--out {out}: {exc.strerror or exc}") from exc


def explore_kernel(
    options: ExploreOptions, on_progress: Callable[[ExploreProgress], None] | None = None
) -> ExploreReport:
    """Search ``options.kernel`` within the budget; write the findings' matrix to
    ``options.out`` when there are any, also when a signal or a fault ended the search early
    (the report says which). ``ValueError``/``UsageError`` for bad options."""
    if not 1 <= options.max_elements <= MAX_ELEMENTS:
        raise ValueError(f"max_elements must be in [1, {MAX_ELEMENTS}]")
    kernel = load_kernel(options.kernel)
    space = CaseSpace(kernel, options.max_elements)
    out = options.out

    def keep(report: ExploreReport) -> None:
        if out is not None:
            write_findings(report, options.kernel, out)

    with (
        stoppable() as stopping,
        Database(options.db) as database,
        tempfile.TemporaryDirectory(prefix="convmatrix-explore-") as scratch,
    ):
        stopping.forward = options.executor == "xdist"
        rounds = _Rounds(options, database, Path(scratch), stopping)
        shrink = _Shrinker(options, rounds, stopping) if options.shrink else None
        try:
            report = explore(
                space, rounds, options.settings, shrink=shrink, on_progress=on_progress,
                on_round=keep,
            )  # fmt: skip
        finally:
            stopping.settle()
            if shrink is not None:
                shrink.close()
        report.signal = stopping.signal_name
        keep(report)
    return report
