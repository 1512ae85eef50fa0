"""Bisect: find the kernel commit that broke a case, with ``git bisect run``.

Each step is a one-case ``convmatrix run`` (the case by id, the kernel imported from the
checkout under test, the commit given explicitly) recorded as a side run labelled
``bisect:<sha>``, so every step can be looked at afterwards. A step's exit status is the run's
(0 good, 1 bad); a build command that fails, or a run that cannot start (exit 2: the kernel
does not import at that commit), is 125, which ``git bisect`` skips. The repository is left
as it was found (``git bisect reset``).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import select

from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.models import Run
from convmatrix.db.queries import resolve_run
from convmatrix.reports.viewmodel import run_header
from convmatrix.service.alerts import record_bisection
from convmatrix.service.regressions import list_regressions

__all__ = [
    "BisectRequest",
    "BisectResult",
    "BisectStep",
    "bisect",
    "git",
    "plan_bisection",
    "record_result",
    "step_script",
]

_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.MULTILINE)
_STEP = re.compile(r"^convmatrix-bisect: ([0-9a-f]{40}) (\w+) (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class BisectRequest:
    repo: Path
    good: str
    bad: str
    case_id: str
    matrix: str
    kernel: str
    db: str
    build: str | None = None
    device: str = "auto"
    python: str = sys.executable


@dataclass(frozen=True)
class BisectStep:
    commit: str
    stage: str  # "build" (its failure) or "run"
    exit_code: int  # as git bisect saw it: 0 good, 1 bad, 125 skipped


@dataclass
class BisectResult:
    first_bad: str | None  # None when git bisect could not tell (every candidate skipped)
    steps: list[BisectStep] = field(default_factory=list)
    log: str = ""


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``git -C repo ARGS``; with ``check``, a failure is a ``UsageError`` with git's last
    words (the kernel's repository is the user's input)."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"git {' '.join(args)}: {reason[0] if reason else 'failed'}")
    return done


def step_script(request: BisectRequest) -> str:
    """The shell script ``git bisect run`` calls at each commit."""
    q = shlex.quote
    run = [request.python, "-m", "convmatrix", "run", "--matrix", request.matrix,
           "--kernel", request.kernel, "--case", request.case_id, "--db", request.db,
           "-n", "0", "--device", request.device, "--kind", "bisect"]  # fmt: skip
    build = ""
    if request.build:
        build = (
            f'sh -c {q(request.build)} || {{ echo "convmatrix-bisect: $sha build 125"; '
            "exit 125; }\n"
        )
    return (
        "#!/bin/sh\n"
        f"cd {q(str(request.repo))} || exit 128\n"
        "sha=$(git rev-parse HEAD)\n"
        f"{build}"
        f"PYTHONPATH={q(str(request.repo))}${{PYTHONPATH:+:$PYTHONPATH}} "
        f'{shlex.join(run)} --label "bisect:$sha" --commit "$sha"\n'
        "rc=$?\n"
        "case $rc in 0|1) ;; *) rc=125 ;; esac\n"
        'echo "convmatrix-bisect: $sha run $rc"\n'
        "exit $rc\n"
    )


def bisect(request: BisectRequest) -> BisectResult:
    """Run ``git bisect`` between ``good`` and ``bad`` in ``repo``; the first bad commit."""
    repo = request.repo.resolve()
    if not repo.is_dir() or git(repo, "rev-parse", "--git-dir", check=False).returncode:
        raise UsageError(f"--repo {request.repo}: not a git repository")
    good = git(repo, "rev-parse", "--verify", f"{request.good}^{{commit}}").stdout.strip()
    bad = git(repo, "rev-parse", "--verify", f"{request.bad}^{{commit}}").stdout.strip()
    if git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise UsageError(f"--repo {repo}: the working tree has changes; commit or stash them")
    with tempfile.TemporaryDirectory(prefix="convmatrix-bisect-") as tmp:
        script = Path(tmp) / "step.sh"
        script.write_text(step_script(replace(request, repo=repo)))
        script.chmod(0o755)
        git(repo, "bisect", "start", bad, good)
        try:
            done = git(repo, "bisect", "run", str(script), check=False)
        finally:
            git(repo, "bisect", "reset", check=False)
    log = done.stdout + done.stderr
    steps = [BisectStep(sha, stage, int(rc)) for sha, stage, rc in _STEP.findall(log)]
    found = _FIRST_BAD.search(log)
    return BisectResult(first_bad=found.group(1) if found else None, steps=steps, log=log)


@dataclass(frozen=True)
class Asked:
    """What ``convmatrix bisect`` was given: a regression, or a run, or the parts by hand."""

    repo: Path
    good: str | None = None
    bad: str | None = None
    case_id: str | None = None
    run: str | None = None
    kernel: str | None = None
    matrix: str | None = None
    regression: int | None = None
    build: str | None = None
    device: str = "auto"


def plan_bisection(database: Database, asked: Asked) -> tuple[BisectRequest, int | None]:
    """The bisection ``asked`` names, and the alert its result belongs to: a regression gives
    its last good and first bad commits, its case, and the kernel and matrix of its first bad
    run; explicit values win; ``run`` gives kernel and matrix."""
    good, bad, case_id, run, alert_id = asked.good, asked.bad, asked.case_id, asked.run, None
    with database.session() as session:
        if asked.regression is not None:
            found = list_regressions(session, ids=[asked.regression])
            if not found:
                raise UsageError(f"--regression {asked.regression}: no such regression")
            reg = found[0]
            good, bad = good or reg.last_good_commit, bad or reg.first_bad_commit
            case_id, alert_id = case_id or reg.case_id, reg.alert_id
            run = run or (str(reg.first_bad_run) if reg.first_bad_run else None)
        kernel, matrix = asked.kernel, asked.matrix
        if run is not None:
            header = run_header(resolve_run(session, run), database.url)
            kernel = kernel or header.kernel_spec or header.kernel
            matrix = matrix or header.matrix_source or header.matrix
    missing = [n for n, v in (("--good", good), ("--bad", bad), ("--case", case_id)) if not v]
    if missing:
        raise UsageError(f"give {', '.join(missing)} (or --regression N to take them from one)")
    if not kernel or not matrix:
        raise UsageError("give --kernel and --matrix, or --run RUN to take them from a run")
    if Path(matrix).is_file():  # each step runs inside the repository
        matrix = str(Path(matrix).resolve())
    request = BisectRequest(
        repo=asked.repo, good=str(good), bad=str(bad), case_id=str(case_id), matrix=str(matrix),
        kernel=kernel, db=database.url, build=asked.build, device=asked.device,
    )  # fmt: skip
    return request, alert_id


def record_result(database: Database, alert_id: int, result: BisectResult) -> None:
    """Attach the first bad commit (and its step's run) to the alert the bisection served."""
    if result.first_bad is None:
        return
    with database.writing() as session:
        step = session.scalar(
            select(Run.id).where(Run.kind == "bisect", Run.kernel_commit == result.first_bad)
            .order_by(Run.id.desc()).limit(1)
        )  # fmt: skip
        record_bisection(session, alert_id, result.first_bad, step)
