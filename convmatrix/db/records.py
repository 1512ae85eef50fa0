"""Between ``CaseResult`` records and table rows, both ways, in one place.

The writer turns results into plain tuples in each table's ``Layout`` order and inserts them
with the driver's ``executemany`` (``Layout.insert``): a 10,000-case run is tens of thousands of
rows, and building dicts field by field through ``dataclasses.asdict`` and per-value type
checks cost more than the SQL (benchmarks/bench_db_ingest.py). Each field's conversion is
chosen once, from the record's declared type (``_CONVERT``); JSON and timestamp columns go
through the column type's own bind processor, so rows are stored exactly as a Core insert
would store them. The loader turns rows back into results.

A metric or timing row has a column of the same name for every field of its record
(``OutputMetrics``, ``TimingResult``), so a new field needs a column and a migration, nothing
here. Values are coerced at this boundary (numpy/torch scalars to ``int``/``float``) so JSON
columns and drivers only ever see plain Python numbers. NaN is stored as NULL on every backend
(SQLite does that by itself) and a measured error that comes back NULL is NaN again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cache
from operator import attrgetter
from typing import Any

from sqlalchemy import JSON, Connection, DateTime, Row, Table
from sqlalchemy.engine import Dialect

from convmatrix.core.case import Case
from convmatrix.core.records import (
    CaseResult,
    ErrorMetrics,
    OutputMetrics,
    PropertyResult,
    TimingResult,
)
from convmatrix.core.verdict import judged_dtype
from convmatrix.db.tables import cases, metrics, properties, timings

__all__ = [
    "CASES",
    "CASES_WITH_ID",
    "CASE_COLUMNS",
    "METRICS",
    "PROPERTIES",
    "TIMINGS",
    "Layout",
    "case_row",
    "child_rows",
    "result_from_rows",
]

# Case fields stored as real columns (the rest live in ``params`` only).
CASE_COLUMNS = (
    "suite", "op", "width", "seqlen", "dim", "batch", "layout", "gap", "activation", "bias",
    "x_dtype", "w_dtype", "initial_state", "final_state", "dfinal", "tokens", "steps",
    "state_len", "circular", "slots", "expect",
)  # fmt: skip
_METRIC_FIELDS = tuple(f.name for f in fields(OutputMetrics))
# Measured errors (never None in a record): NULL in the database reads back as NaN.
_MEASURED = frozenset(f.name for f in fields(ErrorMetrics) if f.type == "float")
_TIMING_FIELDS = tuple(f.name for f in fields(TimingResult))
_PLACEHOLDER = {"qmark": "?", "format": "%s", "pyformat": "%s"}


@dataclass(frozen=True)
class Layout:
    """A table's columns in the order its row tuples hold them."""

    table: Table
    columns: tuple[str, ...]

    def values(self, row: Sequence[Any]) -> dict[str, Any]:
        """One row as a mapping of column to value (to check it: ``validate.check_row``)."""
        return dict(zip(self.columns, row, strict=True))

    def insert(self, connection: Connection, rows: list[tuple[Any, ...]]) -> None:
        """``executemany`` of ``rows`` by the driver itself: no per-row parameter processing
        but the JSON and timestamp columns' own bind processors."""
        if not rows:
            return
        sql, encode = self.prepared(connection.dialect)
        if encode is not None:
            rows = list(map(encode, rows))
        connection.exec_driver_sql(sql, rows)  # type: ignore[arg-type]

    def prepared(self, dialect: Dialect) -> tuple[str, Callable[[tuple[Any, ...]], Any] | None]:
        """The INSERT for ``dialect``'s driver, and what makes a row one the driver takes
        (None: rows go as they are): the bind processors of the columns that need one (JSON,
        timestamps), applied by a function generated once per layout and dialect."""
        return _statement(self, dialect)


