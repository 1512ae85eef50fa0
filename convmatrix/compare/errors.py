"""The error rule: whether one output of one case got worse (or better) from base to head.

One measure, the verdict's: the bound usage (``OutputMetrics.bound_usage``, max over elements
of |a - r| / bound, docs/spec.md §4). An output regressed when its usage grew by more than
``factor`` AND ends above the usage ``floor``; it improved when its usage fell by more than
``factor`` from above the floor. Both numbers were chosen with
``benchmarks/bench_regression_rule.py`` (docs/regression-rule.md): on the nightly matrix and at
production's reduction lengths, sums reordered, compensated or done in float64, and swaps
between kernels of one declared arithmetic, move an honest kernel's usage by at most x7.6
among outputs ending above the floor (float64 sums to FP32 ones; every factor from 8 up
raises none), while a defect that stays under its bound moves it by x100 to x4000.
Below the floor a change is the rounding of a few elements going the other way. A kernel that
declares itself nondeterministic is judged by the same rule: what differs from one of its runs
to the next is the order of its sums, the change the rule is chosen to tolerate (two runs of
``ShuffledSums`` in the benchmark).

An element expected exactly 0 that comes out non-zero is counted apart from the usage
(``broken_zeros``): more of them in head than in base is a regression by itself, as a new NaN
is (an infinite growth).

The usage of two runs means the same only under one bound: where either side recorded none
(rows written before the bound model, an exact output) or the two kernels declare different
arithmetic (the bound follows the declaration: the ``torch`` path's ``intermediate="input"``
allows its outputs more than an FP32 kernel's), the rule falls back to the e_rel/e_norm rule
it replaces: e_rel or e_norm grew by more than ``fallback_factor`` (2) and ends above half the
default e_norm limit of the (dtype, output) row, 4 unit roundoffs (16 for the dw/db
reductions): fp32 2.4e-7, fp16 2.0e-3, bf16 1.6e-2. ``ErrorChange.measure`` says which rule
judged, ``why`` why it was not the usage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from convmatrix.core.records import CaseResult, OutputMetrics
from convmatrix.core.tolerances import DEFAULT_TOLERANCES
from convmatrix.core.verdict import broken_zeros_text, judged_dtype

__all__ = [
    "DEFAULT_FACTOR",
    "DEFAULT_FLOOR",
    "FALLBACK_FACTOR",
    "Declared",
    "ErrorChange",
    "ErrorRule",
    "error_change",
    "growth",
    "noise_level",
]

# Chosen with benchmarks/bench_regression_rule.py on the nightly matrix (docs/regression-rule.md).
DEFAULT_FACTOR = 16.0
DEFAULT_FLOOR = 0.1  # a bound usage
FALLBACK_FACTOR = 2.0  # the e_rel/e_norm rule, where usage cannot judge
_FALLBACK_FLOOR = 1e-6  # dtypes the tolerance table does not know


def noise_level(dtype: str, output: str) -> float:
    """The fallback rule's floor: half the default e_norm limit of (dtype, output), 4 unit
    roundoffs (16 for dw, db)."""
    row = DEFAULT_TOLERANCES.get((dtype, output))
    return row.norm / 2 if row is not None else _FALLBACK_FLOOR


@dataclass(frozen=True)
class Declared:
    """The arithmetic a run's kernel declared (``Capabilities``: ``accumulate``,
    ``intermediate``, ``deterministic``), as the run records it in
    ``RunMeta.options["facts"]["arithmetic"]``. The bound, so the usage, follows the first two."""

    accumulate: str = "float32"
    intermediate: str = "fp32"
    deterministic: bool = True

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> Declared | None:
        """From a run's record; None for a run that recorded none (before 0008's code)."""
        if not data:
            return None
        return cls(
            accumulate=str(data.get("accumulate", cls.accumulate)),
            intermediate=str(data.get("intermediate", cls.intermediate)),
            deterministic=bool(data.get("deterministic", cls.deterministic)),
        )

    def same_bound(self, other: Declared) -> bool:
        return (self.accumulate, self.intermediate) == (other.accumulate, other.intermediate)

    def text(self) -> str:
        return f"accumulate {self.accumulate}, intermediate {self.intermediate}"


@dataclass(frozen=True)
class ErrorRule:
    """An output regressed when its bound usage grew by more than ``factor`` and ends above a
    usage floor (``floor`` for every dtype, ``floors`` per judged dtype; default
    ``DEFAULT_FLOOR``); where usage cannot judge, when e_rel or e_norm grew by more than
    ``fallback_factor`` above the dtype's noise level (``noise_level``)."""

    factor: float = DEFAULT_FACTOR
    floor: float | None = None  # a bound usage, for every dtype
    floors: Mapping[str, float] = field(default_factory=dict)  # judged dtype -> usage floor
    fallback_factor: float = FALLBACK_FACTOR

    def floor_for(self, dtype: str, output: str = "") -> float:
        """The usage floor of outputs judged in ``dtype``."""
        if dtype in self.floors:
            return self.floors[dtype]
        return self.floor if self.floor is not None else DEFAULT_FLOOR

    def describe(self) -> str:
        """The rule in words, for the diff's header."""
        floors = "".join(f"; {d} {f:g}" for d, f in self.floors.items())
        return (
            f"bound usage grew by more than x{self.factor:g} and ends above "
            f"{self.floor_for(''):g}{floors}"
        )


