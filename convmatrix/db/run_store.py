"""``DatabaseStore``: a run's results kept in the database (the runners' ``RunStore``).

The store records through the ``Database`` it is given (opened on first use, closed by its
owner: the run pipeline, or the database's pytest plugin): looking up the run ``--resume``
names, the run's completed cases, and then writing the run all go through its one engine.
Results are buffered and committed in batches by ``ResultWriter``; ``finish`` flushes, sets the
run's status and returns its counts over every session that wrote to it. Results the database
refused past the retry limit are in the run's journal (``db.journal``; ``failure`` names it),
and ``lookup`` (``--resume``) replays a run's journal before it says which cases are done.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, exc, select, text
from sqlalchemy.orm import Session

from convmatrix.core.errors import UsageError
from convmatrix.core.recorded import Recorded
from convmatrix.core.records import CaseResult, RunMeta, run_identity
from convmatrix.db.database import Database
from convmatrix.db.engine import connection_error, write_session
from convmatrix.db.models import Run
from convmatrix.db.queries import done_case_ids, resolve_run
from convmatrix.db.writer import ResultWriter, replay_journal
from convmatrix.runners.run.store import Shard, StoredRun

__all__ = ["DatabaseStore"]


class DatabaseStore:
    """Results kept in ``database`` (``db.database.Database``; opened on first use)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._writer: ResultWriter | None = None
        self._shard: Shard | None = None
        self._run_status: str | None = None

    @property
    def engine(self) -> Engine:
        return self.database.engine

    def where(self) -> str | None:
        return self.database.shown

    def check(self) -> None:
        """Open the database (schema included) and write nothing once (a DELETE matching no
        row): a read-only file, server or role fails here, in one line, not inside the run."""
        try:
            with write_session(self.engine) as session:
                session.execute(text("DELETE FROM alembic_version WHERE 1 = 0"))
        except exc.DBAPIError as err:  # a database the run cannot use: a usage error (exit 2)
            raise UsageError(str(connection_error(self.engine, err))) from err

    def sharded(self, label: str) -> StoredRun | None:
        # Other shards of the run may be writing it right now: joining is not resuming.
        with Session(self.engine) as session:
            run_id = session.scalar(select(Run.id).where(Run.shard_label == label))
        return None if run_id is None else self._stored(str(run_id), alive_ok=True)

    def lookup(self, spec: str) -> StoredRun:
        return self._stored(spec, alive_ok=False)

    def _stored(self, spec: str, alive_ok: bool) -> StoredRun:
        with Session(self.engine) as session:
            info = resolve_run(session, spec)
            age = info.heartbeat_age()
            if not alive_ok and info.status == "running" and age is not None and not info.abandoned:
                raise UsageError(
                    f"--resume {spec}: run {info.id} is still running (pid {info.pid} on "
                    f"{info.host}, heartbeat {age:.0f} s ago); resume it once it has stopped"
                )
        if not alive_ok and info.uid:  # --resume: what the database refused comes first
            replayed = replay_journal(self.engine, info.id, info.uid, self.database.url)
            if replayed:
                print(f"convmatrix run: run {info.id}: {replayed} result(s) from its journal")
        with Session(self.engine) as session:
            done = done_case_ids(session, info.id)
        recorded = Recorded.of(info.options)
        return StoredRun(
            id=info.id,
            kernel=info.kernel,
            kernel_spec=recorded.kernel_spec,
            matrix_sources=tuple(recorded.matrix_sources or [info.matrix]),
            done=frozenset(done),
            identity=run_identity(info),
        )

    def start(
        self, meta: RunMeta, resume: int | None = None, shard: Shard | None = None
    ) -> int | None:
        self._writer = ResultWriter(self.engine, url=self.database.url)
        self._shard = shard
        if shard is not None:
            return self._writer.join_sharded_run(meta, shard.label, shard.count, shard.index)
        if resume is None:
            return self._writer.start_run(meta)
        self._writer.resume_run(resume)
        return resume

    def add(self, result: CaseResult) -> None:
        assert self._writer is not None, "start the run before adding results"
        self._writer.add(result)

    def finish(self, status: str) -> Mapping[str, int] | None:
        writer = self._writer
        if writer is None or writer.run_id is None:
            return None
        if self._shard is not None:
            self._run_status = writer.finish_shard(self._shard.index, status)
        else:
            writer.finish_run(writer.run_id, status)
            self._run_status = status
        if writer.failure is not None:
            return None  # the database cannot say: the account counts this session's
        try:
            with Session(self.engine) as session:
                return resolve_run(session, writer.run_id).counts
        except exc.SQLAlchemyError:  # gone again since it closed the run: this session's
            return None

    def failure(self) -> str | None:
        return None if self._writer is None else self._writer.failure

    def run_status(self) -> str | None:
        return self._run_status
