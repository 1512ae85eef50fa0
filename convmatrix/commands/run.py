"""``convmatrix run``: execute a matrix against a kernel and record every result.

Parses the run's options (declared once, in ``convmatrix.runners.options``), hands them to the
run pipeline (``convmatrix.pipeline.run``: prepare, execute, scan, confirm, report, CI
outputs) and prints what its steps left.

Exit status: 0 every case passed (skips allowed), 1 any failed, crashed, timed out or errored,
or the run stopped early, 2 usage or matrix errors, 130 interrupted. With ``--fail-on
new-regressions``: 1 only when the run inserted a regression (not found flaky by
``--confirm``) or stopped early, else 0, so a failure already known does not fail every build.
"""

from __future__ import annotations

import argparse

from convmatrix.runners.options import RunOptions, add_cli_options

__all__ = ["add_arguments", "run_command"]


def run_command(args: argparse.Namespace) -> int:
    from convmatrix.pipeline.run import run

    end = run(RunOptions.from_namespace(args))
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
            print(f"  where: {text}")
        for reg in scan.alerting:
            print("  " + reg.line())
    if end.confirmation is not None:
        print("\n".join(end.confirmation.lines()))
    if end.junit is not None:
        print(f"junit: {end.junit}")
    if end.summary is not None:
        print(f"summary: {end.summary}")
    return end.exit_code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run every case of a matrix against a kernel on this machine's devices, "
        "compare with the float64 reference and record the results. Exit 0 when all pass, "
        "1 on failures, 2 on usage or matrix errors."
    )
    add_cli_options(p)
    p.set_defaults(handler=run_command)
