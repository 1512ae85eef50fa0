"""A run's journal: the results the database could not take, kept on local disk.

When the database refuses a run's results for longer than the retry limit (a PostgreSQL
server restarting or in crash recovery, a full disk under SQLite), ``ResultWriter`` appends
them here instead of dropping them: ``convmatrix-journal-<run uid>.jsonl`` beside the SQLite
file, or in the working directory for a database server. The lines are ``convmatrix
export``'s: one run line (with ``"journal": true``) then one line per result, so
``convmatrix import FILE`` stores them (into the same run when the database holds it), and
``convmatrix run --resume RUN`` replays the journal of RUN before it runs what is missing.
Each batch is flushed and fsynced before the writer counts it as kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from convmatrix.core.records import CaseResult, RunMeta
from convmatrix.core.sanitise import redact_argv
from convmatrix.db.engine import sqlite_file

__all__ = [
    "JOURNAL_PREFIX",
    "Journal",
    "journal_paths",
    "read_journal",
    "run_line",
]

JOURNAL_PREFIX = "convmatrix-journal-"
_META = tuple(f.name for f in fields(RunMeta))


def journal_paths(url: str, uid: str) -> list[Path]:
    """Where the journal of run ``uid`` may go, in order: beside the SQLite file, then the
    working directory (the first for a database server: it has no directory here), then the
    temporary directory. A full disk under SQLite is full beside its file too: the journal
    moves on to the next place that takes it."""
    try:
        path = sqlite_file(url)
    except Exception:  # an unparsable URL: the working directory will do
        path = None
    name = f"{JOURNAL_PREFIX}{uid}.jsonl"
    places = [] if path is None else [path.parent]
    places += [Path.cwd(), Path(tempfile.gettempdir())]
    found: list[Path] = []
    for place in places:
        candidate = (place / name).resolve()
        if candidate not in found:
            found.append(candidate)
    return found


def meta_values(source: Any) -> dict[str, Any]:
    """The ``RunMeta`` fields of a ``RunMeta`` or a stored run row (argv redacted)."""
    values = {name: getattr(source, name) for name in _META if hasattr(source, name)}
    if values.get("argv") is not None:
        values["argv"] = redact_argv(list(values["argv"]))
    return values


def run_line(run_id: int, meta: dict[str, Any], started_at: datetime | None) -> dict[str, Any]:
    """The journal's first line: ``convmatrix export``'s run line, marked as a journal."""
    return {
        "kind": "run",
        "id": run_id,
        "uid": meta.get("uid"),
        "meta": meta,
        "status": "interrupted",
        "started_at": (started_at or datetime.now()).isoformat(),
        "finished_at": None,
        "journal": True,
    }


class Journal:
    """Appends results to one run's journal (the run line first), in the first of its
    places (``journal_paths``) that takes them."""

    def __init__(self, paths: list[Path], head: dict[str, Any]) -> None:
        self.paths = list(paths)
        self.path = self.paths[0]
        self.head = head
        self.written = 0  # results kept

    def write(self, results: list[CaseResult]) -> None:
        """Append ``results``, flushed and fsynced, moving on to the next place when one
        refuses; ``OSError`` when none takes them."""
        while True:
            try:
                self._append(self.path, results)
            except OSError:
                rest = self.paths[self.paths.index(self.path) + 1 :]
                if not rest:
                    raise
                self.path = rest[0]
                continue
            self.written += len(results)
            return

    def _append(self, path: Path, results: list[CaseResult]) -> None:
        fresh = not path.exists() or path.stat().st_size == 0
        lines = [json.dumps(self.head)] if fresh else []
        run_id = self.head["id"]
        lines += [json.dumps({"kind": "result", "run": run_id, "result": r.to_json()})
                  for r in results]  # fmt: skip
        try:
            with path.open("a", encoding="utf-8") as out:
                if not fresh:
                    out.write("\n")  # after a line a full disk tore, if any: an empty line
                out.write("".join(line + "\n" for line in lines))
                out.flush()
                os.fsync(out.fileno())
        except OSError:
            if fresh:  # a torn head would make the file unreadable: leave nothing
                with contextlib.suppress(OSError):
                    path.unlink()
            raise


def read_journal(path: Path) -> tuple[dict[str, Any], list[CaseResult]]:
    """(run line, its results) of a journal ``ResultWriter`` wrote; ``ValueError`` when the
    file is not one. A line torn by a full disk (not JSON) is skipped: its results were
    written again, in full, to the journal's next place."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or head.get("kind") != "run" or not head.get("journal"):
        raise ValueError(f"{path} is not a convmatrix journal")
    results = []
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        results.append(CaseResult.from_json(data["result"]))
    return head, results
