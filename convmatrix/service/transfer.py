"""Runs as JSON lines: ``export`` on a device host that cannot reach the database, ``import``
where it can (or from SQLite into PostgreSQL), with their triage.

One line per run (``{"kind": "run", "uid": ..., ...}``: its ``RunMeta``, status and times),
followed by a line per result (``{"kind": "result", "run": <id in the file>, ...}``); then the
alerts those runs raised and their regressions with every event
(``{"kind": "alert", ...}``, ``{"kind": "regression", ..., "events": [...]}``), runs named by
their uid. NaN errors are written as ``NaN`` (Python's JSON reads them back).

A run's uid is its identity in every database. A run already present gains the cases of
the file it does not hold yet (a newer export of a run exported half done, another shard's
export of a sharded run), keeps the ones it holds, and takes the file's status unless it
has finished; importing the same export twice changes nothing. A run still ``running`` in
the receiving database is refused (its writer may be storing the same cases). An alert or
regression already present is not duplicated. An imported run keeps its start and finish
times, so it takes its place in history and as a baseline (it gets a new id in the receiving
database); the scan that follows an import changes regressions only by the run's place in
time (``service.scan``). The lines are checked first (``service.transfer_lines``): a case
twice in one run, a case id its parameters do not give, a negative duration are exit 2.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult
from convmatrix.core.sanitise import redact_argv
from convmatrix.db.aggregates import aggregate_runs
from convmatrix.db.alert_queries import alert_rows, find_alert
from convmatrix.db.engine import write_session
from convmatrix.db.models import AlertRow, RegressionEventRow, RegressionRow, Run
from convmatrix.db.queries import (
    RunInfo,
    done_case_ids,
    load_results,
    run_column,
    run_id_of_uid,
)
from convmatrix.db.regression_queries import event_rows, find_regression, regression_rows
from convmatrix.db.writer import count_values, run_counts, write_results
from convmatrix.service.transfer_lines import (
    ALERT_FIELDS,
    META,
    REGRESSION_FIELDS,
    RunLine,
    check_lines,
    moment,
    read_lines,
    read_result,
)

__all__ = ["check_lines", "export_lines", "import_lines"]


def _meta(run: RunInfo) -> dict[str, Any]:
    data = {name: getattr(run, name) for name in META if hasattr(run, name)}
    data.update(device_kind=run.device_kind, device_name=run.device_name)
    data["argv"] = redact_argv(list(data.get("argv") or []))  # a row stored before redaction
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
        return uids.get(run_id) or run_column(session, run_id, "uid")  # type: ignore[no-any-return]

    # in id order, as the runs' rows were written (the file keeps that order)
    alerts = sorted(alert_rows(session, run_ids=list(uids)), key=lambda a: a.id)
    for alert in alerts:
        line = {"kind": "alert", "id": alert.id, "run": uid(alert.run_id),
                "baseline": uid(alert.baseline_run), "confirm_run": uid(alert.confirm_run),
                "bisect_run": uid(alert.bisect_run),
                "created_at": _iso(alert.created_at)}  # fmt: skip
        line.update({name: getattr(alert, name) for name in ALERT_FIELDS})
        yield json.dumps(line)
    rows = regression_rows(session, first_bad_runs=list(uids)) if uids else []
    rows.sort(key=lambda row: row.id)
    events_by_id = event_rows(session, [row.id for row in rows])
    for row in rows:
        events = events_by_id[row.id]
        line = {
            "kind": "regression", "alert": row.alert_id, "first_bad_run": uid(row.first_bad_run),
            "last_good_run": uid(row.last_good_run), "fixed_run": uid(row.fixed_run),
            "created_at": _iso(row.created_at), "updated_at": _iso(row.updated_at),
            "events": [{"at": _iso(e.at), "by": e.by, "from_state": e.from_state,
                        "to_state": e.to_state, "run": uid(e.run_id), "note": e.note}
                       for e in events],
        }  # fmt: skip
        fields_ = {name: getattr(row, name) for name in REGRESSION_FIELDS}
        fields_["regression_kind"] = fields_.pop("kind")  # "kind" names the line
        yield json.dumps(line | fields_)


@dataclass
class _Arrival:
    """A run the file writes results to: ``new`` here, a ``journal``'s run (its results
    replace what the run holds for their cases), or ``more`` of a run present here (a newer
    export, another shard's): its cases not stored yet are added, the stored ones kept."""

    run_id: int
    line: RunLine
    kind: str
    stored: set[str] = field(default_factory=set)  # ``more``: the case ids stored before
    added: int = 0


class _Importer:
    """Pass two: every line written inside one transaction (``session``)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.current: _Arrival | None = None  # the run results go to (None: none)
        self.arrivals: list[_Arrival] = []
        self.batch: list[CaseResult] = []
        self.run_ids: dict[Any, int] = {}  # file id -> id here
        self.by_uid: dict[str, int] = {}  # uid -> id here
        self.alerts: dict[Any, int] = {}  # file id -> alert id here
        self.imported: list[int] = []

    def _flush(self) -> None:
        if self.batch and self.current is not None:
            write_results(self.session, self.current.run_id, self.batch)
        self.batch = []

    def run(self, line: RunLine, where: str) -> None:
        self._flush()
        session = self.session
        found_id = run_id_of_uid(session, line.meta.uid)
        if found_id is None:
            row = Run(**line.values(), shard_label=None)
            session.add(row)
            session.flush()
            arrival = _Arrival(row.id, line, "new")
        elif line.journal:
            arrival = _Arrival(found_id, line, "journal")
        elif run_column(session, found_id, "status") == "running":
            # a writer here may be storing the same cases
            raise UsageError(
                f"{where}: run {found_id} (uid {line.meta.uid}) is still running in this "
                "database; import its export when it has stopped"
            )
        else:
            stored = done_case_ids(session, found_id)
            arrival = _Arrival(found_id, line, "more", stored=stored)
        self.run_ids[line.file_id] = self.by_uid[line.meta.uid] = arrival.run_id
        self.current = arrival
        self.arrivals.append(arrival)

    def result(self, data: dict[str, Any], where: str) -> None:
        arrival = self.current
        if arrival is None:
            return
        result = read_result(data, where)
        if result.case.id in arrival.stored:
            return  # present already: kept as stored (importing an export twice is a no-op)
        self.batch.append(result)
        arrival.added += 1
        if len(self.batch) >= 500:
            self._flush()

    def finish(self) -> None:
        """Every run written to: its counts, status and history summary, as the file says
        (a finished run stays finished); a ``more`` run that gained nothing is left as is."""
        self._flush()
        self.current = None
        for arrival in self.arrivals:
            run, line = self.session.get(Run, arrival.run_id), arrival.line
            assert run is not None
            status = "interrupted" if arrival.kind == "journal" else line.values()["status"]
            if arrival.kind == "more" and not arrival.added and run.status in (status, "finished"):
                continue
            for key, value in count_values(run_counts(self.session, run.id)).items():
                setattr(run, key, value)
            if arrival.kind == "new" or run.status != "finished":
                later = line.finished if arrival.kind == "more" else None
                run.status = status
                run.finished_at = later or run.finished_at or line.finished or line.started
            if run.id not in self.imported:
                self.imported.append(run.id)
        self.session.flush()
        aggregate_runs(self.session, self.imported)

    def _run(self, uid: str | None) -> int | None:
        if not uid:
            return None
        return self.by_uid.get(uid) or run_id_of_uid(self.session, uid)

    def alert(self, data: dict[str, Any]) -> None:
        self._flush()
        self.current = None
        session = self.session
        run_id = self._run(data.get("run"))
        found = find_alert(
            session, run_id, data.get("kernel"), data.get("matrix"), data.get("device")
        ) if run_id is not None else None  # fmt: skip
        if found is None:
            row = AlertRow(
                run_id=run_id, baseline_run=self._run(data.get("baseline")),
                confirm_run=self._run(data.get("confirm_run")),
                bisect_run=self._run(data.get("bisect_run")),
                created_at=moment(data.get("created_at")),
                **{name: data.get(name) for name in ALERT_FIELDS},
            )  # fmt: skip
            session.add(row)
            session.flush()
            found = row.id
        self.alerts[data.get("id")] = found

    def regression(self, data: dict[str, Any]) -> None:
        self._flush()
        self.current = None
        session = self.session
        data = {**data, "kind": data.get("regression_kind")}
        first_bad = self._run(data.get("first_bad_run"))
        key = {
            name: data.get(name)
            for name in ("kernel", "matrix", "device", "case_id", "kind", "output")
        }
        if find_regression(session, **key, first_bad_run=first_bad) is not None:
            return
        row = RegressionRow(
            alert_id=self.alerts.get(data.get("alert")), first_bad_run=first_bad,
            last_good_run=self._run(data.get("last_good_run")),
            fixed_run=self._run(data.get("fixed_run")),
            created_at=moment(data.get("created_at")),
            updated_at=moment(data.get("updated_at")),
            **{name: data.get(name) for name in REGRESSION_FIELDS},
        )  # fmt: skip
        session.add(row)
        session.flush()
        for e in data.get("events") or []:
            session.add(RegressionEventRow(
                regression_id=row.id, at=moment(e.get("at")), by=e.get("by"),
                from_state=e.get("from_state"), to_state=e.get("to_state"),
                run_id=self._run(e.get("run")), note=e.get("note"),
            ))  # fmt: skip


def import_lines(engine: Engine, stream: IO[str], name: str = "<stdin>") -> list[int]:
    """Store every run of an export not already present, the cases a present run lacks, a
    journal's results in the run it was written for, and their triage, all in one
    transaction; the runs written to, in file order. The stream is read twice
    (``check_lines`` first): it must be seekable. A file that fails anywhere changes
    nothing."""
    check_lines(stream, name)
    stream.seek(0)
    with write_session(engine) as session:
        importer = _Importer(session)
        for where, data in read_lines(stream, name):
            kind = data["kind"]
            if kind == "run":
                importer.run(RunLine(data, where), where)
            elif kind == "result":
                importer.result(data, where)
            elif kind == "alert":
                importer.alert(data)
            else:
                importer.regression(data)
        importer.finish()
    return importer.imported
