"""Arguments several commands share, each defined once: the database URL, a run's name, and
the check of a file a command will write."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from convmatrix.core.errors import UsageError

__all__ = ["RUN_HELP", "add_db_argument", "check_writable"]

RUN_HELP = "a run id, 'latest', a label or a kernel commit (prefix)"


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    """``--db URL``: the results database (SQLite file or PostgreSQL, any SQLAlchemy URL)."""
    parser.add_argument(
        "--db",
        metavar="URL",
        help="database URL (default: $CONVMATRIX_DB, else sqlite:///convmatrix.db)",
    )


def check_writable(path: Path, flag: str) -> Path:
    """``path``, once it is known a file can be written there: checked before any work, so a
    typo costs no search and ends in a usage error naming ``flag`` instead of a traceback
    after it. Its folder may not exist yet (it is made on writing); the nearest existing one
    must take a file (tried with a temporary one: permissions alone say nothing to root)."""
    where = path.absolute()
    if where.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    folder = next(p for p in where.parents if p.exists())
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: {folder} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {folder} ({exc.strerror})") from None
    return path
