"""``convmatrix run``: execute a matrix against a kernel and record every result.

A thin front over ``convmatrix.run`` (``convmatrix/api.py``), which prepares the run (a typo
is exit 2 with a clear message), runs it on its engine and returns the ``RunSummary`` the
exit status comes from; with ``--report DIR`` the run report is written afterwards.

Exit status: 0 every case passed (skips allowed), 1 any failed, crashed, timed out or errored,
or the run stopped early, 2 usage or matrix errors, 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.core.verdict import RULES

__all__ = ["add_arguments", "run_command"]


def run_command(args: argparse.Namespace) -> int:
    """Run the matrix the parsed arguments name; the process exit status."""
    if args.report is not None and args.no_db:
        raise UsageError("--report reads the run from the database; drop --no-db")
    from convmatrix.api import run

    summary = run(
        args.matrix,
        args.kernel,
        device=args.device,
        workers=args.workers,
        db=args.db,
        no_db=args.no_db,
        label=args.label,
        commit=args.commit,
        cases=args.cases,
        resume=args.resume,
        case_timeout=args.case_timeout,
        policy=args.policy,
        engine=args.engine,
        address=args.address,
        shard=args.shard,
        run_label=args.run_label,
        verbose=args.verbose,
    )
    if args.report is not None and summary.run_id is not None:
        from convmatrix.commands.report import write_run_report

        _, html = write_run_report(str(summary.run_id), args.report, args.db)
        print(f"report: {html}")
    return summary.exit_code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run every case of a matrix against a kernel on this machine's devices, "
        "compare with the float64 reference and record the results. Exit 0 when all pass, "
        "1 on failures, 2 on usage or matrix errors."
    )
    p.add_argument("--matrix", help="built-in matrix name (smoke, nightly), or a file")
    p.add_argument("--kernel", help="registered kernel name or package.module:attribute")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mlu")
    p.add_argument("-n", dest="workers", default="auto", help="worker processes: N or auto")
    add_db_argument(p)
    p.add_argument("--no-db", action="store_true", help="do not record (summary only)")
    p.add_argument("--label", help="free-text label stored with the run")
    p.add_argument("--commit", help="kernel commit (default: git HEAD of the kernel source)")
    p.add_argument(
        "--case",
        dest="cases",
        action="extend",
        nargs="+",
        default=[],
        metavar="ID",
        help="run only these cases (id, id prefix or pytest id)",
    )
    p.add_argument("--resume", metavar="RUN", help="run only the cases RUN has no result for")
    p.add_argument("--case-timeout", type=float, help="seconds per case (default: matrix's)")
    p.add_argument(
        "--policy",
        choices=tuple(RULES),
        help="verdict policy, overriding the matrix's (default: bound; docs/spec.md §4)",
    )
    p.add_argument(
        "--engine",
        choices=("xdist", "ray"),
        default="xdist",
        help="xdist: this host's devices (default); ray: a Ray cluster's (convmatrix[ray])",
    )
    p.add_argument("--address", metavar="ADDR", help="the Ray cluster (default: a local one)")
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="run shard I of N of one run (auto[/N]: I from the CI's index variable)",
    )
    p.add_argument("--run-label", metavar="LABEL", help="the run every --shard writes into")
    p.add_argument("--report", type=Path, metavar="DIR", help="write the HTML report here")
    p.add_argument("-v", "--verbose", action="count", default=0, help="one line per case")
    p.set_defaults(handler=run_command)
