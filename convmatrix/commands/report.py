"""``convmatrix report RUN [--out DIR]``: the run report, HTML and JSON, for a person and CI.

Exit status 0 when every case of the run passed (skips allowed), 1 when any failed, crashed,
timed out or errored, or when the run is incomplete (interrupted, still running, or short of
the cases it planned), so CI can gate on the report as on the run itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sqlalchemy.orm import Session

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.reports.render import write_report
from convmatrix.reports.run_view import RunView, build_run_view
from convmatrix.reports.source import load_run, open_for_reading
from convmatrix.reports.viewmodel import shard_lines

__all__ = ["add_arguments", "report_command", "write_run_report"]


def write_run_report(spec: str, out_dir: Path, db: str | None = None) -> tuple[RunView, Path]:
    """Write ``run-<id>.html`` and ``run-<id>.json`` for the run ``spec`` names into ``out_dir``;
    returns the view-model and the HTML path. (``convmatrix run --report`` may call this.)"""
    engine, url = open_for_reading(db)
    try:
        with Session(engine) as session:
            loaded = load_run(session, spec, url)
    finally:
        engine.dispose()
    view = build_run_view(loaded.header, loaded.results)
    html, _ = write_report(view, Path(out_dir) / f"run-{loaded.info.id}.html")
    return view, html


def report_command(spec: str, out_dir: Path, db: str | None = None) -> int:
    view, html = write_run_report(spec, out_dir, db)
    run = view.run
    counts = ", ".join(f"{n} {o}" for o, n in run.counts.items() if n)
    status = "" if run.status == "finished" else f" [{run.status}]"
    print(f"{run.verdict} {run.title}{status}: {counts or 'no results'}")
    for line in shard_lines(run):
        print(f"  {line}")
    for failure in view.failures[:10]:
        print(f"  {failure.outcome:<8} {failure.name}")
    if len(view.failures) > 10:
        print(f"  ... and {len(view.failures) - 10} more")
    print(f"report: {html}")
    return 0 if run.verdict == "PASSED" else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write run-<id>.html (self-contained) and run-<id>.json for one run. "
        "Exit 0 when every case passed, 1 when any failed or the run is incomplete."
    )
    parser.add_argument("run", metavar="RUN", help=RUN_HELP)
    parser.add_argument(
        "--out", type=Path, default=Path("reports"), metavar="DIR",
        help="directory for the report (default: reports)",
    )  # fmt: skip
    add_db_argument(parser)
    parser.set_defaults(handler=lambda args: report_command(args.run, args.out, args.db))
