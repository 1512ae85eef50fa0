"""``convmatrix import FILE...``: store the runs of ``convmatrix export`` files (``-`` for
stdin) in the database, then scan each for regressions as ``convmatrix run`` would."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.service.scan import scan_run
from convmatrix.service.transfer import import_lines

__all__ = ["add_arguments", "import_command"]


def import_command(args: argparse.Namespace) -> int:
    for name in args.files:
        if name != "-" and not Path(name).is_file():
            raise UsageError(f"import: no file {name}")
    imported: list[int] = []
    with Database(args.db) as database:  # created when it does not exist yet
        for name in args.files:
            if name == "-":
                imported += import_lines(database.engine, sys.stdin, "<stdin>")
            else:
                with open(name, encoding="utf-8") as stream:
                    imported += import_lines(database.engine, stream, name)
        print(f"import: runs {', '.join(map(str, imported)) or 'none'}")
        for run_id in [] if args.no_scan else imported:
            with database.writing() as session:
                scan = scan_run(session, run_id)
            print(f"  run {run_id}: {len(scan.new)} new regressions, {len(scan.fixed)} fixed")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Store runs written by convmatrix export, then scan them."
    parser.add_argument("files", nargs="+", metavar="FILE", help="export files ('-': stdin)")
    parser.add_argument("--no-scan", action="store_true", help="do not look for regressions")
    add_db_argument(parser)
    parser.set_defaults(handler=import_command)
