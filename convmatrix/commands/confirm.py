"""``convmatrix confirm RUN``: rerun the cases of RUN's new regressions and mark each one
confirmed (it reproduces) or flaky (it does not), and rerun with a 4x longer limit the cases
the machine failed to judge (timeouts, lost workers, harness errors), filing as confirmed
regressions those the rerun shows to be the kernel's; ``convmatrix run --confirm`` does the
same right after the run (``convmatrix.pipeline.confirm``).

The rerun runs the cases by id, with the run's own kernel and matrix, on another device of
the same kind when the machine has more than one, as a side run labelled ``confirm:RUN`` that
is never a nightly's baseline. It reruns the kernel at the commit the run recorded: a checkout
elsewhere is refused with both commits named, or with ``--checkout`` a temporary worktree at
the recorded commit is used. Exit status: 0 when nothing was confirmed, 1 when any was (or a
case not judged before was reproduced), 2 when the rerun was refused.
"""

from __future__ import annotations

import argparse

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.core.sanitise import terminal_safe

__all__ = ["add_arguments", "confirm_command"]


def confirm_command(args: argparse.Namespace) -> int:
    from convmatrix.db.database import Database
    from convmatrix.pipeline.confirm import confirm_run

    with Database(args.db, existing=True) as database:
        result = confirm_run(database, args.run, args.workers, checkout=args.checkout)
    print(terminal_safe("\n".join(result.lines())))
    return 1 if result.confirmed or result.reproduced else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Rerun the cases of a run's detected regressions (on another device when there is one) "
        "and mark each confirmed or flaky. Exit 1 when any was confirmed."
    )
    parser.add_argument("run", metavar="RUN", help=RUN_HELP)
    parser.add_argument("-n", dest="workers", default="0", help="worker processes (default 0)")
    parser.add_argument(
        "--checkout", action="store_true",
        help="when the kernel's checkout is not at the commit the run tested, rerun from a "
        "temporary git worktree at that commit (default: refuse, naming both commits)",
    )  # fmt: skip
    add_db_argument(parser)
    parser.set_defaults(handler=confirm_command)