@cache
def _statement(layout: Layout, dialect: Dialect) -> tuple[str, tuple[tuple[int, Any], ...]]:
    mark = _PLACEHOLDER.get(dialect.paramstyle)
    if mark is None:
        raise NotImplementedError(f"the {dialect.name} driver's {dialect.paramstyle} style")
    quote = dialect.identifier_preparer.quote
    names = ", ".join(quote(name) for name in layout.columns)
    sql = (
        f"INSERT INTO {quote(layout.table.name)} ({names}) "
        f"VALUES ({', '.join([mark] * len(layout.columns))})"
    )
    encoders = {}
    for index, name in enumerate(layout.columns):
        kind = layout.table.c[name].type
        if isinstance(kind, (JSON, DateTime)):
            process = kind.dialect_impl(dialect).bind_processor(dialect)
            if process is not None and isinstance(kind, JSON):
                process = _json_ints_first(process)
            if process is not None:
                encoders[f"e{index}"] = process
    if not encoders:
        return sql, None
    values = "".join(
        (f"e{i}(row[{i}]), " if f"e{i}" in encoders else f"row[{i}], ")
        for i in range(len(layout.columns))
    )
    exec(f"def encode(row):\n    return ({values})", encoders)  # indices and our names only
    return sql, encoders["encode"]


