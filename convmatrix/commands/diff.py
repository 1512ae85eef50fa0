"""``convmatrix diff BASE HEAD``: what changed between two runs, for a person and for CI.

Prints a text summary, writes the HTML (and JSON beside it) with ``--out``, and exits 1 when a
``--fail-on`` condition holds. Timing claims follow ``compare.timing.pairs`` (rank test,
minimum ratio, framework-path control) and, with ``--timing-history N``,
``compare.timing.history`` (a baseline window against confirming recent runs).
``--previous HEAD`` compares HEAD with the newest earlier run of the same kernel, matrix and
device (what ``nox -s matrix`` does each night); with no such run there is nothing to compare
and the exit status is 0.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from convmatrix.commands.arguments import RUN_HELP, add_db_argument
from convmatrix.compare.errors import DEFAULT_FACTOR, DEFAULT_FLOOR, FALLBACK_FACTOR, ErrorRule
from convmatrix.compare.runs import FAIL_ON, DiffOptions
from convmatrix.compare.timing.history import HistoryRule
from convmatrix.compare.timing.rules import TimingRule
from convmatrix.core.dtypes import parse_case_dtype
from convmatrix.core.errors import UsageError
from convmatrix.core.sanitise import terminal_safe
from convmatrix.db.database import Database
from convmatrix.reports.diff import diff_runs, diff_text

__all__ = ["add_arguments", "diff_command"]


def _floors(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """``--floor 0.2`` (a bound usage, every dtype) and ``--floor bfloat16=0.3`` (the outputs
    judged in one dtype)."""
    common: float | None = None
    per_dtype: dict[str, float] = {}
    for text in values:
        dtype, _, number = text.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(
                f"--floor {text!r}: expected a bound usage (a number >= 0, such as "
                f"{DEFAULT_FLOOR:g}) or DTYPE=USAGE"
            )
        if dtype:
            per_dtype[parse_case_dtype(dtype, "--floor")] = value
        else:
            common = value
    return common, per_dtype


def _fail_on(values: list[str]) -> list[str]:
    conditions = [c.strip() for v in values for c in v.split(",") if c.strip()]
    unknown = [c for c in conditions if c not in FAIL_ON]
    if unknown:
        raise UsageError(f"--fail-on {unknown[0]!r}: choose from {', '.join(FAIL_ON)}")
    return conditions


def diff_command(args: argparse.Namespace) -> int:
    if args.previous and len(args.runs) != 1:
        raise UsageError("--previous takes exactly one run: convmatrix diff --previous HEAD")
    if not args.previous and len(args.runs) != 2:
        raise UsageError("give two runs, BASE and HEAD (or --previous HEAD)")
    if not (args.factor > 1 and math.isfinite(args.factor)):
        raise UsageError(f"--factor {args.factor}: must be a number greater than 1")
    conditions = _fail_on(args.fail_on)
    floor, floors = _floors(args.floor)
    control = None if args.timing_control == "none" else args.timing_control
    options = DiffOptions(
        errors=ErrorRule(factor=args.factor, floor=floor, floors=floors),
        timing=TimingRule(ratio=args.timing_ratio, alpha=args.timing_alpha, control=control),
    )  # fmt: skip
    history = None
    if args.timing_history:
        if args.timing_history < 3 or args.timing_confirm < 1:
            raise UsageError("--timing-history needs at least 3 runs, --timing-confirm 1 or more")
        history = HistoryRule(
            window=args.timing_history, confirm=args.timing_confirm, ratio=args.timing_ratio,
            control=control,
        )  # fmt: skip
    base, head = (None, args.runs[0]) if args.previous else args.runs
    with Database(args.db, existing=True) as database, database.reading() as session:
        view = diff_runs(session, database.url, base, head, options, history)
    if view is None:
        print(f"diff: no earlier run of the kernel of run {head!r} to compare with")
        return 0
    print(terminal_safe(diff_text(view)))
    if args.out is not None:
        from convmatrix.reports.render import write_report  # Jinja2: only for --out

        html, data = write_report(view, args.out)
        print(f"diff report: {html} (data: {data})")
    held = [c for c in conditions if view.conditions()[c]]
    if held:
        print(f"diff: failing on {', '.join(held)}")
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Compare two runs matched by case id: new failures, fixed, still failing, "
        "error and timing regressions, cases added or removed."
    )
    parser.add_argument("runs", nargs="*", metavar="RUN", help=f"BASE and HEAD: {RUN_HELP}")
    parser.add_argument(
        "--previous", action="store_true",
        help="compare HEAD with the newest earlier run of its kernel, matrix and device",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the HTML diff here")
    parser.add_argument(
        "--fail-on", action="append", default=[], metavar="CONDITION",
        help=f"exit 1 when this holds: {', '.join(FAIL_ON)} (repeat or comma-separate)",
    )  # fmt: skip
    parser.add_argument(
        "--factor", type=float, default=DEFAULT_FACTOR,
        help=f"error regression: an output's bound usage grew by more than this (default "
        f"{DEFAULT_FACTOR:g}; docs/regression-rule.md)",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="append", default=[], metavar="[DTYPE=]USAGE",
        help=f"the bound usage below which an output never regresses (default "
        f"{DEFAULT_FLOOR:g}); DTYPE=USAGE for the outputs judged in one dtype. Where a run "
        f"recorded no usage, or the kernels declare different arithmetic, e_rel/e_norm judge "
        f"instead (x{FALLBACK_FACTOR:g} above 4 unit roundoffs of the dtype, 16 for dw/db)",
    )  # fmt: skip
    parser.add_argument(
        "--timing-ratio", type=float, default=TimingRule.ratio,
        help="timing regression: median grew by more than this (default 1.1)",
    )  # fmt: skip
    parser.add_argument(
        "--timing-alpha", type=float, default=TimingRule.alpha,
        help="significance of the Mann-Whitney U test on the samples (default 0.01)",
    )  # fmt: skip
    parser.add_argument(
        "--timing-control", default=TimingRule.control, metavar="SCOPE",
        help="scope measured beside each case that a timing claim must also hold against "
        "(default framework: the PyTorch path; 'none' to judge raw times)",
    )  # fmt: skip
    parser.add_argument(
        "--timing-history", type=int, default=0, metavar="N",
        help="also judge HEAD's timings against the N runs of its kernel, matrix and device "
        "before the confirming ones: slower than all of them and x ratio their median in each "
        "of the --timing-confirm newest runs (fail on it with --fail-on timing-history)",
    )  # fmt: skip
    parser.add_argument(
        "--timing-confirm", type=int, default=HistoryRule.confirm, metavar="K",
        help="consecutive newest runs (HEAD included) that must all be slower (default 3)",
    )  # fmt: skip
    add_db_argument(parser)
    parser.set_defaults(handler=diff_command)
