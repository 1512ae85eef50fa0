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
import re
from collections.abc import Iterable, Iterator
from dataclasses import fields
from datetime import datetime
from typing import IO, Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.records import OUTCOMES, RUN_KINDS, CaseResult, RunMeta
from convmatrix.db.aggregates import aggregate_runs
from convmatrix.db.engine import redact_argv, write_session
from convmatrix.db.models import AlertRow, RegressionEventRow, RegressionRow, Run
from convmatrix.db.queries import RunInfo, load_results
from convmatrix.db.records import CASES, METRICS, PROPERTIES, TIMINGS, case_row, child_rows
from convmatrix.db.tables import REGRESSION_KINDS, REGRESSION_STATES, RUN_STATUSES, utcnow
from convmatrix.db.validate import check_moment, check_row
from convmatrix.db.writer import count_values, run_counts, run_values, write_results

__all__ = ["check_lines", "export_lines", "import_lines"]

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
    except (json.JSONDecodeError, RecursionError) as err:
        msg = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deep"
        raise UsageError(f"{where}: not JSON ({msg})") from None
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise UsageError(f"{where}: expected a run, result, alert or regression line")
    return data


def _moment(text: Any, what: str = "a date", where: str = "") -> datetime | None:
    """An ISO date-time of the file (None: none given); ``UsageError`` for one that is not
    text, not a date, or later than tomorrow (a run dated 9999-12-31 was 'latest' for ever)."""
    if text is None or text == "":
        return None
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {what} {str(text)[:40]!r} is not an ISO date") from None
    problem = check_moment(moment, what)
    if problem:
        raise UsageError(f"{where}: {problem}")
    return moment


def _choice(value: Any, allowed: tuple[str, ...], what: str, where: str) -> str:
    if value not in allowed:
        raise UsageError(f"{where}: {what} {str(value)[:40]!r}: one of {', '.join(allowed)}")
    return value


_BAD_RECORD = (TypeError, KeyError, ValueError, AttributeError, OverflowError, RecursionError)


_NUMBER = (int, float)
# The JSON types of a result's fields as ``CaseResult.to_json`` writes them (None allowed for
# the optional ones): checked before ``from_json``, which would turn "12" into 12.0.
_RESULT_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "case": ((dict,), False), "outcome": ((str,), False), "duration_s": (_NUMBER, True),
    "message": ((str,), True), "outputs": ((list,), True), "properties": ((list,), True),
    "timings": ((list,), True), "worker": ((str,), True), "peak_mem_mb": (_NUMBER, True),
    "host": ((str,), True), "device_index": ((int,), True), "retries": ((int,), True),
    "retry_reason": ((str,), True),
}  # fmt: skip
_ITEM_TYPES = {"passed": (bool,), "name": (str,), "detail": (str,), "output": (str,),
               "scope": (str,), "mode": (str,)}  # fmt: skip


def _check_types(raw: Any, where: str) -> None:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: bad result (not an object)")
    for key, (types, optional) in _RESULT_TYPES.items():
        value = raw.get(key)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise UsageError(
                f"{where}: result.{key}: {str(value)[:40]!r} is not a {types[0].__name__}"
            )
    for key in ("outputs", "properties", "timings"):
        for item in raw.get(key) or []:
            if not isinstance(item, dict):
                raise UsageError(f"{where}: result.{key}: an item that is not an object")
            for name, value in item.items():
                allowed = _ITEM_TYPES.get(name)
                if allowed is None:  # a measured number (None: not measured), or a list
                    allowed = (*_NUMBER, list, type(None))
                    if isinstance(value, bool):
                        allowed = ()
                elif value is None and name in ("mode", "detail"):
                    continue
                if not isinstance(value, allowed):
                    raise UsageError(f"{where}: result.{key}.{name}: {str(value)[:40]!r}")


def _result(data: dict[str, Any], where: str) -> CaseResult:
    """The result a result line holds, every row it becomes checked against its columns."""
    _check_types(data.get("result"), where)
    try:
        result = CaseResult.from_json(data["result"])
        case = CASES.values(case_row(result, 0, utcnow()))
        children = child_rows(result, 0, 0)
    except _BAD_RECORD as err:
        raise UsageError(f"{where}: bad result ({type(err).__name__}: {err})"[:300]) from None
    _choice(result.outcome, OUTCOMES, "outcome", where)
    check_row(CASES.table, case, where)
    for layout, rows in zip((METRICS, PROPERTIES, TIMINGS), children, strict=True):
        for row in rows:
            check_row(layout.table, layout.values(row), where)
    return result


