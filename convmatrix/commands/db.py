"""``convmatrix db upgrade|current [--db URL]``: the results database's schema.

Every command that opens the database upgrades it on first use; ``db upgrade`` does it
explicitly (e.g. before a fleet of runners starts), ``db current`` says where it stands.
"""

from __future__ import annotations

import argparse

from convmatrix.commands.arguments import add_db_argument
from convmatrix.db import current_revision, ensure_schema, head_revision, make_engine, redact_url

__all__ = ["add_arguments", "current_command", "upgrade_command"]


def upgrade_command(url: str | None = None) -> int:
    engine = make_engine(url)
    try:
        before = current_revision(engine)
        ensure_schema(engine)  # refuses a database newer than this convmatrix
        after = current_revision(engine)
    finally:
        engine.dispose()
    where = redact_url(engine.url)
    if before == after:
        print(f"{where}: schema already at revision {after} (newest)")
    else:
        print(f"{where}: schema upgraded from {before or 'empty'} to {after}")
    return 0


def current_command(url: str | None = None) -> int:
    engine = make_engine(url)
    try:
        current, head = current_revision(engine), head_revision()
    finally:
        engine.dispose()
    state = "newest" if current == head else f"newest is {head}; run `convmatrix db upgrade`"
    print(f"{redact_url(engine.url)}: schema revision {current or 'none (empty)'} ({state})")
    return 0


_ACTIONS = {"upgrade": upgrade_command, "current": current_command}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("upgrade", "apply the shipped migrations (also done on first use)"),
        ("current", "show the schema revision of the database"),
    ):
        action = actions.add_parser(name, help=help_text)
        add_db_argument(action)
    parser.set_defaults(handler=lambda args: _ACTIONS[args.action](args.db))
