"""The controller's side of a run: the single database writer and the session's tally.

Only the process that owns the pytest session (the xdist controller, or a plain pytest
process) builds a ``Recorder``; workers never import ``convmatrix.db``. Results arrive as the
JSON payload of test reports, a worker that died mid-case arrives as xdist's crash report and
becomes ``crashed``; each case is recorded once per session (a timeout result beats the crash
report that follows it). Results are committed in batches by ``ResultWriter``.
"""

from __future__ import annotations

import inspect
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convmatrix.db import ResultWriter, RunInfo, RunMeta, Session, open_database, resolve_run
from convmatrix.matrix.case import Case
from convmatrix.runners.results import CaseResult

__all__ = ["Recorder", "git_provenance", "kernel_provenance", "open_resumed"]


def git_provenance(path: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty) of the git checkout holding ``path``; (None, None) outside one."""
    where = path if path.is_dir() else path.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), None if status is None else bool(status.strip())


def kernel_provenance(kernel: Any) -> tuple[str | None, bool | None]:
    """The git commit and dirty flag of the source file that defines ``kernel``'s class."""
    try:
        source = inspect.getsourcefile(type(kernel))
    except TypeError:
        source = None
    return git_provenance(Path(source)) if source else (None, None)


def open_resumed(url: str | None, spec: str) -> RunInfo:
    """The run ``--resume`` names (id, ``latest``, label or commit), read on the controller."""
    engine = open_database(url)
    try:
        with Session(engine) as session:
            return resolve_run(session, spec)
    finally:
        engine.dispose()


@dataclass
class _Tally:
    results: dict[str, CaseResult]
    crashed_workers: Counter[str]


class Recorder:
    """Writes a session's results to one run (new, or resumed) and remembers them.

    ``url=None`` with ``enabled=False`` keeps results in memory only (``--no-db``).
    """

    def __init__(
        self,
        url: str | None,
        meta: RunMeta,
        *,
        resume: int | None = None,
        enabled: bool = True,
    ) -> None:
        self.meta = meta
        self.writer: ResultWriter | None = None
        self.run_id: int | None = None
        self.url = url
        if enabled:
            self.writer = ResultWriter(open_database(url))
            if resume is None:
                self.run_id = self.writer.start_run(meta)
            else:
                self.writer.resume_run(resume)
                self.run_id = resume
        self.tally = _Tally({}, Counter())
        self.status: str | None = None

    def record(self, result: CaseResult) -> bool:
        """Store one result; False (and nothing stored) if the case already has one."""
        if result.case.id in self.tally.results or self.status is not None:
            return False
        self.tally.results[result.case.id] = result
        if self.writer is not None:
            self.writer.add(result)
        return True

    def crashed(self, case: Case, worker: str | None, detail: str) -> bool:
        """Record the in-flight case of a worker that died (unless it already has a result)."""
        if worker:
            self.tally.crashed_workers[worker] += 1
        message = f"the worker process died while running this case ({detail})"
        return self.record(CaseResult(case=case, outcome="crashed", message=message, worker=worker))

    def finish(self, planned: set[str], interrupted: bool) -> str:
        """Flush and close the run: ``finished`` when every planned case has a result."""
        if self.status is not None:
            return self.status
        complete = planned <= set(self.tally.results)
        status = "finished" if complete and not interrupted else "interrupted"
        if self.writer is not None:
            self.writer.finish_run(self.run_id, status)
            self.writer.engine.dispose()
        self.status = status
        return status

    def run_info(self) -> RunInfo | None:
        """The run row as stored now (counts include results of earlier, resumed sessions)."""
        if self.writer is None or self.run_id is None:
            return None
        with Session(self.writer.engine) as session:
            return resolve_run(session, self.run_id)
