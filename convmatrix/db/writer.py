"""The single writer of a run: results buffered and committed in batches.

The pytest-xdist controller owns one ``ResultWriter``; workers never touch the database. A
commit per result is several times slower than one per batch (benchmarks/bench_db_ingest.py),
so results are buffered and written every ``batch_size`` results or ``max_delay_s`` seconds
after the first of a batch arrived, each batch in one transaction with multi-row inserts.
A killed run keeps every committed batch: leaving the ``with`` block by an exception or Ctrl-C
flushes what is buffered and marks the run ``interrupted``; a run whose process died without a
word (SIGKILL) is marked ``interrupted`` by the next writer started on the same host.
A run that stops (finished or interrupted, also when reaped) gets its history summary computed
in the transaction that sets its status; every batch written clears it (``summaries.py``).

No result is dropped when the database blinks. A batch the database refuses stays buffered
and is tried again with backoff (0.5 s doubling to 8 s) for up to ``retry_s`` seconds from the
first failure (``CONVMATRIX_DB_RETRY_S``, default 60); past that, it and every later result
go to the run's journal (``db.journal``: JSON lines beside the SQLite file or in the working
directory, replayed by ``convmatrix run --resume`` or ``convmatrix import``). ``failure``
then holds the one line the run ends with; the run's exit status is the infrastructure one.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, delete, exc, func, select, update
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.records import OUTCOMES, CaseResult, RunMeta, run_identity
from convmatrix.core.sanitise import redact_argv
from convmatrix.db import tables
from convmatrix.db.aggregates import aggregate_runs
from convmatrix.db.engine import connection_error, redact_url, write_session
from convmatrix.db.journal import Journal, journal_paths, meta_values, read_journal, run_line
from convmatrix.db.migrate import ensure_schema
from convmatrix.db.models import CaseRow, Run, RunShardRow
from convmatrix.db.records import (
    CASES,
    CASES_WITH_ID,
    METRICS,
    PROPERTIES,
    TIMINGS,
    case_row,
    child_rows,
)
from convmatrix.db.tables import HEARTBEAT_S, RUN_STATUSES, STALE_HEARTBEAT_S, utcnow

__all__ = [
    "DEFAULT_RETRY_S",
    "ResultWriter",
    "RunMeta",
    "count_values",
    "reap_stale_runs",
    "replay_journal",
    "retry_bound",
    "run_counts",
    "run_values",
    "shard_status",
    "write_results",
]

DEFAULT_RETRY_S = 60.0
RETRY_ENV = "CONVMATRIX_DB_RETRY_S"
_BACKOFF_S = (0.5, 8.0)  # first pause between attempts, and the longest
# What a database that is there again a moment later answers: a server restarting, in crash
# recovery or unreachable, a lock or a full disk. Anything else (a constraint, bad data) will
# not pass on a retry: it goes to the journal at once.
_TRANSIENT = (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError, exc.TimeoutError)
T = TypeVar("T")
_PAGE = 900  # case ids per IN (...): under SQLite's oldest limit of 999 parameters


def retry_bound() -> float:
    """Seconds a refused batch is retried before it goes to the journal
    (``CONVMATRIX_DB_RETRY_S``, checked at start-up by ``core.environment``)."""
    text = os.environ.get(RETRY_ENV, "").strip()
    try:
        return max(0.0, float(text)) if text else DEFAULT_RETRY_S
    except ValueError:
        return DEFAULT_RETRY_S


def _reason(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    return text[0] if text else type(err).__name__


def run_values(meta: RunMeta) -> dict[str, Any]:
    """The run row's values of ``meta``: the command line's passwords redacted (every door
    that creates a run row goes through here: a plain run, a shard, an import)."""
    values = asdict(meta)
    values["argv"] = redact_argv(meta.argv)
    return values


def write_results(session: Session, run_id: int, batch: list[CaseResult]) -> None:
    """Store ``batch`` in run ``run_id`` inside ``session``'s transaction: what the run already
    holds for those cases is replaced, and the run's counts move by the difference."""
    # Core on the session's connection, and plain tuples through the driver's executemany
    # (``records.Layout``): dicts, the ORM's statement handling and SQLAlchemy's per-row
    # parameter processing cost more than the SQL itself (benchmarks/bench_db_ingest.py).
    connection = session.connection()
    ids = [r.case.id for r in batch]
    replaced = _drop_stored(connection, run_id, ids)
    now = utcnow()
    if connection.dialect.name == "sqlite":
        # The write lock is held from the transaction's start (``engine.write_session``): the
        # next ids are this batch's, given with the rows rather than read back by a SELECT.
        first = (connection.scalar(select(func.max(_CASES.id))) or 0) + 1
        pks = dict(zip(ids, range(first, first + len(ids)), strict=True))
        CASES_WITH_ID.insert(
            connection, [(pks[r.case.id], *case_row(r, run_id, now)) for r in batch]
        )
    else:  # concurrent writers (shards) take ids from the sequence: read them back
        CASES.insert(connection, [case_row(r, run_id, now) for r in batch])
        pks = _case_pks(connection, run_id, ids)
    children: tuple[list[tuple[Any, ...]], ...] = ([], [], [])
    for result in batch:
        new = child_rows(result, pks[result.case.id], run_id)
        for rows, more in zip(children, new, strict=True):
            rows.extend(more)
    for layout, rows in zip((METRICS, PROPERTIES, TIMINGS), children, strict=True):
        layout.insert(connection, rows)
    delta: Counter[str] = Counter(r.outcome for r in batch)
    delta.subtract(replaced)
    # Increments, not values: shards of one run write their batches concurrently.
    # The summary no longer matches: history computes this run live until it stops.
    r = tables.runs.c
    values: dict[str, Any] = {f"n_{o}": r[f"n_{o}"] + n for o, n in delta.items() if n}
    connection.execute(
        update(tables.runs).where(r.id == run_id).values(**values, summarised_at=None)
    )