class _RunLine:
    """A run line, checked: its meta, uid, status and times."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        meta = data.get("meta")
        if not isinstance(meta, dict):
            raise UsageError(f"{where}: bad run line (no meta)")
        unknown = sorted(set(meta) - _META)
        if unknown:
            raise UsageError(f"{where}: unknown run field {unknown[0]!r}")
        meta = dict(meta)
        if data.get("uid"):
            meta["uid"] = data["uid"]
        try:
            self.meta = RunMeta(**meta)
            self.started = datetime.fromisoformat(data["started_at"])
        except (TypeError, KeyError, ValueError) as err:
            raise UsageError(f"{where}: bad run line ({err})"[:300]) from None
        _moment(data["started_at"], "started_at", where)
        self.finished = _moment(data.get("finished_at"), "finished_at", where)
        self.status = _choice(data.get("status", "finished"), RUN_STATUSES, "status", where)
        _choice(self.meta.kind, RUN_KINDS, "kind", where)
        if not isinstance(self.meta.uid, str) or not re.fullmatch(r"[0-9a-f]{1,32}", self.meta.uid):
            raise UsageError(f"{where}: uid {str(self.meta.uid)[:40]!r}: 1-32 hex digits")
        self.file_id = data.get("id")
        self.journal = data.get("journal") is True
        check_row(Run.__table__, self.values(), where)

    def values(self) -> dict[str, Any]:
        status = self.status if self.status != "running" else "interrupted"
        return {**run_values(self.meta), "pid": None, "status": status,
                "started_at": self.started, "finished_at": self.finished}  # fmt: skip


def _check_triage(data: dict[str, Any], where: str) -> None:
    """An alert or regression line: its fields as their columns take them, its dates."""
    if data["kind"] == "alert":
        check_row(AlertRow.__table__, {n: data.get(n) for n in _ALERT_FIELDS}, where)
        _moment(data.get("created_at"), "created_at", where)
        uids = [data.get(k) for k in ("run", "baseline", "confirm_run", "bisect_run")]
    else:
        fields_ = {n: data.get("regression_kind" if n == "kind" else n)
                   for n in _REGRESSION_FIELDS}  # fmt: skip
        _choice(fields_["kind"], REGRESSION_KINDS, "regression_kind", where)
        _choice(fields_["state"], REGRESSION_STATES, "state", where)
        check_row(RegressionRow.__table__, fields_, where)
        for key in ("created_at", "updated_at"):
            _moment(data.get(key), key, where)
        events = data.get("events") or []
        if not isinstance(events, list):
            raise UsageError(f"{where}: events: expected a list")
        for e in events:
            if not isinstance(e, dict):
                raise UsageError(f"{where}: an event that is not an object")
            _moment(e.get("at"), "an event's date", where)
            values = {k: e.get(k) for k in ("by", "from_state", "to_state", "note")}
            check_row(RegressionEventRow.__table__, values, where)
        uids = [data.get(k) for k in ("first_bad_run", "last_good_run", "fixed_run")]
        uids += [e.get("run") for e in events]
    if any(u is not None and not isinstance(u, str) for u in uids):
        raise UsageError(f"{where}: a run named by something other than its uid")


def _lines(stream: IO[str], name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, parsed line) of every non-empty line; text that is not UTF-8 is refused."""
    number = 0
    try:
        for number, line in enumerate(stream, 1):
            if line.strip():
                where = f"{name}:{number}"
                yield where, _parse(line, where)
    except UnicodeDecodeError:
        raise UsageError(
            f"{name}:{number + 1}: not UTF-8 text (an export is JSON lines; a compressed "
            "one must be gzip)"
        ) from None


def check_lines(stream: IO[str], name: str = "<stdin>") -> int:
    """Validate a whole export, line by line, keeping nothing but the run ids seen; the
    number of lines. ``UsageError`` (exit 2) names file:line and what is wrong."""
    runs: set[Any] = set()
    current: Any = _NO_RUN
    count = 0
    for where, data in _lines(stream, name):
        count += 1
        kind = data["kind"]
        if kind == "run":
            line = _RunLine(data, where)
            current = line.file_id
            runs.add(current)
        elif kind == "result":
            if current is _NO_RUN or data.get("run") != current:
                raise UsageError(f"{where}: a result before its run line")
            _result(data, where)
        else:
            current = _NO_RUN
            _check_triage(data, where)
    return count


_NO_RUN = object()


