"""Writing a stored run's report: the view-model built from the database, rendered to HTML with
its JSON beside it (``convmatrix report``, and the run pipeline's ``report`` step)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from convmatrix.reports.render import write_report
from convmatrix.reports.run_view import RunView, build_run_view
from convmatrix.reports.source import load_run

__all__ = ["write_run_report"]


def write_run_report(
    session: Session, spec: str | int, url: str, out_dir: Path
) -> tuple[RunView, Path]:
    """Write ``run-<id>.html`` and ``run-<id>.json`` for the run ``spec`` names into
    ``out_dir``; the view-model and the HTML path."""
    loaded = load_run(session, str(spec), url)
    view = build_run_view(loaded.header, loaded.results)
    html, _ = write_report(view, Path(out_dir) / f"run-{loaded.info.id}.html")
    return view, html
