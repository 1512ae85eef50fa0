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
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from sqlalchemy import Engine, delete, exc, func, insert, select, update
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.records import OUTCOMES, CaseResult, RunMeta
from convmatrix.db.aggregates import aggregate_runs
from convmatrix.db.engine import connection_error, redact_argv, redact_url, write_session
from convmatrix.db.migrate import ensure_schema
from convmatrix.db.models import (
    HEARTBEAT_S,
    RUN_STATUSES,
    STALE_HEARTBEAT_S,
    CaseRow,
    MetricRow,
    PropertyRow,
    Run,
    RunShardRow,
    TimingRow,
    utcnow,
)
from convmatrix.db.records import case_values, child_values

__all__ = ["ResultWriter", "RunMeta", "reap_stale_runs", "shard_status"]


def _counts(session: Session, run_id: int) -> Counter[str]:
    rows = session.execute(
        select(CaseRow.outcome, func.count())
        .where(CaseRow.run_id == run_id)
        .group_by(CaseRow.outcome)
    )
    return Counter({outcome: n for outcome, n in rows})


def _count_values(counts: Counter[str]) -> dict[str, int]:
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
            for key, value in _count_values(_counts(session, run.id)).items():
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

    def __init__(self, engine: Engine, *, batch_size: int = 200, max_delay_s: float = 2.0):
        ensure_schema(engine)
        self.engine = engine
        self.batch_size = max(1, batch_size)
        self.max_delay_s = max_delay_s
        self.run_id: int | None = None
        self.written = 0  # results committed by this writer
        self._buffer: dict[str, CaseResult] = {}
        self._timer: threading.Timer | None = None  # flushes a batch that is not filling up
        self._lock = threading.RLock()  # the timer's thread and the caller's share the buffer
        self._finished = False
        self._beating = threading.Event()  # set: the heartbeat thread stops

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
        values = asdict(meta)
        values["argv"] = redact_argv(meta.argv)
        with write_session(self.engine) as session:
            now = utcnow()
            run = Run(**values, pid=os.getpid(), status="running", started_at=now, heartbeat_at=now)
            session.add(run)
            session.flush()
            self.run_id = run.id
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
                        values = {**asdict(meta), "pid": None, "status": "running"}
                        run = Run(**values, started_at=utcnow(), shard_label=label)
                        run.shard_count = count
                        session.add(run)
                        session.flush()
                        run_id = run.id
                except exc.IntegrityError:  # another shard created it first: join that one
                    continue
            self._register_shard(run_id, label, count, shard, meta)
            self.run_id, self._finished = run_id, False
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
            if run.matrix_hash != meta.matrix_hash or run.kernel != meta.kernel:
                raise UsageError(
                    f"--run-label {label}: run {run_id} is {run.kernel} on matrix {run.matrix}; "
                    f"this shard runs {meta.kernel} on {meta.matrix} (a new label per run)"
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
        (``shard_status``); the run's status."""
        run_id = self.run_id
        if run_id is None:
            raise RuntimeError("finish_shard before join_sharded_run")
        self.flush()
        with write_session(self.engine) as session:
            session.execute(
                update(RunShardRow)
                .where(RunShardRow.run_id == run_id, RunShardRow.shard == shard)
                .values(status=status, finished_at=utcnow())
            )
            run = session.get(Run, run_id)
            assert run is not None and run.shard_count is not None
            rows = session.scalars(select(RunShardRow).where(RunShardRow.run_id == run_id))
            overall = shard_status(run.shard_count, {r.shard: r.status for r in rows})
        self.finish_run(run_id, overall)
        return overall

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
        self._start_heartbeat()

    def finish_run(self, run_id: int | None = None, status: str = "finished") -> None:
        """Flush, then store the final counts, ``finished_at`` and ``status``, and (unless the
        status is ``running``) the history summary, all in one transaction."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, not {status!r}")
        run_id = self.run_id if run_id is None else run_id
        if run_id is None:
            raise RuntimeError("finish_run before start_run")
        if run_id == self.run_id:
            self._beating.set()
            self.flush()
        with write_session(self.engine) as session:
            # Lock the run first: a shard writing a batch meanwhile waits, and the count read
            # next sees every batch committed before it.
            session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
            values = _count_values(_counts(session, run_id))
            session.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status=status, finished_at=None if status == "running" else utcnow())
                .values(**values)
            )
            if status != "running":
                aggregate_runs(session, [run_id])
        if run_id == self.run_id:
            self._finished = True

    # -- results ------------------------------------------------------------------------------
    def add(self, result: CaseResult) -> None:
        """Buffer one result; the batch commits when full or ``max_delay_s`` after it began."""
        with self._lock:
            self._buffer[result.case.id] = result  # a retry within the batch replaces, too
            if len(self._buffer) >= self.batch_size:
                self.flush()
            elif self._timer is None:
                # A timer, not a check on the next add: with slow cases the next add may be
                # minutes away, and a killed controller would lose what waits in the buffer.
                self._timer = threading.Timer(self.max_delay_s, self._flush_in_background)
                self._timer.daemon = True
                self._timer.start()

    def _flush_in_background(self) -> None:
        try:
            self.flush()
        except Exception as err:  # kept in the buffer: the next add or flush tries again
            print(f"convmatrix: writing results failed, will retry: {err}", file=sys.stderr)

    def flush(self) -> int:
        """Commit every buffered result in one transaction; returns how many."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self._buffer:
                return 0
            if self.run_id is None:
                raise RuntimeError("start_run or resume_run before writing results")
            return self._write(list(self._buffer.values()), self.run_id)

    def _write(self, batch: list[CaseResult], run_id: int) -> int:
        with write_session(self.engine) as session:
            replaced = self._drop_stored(session, run_id, [r.case.id for r in batch])
            # Core inserts, one multi-row statement per table and page: the ORM's bulk path
            # (and RETURNING in parameter order on SQLite) falls back to a statement per row.
            inserted = session.execute(
                insert(CaseRow.__table__).returning(CaseRow.id, CaseRow.case_id),
                [case_values(r, run_id) for r in batch],
            )
            pks = {case_id: pk for pk, case_id in inserted}
            children: tuple[list[dict[str, Any]], ...] = ([], [], [])
            for result in batch:
                new = child_values(result, pks[result.case.id], run_id)
                for rows, more in zip(children, new, strict=True):
                    rows.extend(more)
            for model, rows in zip((MetricRow, PropertyRow, TimingRow), children, strict=True):
                if rows:
                    session.execute(insert(model.__table__), rows)
            delta: Counter[str] = Counter(r.outcome for r in batch)
            delta.subtract(replaced)
            # Increments, not values: shards of one run write their batches concurrently.
            # The summary no longer matches: history computes this run live until it stops.
            values: dict[str, Any] = {
                f"n_{o}": getattr(Run, f"n_{o}") + n for o, n in delta.items() if n
            }
            session.execute(
                update(Run).where(Run.id == run_id).values(**values, summarised_at=None)
            )
        self._buffer.clear()
        self.written += len(batch)
        return len(batch)

    @staticmethod
    def _drop_stored(session: Session, run_id: int, case_ids: list[str]) -> list[str]:
        """Delete what the run already holds for ``case_ids``; returns the old outcomes."""
        where = (CaseRow.run_id == run_id, CaseRow.case_id.in_(case_ids))
        old = session.execute(select(CaseRow.id, CaseRow.outcome).where(*where)).all()
        if old:
            pks = [pk for pk, _ in old]
            for model in (MetricRow, PropertyRow, TimingRow):
                session.execute(delete(model).where(model.run_id == run_id, model.case_pk.in_(pks)))
            session.execute(delete(CaseRow).where(CaseRow.id.in_(pks)))
        return [outcome for _, outcome in old]

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
