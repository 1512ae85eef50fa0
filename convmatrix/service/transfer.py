"""Runs as JSON lines: ``export`` on a device host that cannot reach the database, ``import``
where it can (or from SQLite into PostgreSQL), with their triage.

One line per run (``{"kind": "run", "uid": ..., ...}``: its ``RunMeta``, status and times),
followed by a line per result (``{"kind": "result", "run": <id in the file>, ...}``); then the
alerts those runs raised and their regressions with every event
(``{"kind": "alert", ...}``, ``{"kind": "regression", ..., "events": [...]}``), runs named by
their uid. NaN errors are written as ``NaN`` (Python's JSON reads them back).

A run's uid is its identity in every database: importing a run already present changes
nothing (its results are not read again), an alert or regression already present is not
duplicated. An imported run keeps its start and finish times, so it takes its place in
history and as a baseline (it gets a new id in the receiving database); the scan that
follows an import changes regressions only by the run's place in time (``service.scan``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import fields
from datetime import datetime
from typing import IO, Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult, RunMeta
from convmatrix.db.engine import write_session
from convmatrix.db.models import AlertRow, RegressionEventRow, RegressionRow, Run
from convmatrix.db.queries import RunInfo, load_results
from convmatrix.db.writer import ResultWriter

__all__ = ["export_lines", "import_lines"]

_META = {f.name for f in fields(RunMeta)}
_KINDS = ("run", "result", "alert", "regression")
_ALERT_FIELDS = ("kernel", "matrix", "device", "explanation", "bisect_commit")
_REGRESSION_FIELDS = (
    "kernel", "matrix", "device", "case_id", "case_name", "output", "kind", "state", "detail",
    "first_bad_commit", "last_good_commit", "changed_by", "note", "outputs", "properties",
    "assignee", "bug",
)  # fmt: skip


def _meta(run: RunInfo) -> dict[str, Any]:
    data = {name: getattr(run, name) for name in _META if hasattr(run, name)}
    data.update(device_kind=run.device_kind, device_name=run.device_name)
    return data


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def export_lines(session: Session, runs: Iterable[RunInfo]) -> Iterator[str]:
    """The JSON lines of ``runs``, each followed by its results; then the alerts those runs
    raised and their regressions, with every event."""
    uids: dict[int, str] = {}
    for run in runs:
        uids[run.id] = run.uid
        head = {
            "kind": "run", "id": run.id, "uid": run.uid, "meta": _meta(run),
            "status": run.status, "started_at": run.started_at.isoformat(),
            "finished_at": _iso(run.finished_at),
        }  # fmt: skip
        yield json.dumps(head)
        for result in load_results(session, run.id):
            yield json.dumps({"kind": "result", "run": run.id, "result": result.to_json()})
    yield from _triage_lines(session, uids)


def _triage_lines(session: Session, uids: dict[int, str]) -> Iterator[str]:
    def uid(run_id: int | None) -> str | None:
        if run_id is None:
            return None
        return uids.get(run_id) or session.scalar(select(Run.uid).where(Run.id == run_id))

    alerts = session.scalars(select(AlertRow).where(AlertRow.run_id.in_(list(uids))))
    for alert in alerts:
        line = {"kind": "alert", "id": alert.id, "run": uid(alert.run_id),
                "baseline": uid(alert.baseline_run), "confirm_run": uid(alert.confirm_run),
                "bisect_run": uid(alert.bisect_run),
                "created_at": _iso(alert.created_at)}  # fmt: skip
        line.update({name: getattr(alert, name) for name in _ALERT_FIELDS})
        yield json.dumps(line)
    rows = session.scalars(select(RegressionRow).where(RegressionRow.first_bad_run.in_(list(uids))))
    for row in rows:
        events = session.scalars(
            select(RegressionEventRow)
            .where(RegressionEventRow.regression_id == row.id)
            .order_by(RegressionEventRow.id)
        )
        line = {
            "kind": "regression", "alert": row.alert_id, "first_bad_run": uid(row.first_bad_run),
            "last_good_run": uid(row.last_good_run), "fixed_run": uid(row.fixed_run),
            "created_at": _iso(row.created_at), "updated_at": _iso(row.updated_at),
            "events": [{"at": _iso(e.at), "by": e.by, "from_state": e.from_state,
                        "to_state": e.to_state, "run": uid(e.run_id), "note": e.note}
                       for e in events],
        }  # fmt: skip
        fields_ = {name: getattr(row, name) for name in _REGRESSION_FIELDS}
        fields_["regression_kind"] = fields_.pop("kind")  # "kind" names the line
        yield json.dumps(line | fields_)


def _parse(line: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise UsageError(f"{where}: expected a run, result, alert or regression line")
    return data


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


class _Importer:
    """The state of one import: the run being written, and where each file id now lives."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.writer: ResultWriter | None = None
        self.skipping = False  # the current run is already present: its results are not read
        self.run_ids: dict[Any, int] = {}  # file id -> id here (results)
        self.by_uid: dict[str, int] = {}  # uid -> id here
        self.alerts: dict[Any, int] = {}  # file id -> alert id here
        self.times: dict[int, tuple[datetime, datetime | None, str]] = {}
        self.imported: list[int] = []

    def close(self) -> None:
        writer = self.writer
        if writer is not None and writer.run_id is not None:
            started, finished, status = self.times[writer.run_id]
            writer.finish_run(status=status if status != "running" else "interrupted")
            with write_session(self.engine) as session:
                session.execute(update(Run).where(Run.id == writer.run_id)
                                .values(started_at=started, finished_at=finished))  # fmt: skip
        self.writer = None

    def run(self, data: dict[str, Any], where: str) -> None:
        self.close()
        meta = dict(data.get("meta") or {})
        unknown = sorted(set(meta) - _META)
        if unknown:
            raise UsageError(f"{where}: unknown run field {unknown[0]!r}")
        if data.get("uid"):
            meta["uid"] = data["uid"]
        try:
            run_meta = RunMeta(**meta)
            started = datetime.fromisoformat(data["started_at"])
            finished = _moment(data.get("finished_at"))
        except (TypeError, KeyError, ValueError) as err:
            raise UsageError(f"{where}: bad run line ({err})") from None
        with Session(self.engine) as session:
            present = session.scalar(select(Run.id).where(Run.uid == run_meta.uid))
        self.skipping = present is not None
        if present is not None:  # imported before (or exported from here): nothing changes
            self.run_ids[data.get("id")] = present
            self.by_uid[run_meta.uid] = present
            return
        self.writer = ResultWriter(self.engine, batch_size=500)
        run_id = self.writer.start_run(run_meta)
        self.times[run_id] = (started, finished, data.get("status", "finished"))
        self.run_ids[data.get("id")] = run_id
        self.by_uid[run_meta.uid] = run_id
        self.imported.append(run_id)

    def result(self, data: dict[str, Any], where: str) -> None:
        if self.skipping and data.get("run") in self.run_ids:
            return
        writer = self.writer
        if writer is None or self.run_ids.get(data.get("run")) != writer.run_id:
            raise UsageError(f"{where}: a result before its run line")
        try:
            writer.add(CaseResult.from_json(data["result"]))
        except (TypeError, KeyError, ValueError) as err:
            raise UsageError(f"{where}: bad result ({err})") from None

    def _run(self, session: Session, uid: str | None) -> int | None:
        if not uid:
            return None
        return self.by_uid.get(uid) or session.scalar(select(Run.id).where(Run.uid == uid))

    def alert(self, data: dict[str, Any]) -> None:
        self.close()
        with write_session(self.engine) as session:
            run_id = self._run(session, data.get("run"))
            found = session.scalar(select(AlertRow.id).where(
                AlertRow.run_id == run_id, AlertRow.kernel == data.get("kernel"),
                AlertRow.matrix == data.get("matrix"), AlertRow.device == data.get("device"),
            )) if run_id is not None else None  # fmt: skip
            if found is None:
                row = AlertRow(
                    run_id=run_id, baseline_run=self._run(session, data.get("baseline")),
                    confirm_run=self._run(session, data.get("confirm_run")),
                    bisect_run=self._run(session, data.get("bisect_run")),
                    created_at=_moment(data.get("created_at")),
                    **{name: data.get(name) for name in _ALERT_FIELDS},
                )  # fmt: skip
                session.add(row)
                session.flush()
                found = row.id
            self.alerts[data.get("id")] = found

    def regression(self, data: dict[str, Any]) -> None:
        self.close()
        data = {**data, "kind": data.get("regression_kind")}
        with write_session(self.engine) as session:
            first_bad = self._run(session, data.get("first_bad_run"))
            key = (RegressionRow.kernel == data.get("kernel"),
                   RegressionRow.matrix == data.get("matrix"),
                   RegressionRow.device == data.get("device"),
                   RegressionRow.case_id == data.get("case_id"),
                   RegressionRow.kind == data.get("kind"),
                   RegressionRow.output == data.get("output"),
                   RegressionRow.first_bad_run == first_bad)  # fmt: skip
            if session.scalar(select(RegressionRow.id).where(*key)) is not None:
                return
            row = RegressionRow(
                alert_id=self.alerts.get(data.get("alert")), first_bad_run=first_bad,
                last_good_run=self._run(session, data.get("last_good_run")),
                fixed_run=self._run(session, data.get("fixed_run")),
                created_at=_moment(data.get("created_at")),
                updated_at=_moment(data.get("updated_at")),
                **{name: data.get(name) for name in _REGRESSION_FIELDS},
            )  # fmt: skip
            session.add(row)
            session.flush()
            for e in data.get("events") or []:
                session.add(RegressionEventRow(
                    regression_id=row.id, at=_moment(e.get("at")), by=e.get("by"),
                    from_state=e.get("from_state"), to_state=e.get("to_state"),
                    run_id=self._run(session, e.get("run")), note=e.get("note"),
                ))  # fmt: skip


def import_lines(engine: Engine, stream: IO[str], name: str = "<stdin>") -> list[int]:
    """Store every run of an export not already present, and its triage; the new runs' ids,
    in file order."""
    importer = _Importer(engine)
    try:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            where = f"{name}:{number}"
            data = _parse(line, where)
            kind = data["kind"]
            if kind == "run":
                importer.run(data, where)
            elif kind == "result":
                importer.result(data, where)
            elif kind == "alert":
                importer.alert(data)
            else:
                importer.regression(data)
        importer.close()
    except BaseException:
        writer = importer.writer
        if writer is not None and writer.run_id is not None:
            writer.finish_run(status="interrupted")  # what was read stays, marked as such
        raise
    return importer.imported
