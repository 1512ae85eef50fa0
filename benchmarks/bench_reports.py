"""Report benchmarks: render time of a 10,000-case run report, and the history query over
1,000,000 metric rows on SQLite and PostgreSQL.

    python benchmarks/bench_reports.py [--pg postgresql://postgres@127.0.0.1/test]
                                       [--skip-render] [--skip-history]

Targets (issue 5): render <= 2 s; history query <= 100 ms. Timings are medians of repeated
runs after one warm-up, on whatever machine this runs on; the figures in docs/benchmarks.md say
where they were measured.

The history database is built honestly but quickly: one run of realistic results goes through
the real ``ResultWriter``; the other runs are copies of it made by the database itself
(INSERT ... SELECT with errors jittered per run and start times a day apart), then ANALYZE.
The copies bypass the writer, so they start without history summaries: history is timed once
so (every run computed live, as before summaries existed), then ``aggregate_pending`` fills
them as ``finish_run`` would, and history is timed reading them, also with one run left live
(a run in progress).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import Engine, create_engine, func, pool, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reports_support import (
    synthetic_results,
    tile_plus_one_channel_last,
    write_run,
)

from convmatrix.db import (
    aggregate_pending,
    aggregate_runs,
    case_counts,
    history,
    open_database,
)
from convmatrix.db.models import MetricRow, Run
from convmatrix.reports.render import write_report
from convmatrix.reports.run_view import build_run_view
from convmatrix.reports.source import run_case_counts
from convmatrix.reports.viewmodel import run_header

RENDER_TARGET_S = 2.0
HISTORY_TARGET_S = 0.100


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    """Median wall time of ``fn`` over ``repeat`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- render --------------------------------------------------------------------------------
def bench_render(n_cases: int = 10_000) -> None:
    results = synthetic_results(n_cases, bug=tile_plus_one_channel_last, timed_every=10)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/render.db"
        engine = open_database(url)
        run_id = write_run(engine, results)
        from convmatrix.db import load_results, resolve_run

        with Session(engine) as session:
            info = resolve_run(session, str(run_id))
            load_s = timed(lambda: load_results(session, run_id), repeat=3)
            stored = load_results(session, run_id)
        engine.dispose()
        head = run_header(info, url, stored)
        view_s = timed(lambda: build_run_view(head, stored))
        view = build_run_view(head, stored)
        out = Path(tmp) / "run.html"
        render_s = timed(lambda: write_report(view, out))
        size_mb = out.stat().st_size / 1e6
    total = view_s + render_s
    n_fail = len(view.failures)
    print(f"render: {len(results)} cases ({n_fail} failing, {len(view.timings)} timings)")
    print(f"  load from SQLite      {load_s * 1e3:8.1f} ms (convmatrix.db.load_results)")
    print(f"  view-model            {view_s * 1e3:8.1f} ms")
    print(f"  HTML + JSON           {render_s * 1e3:8.1f} ms ({size_mb:.1f} MB of HTML)")
    print(
        f"  view + render         {total * 1e3:8.1f} ms: {total / RENDER_TARGET_S:.2f} of the "
        f"{RENDER_TARGET_S:.0f} s target; with the load {(total + load_s):.2f} s"
    )


# -- history -------------------------------------------------------------------------------
_COPY_CASES = """
INSERT INTO cases (run_id, case_id, suite, op, width, seqlen, dim, batch, layout, gap,
    activation, bias, x_dtype, w_dtype, initial_state, final_state, dfinal, packed, tokens,
    steps, state_len, circular, slots, expect, params, outcome, message, duration_s, worker,
    created_at)
SELECT :new, case_id, suite, op, width, seqlen, dim, batch, layout, gap, activation, bias,
    x_dtype, w_dtype, initial_state, final_state, dfinal, packed, tokens, steps, state_len,
    circular, slots, expect, params, outcome, message, duration_s, worker, created_at
FROM cases WHERE run_id = :src
"""
_COPY_METRICS = """
INSERT INTO metrics (case_pk, run_id, x_dtype, output, e_abs, e_rel, e_norm, tau, scale,
    worst_index, fw_abs, fw_rel, fw_norm, limit_rel, limit_norm, passed)
SELECT nc.id, :new, m.x_dtype, m.output, m.e_abs * :jitter, m.e_rel * :jitter,
    m.e_norm * :jitter, m.tau, m.scale, m.worst_index, m.fw_abs, m.fw_rel, m.fw_norm,
    m.limit_rel, m.limit_norm, m.passed
FROM metrics m
JOIN cases oc ON oc.id = m.case_pk
JOIN cases nc ON nc.run_id = :new AND nc.case_id = oc.case_id
WHERE m.run_id = :src
"""
_COPY_RUN = """
INSERT INTO runs (kernel, kernel_commit, kernel_dirty, matrix, matrix_hash, device_kind,
    device_name, host, pid, versions, label, argv, options, geometry, started_at, finished_at,
    status, n_planned, n_passed, n_failed, n_skipped, n_crashed, n_timeout, n_error)
SELECT kernel, :commit, kernel_dirty, matrix, matrix_hash, device_kind, device_name, host, pid,
    versions, label, argv, options, geometry, :started, :started, status, n_planned, n_passed,
    n_failed, n_skipped, n_crashed, n_timeout, n_error
FROM runs WHERE id = :src
"""


def build_history_db(engine: Engine, metric_rows: int, cases_per_run: int) -> int:
    """Fill ``engine`` with runs until it holds ``metric_rows`` metric rows; returns runs."""
    src = write_run(engine, synthetic_results(cases_per_run), commit="0" * 40)
    with Session(engine) as session:
        per_run = session.scalar(select(func.count()).where(MetricRow.run_id == src))
    n_runs = -(-metric_rows // per_run)
    start = datetime.now(timezone.utc) - timedelta(days=n_runs)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE runs SET started_at = :t WHERE id = :id"), {"t": start, "id": src}
        )
        for k in range(1, n_runs):
            new = conn.execute(
                text(_COPY_RUN + " RETURNING id"),
                {"src": src, "commit": f"{k:040x}", "started": start + timedelta(days=k)},
            ).scalar_one()
            args = {"src": src, "new": new, "jitter": 1.0 + 0.05 * (k % 11)}
            conn.execute(text(_COPY_CASES), args)
            conn.execute(text(_COPY_METRICS), args)
    with engine.begin() as conn:  # (in AUTOCOMMIT, SQLite's ANALYZE was never stored)
        conn.execute(text("ANALYZE"))
    return n_runs


def _forget(engine: Engine, run_ids: list[int] | None) -> None:
    """Mark runs unsummarised (``None``: all), as a run in progress is."""
    stmt = update(Run).values(summarised_at=None)
    with engine.begin() as conn:
        conn.execute(stmt if run_ids is None else stmt.where(Run.id.in_(run_ids)))


def bench_history(url: str, name: str, metric_rows: int, cases_per_run: int) -> None:
    engine = open_database(url)
    start = time.perf_counter()
    n_runs = build_history_db(engine, metric_rows, cases_per_run)
    build_s = time.perf_counter() - start
    with Session(engine) as session:
        total = session.scalar(select(func.count()).select_from(MetricRow))
        newest = session.scalar(select(func.max(Run.id)))
    print(f"history on {name}: {total} metric rows in {n_runs} runs (built in {build_s:.0f} s)")

    def full() -> None:
        """`convmatrix history --dtype bf16`'s two questions, the counts from ``case_counts``
        (the command still asks ``reports.source.run_case_counts``: timed last)."""
        with Session(engine) as session:
            points = history(session, "bfloat16")
            case_counts(session, "bfloat16", sorted({p.run_id for p in points}))

    _forget(engine, None)
    _report("no summaries (live)", timed(full, repeat=1))
    start = time.perf_counter()
    with engine.begin() as conn:
        aggregate_pending(conn)
    fill_s = time.perf_counter() - start
    per_run_s = timed(lambda: _summarise(engine, newest), repeat=3)
    print(
        f"  summaries of {n_runs} runs filled in {fill_s:.1f} s; one run's "
        f"({total // n_runs} metric rows, what finish_run adds) {per_run_s * 1e3:.0f} ms"
    )
    since = datetime.now(timezone.utc) - timedelta(days=30)
    with Session(engine) as session:
        run_ids = list(session.scalars(select(Run.id)))
        cases: dict[str, Callable[[], object]] = {
            "dtype, every output": full,
            "history() alone": lambda: history(session, "bfloat16"),
            "case_counts() alone": lambda: case_counts(session, "bfloat16", run_ids),
            "dtype + output dx": lambda: history(session, "bfloat16", output="dx"),
            "dtype + kernel": lambda: history(session, "bfloat16", kernel="tiled"),
            "dtype, last 30 days": lambda: history(session, "bfloat16", since=since),
        }
        for label, fn in cases.items():
            _report(label, timed(fn))
    _forget(engine, [newest])
    _report("one run live", timed(full))
    with Session(engine) as session:  # reports.source.run_case_counts: a GROUP BY over cases
        old_counts = timed(lambda: run_case_counts(session, "bfloat16", run_ids))
        _report("reports' run_case_counts", old_counts)
    engine.dispose()


def _summarise(engine: Engine, run_id: int) -> None:
    with engine.begin() as conn:
        aggregate_runs(conn, [run_id])


def _report(label: str, t: float) -> None:
    print(
        f"  {label:<24} {t * 1e3:8.1f} ms: {t / HISTORY_TARGET_S:.2f} of the "
        f"{HISTORY_TARGET_S * 1e3:.0f} ms target"
    )


@contextmanager
def scratch_postgres(server_url: str) -> Iterator[str]:
    """A fresh database on the server of ``server_url`` (dropped afterwards), so the benchmark
    never touches tables someone else uses."""
    url = make_url(server_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    name = f"convmatrix_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg", metavar="URL", help="a PostgreSQL server (any database on it): a scratch "
        "database is created there and dropped afterwards",
    )  # fmt: skip
    parser.add_argument("--rows", type=int, default=1_000_000, help="metric rows (1,000,000)")
    parser.add_argument("--cases-per-run", type=int, default=2000)
    parser.add_argument("--skip-render", action="store_true")
    parser.add_argument("--skip-history", action="store_true")
    args = parser.parse_args()
    if not args.skip_render:
        bench_render()
    if not args.skip_history:
        with tempfile.TemporaryDirectory() as tmp:
            bench_history(f"sqlite:///{tmp}/history.db", "SQLite", args.rows, args.cases_per_run)
        if args.pg:
            with scratch_postgres(args.pg) as url:
                bench_history(url, "PostgreSQL", args.rows, args.cases_per_run)


if __name__ == "__main__":
    main()
