"""Reports: the run report, the diff of two runs, the error history of a dtype.

Each is built as a plain view-model from the database first (``build_run_view``,
``build_diff``, ``build_history_view``), then rendered to one self-contained HTML page with
the same view-model as JSON beside it (``write_report``).
"""

from convmatrix.reports.diff import DiffOptions, DiffView, build_diff, summary_text
from convmatrix.reports.history_view import HistoryView, build_history_view
from convmatrix.reports.render import render_html, write_report
from convmatrix.reports.run_view import RunView, build_run_view
from convmatrix.reports.timing_compare import TimingRule, compare_timings, mann_whitney_u
from convmatrix.reports.timing_history import HistoryRule, history_regressions
from convmatrix.reports.viewmodel import RunHeader, run_header

__all__ = [
    "DiffOptions",
    "DiffView",
    "HistoryRule",
    "HistoryView",
    "RunHeader",
    "RunView",
    "TimingRule",
    "build_diff",
    "build_history_view",
    "build_run_view",
    "compare_timings",
    "history_regressions",
    "mann_whitney_u",
    "render_html",
    "run_header",
    "summary_text",
    "write_report",
]
