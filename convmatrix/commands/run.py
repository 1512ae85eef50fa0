"""``convmatrix run``: execute a matrix against a kernel and record every result.

A thin front over ``convmatrix.run`` (``convmatrix/api.py``), which prepares the run (a typo
is exit 2 with a clear message), runs it on its engine and returns the ``RunAccount`` the
exit status comes from; with ``--report DIR`` the run report is written afterwards.

A recorded run is then scanned for regressions against the previous comparable run
(``convmatrix.service.regressions``); ``--confirm`` reruns the cases of the new ones,
``--junit`` and ``--summary`` write what CI shows (``convmatrix.service.ci``).

Exit status: 0 every case passed (skips allowed), 1 any failed, crashed, timed out or errored,
or the run stopped early, 2 usage or matrix errors, 130 interrupted. With ``--fail-on
new-regressions``: 1 only when the run inserted a regression (not found flaky by
``--confirm``) or stopped early, else 0, so a failure already known does not fail every build.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError
from convmatrix.core.verdict import RULES

__all__ = ["FAIL_ON", "add_arguments", "run_command"]

FAIL_ON = ("new-regressions",)


def _after_run(args: argparse.Namespace, run_id: int, exit_code: int, status: str) -> int:
    """Scan, confirm, JUnit and summary for a recorded run; the exit status."""
    from convmatrix.db.queries import load_results, resolve_run
    from convmatrix.reports.viewmodel import run_header
    from convmatrix.service.ci import job_summary_markdown, write_junit
    from convmatrix.service.regressions import scan_run
    from convmatrix.service.store import writing

    with writing(args.db) as (session, url):
        scan = scan_run(session, run_id)
    print(
        f"regressions: {len(scan.new)} new, {len(scan.kept)} already known, "
        f"{len(scan.fixed)} fixed (against run {scan.baseline_id or '-'})"
    )
    new = scan.new
    if args.confirm and new:
        from convmatrix.commands.confirm import confirm_run, print_confirmation

        confirmation = confirm_run(run_id, args.db, args.workers)
        print_confirmation(confirmation)
        flaky = {r.id for r in confirmation.flaky}
        new = [r for r in new if r.id not in flaky]
        scan.new = new
    if args.junit is not None or args.summary is not None:
        with writing(args.db) as (session, url):
            info = resolve_run(session, run_id)
            results = load_results(session, run_id)
            header = run_header(info, url, results)
        if args.junit is not None:
            print(f"junit: {write_junit(args.junit, header.title, results)}")
        if args.summary is not None:
            text = job_summary_markdown(run_id, header.title, header.counts, scan,
                                    base_url=args.base_url)  # fmt: skip
            args.summary.parent.mkdir(parents=True, exist_ok=True)
            with args.summary.open("a", encoding="utf-8") as out:  # GitHub appends steps
                out.write(text)
            print(f"summary: {args.summary}")
    if "new-regressions" in args.fail_on:
        if status != "finished" or exit_code == 130:
            return exit_code or 1
        return 1 if new else 0
    return exit_code


def run_command(args: argparse.Namespace) -> int:
    """Run the matrix the parsed arguments name; the process exit status."""
    if args.report is not None and args.no_db:
        raise UsageError("--report reads the run from the database; drop --no-db")
    conditions = [c.strip() for v in args.fail_on for c in v.split(",") if c.strip()]
    unknown = [c for c in conditions if c not in FAIL_ON]
    if unknown:
        raise UsageError(f"--fail-on {unknown[0]!r}: choose from {', '.join(FAIL_ON)}")
    args.fail_on = conditions
    if args.summary is None and os.environ.get("GITHUB_STEP_SUMMARY"):
        args.summary = Path(os.environ["GITHUB_STEP_SUMMARY"])
    if args.no_db and (args.junit or args.summary or args.confirm or conditions):
        raise UsageError("--junit, --summary, --confirm and --fail-on read the database; "
                         "drop --no-db")  # fmt: skip
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
    if summary.run_id is None:
        return summary.exit_code
    return _after_run(args, summary.run_id, summary.exit_code, summary.status)


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
    p.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    p.add_argument(
        "--summary", type=Path, metavar="FILE",
        help="append a markdown summary here (default: $GITHUB_STEP_SUMMARY when set)",
    )  # fmt: skip
    p.add_argument(
        "--base-url", metavar="URL", default=os.environ.get("CONVMATRIX_BASE_URL"),
        help="link the summary to `convmatrix serve` here (default: $CONVMATRIX_BASE_URL)",
    )  # fmt: skip
    p.add_argument(
        "--fail-on", action="append", default=[], metavar="CONDITION",
        help="new-regressions: exit 1 only when this run found a new regression",
    )  # fmt: skip
    p.add_argument(
        "--confirm", action="store_true",
        help="rerun the cases of new regressions: confirmed or flaky (flaky ones do not fail)",
    )  # fmt: skip
    p.add_argument("-v", "--verbose", action="count", default=0, help="one line per case")
    p.set_defaults(handler=run_command)
