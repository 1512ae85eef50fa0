"""``convmatrix bisect --regression N`` (or ``--good SHA --bad SHA --case ID``) ``[--build CMD]
[--repo PATH]``: the kernel commit that broke a case (``service.bisect``: ``git bisect run``
with a one-case run per step, each recorded as a run of kind ``bisect`` labelled
``bisect:<sha>``); with ``--regression`` the first bad commit is recorded with its alert.

The kernel and matrix are those of ``--run RUN`` (a run that failed the case, e.g. the
regression's first bad run), or ``--kernel`` and ``--matrix``; the kernel is imported from the
checkout under test (``--repo`` is put first on ``PYTHONPATH``). A step that judged nothing
(the kernel does not import there, the case got no verdict) is skipped, never good or bad.

Exit 0 when a first bad commit was judged bad with a parent judged good, 4 *cannot decide*
(an endpoint not judged as given, only unjudged commits left at the boundary), 3 when a
step's run failed on infrastructure (the bisection stops), 2 usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.db.database import Database
from convmatrix.db.engine import absolute_url, default_url
from convmatrix.service.bisect import Asked, bisect, plan_bisection, record_result

__all__ = ["add_arguments", "bisect_command"]


def bisect_command(args: argparse.Namespace) -> int:
    asked = Asked(
        repo=args.repo, good=args.good, bad=args.bad, case_id=args.case, run=args.run,
        kernel=args.kernel, matrix=args.matrix, regression=args.regression, build=args.build,
        device=args.device,
    )  # fmt: skip
    url = absolute_url(args.db or default_url())  # the steps run in the repository
    with Database(url, existing=bool(args.run or args.regression)) as database:
        request, alert_id = plan_bisection(database, asked)
        result = bisect(request)
        if alert_id is not None:
            record_result(database, alert_id, result)
    for step in result.steps:
        where = f" [{step.endpoint}]" if step.endpoint else ""
        print(f"  {step.commit[:12]} {step.verdict}{where}")
    if result.infrastructure:
        print(f"bisect: stopped: {result.infrastructure}")
    elif result.first_bad is None:
        print(f"bisect: cannot decide: {result.undecided}")
    else:
        print(
            f"bisect: first bad commit {result.first_bad} (judged bad, its parent good; "
            "steps recorded as runs 'bisect:<sha>')"
        )
        if alert_id is not None:
            print(f"bisect: recorded with alert {alert_id}")
    return result.exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Find the commit of the kernel's repository that broke one case: git bisect run with a "
        "one-case convmatrix run per step, both endpoints judged first; a step that judged "
        "nothing (--build failed, the kernel did not import) is skipped. Exit 0 a first bad "
        "commit, 4 cannot decide, 3 a step failed on infrastructure."
    )
    parser.add_argument(
        "--regression", type=int, metavar="N",
        help="bisect regression N: its good and bad commits, case, kernel and matrix; the "
        "first bad commit is recorded with its alert",
    )  # fmt: skip
    parser.add_argument("--good", metavar="SHA", help="a commit where it passed")
    parser.add_argument("--bad", metavar="SHA", help="a commit where it fails")
    parser.add_argument("--case", metavar="ID", help="the case id")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the kernel's repository")
    parser.add_argument("--build", metavar="CMD", help="shell command that builds each step")
    parser.add_argument("--run", metavar="RUN", help=f"take kernel and matrix from it: {RUN_HELP}")
    parser.add_argument("--kernel", help="kernel name or module:attribute (from the checkout)")
    parser.add_argument("--matrix", help="matrix name or file")
    parser.add_argument("--device", default="auto", help="device of each step (default auto)")
    add_db_argument(parser)
    parser.set_defaults(handler=bisect_command)
