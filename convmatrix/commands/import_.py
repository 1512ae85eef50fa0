"""``convmatrix import FILE...``: store the runs of ``convmatrix export`` files (``-`` for
stdin; gzip-compressed files too) in the database, then scan each for regressions as
``convmatrix run`` would. A run's journal (``convmatrix-journal-<uid>.jsonl``: the results a
database refused) is an export too: its results go into the run it was written for. A run
already present gains the cases it lacks (a newer export, another shard's) and is scanned
again; importing an export twice changes nothing (``service.transfer``).

Every file is validated whole before the database is opened (types, outcomes, numbers the
columns hold, dates no later than tomorrow, UTF-8 text, case ids their parameters give, no
negative duration, no case twice in a run): a malformed file is one line naming
file:line and exit 2, and the database is as it was, byte for byte. Each file is then
written in one transaction. Memory: one line at a time (stdin is spooled to a temporary
file past 64 MiB, since it is read twice).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.service.scan import scan_run
from convmatrix.service.transfer import check_lines, import_lines

__all__ = ["add_arguments", "import_command"]

_GZIP = b"\x1f\x8b"
_SPOOL = 64 << 20  # bytes of stdin kept in memory before it goes to a temporary file


@contextlib.contextmanager
def _text(name: str, spool: IO[bytes] | None) -> Iterator[IO[str]]:
    """The file (or the spooled stdin) as seekable UTF-8 text, gunzipped when it is gzip."""
    raw: IO[bytes] = spool if spool is not None else open(name, "rb")  # noqa: SIM115
    try:
        raw.seek(0)
        compressed = raw.read(2) == _GZIP
        raw.seek(0)
        binary: IO[bytes] = gzip.GzipFile(fileobj=raw) if compressed else raw
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="strict", newline=None)
        try:
            yield text
        finally:
            text.detach()
    except (OSError, EOFError) as err:  # a truncated or corrupt gzip stream
        raise UsageError(f"{name}: cannot read it ({err})") from None
    finally:
        if spool is None:
            raw.close()


def import_command(args: argparse.Namespace) -> int:
    for name in args.files:
        if name != "-" and not Path(name).is_file():
            raise UsageError(f"import: no file {name}")
    spool = None
    if "-" in args.files:
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL)  # noqa: SIM115 - closed below
        shutil.copyfileobj(sys.stdin.buffer, spool)
    try:
        names = [("<stdin>" if n == "-" else n, spool if n == "-" else None) for n in args.files]
        for name, source in names:  # every file valid before the database is touched
            with _text(name, source) as stream:
                check_lines(stream, name)
        imported: list[int] = []
        with Database(args.db) as database:  # created when it does not exist yet
            for name, source in names:
                with _text(name, source) as stream:
                    imported += import_lines(database.engine, stream, name)
            print(f"import: runs {', '.join(map(str, imported)) or 'none'}")
            for run_id in [] if args.no_scan else imported:
                with database.writing() as session:
                    scan = scan_run(session, run_id)
                print(f"  run {run_id}: {len(scan.new)} new regressions, {len(scan.fixed)} fixed")
    finally:
        if spool is not None:
            spool.close()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Store runs written by convmatrix export, then scan them."
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="export or journal files, gzip too ('-': stdin)"
    )
    parser.add_argument("--no-scan", action="store_true", help="do not look for regressions")
    add_db_argument(parser)
    parser.set_defaults(handler=import_command)
