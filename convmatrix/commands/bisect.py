"""``convmatrix bisect --good SHA --bad SHA --case ID [--build CMD] [--repo PATH]``: the kernel
commit that broke a case (``service.bisect``: ``git bisect run`` with a one-case run per step,
each recorded as a run labelled ``bisect:<sha>``).

The kernel and matrix are those of ``--run RUN`` (a run that failed the case, e.g. the
regression's first bad run), or ``--kernel`` and ``--matrix``; the kernel is imported from the
checkout under test (``--repo`` is put first on ``PYTHONPATH``). Exit 0 when a first bad
commit was found, 1 when git bisect could not tell.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.db.database import Database
from convmatrix.db.engine import absolute_url, default_url
from convmatrix.reports.viewmodel import run_header
from convmatrix.service.bisect import BisectRequest, bisect

__all__ = ["add_arguments", "bisect_command"]


def bisect_command(args: argparse.Namespace) -> int:
    kernel, matrix = args.kernel, args.matrix
    db = absolute_url(args.db or default_url())
    if args.run is not None:
        from convmatrix.db.queries import resolve_run

        with Database(db, existing=True) as database, database.reading() as session:
            header = run_header(resolve_run(session, args.run), db)
        kernel = kernel or header.kernel_spec or header.kernel
        matrix = matrix or header.matrix_source or header.matrix
    if not kernel or not matrix:
        raise UsageError("give --kernel and --matrix, or --run RUN to take them from a run")
    if Path(matrix).is_file():  # each step runs inside the repository
        matrix = str(Path(matrix).resolve())
    request = BisectRequest(
        repo=args.repo, good=args.good, bad=args.bad, case_id=args.case, matrix=str(matrix),
        kernel=kernel, db=db, build=args.build, device=args.device,
    )  # fmt: skip
    result = bisect(request)
    for step in result.steps:
        verdict = {0: "good", 1: "bad"}.get(step.exit_code, "skipped")
        print(
            f"  {step.commit[:12]} {verdict}" + (" (build failed)" if step.stage == "build" else "")
        )
    if result.first_bad is None:
        print("bisect: git bisect could not tell the first bad commit")
        print(result.log.strip().splitlines()[-1] if result.log.strip() else "")
        return 1
    print(f"bisect: first bad commit {result.first_bad} (steps recorded as runs 'bisect:<sha>')")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Find the commit of the kernel's repository that broke one case: git bisect run with a "
        "one-case convmatrix run per step (exit 125, skipped, when --build fails)."
    )
    parser.add_argument("--good", required=True, metavar="SHA", help="a commit where it passed")
    parser.add_argument("--bad", required=True, metavar="SHA", help="a commit where it fails")
    parser.add_argument("--case", required=True, metavar="ID", help="the case id")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the kernel's repository")
    parser.add_argument("--build", metavar="CMD", help="shell command that builds each step")
    parser.add_argument("--run", metavar="RUN", help=f"take kernel and matrix from it: {RUN_HELP}")
    parser.add_argument("--kernel", help="kernel name or module:attribute (from the checkout)")
    parser.add_argument("--matrix", help="matrix name or file")
    parser.add_argument("--device", default="auto", help="device of each step (default auto)")
    add_db_argument(parser)
    parser.set_defaults(handler=bisect_command)
