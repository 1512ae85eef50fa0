"""Runs as JSON lines: ``export`` on a device host that cannot reach the database, ``import``
where it can (or from SQLite into PostgreSQL).

One line per run (``{"kind": "run", ...}``: its ``RunMeta``, status and times), followed by a
line per result (``{"kind": "result", "run": <id in the file>, "result": CaseResult}``). NaN
errors are written as ``NaN`` (Python's JSON reads them back; the numbers must survive as they
were). An imported run keeps its start and finish times, so it takes its place in history and
as a baseline; it gets a new id in the receiving database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import fields
from datetime import datetime
from typing import IO, Any

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult, RunMeta
from convmatrix.db.engine import write_session
from convmatrix.db.models import Run
from convmatrix.db.queries import RunInfo, load_results
from convmatrix.db.writer import ResultWriter

__all__ = ["export_lines", "import_lines"]

_META = {f.name for f in fields(RunMeta)}


def _meta(run: RunInfo) -> dict[str, Any]:
    data = {name: getattr(run, name) for name in _META if hasattr(run, name)}
    data.update(device_kind=run.device_kind, device_name=run.device_name)
    return data


def export_lines(session: Session, runs: Iterable[RunInfo]) -> Iterator[str]:
    """The JSON lines of ``runs``, each followed by its results."""
    for run in runs:
        head = {
            "kind": "run", "id": run.id, "meta": _meta(run), "status": run.status,
            "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        }  # fmt: skip
        yield json.dumps(head)
        for result in load_results(session, run.id):
            yield json.dumps({"kind": "result", "run": run.id, "result": result.to_json()})


def _parse(line: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(data, dict) or data.get("kind") not in ("run", "result"):
        raise UsageError(f"{where}: expected a run or result line from convmatrix export")
    return data


def import_lines(engine: Engine, stream: IO[str], name: str = "<stdin>") -> list[int]:
    """Store every run of an export in ``engine``'s database; their new ids, in file order."""
    imported: list[int] = []
    ids: dict[Any, int] = {}
    writer: ResultWriter | None = None
    times: dict[int, tuple[datetime, datetime | None, str]] = {}

    closed: set[int] = set()

    def close() -> None:
        if writer is not None and writer.run_id is not None and writer.run_id not in closed:
            closed.add(writer.run_id)
            started, finished, status = times[writer.run_id]
            writer.finish_run(status=status if status != "running" else "interrupted")
            with write_session(engine) as session:
                session.execute(update(Run).where(Run.id == writer.run_id)
                                .values(started_at=started, finished_at=finished))  # fmt: skip

    try:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            where = f"{name}:{number}"
            data = _parse(line, where)
            if data["kind"] == "run":
                close()
                meta = data.get("meta") or {}
                unknown = sorted(set(meta) - _META)
                if unknown:
                    raise UsageError(f"{where}: unknown run field {unknown[0]!r}")
                try:
                    run_meta = RunMeta(**meta)
                    started = datetime.fromisoformat(data["started_at"])
                    finished = data.get("finished_at")
                    finished = datetime.fromisoformat(finished) if finished else None
                except (TypeError, KeyError, ValueError) as err:
                    raise UsageError(f"{where}: bad run line ({err})") from None
                writer = ResultWriter(engine, batch_size=500)
                run_id = writer.start_run(run_meta)
                times[run_id] = (started, finished, data.get("status", "finished"))
                ids[data.get("id")] = run_id
                imported.append(run_id)
            else:
                if writer is None or ids.get(data.get("run")) != writer.run_id:
                    raise UsageError(f"{where}: a result before its run line")
                try:
                    writer.add(CaseResult.from_json(data["result"]))
                except (TypeError, KeyError, ValueError) as err:
                    raise UsageError(f"{where}: bad result ({err})") from None
        close()
    except BaseException:
        if writer is not None and writer.run_id is not None and writer.run_id not in closed:
            writer.finish_run(status="interrupted")  # what was read stays, marked as such
        raise
    return imported
