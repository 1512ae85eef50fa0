"""The results schema: runs, cases, and one row per output metric, property and timing.

One ``Run`` is one ``convmatrix run`` (kernel, commit, device, matrix, time); a ``CaseRow`` is one
case's outcome in it, with the matrix dimensions as real columns so history and pivots are plain
GROUP BYs, and the full ``Case.to_json()`` in ``params`` so a result can be rebuilt exactly.
Child rows repeat ``run_id`` (and metrics the case's ``x_dtype``) so the two questions reports
ask most, "history of dtype X" and "this run against that one by case id", hit one index each.

Float errors are nullable because SQLite stores NaN as NULL: the writer stores NaN as NULL on
every backend and the loader turns NULL back into NaN, so both behave alike.

``RunAggregateRow`` and ``RunCountRow`` keep what ``convmatrix history`` shows of a run once it
stops writing (``Run.summarised_at`` set), so history reads a few rows per run instead of
sorting every metric row of a dtype (see ``summaries.py``).
Changing these models needs a new migration under ``migrations/versions``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from convmatrix.core.records import OUTCOMES, RUN_KINDS

__all__ = [
    "HEARTBEAT_S",
    "REGRESSION_KINDS",
    "REGRESSION_STATES",
    "RUN_KINDS",
    "RUN_STATUSES",
    "STALE_HEARTBEAT_S",
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
    "utcnow",
]

# abandoned: a run left ``running`` whose controller stopped beating (killed without a word);
# it can be resumed like an interrupted one.
RUN_STATUSES = ("running", "finished", "interrupted", "abandoned")
HEARTBEAT_S = 2.0  # how often a writing controller stamps runs.heartbeat_at
STALE_HEARTBEAT_S = 30.0  # a running run silent this long lost its controller
REGRESSION_KINDS = ("new_failure", "error_regression", "timing_regression")
# detected: found by a scan; confirmed/flaky: after a rerun; the rest set by people, except
# fixed, which a later passing run also sets (and a later failing run reopens: detected).
REGRESSION_STATES = (
    "detected", "confirmed", "flaky", "acknowledged", "fixed", "ignored", "invalid",
)  # fmt: skip

# Deterministic constraint names, so migrations can refer to (and batch-alter) them everywhere.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timestamps are stored in UTC (SQLite keeps no zone; see ``queries._aware``)."""
    return datetime.now(timezone.utc)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


