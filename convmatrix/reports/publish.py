"""Writing a stored run's report: its HTML with the JSON beside it (``convmatrix report``, and
the run pipeline's ``report`` step), built once the run has finished and read back after
(``reports.stored``).

What the command prints (the header, the first failures) is a third stored page, a few hundred
bytes: a stored report of 10,000 cases is copied out as stored, its JSON never parsed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from convmatrix.reports.stored import StoredPages
from convmatrix.reports.viewmodel import (
    RunHeader,
    json_text,
    out_dir,
    to_jsonable,
    write_pages,
)

if TYPE_CHECKING:
    from convmatrix.db.engine import Reader
    from convmatrix.reports.run_view import RunView

__all__ = ["RunReport", "write_run_report"]


@dataclass
class RunReport:
    """What a report command prints of the report it wrote."""

    run: RunHeader
    failures: list[tuple[str, str]]  # (outcome, case name), worst first: the first SHOWN
    html: Path
    n_failures: int = 0  # all of them


SHOWN = 10  # failures a report command names


def write_run_report(session: Reader, spec: str | int, url: str, out: Path) -> RunReport:
    """Write ``run-<id>.html`` and ``run-<id>.json`` for the run ``spec`` names into ``out``."""
    stored = StoredPages(session, spec, url)
    out_dir(Path(out))  # nothing can be written there: refused before a page is stored
    html = stored.page("run.html", _html)
    data = stored.page("run.json", json_text)
    path, _ = write_pages(Path(out) / f"run-{stored.info.id}.html", html, data)
    summary = json.loads(stored.page("run.summary.json", _summary))
    return RunReport(
        run=RunHeader(**summary["run"]), failures=[tuple(f) for f in summary["failures"]],
        html=path, n_failures=summary["n_failures"],
    )  # fmt: skip


def _summary(view: RunView) -> str:
    """What the command prints of a report: its header and its first failures."""
    shown = [[f.outcome, f.name] for f in view.failures[:SHOWN]]
    return json.dumps({"run": to_jsonable(view.run), "failures": shown,
                       "n_failures": len(view.failures)})  # fmt: skip


def _html(view: RunView) -> str:
    from convmatrix.reports.render import render_html  # Jinja2: only when a page is built

    return render_html(view)
