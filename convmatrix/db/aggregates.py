"""Per-run summaries for history: computed once when a run stops writing, read back cheaply.

``convmatrix history`` shows, per run and output, the worst and median bound usage, e_rel and
e_norm of one judged dtype. Medians need every metric row of the dtype sorted, which over a
million rows takes seconds (benchmarks/bench_reports.py); a run's numbers never change once it
stops writing, so they are computed then and stored in ``run_summaries`` (and the per-dtype
outcome counts in ``run_counts``). The SELECTs below are the only definition of those
numbers: ``aggregate_runs`` fills the tables from them, and ``queries.history`` runs the same
SELECTs live for runs whose summary is missing or stale (``Run.summarised_at`` NULL: running,
or written since).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Float,
    Select,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)

from convmatrix.core.records import OUTCOMES
from convmatrix.db.tables import cases, metrics, run_counts, run_summaries, runs, utcnow

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = [
    "COUNT_COLUMNS",
    "SUMMARY_COLUMNS",
    "aggregate_pending",
    "aggregate_runs",
    "count_select",
    "summary_select",
]

SUMMARY_COLUMNS = (
    "run_id", "x_dtype", "output", "cases", "passed", "worst_rel", "median_rel", "worst_norm",
    "median_norm", "worst_case_id", "worst_usage", "median_usage",
)  # fmt: skip
COUNT_COLUMNS = ("run_id", "x_dtype", *(f"n_{o}" for o in OUTCOMES))

_CHUNK = 100  # runs per statement when many are summarised at once (after an upgrade)


def _median(values: Any, rank: Any, n: Any) -> Any:
    """Median of ``values`` within a group, from a row number and the group size.

    The middle one (n odd) or the mean of the middle two (n even), as percentile_cont(0.5):
    portable to SQLite, which has no ordered-set aggregates.
    """
    return func.avg(case((or_(rank == (n + 1) // 2, rank == (n + 2) // 2), values)))


def summary_select(
    run_ids: Sequence[int], *, dtype: str | None = None, output: str | None = None
) -> Select[Any]:
    """Per (run, judged dtype, output) of ``run_ids``: the columns of ``SUMMARY_COLUMNS``.

    A NaN error (stored as NULL) counts as +inf: a kernel that emits NaN is the worst case.
    Bound usage is never NaN (a non-finite output is stored as an infinite usage); NULL is a
    row without one (written before 0003, an exact output), and its median is over the rows
    that have one (NULL when none does). Among equal worst errors the first case written is
    named (ties ordered by ``case_pk``), so the stored and the live answer agree.
    ``dtype``/``output`` restrict it (history's filters).
    """
    m = metrics.c
    inf = literal(math.inf, Float)
    rel = func.coalesce(m.e_rel, inf)
    norm = func.coalesce(m.e_norm, inf)
    group = (m.run_id, m.x_dtype, m.output)
    conditions = [m.run_id.in_(list(run_ids))]
    if dtype is not None:
        conditions.append(m.x_dtype == dtype)
    if output is not None:
        conditions.append(m.output == output)
    ranked = (
        select(
            *group,
            m.passed,
            m.case_pk,
            rel.label("rel"),
            norm.label("norm"),
            m.bound_usage.label("usage"),
            func.row_number()
            .over(partition_by=group, order_by=(rel, m.case_pk.desc()))
            .label("rel_rank"),
            func.row_number().over(partition_by=group, order_by=norm).label("norm_rank"),
            # NULLs last on both backends (SQLite sorts them first by default): the ranks
            # 1..n_usage are the rows that recorded a usage.
            func.row_number()
            .over(partition_by=group, order_by=m.bound_usage.asc().nulls_last())
            .label("usage_rank"),
            func.count().over(partition_by=group).label("n"),
            func.count(m.bound_usage).over(partition_by=group).label("n_usage"),
        )
        .where(*conditions)
        .subquery()
    )
    r = ranked.c
    per_group = (
        select(
            r.run_id,
            r.x_dtype,
            r.output,
            func.count().label("cases"),
            func.sum(case((r.passed, 1), else_=0)).label("passed"),
            func.max(r.rel).label("worst_rel"),
            _median(r.rel, r.rel_rank, r.n).label("median_rel"),
            func.max(r.norm).label("worst_norm"),
            _median(r.norm, r.norm_rank, r.n).label("median_norm"),
            func.max(case((r.rel_rank == r.n, r.case_pk))).label("worst_pk"),
            func.max(r.usage).label("worst_usage"),
            _median(r.usage, r.usage_rank, r.n_usage).label("median_usage"),
        )
        .group_by(r.run_id, r.x_dtype, r.output)
        .subquery()
    )
    # The worst case's id: one lookup per group rather than a join on every metric row.
    g = per_group.c
    named = (
        *(g[c] for c in SUMMARY_COLUMNS[:-3]),
        cases.c.case_id.label("worst_case_id"),
        g.worst_usage,
        g.median_usage,
    )
    return select(*named).join(cases, cases.c.id == g.worst_pk)


def count_select(run_ids: Sequence[int], *, dtype: str | None = None) -> Select[Any]:
    """Per (run, input dtype) of ``run_ids``: cases by outcome (``COUNT_COLUMNS``)."""
    c = cases.c
    conditions = [c.run_id.in_(list(run_ids))]
    if dtype is not None:
        conditions.append(c.x_dtype == dtype)
    return (
        select(
            c.run_id,
            c.x_dtype,
            *(func.sum(case((c.outcome == o, 1), else_=0)).label(f"n_{o}") for o in OUTCOMES),
        )
        .where(*conditions)
        .group_by(c.run_id, c.x_dtype)
    )


def aggregate_runs(db: Reader, run_ids: Sequence[int]) -> None:
    """(Re)compute the stored summaries of ``run_ids`` and mark them current.

    Runs inside the caller's transaction (the writer's, with its status update), so a reader
    sees either the old summary or the new one, never half of it.
    """
    ordered = sorted(set(run_ids))
    for start in range(0, len(ordered), _CHUNK):
        ids = ordered[start : start + _CHUNK]
        for table in (run_summaries, run_counts):
            db.execute(delete(table).where(table.c.run_id.in_(ids)))
        db.execute(insert(run_summaries).from_select(SUMMARY_COLUMNS, summary_select(ids)))
        db.execute(insert(run_counts).from_select(COUNT_COLUMNS, count_select(ids)))
        db.execute(update(runs).where(runs.c.id.in_(ids)).values(summarised_at=utcnow()))


def aggregate_pending(db: Reader) -> list[int]:
    """Summarise every run that stopped writing without a current summary; returns their ids.

    Used after a schema upgrade (runs written before summaries existed) and by tools that
    insert runs without the writer (benchmarks/bench_reports.py).
    """
    ids = list(
        db.execute(
            select(runs.c.id).where(runs.c.summarised_at.is_(None), runs.c.status != "running")
        ).scalars()
    )
    aggregate_runs(db, ids)
    return ids
