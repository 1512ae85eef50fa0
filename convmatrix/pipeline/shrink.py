"""``convmatrix shrink RUN CASE`` and ``run --shrink``: a stored failure shrunk and kept.

The case is read back from the run's results; the probe is the run's own (its kernel spec,
matrix, device, ``--policy`` rule and reference device, as the run recorded them), each
candidate in the isolated child process the Ray executor uses, so a crashing kernel ends no
shrink. What it found is kept three ways:

- a matrix file holding exactly the shrunk case (``search.space.matrix_text``: one suite
  named as the case's, its ``include:`` entry explicit), for ``convmatrix run --matrix``;
- a recorded run of kind ``shrink`` holding the shrunk case's result as the probe judged it
  (under the original matrix's policy; label ``shrink:<run>:<case>``; never a baseline), the
  shrink's path and boundaries in its options;
- an event on each open regression of the original case (same kernel, matrix and device),
  naming the shrunk case and its run.

It shrinks the kernel the run tested, or nothing: the kernel's checkout must stand at the
run's commit (``pipeline.checkout.recorded_code``, the check ``confirm`` makes); with
``--checkout`` the whole shrink runs as ``convmatrix shrink`` in a process importing the
kernel from a temporary worktree at that commit (``shrink_in_worktree``). SIGINT and SIGTERM
end the walk within a case (``search.stop``); the smallest case found so far is still
written, recorded and attached (``ShrinkResult.interrupted``: exit 130).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convmatrix.core.case import Case
from convmatrix.core.errors import InfrastructureError, UsageError
from convmatrix.core.recorded import FACTS, Recorded
from convmatrix.core.records import BAD_OUTCOMES, CaseResult
from convmatrix.db.database import Database
from convmatrix.db.engine import absolute_url
from convmatrix.db.models import RegressionRow
from convmatrix.db.queries import RunInfo, load_results, resolve_run
from convmatrix.db.run_store import DatabaseStore
from convmatrix.pipeline.checkout import recorded_code, worktree_env
from convmatrix.pipeline.steps import RunState
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import Controller, run_meta
from convmatrix.runners.run.workload import select_cases
from convmatrix.search.probe import Probe
from convmatrix.search.shrink import ShrinkResult, shrink
from convmatrix.search.space import case_entry, matrix_text
from convmatrix.search.stop import stoppable
from convmatrix.service.regressions import OPEN_STATES, list_regressions, record_event

__all__ = [
    "Shrunk",
    "probe_options",
    "shrink_in_worktree",
    "shrink_run_failures",
    "shrink_stored",
    "stored_failure",
]

BY = "convmatrix shrink"


@dataclass
class Shrunk:
    """One stored failure shrunk: the shrink, where it was written and recorded."""

    run_id: int
    result: ShrinkResult
    matrix: Path | None = None  # the matrix file of the shrunk case
    recorded_run: int | None = None  # the run of kind shrink holding its result
    regressions: list[int] = field(default_factory=list)  # open regressions it was attached to

    def lines(self, path: bool = False) -> list[str]:
        """What a terminal shows: the shrink in a line, its boundaries, where it was kept;
        with ``path`` every candidate judged on the way."""
        r = self.result
        budget = ", interrupted" if r.interrupted else ", budget spent" if r.exhausted else ""
        out = [f"shrunk {r.original.pytest_id} of run {self.run_id} in {r.runs} case runs"
               f"{budget}: {r.case.pytest_id} ({r.failure.signature})"]  # fmt: skip
        if path:
            out += [f"  {i}. {step.line()}" for i, step in enumerate(r.path, 1)]
        out += [f"  {line}" for line in r.boundary_lines()]
        if self.matrix is not None:
            out.append(f"  matrix: {self.matrix}")
        if self.recorded_run is not None:
            attached = ", ".join(f"#{i}" for i in self.regressions)
            out.append(f"  recorded as run {self.recorded_run}"
                       + (f"; attached to regression {attached}" if attached else ""))  # fmt: skip
        return out

    def to_json(self) -> dict[str, object]:
        return {
            **self.result.to_json(),
            "run": self.run_id,
            "matrix": None if self.matrix is None else str(self.matrix),
            "recorded_run": self.recorded_run,
            "regressions": self.regressions,
        }


def probe_options(run: RunInfo) -> RunOptions:
    """The options ``run`` was made with, as a probe takes them (no database of its own)."""
    return RunOptions.rerun(
        run.options,
        run.matrix,
        run.kernel,
        device=Recorded.of(run.options).device(run.device_kind),
        reference_cache="off",  # shrunk candidates hardly repeat
        workers=0,
        no_db=True,
    )


def _stored_case(results: Sequence[CaseResult], spec: str, run: RunInfo) -> CaseResult:
    by_id = {r.case.id: r for r in results}
    try:
        [case] = select_cases([r.case for r in results], [spec])
    except ValueError:
        raise UsageError(f"CASE {spec!r}: names several cases of run {run.id}") from None
    except UsageError:
        raise UsageError(f"CASE {spec!r}: no such case in run {run.id}") from None
    return by_id[case.id]


def stored_failure(
    database: Database, run_spec: str | int, case_spec: str
) -> tuple[RunInfo, CaseResult]:
    """The run ``run_spec`` names and its failing case ``case_spec``; a ``UsageError`` for
    no such run or case, or a case that did not fail."""
    with database.reading() as session:
        run = resolve_run(session, run_spec)
        stored = _stored_case(load_results(session, run.id), case_spec, run)
    if stored.outcome not in BAD_OUTCOMES:
        raise UsageError(f"case {stored.case.pytest_id} {stored.outcome} in run {run.id}: "
                         "only a failing case shrinks")  # fmt: skip
    return run, stored


def shrink_stored(
    database: Database,
    run_spec: str | int,
    case_spec: str,
    *,
    max_runs: int = 60,
    out: Path | None = None,
    isolate: bool = True,
    record: bool = True,
    here: bool = False,
) -> Shrunk:
    """Shrink case ``case_spec`` of run ``run_spec`` (id, ``latest``, label, commit) within
    ``max_runs`` case runs; write its matrix to ``out`` (None: nowhere), record it and attach
    it to the case's open regressions (``record``). Refused unless the kernel's checkout
    stands at the run's commit, or ``here`` (the run's own process: ``run --shrink``)."""
    if max_runs < 1:
        raise UsageError(f"--max-runs {max_runs}: at least 1")
    run, stored = stored_failure(database, run_spec, case_spec)
    options = probe_options(run)
    code = contextlib.nullcontext() if here else recorded_code(
        run, str(options.kernel), "shrink", checkout=False
    )  # fmt: skip
    # The isolated child rebuilds the run from its matrix: a run of cases given to pytest
    # as files has none, and runs its candidates in this process.
    with code, stoppable(), Probe(options, isolate=isolate and bool(options.matrix)) as probe:
        result = shrink(stored.case, probe, max_runs=max_runs)
        if not result.failure.failed:
            raise UsageError(
                f"case {stored.case.pytest_id} failed in run {run.id} but passes now "
                f"({result.failure.outcome}): nothing to shrink (flaky, or the kernel changed)"
            )
        shrunk = Shrunk(run.id, result)
        if record:
            shrunk.recorded_run = _record(database, probe, run, result)
            shrunk.regressions = _attach(database, run, shrunk)
        if out is not None:
            shrunk.matrix = write_matrix(result, out, run)
    return shrunk


def shrink_in_worktree(
    database: Database, run_spec: str | int, case_spec: str, options: list[str]
) -> int | None:
    """``--checkout``: when the kernel's checkout here is not the run's code, the whole shrink
    as ``convmatrix shrink RUN CASE *options`` in a process importing the kernel from a
    temporary worktree at the run's commit, its output passed through; its exit status.
    None: the code here is the run's (shrink here). A signal is passed on to it, and its
    status (130, the case so far kept) is the answer."""
    run, stored = stored_failure(database, run_spec, case_spec)
    kernel = str(probe_options(run).kernel)
    with recorded_code(run, kernel, "shrink", checkout=True) as root:
        if root is None:
            return None
        argv = [sys.executable, "-m", "convmatrix", "shrink", str(run.id), stored.case.id,
                *options, "--db", absolute_url(database.url)]  # fmt: skip
        child = subprocess.Popen(argv, cwd=root, env=worktree_env(root))
        with stoppable() as stopping:
            try:
                return child.wait()
            except KeyboardInterrupt:
                child.send_signal(stopping.signum or signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return child.wait(timeout=60)
                child.kill()
                return child.wait()


def write_matrix(result: ShrinkResult, out: Path, run: RunInfo) -> Path:
    """The shrunk case as a matrix file of its own (its id the same when expanded)."""
    case = result.case
    text = matrix_text(
        [case_entry(case)], out.name.split(".")[0] or "shrunk",
        description=f"convmatrix shrink: run {run.id} case {result.original.id} -> {case.id}",
        suites=[case.suite],
    )  # fmt: skip
    header = "\n".join(f"# {line}" for line in result.boundary_lines())
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text((header + "\n" if header else "") + text, encoding="utf-8")
    except OSError as exc:  # checked before the work (--out): the disk failed since
        raise InfrastructureError(f"--out {out}: {exc.strerror or exc}") from exc
    return out


def _record(database: Database, probe: Probe, run: RunInfo, result: ShrinkResult) -> int | None:
    """A run of kind ``shrink`` holding the shrunk case's result as the probe judged it."""
    judged = result.outcome.result if result.outcome is not None else None
    if judged is None:
        return None
    options = RunOptions(
        kernel=probe.options.kernel, label=f"shrink:{run.id}:{result.original.id}",
        kind="shrink", workers=0, db=database.url,
    )  # fmt: skip
    meta = run_meta(probe.prepared, options, 1)
    meta.options[FACTS]["shrink"] = {**result.to_json(), "from_run": run.id}
    controller = Controller(DatabaseStore(database), meta, {judged.case.id}, None)
    controller.record(judged)
    return controller.finish(interrupted=False).run_id