def _json_ints_first(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``process`` (the column's JSON bind processor) with a fast path for a list of ints,
    the metrics' ``worst_index``: the same text ``json.dumps`` writes, joined directly (a
    third of the writer's JSON calls; each ``dumps`` builds an encoder). Kept only where
    ``process`` writes JSON text (SQLite, the psycopg driver may wrap values instead)."""
    if process([0, 1]) != "[0, 1]":
        return process

    def encode(value: Any) -> Any:
        if type(value) is list and all(type(i) is int for i in value):
            return "[" + ", ".join(map(str, value)) + "]"
        return process(value)

    return encode


def _num(value: Any) -> float | None:
    """A measured number as its column keeps it: NaN as NULL."""
    if value is None:
        return None
    value = float(value)
    return None if value != value else value  # NaN, without a call per value


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _ints(value: Any) -> list[int] | None:
    return None if value is None else [int(i) for i in value]


def _floats(value: Any) -> list[float]:
    return [float(v) for v in value]


# A float as its column keeps it, written inline in the generated row functions below:
# measured errors NaN as NULL (``_num``), timings as measured (NaN kept where the backend does).
_NUM = "(None if (v := r.{}) is None or (v := float(v)) != v else v)"
_FLOAT = "(None if (v := r.{}) is None else float(v))"


def _row_values(record: type, floats: str) -> Callable[[Any], tuple[Any, ...]]:
    """A function from one ``record`` to its fields' values, in order, each made one its
    column takes by a conversion chosen once from the declared type (``floats``: the
    expression for float fields). Generated once per record type, as ``dataclasses``
    generates ``__init__``: a row then costs no dispatch, zip, intermediate list or call
    per float (the writer builds six rows a result, most of their values floats)."""
    calls = {
        "int": "_int", "int | None": "_int", "bool": "_bool", "str": "_text",
        "str | None": "_text", "list[int] | None": "_ints", "list[float]": "_floats",
    }  # fmt: skip
    values = "".join(
        (floats if f.type in ("float", "float | None") else calls[f.type] + "(r.{})").format(f.name)
        + ", "
        for f in fields(record)
    )
    scope = {"_int": _int, "_bool": _bool, "_text": _text, "_ints": _ints, "_floats": _floats}
    exec(f"def values(r):\n    return ({values})", scope)  # our own field names only
    return scope["values"]


_metric_values = _row_values(OutputMetrics, _NUM)
_timing_values = _row_values(TimingResult, _FLOAT)
_case_columns = attrgetter(*CASE_COLUMNS)

CASES = Layout(cases, (
    "run_id", "case_id", *CASE_COLUMNS, "packed", "params", "outcome", "message", "duration_s",
    "worker", "peak_mem_mb", "host", "device_index", "retries", "retry_reason", "phases",
    "created_at",
))  # fmt: skip
CASES_WITH_ID = Layout(cases, ("id", *CASES.columns))  # ids given (SQLite: ``writer``)
METRICS = Layout(metrics, ("case_pk", "run_id", "x_dtype", *_METRIC_FIELDS))
PROPERTIES = Layout(
    properties,
    ("case_pk", "run_id", "name", "passed", "detail", "forward_calls", "backward_calls"),
)
TIMINGS = Layout(timings, ("case_pk", "run_id", *_TIMING_FIELDS))


def case_row(result: CaseResult, run_id: int, created_at: datetime) -> tuple[Any, ...]:
    """The ``cases`` row of one result, in ``CASES`` order."""
    result.sanitised()  # idempotent: text from a kernel, safe for every driver
    case = result.case
    return (
        run_id, case.id, *_case_columns(case), case.seq_lens is not None, case.to_json(),
        result.outcome, result.message, float(result.duration_s), result.worker,
        _num(result.peak_mem_mb), result.host, result.device_index, int(result.retries),
        result.retry_reason, result.phases or None, created_at,
    )  # fmt: skip


def child_rows(
    result: CaseResult, case_pk: int, run_id: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The ``metrics``, ``properties`` and ``timings`` rows of one stored result, in the
    order of ``METRICS``, ``PROPERTIES`` and ``TIMINGS``."""
    case = result.case
    metrics = [
        (case_pk, run_id, judged_dtype(m.output, case), *_metric_values(m)) for m in result.outputs
    ]
    props = [
        (case_pk, run_id, p.name, bool(p.passed), p.detail or "", p.forward_calls,
         p.backward_calls)
        for p in result.properties
    ]  # fmt: skip
    timings = [(case_pk, run_id, *_timing_values(t)) for t in result.timings]
    return metrics, props, timings


# What ``load_results`` selects of each child table after ``case_pk``: the record's fields in
# their order, so a row builds its record positionally (reading a 10k-case run by name cost
# 17 getattr calls a metrics row, a third of the time).
METRIC_COLUMNS = _METRIC_FIELDS
PROPERTY_COLUMNS = tuple(f.name for f in fields(PropertyResult))
TIMING_COLUMNS = _TIMING_FIELDS
_NAN_AT = tuple(i for i, name in enumerate(_METRIC_FIELDS) if name in _MEASURED)


def _output_metrics(values: Sequence[Any]) -> OutputMetrics:
    """A metrics row's values (``METRIC_COLUMNS``) as the record: a NULL error is NaN again."""
    if any(values[i] is None for i in _NAN_AT):
        values = [math.nan if i in _NAN_AT and v is None else v for i, v in enumerate(values)]
    return OutputMetrics(*values)


def result_from_rows(
    case: Row[Any], metrics: list[Row[Any]], props: list[Row[Any]], timings: list[Row[Any]]
) -> CaseResult:
    """Rebuild the ``CaseResult`` a case row and its child rows were written from (each child
    row ``case_pk`` and then its record's columns: ``METRIC_COLUMNS``, ``PROPERTY_COLUMNS``,
    ``TIMING_COLUMNS``)."""
    return CaseResult(
        case=Case.from_json(case.params),
        outcome=case.outcome,
        duration_s=case.duration_s,
        message=case.message,
        outputs=[_output_metrics(m[1:]) for m in metrics],
        properties=[PropertyResult(*p[1:]) for p in props],
        timings=[TimingResult(*t[1:]) for t in timings],
        worker=case.worker,
        peak_mem_mb=getattr(case, "peak_mem_mb", None),
        host=case.host,
        device_index=case.device_index,
        retries=case.retries or 0,
        retry_reason=case.retry_reason,
        phases=dict(getattr(case, "phases", None) or {}),
    )
