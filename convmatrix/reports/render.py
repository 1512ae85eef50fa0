"""Rendering view-models to self-contained HTML (Jinja2, autoescaped) and JSON beside it.

Every page inlines its stylesheet, script and SVG charts and opens from disk with no network
access. Autoescaping is on for every template, so a kernel whose error message is
``<script>alert(1)</script>`` shows that text. As a second line of defence each page carries a
Content-Security-Policy that forbids every fetch and allows only our own inline script, by hash:
an injected script would not run even if escaping were ever bypassed.
"""

from __future__ import annotations

import base64
import hashlib
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from convmatrix.core import __version__
from convmatrix.core.bounds import DEFAULT_SAFETY
from convmatrix.reports.charts import history_charts
from convmatrix.reports.formatting import fmt_num, fmt_pct, fmt_secs, raw_value
from convmatrix.reports.timing_charts import timing_charts
from convmatrix.reports.viewmodel import json_text, write_pages

__all__ = ["content_policy", "render_html", "write_report"]


def num_cell(value: float | None, cls: str = "") -> Markup:
    """A numeric table cell: formatted text, the exact number in ``data-value`` (a filter, not
    a macro: a 10,000-case report has tens of thousands of them)."""
    # Both texts are numbers formatted here (digits, sign, ".", "e", "nan", "inf", "-"): no
    # markup can come from them; Markup.format would cost a third of a large report's time.
    return Markup(
        f'<td class="num {escape(cls)}" data-value="{raw_value(value)}">{fmt_num(value)}</td>'
    )


def badge(outcome: str | None) -> Markup:
    return Markup('<span class="badge {}">{}</span>').format(outcome or "none", outcome or "absent")


def severity_class(value: float | None) -> str:
    """CSS class of an error relative to its limit (1 = at the limit)."""
    if value is None:
        return ""
    if math.isnan(value):
        return "sev-nan"
    return "sev-ok" if value <= 0.5 else "sev-warn" if value <= 1 else "sev-bad"


def usage_class(usage: float | None, safety: float | None = None) -> str:
    """CSS class of a bound usage against the safety factor it is judged by (the default
    policy's, 2, unless given): yellow above half of it, red above it."""
    if usage is None:
        return ""
    return severity_class(usage / (safety or DEFAULT_SAFETY))


def rate_class(value: float | None) -> str:
    if value is None:
        return ""
    return "rate-full" if value >= 1 else "rate-part" if value >= 0.9 else "rate-low"


@cache
def _static(name: str) -> str:
    return resources.files("convmatrix.reports").joinpath("templates", name).read_text()


def content_policy(form_action: str = "'none'", connect_src: str | None = None) -> str:
    """The pages' Content-Security-Policy: no fetch at all, our inline script by its hash;
    ``convmatrix serve`` allows its own forms (``form_action="'self'"``) and the triage
    form's requests to itself (``connect_src="'self'"``). Static reports fetch nothing."""
    digest = base64.b64encode(hashlib.sha256(_static("report.js").encode()).digest()).decode()
    connect = f"; connect-src {connect_src}" if connect_src else ""
    return (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{digest}'; base-uri 'none'; form-action {form_action}{connect}"
    )


@cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("convmatrix.reports", "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        num=fmt_num, pct=fmt_pct, secs=fmt_secs, raw=raw_value, sev=severity_class,
        rate=rate_class, numcell=num_cell, badge=badge, usage_sev=usage_class,
    )  # fmt: skip
    env.globals.update(
        css=Markup(_static("report.css")),  # our own files, not data: safe to inline
        script=Markup(_static("report.js")),
        csp=content_policy(),
        version=__version__,
    )
    return env


def render_html(view: Any, template: str | None = None, **context: Any) -> str:
    """The HTML page of a view-model; the template is ``<view.kind>.html`` by default.
    ``context`` adds to (or overrides) the template's globals: ``convmatrix serve`` passes
    ``served``, ``request_path`` and its own ``csp``."""
    extra: dict[str, Any] = dict(context)
    if view.kind == "history":
        extra["charts"] = history_charts(view)
    if view.kind == "run":
        extra["timing_charts"] = timing_charts(view.performance)
    return _environment().get_template(template or f"{view.kind}.html").render(view=view, **extra)


def write_report(view: Any, html_path: Path) -> tuple[Path, Path]:
    """Write ``html_path`` and the view-model as JSON beside it (same name, ``.json``)."""
    return write_pages(Path(html_path), render_html(view), json_text(view))
