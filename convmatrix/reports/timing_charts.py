"""SVG charts of the run report's sweeps (``timing_view.SweepChart``), drawn by ``svg``.

The x positions are the sweep's values in order, evenly spaced: the length sweeps grow
geometrically, so even spacing reads as a log axis for bytes; the y axis (seconds) is log.
Each series' legend carries its fitted log-log slope (bytes) or cost per extra tile (tiles).
"""

from __future__ import annotations

from markupsafe import Markup

from convmatrix.reports.svg import Series, line_chart
from convmatrix.reports.timing_view import PerformanceSection, SweepChart, SweepSeries

__all__ = ["sweep_chart", "timing_charts"]


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _secs(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _legend(s: SweepSeries) -> str:
    """Short enough for the legend column: the title says what the number is."""
    if s.slope is not None:
        return f"{s.scope} {s.slope:.2f}"
    if s.per_tile_s is not None:
        return f"{s.scope} +{_secs(s.per_tile_s)}"
    return s.scope


def sweep_chart(chart: SweepChart) -> Markup:
    label = _bytes if chart.kind == "bytes" else (lambda v: f"{v:g}")
    labels = [label(x) for x in chart.x]
    series = []
    for s in chart.series:
        by_x = dict(zip(s.x, s.median_s, strict=True))
        values = [by_x.get(x) for x in chart.x]
        tips = [
            f"{s.scope} at {label(x)}: {_secs(v)}" if v is not None else ""
            for x, v in zip(chart.x, values, strict=True)
        ]
        series.append(Series(_legend(s), values, dashed=s.scope == "memcpy", tips=tips))
    key = "legend: log-log slope" if chart.kind == "bytes" else "+ per tile"
    return line_chart(f"{chart.title} ({key})", labels, series, log_y=True)


def timing_charts(summary: PerformanceSection | None) -> list[Markup]:
    return [] if summary is None else [sweep_chart(c) for c in summary.charts]
