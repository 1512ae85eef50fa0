"""``convmatrix export RUN... [--out FILE]``: runs as JSON lines (``service.transfer``), for a
device host that cannot reach the shared database, or to move runs from SQLite to PostgreSQL;
``convmatrix import FILE`` stores them on the other side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.queries import list_runs, resolve_run
from convmatrix.service.transfer import export_lines

__all__ = ["add_arguments", "export_command"]


def export_command(args: argparse.Namespace) -> int:
    if not args.runs and not args.all:
        raise UsageError("give the runs to export (RUN ...) or --all")
    with Database(args.db, existing=True) as database, database.session() as session:
        if args.all:
            runs = list(reversed(list_runs(session, limit=1_000_000, kinds=None)))  # oldest first
        else:
            runs = [resolve_run(session, spec) for spec in args.runs]
        out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
        try:
            n = 0
            for line in export_lines(session, runs):
                out.write(line + "\n")
                n += 1
        finally:
            if args.out:
                out.close()
    print(f"export: {len(runs)} runs, {n - len(runs)} results", file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Write runs and all their results as JSON lines (for convmatrix import)."
    parser.add_argument("runs", nargs="*", metavar="RUN", help=RUN_HELP)
    parser.add_argument("--all", action="store_true", help="every run, oldest first")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write here (default stdout)")
    add_db_argument(parser)
    parser.set_defaults(handler=export_command)
