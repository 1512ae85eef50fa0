"""Error metrics (docs/spec.md §4) on hand-computed values, and the verdict builder's rules."""

from __future__ import annotations

import math

import pytest
import torch

from convmatrix.core.case import Case
from convmatrix.core.records import CaseResult, ErrorMetrics, PropertyResult
from convmatrix.core.tolerances import Policy, Tolerance, Tolerances
from convmatrix.core.verdict import case_severity as severity
from convmatrix.core.verdict import describe, judge_output, judged_dtype
from convmatrix.runners.case.metrics import error_metrics, rms

F64 = torch.float64


def test_three_errors_by_hand():
    r = torch.tensor([3.0, -4.0, 0.0, 0.0], dtype=F64)  # rms = sqrt(25/4) = 2.5
    a = torch.tensor([3.0, -3.5, 0.25, 0.0], dtype=F64)  # diffs 0, 0.5, 0.25, 0
    m = error_metrics(a, r, tau_scale=1.0)
    assert m.scale == 2.5 and m.tau == 2.5
    assert m.e_abs == 0.5
    # e_rel = max(0/3, 0.5/4, 0.25/max(0, 2.5), 0) = 0.125
    assert m.e_rel == pytest.approx(0.125, rel=1e-15)
    # e_norm = sqrt(0.25 + 0.0625) / 5
    assert m.e_norm == pytest.approx(math.sqrt(0.3125) / 5, rel=1e-15)
    assert m.worst_index == [1]


def test_tau_scale_moves_the_floor_for_near_zero_outputs():
    r = torch.tensor([1.0, 1e-9], dtype=F64)
    a = torch.tensor([1.0, 2e-9], dtype=F64)
    tight = error_metrics(a, r, tau_scale=0.0)  # relative to |r| alone: 1e-9 / 1e-9
    loose = error_metrics(a, r, tau_scale=1.0)  # floor at rms(r) ~ 0.707
    assert tight.e_rel == pytest.approx(1.0, rel=1e-6)
    assert loose.e_rel == pytest.approx(1e-9 / rms(r), rel=1e-6)


def test_nan_or_inf_in_the_output_is_an_infinite_error():
    r = torch.ones(2, 3, dtype=F64)
    a = r.clone().float()
    a[1, 2] = math.nan
    m = error_metrics(a, r)
    assert math.isinf(m.e_abs) and math.isinf(m.e_rel) and math.isinf(m.e_norm)
    assert m.worst_index == [1, 2]


def test_zero_reference_exact_zero_is_not_nan():
    z = torch.zeros(4, dtype=F64)
    m = error_metrics(z.clone(), z)
    assert (m.e_abs, m.e_rel, m.e_norm) == (0.0, 0.0, 0.0)
    bad = error_metrics(torch.tensor([0.0, 1e-3, 0, 0]), z)
    assert math.isinf(bad.e_rel) and math.isinf(bad.e_norm)


def test_empty_outputs_and_shape_mismatch():
    empty = torch.zeros(2, 3, 0, dtype=F64)  # dS of a width-1 kernel
    assert error_metrics(empty, empty).worst_index is None
    with pytest.raises(ValueError, match=r"shape \(2, 3\) differs"):
        error_metrics(torch.zeros(2, 3), torch.zeros(3, 2))


def metrics(rel: float, norm: float, abs_: float = 1e-3) -> ErrorMetrics:
    return ErrorMetrics(abs_, rel, norm, tau=0.5, scale=0.5, worst_index=[0, 1])


TOL = Tolerance(rel=1e-3, norm=1e-4)


def test_threshold_rule_needs_both_rel_and_norm():
    assert judge_output("y", metrics(9e-4, 9e-5), None, TOL, Policy()).passed
    assert not judge_output("y", metrics(2e-3, 9e-5), None, TOL, Policy()).passed
    assert not judge_output("y", metrics(9e-4, 2e-4), None, TOL, Policy()).passed
    judged = judge_output("y", metrics(9e-4, 9e-5), metrics(1e-4, 1e-5), TOL, Policy())
    assert (judged.limit_rel, judged.limit_norm) == (1e-3, 1e-4)
    assert judged.fw_rel == 1e-4


def test_framework_rule_is_factor_times_torch_path_plus_floor():
    policy = Policy(rule="framework", factor=2.0, floor=1e-6)
    fw = metrics(1e-2, 1e-3)  # a coarse torch path: 2x that + 1e-6 is allowed
    judged = judge_output("dw", metrics(1.5e-2, 1.5e-3), fw, TOL, policy)
    assert judged.passed
    assert judged.limit_rel == pytest.approx(2e-2 + 1e-6)
    assert not judge_output("dw", metrics(3e-2, 1e-3), fw, TOL, policy).passed
    # Without a torch path the framework rule cannot judge: the threshold row does.
    assert judge_output("dw", metrics(9e-4, 9e-5), None, TOL, policy).passed


def test_threshold_or_framework_passes_when_either_holds():
    policy = Policy(rule="threshold_or_framework")
    fw = metrics(1e-2, 1e-3)
    assert judge_output("y", metrics(1.5e-2, 1.5e-3), fw, TOL, policy).passed  # framework
    assert judge_output("y", metrics(9e-4, 9e-5), metrics(1e-9, 1e-9), TOL, policy).passed
    assert not judge_output("y", metrics(5e-2, 1e-3), fw, TOL, policy).passed


