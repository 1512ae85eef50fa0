"""``convmatrix history --dtype DT``: how one dtype's errors moved over the runs.

Per run (oldest first, labelled by kernel and commit; ``--kernel``/``--matrix`` keep one
lineage, and the charts draw each kernel, matrix and device kind as a line of its own): worst
and median bound usage, e_rel and e_norm of each output, case count and pass rate, as a table,
CSV, JSON or an HTML page with line charts (usage against the safety line). The aggregates
are computed by the database (``convmatrix.db.history``), not in Python.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.tolerances import OUTPUTS
from convmatrix.db.database import Database
from convmatrix.reports.formatting import fmt_num, fmt_pct
from convmatrix.reports.history_view import (
    FLAT_COLUMNS,
    HistoryView,
    flat_rows,
    load_history,
)
from convmatrix.reports.viewmodel import to_jsonable

__all__ = ["add_arguments", "history_command"]

FORMATS = ("table", "csv", "json", "html")


def _table(view: HistoryView) -> str:
    rows = flat_rows(view)
    cells = [list(FLAT_COLUMNS)]
    for row in rows:
        cells.append(
            [
                fmt_pct(v) if k == "run_pass_rate" else fmt_num(v) if isinstance(v, float)
                else (v[:10] if k == "commit" else str(v))
                for k, v in row.items()
            ]
        )  # fmt: skip
    widths = [max(len(r[i]) for r in cells) for i in range(len(FLAT_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells)


def _csv(view: HistoryView) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FLAT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat_rows(view))
    return buffer.getvalue()


def history_command(args: argparse.Namespace) -> int:
    with Database(args.db, existing=True) as database, database.reading() as session:
        view = load_history(
            session, database.url, args.dtype, output=args.output, kernel=args.kernel,
            since=args.since, matrix=args.matrix,
        )  # fmt: skip
    if not view.runs:
        print(f"history: no run holds metrics for dtype {view.dtype}", file=sys.stderr)
    if args.format == "html":
        from convmatrix.reports.render import render_html, write_report  # Jinja2: html only

        if args.out is not None:
            html, data = write_report(view, args.out)
            print(f"history report: {html} (data: {data})")
            return 0
        text = render_html(view)
    else:
        text = {
            "table": _table,
            "csv": _csv,
            "json": lambda v: json.dumps(to_jsonable(v), indent=1, allow_nan=False) + "\n",
        }[args.format](view)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Per run (oldest first): worst and median bound usage, e_rel and e_norm of each "
        "output judged in one dtype, with case count and pass rate."
    )
    parser.add_argument("--dtype", required=True, help="input dtype: float32, bfloat16 (bf16)...")
    parser.add_argument("--output", help=f"only this output: {', '.join(OUTPUTS)}")
    parser.add_argument("--kernel", help="only runs of this kernel (as recorded by the run)")
    parser.add_argument("--matrix", help="only runs of this matrix (as recorded: nightly, ...)")
    parser.add_argument("--since", help="only runs started since: 2025-01-31, or 30d")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument(
        "--out", type=Path, metavar="FILE",
        help="write here instead of stdout (html: the page and its JSON beside it)",
    )  # fmt: skip
    add_db_argument(parser)
    parser.set_defaults(handler=history_command)
