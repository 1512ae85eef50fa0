"""The results schema, declared once as SQLAlchemy Core tables: runs, cases, and one row per
output metric, property and timing, plus what regressions and stored pages keep.

One ``runs`` row is one ``convmatrix run`` (kernel, commit, device, matrix, time); a ``cases``
row is one case's outcome in it, with the matrix dimensions as real columns so history and
pivots are plain GROUP BYs, and the full ``Case.to_json()`` in ``params`` so a result can be
rebuilt exactly. Child rows repeat ``run_id`` (and metrics the case's ``x_dtype``) so the two
questions reports ask most, "history of dtype X" and "this run against that one by case id",
hit one index each.

Why Core tables and not ORM classes: the commands that only read (``history``, ``report``,
``diff``) query these tables with Core and never import ``sqlalchemy.orm`` nor map classes,
which was a fifth of their start-up (docs/benchmarks.md, "reading start-up"). The writers and
the triage service map ORM classes onto the same tables in ``db.models``.

Float errors are nullable because SQLite stores NaN as NULL: the writer stores NaN as NULL on
every backend and the loader turns NULL back into NaN, so both behave alike.

``run_summaries`` and ``run_counts`` keep what ``convmatrix history`` shows of a run once it
stops writing (``runs.summarised_at`` set), so history reads a few rows per run instead of
sorting every metric row of a dtype (``db.aggregates``).
Changing these tables needs a new migration under ``migrations/versions``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from convmatrix.core.records import OUTCOMES, RUN_KINDS

__all__ = [
    "HEARTBEAT_S",
    "REGRESSION_KINDS",
    "REGRESSION_STATES",
    "RUN_KINDS",
    "RUN_STATUSES",
    "STALE_HEARTBEAT_S",
    "alerts",
    "cases",
    "metadata",
    "metrics",
    "properties",
    "regression_events",
    "regressions",
    "run_counts",
    "run_pages",
    "run_shards",
    "run_summaries",
    "runs",
    "timings",
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
metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> datetime:
    """Timestamps are stored in UTC (SQLite keeps no zone; see ``queries._aware``)."""
    return datetime.now(timezone.utc)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# Column spellings: ``req`` NOT NULL, ``opt`` nullable (the ORM's ``Mapped[X]`` and
# ``Mapped[X | None]``).
def req(name: str, type_: Any, *args: Any, **kw: Any) -> Column[Any]:
    return Column(name, type_, *args, nullable=False, **kw)


def opt(name: str, type_: Any, *args: Any, **kw: Any) -> Column[Any]:
    return Column(name, type_, *args, nullable=True, **kw)


def _id() -> Column[Any]:
    return Column("id", Integer, primary_key=True)


def _str200() -> String:
    return String(200)


def _str32() -> String:
    return String(32)


def _time() -> DateTime:
    return DateTime(timezone=True)


def _run(name: str = "run_id", *, pk: bool = False) -> Column[Any]:
    """The run a row belongs to (deleted with it)."""
    fk = ForeignKey("runs.id", ondelete="CASCADE")
    return Column(name, Integer, fk, nullable=False, primary_key=pk)


def _case() -> Column[Any]:
    return req("case_pk", Integer, ForeignKey("cases.id", ondelete="CASCADE"))


def _run_ref(name: str) -> Column[Any]:
    """A run a row refers to and outlives (NULL once that run is deleted)."""
    return opt(name, Integer, ForeignKey("runs.id", ondelete="SET NULL"))


def _error(name: str) -> Column[Any]:
    return opt(name, Double)  # NULL stands for NaN


runs = Table(
    "runs", metadata,
    _id(),
    # The run's identity everywhere: kept by export and import (ids are per database).
    req("uid", String(32)),  # RunMeta.uid
    req("kind", _str32(), default="run"),
    req("kernel", _str200()),
    opt("kernel_commit", String(64)),
    opt("kernel_dirty", Boolean),
    req("matrix", _str200()),
    req("matrix_hash", String(64)),
    req("device_kind", _str32()),
    opt("device_name", _str200()),
    req("host", _str200()),
    opt("pid", Integer),  # of the writing process, to spot runs killed without a word
    req("versions", JSON),  # {"torch": ..., "cuda": ..., "convmatrix": ...}
    opt("label", _str200()),
    req("argv", JSON),  # the command line
    req("options", JSON),  # parsed arguments worth keeping (workers, timeout, ...)
    opt("geometry", JSON),
    req("started_at", _time(), default=utcnow),
    opt("finished_at", _time()),
    req("status", _str32(), default="running"),
    opt("n_planned", Integer),  # cases the run meant to execute
    *(req(f"n_{o}", Integer, default=0) for o in ("passed", "failed", "skipped", "crashed")),
    *(req(f"n_{o}", Integer, default=0) for o in ("timeout", "error", "lost")),
    # The controller's last sign of life (every few seconds while it runs): a ``running`` run
    # whose heartbeat is stale lost its controller and is shown ``abandoned``.
    opt("heartbeat_at", _time()),
    # When the summary rows were computed; NULL while results may still change (every batch
    # written clears it), and history then computes this run's numbers live.
    opt("summarised_at", _time()),
    # A run written by shards (``convmatrix run --shard I/N --run-label L``): the label every
    # shard finds it by and N; which shards reported is in ``run_shards``.
    opt("shard_label", _str200()),
    opt("shard_count", Integer),
    CheckConstraint(_in("status", RUN_STATUSES), name="status"),
    CheckConstraint(_in("kind", RUN_KINDS), name="kind"),
    Index(None, "kernel", "started_at"),
    Index(None, "uid", unique=True),
    Index(None, "label"),
    Index(None, "kernel_commit"),
    Index(None, "shard_label", unique=True),  # the run N CI shards write into
)  # fmt: skip

cases = Table(
    "cases", metadata,
    _id(),
    _run(),
    req("case_id", String(12)),
    req("suite", _str200()),
    req("op", _str32()),
    req("width", Integer),
    opt("seqlen", Integer),
    req("dim", Integer),
    req("batch", Integer),
    req("layout", _str32()),
    opt("gap", _str32()),
    opt("activation", _str32()),
    req("bias", Boolean),
    req("x_dtype", _str32()),
    req("w_dtype", _str32()),
    opt("initial_state", _str32()),
    opt("final_state", Boolean),
    opt("dfinal", _str32()),
    req("packed", Boolean),
    opt("tokens", Integer),
    opt("steps", Integer),
    opt("state_len", Integer),
    opt("circular", Boolean),
    opt("slots", _str32()),
    req("expect", _str32()),
    req("params", JSON),  # Case.to_json()
    req("outcome", _str32()),
    opt("message", Text),
    req("duration_s", Double),
    opt("worker", _str32()),
    opt("peak_mem_mb", Double),  # memory the case added at its peak (MB)
    req("created_at", _time(), default=utcnow),
    # Placement (the Ray executor, xdist too): the host and the device index the result came from.
    opt("host", _str200()),
    opt("device_index", Integer),
    # Resubmissions after a lost actor or node, or a crash confirmed on another device.
    req("retries", Integer, default=0, server_default="0"),
    opt("retry_reason", Text),
    opt("phases", JSON),  # seconds per phase (runners.case.phases)
    # Also the "diff by case id" index: two runs joined on case_id.
    UniqueConstraint("run_id", "case_id"),
    CheckConstraint(_in("outcome", OUTCOMES), name="outcome"),
    Index(None, "case_id"),
)  # fmt: skip

# Errors of one output of one case (docs/spec.md §4), the framework path's, and the verdict.
metrics = Table(
    "metrics", metadata,
    _id(),
    _case(),
    _run(),
    req("x_dtype", _str32()),  # the dtype the output is judged in (core.verdict.judged_dtype)
    req("output", _str32()),
    *(_error(name) for name in ("e_abs", "e_rel", "e_norm", "tau", "scale")),
    opt("worst_index", JSON),
    *(_error(name) for name in ("fw_abs", "fw_rel", "fw_norm", "limit_rel", "limit_norm")),
    req("passed", Boolean),
    _error("bound_usage"),  # max |a-r| / bound (docs/spec.md §4); NULL before 0003
    _error("limit_usage"),  # the threshold rows' usage
    _error("usage_limit"),  # the bound usage allowed, when the bound judged
    # Elements expected exactly 0 (zero bound) that came out non-zero; NULL before 0008
    opt("broken_zeros", Integer),
    UniqueConstraint("case_pk", "output"),
    Index(None, "x_dtype", "output", "run_id"),  # history of dtype X
    # One run's rows (load, delete), and one dtype of one run: a summary computed live.
    Index(None, "run_id", "x_dtype", "output"),
)  # fmt: skip

properties = Table(
    "properties", metadata,
    _id(),
    _case(),
    _run(),
    req("name", _str200()),
    req("passed", Boolean),
    req("detail", Text),
    # The kernel calls the check made (forwards; backwards, one per chunk); NULL before 0014
    opt("forward_calls", Integer),
    opt("backward_calls", Integer),
    Index(None, "run_id"),
)  # fmt: skip

# The fields of ``TimingResult``; ``samples`` keeps every repetition for later statistics.
timings = Table(
    "timings", metadata,
    _id(),
    _case(),
    _run(),
    req("scope", _str32()),
    req("median_s", Double),
    req("min_s", Double),
    req("iqr_s", Double),
    req("n", Integer),
    opt("cold_s", Double),
    req("samples", JSON),
    opt("mode", _str32()),
    *(opt(name, Double) for name in ("flops", "bytes_moved", "floor_s", "efficiency")),
    Index(None, "run_id"),
)  # fmt: skip

# One output of one run for one input dtype: the numbers of a ``HistoryPoint``. Valid while
# ``runs.summarised_at`` is set; errors that were NaN count as +inf (as stored).
run_summaries = Table(
    "run_summaries", metadata,
    _run(pk=True),
    Column("x_dtype", _str32(), primary_key=True),
    Column("output", _str32(), primary_key=True),
    req("cases", Integer),  # metric rows: cases of this dtype that produced this output
    req("passed", Integer),
    _error("worst_rel"),
    _error("median_rel"),
    _error("worst_norm"),
    _error("median_norm"),
    req("worst_case_id", String(12)),
    _error("worst_usage"),  # the largest bound usage (NULL: none recorded)
    _error("median_usage"),  # the median over the rows that recorded one (0008)
    Index(None, "x_dtype", "output", "run_id"),  # history of dtype X
)  # fmt: skip

# Cases of one input dtype in one run by outcome (a run's counts, split by dtype).
run_counts = Table(
    "run_counts", metadata,
    _run(pk=True),
    Column("x_dtype", _str32(), primary_key=True),
    *(req(f"n_{o}", Integer) for o in ("passed", "failed", "skipped", "crashed")),
    *(req(f"n_{o}", Integer) for o in ("timeout", "error")),
    req("n_lost", Integer, default=0),
    Index(None, "x_dtype", "run_id"),
)  # fmt: skip

# One shard of a sharded run: who ran it and whether it reported (finished).
run_shards = Table(
    "run_shards", metadata,
    _run(pk=True),
    Column("shard", Integer, primary_key=True),  # 0 .. shard_count - 1
    req("host", _str200()),
    opt("pid", Integer),
    req("status", _str32()),
    req("started_at", _time()),
    opt("finished_at", _time()),
    CheckConstraint(_in("status", RUN_STATUSES), name="status"),
)  # fmt: skip

# A page of a finished run, stored once and served from here (``db.pages``): a finished run
# never changes, and rebuilding a 10,000-case page costs seconds. ``stamp`` names what the
# page was built from (the run's state, the code, what else it shows); a page whose stamp no
# longer matches is rebuilt. Deleted with its run.
run_pages = Table(
    "run_pages", metadata,
    _run(pk=True),
    Column("name", String(300), primary_key=True),  # run.html, served ...
    req("stamp", String(64)),
    req("body", LargeBinary),  # zlib-compressed UTF-8
    req("stored_at", _time(), default=utcnow),
)  # fmt: skip

# What one run found against its baseline: the regressions of one kernel, matrix and device
# between two runs, grouped, with the dimension values that explain them and what a
# confirmation rerun and a bisection found.
alerts = Table(
    "alerts", metadata,
    _id(),
    req("kernel", _str200()),
    req("matrix", _str200()),
    req("device", _str32()),
    _run_ref("run_id"),  # the run that found it
    _run_ref("baseline_run"),  # what it was compared with (NULL: no earlier run)
    req("created_at", _time(), default=utcnow),
    opt("explanation", JSON),  # [{"values": {...}, "failing": n, ...}, ...]
    _run_ref("confirm_run"),  # the rerun of ``convmatrix confirm``
    opt("bisect_commit", String(64)),  # the first bad commit
    _run_ref("bisect_run"),  # the bisection's step at the first bad commit
    Index(None, "kernel", "matrix", "device"),
)  # fmt: skip

# One case of one kernel, matrix and device that went bad, and where it stands. One row per
# case and kind: ``outputs`` holds each output's measures before and after (usage, e_rel, the
# allowed usage), ``properties`` the failed property checks. Rows from before alerts (schema
# 0006/0007) were one per output: their ``output`` names it; newer rows have ``output`` "".
regressions = Table(
    "regressions", metadata,
    _id(),
    opt("alert_id", Integer, ForeignKey("alerts.id", ondelete="SET NULL")),
    req("kernel", _str200()),
    req("matrix", _str200()),
    req("device", _str32()),
    req("case_id", String(12)),
    req("case_name", Text),
    req("output", _str32()),
    req("kind", _str32()),
    req("state", _str32()),
    opt("detail", Text),
    opt("outputs", JSON),  # [{"output": "dx", "base_usage": .., "usage": ..}, ...]
    opt("properties", JSON),  # [{"name": "causality", "detail": ".."}, ...]
    opt("assignee", _str200()),
    opt("bug", Text),  # a link or id in the team's tracker
    _run_ref("first_bad_run"),
    opt("first_bad_commit", String(64)),
    _run_ref("last_good_run"),
    opt("last_good_commit", String(64)),
    _run_ref("fixed_run"),
    req("created_at", _time(), default=utcnow),
    req("updated_at", _time(), default=utcnow),
    req("changed_by", _str200()),
    opt("note", Text),
    CheckConstraint(_in("kind", REGRESSION_KINDS), name="kind"),
    CheckConstraint(_in("state", REGRESSION_STATES), name="state"),
    Index(None, "kernel", "matrix", "device", "case_id"),
    Index(None, "state"),
    Index(None, "alert_id"),
)  # fmt: skip

# One change of a regression's state: who or what, when, from and to, in which run.
regression_events = Table(
    "regression_events", metadata,
    _id(),
    req("regression_id", Integer, ForeignKey("regressions.id", ondelete="CASCADE")),
    req("at", _time(), default=utcnow),
    req("by", _str200()),
    opt("from_state", _str32()),
    req("to_state", _str32()),
    _run_ref("run_id"),
    opt("note", Text),
    Index(None, "regression_id"),
)  # fmt: skip