intpk = Annotated[int, mapped_column(Integer, primary_key=True)]
str200 = Annotated[str, mapped_column(String(200))]
str32 = Annotated[str, mapped_column(String(32))]
hex12 = Annotated[str, mapped_column(String(12))]
long_text = Annotated[str, mapped_column(Text)]
json_data = Annotated[Any, mapped_column(JSON)]
utc_time = Annotated[datetime, mapped_column(DateTime(timezone=True))]
error = Annotated[float | None, mapped_column()]  # NULL stands for NaN
run_fk = Annotated[int, mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))]
case_fk = Annotated[int, mapped_column(ForeignKey("cases.id", ondelete="CASCADE"))]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    """One invocation of ``convmatrix run``; counts are kept current as batches commit."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        CheckConstraint(_in("kind", RUN_KINDS), name="kind"),
        Index(None, "kernel", "started_at"),
        Index(None, "uid", unique=True),
        Index(None, "label"),
        Index(None, "kernel_commit"),
        Index(None, "shard_label", unique=True),  # the run N CI shards write into
    )

    id: Mapped[intpk]
    # The run's identity everywhere: kept by export and import (ids are per database).
    uid: Mapped[str] = mapped_column(String(32))  # RunMeta.uid
    kind: Mapped[str32] = mapped_column(default="run")
    kernel: Mapped[str200]
    kernel_commit: Mapped[str | None] = mapped_column(String(64))
    kernel_dirty: Mapped[bool | None]
    matrix: Mapped[str200]
    matrix_hash: Mapped[str] = mapped_column(String(64))
    device_kind: Mapped[str32]
    device_name: Mapped[str200 | None]
    host: Mapped[str200]
    pid: Mapped[int | None]  # of the writing process, to spot runs killed without a word
    versions: Mapped[json_data]  # {"torch": ..., "cuda": ..., "convmatrix": ...}
    label: Mapped[str200 | None]
    argv: Mapped[json_data]  # the command line
    options: Mapped[json_data]  # parsed arguments worth keeping (workers, timeout, ...)
    geometry: Mapped[json_data | None]
    started_at: Mapped[utc_time] = mapped_column(default=utcnow)
    finished_at: Mapped[utc_time | None]
    status: Mapped[str32] = mapped_column(default="running")
    n_planned: Mapped[int | None]  # cases the run meant to execute
    n_passed: Mapped[int] = mapped_column(default=0)
    n_failed: Mapped[int] = mapped_column(default=0)
    n_skipped: Mapped[int] = mapped_column(default=0)
    n_crashed: Mapped[int] = mapped_column(default=0)
    n_timeout: Mapped[int] = mapped_column(default=0)
    n_error: Mapped[int] = mapped_column(default=0)
    n_lost: Mapped[int] = mapped_column(default=0)
    # The controller's last sign of life (every few seconds while it runs): a ``running`` run
    # whose heartbeat is stale lost its controller and is shown ``abandoned``.
    heartbeat_at: Mapped[utc_time | None]
    # When the summary rows were computed; NULL while results may still change (every batch
    # written clears it), and history then computes this run's numbers live.
    summarised_at: Mapped[utc_time | None]
    # A run written by shards (``convmatrix run --shard I/N --run-label L``): the label every
    # shard finds it by and N; which shards reported is in ``run_shards``.
    shard_label: Mapped[str200 | None]
    shard_count: Mapped[int | None]


class CaseRow(Base):
    """One case's outcome in one run; its dimensions as columns, the full case in ``params``."""

    __tablename__ = "cases"
    __table_args__ = (
        # Also the "diff by case id" index: two runs joined on case_id.
        UniqueConstraint("run_id", "case_id"),
        CheckConstraint(_in("outcome", OUTCOMES), name="outcome"),
        Index(None, "case_id"),
    )

    id: Mapped[intpk]
    run_id: Mapped[run_fk]
    case_id: Mapped[hex12]
    suite: Mapped[str200]
    op: Mapped[str32]
    width: Mapped[int]
    seqlen: Mapped[int | None]
    dim: Mapped[int]
    batch: Mapped[int]
    layout: Mapped[str32]
    gap: Mapped[str32 | None]
    activation: Mapped[str32 | None]
    bias: Mapped[bool]
    x_dtype: Mapped[str32]
    w_dtype: Mapped[str32]
    initial_state: Mapped[str32 | None]
    final_state: Mapped[bool | None]
    dfinal: Mapped[str32 | None]
    packed: Mapped[bool]
    tokens: Mapped[int | None]
    steps: Mapped[int | None]
    state_len: Mapped[int | None]
    circular: Mapped[bool | None]
    slots: Mapped[str32 | None]
    expect: Mapped[str32]
    params: Mapped[json_data]  # Case.to_json()
    outcome: Mapped[str32]
    message: Mapped[long_text | None]
    duration_s: Mapped[float]
    worker: Mapped[str32 | None]
    peak_mem_mb: Mapped[float | None]  # memory the case added at its peak (MB)
    created_at: Mapped[utc_time] = mapped_column(default=utcnow)
    # Placement (the Ray engine, xdist too): the host and the device index the result came from.
    host: Mapped[str200 | None]
    device_index: Mapped[int | None]
    # Resubmissions after a lost actor or node, or a crash confirmed on another device.
    retries: Mapped[int] = mapped_column(default=0, server_default="0")
    retry_reason: Mapped[long_text | None]
    phases: Mapped[json_data | None]  # seconds per phase (runners.phases)


