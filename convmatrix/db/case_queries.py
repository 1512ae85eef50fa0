"""What served pages ask of cases: one case across runs, a few cases of one run, the metrics
and failed checks behind them. Core queries on ``cases``, ``metrics`` and ``properties``
(they run on a connection or a session alike); long ``IN`` lists go in ``chunks``.

``case_across_runs`` is the one query for a case's history: a case page (every run holding
a case id or prefix) and an alert's page (its cases over the runs of its lineage) read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, select

from convmatrix.db.queries import chunks
from convmatrix.db.tables import cases, metrics, properties, runs

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = [
    "case_across_runs",
    "case_metrics",
    "case_outcomes",
    "case_params",
    "failed_outputs",
    "failed_properties",
    "run_cases_with",
    "run_dtypes",
]

_C, _M, _P = cases.c, metrics.c, properties.c


def case_across_runs(
    session: Reader,
    case_ids: Iterable[str] = (),
    *,
    prefix: str | None = None,
    run_ids: Sequence[int] | None = None,
    kernel: str | None = None,
) -> list[Row[Any]]:
    """(id, case_id, run_id, outcome, message) of the cases ``case_ids`` (or those whose id
    starts with ``prefix``) in every run holding them, or in ``run_ids`` only, or in runs of
    ``kernel`` only; ordered by when their run started, then the run's id."""
    query = (
        select(_C.id, _C.case_id, _C.run_id, _C.outcome, _C.message)
        .join(runs, runs.c.id == _C.run_id)
        .order_by(runs.c.started_at, runs.c.id)
    )
    if prefix is not None:
        query = query.where(_C.case_id.startswith(prefix, autoescape=True))
    if run_ids is not None:
        if not run_ids:
            return []
        query = query.where(_C.run_id.in_(list(run_ids)))
    if kernel:
        query = query.where(runs.c.kernel == kernel)
    if prefix is not None:
        return list(session.execute(query).all())
    return [
        row
        for batch in chunks(sorted(set(case_ids)))
        for row in session.execute(query.where(_C.case_id.in_(batch)))
    ]


def case_metrics(session: Reader, case_pks: Iterable[int]) -> dict[int, list[Row[Any]]]:
    """case pk -> its metric rows (output, e_rel, e_norm, bound_usage, usage_limit,
    broken_zeros), in write order."""
    found: dict[int, list[Row[Any]]] = {}
    for batch in chunks(case_pks):
        for m in session.execute(
            select(_M.case_pk, _M.output, _M.e_rel, _M.e_norm, _M.bound_usage,
                   _M.usage_limit, _M.broken_zeros)
            .where(_M.case_pk.in_(batch)).order_by(_M.id)
        ):  # fmt: skip
            found.setdefault(m.case_pk, []).append(m)
    return found


def case_params(session: Reader, run_id: int, case_id: str) -> Any:
    """A case's stored parameters (``Case.to_json()``), by its key (run, case id)."""
    return session.scalar(select(_C.params).where(_C.run_id == run_id, _C.case_id == case_id))


def case_outcomes(
    session: Reader, run_id: int, case_ids: Iterable[str], outcomes: Sequence[str] | None = None
) -> dict[str, str]:
    """case id -> outcome in run ``run_id``, for those of ``case_ids`` it holds (with one of
    ``outcomes`` only, when given)."""
    found: dict[str, str] = {}
    for batch in chunks(case_ids):
        query = select(_C.case_id, _C.outcome).where(_C.run_id == run_id, _C.case_id.in_(batch))
        if outcomes is not None:
            query = query.where(_C.outcome.in_(list(outcomes)))
        found.update((row.case_id, row.outcome) for row in session.execute(query))
    return found


def run_cases_with(session: Reader, run_id: int, outcomes: Sequence[str]) -> list[Row[Any]]:
    """The ``cases`` rows (every column) of run ``run_id`` with one of ``outcomes``."""
    query = select(cases).where(_C.run_id == run_id, _C.outcome.in_(list(outcomes)))
    return list(session.execute(query).all())


def run_dtypes(session: Reader, run_id: int) -> list[str]:
    """The input dtypes of a run's cases, sorted."""
    return sorted(session.scalars(select(_C.x_dtype).where(_C.run_id == run_id).distinct()))


def failed_outputs(
    session: Reader, base_id: int, head_id: int, case_ids: Iterable[str]
) -> list[Row[Any]]:
    """(case_id, output, bound_usage, usage_limit, e_rel, base_usage) of each output that
    failed in run ``head_id`` among these cases, ``base_usage`` the output's usage in run
    ``base_id`` (None: not there); in write order within each batch."""
    base_case, base_metric = cases.alias("base_case"), metrics.alias("base_metric")
    return [
        row
        for batch in chunks(case_ids)
        for row in session.execute(
            select(_C.case_id, _M.output, _M.bound_usage, _M.usage_limit, _M.e_rel,
                   base_metric.c.bound_usage.label("base_usage"))
            .join(metrics, _M.case_pk == _C.id)
            .outerjoin(base_case, (base_case.c.run_id == base_id)
                       & (base_case.c.case_id == _C.case_id))
            .outerjoin(base_metric, (base_metric.c.case_pk == base_case.c.id)
                       & (base_metric.c.output == _M.output))
            .where(_C.run_id == head_id, _C.case_id.in_(batch), ~_M.passed)
            .order_by(_M.id)
        )
    ]  # fmt: skip


def failed_properties(session: Reader, run_id: int, case_ids: Iterable[str]) -> list[Row[Any]]:
    """(case_id, name, detail) of each failed property check of run ``run_id``'s cases."""
    return [
        row
        for batch in chunks(case_ids)
        for row in session.execute(
            select(_C.case_id, _P.name, _P.detail)
            .join(properties, _P.case_pk == _C.id)
            .where(_C.run_id == run_id, _C.case_id.in_(batch), ~_P.passed)
            .order_by(_P.id)
        )
    ]
