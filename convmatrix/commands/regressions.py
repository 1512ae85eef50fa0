"""``convmatrix regressions``: the alerts of the recorded runs, their regressions, triage.

``regressions`` lists the alerts (newest first; ``--state``, ``--kernel``, ``--case`` filter;
``--format json``: a list of alerts, each with its ``regressions``), ``regressions show N``
prints alert N with its explanation and regressions (``show rN``: regression N and its
events), ``regressions scan RUN`` scans a run recorded without ``convmatrix run`` (an import),
and ``regressions set ID STATE [--note WHY] [--assign WHO] [--bug LINK]`` triages one
regression (``aN`` for every regression of alert N) along its lifecycle (docs/regressions.md).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.core.sanitise import terminal_safe
from convmatrix.db.database import Database
from convmatrix.db.queries import parse_id
from convmatrix.reports.viewmodel import to_jsonable
from convmatrix.service.alerts import get_alert, list_alerts
from convmatrix.service.regressions import (
    TRANSITIONS,
    list_regressions,
    regression_events,
    triage,
)

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader

__all__ = ["add_arguments", "regressions_command"]


def _say(text: str) -> None:
    """Print kernel text (details, notes, messages) with escape sequences shown, not obeyed."""
    print(terminal_safe(text))


def _list(args: argparse.Namespace) -> int:
    states = [s.strip() for v in args.state for s in v.split(",") if s.strip()]
    unknown = [s for s in states if s not in TRANSITIONS]
    if unknown:
        raise UsageError(f"--state {unknown[0]!r}: choose from {', '.join(TRANSITIONS)}")
    with Database(args.db, existing=True) as database, database.reading() as session:
        alerts = list_alerts(session, states=states, kernel=args.kernel)
    if args.case:
        alerts = [a for a in alerts if any(r.case_id.startswith(args.case) for r in a.regressions)]
    if args.format == "json":
        print(json.dumps(to_jsonable(alerts), indent=1))
        return 0
    for alert in alerts:
        _say("\n".join(alert.lines()))
    if not alerts:
        _say("no alerts")
    return 0


def _scan(args: argparse.Namespace) -> int:
    from convmatrix.service.scan import scan_run  # the comparison: only when scanning

    with Database(args.db, existing=True) as database, database.writing() as session:
        scan = scan_run(session, args.run)
    if scan.skipped:
        _say(f"run {scan.run_id}: not scanned ({scan.skipped})")
        return 0
    _say(
        f"run {scan.run_id} against {scan.baseline_id or 'no earlier run'}: "
        f"{len(scan.new)} new, {len(scan.reopened)} reopened, {len(scan.kept)} known, "
        f"{len(scan.fixed)} fixed" + (f" (alert {scan.alert_id})" if scan.alert_id else "")
    )
    for label, regs in (("NEW", scan.new), ("AGAIN", scan.reopened), ("FIXED", scan.fixed)):
        for reg in regs:
            _say(f"  {label:<6}" + reg.line())
    for line in scan.infrastructure_lines():
        _say(line)
    return 0


def _id(text: str, what: str) -> int:
    """The row id ``text`` names (``db.queries.parse_id``: ASCII digits within the id
    column); a number no row can have is no such row (exit 2), never a database error."""
    found = parse_id(text)
    if found is None:
        raise UsageError(f"{what} {text[:40]}: no such {what}")
    return found


def _spelled(target: str, prefix: str) -> bool:
    return target.startswith(prefix) and target[len(prefix) :].isdigit()


def _regression_ids(session: Reader, target: str) -> list[int]:
    if _spelled(target, "a"):
        return [r.id for r in get_alert(session, _id(target[1:], "alert")).regressions]
    if _spelled(target, ""):
        return [_id(target, "regression")]
    raise UsageError(f"ID {target!r}: a regression id (12) or an alert (a3)")


def _set(args: argparse.Namespace) -> int:
    by = args.by or os.environ.get("USER") or "unknown"
    with Database(args.db, existing=True) as database, database.writing() as session:
        changed = [
            triage(session, reg_id, by=by, state=args.state, note=args.note,
                   assignee=args.assign, bug=args.bug)
            for reg_id in _regression_ids(session, args.id)
        ]  # fmt: skip
    for reg in changed:
        _say(reg.line())
    return 0


def _show(args: argparse.Namespace) -> int:
    target = args.id
    with Database(args.db, existing=True) as database, database.reading() as session:
        if _spelled(target, ""):
            _say("\n".join(get_alert(session, _id(target, "alert")).lines()))
            return 0
        if not _spelled(target, "r"):
            raise UsageError(f"ID {target!r}: an alert id (3) or a regression (r12)")
        found = list_regressions(session, ids=[_id(target[1:], "regression")])
        if not found:
            raise UsageError(f"regression {target[1:]}: no such regression")
        events = regression_events(session, found[0].id)
    reg = found[0]
    _say(reg.line() + (f"\n      alert {reg.alert_id}" if reg.alert_id else ""))
    for entry in reg.outputs:
        _say(f"      {json.dumps(entry)}")
    for prop in reg.properties:
        _say(f"      property {prop['name']}: {prop['detail']}")
    for e in events:
        note = f": {e.note}" if e.note else ""
        run = f" (run {e.run_id})" if e.run_id else ""
        _say(f"  {e.at} {e.by}: {e.from_state or '-'} -> {e.to_state}{run}{note}")
    return 0


def regressions_command(args: argparse.Namespace) -> int:
    return {"list": _list, "scan": _scan, "set": _set, "show": _show}[args.action or "list"](args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The alerts found in recorded runs, each with its regressions (one per case): list "
        "them (default), show one, scan a run, triage a regression."
    )
    add_db_argument(parser)
    parser.add_argument("--state", action="append", default=[],
                        help="only alerts holding a regression in these states")  # fmt: skip
    parser.add_argument("--kernel", help="only this kernel")
    parser.add_argument("--case", metavar="ID", help="only alerts holding this case (id prefix)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    scan = actions.add_parser("scan", help="look for the regressions of one run")
    scan.add_argument("run", metavar="RUN", help=RUN_HELP)
    change = actions.add_parser("set", help="triage a regression (or every one of an alert)")
    change.add_argument("id", metavar="ID", help="a regression id (12), or an alert (a3)")
    change.add_argument("state", nargs="?", choices=tuple(TRANSITIONS), metavar="STATE",
                        help=f"one of {', '.join(TRANSITIONS)}")  # fmt: skip
    change.add_argument("--by", help="who changes it (default: $USER)")
    change.add_argument("--note", help="why (ignored and invalid need one)")
    change.add_argument("--assign", metavar="WHO", help="assign it ('' unassigns)")
    change.add_argument("--bug", metavar="LINK", help="link a bug ('' removes the link)")
    show = actions.add_parser("show", help="one alert (3) or one regression and its events (r12)")
    show.add_argument("id", metavar="ID")
    for sub in (scan, change, show):  # --db before or after the action, either way
        sub.add_argument("--db", metavar="URL", default=argparse.SUPPRESS, help="database URL")
    parser.set_defaults(handler=regressions_command)
