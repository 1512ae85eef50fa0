"""Confirmation before alerting: rerun the cases of a run's new regressions and judge them.

A rerun is a run of its own (kind ``confirm``, labelled ``confirm:<run>``, never scanned), on
another device of the same kind when the machine has one, so a fault of one card is told
apart from one of the kernel; ``service.confirm`` judges it and attaches it to the alert.

It reruns the kernel the run tested, or nothing (``pipeline.checkout.recorded_code``, the
check ``shrink`` makes too): the kernel's checkout must stand at the commit the run recorded.
When it does not (another commit, or local changes the run did not have), the rerun is
refused with both commits named, or, with ``checkout=True``, made from a temporary git
worktree at the recorded commit, in a process of its own whose import path starts there.
The rerun records the commit it actually ran (its own provenance), never the one it was
asked about.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from convmatrix.core.devices import discover
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.engine import absolute_url
from convmatrix.db.queries import RunInfo
from convmatrix.db.tables import runs
from convmatrix.pipeline.checkout import recorded_code, worktree_env
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


def _rerun_options(
    run: RunInfo, database: Database, workers: int | str, cases: list[str]
) -> RunOptions:
    sources = run.options.get("matrix_sources") or []
    return RunOptions(
        matrix=sources[0] if len(sources) == 1 else run.matrix,
        kernel=run.options.get("kernel_spec") or run.kernel,
        device=rerun_device(run.device_kind),
        workers=workers,
        db=database.url,
        label=f"confirm:{run.id}",
        kind="confirm",
        cases=cases,
        scan=False,
    )


def _rerun_in_worktree(options: RunOptions, root: Path, database: Database) -> int:
    """The rerun as ``convmatrix run`` in a process importing the kernel from ``root``."""
    matrix = options.matrix or ""
    if Path(matrix).is_file():
        matrix = str(Path(matrix).resolve())
    argv = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix,
            "--kernel", str(options.kernel), "--device", options.device,
            "-n", str(options.workers), "--db", absolute_url(database.url),
            "--label", str(options.label), "--kind", "confirm"]  # fmt: skip
    for case in options.cases:
        argv += ["--case", case]
    done = subprocess.run(argv, cwd=root, env=worktree_env(root), capture_output=True, text=True)
    if done.returncode not in (0, 1):
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"confirm: the rerun in the worktree failed: {reason[-1:]}")
    with database.reading() as session:
        rerun = session.scalar(
            select(runs.c.id)
            .where(runs.c.label == options.label)
            .order_by(runs.c.id.desc())
            .limit(1)
        )
    if rerun is None:
        raise UsageError("confirm: the rerun in the worktree recorded no run")
    return rerun


def confirm_run(
    database: Database, spec: str | int, workers: int | str = 0, *, checkout: bool = False
) -> Confirmation:
    """Rerun the cases of run ``spec``'s detected regressions at the kernel commit the run
    tested and mark each one confirmed (it reproduces) or flaky (it does not)."""
    with database.writing() as session:
        run, regressions = pending(session, spec)
    if not regressions:
        return Confirmation(run.id, None, [], [])
    options = _rerun_options(run, database, workers, sorted({r.case_id for r in regressions}))
    with recorded_code(run, str(options.kernel), "confirm", checkout=checkout) as root:
        if root is not None:
            rerun_id = _rerun_in_worktree(options.checked(), root, database)
        else:
            end = walk(options, database, (("prepare", prepare), ("execute", execute)))
            assert end.account.run_id is not None, "a rerun into a database is recorded"
            rerun_id = end.account.run_id
    with database.writing() as session:
        confirmed, flaky = judge_rerun(session, regressions, rerun_id)
    return Confirmation(run.id, rerun_id, confirmed, flaky)


def confirm(state: RunState) -> None:
    """The run's ``confirm`` step (``--confirm``): its new regressions rerun and judged."""
    end = state.end
    if not state.options.confirm or end is None or end.scan is None or not end.scan.alerting:
        return
    assert state.database is not None and state.run_id is not None
    end.confirmation = confirm_run(state.database, state.run_id, state.options.workers)
