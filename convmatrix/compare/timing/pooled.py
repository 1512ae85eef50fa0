"""What a whole pair of runs says about the kernel's speed: a pooled test and a noise band.

Pure functions, no I/O. The rank test of one timing (``timing_compare``) sees only that timing's
repetitions, which share the load of one second; between two runs a timing moves by more than
that (A/A runs on a shared 2-core host: a median moved x1.2 typically, x1.6 at the 90th
percentile). The run pair itself measures that noise, because most timings of an A/A pair and
every timing of a uniformly slowed kernel move together:

- *kernel-wide*: each case's change is the median over its timings of the log effective ratio
  (control-corrected where there is a control). A one-sided Wilcoxon signed-rank test on those
  changes minus log(``ratio``) asks whether the cases moved beyond ``ratio`` (1.1) as a whole
  (H0: the changes are symmetric about a centre at most log(``ratio``)); slower when its exact
  p-value is below ``alpha``, which takes at least 7 cases at 0.01. The kernel as a whole being
  slower makes every timing that passed its own test a claim.
- *beyond the noise*: otherwise a timing is claimed only when its effective change is outside
  the pair's band ``exp(noise_z * sigma)``, sigma the robust spread (1.4826 x MAD) of the log
  effective ratios around their median: a case that slowed while the rest did not. The band
  adapts to the host: quiet (sigma x1.02) it would be about x1.13, on a loaded shared CPU about
  x2, and it is never narrower than ``min_noise`` (x1.25);
  a smaller case-specific change needs the history rule (``timing_history``), which asks for
  it to persist over consecutive runs.

With fewer than ``min_cases`` (5) cases there is no estimate of the noise and the per-timing
rule stands alone.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from convmatrix.compare.timing.rules import TimingChange, TimingRule

__all__ = ["PooledVerdict", "basis_for", "effective_ratio", "pool", "signed_rank_test"]


@dataclass
class PooledVerdict:
    n_cases: int
    ratio: float | None = None  # median over cases of their median effective ratio
    above: int = 0  # cases whose change exceeds the rule's ratio
    below: int = 0  # cases whose change is under 1 / ratio
    p_slower: float | None = None
    p_faster: float | None = None
    slower: bool = False  # the kernel as a whole is slower
    faster: bool = False
    noise: float | None = None  # band a single timing must leave: exp(noise_z * sigma)


# The exact count is a dynamic programme over sum(ranks) ~ n^2 totals for each of n ranks:
# O(n^3), 0.1 s at 50 cases and about a minute at 500 (a nightly diff has hundreds). Above
# this the normal approximation is used; at n = 50 it is within 1e-3 of the exact p-value in
# the tail that matters (test_perf_rules).
EXACT_MAX_N = 50


def signed_rank_test(values: Sequence[float]) -> float:
    """One-sided Wilcoxon signed-rank p-value for "the values are centred above 0": the exact
    P(W+ >= observed) under H0 (symmetric about 0), by counting the 2^n sign patterns with a
    dynamic programme over doubled (integer) average ranks, for up to ``EXACT_MAX_N`` non-zero
    values, the normal approximation above; zeros are dropped."""
    nonzero = [v for v in values if v != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(nonzero[i]))
    ranks = [0] * n  # doubled average ranks: integers even with ties
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(nonzero[order[j + 1]]) == abs(nonzero[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = i + j + 2
        i = j + 1
    observed = sum(r for r, v in zip(ranks, nonzero, strict=True) if v > 0)
    if n > EXACT_MAX_N:
        return _normal_upper_tail(observed, ranks)
    counts = [0] * (sum(ranks) + 1)
    counts[0] = 1
    reach = 0
    for r in ranks:
        reach += r
        for total in range(reach, r - 1, -1):
            counts[total] += counts[total - r]
    return sum(counts[observed:]) / 2**n


def _normal_upper_tail(observed: int, ranks: Sequence[int]) -> float:
    """P(W+ >= observed) by the normal approximation, on doubled ranks: under H0 each rank
    joins W+ with probability 1/2, so the mean is sum(r)/2 and the variance sum(r^2)/4 (this
    is the tie-corrected variance, ranks being average ranks); continuity-corrected by half a
    rank step (1 in doubled units)."""
    mean = sum(ranks) / 2
    sd = math.sqrt(sum(r * r for r in ranks) / 4)
    return 0.5 * math.erfc((observed - 1 - mean) / sd / math.sqrt(2))


def effective_ratio(change: TimingChange) -> float:
    """The control-corrected ratio where a control was measured, else the raw one."""
    return change.corrected_ratio if change.corrected_ratio is not None else change.ratio


def _logs(changes: Sequence[TimingChange]) -> list[tuple[str, float]]:
    out = []
    for c in changes:
        r = effective_ratio(c)
        if 0 < r < math.inf:
            out.append((c.case_id, math.log(r)))
    return out


def pool(changes: Sequence[TimingChange], rule: TimingRule) -> PooledVerdict:
    """The pair's verdict on the kernel from every compared (non-yardstick) timing."""
    logs = _logs(changes)
    by_case: dict[str, list[float]] = defaultdict(list)
    for case_id, value in logs:
        by_case[case_id].append(value)
    verdict = PooledVerdict(n_cases=len(by_case))
    if len(by_case) < rule.min_cases:
        return verdict
    per_case = [statistics.median(v) for v in by_case.values()]
    limit = math.log(rule.ratio)
    verdict.ratio = math.exp(statistics.median(per_case))
    verdict.above = sum(v > limit for v in per_case)
    verdict.below = sum(v < -limit for v in per_case)
    verdict.p_slower = signed_rank_test([v - limit for v in per_case])
    verdict.p_faster = signed_rank_test([-limit - v for v in per_case])
    verdict.slower = verdict.p_slower < rule.alpha
    verdict.faster = verdict.p_faster < rule.alpha
    centre = statistics.median(v for _, v in logs)
    sigma = 1.4826 * statistics.median(abs(v - centre) for _, v in logs)
    verdict.noise = max(math.exp(rule.noise_z * sigma), rule.min_noise)
    return verdict


def basis_for(verdict: PooledVerdict, change: TimingChange, slower: bool) -> str | None:
    """Why a timing that passed its own test is claimed (None: it is within the noise)."""
    if verdict.noise is None:
        return "per-timing test (too few cases to estimate the run-to-run noise)"
    if verdict.slower if slower else verdict.faster:
        return "kernel-wide change (signed-rank test over cases)"
    r = effective_ratio(change)
    if (r > verdict.noise) if slower else (r < 1 / verdict.noise):
        return f"beyond the run-to-run noise (x{verdict.noise:.2f})"
    return None
