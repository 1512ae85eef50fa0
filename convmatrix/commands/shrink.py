"""``convmatrix shrink RUN CASE``: a stored failure shrunk to the simplest case that fails the
same way (``convmatrix.pipeline.shrink``, ``convmatrix.search.shrink``; docs/search.md).

Each candidate is a real case on the run's kernel, device and policy. Prints the path, the
boundary found per dimension ("passes at C=1024, fails at C=1025") and the shrunk case as an
``include:`` entry; writes it as a matrix file (``--out``), records it as a run of kind
``shrink`` and notes it on the case's open regressions. ``--format json`` prints
``{"case": {dimension: value, ...}, "runs": N, "path": [...], ...}``.

It shrinks the kernel the run tested: a checkout at another commit, or with local changes
the run did not have, is refused naming both commits (as ``confirm`` refuses), or with
``--checkout`` the shrink runs from a temporary git worktree at the run's commit.

Exit status: 0 shrunk, 2 usage errors (no such run or case, a case that passed or passes now,
an ``--out`` that cannot be written, the checkout elsewhere: nothing runs), 130 stopped by
SIGINT or SIGTERM (the smallest case so far written and recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from convmatrix.commands.arguments import RUN_HELP, add_db_argument, check_writable
from convmatrix.core.sanitise import terminal_safe

__all__ = ["add_arguments", "shrink_command"]


def shrink_command(args: argparse.Namespace) -> int:
    from convmatrix.db.database import Database
    from convmatrix.pipeline.shrink import shrink_in_worktree, shrink_stored

    out = check_writable(args.out or Path(f"shrunk-{args.case}.yaml"), "--out")
    with Database(args.db, existing=True) as database:
        if args.checkout:
            code = shrink_in_worktree(database, args.run, args.case, _passed_on(args, out))
            if code is not None:
                return code
        shrunk = shrink_stored(
            database, args.run, args.case, max_runs=args.max_runs, out=out,
            isolate=not args.in_process, record=not args.no_record,
        )  # fmt: skip
    if args.format == "json":
        print(json.dumps(shrunk.to_json(), indent=2, default=str))
    else:
        print(terminal_safe("\n".join(shrunk.lines(path=True))))
        print(terminal_safe(shrunk.result.include_snippet()))
    if not shrunk.result.interrupted:
        return 0
    print("convmatrix shrink: interrupted: the smallest case so far is kept", file=sys.stderr)
    return 130


def _passed_on(args: argparse.Namespace, out: Path) -> list[str]:
    """The options of this shrink for the one run in the worktree (paths made absolute)."""
    options = ["--max-runs", str(args.max_runs), "--out", str(out.absolute()),
               "--format", args.format]  # fmt: skip
    options += ["--no-record"] if args.no_record else []
    return options + (["--in-process"] if args.in_process else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Shrink a failing case of a recorded run to the simplest case that fails the same way "
        "(sizes down to their boundaries, features off), each candidate run on the run's "
        "kernel and device; print the path and the boundaries, write the case as a matrix."
    )
    parser.add_argument("run", metavar="RUN", help=RUN_HELP)
    parser.add_argument("case", metavar="CASE", help="the case: id, id prefix or pytest id")
    parser.add_argument(
        "--max-runs", type=int, default=60, metavar="N",
        help="case runs at most, the failure's reproduction included (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, metavar="FILE",
        help="the shrunk case's matrix file (default: shrunk-CASE.yaml)",
    )  # fmt: skip
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--no-record", action="store_true",
        help="record no run of kind shrink and touch no regression",
    )  # fmt: skip
    parser.add_argument(
        "--in-process", action="store_true",
        help="run candidates in this process (default: an isolated child, as Ray does)",
    )  # fmt: skip
    parser.add_argument(
        "--checkout", action="store_true",
        help="when the kernel's checkout is not at the commit the run tested, shrink from a "
        "temporary git worktree at that commit (default: refuse, naming both commits)",
    )  # fmt: skip
    add_db_argument(parser)
    parser.set_defaults(handler=shrink_command)
