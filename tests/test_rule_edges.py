"""The edges of the rules a deliberate bug once slipped past (issue 33 item 8): each test here
fails with its bug put back.

- broken zeros, off by one: one element expected exactly 0 that comes out non-zero fails the
  verdict, and one more of them than the baseline had is an error regression; as many as
  before is not (``core.verdict.judge_output``, ``compare.errors``);
- the bound's accumulation term, loosened 2x: the term is gamma(n) u_acc mag to the last bit,
  and a kernel off by three times it fails (``core.bounds``, the reference's magnitudes);
- the scan turning an in-bound error regression of a passing case into a row, and a timing
  regression into a row (``compare.findings``, ``service.scan``), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from reports_support import cases, synthetic_results, write_run
from sqlalchemy.orm import Session

from convmatrix.compare.errors import error_change
from convmatrix.compare.runs import DiffOptions
from convmatrix.core.bounds import TINY, Arithmetic, BoundModel, Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.records import ErrorMetrics, OutputMetrics
from convmatrix.core.tolerances import Policy, Tolerances
from convmatrix.core.verdict import judge_output
from convmatrix.db import load_results, open_database
from convmatrix.db.engine import write_session
from convmatrix.kernels.doubles.variants import Float64Sums
from convmatrix.runners.case.execute import Context, run_case
from convmatrix.service.regressions import list_regressions
from convmatrix.service.scan import scan_run

U32 = 2.0**-24  # fp32's unit roundoff


# -- broken zeros ---------------------------------------------------------------------------
def _y(usage: float, zeros: int) -> OutputMetrics:
    return OutputMetrics("y", 1e-7, 1e-7, 2e-8, 1e-3, 1.0, bound_usage=usage, broken_zeros=zeros)


def test_one_broken_zero_fails_the_verdict_and_none_does_not():
    m = ErrorMetrics(1e-7, 1e-7, 2e-8, 1e-3, 1.0, [0, 0, 0])
    tol = Tolerances().lookup("float32", "y")
    judge = lambda zeros: judge_output(  # noqa: E731
        "y", m, None, tol, Policy(), bound_usage=0.5, broken_zeros=zeros
    )
    assert judge(0).passed and not judge(1).passed and not judge(2).passed


@pytest.mark.parametrize(
    ("before", "after", "worse"),
    [(0, 1, True), (5, 6, True), (0, 32, True), (0, 0, False), (3, 3, False), (6, 5, False)],
)
def test_one_broken_zero_more_than_the_baseline_is_an_error_regression(before, after, worse):
    result = synthetic_results(1, extras=False)[0]
    found, better = error_change(
        result, _y(0.5, before), _y(0.5, after), DiffOptions().errors
    )  # the usage equal on both sides: only the count can judge
    assert (found is not None) == worse
    if worse:
        assert found.metrics == ["broken_zeros"] and found.growth == math.inf
    assert (better is not None) == (after < before)


# -- the bound's accumulation term ----------------------------------------------------------
def test_the_accumulation_term_is_gamma_n_u_mag_to_the_last_bit():
    """bound = u_out |r| + eta + gamma(n) u_acc mag, gamma written out here: the worst case
    n u / (1 - n u) below lambda^2 = 36 terms, lambda sqrt(n) u from there (docs/spec.md §4).
    Compared to 1e-15 relative: a few roundings of float64 sums of three terms."""
    r = torch.tensor([0.0, 1.0, -3.0, 1e-3], dtype=torch.float64)
    mag = torch.tensor([2.0, 5.0, 4.0, 7.0], dtype=torch.float64)
    model = BoundModel()
    for n in (2, 4, 35, 36, 100, 4096):
        gamma = n * U32 / (1 - n * U32) if n < 36 else 6.0 * math.sqrt(n) * U32
        want = U32 * r.abs() + TINY["float32"] + gamma * mag
        got = model.bound(r.clone(), Magnitudes(mag, n), Arithmetic())
        assert torch.allclose(got, want, rtol=1e-15, atol=0), (n, got, want)


class Misrounded(Float64Sums):
    """Float64 sums, then ``s`` times the accumulation term an FP32 kernel is allowed added
    to every element of y (no bias, no activation: y's terms are the K taps, mag their |sum|)."""

    name = "misrounded"

    def __init__(self, s: float) -> None:
        self.s = s

    def window_sum(self, terms):
        out = super().window_sum(terms)
        n = len(terms)
        gamma = n * U32 / (1 - n * U32)  # n = K = 4 < 36: the worst case
        return out + self.s * gamma * sum(t.abs() for t in terms)


def test_a_kernel_off_by_three_accumulation_terms_fails_and_by_half_of_one_passes():
    """y = r + s gamma(K) u mag (+ the output's rounding, at most u |r| <= u mag): its usage
    is between (4s - 1)/5 and (4s + 1)/4 of the bound u |r| + 4u mag. s = 3: 2.2 to 3.25, over
    the 2 allowed; with the term loosened 2x it would be 1.2 to 1.6 and pass. s = 0.5: at most
    0.75."""
    case = Case("t", "fwd", 4, 8, 2, seqlen=40, bias=False)
    over = run_case(case, Context(Misrounded(3.0)))
    (y,) = over.outputs
    assert over.outcome == "failed" and 2.2 <= y.bound_usage <= 3.25, y.bound_usage
    within = run_case(case, Context(Misrounded(0.5)))
    assert within.outcome == "passed" and within.outputs[0].bound_usage <= 0.75


# -- the scan's error and timing paths ------------------------------------------------------
def _with_y_usage(result, usage: float):
    outputs = [
        dataclasses.replace(m, bound_usage=usage, passed=True) if m.output == "y" else m
        for m in result.outputs
    ]
    return dataclasses.replace(result, outputs=outputs, outcome="passed", message=None)


def test_an_in_bound_error_regression_of_a_passing_case_is_a_row(db_url):
    n = 20
    engine = open_database(db_url)
    grid = {c.id for c in cases(n)}
    target = sorted(grid)[0]
    base = [
        _with_y_usage(r, 0.01) if r.case.id == target else r
        for r in synthetic_results(n, extras=False, usage=True)
    ]
    head = [_with_y_usage(r, 0.5) if r.case.id == target else r for r in base]
    write_run(engine, base, commit="1" * 40)
    run = write_run(engine, head, commit="2" * 40)
    with write_session(engine) as session:
        scan = scan_run(session, run)
    (reg,) = scan.new
    assert (reg.case_id, reg.kind, reg.state) == (target, "error_regression", "detected")
    (y,) = reg.outputs
    assert (y["output"], y["base_usage"], y["usage"]) == ("y", 0.01, 0.5)
    assert y["growth"] == pytest.approx(50.0, rel=1e-12)  # 0.5 / 0.01 in doubles
    assert reg.detail == "y usage 0.01 -> 0.5 (x50)"
    with Session(engine) as session:
        held = {r.case.id: r.outcome for r in load_results(session, run)}
        assert held[target] == "passed"  # a regression of a case that still passes
        assert [r.id for r in list_regressions(session)] == [reg.id]
    engine.dispose()


def test_a_timing_regression_is_a_row(db_url):
    n = 24
    engine = open_database(db_url)
    base = synthetic_results(n, extras=False, timed_every=2)
    timed = [r.case.id for r in base if r.timings]
    slow = set(timed[:2])

    def slower(result):
        if result.case.id not in slow:
            return result
        times = [
            dataclasses.replace(t, median_s=3 * t.median_s, min_s=3 * t.min_s,
                                samples=[3 * s for s in t.samples])
            for t in result.timings
        ]  # fmt: skip
        return dataclasses.replace(result, timings=times)

    write_run(engine, base, commit="1" * 40)
    run = write_run(engine, [slower(r) for r in base], commit="2" * 40)
    with write_session(engine) as session:
        scan = scan_run(session, run)
    assert {(r.case_id, r.kind) for r in scan.new} == {(i, "timing_regression") for i in slow}
    for reg in scan.new:
        (kernel,) = reg.outputs
        assert kernel["scope"] == "kernel" and kernel["ratio"] == pytest.approx(3.0, rel=1e-12)
        assert reg.detail.startswith("kernel ") and reg.detail.endswith("(x3)")
    engine.dispose()
