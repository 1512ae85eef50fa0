"""A tiny inline-SVG line chart: no JavaScript library, no network, opens from disk.

Errors span many decades (1e-8 for fp32 to 1e-2 for bf16), so the y axis is logarithmic by
default. Points carry a ``<title>`` (the browser shows it on hover). Non-finite values (a NaN
error is stored as +inf) are drawn at the top edge as a cross, zeros at the bottom edge.
Every piece of text goes through ``markupsafe.escape``: labels come from kernels and commits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

__all__ = ["Series", "line_chart"]

_COLOURS = ("#1f5fa8", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#2c7a7b")
_W, _H = 720, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 150, 24, 46


@dataclass
class Series:
    name: str
    values: list[float | None]  # one per x position; None = no point
    dashed: bool = False
    tips: list[str] = field(default_factory=list)  # hover text per point
    colour: int | None = None  # index into the palette; None: the series' position


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.0e}" if v < 1e-2 or v >= 1e3 else f"{v:g}"


def _y_range(series: Sequence[Series], log: bool) -> tuple[float, float]:
    finite = [v for s in series for v in s.values if v is not None and math.isfinite(v)]
    if log:
        finite = [v for v in finite if v > 0]
        if not finite:
            return -8.0, 0.0
        lo, hi = math.floor(math.log10(min(finite))), math.ceil(math.log10(max(finite)))
        return float(lo), float(max(hi, lo + 1))
    if not finite:
        return 0.0, 1.0
    lo, hi = min(0.0, min(finite)), max(finite)
    return lo, hi if hi > lo else lo + 1.0


def _y_ticks(lo: float, hi: float, log: bool) -> list[tuple[float, str]]:
    if log:
        step = max(1, math.ceil((hi - lo) / 6))
        return [(e, f"1e{int(e)}") for e in range(int(lo), int(hi) + 1, step)]
    return [(lo + (hi - lo) * i / 4, _fmt(lo + (hi - lo) * i / 4)) for i in range(5)]


def line_chart(
    title: str,
    x_labels: Sequence[str],
    series: Sequence[Series],
    *,
    log_y: bool = True,
    marks: Sequence[bool] = (),
    mark_label: str = "failing run",
    guides: Sequence[tuple[str, float]] = (),
) -> Markup:
    """An SVG chart of ``series`` over ``x_labels``; ``marks[i]`` shades x position i in red;
    ``guides`` are horizontal lines (label, y), such as the verdict's limit, always in range."""
    n = max(len(x_labels), 1)
    lo, hi = _y_range([*series, Series("", [y for _, y in guides])], log_y)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x_at(i: int) -> float:
        return _LEFT + (plot_w * (i + 0.5) / n)

    def y_at(v: float) -> float:
        if not math.isfinite(v):
            return _TOP
        t = (math.log10(v) if v > 0 else lo) if log_y else v
        t = min(max(t, lo), hi)
        return _TOP + plot_h * (1 - (t - lo) / (hi - lo))

    out = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">',
        f'<text x="{_LEFT}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    band = plot_w / n
    for i, marked in enumerate(marks):
        if marked:
            out.append(
                f'<rect class="mark" x="{x_at(i) - band / 2:.1f}" y="{_TOP}" width="{band:.1f}" '
                f'height="{plot_h}" fill="#fde2e2"><title>{escape(mark_label)}: '
                f"{escape(x_labels[i])}</title></rect>"
            )
    for t, label in _y_ticks(lo, hi, log_y):
        y = y_at(10**t) if log_y else y_at(t)
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>'
        )
    every = max(1, math.ceil(n / 12))
    for i, label in enumerate(x_labels):
        if i % every == 0:
            out.append(
                f'<text x="{x_at(i):.1f}" y="{_TOP + plot_h + 14}" text-anchor="end" '
                f'transform="rotate(-30 {x_at(i):.1f} {_TOP + plot_h + 14})">'
                f"{escape(label[:14])}</text>"
            )
    for label, value in guides:
        y = y_at(value)
        out.append(
            f'<g class="guide" data-value="{value!r}"><line x1="{_LEFT}" x2="{_LEFT + plot_w}" '
            f'y1="{y:.1f}" y2="{y:.1f}" stroke="#c53030" stroke-dasharray="2 3"/>'
            f'<text x="{_LEFT + plot_w + 4}" y="{y + 4:.1f}" fill="#c53030">{escape(label)}'
            f"</text><title>{escape(label)}</title></g>"
        )
    for k, s in enumerate(series):
        out.extend(_series_svg(k, s, x_at, y_at, plot_w))
    out.append(
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#999"/></svg>'
    )
    return Markup("".join(out))


def _series_svg(
    k: int, s: Series, x_at: Callable[[int], float], y_at: Callable[[float], float], plot_w: float
) -> list[str]:
    colour = _COLOURS[(k if s.colour is None else s.colour) % len(_COLOURS)]
    dash = ' stroke-dasharray="5 3"' if s.dashed else ""
    points = [(i, v) for i, v in enumerate(s.values) if v is not None]
    path = " ".join(f"{x_at(i):.1f},{y_at(v):.1f}" for i, v in points)
    out = [
        f'<polyline class="series" data-series="{escape(s.name)}" fill="none" '
        f'stroke="{colour}" stroke-width="1.6"{dash} points="{path}"/>'
    ]
    for i, v in points:
        tip = s.tips[i] if i < len(s.tips) else f"{s.name}: {v:.3g}"
        x, y = x_at(i), y_at(v)
        shape = (
            f'<path d="M{x - 4:.1f},{y - 4:.1f}l8,8m0,-8l-8,8" stroke="{colour}"/>'
            if not math.isfinite(v)
            else f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{colour}"/>'
        )
        out.append(f"<g>{shape}<title>{escape(tip)}</title></g>")
    ly = _TOP + 14 + 16 * k
    lx = _LEFT + plot_w + 10
    out.append(
        f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" '
        f'stroke-width="2"{dash}/><text x="{lx + 22}" y="{ly}">{escape(s.name)}</text>'
    )
    return out
