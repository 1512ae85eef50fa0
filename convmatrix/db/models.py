"""ORM classes mapped onto the tables of ``db.tables``, for the code that changes rows one by
one: the writer's run bookkeeping, regressions and alerts, their triage, export and import.

The schema is declared once, as Core tables (``db.tables``); these classes add attribute
access and the unit of work on top and declare nothing of their own (the annotations are for
type checkers and name the same columns). Reading commands import none of this: importing
``sqlalchemy.orm`` and mapping the classes cost a fifth of their start-up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import DeclarativeBase, Mapped

from convmatrix.db import tables

__all__ = [
    "AlertRow",
    "Base",
    "CaseRow",
    "MetricRow",
    "PropertyRow",
    "RegressionEventRow",
    "RegressionRow",
    "Run",
    "RunAggregateRow",
    "RunCountRow",
    "RunPageRow",
    "RunShardRow",
    "TimingRow",
]


class Base(DeclarativeBase):
    metadata = tables.metadata


class Run(Base):
    """One invocation of ``convmatrix run``; counts are kept current as batches commit."""

    __table__ = tables.runs

    id: Mapped[int]
    uid: Mapped[str]
    kind: Mapped[str]
    kernel: Mapped[str]
    kernel_commit: Mapped[str | None]
    kernel_dirty: Mapped[bool | None]
    matrix: Mapped[str]
    matrix_hash: Mapped[str]
    device_kind: Mapped[str]
    device_name: Mapped[str | None]
    host: Mapped[str]
    pid: Mapped[int | None]
    versions: Mapped[Any]
    label: Mapped[str | None]
    argv: Mapped[Any]
    options: Mapped[Any]
    geometry: Mapped[Any | None]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    status: Mapped[str]
    n_planned: Mapped[int | None]
    n_passed: Mapped[int]
    n_failed: Mapped[int]
    n_skipped: Mapped[int]
    n_crashed: Mapped[int]
    n_timeout: Mapped[int]
    n_error: Mapped[int]
    n_lost: Mapped[int]
    heartbeat_at: Mapped[datetime | None]
    summarised_at: Mapped[datetime | None]
    shard_label: Mapped[str | None]
    shard_count: Mapped[int | None]


class CaseRow(Base):
    """One case's outcome in one run; its dimensions as columns, the full case in ``params``."""

    __table__ = tables.cases

    id: Mapped[int]
    run_id: Mapped[int]
    case_id: Mapped[str]
    suite: Mapped[str]
    op: Mapped[str]
    width: Mapped[int]
    seqlen: Mapped[int | None]
    dim: Mapped[int]
    batch: Mapped[int]
    layout: Mapped[str]
    gap: Mapped[str | None]
    activation: Mapped[str | None]
    bias: Mapped[bool]
    x_dtype: Mapped[str]
    w_dtype: Mapped[str]
    initial_state: Mapped[str | None]
    final_state: Mapped[bool | None]
    dfinal: Mapped[str | None]
    packed: Mapped[bool]
    tokens: Mapped[int | None]
    steps: Mapped[int | None]
    state_len: Mapped[int | None]
    circular: Mapped[bool | None]
    slots: Mapped[str | None]
    expect: Mapped[str]
    params: Mapped[Any]
    outcome: Mapped[str]
    message: Mapped[str | None]
    duration_s: Mapped[float]
    worker: Mapped[str | None]
    peak_mem_mb: Mapped[float | None]
    created_at: Mapped[datetime]
    host: Mapped[str | None]
    device_index: Mapped[int | None]
    retries: Mapped[int]
    retry_reason: Mapped[str | None]
    phases: Mapped[Any | None]


class MetricRow(Base):
    """Errors of one output of one case (docs/spec.md §4), the framework path's, and the verdict."""

    __table__ = tables.metrics

    id: Mapped[int]
    case_pk: Mapped[int]
    run_id: Mapped[int]
    x_dtype: Mapped[str]
    output: Mapped[str]
    e_abs: Mapped[float | None]
    e_rel: Mapped[float | None]
    e_norm: Mapped[float | None]
    tau: Mapped[float | None]
    scale: Mapped[float | None]
    worst_index: Mapped[Any | None]
    fw_abs: Mapped[float | None]
    fw_rel: Mapped[float | None]
    fw_norm: Mapped[float | None]
    limit_rel: Mapped[float | None]
    limit_norm: Mapped[float | None]
    passed: Mapped[bool]
    bound_usage: Mapped[float | None]
    limit_usage: Mapped[float | None]
    usage_limit: Mapped[float | None]
    broken_zeros: Mapped[int | None]


class PropertyRow(Base):
    __table__ = tables.properties

    id: Mapped[int]
    case_pk: Mapped[int]
    run_id: Mapped[int]
    name: Mapped[str]
    passed: Mapped[bool]
    detail: Mapped[str]
    forward_calls: Mapped[int | None]
    backward_calls: Mapped[int | None]


