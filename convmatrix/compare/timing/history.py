"""Timing regressions across the nightly history: a baseline window against confirmed recent runs.

Pure functions, no I/O. A pair of runs can disagree for reasons that are not the kernel (the
machine was busy that night); a change that persists cannot. For each timing of the newest run
(matched by case id, scope and mode), with ``runs`` oldest first:

- the *recent* runs are the newest ``confirm`` (default 3, HEAD included), the *baseline* the
  up to ``window`` (default 5) runs before them, of which at least ``min_baseline`` (3) must
  hold the timing, each median from at least ``min_samples`` (5) repetitions;
- the value compared is the median divided by the same run's control median (the framework
  path measured beside it, see ``compare``) when every run involved has one, else the
  median itself;
- a regression is claimed when *every* recent value is above ``ratio`` (1.1) times the
  baseline's median value AND above the baseline's largest value (outside its whole range),
  and the raw medians agree (above ``ratio`` times the raw baseline median), so neither one
  noisy night nor a drifting control can make the claim alone.

``benchmarks/bench_timing_aa.py`` measures how often the rule fires on a history of A/A runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.compare.timing.rules import TimingRule
from convmatrix.core.records import TimingResult

__all__ = ["HistoryChange", "HistoryRule", "TimingHistory", "history_regressions"]

RunTimings = Mapping[str, Sequence[TimingResult]]  # case id -> the case's timing rows


@dataclass(frozen=True)
class HistoryRule:
    window: int = 5
    # A/A histories on a loaded shared CPU: 2 confirming runs claimed 1.6-3.9% of the timings,
    # 3 claimed none (benchmarks/bench_timing_aa.py, README "Timing").
    confirm: int = 3
    ratio: float = 1.1
    min_baseline: int = 3
    min_samples: int = 5
    control: str | None = TimingRule.control
    yardsticks: tuple[str, ...] = TimingRule.yardsticks


@dataclass
class HistoryChange:
    case_id: str
    name: str
    scope: str
    mode: str | None
    baseline_median_s: float  # median of the baseline runs' medians (raw)
    recent_median_s: list[float]  # the confirming runs' medians, oldest first (raw)
    ratio: float  # the smallest recent / baseline value (corrected when ``corrected``)
    corrected: bool  # values were divided by the control


@dataclass
class TimingHistory:
    rule: HistoryRule
    baseline_runs: list[int]
    recent_runs: list[int]
    regressions: list[HistoryChange] = field(default_factory=list)
    judged: int = 0  # timings with enough history to judge


_Key = tuple[str, str, str | None]


def _value(rows: Sequence[TimingResult], scope: str, mode: str | None,
           rule: HistoryRule) -> tuple[float | None, float | None]:  # fmt: skip
    """(median, control median) of one case's rows in one run; None where absent or thin."""
    by = {(t.scope, t.mode): t for t in rows}
    t = by.get((scope, mode))
    if t is None or len(t.samples) < rule.min_samples or t.median_s <= 0:
        return None, None
    c = None
    if rule.control is not None:
        c = by.get((rule.control, mode)) or by.get((rule.control, None))
    return t.median_s, (c.median_s if c is not None and c.median_s > 0 else None)


def _judge(key: _Key, name: str, raw: list[tuple[float, float | None]], n_recent: int,
           rule: HistoryRule) -> HistoryChange | None:  # fmt: skip
    base, recent = raw[:-n_recent], raw[-n_recent:]
    corrected = all(c is not None for _, c in raw)
    values = [v / c if corrected and c else v for v, c in raw]
    base_v, recent_v = values[:-n_recent], values[-n_recent:]
    centre, top = statistics.median(base_v), max(base_v)
    raw_centre = statistics.median(v for v, _ in base)
    if not all(v > rule.ratio * centre and v > top for v in recent_v):
        return None
    if not all(v > rule.ratio * raw_centre for v, _ in recent):
        return None
    return HistoryChange(
        case_id=key[0], name=name, scope=key[1], mode=key[2], baseline_median_s=raw_centre,
        recent_median_s=[v for v, _ in recent], ratio=min(recent_v) / centre, corrected=corrected,
    )  # fmt: skip


def history_regressions(
    runs: Sequence[tuple[int, RunTimings]],
    names: Mapping[str, str] | None = None,
    rule: HistoryRule | None = None,
) -> TimingHistory:
    """Judge the newest run's timings against the history before it (``runs`` oldest first)."""
    rule = rule or HistoryRule()
    names = names or {}
    recent = list(runs[-rule.confirm :])
    baseline = list(runs[-(rule.confirm + rule.window) : -rule.confirm]) if rule.confirm else []
    out = TimingHistory(rule, [r for r, _ in baseline], [r for r, _ in recent])
    if len(recent) < rule.confirm or len(baseline) < rule.min_baseline:
        return out
    head = recent[-1][1]
    for case_id in sorted(head):
        for scope, mode in sorted({(t.scope, t.mode or "") for t in head[case_id]}):
            if scope in rule.yardsticks:
                continue
            mode_ = mode or None
            series = [_value(t.get(case_id, ()), scope, mode_, rule) for _, t in baseline + recent]
            base_pts = [p for p in series[: len(baseline)] if p[0] is not None]
            recent_pts = series[len(baseline) :]
            if len(base_pts) < rule.min_baseline or any(p[0] is None for p in recent_pts):
                continue
            out.judged += 1
            raw = [(v, c) for v, c in base_pts + recent_pts if v is not None]
            change = _judge((case_id, scope, mode_), names.get(case_id, case_id), raw,
                            len(recent_pts), rule)  # fmt: skip
            if change is not None:
                out.regressions.append(change)
    out.regressions.sort(key=lambda c: -c.ratio)
    return out
