"""``convmatrix explore --kernel K``: a budgeted search for failures no matrix lists.

Draws valid cases from the whole space of docs/spec.md up to ``--max-elements`` elements,
runs them in rounds through the run pipeline (each round a recorded run of kind
``explore``), prints one progress line per round, shrinks each failure, merges those whose
shrunk cases agree, and writes the failing cases as a matrix file (``--out``) that
``convmatrix run --matrix FILE`` runs (docs/search.md, "Explore").

Exit status: 1 when it found a failure, 0 when the budget ran out without one, 2 on usage
errors (nothing runs: ``--out`` is checked first), 3 when the machine or the database failed
under it, 130 when SIGINT or SIGTERM stopped it; the findings so far are written in every
case.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from convmatrix.commands.arguments import check_writable
from convmatrix.core.errors import InfrastructureError, UsageError
from convmatrix.runners.options import add_cli_options, check_device

__all__ = ["add_arguments", "explore_command", "parse_budget", "parse_count"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds (> 0)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"--budget {text!r}: give a duration > 0 like 90s, 10m or 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_count(text: str, flag: str) -> int:
    """``50000000``, ``5e7`` -> an integer >= 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise UsageError(f"{flag} {text!r}: give a whole number >= 1 (5e7 is fine)")
    return int(value)


def explore_command(args: argparse.Namespace) -> int:
    from convmatrix.matrix.build import MAX_ELEMENTS
    from convmatrix.search.explore import ExploreSettings

    if not args.kernel:
        raise UsageError("--kernel is required")
    max_elements = parse_count(args.max_elements, "--max-elements")
    if max_elements > MAX_ELEMENTS:
        raise UsageError(f"--max-elements {args.max_elements}: at most {MAX_ELEMENTS} (2^31-1)")
    if args.max_failures is not None and args.max_failures < 1:
        raise UsageError(f"--max-failures {args.max_failures}: give a number >= 1")
    check_device(args.device)
    settings = ExploreSettings(
        budget_s=parse_budget(args.budget), seed=args.seed, max_failures=args.max_failures,
        round_s=parse_budget(args.round), shrink_runs=args.shrink_runs,
    )  # fmt: skip
    out = args.out or Path(f"explore-{re.sub(r'[^A-Za-z0-9_.-]+', '_', args.kernel)}.yaml")
    check_writable(out, "--out")
    from convmatrix.pipeline.explore import ExploreOptions, explore_kernel  # imports torch

    options = ExploreOptions(
        kernel=args.kernel, settings=settings, max_elements=max_elements, device=args.device,
        workers=args.workers, executor=args.executor, address=args.address, db=args.db,
        out=out, shrink=not args.no_shrink,
    )  # fmt: skip
    report = explore_kernel(options, on_progress=lambda p: print(p.line(), flush=True))
    _print_report(report, args.kernel, args.seed, out)
    if report.fault is not None:
        raise InfrastructureError(report.fault)  # one line, exit 3
    if report.interrupted:
        print(f"convmatrix explore: interrupted ({report.signal or 'signal'}) after "
              f"{report.elapsed_s:.0f}s", file=sys.stderr)  # fmt: skip
    return report.exit_code


def _print_report(report: Any, kernel: str, seed: int, out: Path) -> None:
    first = report.first_failure_s
    print(
        f"explore {kernel} seed {seed}: {report.cases} cases in {report.rounds} "
        f"rounds, {report.elapsed_s:.0f}s, {len(report.failures)} failed"
        + (f" (first after {first:.1f}s)" if first is not None else "")
        + ("; the budget ran out inside the last round" if report.cut else "")
    )
    for i, finding in enumerate(report.findings, 1):
        shrunk = finding.shrunk
        how = f"shrunk in {shrunk.runs} runs" if shrunk is not None else "not shrunk"
        print(f"{i}. {finding.case.pytest_id}  {finding.signature}  ({how}, "
              f"{len(finding.failures)} failing case(s))")  # fmt: skip
        for line in shrunk.boundary_lines() if shrunk is not None else ():
            print(f"   {line}")
    if report.findings:
        print(f"matrix of the failing cases: {out} (convmatrix run --matrix {out} ...)",
              flush=True)  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Search for failures beyond the matrix: draw valid cases from the whole space of "
        "docs/spec.md (biased toward tile and power-of-two boundaries and the kernel's "
        "contract edges), run them in rounds like `run` (recorded as runs of kind explore), "
        "shrink each failure and write the failing cases as a matrix file. Exit 1 when a "
        "failure was found, 0 when the budget ran out without one, 3 when the machine or the "
        "database failed, 130 on SIGINT/SIGTERM (the findings so far are written each time)."
    )
    add_cli_options(p, only=("kernel", "device", "workers", "db", "executor", "address"))
    p.add_argument("--budget", default="10m", help="search time: 90s, 10m, 1h (default 10m)")
    p.add_argument(
        "--max-elements", default="1048576", metavar="N",
        help="largest tensor drawn, batch x dim x time elements (default 2^20; 5e7 reaches "
        "the size bugs)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the same seed draws the same cases")
    p.add_argument(
        "--out", type=Path, metavar="FILE",
        help="matrix file of the failing cases (default: explore-<kernel>.yaml)",
    )  # fmt: skip
    p.add_argument(
        "--max-failures", type=int, metavar="N",
        help="stop after N distinct failures (default: search the whole budget)",
    )  # fmt: skip
    p.add_argument("--round", default="30s", help="a round's target duration (default 30s)")
    p.add_argument(
        "--shrink-runs", type=int, default=60, metavar="N", help="case runs per shrink (60)"
    )
    p.add_argument("--no-shrink", action="store_true", help="report failures as drawn")
    p.set_defaults(handler=explore_command)
