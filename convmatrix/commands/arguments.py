"""Arguments several commands share, each defined once: the database URL and a run's name."""

from __future__ import annotations

import argparse

__all__ = ["RUN_HELP", "add_db_argument"]

RUN_HELP = "a run id, 'latest', a label or a kernel commit (prefix)"


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    """``--db URL``: the results database (SQLite file or PostgreSQL, any SQLAlchemy URL)."""
    parser.add_argument(
        "--db",
        metavar="URL",
        help="database URL (default: $CONVMATRIX_DB, else sqlite:///convmatrix.db)",
    )
