"""Bisect: find the kernel commit that broke a case, with ``git bisect run``.

Each step is a one-case ``convmatrix run`` (the case by id, the kernel imported from the
checkout under test, the commit given explicitly) recorded as a side run labelled
``bisect:<sha>``, so every step can be looked at afterwards. A step's exit status is the run's
verdict: 0 good, 1 bad. A step that judged nothing is skipped (125), never good nor bad: a
build command that fails, a run that cannot start (2), a kernel that did not load or a case
that got no verdict (4: ``runners.run.account``; a timeout or harness error included). An
infrastructure failure (3) or an interrupt (130) aborts the bisection (git's 128).

Only judged commits are named. Both endpoints are judged first (``--good`` must pass, ``--bad``
fail), and the first bad commit git reports must have been judged bad with a parent judged
good; otherwise, and whenever git is left with skipped commits only, the bisection ends
*cannot decide* (``core.errors.NotJudgedError``, exit 4) with the reason and the commits it
could be. The repository is left as it was found (``git bisect reset``, the branch checked
out again).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from convmatrix.core.errors import InfrastructureError, NotJudgedError, UsageError
from convmatrix.db.database import Database
from convmatrix.db.queries import newest_run_id, resolve_run
from convmatrix.runners.options import RunOptions
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
_CANDIDATES = re.compile(r"^The first bad commit could be any of:\n((?:[0-9a-f]{40}\n?)+)", re.M)
_STEP = re.compile(r"^convmatrix-bisect: ([0-9a-f]{40}) (\w+) (\d+)(?: (\d+))?$", re.MULTILINE)
ABORT = 128  # what a step exits with to stop git bisect run (it aborts on 128 and above)
# A run's exit status (core.errors.EXIT_CODES) as a step's reason when it is not a verdict.
_NOT_A_VERDICT = {2: "run could not start", 3: "infrastructure failure", 4: "nothing judged",
                  130: "interrupted"}  # fmt: skip


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
    # how the bisected run ran and judged its cases (RunOptions.rerun: its --policy rule,
    # reference device...): every step judges the case the same way
    judged: RunOptions = field(default_factory=RunOptions)


@dataclass(frozen=True)
class BisectStep:
    commit: str
    stage: str  # "build" (its failure) or "run"
    exit_code: int  # as git bisect saw it: 0 good, 1 bad, 125 skipped, 128 aborted
    run_exit: int | None = None  # the run's own status (4 nothing judged, 3 infrastructure)
    endpoint: str | None = None  # "--good" or "--bad": judged before the bisection

    @property
    def verdict(self) -> str:
        """good, bad or skipped, with why a step was not judged."""
        verdict = {0: "good", 1: "bad", ABORT: "aborted"}.get(self.exit_code, "skipped")
        why = "build failed" if self.stage == "build" else _NOT_A_VERDICT.get(self.run_exit or 0)
        if why is None and self.exit_code not in (0, 1):
            why = f"exit {self.run_exit}"
        return verdict + (f" ({why})" if why else "")


@dataclass
class BisectResult:
    first_bad: str | None  # None: nothing named (cannot decide, or aborted)
    steps: list[BisectStep] = field(default_factory=list)
    log: str = ""
    undecided: str | None = None  # why no judged commit can be named
    candidates: list[str] = field(default_factory=list)  # what git could not tell apart
    infrastructure: str | None = None  # a step's run failed under it: the bisection stopped

    @property
    def exit_code(self) -> int:
        """0 a judged first bad commit, 3 aborted by infrastructure, 4 cannot decide."""
        if self.infrastructure:
            return InfrastructureError.exit_code
        return 0 if self.first_bad else NotJudgedError.exit_code


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
    step = replace(
        request.judged, matrix=request.matrix, kernel=request.kernel, cases=[request.case_id],
        db=request.db, workers=0, device=request.device, kind="bisect",
    )  # fmt: skip
    run = [request.python, "-m", "convmatrix", "run", *step.to_argv()]
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
        "status=$?\n"
        f"case $status in 0|1) rc=$status ;; 3|130) rc={ABORT} ;; *) rc=125 ;; esac\n"
        'echo "convmatrix-bisect: $sha run $rc $status"\n'
        "exit $rc\n"
    )


def _steps(text: str, endpoint: str | None = None) -> list[BisectStep]:
    return [
        BisectStep(sha, stage, int(rc), int(raw) if raw else None, endpoint)
        for sha, stage, rc, raw in _STEP.findall(text)
    ]


def _judge_endpoints(repo: Path, script: Path, good: str, bad: str) -> list[BisectStep]:
    """Run the step at ``--good`` and ``--bad`` (git bisect trusts both unjudged), then check
    out what was checked out before."""
    head = git(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
    head = head or git(repo, "rev-parse", "HEAD").stdout.strip()
    steps: list[BisectStep] = []
    try:
        for flag, sha in (("--good", good), ("--bad", bad)):
            git(repo, "checkout", "-q", "--detach", sha)
            done = subprocess.run([str(script)], cwd=repo, capture_output=True, text=True)
            found = _steps(done.stdout, flag)
            steps += found or [BisectStep(sha, "run", 125, done.returncode, flag)]
            if steps[-1].exit_code == ABORT:
                break
    finally:
        git(repo, "checkout", "-q", head, check=False)
    return steps


def _endpoint_problem(steps: list[BisectStep]) -> str | None:
    """Why the endpoints do not bound a bisection: ``--good`` must pass, ``--bad`` fail."""
    for step, wanted in zip(steps, ("good", "bad"), strict=False):
        if not step.verdict.startswith(wanted):
            return f"{step.endpoint} {step.commit[:12]} is {step.verdict}, not {wanted}"
    return None


def _verified(result: BisectResult, repo: Path) -> BisectResult:
    """Keep git's first bad commit only when the steps judged it bad and a parent of it good;
    else say why the bisection cannot decide."""
    found = result.first_bad
    if found is None:
        shown = ", ".join(c[:12] for c in result.candidates) or "none"
        result.undecided = f"only commits that judged nothing are left; it is one of: {shown}"
        return result
    judged = {s.commit: s.exit_code for s in result.steps}
    parents = git(repo, "rev-list", "--parents", "-n", "1", found).stdout.split()[1:]
    if judged.get(found) != 1:
        result.undecided = f"git named {found[:12]}, which no step judged bad"
    elif not any(judged.get(p) == 0 for p in parents):
        result.undecided = f"git named {found[:12]}, but no parent of it was judged good"
    if result.undecided:
        result.candidates, result.first_bad = [found], None
    return result


def bisect(request: BisectRequest) -> BisectResult:
    """Run ``git bisect`` between ``good`` and ``bad`` in ``repo`` (both judged first); the
    first bad commit, or why none can be named."""
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
        endpoints = _judge_endpoints(repo, script, good, bad)
        problem = _endpoint_problem(endpoints)
        if problem:
            return _stopped(BisectResult(None, endpoints, undecided=problem))
        git(repo, "bisect", "start", bad, good)
        try:
            done = git(repo, "bisect", "run", str(script), check=False)
        finally:
            git(repo, "bisect", "reset", check=False)
    log = done.stdout + done.stderr
    found = _FIRST_BAD.search(log)
    listed = _CANDIDATES.search(log)
    result = BisectResult(
        first_bad=found.group(1) if found else None, steps=endpoints + _steps(log), log=log,
        candidates=listed.group(1).split() if listed else [],
    )  # fmt: skip
    stopped = _stopped(result)
    return stopped if stopped.infrastructure else _verified(result, repo)


def _stopped(result: BisectResult) -> BisectResult:
    """A step aborted by an infrastructure failure or an interrupt stops the bisection."""
    aborted = next((s for s in result.steps if s.exit_code == ABORT), None)
    if aborted is not None:
        result.first_bad, result.undecided = None, None
        result.infrastructure = f"the step at {aborted.commit[:12]} was {aborted.verdict}"
    return result


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
        kernel, matrix, judged = asked.kernel, asked.matrix, RunOptions()
        if run is not None:
            info = resolve_run(session, run)
            judged = RunOptions.rerun(info.options, info.matrix, info.kernel)
            kernel, matrix = kernel or judged.kernel, matrix or judged.matrix
    missing = [n for n, v in (("--good", good), ("--bad", bad), ("--case", case_id)) if not v]
    if missing:
        raise UsageError(f"give {', '.join(missing)} (or --regression N to take them from one)")
    if not kernel or not matrix:
        raise UsageError("give --kernel and --matrix, or --run RUN to take them from a run")
    if Path(matrix).is_file():  # each step runs inside the repository
        matrix = str(Path(matrix).resolve())
    request = BisectRequest(
        repo=asked.repo, good=str(good), bad=str(bad), case_id=str(case_id), matrix=str(matrix),
        kernel=kernel, db=database.url, build=asked.build, device=asked.device, judged=judged,
    )  # fmt: skip
    return request, alert_id


def record_result(database: Database, alert_id: int, result: BisectResult) -> None:
    """Attach the first bad commit (and its step's run) to the alert the bisection served."""
    if result.first_bad is None:
        return
    with database.writing() as session:
        step = newest_run_id(session, kind="bisect", commit=result.first_bad)
        record_bisection(session, alert_id, result.first_bad, step)
