"""What commands and reports ask the database, answered as plain dataclasses.

No ORM object leaves this module: reports build their view-models from ``RunInfo``,
``CaseResult``, ``HistoryPoint`` and ``CasePair``. Aggregates (history) are computed by the
database with GROUP BY and window functions, never by loading every metric row into Python,
and kept per run once it stops writing (``summaries.py``), so history reads a few rows per run.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, or_, select, union_all

from convmatrix.core.errors import InputError, UsageError
from convmatrix.core.records import OUTCOMES, CaseResult
from convmatrix.core.tolerances import OUTPUTS
from convmatrix.db.aggregates import COUNT_COLUMNS, SUMMARY_COLUMNS, count_select, summary_select
from convmatrix.db.records import (
    METRIC_COLUMNS,
    PROPERTY_COLUMNS,
    TIMING_COLUMNS,
    result_from_rows,
)
from convmatrix.db.tables import (
    STALE_HEARTBEAT_S,
    cases,
    metrics,
    properties,
    run_counts,
    run_shards,
    run_summaries,
    runs,
    timings,
    utcnow,
)

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = [
    "CasePair",
    "HistoryPoint",
    "OutputStats",
    "RunInfo",
    "case_counts",
    "case_pairs",
    "chunks",
    "done_case_ids",
    "history",
    "list_runs",
    "load_results",
    "missing_shards",
    "newest_run_id",
    "resolve_run",
    "run_column",
    "run_id_of_uid",
]

CHUNK = 500  # values per IN (...) list: far below any backend's limit on bound parameters


def chunks(values: Iterable[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    """``values`` in lists of at most ``size``, for ``IN`` lists of any length."""
    batch: list[Any] = []
    for value in values:
        batch.append(value)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# What names a run (``resolve_run``): an id its column holds, a label (200 characters at most:
# --label), a kernel commit (40 hex digits) or a prefix of one. Anything longer is malformed.
MAX_RUN_SPEC = 200
MAX_ID = (1 << 31) - 1  # ids are INTEGER: 4 bytes on PostgreSQL, which refuses a larger one


def parse_id(text: str) -> int | None:
    """The row id ``text`` spells (ASCII digits, at most ``MAX_ID``), else ``None``: ``²`` or
    ``١`` (``str.isdigit`` says yes) and a larger number name no row, so every door (the
    command line, the served pages) answers "no such ..." instead of a database error."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_ID)):
        return None
    value = int(text)
    return value if value <= MAX_ID else None


