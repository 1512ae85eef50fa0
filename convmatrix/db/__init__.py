"""The results database: models, migrations, the batched writer and the queries reports use.

Typical use::

    engine = open_database(args.db)            # default CONVMATRIX_DB or sqlite:///convmatrix.db
    with ResultWriter(engine) as writer:       # the single writer (the xdist controller)
        run_id = writer.start_run(RunMeta(kernel=..., matrix=..., matrix_hash=...))
        for result in results:
            writer.add(result)                 # committed in batches
    with engine.connect() as conn:                # or an ORM Session: queries take either
        run = resolve_run(conn, "latest")
        results = load_results(conn, run.id)
        points = history(conn, "bfloat16")             # stored per-run summaries, live if running
        counts = case_counts(conn, "bfloat16", [p.run_id for p in points])

Names load on first use (``core.lazy``): a command that only reads imports the queries and
Core, never the ORM and the writer.
"""

from convmatrix.core.lazy import lazy_attributes

_WHERE = {
    **dict.fromkeys(
        ("DEFAULT_URL", "default_url", "make_engine", "redact_url"), "convmatrix.db.engine"
    ),
    **dict.fromkeys(("aggregate_pending", "aggregate_runs"), "convmatrix.db.aggregates"),
    **dict.fromkeys(
        ("current_revision", "ensure_schema", "head_revision", "open_database"),
        "convmatrix.db.migrate",
    ),
    **dict.fromkeys(
        (
            "CasePair",
            "HistoryPoint",
            "OutputStats",
            "RunInfo",
            "case_counts",
            "case_pairs",
            "done_case_ids",
            "history",
            "list_runs",
            "load_results",
            "missing_shards",
            "resolve_run",
        ),
        "convmatrix.db.queries",
    ),
    **dict.fromkeys(("ResultWriter", "reap_stale_runs"), "convmatrix.db.writer"),
    "Session": "sqlalchemy.orm",  # for reading mapped rows (``db.models``) and writing
}
__all__ = sorted(_WHERE)
__getattr__ = lazy_attributes(__name__, _WHERE)
