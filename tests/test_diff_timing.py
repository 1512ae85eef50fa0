"""The timing-regression hook: the pure-Python Mann-Whitney U test against SciPy's, and the rule
(median ratio above 1.1 AND p below 0.01, only with at least 5 samples per side)."""

from __future__ import annotations

import random

import pytest
import scipy.stats as scipy_stats

from convmatrix.compare.timing.pairs import compare_timings, mann_whitney_u
from convmatrix.compare.timing.rules import TimingRule
from convmatrix.core.records import TimingResult


@pytest.mark.parametrize("seed", range(6))
def test_u_test_matches_scipy_asymptotic_with_ties(seed):
    rng = random.Random(seed)
    n1, n2 = rng.randrange(3, 30), rng.randrange(3, 30)
    # Rounded to few values so that ties are common: the tie correction must match too.
    a = [round(rng.gauss(1.0, 0.1), 1) for _ in range(n1)]
    b = [round(rng.gauss(1.05, 0.1), 1) for _ in range(n2)]
    u, p = mann_whitney_u(a, b)
    ref = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    assert u == ref.statistic  # exact: a sum of half-integer ranks
    # Both evaluate the same closed form with erfc; 1e-12 covers rounding in the two orders.
    assert p == pytest.approx(ref.pvalue, rel=1e-12, abs=1e-15)


def test_all_values_tied_gives_p_one():
    assert mann_whitney_u([1.0] * 6, [1.0] * 6)[1] == 1.0


def _timing(samples: list[float]) -> TimingResult:
    ordered = sorted(samples)
    return TimingResult(
        scope="kernel", median_s=ordered[len(ordered) // 2], min_s=ordered[0], iqr_s=0.0,
        n=len(samples), samples=samples,
    )  # fmt: skip


def _samples(rng: random.Random, center: float, n: int = 9) -> list[float]:
    return [center * (1 + 0.01 * rng.random()) for _ in range(n)]


def test_rule_flags_a_clear_slowdown_and_not_noise_or_small_changes():
    rng = random.Random(1)
    base = {"a": [_timing(_samples(rng, 1e-4))], "b": [_timing(_samples(rng, 1e-4))],
            "c": [_timing(_samples(rng, 1e-4))]}  # fmt: skip
    head = {"a": [_timing(_samples(rng, 1.3e-4))],  # 30% slower: a regression
            "b": [_timing(_samples(rng, 1.05e-4))],  # 5%: under the 1.1 ratio
            "c": [_timing(_samples(rng, 0.7e-4))]}  # faster  # fmt: skip
    out = compare_timings(base, head)
    assert [c.case_id for c in out.regressions] == ["a"]
    assert out.regressions[0].p_value < 0.01
    assert out.regressions[0].ratio == pytest.approx(1.3, rel=0.02)  # 1% jitter per side
    assert [c.case_id for c in out.improvements] == ["c"]
    assert out.unchanged == 1


def test_too_few_samples_makes_no_claim():
    rng = random.Random(2)
    base = {"a": [_timing(_samples(rng, 1e-4, n=3))]}
    head = {"a": [_timing(_samples(rng, 2e-4, n=3))]}
    out = compare_timings(base, head)
    assert out.regressions == [] and [c.case_id for c in out.not_enough_samples] == ["a"]
    assert out.not_enough_samples[0].p_value is None
    lenient = compare_timings(base, head, rule=TimingRule(min_samples=3, alpha=0.2))
    assert [c.case_id for c in lenient.regressions] == ["a"]


def test_overlapping_distributions_are_not_a_regression():
    """Medians 15% apart but samples spread +-50%: the U test does not reject."""
    rng = random.Random(3)
    base = {"a": [_timing([1e-4 * (0.5 + rng.random()) for _ in range(6)])]}
    head = {"a": [_timing([1.15e-4 * (0.5 + rng.random()) for _ in range(6)])]}
    out = compare_timings(base, head)
    assert out.regressions == []