class MetricRow(Base):
    """Errors of one output of one case (docs/spec.md §4), the framework path's, and the verdict."""

    __tablename__ = "metrics"
    __table_args__ = (
        UniqueConstraint("case_pk", "output"),
        Index(None, "x_dtype", "output", "run_id"),  # history of dtype X
        # One run's rows (load, delete), and one dtype of one run: a summary computed live.
        Index(None, "run_id", "x_dtype", "output"),
    )

    id: Mapped[intpk]
    case_pk: Mapped[case_fk]
    run_id: Mapped[run_fk]
    x_dtype: Mapped[str32]  # the dtype the output is judged in (core.verdict.judged_dtype)
    output: Mapped[str32]
    e_abs: Mapped[error]
    e_rel: Mapped[error]
    e_norm: Mapped[error]
    tau: Mapped[error]
    scale: Mapped[error]
    worst_index: Mapped[json_data | None]
    fw_abs: Mapped[error]
    fw_rel: Mapped[error]
    fw_norm: Mapped[error]
    limit_rel: Mapped[error]
    limit_norm: Mapped[error]
    passed: Mapped[bool]
    bound_usage: Mapped[error]  # max |a-r| / bound (docs/spec.md §4); NULL before 0003
    limit_usage: Mapped[error]  # the threshold rows' usage
    usage_limit: Mapped[error]  # the bound usage allowed, when the bound judged
    # Elements expected exactly 0 (zero bound) that came out non-zero; NULL before 0008
    broken_zeros: Mapped[int | None]


class PropertyRow(Base):
    __tablename__ = "properties"
    __table_args__ = (Index(None, "run_id"),)

    id: Mapped[intpk]
    case_pk: Mapped[case_fk]
    run_id: Mapped[run_fk]
    name: Mapped[str200]
    passed: Mapped[bool]
    detail: Mapped[long_text]


class TimingRow(Base):
    """The fields of ``TimingResult``; ``samples`` keeps every repetition for later statistics."""

    __tablename__ = "timings"
    __table_args__ = (Index(None, "run_id"),)

    id: Mapped[intpk]
    case_pk: Mapped[case_fk]
    run_id: Mapped[run_fk]
    scope: Mapped[str32]
    median_s: Mapped[float]
    min_s: Mapped[float]
    iqr_s: Mapped[float]
    n: Mapped[int]
    cold_s: Mapped[float | None]
    samples: Mapped[json_data]
    mode: Mapped[str32 | None]
    flops: Mapped[float | None]
    bytes_moved: Mapped[float | None]
    floor_s: Mapped[float | None]
    efficiency: Mapped[float | None]


class RunAggregateRow(Base):
    """One output of one run for one input dtype: the numbers of a ``HistoryPoint``.

    Valid while ``Run.summarised_at`` is set; errors that were NaN count as +inf (as stored).
    """

    __tablename__ = "run_summaries"
    __table_args__ = (Index(None, "x_dtype", "output", "run_id"),)  # history of dtype X

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    x_dtype: Mapped[str] = mapped_column(String(32), primary_key=True)
    output: Mapped[str] = mapped_column(String(32), primary_key=True)
    cases: Mapped[int]  # metric rows: cases of this dtype that produced this output
    passed: Mapped[int]
    worst_rel: Mapped[error]
    median_rel: Mapped[error]
    worst_norm: Mapped[error]
    median_norm: Mapped[error]
    worst_case_id: Mapped[hex12]
    worst_usage: Mapped[error]  # the largest bound usage (NULL: none recorded)
    median_usage: Mapped[error]  # the median over the rows that recorded one (0008)


