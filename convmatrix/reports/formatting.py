"""Numbers for people: errors, ratios, percentages and durations as reports and tables show
them, and the exact value a sortable cell carries. Pure functions, shared by the HTML
templates (as Jinja2 filters) and the text output of ``convmatrix history``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["fmt_num", "fmt_pct", "fmt_secs", "raw_value"]


def fmt_num(value: float | None, digits: int = 3) -> str:
    """Errors and ratios for people: ``1.23e-05``, ``0.0123``, ``NaN``, ``inf``, ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def fmt_secs(value: float | None) -> str:
    """Durations in the unit that keeps 3 significant digits readable."""
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def raw_value(value: Any) -> str:
    """The exact number for ``data-value`` attributes (sorting, and tests reading numbers)."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return repr(value)