def _aware(moment: datetime | None) -> datetime | None:
    """Timestamps in UTC with the zone attached (SQLite hands them back without one)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


@dataclass(frozen=True)
class RunInfo:
    """One run's metadata and counts by outcome (the columns of ``Run``, as plain data)."""

    id: int
    kernel: str
    kernel_commit: str | None
    kernel_dirty: bool | None
    matrix: str
    matrix_hash: str
    device_kind: str
    device_name: str | None
    host: str
    versions: dict[str, Any]
    label: str | None
    argv: list[str]
    options: dict[str, Any]
    geometry: dict[str, Any] | None
    started_at: datetime
    finished_at: datetime | None
    status: str
    n_planned: int | None
    counts: dict[str, int]  # outcome -> number of cases, every outcome present
    heartbeat_at: datetime | None = None  # the writing controller's last sign of life
    pid: int | None = None  # of the writing controller
    kind: str = "run"  # what the run is for (core.records.RUN_KINDS)
    uid: str = ""  # its globally unique id, kept by export and import

    def heartbeat_age(self, now: datetime | None = None) -> float | None:
        """Seconds since the controller writing this run last beat (None: it never did)."""
        if self.heartbeat_at is None:
            return None
        return ((now or utcnow()) - self.heartbeat_at).total_seconds()

    @property
    def shown_status(self) -> str:
        """The status, with a ``running`` run whose controller stopped beating shown as
        ``abandoned (N s without a heartbeat)``: it was killed without a word."""
        if self.abandoned:
            return f"abandoned ({self.heartbeat_age():.0f} s without a heartbeat)"
        return self.status

    @property
    def abandoned(self) -> bool:
        """A ``running`` run whose controller is gone: heartbeat stale, or (this host) its
        process has ended. Runs from before heartbeats are never called abandoned here."""
        age = self.heartbeat_age()
        if self.status != "running" or age is None:
            return False
        return age > STALE_HEARTBEAT_S or (self.host == socket.gethostname() and not self._alive())

    def _alive(self) -> bool:
        """Whether the writing process still exists (on this host)."""
        if self.pid is None:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    shard_count: int | None = None  # a run written by shards: how many

    @property
    def n_results(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> str:
        """One line naming the run, for candidate lists and summaries."""
        commit = (self.kernel_commit or "no commit")[:12] + ("+dirty" if self.kernel_dirty else "")
        label = f" label={self.label}" if self.label else ""
        return (
            f"run {self.id}: {self.kernel} @ {commit} on {self.device_kind}, matrix "
            f"{self.matrix}, {self.started_at:%Y-%m-%d %H:%M}{label} ({self.shown_status})"
        )


def _run_info(run: Row[Any]) -> RunInfo:
    """From a row of ``runs`` (or an ORM ``Run``: the same attribute names)."""
    return RunInfo(
        id=run.id,
        kernel=run.kernel,
        kernel_commit=run.kernel_commit,
        kernel_dirty=run.kernel_dirty,
        matrix=run.matrix,
        matrix_hash=run.matrix_hash,
        device_kind=run.device_kind,
        device_name=run.device_name,
        host=run.host,
        versions=run.versions,
        label=run.label,
        argv=run.argv,
        options=run.options,
        geometry=run.geometry,
        started_at=_aware(run.started_at),  # type: ignore[arg-type]
        finished_at=_aware(run.finished_at),
        status=run.status,
        n_planned=run.n_planned,
        counts={o: getattr(run, f"n_{o}") for o in OUTCOMES},
        heartbeat_at=_aware(run.heartbeat_at),
        pid=run.pid,
        shard_count=run.shard_count,
        kind=run.kind,
        uid=run.uid,
    )


def list_runs(
    session: Reader,
    *,
    kernel: str | None = None,
    limit: int = 50,
    kinds: Sequence[str] | None = ("run",),
    equal: Mapping[str, str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[RunInfo]:
    """The newest runs first; of these ``kinds`` (None: every kind; by default plain runs),
    whose columns hold the values ``equal`` maps them to, started in [``since``, ``until``)."""
    r = runs.c
    query = select(runs).order_by(r.started_at.desc(), r.id.desc()).limit(limit)
    if kernel is not None:
        query = query.where(r.kernel == kernel)
    if kinds is not None:
        query = query.where(r.kind.in_(list(kinds)))
    for column, value in (equal or {}).items():
        query = query.where(r[column] == value)
    if since is not None:
        query = query.where(r.started_at >= since)
    if until is not None:
        query = query.where(r.started_at < until)
    return [_run_info(run) for run in session.execute(query)]


def newest_run_id(
    session: Reader, *, label: str | None = None, kind: str | None = None,
    commit: str | None = None, after: int | None = None,
) -> int | None:  # fmt: skip
    """The highest id among the runs of this label, kind and kernel commit (each when given)
    with an id above ``after``: the run a command just recorded, found again by what it was
    told to record."""
    r = runs.c
    conditions = [
        column == value
        for column, value in ((r.label, label), (r.kind, kind), (r.kernel_commit, commit))
        if value is not None
    ]
    if after is not None:
        conditions.append(r.id > after)
    return session.scalar(select(r.id).where(*conditions).order_by(r.id.desc()).limit(1))


def run_column(session: Reader, run_id: int | None, column: str) -> Any:
    """One column of run ``run_id`` (None: no such run, or no run named)."""
    if run_id is None:
        return None
    return session.scalar(select(runs.c[column]).where(runs.c.id == run_id))


def run_id_of_uid(session: Reader, uid: str) -> int | None:
    """The id of the run with this uid here (None: the database does not hold it)."""
    return session.scalar(select(runs.c.id).where(runs.c.uid == uid))


def resolve_run(session: Reader, spec: str | int) -> RunInfo:
    """The run ``spec`` names: an id, ``latest`` (the newest plain run: not a confirm, bisect
    or adequacy run), a label, or a kernel commit (prefix); where a label or commit matches
    several runs of which one is a plain run, that one.

    Raises ``UsageError`` listing the candidates when nothing or more than one run matches.
    """
    text = str(spec).strip()
    if len(text) > MAX_RUN_SPEC or "\x00" in text:  # no id, label (200) or commit is longer
        shown = text[:24].replace("\x00", "\\x00") + ("..." if len(text) > 24 else "")
        raise InputError(
            f"run {shown!r} ({len(text)} characters): not a run id, label or kernel commit"
        )
    r = runs.c
    if text == "latest":
        newest = select(runs).where(r.kind == "run").order_by(r.started_at.desc(), r.id.desc())
        found = session.execute(newest.limit(1)).first()
        if found is None:
            raise UsageError("run 'latest': the database holds no runs yet")
        return _run_info(found)
    row_id = parse_id(text)
    if row_id is not None and (run := session.execute(select(runs).where(r.id == row_id)).first()):
        return _run_info(run)
    matches = [
        _run_info(row)
        for row in session.execute(
            select(runs)
            .where(
                or_(
                    r.label == text,
                    r.shard_label == text,
                    r.kernel_commit.startswith(text, autoescape=True),
                )
            )
            .order_by(r.started_at, r.id)
        )
    ]
    plain = [m for m in matches if m.kind == "run"]
    if len(matches) == 1 or len(plain) == 1:
        return matches[0] if len(matches) == 1 else plain[0]
    if not matches:
        recent = "\n  ".join(r.describe() for r in list_runs(session, limit=5))
        hint = f"; the newest runs are:\n  {recent}" if recent else "; the database holds no runs"
        raise UsageError(f"run {text!r} matches no run id, label or kernel commit{hint}")
    listed = "\n  ".join(r.describe() for r in matches)
    raise UsageError(f"run {text!r} is ambiguous; give one of these ids:\n  {listed}")


def run_values(
    session: Reader, columns: dict[str, str], *, kind: str | None = None
) -> dict[str, list[str]]:
    """The distinct non-empty values of run columns, for a page's filter choices: ``columns``
    maps each filter's name to its column of ``runs``; ``kind``: runs of that kind only."""
    found = {}
    for name, column in columns.items():
        query = select(runs.c[column]).distinct()
        if kind is not None:
            query = query.where(runs.c.kind == kind)
        found[name] = sorted(v for v in session.scalars(query) if v)
    return found


def missing_shards(session: Reader, run_id: int, count: int | None) -> list[str]:
    """The shards of a sharded run that have not reported (finished), each with what is
    known of it: ``2/4 never started``, ``1/4 running on host-b``, ``3/4 interrupted on ...``.
    Empty for a run that is not sharded or whose shards all finished."""
    if not count:
        return []
    query = select(run_shards).where(run_shards.c.run_id == run_id)
    rows = {r.shard: r for r in session.execute(query)}
    missing = []
    for index in range(count):
        row = rows.get(index)
        if row is None:
            missing.append(f"{index}/{count} never started")
        elif row.status != "finished":
            missing.append(f"{index}/{count} {row.status} on {row.host}")
    return missing


def done_case_ids(session: Reader, run_id: int) -> set[str]:
    """Ids of the cases the run already holds a result for (``--resume`` skips them)."""
    return set(session.scalars(select(cases.c.case_id).where(cases.c.run_id == run_id)))


def load_results(session: Reader, run_id: int) -> list[CaseResult]:
    """Every stored result of the run, rebuilt as ``CaseResult`` records, in write order."""
    case_rows = session.execute(
        select(cases).where(cases.c.run_id == run_id).order_by(cases.c.id)
    ).all()
    children: list[dict[int, list[Any]]] = []
    for table, names in (
        (metrics, METRIC_COLUMNS), (properties, PROPERTY_COLUMNS), (timings, TIMING_COLUMNS)
    ):  # fmt: skip
        by_case: dict[int, list[Any]] = {}
        columns = [table.c.case_pk, *(table.c[name] for name in names)]
        query = select(*columns).where(table.c.run_id == run_id).order_by(table.c.id)
        for row in session.execute(query):
            by_case.setdefault(row[0], []).append(row)
        children.append(by_case)
    return [
        result_from_rows(c, *(by_case.get(c.id, []) for by_case in children)) for c in case_rows
    ]


@dataclass(frozen=True)
class CasePair:
    """One case in two runs; ``None`` where a run does not hold it."""

    case_id: str
    base: CaseResult | None
    head: CaseResult | None


def case_pairs(session: Reader, base_run: int, head_run: int) -> list[CasePair]:
    """Results of two runs matched by case id: head's order first, then base-only cases."""
    base = {r.case.id: r for r in load_results(session, base_run)}
    head = {r.case.id: r for r in load_results(session, head_run)}
    order = list(head) + [cid for cid in base if cid not in head]
    return [CasePair(cid, base.get(cid), head.get(cid)) for cid in order]


@dataclass(frozen=True)
class OutputStats:
    """One output over one run's cases of one input dtype: worst and median errors, passes.

    A NaN error (stored as NULL) counts as +inf: a kernel that emits NaN is the worst case.
    """

    cases: int
    passed: int
    worst_rel: float
    median_rel: float
    worst_norm: float
    median_norm: float
    worst_case_id: str  # the case with the largest e_rel
    worst_usage: float | None = None  # the largest bound usage (None: no bound recorded)
    median_usage: float | None = None  # over the cases that recorded one

    @property
    def pass_rate(self) -> float:
        return self.passed / self.cases if self.cases else 0.0


@dataclass(frozen=True)
class HistoryPoint:
    """One output of one run, for one input dtype: which run, and its ``OutputStats``."""

    run_id: int
    started_at: datetime
    kernel: str
    kernel_commit: str | None
    label: str | None
    device_kind: str
    matrix: str
    output: str
    stats: OutputStats


def _float(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _unsummarised(session: Reader, *conditions: Any) -> list[int]:
    """Ids of the runs (among ``conditions``) whose numbers must be computed live: running, or
    written since their summary. Usually none or one, so the live part stays small."""
    query = select(runs.c.id).where(runs.c.summarised_at.is_(None), *conditions)
    return list(session.scalars(query))


def history(
    session: Reader,
    dtype: str,
    *,
    kernel: str | None = None,
    since: datetime | None = None,
    output: str | None = None,
    matrix: str | None = None,
) -> list[HistoryPoint]:
    """Per run (oldest first) and output: errors of the outputs judged in ``dtype``
    (``core.verdict.judged_dtype``: the x dtype, dw/db the weight dtype).

    Runs that stopped writing are read from their stored summaries (a few rows per run); the
    others are computed live by the same SELECT that filled those summaries
    (``summaries.summary_select``), so both give the same numbers. A run summarised while this
    reads is taken live (its id was listed first), never twice.
    """
    r = runs.c
    conditions: list[Any] = [r.kind == "run"]  # history points are plain runs only
    if kernel is not None:
        conditions.append(r.kernel == kernel)
    if matrix is not None:
        conditions.append(r.matrix == matrix)
    if since is not None:
        conditions.append(r.started_at >= _aware(since))
    live = _unsummarised(session, *conditions)
    kept = run_summaries.c
    stored = select(*(kept[c] for c in SUMMARY_COLUMNS)).where(kept.x_dtype == dtype)
    if output is not None:
        stored = stored.where(kept.output == output)
    if live:
        stored = stored.where(kept.run_id.not_in(live))
        both = union_all(stored, summary_select(live, dtype=dtype, output=output))
        per_run = both.subquery()
    else:
        per_run = stored.subquery()
    c = per_run.c
    rows = session.execute(
        select(c.run_id, r.started_at, r.kernel, r.kernel_commit, r.label)
        .add_columns(
            r.device_kind, r.matrix, c.output, c.cases, c.passed, c.worst_rel, c.median_rel
        )
        .add_columns(c.worst_norm, c.median_norm, c.worst_case_id, c.worst_usage, c.median_usage)
        .join(runs, r.id == c.run_id)
        .where(*conditions)
    )
    # In HistoryPoint's field order, unpacked by position: a point per run and output can be
    # thousands, and named access on each row costs more than the query itself.
    points = [
        HistoryPoint(
            run_id, _aware(started), kernel, commit, label, device, matrix_name, out,
            OutputStats(
                n, int(n_passed), *(_float(v) for v in errors), worst_case, usage, median_usage
            ),
        )
        for run_id, started, kernel, commit, label, device, matrix_name, out, n, n_passed, *errors,
        worst_case, usage, median_usage in rows
    ]  # fmt: skip
    rank = {name: i for i, name in enumerate(OUTPUTS)}
    points.sort(key=lambda p: (p.started_at, p.run_id, rank.get(p.output, len(rank)), p.output))
    return points


def case_counts(session: Reader, dtype: str, run_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """run id -> outcome -> cases with input dtype ``dtype`` in that run (every outcome
    present; runs without such cases absent): the case count and pass rate history shows.

    Stored counts for runs that stopped writing, ``summaries.count_select`` live for the rest.
    """
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    live = _unsummarised(session, runs.c.id.in_(ids))
    kept = run_counts.c
    query = select(*(kept[c] for c in COUNT_COLUMNS)).where(
        kept.x_dtype == dtype, kept.run_id.in_(ids)
    )
    if live:
        query = union_all(query.where(kept.run_id.not_in(live)), count_select(live, dtype=dtype))
    return {
        row.run_id: {o: int(getattr(row, f"n_{o}") or 0) for o in OUTCOMES}
        for row in session.execute(query)
    }
