"""The results database: models, migrations, the batched writer and the queries reports use.

Typical use::

    engine = open_database(args.db)            # default CONVMATRIX_DB or sqlite:///convmatrix.db
    with ResultWriter(engine) as writer:       # the single writer (the xdist controller)
        run_id = writer.start_run(RunMeta(kernel=..., matrix=..., matrix_hash=...))
        for result in results:
            writer.add(result)                 # committed in batches
    with Session(engine) as session:
        run = resolve_run(session, "latest")
        results = load_results(session, run.id)
        points = history(session, "bfloat16")          # stored per-run summaries, live if running
        counts = case_counts(session, "bfloat16", [p.run_id for p in points])
"""

from sqlalchemy.orm import Session

from convmatrix.db.aggregates import aggregate_pending, aggregate_runs
from convmatrix.db.engine import DEFAULT_URL, default_url, make_engine, redact_url
from convmatrix.db.migrate import current_revision, ensure_schema, head_revision, open_database
from convmatrix.db.queries import (
    CasePair,
    HistoryPoint,
    OutputStats,
    RunInfo,
    case_counts,
    case_pairs,
    done_case_ids,
    history,
    list_runs,
    load_results,
    missing_shards,
    resolve_run,
)
from convmatrix.db.writer import ResultWriter, reap_stale_runs

__all__ = [
    "DEFAULT_URL",
    "CasePair",
    "HistoryPoint",
    "OutputStats",
    "ResultWriter",
    "RunInfo",
    "Session",
    "aggregate_pending",
    "aggregate_runs",
    "case_counts",
    "case_pairs",
    "current_revision",
    "default_url",
    "done_case_ids",
    "ensure_schema",
    "head_revision",
    "history",
    "list_runs",
    "load_results",
    "make_engine",
    "missing_shards",
    "open_database",
    "reap_stale_runs",
    "redact_url",
    "resolve_run",
]