_CASES = tables.cases.c


def _case_pks(connection: Connection, run_id: int, case_ids: list[str]) -> dict[str, int]:
    """case id -> the primary key its row got (the (run, case id) index; in pages that
    every driver's parameter limit allows)."""
    pks: dict[str, int] = {}
    for start in range(0, len(case_ids), _PAGE):
        page = case_ids[start : start + _PAGE]
        rows = connection.execute(
            select(_CASES.case_id, _CASES.id).where(
                _CASES.run_id == run_id, _CASES.case_id.in_(page)
            )
        )
        pks.update((case_id, pk) for case_id, pk in rows)
    return pks


def _drop_stored(connection: Connection, run_id: int, case_ids: list[str]) -> list[str]:
    """Delete what the run already holds for ``case_ids``; returns the old outcomes."""
    where = (_CASES.run_id == run_id, _CASES.case_id.in_(case_ids))
    old = connection.execute(select(_CASES.id, _CASES.outcome).where(*where)).all()
    if old:
        pks = [pk for pk, _ in old]
        for table in (tables.metrics, tables.properties, tables.timings):
            connection.execute(
                delete(table).where(table.c.run_id == run_id, table.c.case_pk.in_(pks))
            )
        connection.execute(delete(tables.cases).where(_CASES.id.in_(pks)))
    return [outcome for _, outcome in old]


def replay_journal(engine: Engine, run_id: int, uid: str, url: str) -> int:
    """Store the results of run ``run_id``'s journal (in any of its places) in the run, in one
    transaction, and move the journal aside (``.replayed``); how many results it held."""
    found = [path for path in journal_paths(url, uid) if path.is_file()]
    if not found:
        return 0
    batch: dict[str, CaseResult] = {}
    for path in found:
        try:
            head, results = read_journal(path)
        except (ValueError, KeyError, TypeError) as err:
            raise UsageError(f"--resume: the journal {path} cannot be read: {err}") from None
        if head.get("uid") != uid:
            raise UsageError(f"--resume: the journal {path} belongs to run {head.get('uid')}")
        batch.update((r.case.id, r) for r in results)  # a case's last result wins
    if batch:
        with write_session(engine) as session:
            write_results(session, run_id, list(batch.values()))
    for path in found:
        path.replace(path.with_name(path.name + ".replayed"))
    return len(batch)


def run_counts(session: Session, run_id: int) -> Counter[str]:
    rows = session.execute(
        select(CaseRow.outcome, func.count())
        .where(CaseRow.run_id == run_id)
        .group_by(CaseRow.outcome)
    )
    return Counter({outcome: n for outcome, n in rows})


