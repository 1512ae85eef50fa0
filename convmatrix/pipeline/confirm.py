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

It reruns the kernel the run tested, or nothing: the kernel's checkout must stand at the
commit the run recorded. When it does not (another commit, or local changes the run did not
have), the rerun is refused with both commits named, or, with ``checkout=True``, made from a
temporary git worktree at the recorded commit, in a process of its own whose import path
starts there. The rerun records the commit it actually ran (its own provenance), never the
one it was asked about.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import select

from convmatrix.core.devices import discover
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.engine import absolute_url
from convmatrix.db.queries import RunInfo
from convmatrix.db.tables import runs
from convmatrix.pipeline.steps import RunState, execute, prepare, walk
from convmatrix.runners.controller import load_kernel
from convmatrix.runners.options import RunOptions
from convmatrix.runners.provenance import KernelIdentity, kernel_identity
from convmatrix.service.bisect import git
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
    sources = run.options.get("matrix_sources") or []
    return RunOptions(
        matrix=sources[0] if len(sources) == 1 else run.matrix,
        kernel=run.options.get("kernel_spec") or run.kernel,
        device=rerun_device(run.device_kind),
        workers=workers,
        db=database.url,
        label=label or f"confirm:{run.id}",
        kind="confirm",
        cases=cases,
        case_timeout=limit_s,
        scan=False,
    )


def _stands_at(run: RunInfo, identity: KernelIdentity) -> str | None:
    """Why the kernel's code here is not the code ``run`` tested; None when it is."""
    recorded = run.kernel_commit
    commit, dirty = identity.recorded()
    if recorded is None or commit is None:
        return None  # nothing recorded to hold it to (or nothing to tell here)
    where = f" ({Path(identity.path).parent})" if identity.path else ""
    if commit != recorded:
        return (
            f"run {run.id} tested kernel commit {recorded}; the kernel's checkout{where} is "
            f"at {commit}"
        )
    if dirty and not run.kernel_dirty:  # a run made dirty is rerun dirty, and recorded so
        return (
            f"run {run.id} tested kernel commit {recorded}; the kernel's checkout{where} is "
            "at it with local changes"
        )
    return None


@contextmanager
def _worktree(identity: KernelIdentity, commit: str) -> Iterator[Path]:
    """A temporary worktree of the kernel's repository at ``commit``; yields the directory
    to put first on the import path there (where the kernel's top-level package lives)."""
    if identity.path is None:
        raise UsageError(f"--checkout: the kernel's module {identity.module} has no file")
    source = Path(identity.path).resolve()
    top = Path(git(source.parent, "rev-parse", "--show-toplevel").stdout.strip())
    depth = len(identity.module.split(".")) - (0 if source.name == "__init__.py" else 1)
    root = source.parents[depth] if depth < len(source.parents) else source.parent
    scratch = Path(tempfile.mkdtemp(prefix="convmatrix-confirm-"))
    tree = scratch / "worktree"
    git(top, "worktree", "add", "--detach", str(tree), commit)
    try:
        yield tree / root.relative_to(top)
    finally:
        subprocess.run(["git", "-C", str(top), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)


def _rerun_in_worktree(options: RunOptions, root: Path, database: Database) -> int:
    """The rerun as ``convmatrix run`` in a process importing the kernel from ``root``."""
    matrix = options.matrix or ""
    if Path(matrix).is_file():
        matrix = str(Path(matrix).resolve())
    argv = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix,
            "--kernel", str(options.kernel), "--device", options.device,
            "-n", str(options.workers), "--db", absolute_url(database.url),
            "--label", str(options.label), "--kind", "confirm"]  # fmt: skip
    if options.case_timeout is not None:
        argv += ["--case-timeout", f"{options.case_timeout:g}"]
    for case in options.cases:
        argv += ["--case", case]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
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


def _refusal(run: RunInfo, why: str) -> UsageError:
    return UsageError(
        f"confirm: {why}: check out {run.kernel_commit} there, or pass --checkout to "
        "rerun from a temporary worktree at it (nothing was rerun or marked)"
    )


def _rerun_at(
    run: RunInfo,
    identity: KernelIdentity,
    options: RunOptions,
    database: Database,
    checkout: bool,
) -> int:
    """The rerun of ``options`` at the kernel commit ``run`` recorded: in this process when
    the kernel's checkout stands there, else (``checkout``) from a temporary worktree at it;
    else refused, naming both commits."""
    why = _stands_at(run, identity)
    if why is not None and not checkout:
        raise _refusal(run, why)
    if why is not None:
        assert run.kernel_commit is not None
        with _worktree(identity, run.kernel_commit) as root:
            return _rerun_in_worktree(options.checked(), root, database)
    end = walk(options, database, (("prepare", prepare), ("execute", execute)))
    assert end.account.run_id is not None, "a rerun into a database is recorded"
    return end.account.run_id


def _base_rerun(
    todo: Pending, identity: KernelIdentity, database: Database, workers: int | str
) -> tuple[int | None, str | None]:
    """(the rerun of the new regressions' cases at the baseline's commit, or None and why
    not): made where that commit is a checkout away."""
    with database.reading() as session:
        base = baseline_run(session, todo.run)
    if not todo.regressions or base is None:
        return None, None
    if not base.kernel_commit or not identity.commit:
        return None, "no baseline rerun: the kernel's commit is not known in git"
    if base.kernel_commit == todo.run.kernel_commit:
        return None, None  # the same code: the head's rerun says it all
    cases = sorted({r.case_id for r in todo.regressions})
    label = f"confirm-base:{todo.run.id}"
    options = _rerun_options(base, database, workers, cases, label=label)
    try:
        return _rerun_at(base, identity, options, database, checkout=True), None
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
    limit = rerun_limit(todo)
    options = _rerun_options(run, database, workers, todo.case_ids, limit)
    identity = kernel_identity(load_kernel(options.kernel))
    why = _stands_at(run, identity)
    if why is not None and not checkout:  # refused before anything is rerun
        raise _refusal(run, why)
    rerun_id = _rerun_at(run, identity, options, database, checkout)
    base_id, note = _base_rerun(todo, identity, database, workers)
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
