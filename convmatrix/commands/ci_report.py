"""``convmatrix ci-report RUN [--junit FILE] [--summary FILE]``: the CI outputs of a whole run.

A sharded run (``convmatrix run --shard I/N --run-label L``) is written by N jobs; each
shard's ``--junit`` and summary hold its own cases only. This command, run once after every
shard (the CI's report job), writes the whole run's JUnit XML and job summary from the
database (``service.ci_report``) and names any shard that never reported. It works on any
recorded run, sharded or not.

Exit status: 0 every case passed (skips allowed), 1 a case failed or the run is incomplete
(a shard missing, a run stopped early; with ``--fail-on new-regressions``: only a new
regression or an incomplete run), 4 nothing judged (fewer than ``--min-judged`` of the run's
planned cases got a verdict), 2 usage, 3 the database failed.
"""

from __future__ import annotations

import argparse

from convmatrix.commands.arguments import RUN_HELP
from convmatrix.core.sanitise import terminal_safe
from convmatrix.db.database import Database
from convmatrix.runners.options import (
    add_cli_options,
    check_share,
    parse_fail_on,
    summary_path,
)
from convmatrix.service.ci_report import CiOutputs, ci_report

__all__ = ["add_arguments", "ci_report_command"]


def ci_report_command(args: argparse.Namespace) -> int:
    check_share(args.min_judged)
    outputs = CiOutputs(
        junit=args.junit, summary=summary_path(args.summary), base_url=args.base_url,
        min_judged=args.min_judged, fail_on=tuple(parse_fail_on(args.fail_on)),
    )  # fmt: skip
    with Database(args.db, existing=True) as database:
        written = ci_report(database, args.run, outputs)
    for line in written.account.lines():
        print(terminal_safe(line))
    for path in (written.junit, written.summary):
        if path is not None:
            print(f"wrote {path}")
    return written.exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write the JUnit XML and CI job summary of a whole run (every shard's cases), "
        "naming the shards that never reported. Exit 0 passed, 1 failures or shards "
        "missing, 4 nothing judged."
    )
    parser.add_argument("run", metavar="RUN", help=RUN_HELP)
    add_cli_options(parser, only=("db", "junit", "summary", "base_url", "fail_on", "min_judged"))
    parser.set_defaults(handler=ci_report_command)