def count_values(counts: Counter[str]) -> dict[str, int]:
    return {f"n_{o}": counts[o] for o in OUTCOMES}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _abandoned(run: Run, host: str, now: datetime) -> bool:
    """A ``running`` run whose controller is gone: its process is dead (this host), or its
    heartbeat is stale (any host; runs from before heartbeats only by their process)."""
    if run.host == host and run.pid is not None and not _alive(run.pid):
        return True
    beat = run.heartbeat_at
    if beat is None:
        return False
    if beat.tzinfo is None:  # SQLite keeps no zone: stored in UTC
        beat = beat.replace(tzinfo=timezone.utc)
    return (now - beat).total_seconds() > STALE_HEARTBEAT_S


def reap_stale_runs(engine: Engine, host: str | None = None) -> list[int]:
    """Mark ``abandoned`` the runs still ``running`` whose controller is gone (its process
    dead on this host, or its heartbeat stale): they can be resumed."""
    host, now = host or socket.gethostname(), utcnow()
    with write_session(engine) as session:
        stale = [
            run
            for run in session.scalars(select(Run).where(Run.status == "running"))
            if _abandoned(run, host, now)
        ]
        for run in stale:
            last = session.scalar(
                select(func.max(CaseRow.created_at)).where(CaseRow.run_id == run.id)
            )
            run.status, run.finished_at = "abandoned", last or run.started_at
            for key, value in count_values(run_counts(session, run.id)).items():
                setattr(run, key, value)
        session.flush()
        aggregate_runs(session, [run.id for run in stale])
        return [run.id for run in stale]


