"""Confirmation before alerting: rerun the cases of a run's new regressions, and those the
machine failed to judge, and judge them (``service.confirm``).

A rerun is a run of its own (kind ``confirm``, labelled ``confirm:<run>``, never scanned), on
another device of the same kind when the machine has one, so a fault of one card is told
apart from one of the kernel; ``service.confirm`` judges it and attaches it to the alert. When
the run timed out on some case, the rerun's per-case limit is ``RERUN_LIMIT_FACTOR`` (4) times
the one they ran out at (``service.confirm.rerun_limit``): a busy host's timeout passes there,
a hang does not.

Where the baseline's kernel commit is a checkout away (the kernel's git repository holds it,
and it is not the run's), the new regressions' cases are rerun at it too (``confirm-base:<run>``,
from a temporary worktree, or in process when the checkout stands there): a regression
reproduces only when the head's rerun still shows it against the baseline's rerun, so a value
that changes by itself from run to run (an out-of-bounds read) is not blamed on the commit.

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
from dataclasses import replace
from pathlib import Path

from convmatrix.core.devices import discover
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.engine import absolute_url
from convmatrix.db.queries import RunInfo, newest_run_id
from convmatrix.pipeline.checkout import recorded_code, worktree_env
from convmatrix.pipeline.steps import RunState, execute, prepare, walk
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import load_kernel
from convmatrix.runners.run.provenance import kernel_identity
from convmatrix.service.confirm import Confirmation, Pending, judge_rerun, pending, rerun_limit
from convmatrix.service.scan import baseline_run

__all__ = ["confirm", "confirm_run", "rerun_device"]


def rerun_device(device: str) -> str:
    """Another device of ``device``'s kind when there is one (``cuda:1`` after ``cuda``),
    else the same kind."""
    kind = device.split(" ", 1)[0].split(":", 1)[0]
    if kind == "cpu":
        return "cpu"
    return f"{kind}:1" if discover(kind).count > 1 else kind


def _rerun_options(
    run: RunInfo,
    database: Database,
    workers: int | str,
    cases: list[str],
    limit_s: float | None = None,
    label: str | None = None,
) -> RunOptions:
    return RunOptions.rerun(
        run.options, run.matrix, run.kernel,
        device=rerun_device(run.device_kind),
        workers=workers,
        db=database.url,
        label=label or f"confirm:{run.id}",
        kind="confirm",
        cases=cases,
        case_timeout=limit_s,
        scan=False,
    )  # fmt: skip


def _rerun_in_worktree(options: RunOptions, root: Path, database: Database) -> int:
    """The rerun as ``convmatrix run`` in a process importing the kernel from ``root``."""
    matrix = options.matrix or ""
    if Path(matrix).is_file():
        matrix = str(Path(matrix).resolve())
    given = replace(options, matrix=matrix, db=absolute_url(database.url))
    argv = [sys.executable, "-m", "convmatrix", "run", *given.to_argv()]
    done = subprocess.run(argv, cwd=root, env=worktree_env(root), capture_output=True, text=True)
    if done.returncode not in (0, 1):
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"confirm: the rerun in the worktree failed: {reason[-1:]}")
    with database.reading() as session:
        rerun = newest_run_id(session, label=options.label)
    if rerun is None:
        raise UsageError("confirm: the rerun in the worktree recorded no run")
    return rerun


def _rerun_at(run: RunInfo, options: RunOptions, database: Database, *, checkout: bool) -> int:
    """The rerun of ``options`` at the kernel commit ``run`` recorded
    (``pipeline.checkout.recorded_code``: here, or from a temporary worktree with
    ``checkout``, else refused naming both commits before anything runs)."""
    with recorded_code(run, str(options.kernel), "confirm", checkout=checkout) as root:
        if root is not None:
            options.checked()  # refused here, before a process starts
            return _rerun_in_worktree(options, root, database)
        end = walk(options, database, (("prepare", prepare), ("execute", execute)))
        assert end.account.run_id is not None, "a rerun into a database is recorded"
        return end.account.run_id


def _base_rerun(
    todo: Pending, database: Database, workers: int | str
) -> tuple[int | None, str | None]:
    """(the rerun of the new regressions' cases at the baseline's commit, or None and why
    not): made where that commit is a checkout away (the kernel's code is in git)."""
    with database.reading() as session:
        base = baseline_run(session, todo.run)
    if not todo.regressions or base is None or base.kernel_commit == todo.run.kernel_commit:
        return None, None  # nothing to rerun, or the same code: the head's rerun says it all
    cases = sorted({r.case_id for r in todo.regressions})
    options = _rerun_options(base, database, workers, cases, label=f"confirm-base:{todo.run.id}")
    if not base.kernel_commit or not kernel_identity(load_kernel(str(options.kernel))).commit:
        return None, "no baseline rerun: the kernel's code is not in git"
    try:
        return _rerun_at(base, options, database, checkout=True), None
    except UsageError as exc:
        return None, f"no baseline rerun at {base.kernel_commit[:12]}: {exc}"


def confirm_run(
    database: Database, spec: str | int, workers: int | str = 0, *, checkout: bool = False
) -> Confirmation:
    """Rerun the cases of run ``spec``'s detected regressions, and those the machine failed
    to judge (with a longer limit), at the kernel commit the run tested (and the first at
    its baseline's, where that is a checkout away), and judge them: each regression
    confirmed or flaky, the reproduced ones filed as regressions."""
    with database.writing() as session:
        todo = pending(session, spec)
    run = todo.run
    if not todo.case_ids:
        return Confirmation(run.id, None, [], [])
    options = _rerun_options(run, database, workers, todo.case_ids, rerun_limit(todo))
    rerun_id = _rerun_at(run, options, database, checkout=checkout)
    base_id, note = _base_rerun(todo, database, workers)
    with database.writing() as session:
        done = judge_rerun(session, pending(session, run.id), rerun_id, base_id)
    done.notes += [note] if note else []
    return done


def confirm(state: RunState) -> None:
    """The run's ``confirm`` step (``--confirm``): its new regressions, and the cases the
    machine failed to judge, rerun and judged."""
    end = state.end
    if not state.options.confirm or end is None or end.scan is None:
        return
    if not end.scan.alerting and not end.scan.infrastructure:
        return
    assert state.database is not None and state.run_id is not None
    end.confirmation = confirm_run(state.database, state.run_id, state.options.workers)
    end.account.rejudged = len(end.confirmation.rejudged)
