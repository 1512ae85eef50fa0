"""``convmatrix regressions``: list, scan and update the regressions of the recorded runs.

``regressions`` lists them (newest first; ``--state``, ``--kernel``, ``--case`` filter),
``regressions scan RUN`` looks for the regressions of a run recorded without ``convmatrix run``
(an import), ``regressions set ID STATE --by WHO [--note TEXT]`` moves one along its lifecycle
(docs/regressions.md) and ``regressions show ID`` prints its history.
"""

from __future__ import annotations

import argparse
import json
import os

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.reports.viewmodel import to_jsonable
from convmatrix.service.regressions import (
    TRANSITIONS,
    list_regressions,
    regression_events,
    scan_run,
    set_state,
)

__all__ = ["add_arguments", "regressions_command"]


def _list(args: argparse.Namespace) -> int:
    states = [s.strip() for v in args.state for s in v.split(",") if s.strip()]
    with Database(args.db, existing=True) as database, database.reading() as session:
        found = list_regressions(session, states=states, kernel=args.kernel, case_id=args.case)
    if args.format == "json":
        print(json.dumps(to_jsonable(found), indent=1))
    else:
        for reg in found:
            print(reg.line())
        if not found:
            print("no regressions")
    return 0


def _scan(args: argparse.Namespace) -> int:
    with Database(args.db, existing=True) as database, database.writing() as session:
        scan = scan_run(session, args.run)
    print(
        f"run {scan.run_id} against {scan.baseline_id or 'no earlier run'}: "
        f"{len(scan.new)} new, {len(scan.kept)} known, {len(scan.fixed)} fixed"
    )
    for reg in scan.new:
        print("  NEW   " + reg.line())
    for reg in scan.fixed:
        print("  FIXED " + reg.line())
    return 0


def _set(args: argparse.Namespace) -> int:
    by = args.by or os.environ.get("USER") or "unknown"
    with Database(args.db, existing=True) as database, database.writing() as session:
        reg = set_state(session, args.id, args.state, by=by, note=args.note)
    print(reg.line())
    return 0


def _show(args: argparse.Namespace) -> int:
    with Database(args.db, existing=True) as database, database.reading() as session:
        found = list_regressions(session, ids=[args.id])
        if not found:
            raise UsageError(f"regression {args.id}: no such regression")
        events = regression_events(session, args.id)
    print(found[0].line())
    if found[0].detail:
        print(f"  {found[0].detail}")
    for e in events:
        note = f": {e.note}" if e.note else ""
        run = f" (run {e.run_id})" if e.run_id else ""
        print(f"  {e.at} {e.by}: {e.from_state or '-'} -> {e.to_state}{run}{note}")
    return 0


def regressions_command(args: argparse.Namespace) -> int:
    return {"list": _list, "scan": _scan, "set": _set, "show": _show}[args.action or "list"](args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The regressions found in recorded runs: list them (default), scan a run, "
        "set one's state, show one's history."
    )
    add_db_argument(parser)
    parser.add_argument("--state", action="append", default=[], help="only these states")
    parser.add_argument("--kernel", help="only this kernel")
    parser.add_argument("--case", metavar="ID", help="only this case id (or prefix)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    scan = actions.add_parser("scan", help="look for the regressions of one run")
    scan.add_argument("run", metavar="RUN", help=RUN_HELP)
    change = actions.add_parser("set", help="move a regression to another state")
    change.add_argument("id", type=int, metavar="ID")
    change.add_argument("state", choices=tuple(TRANSITIONS), metavar="STATE",
                        help=f"one of {', '.join(TRANSITIONS)}")  # fmt: skip
    change.add_argument("--by", help="who changes it (default: $USER)")
    change.add_argument("--note", help="why")
    show = actions.add_parser("show", help="one regression and its history")
    show.add_argument("id", type=int, metavar="ID")
    for sub in (scan, change, show):  # --db before or after the action, either way
        sub.add_argument("--db", metavar="URL", default=argparse.SUPPRESS, help="database URL")
    parser.set_defaults(handler=regressions_command)
