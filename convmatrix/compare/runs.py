"""Two runs compared case by case (matched by stable id): outcome sections, error changes under
the error rule (``compare.errors``: bound usage, or e_rel/e_norm where usage cannot judge),
timing changes under the timing rule (``compare.timing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.compare.errors import Declared, ErrorChange, ErrorRule, error_change
from convmatrix.compare.timing.history import TimingHistory
from convmatrix.compare.timing.pairs import TimingComparison, compare_timings
from convmatrix.compare.timing.rules import TimingRule
from convmatrix.core.records import BAD_OUTCOMES, CaseResult

__all__ = ["FAIL_ON", "DiffOptions", "OutcomeChange", "RunComparison", "compare_runs"]

FAIL_ON = ("new-failures", "error-regression", "timing-regression", "timing-history")


@dataclass(frozen=True)
class DiffOptions:
    """The rules two runs are compared by."""

    errors: ErrorRule = field(default_factory=ErrorRule)
    timing: TimingRule = field(default_factory=TimingRule)


@dataclass
class OutcomeChange:
    case_id: str
    name: str
    base_outcome: str | None  # None: the case is not in that run
    head_outcome: str | None
    message: str | None  # head's message, else base's


@dataclass
class RunComparison:
    """Every section of a comparison of two runs (base, head)."""

    options: dict[str, object] = field(default_factory=dict)
    n_common: int = 0
    new_failures: list[OutcomeChange] = field(default_factory=list)
    fixed: list[OutcomeChange] = field(default_factory=list)
    still_failing: list[OutcomeChange] = field(default_factory=list)
    newly_skipped: list[OutcomeChange] = field(default_factory=list)
    error_regressions: list[ErrorChange] = field(default_factory=list)
    error_improvements: list[ErrorChange] = field(default_factory=list)
    timing: TimingComparison = field(default_factory=TimingComparison)
    added: list[OutcomeChange] = field(default_factory=list)
    removed: list[OutcomeChange] = field(default_factory=list)
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


def _classify(view: RunComparison, b: CaseResult | None, h: CaseResult | None) -> None:
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


def _compare_errors(
    view: RunComparison,
    b: CaseResult,
    h: CaseResult,
    opts: DiffOptions,
    declared: tuple[Declared | None, Declared | None],
) -> None:
    base_outputs = {m.output: m for m in b.outputs}
    for hm in h.outputs:
        bm = base_outputs.get(hm.output)
        if bm is None:
            continue
        worse, better = error_change(h, bm, hm, opts.errors, declared)
        if worse:
            view.error_regressions.append(worse)
        if better:
            view.error_improvements.append(better)


def compare_runs(
    base_results: Sequence[CaseResult],
    head_results: Sequence[CaseResult],
    options: DiffOptions | None = None,
    *,
    declared: tuple[Declared | None, Declared | None] = (None, None),
) -> RunComparison:
    """Every section. A case that fails in HEAD but was not in BASE counts as a new failure too
    (and is listed under added): for a CI gate, a new failing case is new. ``declared``: the
    arithmetic each run's kernel declared (``Declared.of(Recorded.of(RunMeta.options).arithmetic)``,
    ``core.recorded``),
    where known; where they differ the error rule falls back to e_rel/e_norm."""
    opts = options or DiffOptions()
    old = {r.case.id: r for r in base_results}
    new = {r.case.id: r for r in head_results}
    view = RunComparison(
        n_common=len(old.keys() & new.keys()),
        options={"factor": opts.errors.factor, "floor": opts.errors.floor_for(""),
                 "floors": dict(opts.errors.floors), "fallback_factor": opts.errors.fallback_factor,
                 "error_rule": opts.errors.describe(),
                 "timing_ratio": opts.timing.ratio, "timing_alpha": opts.timing.alpha,
                 "timing_min_samples": opts.timing.min_samples},
    )  # fmt: skip
    for case_id in sorted(old.keys() | new.keys(), key=lambda i: _name(old, new, i)):
        b, h = old.get(case_id), new.get(case_id)
        _classify(view, b, h)
        if b is not None and h is not None:
            _compare_errors(view, b, h, opts, declared)
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
