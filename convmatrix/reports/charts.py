"""The history report's charts: one per output (its worst and median bound usage per run, with
the verdict's safety line; worst and median e_rel and e_norm where no run recorded a usage)
and one for the pass rate, over the runs in time order, failing runs shaded."""

from __future__ import annotations

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
    where = f"run {run.run_id} @ {run.commit or run.label or '-'} ({run.started_at})"
    return f"{where}: {what} {value:.3g}{extra}"


def _uses_usage(view: HistoryView, output: str) -> bool:
    return any(
        (s := run.outputs.get(output)) is not None and s.worst_usage is not None
        for run in view.runs
    )


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
            values: list[float | None] = []
            tips: list[str] = []
            for run in view.runs:
                stats = run.outputs.get(output)
                value = getattr(stats, attr) if stats else None
                values.append(value)
                extra = ""
                if usage and stats is not None and attr == "worst_usage":
                    extra = f" (worst e_rel {stats.worst_rel:.3g})"
                tips.append(_tip(run, name, value, extra) if value is not None else "")
            series.append(Series(name, values, dashed=dashed, tips=tips))
        if usage:
            title = f"{view.dtype} {output}: bound usage per run"
            guides = [(f"safety x{view.safety:g}", view.safety)]
            charts.append(line_chart(title, labels, series, marks=marks, guides=guides))
        else:
            title = f"{view.dtype} {output}: errors per run (no bound usage recorded)"
            charts.append(line_chart(title, labels, series, marks=marks))
    rates = [run.pass_rate for run in view.runs]
    tips = [
        _tip(r, "pass rate", v) if v is not None else ""
        for r, v in zip(view.runs, rates, strict=True)
    ]
    charts.append(
        line_chart(
            f"{view.dtype}: pass rate per run",
            labels,
            [Series("pass rate", rates, tips=tips)],
            log_y=False,
            marks=marks,
        )
    )
    return charts
