"""``convmatrix run``: execute a matrix against a kernel and record every result.

Parses the run's options (declared once, in ``convmatrix.runners.options``), hands them to the
run pipeline (``convmatrix.pipeline.run``: prepare, execute, scan, confirm, report, CI
outputs) and prints what its steps left.

Exit status: 0 every case passed (skips allowed), 1 any failed, crashed, timed out or errored,
or the run stopped early (a ``-n 0`` run whose case hung stops there), 2 usage, matrix or
environment errors (nothing ran), 3 infrastructure: the database refused results past the
retry limit (they are in the run's journal: ``--resume`` replays it) or the executor failed,
130 interrupted. With ``--fail-on new-regressions``: 1 only when the run inserted a regression
(not found flaky by ``--confirm``) or stopped early, else 0, so a failure already known does
not fail every build.

Kernel text (regressions' detail, the explanation) is printed through
``core.sanitise.terminal_safe``: escape sequences are shown, not obeyed.
"""

from __future__ import annotations

import argparse

from convmatrix.core.sanitise import terminal_safe
from convmatrix.runners.options import RunOptions, add_cli_options

__all__ = ["add_arguments", "run_command"]


def run_command(args: argparse.Namespace) -> int:
    options = RunOptions.from_namespace(args)
    options.export_threads()  # before torch loads: OpenMP reads its wait policy then
    from convmatrix.pipeline.run import run

    # -n 0: the kernel runs in this process; the CLI then ends it with the run's status
    # whatever threads or atexit hooks the kernel left (cli.main).
    args.in_process_kernel = str(args.workers) == "0" and args.executor == "xdist"
    end = run(options)
    if end.report is not None:
        print(f"report: {end.report}")
    scan = end.scan
    if scan is not None and scan.skipped:
        print(f"regressions: not scanned ({scan.skipped})")
    elif scan is not None:
        alert = f", alert {scan.alert_id}" if scan.alert_id else ""
        print(
            f"regressions: {len(scan.new)} new, {len(scan.reopened)} reopened, "
            f"{len(scan.kept)} already known, {len(scan.fixed)} fixed "
            f"(against run {scan.baseline_id or '-'}{alert})"
        )
        for text in scan.explanation[:1]:
            print(f"  where: {terminal_safe(text)}")
        for reg in scan.alerting:
            print("  " + terminal_safe(reg.line()))
        for line in scan.infrastructure_lines():
            print(terminal_safe(line))
    if end.confirmation is not None:
        print(terminal_safe("\n".join(end.confirmation.lines())))
    for shrunk in end.shrunk:
        print(terminal_safe("\n".join(shrunk.lines())))
    if end.junit is not None:
        print(f"junit: {end.junit}")
    if end.summary is not None:
        print(f"summary: {end.summary}")
    return end.exit_code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run every case of a matrix against a kernel on this machine's devices, "
        "compare with the float64 reference and record the results. Exit 0 when all pass, "
        "1 on failures (or a run stopped early), 2 on usage, matrix or environment errors, "
        "3 when the database or the executor failed (results kept in the run's journal; "
        "--resume replays it), 130 when interrupted."
    )
    add_cli_options(p)
    p.set_defaults(handler=run_command)