@dataclass
class ErrorChange:
    """One output whose error moved by more than the factor: its usage before and after, and
    e_rel/e_norm beside it for display (they judge only where ``measure`` is ``e_rel``)."""

    case_id: str
    name: str
    dtype: str
    output: str
    metrics: list[str]  # what crossed the rule: usage, broken_zeros; or e_rel, e_norm
    base_rel: float
    head_rel: float
    base_norm: float
    head_norm: float
    growth: float  # head/base of the measure that judged (0 or inf at NaN transitions)
    floor: float  # the floor applied, in that measure
    base_usage: float | None = None  # bound usage (docs/spec.md §4), None where not recorded
    head_usage: float | None = None
    measure: str = "usage"  # "usage", or "e_rel": the fallback (e_rel and e_norm) judged
    factor: float = DEFAULT_FACTOR  # the factor applied
    why: str | None = None  # why the fallback judged instead of the usage
    base_zeros: int | None = None  # elements expected exactly 0 that came out non-zero
    head_zeros: int | None = None

    def text(self) -> str:
        """The change in words: the usage before and after with e_rel beside it, or, where
        e_rel/e_norm judged, those and why."""
        parts = []
        if "broken_zeros" in self.metrics:
            parts.append(f"{broken_zeros_text(self.head_zeros or 0)} (base {self.base_zeros or 0})")
        if self.measure == "usage":
            grew = "" if "usage" not in self.metrics else f" (x{_num(self.growth)})"
            parts.append(f"usage {_num(self.base_usage)} -> {_num(self.head_usage)}{grew}")
            parts.append(f"e_rel {_num(self.base_rel)} -> {_num(self.head_rel)}")
        else:
            parts.append(
                f"e_rel {_num(self.base_rel)} -> {_num(self.head_rel)}, e_norm "
                f"{_num(self.base_norm)} -> {_num(self.head_norm)} (x{_num(self.growth)}; "
                f"by e_rel/e_norm: {self.why})"
            )
            if self.base_usage is not None or self.head_usage is not None:
                parts.append(f"usage {_num(self.base_usage)} -> {_num(self.head_usage)}")
        return "; ".join(parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def growth(base: float, head: float) -> float:
    """head / base with NaN and zero made explicit: a new NaN grows infinitely."""
    if math.isnan(base):
        return 1.0 if math.isnan(head) else 0.0
    if math.isnan(head):
        return math.inf
    if base == 0:
        return math.inf if head > 0 else 1.0
    return head / base


def _usage_verdict(
    b: OutputMetrics, h: OutputMetrics, rule: ErrorRule, floor: float
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(worse, better) as (metric, growth) pairs under the usage rule."""
    assert b.bound_usage is not None and h.bound_usage is not None
    worse, better = [], []
    g = growth(b.bound_usage, h.bound_usage)
    if g > rule.factor and h.bound_usage > floor:
        worse.append(("usage", g))
    elif g < 1 / rule.factor and b.bound_usage > floor:
        better.append(("usage", g))
    old, new = b.broken_zeros or 0, h.broken_zeros or 0
    if new > old:
        worse.append(("broken_zeros", math.inf))
    elif old > new and not worse:
        better.append(("broken_zeros", 0.0))
    return worse, better


def _fallback_verdict(
    b: OutputMetrics, h: OutputMetrics, factor: float, floor: float
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(worse, better) under the e_rel/e_norm rule."""
    worse, better = [], []
    for metric in ("e_rel", "e_norm"):
        old, new = getattr(b, metric), getattr(h, metric)
        g = growth(old, new)
        if g > factor and (math.isnan(new) or new > floor):
            worse.append((metric, g))
        elif g < 1 / factor and (math.isnan(old) or old > floor):
            better.append((metric, g))
    return worse, better


def _why_not_usage(
    b: OutputMetrics, h: OutputMetrics, declared: tuple[Declared | None, Declared | None]
) -> str | None:
    """Why the usage cannot judge this pair of outputs (None: it can)."""
    missing = [side for side, m in (("base", b), ("head", h)) if m.bound_usage is None]
    if missing:
        return f"no bound usage recorded in {' and '.join(missing)}"
    base, head = declared
    if base is not None and head is not None and not base.same_bound(head):
        return f"declared arithmetic differs (base {base.text()}; head {head.text()})"
    return None


def error_change(
    result: CaseResult,
    b: OutputMetrics,
    h: OutputMetrics,
    rule: ErrorRule,
    declared: tuple[Declared | None, Declared | None] = (None, None),
) -> tuple[ErrorChange | None, ErrorChange | None]:
    """(regression, improvement) of one output; at most one is not None. ``declared``: the
    arithmetic each run's kernel declared, where the runs recorded it."""
    dtype = judged_dtype(h.output, result.case)
    why = _why_not_usage(b, h, declared)
    if why is None:
        measure, factor, floor = "usage", rule.factor, rule.floor_for(dtype, h.output)
        worse, better = _usage_verdict(b, h, rule, floor)
    else:
        measure, factor, floor = "e_rel", rule.fallback_factor, noise_level(dtype, h.output)
        worse, better = _fallback_verdict(b, h, factor, floor)
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
        measure=measure,
        factor=factor,
        why=why,
        base_zeros=b.broken_zeros,
        head_zeros=h.broken_zeros,
    )
    return (change, None) if worse else (None, change)
