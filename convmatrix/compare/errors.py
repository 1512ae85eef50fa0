"""The error rule: whether one output of one case got worse (or better) from base to head.

An output regressed when e_rel or e_norm grew by more than ``factor`` (default 2.0) AND the new
value is above a noise floor. The default floor is half the default e_norm limit of the (dtype,
output) row, i.e. 4 unit roundoffs of the dtype (16 for the dw/db reductions): fp32 2.4e-7, fp16
2.0e-3, bf16 1.6e-2. Below it an error doubling is one rounding going the other way, not a change
in the kernel. A NaN where there was a number is always a regression.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from convmatrix.core.records import CaseResult, OutputMetrics
from convmatrix.core.tolerances import DEFAULT_TOLERANCES
from convmatrix.core.verdict import judged_dtype

__all__ = ["ErrorChange", "ErrorRule", "default_floor", "error_change", "growth"]

_FALLBACK_FLOOR = 1e-6  # dtypes the tolerance table does not know


def default_floor(dtype: str, output: str) -> float:
    """Half the default e_norm limit of (dtype, output): 4 unit roundoffs (16 for dw, db)."""
    row = DEFAULT_TOLERANCES.get((dtype, output))
    return row.norm / 2 if row is not None else _FALLBACK_FLOOR


@dataclass(frozen=True)
class ErrorRule:
    """An output regressed when a metric grew by more than ``factor`` and ends above a floor."""

    factor: float = 2.0
    floor: float | None = None  # one floor for every dtype, overriding the defaults
    floors: Mapping[str, float] = field(default_factory=dict)  # dtype -> floor

    def floor_for(self, dtype: str, output: str) -> float:
        if dtype in self.floors:
            return self.floors[dtype]
        return self.floor if self.floor is not None else default_floor(dtype, output)


@dataclass
class ErrorChange:
    """One output whose errors moved by more than the factor (both metrics shown)."""

    case_id: str
    name: str
    dtype: str
    output: str
    metrics: list[str]  # which of e_rel, e_norm crossed the rule
    base_rel: float
    head_rel: float
    base_norm: float
    head_norm: float
    growth: float  # the largest head/base among ``metrics`` (0 or inf at NaN transitions)
    floor: float
    base_usage: float | None = None  # bound usage (docs/spec.md §4), None where not recorded
    head_usage: float | None = None


def growth(base: float, head: float) -> float:
    """head / base with NaN and zero made explicit: a new NaN grows infinitely."""
    if math.isnan(base):
        return 1.0 if math.isnan(head) else 0.0
    if math.isnan(head):
        return math.inf
    if base == 0:
        return math.inf if head > 0 else 1.0
    return head / base


def error_change(
    result: CaseResult, b: OutputMetrics, h: OutputMetrics, rule: ErrorRule
) -> tuple[ErrorChange | None, ErrorChange | None]:
    """(regression, improvement) of one output; at most one is not None."""
    dtype = judged_dtype(h.output, result.case)
    floor = rule.floor_for(dtype, h.output)
    worse, better = [], []
    for metric in ("e_rel", "e_norm"):
        old, new = getattr(b, metric), getattr(h, metric)
        g = growth(old, new)
        if g > rule.factor and (math.isnan(new) or new > floor):
            worse.append((metric, g))
        elif g < 1 / rule.factor and (math.isnan(old) or old > floor):
            better.append((metric, g))
    picked = worse or better
    if not picked:
        return None, None
    change = ErrorChange(
        case_id=result.case.id,
        name=result.case.pytest_id,
        dtype=dtype,
        output=h.output,
        metrics=[m for m, _ in picked],
        base_rel=b.e_rel,
        head_rel=h.e_rel,
        base_norm=b.e_norm,
        head_norm=h.e_norm,
        growth=max(g for _, g in picked) if worse else min(g for _, g in picked),
        floor=floor,
        base_usage=b.bound_usage,
        head_usage=h.bound_usage,
    )
    return (change, None) if worse else (None, change)
