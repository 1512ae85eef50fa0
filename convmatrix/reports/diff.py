"""What changed between two runs (two kernel commits): cases matched by their stable id.

Error regressions use two knobs (``DiffOptions``): an output regressed when e_rel or e_norm grew
by more than ``factor`` (default 2.0) AND the new value is above a noise floor. The default
floor is half the default e_norm limit of the (dtype, output) row, i.e. 4 unit roundoffs of the
dtype (16 for the dw/db reductions): fp32 2.4e-7, fp16 2.0e-3, bf16 1.6e-2. Below it an error
doubling is one rounding going the other way, not a change in the kernel. A NaN where there was
a number is always a regression. Timing regressions come from ``timing_compare``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.core.records import BAD_OUTCOMES, CaseResult, OutputMetrics
from convmatrix.core.tolerances import DEFAULT_TOLERANCES
from convmatrix.core.verdict import judged_dtype
from convmatrix.reports.viewmodel import RunHeader, shard_lines
from convmatrix.runners.timing.compare import TimingComparison, compare_timings
from convmatrix.runners.timing.history import TimingHistory
from convmatrix.runners.timing.rules import TimingRule

__all__ = [
    "FAIL_ON",
    "DiffOptions",
    "DiffView",
    "ErrorChange",
    "OutcomeChange",
    "build_diff",
    "default_floor",
    "growth",
    "summary_text",
]

FAIL_ON = ("new-failures", "error-regression", "timing-regression", "timing-history")
_FALLBACK_FLOOR = 1e-6  # dtypes the tolerance table does not know


def default_floor(dtype: str, output: str) -> float:
    """Half the default e_norm limit of (dtype, output): 4 unit roundoffs (16 for dw, db)."""
    row = DEFAULT_TOLERANCES.get((dtype, output))
    return row.norm / 2 if row is not None else _FALLBACK_FLOOR


@dataclass(frozen=True)
class DiffOptions:
    factor: float = 2.0
    floor: float | None = None  # one floor for every dtype, overriding the defaults
    floors: Mapping[str, float] = field(default_factory=dict)  # dtype -> floor
    timing: TimingRule = field(default_factory=TimingRule)

    def floor_for(self, dtype: str, output: str) -> float:
        if dtype in self.floors:
            return self.floors[dtype]
        return self.floor if self.floor is not None else default_floor(dtype, output)


@dataclass
class OutcomeChange:
    case_id: str
    name: str
    base_outcome: str | None  # None: the case is not in that run
    head_outcome: str | None
    message: str | None  # head's message, else base's


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


@dataclass
class DiffView:
    kind: str
    base: RunHeader
    head: RunHeader
    options: dict[str, object]
    n_common: int
    new_failures: list[OutcomeChange]
    fixed: list[OutcomeChange]
    still_failing: list[OutcomeChange]
    newly_skipped: list[OutcomeChange]
    error_regressions: list[ErrorChange]
    error_improvements: list[ErrorChange]
    timing: TimingComparison
    added: list[OutcomeChange]
    removed: list[OutcomeChange]
    timing_history: TimingHistory | None = None  # ``--timing-history``: HEAD vs its lineage

    def conditions(self) -> dict[str, bool]:
        """Which ``--fail-on`` conditions hold."""
        return {
            "new-failures": bool(self.new_failures),
            "error-regression": bool(self.error_regressions),
            "timing-regression": bool(self.timing.regressions),
            "timing-history": bool(self.timing_history and self.timing_history.regressions),
        }

    @property
    def empty(self) -> bool:
        """Nothing changed at all (a run against itself)."""
        return not any(
            (self.new_failures, self.fixed, self.newly_skipped, self.error_regressions,
             self.error_improvements, self.timing.regressions, self.timing.improvements,
             self.added, self.removed)
        )  # fmt: skip


def growth(base: float, head: float) -> float:
    """head / base with NaN and zero made explicit: a new NaN grows infinitely."""
    if math.isnan(base):
        return 1.0 if math.isnan(head) else 0.0
    if math.isnan(head):
        return math.inf
    if base == 0:
        return math.inf if head > 0 else 1.0
    return head / base


def _error_change(
    result: CaseResult, b: OutputMetrics, h: OutputMetrics, opts: DiffOptions
) -> tuple[ErrorChange | None, ErrorChange | None]:
    """(regression, improvement) of one output; at most one is not None."""
    dtype = judged_dtype(h.output, result.case)
    floor = opts.floor_for(dtype, h.output)
    worse, better = [], []
    for metric in ("e_rel", "e_norm"):
        old, new = getattr(b, metric), getattr(h, metric)
        g = growth(old, new)
        if g > opts.factor and (math.isnan(new) or new > floor):
            worse.append((metric, g))
        elif g < 1 / opts.factor and (math.isnan(old) or old > floor):
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


def _outcome_change(base: CaseResult | None, head: CaseResult | None) -> OutcomeChange:
    some = head or base
    assert some is not None
    return OutcomeChange(
        case_id=some.case.id,
        name=some.case.pytest_id,
        base_outcome=base.outcome if base else None,
        head_outcome=head.outcome if head else None,
        message=(head.message if head else None) or (base.message if base else None),
    )


def _classify(view: DiffView, b: CaseResult | None, h: CaseResult | None) -> None:
    """Put one case into the outcome sections it belongs to."""
    change = _outcome_change(b, h)
    head_bad = h is not None and h.outcome in BAD_OUTCOMES
    base_bad = b is not None and b.outcome in BAD_OUTCOMES
    if b is None:
        view.added.append(change)
    if h is None:
        view.removed.append(change)
    if head_bad and not base_bad:
        view.new_failures.append(change)
    elif head_bad and base_bad:
        view.still_failing.append(change)
    elif base_bad and h is not None and h.outcome == "passed":
        view.fixed.append(change)
    elif b is not None and b.outcome == "passed" and h is not None and h.outcome == "skipped":
        view.newly_skipped.append(change)


def _compare_errors(view: DiffView, b: CaseResult, h: CaseResult, opts: DiffOptions) -> None:
    base_outputs = {m.output: m for m in b.outputs}
    for hm in h.outputs:
        bm = base_outputs.get(hm.output)
        if bm is None:
            continue
        worse, better = _error_change(h, bm, hm, opts)
        if worse:
            view.error_regressions.append(worse)
        if better:
            view.error_improvements.append(better)


def build_diff(
    base: RunHeader,
    base_results: Sequence[CaseResult],
    head: RunHeader,
    head_results: Sequence[CaseResult],
    options: DiffOptions | None = None,
) -> DiffView:
    """Every section of the diff. A case that fails in HEAD but was not in BASE counts as a new
    failure too (and is listed under added): for a CI gate, a new failing case is new."""
    opts = options or DiffOptions()
    old = {r.case.id: r for r in base_results}
    new = {r.case.id: r for r in head_results}
    view = DiffView(
        kind="diff", base=base, head=head, n_common=len(old.keys() & new.keys()),
        options={"factor": opts.factor, "floor": opts.floor, "floors": dict(opts.floors),
                 "timing_ratio": opts.timing.ratio, "timing_alpha": opts.timing.alpha,
                 "timing_min_samples": opts.timing.min_samples},
        new_failures=[], fixed=[], still_failing=[], newly_skipped=[], error_regressions=[],
        error_improvements=[], timing=TimingComparison(), added=[], removed=[],
    )  # fmt: skip
    for case_id in sorted(old.keys() | new.keys(), key=lambda i: _name(old, new, i)):
        b, h = old.get(case_id), new.get(case_id)
        _classify(view, b, h)
        if b is not None and h is not None:
            _compare_errors(view, b, h, opts)
    view.error_regressions.sort(key=lambda c: -c.growth)
    view.error_improvements.sort(key=lambda c: c.growth)
    view.timing = compare_timings(
        {i: r.timings for i, r in old.items() if r.timings},
        {i: r.timings for i, r in new.items() if r.timings},
        names={i: r.case.pytest_id for i, r in new.items()},
        rule=opts.timing,
    )
    return view


def _name(old: Mapping[str, CaseResult], new: Mapping[str, CaseResult], case_id: str) -> str:
    return (new.get(case_id) or old[case_id]).case.pytest_id


def summary_text(view: DiffView, limit: int = 10) -> str:
    """The text summary printed on stdout: counts per section and the first few entries."""
    lines = [
        f"diff {view.base.title} -> {view.head.title}",
        f"  cases: {view.n_common} in both, {len(view.added)} added, {len(view.removed)} removed",
        f"  new failures: {len(view.new_failures)}  fixed: {len(view.fixed)}  "
        f"still failing: {len(view.still_failing)}  newly skipped: {len(view.newly_skipped)}",
        f"  error regressions: {len(view.error_regressions)}  "
        f"error improvements: {len(view.error_improvements)}  (factor {view.options['factor']})",
        f"  timing regressions: {len(view.timing.regressions)}  "
        f"improvements: {len(view.timing.improvements)}  "
        f"not enough samples: {len(view.timing.not_enough_samples)}",
    ]
    for side, run in (("BASE", view.base), ("HEAD", view.head)):
        lines += [f"  {side} {line}" for line in shard_lines(run)]
    for c in view.new_failures[:limit]:
        was = c.base_outcome or "not in base"
        lines.append(f"  NEW FAILURE  {c.name} ({was} -> {c.head_outcome})")
    for e in view.error_regressions[:limit]:
        lines.append(
            f"  REGRESSION   {e.name} {e.output}: e_rel {e.base_rel:.3g} -> {e.head_rel:.3g}, "
            f"e_norm {e.base_norm:.3g} -> {e.head_norm:.3g}"
        )
    if view.timing.drift is not None:
        drift = view.timing.drift
        lines.append(f"  machine drift (framework path, median over cases): x{drift:.3f}")
    pooled = view.timing.pooled
    if pooled is not None and pooled.ratio is not None:
        verdict = "SLOWER" if pooled.slower else "FASTER" if pooled.faster else "no change"
        lines.append(
            f"  kernel as a whole: x{pooled.ratio:.3f} over {pooled.n_cases} cases "
            f"(signed-rank p={pooled.p_slower:.2g} slower, {pooled.p_faster:.2g} faster): "
            f"{verdict}; a lone timing must move beyond x{pooled.noise:.2f} (run-to-run noise), "
            f"{len(view.timing.within_noise)} within it"
        )
    for t in view.timing.regressions[:limit]:
        corrected = f", x{t.corrected_ratio:.2f} vs framework" if t.corrected_ratio else ""
        lines.append(
            f"  SLOWER       {t.name} [{t.scope}{'/' + t.mode if t.mode else ''}] "
            f"x{t.ratio:.2f} (p={t.p_value:.2g}{corrected})"
        )
    history = view.timing_history
    if history is not None:
        lines.append(
            f"  timing history: {len(history.regressions)} regressions of {history.judged} "
            f"timings (baseline runs {history.baseline_runs}, confirmed by {history.recent_runs})"
        )
        for c in history.regressions[:limit]:
            mode = "/" + c.mode if c.mode else ""
            lines.append(f"  SLOWER SINCE {c.name} [{c.scope}{mode}] x{c.ratio:.2f}")
    if view.empty:
        lines.append("  no changes")
    return "\n".join(lines)
