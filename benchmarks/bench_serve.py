"""Served pages and ``convmatrix report`` of a 10,000-case run: stored pages against a build.

    python benchmarks/bench_serve.py [--cases 10000] [--requests 20] [--pg URL]

One finished run of ``--cases`` synthetic results (the report benchmarks' seeded bug, every
tenth case timed) is written through the real writer into a fresh SQLite file (and, with
``--pg`` or ``CONVMATRIX_TEST_PG_URL``, a fresh PostgreSQL database), then served by the real
``convmatrix serve`` in a subprocess and asked over HTTP, as a browser would:

- the run page's first view (built from the results, then stored), then its p50 and p95 over
  ``--requests`` views; its JSON; one case's page; the runs index;
- eight clients at once, each asking for the run page, its JSON, a case page and the index
  in turn: p50 and p95 per page;
- ``convmatrix report`` as a person types it (a fresh process), first and again.

Side by side, in the same process, the old way: the view-model and HTML built from the results
on every request (``load_run`` + ``build_run_view`` + ``render_html``). Targets (issue 26): run
page p50 under 200 ms after its first view, a case page under 50 ms, p95 under 1 s with eight
clients, ``convmatrix report`` under 1 s whole.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from db_fixtures import fresh_postgres_database  # tests' helpers
from reports_support import synthetic_results, tile_plus_one_channel_last, write_run
from test_serve import running_server

from convmatrix.db import open_database
from convmatrix.reports.render import content_policy, render_html
from convmatrix.reports.run_view import build_run_view
from convmatrix.reports.source import load_run
from convmatrix.service.pages import run_context
from convmatrix.service.regressions import TRANSITIONS

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"run page p50": 0.200, "case page p50": 0.050, "p95, 8 clients": 1.0, "report": 1.0}


def _get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        response.read()
    return time.perf_counter() - start


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _line(name: str, values: list[float]) -> None:
    p50, p95 = statistics.median(values), _pct(values, 0.95)
    print(f"  {name:<34} p50 {p50 * 1e3:8.1f} ms   p95 {p95 * 1e3:8.1f} ms   (n={len(values)})")


def _report(url: str, run: int, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "convmatrix", "report", str(run), "--db", url, "--out", str(out)],
        cwd=ROOT, capture_output=True, check=False,
    )  # fmt: skip
    return time.perf_counter() - start


def fresh_build(url: str, run: int) -> float:
    """The old way, once: the run's view-model and HTML from its results (in process)."""
    engine = open_database(url)
    try:
        start = time.perf_counter()
        with Session(engine) as session:
            loaded = load_run(session, str(run), url)
            extra = run_context(session, loaded.info)
        view = build_run_view(loaded.header, loaded.results)
        render_html(view, served=True, request_path=f"/runs/{run}", csp=content_policy(),
                    writable=False, transitions=TRANSITIONS, **extra)  # fmt: skip
        return time.perf_counter() - start
    finally:
        engine.dispose()


def bench(name: str, url: str, n_cases: int, requests: int) -> None:
    results = synthetic_results(n_cases, bug=tile_plus_one_channel_last, timed_every=10)
    engine = open_database(url)
    run = write_run(engine, results)
    engine.dispose()
    case_id = results[0].case.id
    print(f"{name}: a run of {len(results)} cases")
    build = [fresh_build(url, run) for _ in range(3)]
    with tempfile.TemporaryDirectory() as tmp:
        report_first = _report(url, run, Path(tmp) / "a")  # builds and stores the report
        report_again = [_report(url, run, Path(tmp) / f"r{i}") for i in range(5)]
    with running_server(url) as base:
        pages = {
            "run page": f"{base}/runs/{run}",
            "run JSON": f"{base}/api/runs/{run}",
            "case page": f"{base}/cases/{case_id}",
            "runs index": f"{base}/",
        }
        first = _get(pages["run page"])
        alone = {page: [_get(address) for _ in range(requests)] for page, address in pages.items()}
        crowd: dict[str, list[float]] = {page: [] for page in pages}

        def client(_: int) -> list[tuple[str, float]]:
            return [(p, _get(a)) for _ in range(requests // 4 or 1) for p, a in pages.items()]

        with ThreadPoolExecutor(8) as pool:
            for answers in pool.map(client, range(8)):
                for page, seconds in answers:
                    crowd[page].append(seconds)
    print(f"  old way: build from the results     {statistics.median(build) * 1e3:8.1f} ms "
          "(view-model + served HTML, every request)")  # fmt: skip
    print(f"  run page, first view                {first * 1e3:8.1f} ms (builds and stores)")
    for page, values in alone.items():
        _line(page + ", one client", values)
    for page, values in crowd.items():
        _line(page + ", 8 clients", values)
    again = statistics.median(report_again)
    print(f"  convmatrix report, first            {report_first * 1e3:8.1f} ms")
    print(f"  convmatrix report, stored           {again * 1e3:8.1f} ms (median of 5)")
    run_p50 = statistics.median(alone["run page"])
    worst95 = max(_pct(v, 0.95) for v in crowd.values())
    figures = {
        "run page p50": run_p50,
        "case page p50": statistics.median(alone["case page"]),
        "p95, 8 clients": worst95,
        "report": again,
    }
    print(f"  old build / stored run page: {statistics.median(build) / run_p50:.0f}x")
    for what, seconds in figures.items():
        verdict = "ok" if seconds < TARGETS[what] else "OVER TARGET"
        print(f"  {what:<16} {seconds * 1e3:8.1f} ms, target {TARGETS[what] * 1e3:.0f} ms: "
              f"{verdict}")  # fmt: skip


@contextmanager
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        yield f"sqlite:///{tmp}/serve.db"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--pg", default=os.environ.get("CONVMATRIX_TEST_PG_URL"))
    args = parser.parse_args()
    backends: list[tuple[str, Callable[[], AbstractContextManager[str]]]] = [("SQLite", sqlite_url)]
    if args.pg:
        backends.append(("PostgreSQL", lambda: fresh_postgres_database(args.pg)))
    for name, database in backends:
        with database() as url:
            bench(name, url, args.cases, args.requests)


if __name__ == "__main__":
    main()
