"""Between ``CaseResult`` records and table rows, both ways, in one place.

The writer turns results into plain dicts for bulk inserts; the loader turns rows back into
results. A metric or timing row has a column of the same name for every field of its record
(``OutputMetrics``, ``TimingResult``), so a new field needs a column and a migration, nothing
here. Values are coerced at this boundary (numpy/torch scalars to ``int``/``float``) so JSON
columns and drivers only ever see plain Python numbers. NaN is stored as NULL on every backend
(SQLite does that by itself) and a measured error that comes back NULL is NaN again.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from sqlalchemy import Row

from convmatrix.core.case import Case
from convmatrix.core.records import (
    CaseResult,
    ErrorMetrics,
    OutputMetrics,
    PropertyResult,
    TimingResult,
)
from convmatrix.core.verdict import judged_dtype

__all__ = [
    "CASE_COLUMNS",
    "case_values",
    "child_values",
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


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def case_values(result: CaseResult, run_id: int) -> dict[str, Any]:
    """The ``cases`` row of one result."""
    result.sanitised()  # idempotent: text from a kernel, safe for every driver
    case = result.case
    row = {name: getattr(case, name) for name in CASE_COLUMNS}
    row.update(
        run_id=run_id,
        case_id=case.id,
        packed=case.seq_lens is not None,
        params=case.to_json(),
        outcome=result.outcome,
        message=result.message,
        duration_s=float(result.duration_s),
        worker=result.worker,
        peak_mem_mb=_num(result.peak_mem_mb),
        host=result.host,
        device_index=result.device_index,
        retries=int(result.retries),
        retry_reason=result.retry_reason,
        phases=result.phases or None,
    )
    return row


def _plain(value: Any) -> Any:
    """numpy and torch scalars as Python numbers (drivers and JSON take only those)."""
    return value.item() if hasattr(value, "item") else value


def _column(value: Any) -> Any:
    """A record field as its column takes it: numbers plain (NaN as NULL), lists of ints."""
    value = _plain(value)
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, (list, tuple)):
        return [int(i) for i in value]
    return _num(value)


def _metric(m: OutputMetrics) -> dict[str, Any]:
    return {n: _column(getattr(m, n)) for n in _METRIC_FIELDS}


def _timing(t: TimingResult) -> dict[str, Any]:
    row = {n: _plain(getattr(t, n)) for n in _TIMING_FIELDS}
    row["samples"] = [float(s) for s in t.samples]
    return row


def child_values(
    result: CaseResult, case_pk: int, run_id: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``metrics``, ``properties`` and ``timings`` rows of one stored result."""
    keys = {"case_pk": case_pk, "run_id": run_id}
    case = result.case
    metrics = [
        {**_metric(m), **keys, "x_dtype": judged_dtype(m.output, case)} for m in result.outputs
    ]
    props = [
        {**keys, "name": p.name, "passed": bool(p.passed), "detail": p.detail or ""}
        for p in result.properties
    ]
    timings = [{**_timing(t), **keys} for t in result.timings]
    return metrics, props, timings


def result_from_rows(
    case: Row[Any], metrics: list[Row[Any]], props: list[Row[Any]], timings: list[Row[Any]]
) -> CaseResult:
    """Rebuild the ``CaseResult`` a case row and its child rows were written from."""
    outputs = [
        OutputMetrics(
            **{n: _nan(getattr(m, n)) if n in _MEASURED else getattr(m, n) for n in _METRIC_FIELDS}
        )
        for m in metrics
    ]
    return CaseResult(
        case=Case.from_json(case.params),
        outcome=case.outcome,
        duration_s=case.duration_s,
        message=case.message,
        outputs=outputs,
        properties=[PropertyResult(p.name, p.passed, p.detail) for p in props],
        timings=[TimingResult(**{n: getattr(t, n) for n in _TIMING_FIELDS}) for t in timings],
        worker=case.worker,
        peak_mem_mb=getattr(case, "peak_mem_mb", None),
        host=case.host,
        device_index=case.device_index,
        retries=case.retries or 0,
        retry_reason=case.retry_reason,
        phases=dict(getattr(case, "phases", None) or {}),
    )
