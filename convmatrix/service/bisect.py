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

from convmatrix.core.errors import UsageError

__all__ = ["BisectRequest", "BisectResult", "BisectStep", "bisect", "step_script"]

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


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
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
    if not repo.is_dir() or _git(repo, "rev-parse", "--git-dir", check=False).returncode:
        raise UsageError(f"--repo {request.repo}: not a git repository")
    good = _git(repo, "rev-parse", "--verify", f"{request.good}^{{commit}}").stdout.strip()
    bad = _git(repo, "rev-parse", "--verify", f"{request.bad}^{{commit}}").stdout.strip()
    if _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise UsageError(f"--repo {repo}: the working tree has changes; commit or stash them")
    with tempfile.TemporaryDirectory(prefix="convmatrix-bisect-") as tmp:
        script = Path(tmp) / "step.sh"
        script.write_text(step_script(replace(request, repo=repo)))
        script.chmod(0o755)
        _git(repo, "bisect", "start", bad, good)
        try:
            done = _git(repo, "bisect", "run", str(script), check=False)
        finally:
            _git(repo, "bisect", "reset", check=False)
    log = done.stdout + done.stderr
    steps = [BisectStep(sha, stage, int(rc)) for sha, stage, rc in _STEP.findall(log)]
    found = _FIRST_BAD.search(log)
    return BisectResult(first_bad=found.group(1) if found else None, steps=steps, log=log)