class ResultWriter:
    """Buffers ``CaseResult`` records and commits them to one run in batches.

    Use as a context manager: ``with ResultWriter(engine) as w: run_id = w.start_run(meta)``,
    then ``w.add(result)`` per result. A clean exit finishes the run; an exception or
    KeyboardInterrupt flushes and marks it ``interrupted``. A result for a case the run already
    holds replaces the stored one (resume, retry).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        batch_size: int = 200,
        max_delay_s: float = 2.0,
        retry_s: float | None = None,
        url: str | None = None,
    ):
        ensure_schema(engine)
        self.engine = engine
        self.batch_size = max(1, batch_size)
        self.max_delay_s = max_delay_s
        self.retry_s = retry_bound() if retry_s is None else max(0.0, retry_s)
        # The URL the run was opened by: where its journal goes (beside a SQLite file).
        self.url = url or engine.url.render_as_string(hide_password=False)
        self.run_id: int | None = None
        self.written = 0  # results committed by this writer
        self.journal: Journal | None = None  # set once results went to the journal
        self.failure: str | None = None  # the one line a run that lost its database ends with
        self._buffer: dict[str, CaseResult] = {}
        self._timer: threading.Timer | None = None  # flushes a batch that is not filling up
        self._lock = threading.RLock()  # the timer's thread and the caller's share the buffer
        self._writing = threading.Lock()  # one batch in flight at a time
        self._finished = False
        self._beating = threading.Event()  # set: the heartbeat thread stops
        self._head: dict[str, Any] | None = None  # the journal's run line
        self._failing_since: float | None = None  # monotonic time of the first refusal
        self._pause = _BACKOFF_S[0]  # the next pause before trying a refused batch again
        self._last_error = ""

    # -- the run ------------------------------------------------------------------------------
    def start_run(self, meta: RunMeta) -> int:
        """Create the run row (status ``running``) and return its id. A database that cannot
        be written (read-only, full) is a one-line ``ConvmatrixError`` before anything runs."""
        try:
            return self._start_run(meta)
        except exc.DBAPIError as err:
            raise connection_error(self.engine, err) from err

    def _start_run(self, meta: RunMeta) -> int:
        reap_stale_runs(self.engine, meta.host)
        with write_session(self.engine) as session:
            now = utcnow()
            values = run_values(meta)
            run = Run(**values, pid=os.getpid(), status="running", started_at=now, heartbeat_at=now)
            session.add(run)
            session.flush()
            self.run_id = run.id
        self._head = run_line(self.run_id, meta_values(meta), now)
        self._finished = False
        self._start_heartbeat()
        return self.run_id

    def _start_heartbeat(self) -> None:
        """Stamp ``heartbeat_at`` every ``HEARTBEAT_S`` until the run is finished: a run left
        ``running`` without a fresh heartbeat lost its controller (``abandoned``)."""
        self._beating.set()
        self._beating = threading.Event()
        stop, run_id = self._beating, self.run_id
        failed: list[Exception] = []

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                try:
                    with write_session(self.engine) as session:
                        session.execute(
                            update(Run).where(Run.id == run_id).values(heartbeat_at=utcnow())
                        )
                except Exception as err:  # the next beat tries again; say so once
                    if not failed:
                        print(f"convmatrix: heartbeat failed: {err}", file=sys.stderr)
                    failed.append(err)

        threading.Thread(target=beat, name="convmatrix-heartbeat", daemon=True).start()

    def join_sharded_run(self, meta: RunMeta, label: str, count: int, shard: int) -> int:
        """Shard ``shard`` of ``count``: create the run labelled ``label`` if no shard has yet
        (the unique label makes one of two racing shards create it, the other join), then
        register this shard as ``running``. The run's ``pid`` stays NULL: shards live on
        other hosts and processes, so only ``run_shards`` says who is alive."""
        for _attempt in range(3):
            run_id = self._sharded_run_id(label)
            if run_id is None:
                try:
                    with write_session(self.engine) as session:
                        values = {**run_values(meta), "pid": None, "status": "running"}
                        run = Run(**values, started_at=utcnow(), shard_label=label)
                        run.shard_count = count
                        session.add(run)
                        session.flush()
                        run_id = run.id
                except exc.IntegrityError:  # another shard created it first: join that one
                    continue
            self._register_shard(run_id, label, count, shard, meta)
            self.run_id, self._finished = run_id, False
            self._head = self._stored_head(run_id)
            return run_id
        raise UsageError(f"--run-label {label}: could not create or join the run")

    def _sharded_run_id(self, label: str) -> int | None:
        with Session(self.engine) as session:
            return session.scalar(select(Run.id).where(Run.shard_label == label))

    def _register_shard(self, run_id: int, label: str, count: int, shard: int, meta: RunMeta):
        with write_session(self.engine) as session:
            run = session.get(Run, run_id, with_for_update=True)
            assert run is not None
            if run.shard_count != count:
                raise UsageError(
                    f"--shard {shard}/{count}: run {run_id} (--run-label {label}) was started "
                    f"with {run.shard_count} shards"
                )
            theirs, ours = run_identity(run), run_identity(meta)
            if theirs != ours:
                raise UsageError(
                    f"--run-label {label}: run {run_id} is {theirs}; this shard is {ours} "
                    "(a new label per run)"
                )
            row = session.get(RunShardRow, (run_id, shard))
            if row is None:
                row = RunShardRow(run_id=run_id, shard=shard)
                session.add(row)
            row.host, row.pid, row.status = meta.host, os.getpid(), "running"
            row.started_at, row.finished_at = utcnow(), None
            run.status, run.finished_at = "running", None

    def finish_shard(self, shard: int, status: str) -> str:
        """Close this shard with ``status`` and the run with what all shards say
        (``shard_status``); the run's status (``interrupted`` when the database could not
        take this shard's end: ``failure`` says where its results are)."""
        run_id = self.run_id
        if run_id is None:
            raise RuntimeError("finish_shard before join_sharded_run")
        self._beating.set()
        self._drain()
        closing = "interrupted" if self.journal is not None else status
        try:
            overall = self._retrying(lambda: self._close_shard(run_id, shard, closing))
        except exc.SQLAlchemyError as err:
            self._cannot_close(run_id, err)
            return "interrupted"
        self.finish_run(run_id, overall)
        return overall

    def _close_shard(self, run_id: int, shard: int, status: str) -> str:
        with write_session(self.engine) as session:
            # The run's row locked first, so shards closing at once close one at a time: on
            # PostgreSQL (read committed) two closers each saw the other's shard still
            # running and left a finished run ``running`` (SQLite locks up front anyway).
            run = session.get(Run, run_id, with_for_update=True)
            assert run is not None and run.shard_count is not None
            session.execute(
                update(RunShardRow)
                .where(RunShardRow.run_id == run_id, RunShardRow.shard == shard)
                .values(status=status, finished_at=utcnow())
            )
            rows = session.scalars(select(RunShardRow).where(RunShardRow.run_id == run_id))
            return shard_status(run.shard_count, {r.shard: r.status for r in rows})

    def resume_run(self, run_id: int) -> None:
        """Write into an existing run again (``convmatrix run --resume``): status ``running``."""
        try:
            self._resume_run(run_id)
        except exc.DBAPIError as err:
            raise connection_error(self.engine, err) from err

    def _resume_run(self, run_id: int) -> None:
        with write_session(self.engine) as session:
            run = session.get(Run, run_id)
            if run is None:
                raise UsageError(f"--resume: no run {run_id} in {redact_url(self.engine.url)}")
            run.status, run.finished_at, run.pid = "running", None, os.getpid()
            run.heartbeat_at = utcnow()
        self.run_id, self._finished = run_id, False
        self._head = self._stored_head(run_id)
        self._start_heartbeat()

    def _stored_head(self, run_id: int) -> dict[str, Any]:
        """The journal's run line for a run the database holds (resumed or joined)."""
        with Session(self.engine) as session:
            run = session.get(Run, run_id)
            assert run is not None
            return run_line(run_id, meta_values(run), run.started_at)

    def finish_run(self, run_id: int | None = None, status: str = "finished") -> None:
        """Flush, then store the final counts, ``finished_at`` and ``status``, and (unless the
        status is ``running``) the history summary, all in one transaction. A database that
        refuses past the retry limit leaves the results in the journal and ``failure`` set
        (the run is then ``interrupted`` wherever it can still be marked)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, not {status!r}")
        run_id = self.run_id if run_id is None else run_id
        if run_id is None:
            raise RuntimeError("finish_run before start_run")
        if run_id == self.run_id:
            self._beating.set()
            self._drain()
        if self.journal is not None:  # the last results are in the journal: not finished
            status = "interrupted"
        try:
            self._retrying(lambda: self._close(run_id, status))
        except exc.SQLAlchemyError as err:
            self._cannot_close(run_id, err)
        if run_id == self.run_id:
            self._finished = True

    def _close(self, run_id: int, status: str) -> None:
        with write_session(self.engine) as session:
            # Lock the run first: a shard writing a batch meanwhile waits, and the count read
            # next sees every batch committed before it.
            session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
            values = count_values(run_counts(session, run_id))
            session.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status=status, finished_at=None if status == "running" else utcnow())
                .values(**values)
            )
            if status != "running":
                aggregate_runs(session, [run_id])

    def _cannot_close(self, run_id: int, err: BaseException) -> None:
        """The run's end could not be stored: say so once (the run shows ``abandoned`` once
        this process is gone, and ``--resume`` closes it)."""
        if self.failure is None:
            self.failure = (
                f"the database refused to close run {run_id} for {self.retry_s:g} s "
                f"({_reason(err)}); its results are stored: convmatrix run --resume "
                f"{run_id} closes it"
            )

    # -- results ------------------------------------------------------------------------------
    def add(self, result: CaseResult) -> None:
        """Buffer one result; the batch commits when full or ``max_delay_s`` after it began
        (while the database refuses: when the backoff says, never blocking the caller)."""
        with self._lock:
            self._buffer[result.case.id] = result  # a retry within the batch replaces, too
            if len(self._buffer) >= self.batch_size and self._failing_since is None:
                self.flush()
            elif self._timer is None:
                # A timer, not a check on the next add: with slow cases the next add may be
                # minutes away, and a killed controller would lose what waits in the buffer.
                self._arm(self.max_delay_s)

    def _arm(self, delay_s: float) -> None:
        self._timer = threading.Timer(delay_s, self._flush_in_background)
        self._timer.daemon = True
        self._timer.start()

    def _flush_in_background(self) -> None:
        try:
            self.flush()
        except Exception as err:  # kept in the buffer: the next add or flush tries again
            print(f"convmatrix: writing results failed, will retry: {err}", file=sys.stderr)

    def flush(self) -> int:
        """Commit every buffered result in one transaction; how many were kept (committed,
        or appended to the journal past the retry limit). A batch the database refuses within
        the bound stays buffered, and a timer tries it again after the backoff pause."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self._buffer:
                return 0
            if self.run_id is None:
                raise RuntimeError("start_run or resume_run before writing results")
            batch, run_id = list(self._buffer.values()), self.run_id
        with self._writing:
            if self.journal is not None:
                return self._spool(batch)
            try:
                self._attempt(lambda: self._write(batch, run_id))
            except _TRANSIENT:
                if not self._out_of_time():
                    with self._lock:
                        if self._timer is None:
                            self._arm(self._pause)
                        self._pause = min(2 * self._pause, _BACKOFF_S[1])
                    return 0
                return self._spool(batch)
            except exc.SQLAlchemyError as err:  # will not pass on a retry: keep it now
                self._last_error = _reason(err)
                self._failing_since = self._failing_since or time.monotonic()
                return self._spool(batch)
        self._forget(batch)
        return len(batch)

    def _drain(self) -> None:
        """Flush until the buffer is empty: committed, or in the journal once the database
        has refused for the whole retry limit (pausing with backoff in between)."""
        pause = _BACKOFF_S[0]
        while True:
            self.flush()
            with self._lock:
                if not self._buffer:
                    return
            time.sleep(max(0.0, min(pause, self._time_left())))
            pause = min(2 * pause, _BACKOFF_S[1])

    def _forget(self, batch: list[CaseResult]) -> None:
        """Drop what was kept from the buffer (a newer result for a case stays)."""
        with self._lock:
            for result in batch:
                if self._buffer.get(result.case.id) is result:
                    del self._buffer[result.case.id]

    def _write(self, batch: list[CaseResult], run_id: int) -> int:
        with write_session(self.engine) as session:
            write_results(session, run_id, batch)
        self.written += len(batch)
        return len(batch)

    # -- when the database refuses ----------------------------------------------------------
    def _attempt(self, op: Callable[[], T]) -> T:
        """``op`` once; a transient refusal is noted (the bound runs from the first one)."""
        try:
            result = op()
        except _TRANSIENT as err:
            self._last_error = _reason(err)
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                print(
                    f"convmatrix: the database refused results ({self._last_error}); retrying "
                    f"for up to {self.retry_s:g} s, then keeping them in the run's journal",
                    file=sys.stderr,
                )
            raise
        if self._failing_since is not None and self.journal is None:
            print("convmatrix: the database takes results again", file=sys.stderr)
        self._failing_since, self._pause = None, _BACKOFF_S[0]
        return result

    def _retrying(self, op: Callable[[], T]) -> T:
        """``op``, tried again with backoff while the database refuses it, until the retry
        bound (from the first refusal) has passed; then the last error."""
        pause = _BACKOFF_S[0]
        while True:
            try:
                return self._attempt(op)
            except _TRANSIENT:
                if self._out_of_time():
                    raise
            time.sleep(max(0.0, min(pause, self._time_left())))
            pause = min(2 * pause, _BACKOFF_S[1])

    def _time_left(self) -> float:
        if self._failing_since is None:
            return self.retry_s
        return self.retry_s - (time.monotonic() - self._failing_since)

    def _out_of_time(self) -> bool:
        return self._time_left() <= 0

    def _spool(self, batch: list[CaseResult]) -> int:
        """Append ``batch`` to the run's journal (created on first use); how many kept."""
        assert self.run_id is not None
        if self.journal is None:
            head = self._head or run_line(self.run_id, {}, None)
            self.journal = Journal(journal_paths(self.url, str(head.get("uid"))), head)
            self._beating.set()  # the database is gone for this run: no more heartbeats
        try:
            self.journal.write(batch)
        except OSError as err:  # the local disk refuses too: nowhere left to keep them
            with self._lock:
                lost = len(self._buffer)
            self.failure = (
                f"the database refused results ({self._last_error}) and the journal "
                f"{self.journal.path} could not be written ({err.strerror}): {lost} result(s) "
                "not kept"
            )
            print(f"convmatrix: {self.failure}", file=sys.stderr)
            return 0
        self._forget(batch)
        waited = time.monotonic() - (self._failing_since or time.monotonic())
        self.failure = (
            f"the database refused results for {waited:.0f} s ({self._last_error}): "
            f"{self.journal.written} result(s) kept in the journal {self.journal.path}; "
            f"convmatrix run --resume {self.run_id} replays it"
        )
        return len(batch)

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.run_id is None or self._finished:
            return
        if exc_type is None:
            self.finish_run()
            return
        # Leaving by an exception: keep what we have, say the run is incomplete, and let the
        # original exception propagate (a second failure here must not replace it).
        try:
            self.finish_run(status="interrupted")
        except Exception as err:  # the database itself may be what failed
            print(
                f"convmatrix: could not mark run {self.run_id} interrupted "
                f"({len(self._buffer)} results unsaved): {err}",
                file=sys.stderr,
            )


def shard_status(count: int, shards: dict[int, str]) -> str:
    """A sharded run's status from its shards' (index -> status): ``finished`` when all
    ``count`` finished, ``interrupted`` when one was, else ``running`` (some never reported)."""
    if any(status == "interrupted" for status in shards.values()):
        return "interrupted"
    if all(shards.get(i) == "finished" for i in range(count)):
        return "finished"
    return "running"
