"""``convmatrix confirm RUN``: rerun the cases of RUN's new regressions and mark each one
confirmed (it reproduces) or flaky (it does not); ``convmatrix run --confirm`` does the same
right after the run.

The rerun runs the cases by id, with the run's own kernel and matrix, on another device of
the same kind when the machine has more than one (a fault of one card is then told apart from
one of the kernel), as a side run labelled ``confirm:RUN`` that is never a nightly's baseline.
Exit status: 0 when nothing was confirmed, 1 when any regression was confirmed.
"""

from __future__ import annotations

import argparse

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.service.confirm import Confirmation, RerunRequest, confirm
from convmatrix.service.store import writing

__all__ = ["add_arguments", "confirm_command", "confirm_run", "rerun_device"]


def rerun_device(device: str) -> str:
    """Another device of ``device``'s kind when there is one (``cuda:1`` after ``cuda``),
    else the same kind."""
    kind = device.split(" ", 1)[0].split(":", 1)[0]
    if kind == "cpu":
        return "cpu"
    from convmatrix.core.devices import discover

    count = discover(kind).count
    return f"{kind}:1" if count > 1 else kind


def confirm_run(spec: str | int, db: str | None, workers: str | int = 0) -> Confirmation:
    """Confirm the detected regressions of run ``spec`` by rerunning their cases."""
    from convmatrix.api import run

    def rerun(request: RerunRequest) -> int:
        header = request.header
        summary = run(
            header.matrix_source or header.matrix, header.kernel_spec or header.kernel,
            device=rerun_device(header.device), workers=workers, db=db, label=request.label,
            commit=header.commit, cases=request.case_ids,
        )  # fmt: skip
        assert summary.run_id is not None
        return summary.run_id

    return confirm(lambda: writing(db), spec, rerun)


def print_confirmation(result: Confirmation) -> None:
    if result.rerun_id is None:
        print(f"confirm: run {result.run_id} has no detected regression to confirm")
        return
    print(
        f"confirm: run {result.run_id} rerun as run {result.rerun_id}: "
        f"{len(result.confirmed)} confirmed, {len(result.flaky)} flaky"
    )
    for reg in result.confirmed + result.flaky:
        print("  " + reg.line())


def confirm_command(args: argparse.Namespace) -> int:
    result = confirm_run(args.run, args.db, args.workers)
    print_confirmation(result)
    return 1 if result.confirmed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Rerun the cases of a run's detected regressions (on another device when there is one) "
        "and mark each confirmed or flaky. Exit 1 when any was confirmed."
    )
    parser.add_argument("run", metavar="RUN", help=RUN_HELP)
    parser.add_argument("-n", dest="workers", default="0", help="worker processes (default 0)")
    add_db_argument(parser)
    parser.set_defaults(handler=confirm_command)