class _Importer:
    """Pass two: every line written inside one transaction (``session``)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.run_id: int | None = None  # the run results go to (None: skipping its results)
        self.stopped: list[tuple[int, _RunLine]] = []
        self.batch: list[CaseResult] = []
        self.run_ids: dict[Any, int] = {}  # file id -> id here
        self.by_uid: dict[str, int] = {}  # uid -> id here
        self.alerts: dict[Any, int] = {}  # file id -> alert id here
        self.imported: list[int] = []

    def _flush(self) -> None:
        if self.batch and self.run_id is not None:
            write_results(self.session, self.run_id, self.batch)
        self.batch = []

    def run(self, line: _RunLine) -> None:
        self._flush()
        present = self.session.scalar(select(Run.id).where(Run.uid == line.meta.uid))
        self.run_ids[line.file_id] = self.by_uid[line.meta.uid] = present or 0
        if present is not None and not line.journal:
            self.run_id = None  # imported before (or exported from here): nothing changes
            return
        if present is None:
            row = Run(**line.values(), shard_label=None)
            self.session.add(row)
            self.session.flush()
            present = row.id
            self.run_ids[line.file_id] = self.by_uid[line.meta.uid] = present
        self.run_id = present  # a journal's results go into the run it was written for
        self.stopped.append((present, line))
        self.imported.append(present)

    def result(self, data: dict[str, Any], where: str) -> None:
        if self.run_id is None:
            return
        self.batch.append(_result(data, where))
        if len(self.batch) >= 500:
            self._flush()

    def finish(self) -> None:
        """Every imported run's counts, status and history summary, as the file says."""
        self._flush()
        self.run_id = None
        for run_id, line in self.stopped:
            run = self.session.get(Run, run_id)
            assert run is not None
            for key, value in count_values(run_counts(self.session, run_id)).items():
                setattr(run, key, value)
            if line.journal and run.status in ("finished",):
                continue  # a finished run stays finished
            run.status = "interrupted" if line.journal else line.values()["status"]
            run.finished_at = run.finished_at or line.finished or line.started
        self.session.flush()
        aggregate_runs(self.session, [run_id for run_id, _ in self.stopped])

    def _run(self, uid: str | None) -> int | None:
        if not uid:
            return None
        return self.by_uid.get(uid) or self.session.scalar(select(Run.id).where(Run.uid == uid))

    def alert(self, data: dict[str, Any]) -> None:
        self._flush()
        self.run_id = None
        session = self.session
        run_id = self._run(data.get("run"))
        found = session.scalar(select(AlertRow.id).where(
            AlertRow.run_id == run_id, AlertRow.kernel == data.get("kernel"),
            AlertRow.matrix == data.get("matrix"), AlertRow.device == data.get("device"),
        )) if run_id is not None else None  # fmt: skip
        if found is None:
            row = AlertRow(
                run_id=run_id, baseline_run=self._run(data.get("baseline")),
                confirm_run=self._run(data.get("confirm_run")),
                bisect_run=self._run(data.get("bisect_run")),
                created_at=_moment(data.get("created_at")),
                **{name: data.get(name) for name in _ALERT_FIELDS},
            )  # fmt: skip
            session.add(row)
            session.flush()
            found = row.id
        self.alerts[data.get("id")] = found

    def regression(self, data: dict[str, Any]) -> None:
        self._flush()
        self.run_id = None
        session = self.session
        data = {**data, "kind": data.get("regression_kind")}
        first_bad = self._run(data.get("first_bad_run"))
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
            last_good_run=self._run(data.get("last_good_run")),
            fixed_run=self._run(data.get("fixed_run")),
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
                run_id=self._run(e.get("run")), note=e.get("note"),
            ))  # fmt: skip


def import_lines(engine: Engine, stream: IO[str], name: str = "<stdin>") -> list[int]:
    """Store every run of an export not already present (and a journal's results in the run
    it was written for), and its triage, all in one transaction; the runs written, in file
    order. The stream is read twice (``check_lines`` first): it must be seekable. A file
    that fails anywhere changes nothing."""
    check_lines(stream, name)
    stream.seek(0)
    with write_session(engine) as session:
        importer = _Importer(session)
        for where, data in _lines(stream, name):
            kind = data["kind"]
            if kind == "run":
                importer.run(_RunLine(data, where))
            elif kind == "result":
                importer.result(data, where)
            elif kind == "alert":
                importer.alert(data)
            else:
                importer.regression(data)
        importer.finish()
    return importer.imported