class RunCountRow(Base):
    """Cases of one input dtype in one run by outcome (a run's counts, split by dtype)."""

    __tablename__ = "run_counts"
    __table_args__ = (Index(None, "x_dtype", "run_id"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    x_dtype: Mapped[str] = mapped_column(String(32), primary_key=True)
    n_passed: Mapped[int]
    n_failed: Mapped[int]
    n_skipped: Mapped[int]
    n_crashed: Mapped[int]
    n_timeout: Mapped[int]
    n_error: Mapped[int]
    n_lost: Mapped[int] = mapped_column(default=0)


class RunShardRow(Base):
    """One shard of a sharded run: who ran it and whether it reported (finished)."""

    __tablename__ = "run_shards"
    __table_args__ = (CheckConstraint(_in("status", RUN_STATUSES), name="status"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    shard: Mapped[int] = mapped_column(primary_key=True)  # 0 .. shard_count - 1
    host: Mapped[str200]
    pid: Mapped[int | None]
    status: Mapped[str32]
    started_at: Mapped[utc_time]
    finished_at: Mapped[utc_time | None]


class RunPageRow(Base):
    """A page of a finished run, stored once and served from here (``db.pages``): a finished
    run never changes, and rebuilding a 10,000-case page costs seconds. ``stamp`` names what
    the page was built from (the run's state, the code, what else it shows); a page whose
    stamp no longer matches is rebuilt. Deleted with its run."""

    __tablename__ = "run_pages"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(300), primary_key=True)  # run.html, served ...
    stamp: Mapped[str] = mapped_column(String(64))
    body: Mapped[bytes] = mapped_column(LargeBinary)  # zlib-compressed UTF-8
    stored_at: Mapped[utc_time] = mapped_column(default=utcnow)


run_ref = Annotated[int | None, mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))]


class AlertRow(Base):
    """What one run found against its baseline: the regressions of one kernel, matrix and
    device between two runs, grouped, with the dimension values that explain them and what
    a confirmation rerun and a bisection found."""

    __tablename__ = "alerts"
    __table_args__ = (Index(None, "kernel", "matrix", "device"),)

    id: Mapped[intpk]
    kernel: Mapped[str200]
    matrix: Mapped[str200]
    device: Mapped[str32]
    run_id: Mapped[run_ref]  # the run that found it
    baseline_run: Mapped[run_ref]  # what it was compared with (NULL: no earlier run)
    created_at: Mapped[utc_time] = mapped_column(default=utcnow)
    explanation: Mapped[json_data | None]  # [{"values": {...}, "failing": n, ...}, ...]
    confirm_run: Mapped[run_ref]  # the rerun of ``convmatrix confirm``
    bisect_commit: Mapped[str | None] = mapped_column(String(64))  # the first bad commit
    bisect_run: Mapped[run_ref]  # the bisection's step at the first bad commit


class RegressionRow(Base):
    """One case of one kernel, matrix and device that went bad, and where it stands.

    One row per case and kind: ``outputs`` holds each output's measures before and after
    (usage, e_rel, the allowed usage), ``properties`` the failed property checks. Rows from
    before alerts (schema 0006/0007) were one per output: their ``output`` names it; newer
    rows have ``output`` ``""``."""

    __tablename__ = "regressions"
    __table_args__ = (
        CheckConstraint(_in("kind", REGRESSION_KINDS), name="kind"),
        CheckConstraint(_in("state", REGRESSION_STATES), name="state"),
        Index(None, "kernel", "matrix", "device", "case_id"),
        Index(None, "state"),
        Index(None, "alert_id"),
    )

    id: Mapped[intpk]
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="SET NULL"))
    kernel: Mapped[str200]
    matrix: Mapped[str200]
    device: Mapped[str32]
    case_id: Mapped[hex12]
    case_name: Mapped[long_text]
    output: Mapped[str32]
    kind: Mapped[str32]
    state: Mapped[str32]
    detail: Mapped[long_text | None]
    outputs: Mapped[json_data | None]  # [{"output": "dx", "base_usage": .., "usage": ..}, ...]
    properties: Mapped[json_data | None]  # [{"name": "causality", "detail": ".."}, ...]
    assignee: Mapped[str200 | None]
    bug: Mapped[long_text | None]  # a link or id in the team's tracker
    first_bad_run: Mapped[run_ref]
    first_bad_commit: Mapped[str | None] = mapped_column(String(64))
    last_good_run: Mapped[run_ref]
    last_good_commit: Mapped[str | None] = mapped_column(String(64))
    fixed_run: Mapped[run_ref]
    created_at: Mapped[utc_time] = mapped_column(default=utcnow)
    updated_at: Mapped[utc_time] = mapped_column(default=utcnow)
    changed_by: Mapped[str200]
    note: Mapped[long_text | None]


class RegressionEventRow(Base):
    """One change of a regression's state: who or what, when, from and to, in which run."""

    __tablename__ = "regression_events"
    __table_args__ = (Index(None, "regression_id"),)

    id: Mapped[intpk]
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id", ondelete="CASCADE"))
    at: Mapped[utc_time] = mapped_column(default=utcnow)
    by: Mapped[str200]
    from_state: Mapped[str32 | None]
    to_state: Mapped[str32]
    run_id: Mapped[run_ref]
    note: Mapped[long_text | None]
