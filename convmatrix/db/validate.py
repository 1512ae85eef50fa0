"""Rows from outside (an import) checked against the columns they are headed for.

SQLite takes any value in any column: an export edited by hand stored the text
``"4; DROP TABLE runs"`` in an integer column, and ``report`` crashed on it later; PostgreSQL
would refuse a value mid-import, leaving half a run. ``check_row`` holds every value to its
column's type before anything is written: an integer a BIGINT (or INTEGER) holds and not a
boolean, a number for a float, text within the column's length and without NUL, a boolean, a
date no later than tomorrow, JSON of plain finite values and no NUL; NULL only where the
column allows it. ``UsageError`` (exit 2) names where, the column and why, in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, Integer, String, Table, Text

from convmatrix.core.errors import UsageError

__all__ = ["FUTURE_SLACK", "check_moment", "check_row"]

_INT32 = (1 << 31) - 1
_INT64 = (1 << 63) - 1
_JSON_DEPTH = 32
FUTURE_SLACK = timedelta(days=1)  # clocks disagree; a run dated later than this is refused


def check_moment(moment: datetime, what: str) -> str | None:
    """Why ``moment`` cannot date a run or an event (after tomorrow: it would be ``latest``
    for ever and every run's baseline), or None."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    if aware > datetime.now(timezone.utc) + FUTURE_SLACK:
        return f"{what} {moment.isoformat()} is in the future"
    return None


def _json_problem(value: Any, depth: int = 0) -> str | None:
    if depth > _JSON_DEPTH:
        return f"nested deeper than {_JSON_DEPTH} levels"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if abs(value) <= _INT64 else "an integer past 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else "a NaN or infinite number"
    if isinstance(value, str):
        return "a NUL character" if "\x00" in value else None
    if isinstance(value, list | tuple):
        return next((p for v in value if (p := _json_problem(v, depth + 1))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or "\x00" in key:
                return "a key that is not text"
            if problem := _json_problem(item, depth + 1):
                return problem
        return None
    return f"a {type(value).__name__}"


def _problem(column: Any, value: Any) -> str | None:
    kind = column.type
    if value is None:
        return None if column.nullable or column.primary_key else "missing (null)"
    if isinstance(kind, Boolean):
        return None if isinstance(value, bool) else f"expected true or false, got {value!r:.40}"
    if isinstance(kind, Integer):  # BigInteger is an Integer
        limit = _INT64 if isinstance(kind, BigInteger) else _INT32
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {value!r:.40}"
        return None if abs(value) <= limit else f"{value} does not fit the column"
    if isinstance(kind, Float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {value!r:.40}"
        return (
            None
            if abs(value) <= 1.7976931348623157e308 or math.isnan(value)
            else ("a number past the largest float")
        )
    if isinstance(kind, String | Text):
        if not isinstance(value, str):
            return f"expected text, got {value!r:.40}"
        if "\x00" in value:
            return "a NUL character in the text"
        length = getattr(kind, "length", None)
        return (
            None
            if length is None or len(value) <= length
            else (f"{len(value)} characters, at most {length}")
        )
    if isinstance(kind, DateTime):
        return None if isinstance(value, datetime) else f"expected a date, got {value!r:.40}"
    if isinstance(kind, JSON):
        return _json_problem(value)
    return None


def check_row(table: Table, values: Mapping[str, Any], where: str) -> None:
    """``UsageError`` for the first value of ``values`` its column of ``table`` cannot hold."""
    for column in table.columns:
        if column.name in values:
            problem = _problem(column, values[column.name])
            if problem:
                raise UsageError(f"{where}: {table.name}.{column.name}: {problem}")
    unknown = [key for key in values if key not in table.columns]
    if unknown:
        raise UsageError(f"{where}: {table.name} has no column {unknown[0]!r}")
