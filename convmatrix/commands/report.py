"""``convmatrix report RUN [--out DIR]``: the run report, HTML and JSON, for a person and CI.

Exit status 0 when every case of the run passed (skips allowed), 1 when any failed, crashed,
timed out or errored, or when the run is incomplete (interrupted, still running, or short of
the cases it planned), 4 when it judged (almost) nothing (``NOTHING JUDGED``: fewer than the
default ``--min-judged`` share of its cases got a verdict), so CI can gate on the report as on
the run itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.core.errors import NotJudgedError
from convmatrix.core.sanitise import terminal_safe
from convmatrix.db.database import Database
from convmatrix.reports.publish import write_run_report
from convmatrix.reports.viewmodel import shard_lines

__all__ = ["add_arguments", "report_command"]


def report_command(spec: str, out_dir: Path, db: str | None = None) -> int:
    with Database(db, existing=True) as database, database.reading() as session:
        report = write_run_report(session, spec, database.url, out_dir)
    run = report.run
    counts = ", ".join(f"{n} {o}" for o, n in run.counts.items() if n)
    status = "" if run.status == "finished" else f" [{run.status}]"
    print(f"{run.verdict} {run.title}{status}: {counts or 'no results'}")
    for line in shard_lines(run):
        print(f"  {terminal_safe(line)}")
    for outcome, name in report.failures:
        print(f"  {outcome:<8} {terminal_safe(name)}")
    if report.n_failures > len(report.failures):
        print(f"  ... and {report.n_failures - len(report.failures)} more")
    print(f"report: {report.html}")
    return {"PASSED": 0, "NOTHING JUDGED": NotJudgedError.exit_code}.get(run.verdict, 1)


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
