"""Confirmation before alerting: rerun the cases of a run's new regressions and judge them.

A rerun is a run of its own (prepared and executed like any other, labelled ``confirm:<run>``,
never scanned), on another device of the same kind when the machine has one, so a fault of
one card is told apart from one of the kernel; ``service.confirm`` judges it. It records into
the database of the run it confirms, through the same engine.
"""

from __future__ import annotations

from convmatrix.core.devices import discover
from convmatrix.db.database import Database
from convmatrix.pipeline.steps import RunState, execute, prepare, walk
from convmatrix.runners.options import RunOptions
from convmatrix.service.confirm import Confirmation, judge_rerun, pending

__all__ = ["confirm", "confirm_run", "rerun_device"]


def rerun_device(device: str) -> str:
    """Another device of ``device``'s kind when there is one (``cuda:1`` after ``cuda``),
    else the same kind."""
    kind = device.split(" ", 1)[0].split(":", 1)[0]
    if kind == "cpu":
        return "cpu"
    return f"{kind}:1" if discover(kind).count > 1 else kind


def confirm_run(database: Database, spec: str | int, workers: int | str = 0) -> Confirmation:
    """Rerun the cases of run ``spec``'s detected regressions and mark each one confirmed
    (it reproduces) or flaky (it does not)."""
    with database.writing() as session:
        run, regressions = pending(session, spec)
    if not regressions:
        return Confirmation(run.id, None, [], [])
    sources = run.options.get("matrix_sources") or []
    rerun = RunOptions(
        matrix=sources[0] if len(sources) == 1 else run.matrix,
        kernel=run.options.get("kernel_spec") or run.kernel,
        device=rerun_device(run.device_kind),
        workers=workers,
        db=database.url,
        label=f"confirm:{run.id}",
        commit=run.kernel_commit,
        cases=sorted({r.case_id for r in regressions}),
        scan=False,
    )
    end = walk(rerun, database, (("prepare", prepare), ("execute", execute)))
    rerun_id = end.account.run_id
    assert rerun_id is not None, "a rerun into a database is recorded"
    with database.writing() as session:
        confirmed, flaky = judge_rerun(session, regressions, rerun_id)
    return Confirmation(run.id, rerun_id, confirmed, flaky)


def confirm(state: RunState) -> None:
    """The run's ``confirm`` step (``--confirm``): its new regressions rerun and judged."""
    end = state.end
    if not state.options.confirm or end is None or end.scan is None or not end.scan.new:
        return
    assert state.database is not None and state.run_id is not None
    end.confirmation = confirm_run(state.database, state.run_id, state.options.workers)