class TimingRow(Base):
    """The fields of ``TimingResult``; ``samples`` keeps every repetition for later statistics."""

    __table__ = tables.timings

    id: Mapped[int]
    case_pk: Mapped[int]
    run_id: Mapped[int]
    scope: Mapped[str]
    median_s: Mapped[float]
    min_s: Mapped[float]
    iqr_s: Mapped[float]
    n: Mapped[int]
    cold_s: Mapped[float | None]
    samples: Mapped[Any]
    mode: Mapped[str | None]
    flops: Mapped[float | None]
    bytes_moved: Mapped[float | None]
    floor_s: Mapped[float | None]
    efficiency: Mapped[float | None]


class RunAggregateRow(Base):
    """One output of one run for one input dtype: the numbers of a ``HistoryPoint``.

    Valid while ``Run.summarised_at`` is set; errors that were NaN count as +inf (as stored).
    """

    __table__ = tables.run_summaries

    run_id: Mapped[int]
    x_dtype: Mapped[str]
    output: Mapped[str]
    cases: Mapped[int]
    passed: Mapped[int]
    worst_rel: Mapped[float | None]
    median_rel: Mapped[float | None]
    worst_norm: Mapped[float | None]
    median_norm: Mapped[float | None]
    worst_case_id: Mapped[str]
    worst_usage: Mapped[float | None]
    median_usage: Mapped[float | None]


class RunCountRow(Base):
    """Cases of one input dtype in one run by outcome (a run's counts, split by dtype)."""

    __table__ = tables.run_counts

    run_id: Mapped[int]
    x_dtype: Mapped[str]
    n_passed: Mapped[int]
    n_failed: Mapped[int]
    n_skipped: Mapped[int]
    n_crashed: Mapped[int]
    n_timeout: Mapped[int]
    n_error: Mapped[int]
    n_lost: Mapped[int]


class RunShardRow(Base):
    """One shard of a sharded run: who ran it and whether it reported (finished)."""

    __table__ = tables.run_shards

    run_id: Mapped[int]
    shard: Mapped[int]
    host: Mapped[str]
    pid: Mapped[int | None]
    status: Mapped[str]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class RunPageRow(Base):
    """A page of a finished run, stored once and served from here (``db.pages``): a finished
    run never changes, and rebuilding a 10,000-case page costs seconds. ``stamp`` names what
    the page was built from (the run's state, the code, what else it shows); a page whose
    stamp no longer matches is rebuilt. Deleted with its run."""

    __table__ = tables.run_pages

    run_id: Mapped[int]
    name: Mapped[str]
    stamp: Mapped[str]
    body: Mapped[bytes]
    stored_at: Mapped[datetime]


class AlertRow(Base):
    """What one run found against its baseline: the regressions of one kernel, matrix and
    device between two runs, grouped, with the dimension values that explain them and what
    a confirmation rerun and a bisection found."""

    __table__ = tables.alerts

    id: Mapped[int]
    kernel: Mapped[str]
    matrix: Mapped[str]
    device: Mapped[str]
    run_id: Mapped[int | None]
    baseline_run: Mapped[int | None]
    created_at: Mapped[datetime]
    explanation: Mapped[Any | None]
    confirm_run: Mapped[int | None]
    bisect_commit: Mapped[str | None]
    bisect_run: Mapped[int | None]


class RegressionRow(Base):
    """One case of one kernel, matrix and device that went bad, and where it stands.

    One row per case and kind: ``outputs`` holds each output's measures before and after
    (usage, e_rel, the allowed usage), ``properties`` the failed property checks. Rows from
    before alerts (schema 0006/0007) were one per output: their ``output`` names it; newer
    rows have ``output`` ``""``."""

    __table__ = tables.regressions

    id: Mapped[int]
    alert_id: Mapped[int | None]
    kernel: Mapped[str]
    matrix: Mapped[str]
    device: Mapped[str]
    case_id: Mapped[str]
    case_name: Mapped[str]
    output: Mapped[str]
    kind: Mapped[str]
    state: Mapped[str]
    detail: Mapped[str | None]
    outputs: Mapped[Any | None]
    properties: Mapped[Any | None]
    assignee: Mapped[str | None]
    bug: Mapped[str | None]
    first_bad_run: Mapped[int | None]
    first_bad_commit: Mapped[str | None]
    last_good_run: Mapped[int | None]
    last_good_commit: Mapped[str | None]
    fixed_run: Mapped[int | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    changed_by: Mapped[str]
    note: Mapped[str | None]


class RegressionEventRow(Base):
    """One change of a regression's state: who or what, when, from and to, in which run."""

    __table__ = tables.regression_events

    id: Mapped[int]
    regression_id: Mapped[int]
    at: Mapped[datetime]
    by: Mapped[str]
    from_state: Mapped[str | None]
    to_state: Mapped[str]
    run_id: Mapped[int | None]
    note: Mapped[str | None]
