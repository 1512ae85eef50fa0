"""The timing-regression rules on synthetic timings: what each part of the rule is for.

Pair rule (``timing_compare`` + ``timing_pooled``): the framework-path control cancels a
machine that got slower, the signed-rank test over cases claims a kernel-wide change, the noise
band keeps a lone noisy timing from being claimed while a lone large change still is. History
rule (``timing_history``): a change must persist over the confirming runs and leave the
baseline's range. Samples are drawn from a seeded generator with a stated spread; each
assertion is about a decision, with margins far beyond that spread.
"""

from __future__ import annotations

import random

import pytest
import scipy.stats as scipy_stats

from convmatrix.compare.timing.history import HistoryRule, history_regressions
from convmatrix.compare.timing.pairs import compare_timings
from convmatrix.compare.timing.pooled import EXACT_MAX_N, signed_rank_test
from convmatrix.compare.timing.rules import TimingRule
from convmatrix.core.records import TimingResult


def _t(scope: str, centre: float, rng: random.Random, spread: float = 0.02, n: int = 8,
       mode: str | None = None) -> TimingResult:  # fmt: skip
    """n samples uniform in centre * [1, 1 + spread]."""
    samples = sorted(centre * (1 + spread * rng.random()) for _ in range(n))
    return TimingResult(scope=scope, median_s=samples[n // 2], min_s=samples[0], iqr_s=0.0,
                        n=n, samples=samples, mode=mode)  # fmt: skip


def _run(rng, kernel: dict[str, float], control: dict[str, float], spread: float = 0.02):
    """case id -> [op, kernel, framework, memcpy] rows with the given centres."""
    return {
        case: [_t("op", k, rng, spread), _t("kernel", 0.8 * k, rng, spread),
               _t("framework", control[case], rng, spread), _t("memcpy", 1e-6, rng, spread)]
        for case, k in kernel.items()
    }  # fmt: skip


CASES = [f"case{i}" for i in range(8)]
BASE = {c: 1e-3 * (1 + i) for i, c in enumerate(CASES)}


@pytest.mark.parametrize("seed", range(5))
def test_signed_rank_test_matches_scipy_exact(seed):
    rng = random.Random(seed)
    values = [rng.gauss(0.2, 1.0) for _ in range(rng.randrange(4, 16))]  # no ties, no zeros
    ref = scipy_stats.wilcoxon(values, alternative="greater", method="exact")
    assert signed_rank_test(values) == pytest.approx(ref.pvalue, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n", [EXACT_MAX_N + 1, 200])
def test_signed_rank_test_above_the_exact_size_is_close_to_scipy_exact(seed, n):
    """Above ``EXACT_MAX_N`` cases the normal approximation stands in for the O(n^3) count;
    measured against scipy's exact p-value its absolute error stays below 1.3e-3 (n = 51,
    worst at p ~ 0.66) and a few 1e-4 where p is near alpha = 0.01: 2e-3 bounds it."""
    rng = random.Random(seed)
    values = [rng.gauss(0.3, 1.0) for _ in range(n)]
    ref = scipy_stats.wilcoxon(values, alternative="greater", method="exact")
    assert abs(signed_rank_test(values) - ref.pvalue) < 2e-3


def test_a_busier_machine_is_not_a_slower_kernel():
    """Kernel and control both 1.3x slower in HEAD: the control cancels it."""
    rng = random.Random(1)
    base = _run(rng, BASE, BASE)
    head = _run(rng, {c: 1.3 * v for c, v in BASE.items()}, {c: 1.3 * v for c, v in BASE.items()})
    out = compare_timings(base, head)
    assert out.regressions == [] and out.pooled.slower is False
    assert out.drift == pytest.approx(1.3, rel=0.03)  # 2% sample spread each side
    # Without the control the same pair reads as a kernel-wide slowdown.
    raw = compare_timings(base, head, rule=TimingRule(control=None))
    assert raw.pooled.slower and len(raw.regressions) == 2 * len(CASES)


def test_a_uniformly_slower_kernel_is_claimed_kernel_wide():
    rng = random.Random(2)
    base = _run(rng, BASE, BASE)
    head = _run(rng, {c: 1.5 * v for c, v in BASE.items()}, BASE)
    out = compare_timings(base, head)
    assert out.pooled.slower and out.pooled.ratio == pytest.approx(1.5, rel=0.03)
    assert len(out.regressions) == 2 * len(CASES)  # op and kernel of every case
    assert all(c.basis.startswith("kernel-wide") for c in out.regressions)
    assert {c.scope for c in out.regressions} == {"op", "kernel"}  # never a yardstick
    assert {c.scope for c in out.yardsticks} == {"framework", "memcpy"}


def test_a_lone_timing_is_claimed_only_beyond_the_pairs_noise():
    rng = random.Random(3)
    # Cases move up to 12% between the runs (noise): a robust sigma of about 0.1 in log, a
    # band exp(6 sigma) of about x2. case0 is 5x slower (claimed), case1 1.3x (in the noise).
    moves = [1.0, 1.0, 0.9, 1.12, 0.92, 1.1, 0.95, 1.05]
    head_k = {c: v * m for (c, v), m in zip(BASE.items(), moves, strict=True)}
    head_k["case0"], head_k["case1"] = 5 * BASE["case0"], 1.3 * BASE["case1"]
    out = compare_timings(_run(rng, BASE, BASE), _run(rng, head_k, BASE))
    assert out.pooled.slower is False and 1.3 < out.pooled.noise < 5
    assert {c.case_id for c in out.regressions} == {"case0"}
    assert all(c.basis.startswith("beyond the run-to-run noise") for c in out.regressions)
    assert "case1" in {c.case_id for c in out.within_noise}  # passed its own test, not claimed


def test_on_a_quiet_pair_the_band_never_narrows_below_its_floor():
    """Every case still (2% spread), one moves x1.18: its own test passes, the pair's robust
    band alone would be about x1.1, but one pair never claims a lone move under ``min_noise``
    (the flake CI met: an A/A's smallest case moved x1.14 against a x1.14 band)."""
    rng = random.Random(5)
    head_k = dict(BASE, case3=1.18 * BASE["case3"])
    rule = TimingRule()
    out = compare_timings(_run(rng, BASE, BASE), _run(rng, head_k, BASE), rule=rule)
    assert out.pooled.slower is False and out.pooled.noise == rule.min_noise
    assert out.regressions == [] and "case3" in {c.case_id for c in out.within_noise}
    # the same pair with the floor lowered below the move claims it: the floor decides
    low = compare_timings(_run(rng, BASE, BASE), _run(rng, head_k, BASE),
                          rule=TimingRule(min_noise=1.0))  # fmt: skip
    assert {c.case_id for c in low.regressions} == {"case3"}


def test_with_few_cases_the_per_timing_test_stands_alone():
    rng = random.Random(4)
    two = {c: BASE[c] for c in CASES[:2]}
    out = compare_timings(_run(rng, two, two), _run(rng, {"case0": 1.5e-3, "case1": 2e-3}, two))
    assert out.pooled.ratio is None and out.pooled.n_cases == 2
    assert {c.case_id for c in out.regressions} == {"case0"}  # case1 did not move
    assert out.regressions[0].basis.startswith("per-timing test")


# -- history ------------------------------------------------------------------------------
def _history(rng, factors: list[float], control: list[float] | None = None, spread=0.05):
    """One run per factor: case0's op at factor * 1 ms (+-spread), its control at control[i]."""
    control = control or [1.0] * len(factors)
    return [
        (i, {"case0": [_t("op", 1e-3 * f * (1 + spread * rng.random()), rng),
                       _t("framework", 1e-3 * c, rng)]})
        for i, (f, c) in enumerate(zip(factors, control, strict=True))
    ]  # fmt: skip


def test_history_claims_a_change_confirmed_by_consecutive_runs():
    rng = random.Random(5)
    out = history_regressions(_history(rng, [1, 1, 1, 1, 1, 1.5, 1.5, 1.5]))
    assert [c.case_id for c in out.regressions] == ["case0"] and out.judged == 1
    assert out.regressions[0].ratio == pytest.approx(1.5, rel=0.1)  # 5% spread per run
    assert out.baseline_runs == [0, 1, 2, 3, 4] and out.recent_runs == [5, 6, 7]


@pytest.mark.parametrize(
    "factors, why",
    [
        ([1, 1, 1, 1, 1, 1, 1, 1.5], "one slow run is not confirmed"),
        ([1, 1, 1, 1, 1, 1, 1.5, 1.5], "two slow runs are not three"),
        ([1, 1.4, 1, 1, 1, 1.3, 1.3, 1.3], "the recent runs stay within the baseline's range"),
        ([1, 1, 1.5, 1.5, 1.5], "two baseline runs are too few"),
    ],
)
def test_history_does_not_claim(factors, why):
    rng = random.Random(6)
    assert history_regressions(_history(rng, factors)).regressions == [], why


def test_history_divides_by_the_control():
    """The machine got 1.5x slower for the last three runs (control too): no claim."""
    rng = random.Random(7)
    runs = _history(rng, [1, 1, 1, 1, 1, 1.5, 1.5, 1.5], control=[1, 1, 1, 1, 1, 1.5, 1.5, 1.5])
    assert history_regressions(runs).regressions == []
    raw = history_regressions(runs, rule=HistoryRule(control=None))
    assert [c.case_id for c in raw.regressions] == ["case0"] and not raw.regressions[0].corrected
