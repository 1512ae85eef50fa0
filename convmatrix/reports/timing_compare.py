"""Timing regressions between two runs: the hook the timing work will replace.

Pure functions, no I/O. The rule is deliberately simple and honest: a timing regressed when the
median grew by more than ``ratio`` (default 1.1) AND a two-sided Mann-Whitney U test on the
stored repetitions rejects "same distribution" at ``alpha`` (default 0.01). With fewer than
``min_samples`` (5) repetitions on either side no claim is made: the pair is reported as
"not enough samples" rather than judged on two medians. The U test uses the normal
approximation with tie correction, adequate from about 5 samples per side (Mann & Whitney 1947).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from convmatrix.runners.results import TimingResult

__all__ = ["TimingChange", "TimingComparison", "TimingRule", "compare_timings", "mann_whitney_u"]


@dataclass(frozen=True)
class TimingRule:
    ratio: float = 1.1  # median(head) / median(base) above this is slower
    alpha: float = 0.01  # significance of the U test
    min_samples: int = 5


@dataclass
class TimingChange:
    case_id: str
    name: str
    scope: str
    mode: str | None
    base_median_s: float
    head_median_s: float
    ratio: float  # head / base
    p_value: float | None  # None when not tested (too few samples)
    n_base: int
    n_head: int


@dataclass
class TimingComparison:
    regressions: list[TimingChange] = field(default_factory=list)
    improvements: list[TimingChange] = field(default_factory=list)
    not_enough_samples: list[TimingChange] = field(default_factory=list)
    unchanged: int = 0


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


def _compare(
    key: tuple[str, str, str | None],
    name: str,
    base: TimingResult,
    head: TimingResult,
    rule: TimingRule,
) -> tuple[str, TimingChange]:
    ratio = head.median_s / base.median_s if base.median_s > 0 else math.inf
    change = TimingChange(
        case_id=key[0],
        name=name,
        scope=key[1],
        mode=key[2],
        base_median_s=base.median_s,
        head_median_s=head.median_s,
        ratio=ratio,
        p_value=None,
        n_base=len(base.samples),
        n_head=len(head.samples),
    )
    slower, faster = ratio > rule.ratio, ratio < 1 / rule.ratio
    if not (slower or faster):
        return "unchanged", change
    if min(change.n_base, change.n_head) < rule.min_samples:
        return "not_enough_samples", change
    _, change.p_value = mann_whitney_u(base.samples, head.samples)
    if change.p_value >= rule.alpha:
        return "unchanged", change
    return ("regressions" if slower else "improvements"), change


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
    for case_id in sorted(base.keys() & head.keys()):
        head_by = {(t.scope, t.mode): t for t in head[case_id]}
        for b in base[case_id]:
            h = head_by.get((b.scope, b.mode))
            if h is None:
                continue
            key = (case_id, b.scope, b.mode)
            verdict, change = _compare(key, names.get(case_id, case_id), b, h, rule)
            if verdict == "unchanged":
                out.unchanged += 1
            else:
                getattr(out, verdict).append(change)
    out.regressions.sort(key=lambda c: -c.ratio)
    out.improvements.sort(key=lambda c: c.ratio)
    return out
