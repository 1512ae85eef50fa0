"""Timing regressions between two runs: a rank test, a minimum ratio, and a drift control.

Pure functions, no I/O. A timing of the kernel (matched by case id, scope and mode) regressed
when its median grew by more than ``ratio`` (default 1.1) AND a two-sided Mann-Whitney U test
on the stored repetitions rejects "same distribution" at ``alpha`` (default 0.01). With fewer
than ``min_samples`` (5) repetitions on either side no claim is made: the pair is reported as
"not enough samples" rather than judged on two medians. The U test uses the normal
approximation with tie correction, adequate from about 5 samples per side (Mann & Whitney 1947).

Two runs are taken minutes or days apart, and the repetitions of one case share whatever load
the machine had in that second: they are not independent draws, so a rank test alone reads a
busier machine as a slower kernel. Each timed case therefore carries a *control* measured in
the same seconds, the framework path (scope ``framework``, same mode). When both runs have it,
the claim must also hold after dividing each run's samples by its control's median: the
corrected ratio above ``ratio`` and the U test on the corrected samples below ``alpha``. A
kernel that really slowed down passes both; a machine that slowed down moves the control too.
The yardstick rows themselves (``framework``, ``memcpy``, ``fma``, ``gemm``) are never claimed as
regressions of the kernel; their moves are listed apart (``yardsticks``), as the drift they are.

Runs move more between themselves than a rank test on one second's repetitions can know, so a
timing that passes all this is finally weighed against the whole pair (``pooled``): it
is claimed when the kernel is slower as a whole (a sign test over the cases) or when it moved
beyond the pair's own run-to-run noise; otherwise it is listed as ``within_noise``.
``benchmarks/bench_timing_aa.py`` measures the false-positive rate of this rule with A/A runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.compare.timing.pooled import PooledVerdict, basis_for, pool
from convmatrix.compare.timing.rules import TimingChange, TimingRule
from convmatrix.core.records import TimingResult

__all__ = ["TimingComparison", "compare_timings", "mann_whitney_u"]


@dataclass
class TimingComparison:
    regressions: list[TimingChange] = field(default_factory=list)
    improvements: list[TimingChange] = field(default_factory=list)
    not_enough_samples: list[TimingChange] = field(default_factory=list)
    unchanged: int = 0
    yardsticks: list[TimingChange] = field(default_factory=list)  # the controls' own moves
    drift: float | None = None  # median control ratio over the cases: how the machine moved
    within_noise: list[TimingChange] = field(default_factory=list)  # passed, but not claimed
    pooled: PooledVerdict | None = None  # the pair's verdict on the kernel as a whole


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) of ``values`` and the sizes of the groups of ties."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """U statistic of ``a`` and the two-sided p-value (normal approximation, tie-corrected).

    a: (n1,) samples, b: (n2,) samples, n1, n2 >= 1. All values tied gives p = 1.
    """
    n1, n2 = len(a), len(b)
    ranks, ties = _ranks([*a, *b])
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    n = n1 + n2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12 * ((n + 1) - tie_term)
    if var <= 0:
        return u1, 1.0
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / math.sqrt(var)  # continuity correction
    p = math.erfc(max(z, 0.0) / math.sqrt(2))
    return u1, min(1.0, p)


def _change(key: tuple[str, str, str | None], name: str, base: TimingResult,
            head: TimingResult) -> TimingChange:  # fmt: skip
    return TimingChange(
        case_id=key[0], name=name, scope=key[1], mode=key[2], base_median_s=base.median_s,
        head_median_s=head.median_s,
        ratio=head.median_s / base.median_s if base.median_s > 0 else math.inf, p_value=None,
        n_base=len(base.samples), n_head=len(head.samples),
    )  # fmt: skip


def _significant(change: TimingChange, rule: TimingRule, slower: bool) -> bool:
    """Whether the move holds after dividing by the control (True when there is none)."""
    if change.corrected_ratio is None:
        return True
    moved = (
        change.corrected_ratio > rule.ratio if slower else change.corrected_ratio < 1 / rule.ratio
    )
    return moved and change.corrected_p is not None and change.corrected_p < rule.alpha


def _compare(
    key: tuple[str, str, str | None],
    name: str,
    pair: tuple[TimingResult, TimingResult],
    controls: tuple[TimingResult, TimingResult] | None,
    rule: TimingRule,
) -> tuple[str, TimingChange]:
    base, head = pair
    change = _change(key, name, base, head)
    slower, faster = change.ratio > rule.ratio, change.ratio < 1 / rule.ratio
    if not (slower or faster):
        return "unchanged", change
    if min(change.n_base, change.n_head) < rule.min_samples:
        return "not_enough_samples", change
    _, change.p_value = mann_whitney_u(base.samples, head.samples)
    if change.p_value >= rule.alpha:
        return "unchanged", change
    if controls is not None and min(c.median_s for c in controls) > 0:
        cb, ch = controls
        change.control_ratio = ch.median_s / cb.median_s
        change.corrected_ratio = change.ratio / change.control_ratio
        _, change.corrected_p = mann_whitney_u(
            [v / cb.median_s for v in base.samples], [v / ch.median_s for v in head.samples]
        )
    if not _significant(change, rule, slower):
        return "unchanged", change
    return ("regressions" if slower else "improvements"), change


def _control(rows: Mapping[tuple[str, str | None], TimingResult], mode: str | None,
             rule: TimingRule) -> TimingResult | None:  # fmt: skip
    if rule.control is None:
        return None
    return rows.get((rule.control, mode)) or rows.get((rule.control, None))


def compare_timings(
    base: Mapping[str, Sequence[TimingResult]],
    head: Mapping[str, Sequence[TimingResult]],
    names: Mapping[str, str] | None = None,
    rule: TimingRule | None = None,
) -> TimingComparison:
    """Compare the timings of cases present in both runs, matched by (case id, scope, mode).

    ``base``/``head``: case id -> that case's timings; ``names``: case id -> readable name.
    """
    rule = rule or TimingRule()
    names = names or {}
    out = TimingComparison()
    drifts, judged = [], []
    for case_id in sorted(base.keys() & head.keys()):
        base_by = {(t.scope, t.mode): t for t in base[case_id]}
        head_by = {(t.scope, t.mode): t for t in head[case_id]}
        for (scope, mode), b in base_by.items():
            h = head_by.get((scope, mode))
            if h is None:
                continue
            key, name = (case_id, scope, mode), names.get(case_id, case_id)
            if scope in rule.yardsticks:
                change = _change(key, name, b, h)
                out.yardsticks.append(change)
                if scope == rule.control:
                    drifts.append(change.ratio)
                continue
            cb, ch = _control(base_by, mode, rule), _control(head_by, mode, rule)
            controls = (cb, ch) if cb is not None and ch is not None else None
            judged.append(_compare(key, name, (b, h), controls, rule))
    out.pooled = pool([c for v, c in judged if v != "not_enough_samples"], rule)
    for verdict, change in judged:
        if verdict in ("regressions", "improvements"):
            change.basis = basis_for(out.pooled, change, verdict == "regressions")
            if change.basis is None:
                verdict = "within_noise"
        if verdict == "unchanged":
            out.unchanged += 1
        else:
            getattr(out, verdict).append(change)
    out.regressions.sort(key=lambda c: -c.ratio)
    out.improvements.sort(key=lambda c: c.ratio)
    out.yardsticks.sort(key=lambda c: -abs(math.log(c.ratio)) if 0 < c.ratio < math.inf else 0)
    out.drift = statistics.median(drifts) if drifts else None
    return out
