"""The history report's charts: one per output (its worst and median bound usage per run, with
the verdict's safety line; worst and median e_rel and e_norm where no run recorded a usage)
and one for the pass rate, over the runs in time order, failing runs shaded.

Each lineage (one kernel on one matrix and device kind) is a line of its own colour, its
median dashed: runs of two kernels joined on one line would read as one kernel changing.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from markupsafe import Markup

from convmatrix.reports.history_view import HistoryRun, HistoryView
from convmatrix.reports.svg import Series, line_chart

__all__ = ["history_charts"]

_USAGE = (("worst usage", "worst_usage", False), ("median usage", "median_usage", True))
_STATS = (
    ("worst e_rel", "worst_rel", False),
    ("median e_rel", "median_rel", True),
    ("worst e_norm", "worst_norm", False),
    ("median e_norm", "median_norm", True),
)


def _tip(run: HistoryRun, what: str, value: float, extra: str = "") -> str:
    where = f"run {run.run_id}: {run.tag} ({run.started_at})"
    return f"{where}: {what} {value:.3g}{extra}"


def _uses_usage(view: HistoryView, output: str) -> bool:
    return any(
        (s := run.outputs.get(output)) is not None and s.worst_usage is not None
        for run in view.runs
    )


def _names(view: HistoryView) -> dict[str, str]:
    """Each lineage's name in a legend: nothing when there is one, else the kernel, or the
    whole lineage where two share a kernel."""
    lineages = view.lineages
    if len(lineages) < 2:
        return dict.fromkeys(lineages, "")
    kernels = [lineage.split(" / ", 1)[0] for lineage in lineages]
    unique = len(set(kernels)) == len(kernels)
    return {lin: (k if unique else lin) + " " for lin, k in zip(lineages, kernels, strict=True)}


def _series(
    view: HistoryView,
    name: str,
    value: Callable[[HistoryRun], float | None],
    dashed: bool,
    extra: Callable[[HistoryRun], str] | None = None,
) -> list[Series]:
    """One series per lineage: its runs' values, None at the other runs' positions."""
    names = _names(view)
    out = []
    for colour, lineage in enumerate(view.lineages):
        values: list[float | None] = []
        tips: list[str] = []
        for run in view.runs:
            v = value(run) if run.lineage == lineage else None
            values.append(v)
            note = extra(run) if extra is not None else ""
            tips.append(_tip(run, name, v, note) if v is not None else "")
        out.append(Series(names[lineage] + name, values, dashed, tips, colour))
    return out


def _stat(run: HistoryRun, output: str, attr: str) -> float | None:
    stats = run.outputs.get(output)
    return getattr(stats, attr) if stats else None


def _worst_rel(run: HistoryRun, output: str) -> str:
    stats = run.outputs.get(output)
    return f" (worst e_rel {stats.worst_rel:.3g})" if stats is not None else ""


def history_charts(view: HistoryView) -> list[Markup]:
    """SVG charts for ``view``: bound usage per output (log scale, the safety line drawn),
    then the pass rate."""
    labels = [run.tag for run in view.runs]
    marks = [run.failing for run in view.runs]
    charts = []
    for output in view.outputs:
        usage = _uses_usage(view, output)
        series = []
        for name, attr, dashed in _USAGE if usage else _STATS:
            value = partial(_stat, output=output, attr=attr)
            note = partial(_worst_rel, output=output) if attr == "worst_usage" else None
            series += _series(view, name, value, dashed, note)
        if usage:
            title = f"{view.dtype} {output}: bound usage per run"
            guides = [(f"safety x{view.safety:g}", view.safety)]
            charts.append(line_chart(title, labels, series, marks=marks, guides=guides))
        else:
            title = f"{view.dtype} {output}: errors per run (no bound usage recorded)"
            charts.append(line_chart(title, labels, series, marks=marks))
    rates = _series(view, "pass rate", lambda run: run.pass_rate, dashed=False)
    charts.append(
        line_chart(f"{view.dtype}: pass rate per run", labels, rates, log_y=False, marks=marks)
    )
    return charts
