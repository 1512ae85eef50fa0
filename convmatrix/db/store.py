"""``DatabaseStore``: a run's results kept in the database (the runners' ``RunStore``).

One engine per store, opened on first use: looking up the run ``--resume`` names, the
run's completed cases, and then writing the run all go through it. Results are buffered and
committed in batches by ``ResultWriter``; ``finish`` flushes, sets the run's status and
returns its counts over every session that wrote to it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from convmatrix.core.records import CaseResult, RunMeta
from convmatrix.db.engine import redact_url
from convmatrix.db.migrate import open_database
from convmatrix.db.models import Run
from convmatrix.db.queries import done_case_ids, resolve_run
from convmatrix.db.writer import ResultWriter
from convmatrix.runners.store import Shard, StoredRun

__all__ = ["DatabaseStore"]


class DatabaseStore:
    """``url``: a SQLAlchemy URL, or None for ``CONVMATRIX_DB`` / ``sqlite:///convmatrix.db``."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url
        self._engine: Engine | None = None
        self._writer: ResultWriter | None = None
        self._shard: Shard | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = open_database(self.url)
        return self._engine

    def where(self) -> str | None:
        return redact_url(self.engine.url)

    def sharded(self, label: str) -> StoredRun | None:
        with Session(self.engine) as session:
            run_id = session.scalar(select(Run.id).where(Run.shard_label == label))
        return None if run_id is None else self.lookup(str(run_id))

    def lookup(self, spec: str) -> StoredRun:
        with Session(self.engine) as session:
            info = resolve_run(session, spec)
            done = done_case_ids(session, info.id)
        sources = info.options.get("matrix_sources") or [info.matrix]
        return StoredRun(
            id=info.id,
            kernel=info.kernel,
            kernel_spec=info.options.get("kernel_spec"),
            matrix_sources=tuple(sources),
            done=frozenset(done),
        )

    def start(
        self, meta: RunMeta, resume: int | None = None, shard: Shard | None = None
    ) -> int | None:
        self._writer = ResultWriter(self.engine)
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
            writer.finish_shard(self._shard.index, status)
        else:
            writer.finish_run(writer.run_id, status)
        with Session(self.engine) as session:
            counts = resolve_run(session, writer.run_id).counts
        self.engine.dispose()
        return counts
