"""Reports: the run report, the diff of two runs, the error history of a dtype.

Each is built as a plain view-model from the database first (``run_view.build_run_view``,
``diff.build_diff``, ``history_view.build_history_view``), then rendered to one
self-contained HTML page with the same view-model as JSON beside it
(``render.write_report``). Names are imported on first use: ``convmatrix diff --help`` must
not pay for Jinja2 and SQLAlchemy.
"""

from __future__ import annotations

from convmatrix.core.lazy import lazy_attributes

__all__ = [
    "DiffView",
    "HistoryView",
    "RunHeader",
    "RunView",
    "build_diff",
    "build_history_view",
    "build_run_view",
    "diff_text",
    "render_html",
    "run_header",
    "write_report",
]

_LAZY = {
    "DiffView": "convmatrix.reports.diff",
    "build_diff": "convmatrix.reports.diff",
    "diff_text": "convmatrix.reports.diff",
    "HistoryView": "convmatrix.reports.history_view",
    "build_history_view": "convmatrix.reports.history_view",
    "render_html": "convmatrix.reports.render",
    "write_report": "convmatrix.reports.render",
    "RunView": "convmatrix.reports.run_view",
    "build_run_view": "convmatrix.reports.run_view",
    "RunHeader": "convmatrix.reports.viewmodel",
    "run_header": "convmatrix.reports.viewmodel",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