def _attach(database: Database, run: RunInfo, shrunk: Shrunk) -> list[int]:
    """An event on each open regression of the original case naming the shrunk one."""
    result = shrunk.result
    note = (
        f"shrunk to {result.case.pytest_id} (case {result.case.id}, run "
        f"{shrunk.recorded_run}) in {result.runs} case runs"
        + "".join(f"; {line}" for line in result.boundary_lines())
    )
    attached = []
    with database.writing() as session:
        found = list_regressions(
            session, states=OPEN_STATES, kernel=run.kernel, case_id=result.original.id
        )
        for regression in found:
            if regression.matrix != run.matrix or regression.device != run.device_kind:
                continue
            row = session.get(RegressionRow, regression.id)
            assert row is not None
            record_event(session, row, row.state, BY, shrunk.recorded_run, note)
            attached.append(regression.id)
    return attached


def shrink_run_failures(
    database: Database, run_id: int, cases: Sequence[Case], budget: int, per_case: int = 60
) -> list[Shrunk]:
    """Shrink ``cases`` (failures of run ``run_id``) one after the other while ``budget``
    case runs remain, each within ``per_case``; record each (no matrix file)."""
    done: list[Shrunk] = []
    for case in cases:
        left = budget - sum(s.result.runs for s in done)
        if left < 2:  # a reproduction and one candidate: less shrinks nothing
            break
        try:
            shrunk = shrink_stored(
                database, run_id, case.id, max_runs=min(per_case, left), here=True
            )
        except UsageError:
            continue  # passes now (flaky): nothing to shrink
        done.append(shrunk)
        if shrunk.result.interrupted:  # kept; a signal stops the rest
            raise KeyboardInterrupt
    return done


def shrink_failures(state: RunState) -> None:
    """The run's ``shrink`` step (``--shrink RUNS``): its new failures shrunk within RUNS case
    runs in all. New failures: the cases of the regressions the scan raised; a run not
    scanned (no baseline to speak of, ``--kind``): every failing case."""
    budget = state.options.shrink
    end = state.end
    if not budget or end is None or state.database is None or state.run_id is None:
        return
    if end.scan is not None:
        ids = {r.case_id for r in end.new_regressions if r.kind == "new_failure"}
    else:
        with state.database.reading() as session:
            results = load_results(session, state.run_id)
        ids = {r.case.id for r in results if r.outcome in BAD_OUTCOMES}
    failing = [c for c in _run_cases(state) if c.id in ids]
    end.shrunk = shrink_run_failures(state.database, state.run_id, failing, budget)


def _run_cases(state: RunState) -> list[Case]:
    assert state.setup is not None
    return [c for w in state.setup.prepared.workloads.values() for c in w.cases]