def test_exact_outputs_and_infinite_errors_never_pass_on_tolerance():
    assert not judge_output("state", metrics(1e-9, 1e-9, abs_=1e-9), None, TOL, Policy(),
                            exact=True).passed  # fmt: skip
    assert judge_output("state", metrics(0, 0, abs_=0.0), None, TOL, Policy(), exact=True).passed
    inf = ErrorMetrics(math.inf, 0.0, 0.0, 0.5, 0.5, [0])
    assert not judge_output("y", inf, None, TOL, Policy()).passed


def test_unknown_policy_rule_is_named():
    with pytest.raises(ValueError, match="unknown policy rule 'strict'"):
        judge_output("y", metrics(0, 0), None, TOL, Policy(rule="strict"))


def test_parameter_gradients_are_judged_in_the_weight_dtype():
    # One rule (core.verdict.judged_dtype): dw/db are stored in the weight dtype; with x=bf16
    # and fp32 weights they are fp32 results of exact bf16 products, judged as fp32.
    case = Case("t", "fwd_bwd", 4, 8, 1, seqlen=8, x_dtype="float32", w_dtype="bfloat16")
    assert judged_dtype("y", case) == judged_dtype("dS", case) == "float32"
    assert judged_dtype("dw", case) == judged_dtype("db", case) == "bfloat16"
    case = Case("t", "fwd_bwd", 4, 8, 1, seqlen=8, x_dtype="bfloat16", w_dtype="float32")
    assert judged_dtype("dw", case) == "float32"
    assert judged_dtype("dx", case) == judged_dtype("F", case) == "bfloat16"
    tol = Tolerances()
    assert tol.lookup("bfloat16", "dw").rel > tol.lookup("float32", "dw").rel


def test_describe_names_every_failing_output_where_and_what_was_allowed():
    case = Case("t", "fwd", 4, 8, 1, seqlen=8)
    bad_y = judge_output("y", metrics(2e-3, 9e-5, abs_=0.25), metrics(1e-7, 1e-8), TOL, Policy())
    bad_f = judge_output("F", metrics(9e-4, 5e-4), None, TOL, Policy())
    good = judge_output("dx", metrics(1e-5, 1e-6), None, TOL, Policy())
    result = CaseResult(case, "failed", outputs=[bad_y, good, bad_f])
    result.properties.append(PropertyResult("guards", False, "x: 1 element(s) modified"))
    lines = describe(result)
    assert lines[0] == f"FAILED {case.pytest_id} [{case.id}]"
    assert lines[1].startswith("  y: e_rel 0.002 (allowed 0.001)")
    assert "max|a-r| 0.25 at [0, 1]" in lines[1] and "torch path e_rel 1e-07" in lines[1]
    assert lines[2].startswith("  F: e_rel 0.0009 (allowed 0.001), e_norm 0.0005 (allowed 0.0001)")
    assert lines[3] == "  guards: x: 1 element(s) modified"
    assert len(lines) == 4  # dx passed: not listed
    # The worst failing output's distance past its limits, on e_rel or e_norm: F's e_norm
    # is 5x its limit (the report and the terminal order failures by this one number).
    assert severity(result) == pytest.approx(5.0)
    assert severity(CaseResult(case, "crashed")) == math.inf


def test_non_contiguous_outputs_are_measured_as_they_are():
    """A channel-last kernel returns (B, C, L) with channels innermost: no copy is assumed."""
    r = torch.arange(24, dtype=F64).reshape(2, 3, 4)
    a = r.transpose(1, 2).contiguous().transpose(1, 2).clone(memory_format=torch.preserve_format)
    a[1, 2, 3] += 0.5
    assert not a.is_contiguous()
    m = error_metrics(a, r)
    assert (m.e_abs, m.worst_index) == (0.5, [1, 2, 3])


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 1, 4), (2, 3, 4, 5)])
def test_unravel_gives_torchs_index_of_every_element(shape):
    from convmatrix.runners.case.metrics import unravel

    n = math.prod(shape)
    for flat in range(n):
        assert unravel(flat, shape) == [
            int(i) for i in torch.unravel_index(torch.tensor(flat), shape)
        ]


def test_an_output_in_one_block_gets_the_same_metrics_without_the_second_pass():
    """One block: e_rel divides the kept |a - r| (not recomputed, not changed in place); many
    blocks: each recomputed. Same numbers either way (the blocks see the same elements)."""
    from convmatrix.runners.case.metrics import ErrorSums, abs_diff

    g = torch.Generator().manual_seed(3)
    r = torch.randn(4, 6, 10, generator=g, dtype=torch.float64)
    a = (r + 1e-3 * torch.randn(4, 6, 10, generator=g, dtype=torch.float64)).float()
    whole = ErrorSums(tuple(r.shape), 1)
    diff = abs_diff(a, r)
    kept = diff.clone()
    whole.add(None, a, r, diff)
    blocked = ErrorSums(tuple(r.shape), 1)
    for block in (slice(0, 2), slice(2, 6)):
        blocked.add(block, a[:, block], r[:, block], None)
    for tau in (0.0, 0.5):
        one, many = whole.metrics(a, tau), blocked.metrics(a, tau)
        # tau is the rms of r summed per block or at once: equal to rounding (1e-12 relative)
        assert one.e_rel == pytest.approx(many.e_rel, rel=1e-12) and one.e_rel > 0
        assert (one.e_abs, one.worst_index) == (many.e_abs, many.worst_index)
    assert torch.equal(diff, kept)  # the caller's |a - r| is left as it was
