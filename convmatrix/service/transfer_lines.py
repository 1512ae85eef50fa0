"""The lines of an export (``service.transfer``), read and checked before any is stored.

Every line is parsed and checked whole (``check_lines``) before the database is opened:
types as ``CaseResult.to_json`` writes them, outcomes, states and kinds by name, numbers and
text as their columns hold them, dates no later than tomorrow, UTF-8. A bad line is a
``UsageError`` (exit 2) naming file:line and what is wrong with it; nothing is stored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import fields
from datetime import datetime
from typing import IO, Any

from convmatrix.core.errors import UsageError
from convmatrix.core.records import OUTCOMES, RUN_KINDS, CaseResult, RunMeta
from convmatrix.db.models import AlertRow, RegressionEventRow, RegressionRow, Run
from convmatrix.db.records import CASES, METRICS, PROPERTIES, TIMINGS, case_row, child_rows
from convmatrix.db.tables import REGRESSION_KINDS, REGRESSION_STATES, RUN_STATUSES, utcnow
from convmatrix.db.validate import check_moment, check_row
from convmatrix.db.writer import run_values

__all__ = [
    "ALERT_FIELDS",
    "META",
    "REGRESSION_FIELDS",
    "RunLine",
    "check_lines",
    "moment",
    "read_lines",
    "read_result",
]

META = {f.name for f in fields(RunMeta)}
_KINDS = ("run", "result", "alert", "regression")
_TIMES = ("median_s", "min_s", "iqr_s", "n", "cold_s")
ALERT_FIELDS = ("kernel", "matrix", "device", "explanation", "bisect_commit")
REGRESSION_FIELDS = (
    "kernel", "matrix", "device", "case_id", "case_name", "output", "kind", "state", "detail",
    "first_bad_commit", "last_good_commit", "changed_by", "note", "outputs", "properties",
    "assignee", "bug",
)  # fmt: skip


def _parse(line: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as err:
        msg = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deep"
        raise UsageError(f"{where}: not JSON ({msg})") from None
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise UsageError(f"{where}: expected a run, result, alert or regression line")
    return data


def moment(text: Any, what: str = "a date", where: str = "") -> datetime | None:
    """An ISO date-time of the file (None: none given); ``UsageError`` for one that is not
    text, not a date, or later than tomorrow (a run dated 9999-12-31 was 'latest' for ever)."""
    if text is None or text == "":
        return None
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {what} {str(text)[:40]!r} is not an ISO date") from None
    problem = check_moment(when, what)
    if problem:
        raise UsageError(f"{where}: {problem}")
    return when


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


def read_result(data: dict[str, Any], where: str) -> CaseResult:
    """The result a result line holds, every row it becomes checked against its columns, its
    case id against its parameters and its times and counts against zero."""
    _check_types(data.get("result"), where)
    try:
        result = CaseResult.from_json(data["result"])
        case = CASES.values(case_row(result, 0, utcnow()))
        children = child_rows(result, 0, 0)
    except _BAD_RECORD as err:
        raise UsageError(f"{where}: bad result ({type(err).__name__}: {err})"[:300]) from None
    _choice(result.outcome, OUTCOMES, "outcome", where)
    expected = result.case.stable_id()
    if result.case.id != expected:  # an id is what history, diffs and regressions match on
        raise UsageError(
            f"{where}: case id {result.case.id[:40]!r} does not match its parameters "
            f"(they give {expected})"
        )
    _check_signs(result, where)
    check_row(CASES.table, case, where)
    for layout, rows in zip((METRICS, PROPERTIES, TIMINGS), children, strict=True):
        for row in rows:
            check_row(layout.table, layout.values(row), where)
    return result


def _check_signs(result: CaseResult, where: str) -> None:
    """Durations, memory, counts and indices are never negative (nor NaN or infinite)."""
    values: list[tuple[str, Any]] = [
        ("duration_s", result.duration_s), ("peak_mem_mb", result.peak_mem_mb),
        ("retries", result.retries), ("device_index", result.device_index),
    ]  # fmt: skip
    for timing in result.timings:
        values += [(f"timings.{n}", getattr(timing, n)) for n in _TIMES]
        values += [("timings.samples", v) for v in timing.samples or []]
    for name, value in values:
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise UsageError(f"{where}: result.{name}: {value!r} (a time or count is >= 0)")


class RunLine:
    """A run line, checked: its meta, uid, status and times."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        meta = data.get("meta")
        if not isinstance(meta, dict):
            raise UsageError(f"{where}: bad run line (no meta)")
        unknown = sorted(set(meta) - META)
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
        moment(data["started_at"], "started_at", where)
        self.finished = moment(data.get("finished_at"), "finished_at", where)
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
        check_row(AlertRow.__table__, {n: data.get(n) for n in ALERT_FIELDS}, where)
        moment(data.get("created_at"), "created_at", where)
        uids = [data.get(k) for k in ("run", "baseline", "confirm_run", "bisect_run")]
    else:
        fields_ = {n: data.get("regression_kind" if n == "kind" else n)
                   for n in REGRESSION_FIELDS}  # fmt: skip
        _choice(fields_["kind"], REGRESSION_KINDS, "regression_kind", where)
        _choice(fields_["state"], REGRESSION_STATES, "state", where)
        check_row(RegressionRow.__table__, fields_, where)
        for key in ("created_at", "updated_at"):
            moment(data.get(key), key, where)
        events = data.get("events") or []
        if not isinstance(events, list):
            raise UsageError(f"{where}: events: expected a list")
        for e in events:
            if not isinstance(e, dict):
                raise UsageError(f"{where}: an event that is not an object")
            moment(e.get("at"), "an event's date", where)
            values = {k: e.get(k) for k in ("by", "from_state", "to_state", "note")}
            check_row(RegressionEventRow.__table__, values, where)
        uids = [data.get(k) for k in ("first_bad_run", "last_good_run", "fixed_run")]
        uids += [e.get("run") for e in events]
    if any(u is not None and not isinstance(u, str) for u in uids):
        raise UsageError(f"{where}: a run named by something other than its uid")


def read_lines(stream: IO[str], name: str) -> Iterator[tuple[str, dict[str, Any]]]:
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
    """Validate a whole export, line by line, keeping nothing but the run ids seen and the
    case ids of the run being read; the number of lines. ``UsageError`` (exit 2) names
    file:line and what is wrong: a case twice in one run names both lines."""
    current: Any = _NO_RUN
    cases: dict[str, str] = {}  # case id -> where, in the run being read
    count = 0
    for where, data in read_lines(stream, name):
        count += 1
        kind = data["kind"]
        if kind == "run":
            current, cases = RunLine(data, where).file_id, {}
        elif kind == "result":
            if current is _NO_RUN or data.get("run") != current:
                raise UsageError(f"{where}: a result before its run line")
            case_id = read_result(data, where).case.id
            if case_id in cases:
                raise UsageError(
                    f"{where}: case {case_id} again in this run (first at {cases[case_id]})"
                )
            cases[case_id] = where
        else:
            current = _NO_RUN
            _check_triage(data, where)
    return count


_NO_RUN = object()
