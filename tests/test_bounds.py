"""The bound model (docs/spec.md §4): gamma, the reference's magnitudes, the verdict it gives
honest and defective kernels, exact causality, and the one dtype rule in the diff."""

from __future__ import annotations

import math

import pytest
import torch

from convmatrix.core.bounds import Arithmetic, BoundModel, Magnitudes, gamma
from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.records import CaseResult, OutputMetrics, PropertyResult
from convmatrix.core.tolerances import Policy
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.doubles.defects import DEFECTS, Fp32Kernel
from convmatrix.kernels.interface.registry import load
from convmatrix.kernels.oracle.reference import (
    backward_magnitudes,
    conv_forward,
    forward_magnitudes,
)
from convmatrix.reports.diff import build_diff
from convmatrix.runners.case.execute import Context, run_case
from convmatrix.runners.run.workload import load_workload

U32 = 2.0**-24


def test_gamma_probabilistic_grows_with_sqrt_n_and_never_exceeds_the_worst_case():
    for n in (1, 4, 35, 36, 37, 1000, 16384):
        prob, worst = gamma(n, U32), gamma(n, U32, "worst_case")
        assert prob <= worst
        assert worst == pytest.approx(n * U32 / (1 - n * U32))
    assert gamma(16384, U32) == pytest.approx(6 * 128 * U32)  # lambda sqrt(n) u, n > 36
    assert gamma(4, U32) == gamma(4, U32, "worst_case")  # n < lambda^2: the worst case is less
    assert gamma(300, 2.0**-8, "worst_case") == math.inf  # n u >= 1: no bound at all
    t = gamma(torch.tensor([4.0, 16384.0]), U32)
    assert t.tolist() == pytest.approx([gamma(4, U32), gamma(16384, U32)])
    with pytest.raises(ValueError, match="unknown bound mode"):
        gamma(4, U32, "optimistic")


def test_the_worked_example_of_the_spec():
    """docs/spec.md §4: y at one token, K=4, bf16 x, fp32 weights, bias, SiLU."""
    x = torch.tensor([[[1.0, -2.0, 0.5, 1.5]]], dtype=torch.bfloat16)
    w = torch.tensor([[0.5, -0.25, 0.75, 0.125]])  # w[k] multiplies x_{t-(K-1)+k}
    b = torch.tensor([0.25])
    y, _, saved = conv_forward(x, w, b, None, None, "silu", magnitudes=True)
    m = forward_magnitudes(saved, y)
    assert saved.z[0, 0, 3].item() == pytest.approx(1.8125)
    assert saved.mag_z[0, 0, 3].item() == pytest.approx(1.8125)
    assert m.n == 5
    fp32 = BoundModel().bound(y, m, Arithmetic("float32", "fp32", "bfloat16", "bfloat16"))
    assert fp32[0, 0, 3].item() == pytest.approx(6.09e-3, rel=1e-3)
    torch_path = BoundModel().bound(y, m, Arithmetic("float32", "input", "bfloat16", "bfloat16"))
    assert torch_path[0, 0, 3].item() == pytest.approx(0.096, rel=1e-2)


def test_magnitudes_are_the_computation_on_absolute_values():
    """Against a direct float64 evaluation with |w|, |x|, |b|, |g|: tolerance 1e-12 relative
    (float64 sums of a few hundred terms)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    b = torch.randn(3, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64)
    y, _, saved = conv_forward(x, w, b, None, None, None, magnitudes=True)
    abs_y = conv_forward(x.abs(), w.abs(), b.abs(), None, None, None)[0]
    assert torch.allclose(forward_magnitudes(saved, y).mag, abs_y, rtol=1e-12)
    _, mags = backward_magnitudes(saved, w, g, None)
    abs_saved = conv_forward(x.abs(), w.abs(), b.abs(), None, None, None)[2]
    from convmatrix.kernels.oracle.reference import conv_backward

    dx, dw, db, _ = conv_backward(abs_saved, w.abs(), g.abs(), None)
    assert torch.allclose(mags["dx"].mag, dx, rtol=1e-12)
    assert torch.allclose(mags["dw"].mag, dw, rtol=1e-12)
    assert torch.allclose(mags["db"].mag, db, rtol=1e-12)
    assert mags["dw"].n == 2 * 40 and mags["dx"].n == 4


def test_intermediate_rounding_widens_the_bound_and_rounding_once_uses_it_at_most_once():
    r = torch.tensor([1.0, -3.0, 1e-3], dtype=torch.float64)
    m = Magnitudes(torch.tensor([2.0, 3.0, 5.0], dtype=torch.float64), 4)
    fp32 = BoundModel().bound(r, m, Arithmetic(out_dtype="bfloat16", in_dtype="bfloat16"))
    wide = BoundModel().bound(
        r, m, Arithmetic(intermediate="input", out_dtype="bfloat16", in_dtype="bfloat16")
    )
    assert bool((wide > fp32).all())
    rounded = r.to(torch.bfloat16).double()
    assert float(((rounded - r).abs() / fp32).max()) <= 1.0  # one rounding: within the bound


def _nightly(kernel):
    cases = [c for c in load_workload("nightly", kernel).cases if c.expect != "error"]
    ctx = Context(kernel)
    return [run_case(case, ctx) for case in cases]


def test_the_honest_fp32_base_of_the_defects_passes_nightly():
    results = _nightly(Fp32Kernel())
    assert all(r.outcome in ("passed", "skipped") for r in results), [
        r.case.pytest_id for r in results if r.outcome == "failed"
    ]


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_every_precision_defect_fails_nightly_under_the_default_policy(name):
    """Nightly's cases in order until the first failure (the whole matrix: bench_bounds.py)."""
    kernel = DEFECTS[name]()
    ctx = Context(kernel)
    for case in load_workload("nightly", kernel).cases:
        if case.expect == "error":
            continue
        result = run_case(case, ctx)
        if result.outcome == "failed":
            break
    else:
        pytest.fail(f"{name} passed nightly")
    # failed by the bound: an output's usage exceeds what the policy allows
    usage = [o.bound_usage for o in result.outputs if o.bound_usage is not None]
    assert max(usage) > Policy().safety, result.outputs


class OneUlpLeak(TorchKernel):
    """The torch path, except y[t] moves by one ulp when x[t+1] > 0: a leak from the future
    far below any tolerance row."""

    name = "one_ulp_leak"

    def forward(self, x, weight, bias=None, **kwargs):
        out = super().forward(x, weight, bias, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        ahead = torch.zeros_like(y, dtype=torch.bool)
        ahead[..., :-1] = x[..., 1:] > 0
        y = torch.where(ahead, torch.nextafter(y, torch.full_like(y, math.inf)), y)
        return (y, out[1]) if isinstance(out, tuple) else y


class NondeterministicLeak(OneUlpLeak):
    name = "nondeterministic_leak"
    capabilities = Capabilities(intermediate="input", deterministic=False)


FWD = Case("fwd", "fwd", 4, 16, 2, seqlen=64, checks=("causality",))


def _causality(kernel) -> PropertyResult:
    result = run_case(FWD, Context(kernel))
    return next(p for p in result.properties if p.name == "causality")


def test_causality_is_exact_a_one_ulp_leak_from_the_future_fails():
    prop = _causality(OneUlpLeak())
    assert not prop.passed
    assert "must be identical" in prop.detail and "max|diff|" in prop.detail
    assert _causality(TorchKernel()).passed


def test_a_nondeterministic_kernel_is_held_to_the_bound_instead():
    prop = _causality(NondeterministicLeak())
    assert prop.passed and prop.detail == "y[:33] unchanged", prop.detail


def _dw_result(case: Case, e_rel: float) -> CaseResult:
    m = OutputMetrics("dw", e_rel, e_rel, e_rel, 0.1, 0.1, [0, 0], passed=True)
    return CaseResult(case=case, outcome="passed", outputs=[m])


def test_diff_judges_dw_by_the_weight_dtype_floor():
    from test_report_view import header

    w_bf16 = Case("fwd_bwd", "fwd_bwd", 4, 8, 1, seqlen=8, x_dtype="float32", w_dtype="bfloat16")
    x_bf16 = Case("fwd_bwd", "fwd_bwd", 4, 8, 1, seqlen=8, x_dtype="bfloat16", w_dtype="float32")
    base = [_dw_result(w_bf16, 1e-3), _dw_result(x_bf16, 1e-5)]
    head = [_dw_result(w_bf16, 1e-2), _dw_result(x_bf16, 1e-4)]
    view = build_diff(header(), base, header(), head)
    # x=fp32/w=bf16: 10x growth but under the bf16 dw floor (16 u_bf16 = 0.0625): noise.
    # x=bf16/w=fp32: dw is an fp32 result, its floor 9.5e-7: a regression.
    assert [(e.case_id, e.dtype) for e in view.error_regressions] == [(x_bf16.id, "float32")]
    assert view.error_regressions[0].floor == pytest.approx(16 * U32)


@pytest.mark.slow
def test_torch_passes_production_under_the_default_policy():
    torch.set_num_threads(2)
    kernel = load("torch")
    ctx = Context(kernel)
    bad = []
    for case in load_workload("production", kernel).cases:
        result = run_case(case, ctx)
        if result.outcome != "passed":
            bad.append(result.case.pytest_id)
    assert not bad


def test_the_policy_is_chosen_on_the_command_line(capsys):
    from convmatrix.api import run
    from convmatrix.cli import main

    kernel = load("torch")
    # bf16 x with fp32 weights: dw is judged as fp32. The torch path computes it in bf16
    # (declared intermediate="input"), so the bound passes it and the fp32 threshold row not.
    case = next(
        c
        for c in load_workload("nightly", kernel).cases
        if c.op == "fwd_bwd" and (c.x_dtype, c.w_dtype) == ("bfloat16", "float32")
    )
    common = dict(workers=0, no_db=True, cases=[case.id])
    assert run("nightly", "torch", **common).exit_code == 0
    assert run("nightly", "torch", rule="threshold", **common).exit_code == 1
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--matrix", "nightly", "--kernel", "torch", "--policy", "strict"])
    assert exit_.value.code == 2
    assert "argument --policy: invalid choice: 'strict'" in capsys.readouterr().err


def test_the_torch_paths_window_sums_accumulate_in_the_input_dtype():
    """torch's CPU conv1d backward may add each tap into a bf16 dx: the path declares
    ``intermediate="input"``, so its window sums are bounded as K-tap sums accumulated in bf16.
    In a dao-parity run its fwd_bwd-K4-L1024-C4128 bf16 case (0dfdc2d01cdf) used 2.14 of the
    one-rounding-per-term bound; run alone in a fresh process (this test, and that very case)
    it uses about 0.9 of it, so whether torch takes the rounding path depends on its state,
    and only the declared bound is asserted here."""
    from convmatrix.kernels.oracle.steps import reference_bounded
    from convmatrix.runners.case.bounds import arithmetic, bound_usage
    from convmatrix.runners.case.execute import build_inputs
    from convmatrix.runners.case.invoke import kernel_outputs

    case = Case("fwd_bwd", "fwd_bwd", 4, 1024, 2, seqlen=1024, x_dtype="bfloat16")
    kernel = TorchKernel()
    inputs = build_inputs(case, torch.device("cpu"))
    got = kernel_outputs(kernel, case, inputs)
    values, mags = reference_bounded(case, inputs)
    model = BoundModel()
    declared = arithmetic(kernel.capabilities, case, "dx")
    assert declared.accumulate == "bfloat16"
    usage = bound_usage(got["dx"], values["dx"], model.bound(values["dx"], mags["dx"], declared))
    assert usage <= 1.0, usage  # the declared window-sum bound holds without the safety
    dw_arith = arithmetic(kernel.capabilities, case, "dw")
    assert dw_arith.accumulate == "float32"  # the B*L reduction keeps the declared FP32


def test_a_weight_below_the_smallest_normal_of_x_is_bounded_absolutely():
    """dao-parity's varlen fp16 case 349cbf604f78: the torch path rounds an fp32 weight of
    6.8e-7 to an fp16 subnormal (4% off, where u_fp16 is 0.05%) and its y used 1.64 of a bound
    built on |w|. The magnitudes count |w| as at least fp16's smallest normal."""
    from convmatrix.runners.case.bounds import arithmetic, bound_usage

    case = Case("t", "fwd", 4, 1, 1, seqlen=4, x_dtype="float16", bias=False)
    x = torch.tensor([[[0.0, 0.0, 0.0, 1.04]]]).half()  # only the tiny last tap contributes
    w = torch.tensor([[-0.14316509, -0.10907053, 0.49378857, 6.805957e-07]])
    got = TorchKernel().forward(x, w)
    y, _, saved = conv_forward(x, w, None, None, None, None, magnitudes=True)
    m = forward_magnitudes(saved, y)
    declared = arithmetic(TorchKernel.capabilities, case, "y")
    usage = bound_usage(got, y, BoundModel().bound(y, m, declared))
    plain = Magnitudes((w.double().abs()[0, 3] * x.double().abs()).expand_as(y), m.n)
    over = bound_usage(got, y, BoundModel().bound(y, plain, declared))
    # 1.64 of a bound on |w| alone: past the model (1); the case's dx used 2.26 and failed
    assert over > 1.5, over
    assert usage <= 1.0, usage


# -- elements whose bound is zero --------------------------------------------------------------
def test_usage_of_counts_elements_expected_exactly_zero_apart():
    """An element whose bound is nothing but the subnormal floor eta is right only at 0: a
    non-zero value there is counted, not divided (it was a usage of |a| / eta = 1e+43)."""
    from convmatrix.core.bounds import TINY
    from convmatrix.runners.case.bounds import bound_usage, usage_of

    eta = TINY["float32"]
    r = torch.tensor([0.0, 1.0, 0.0, -2.0], dtype=torch.float64)
    bound = torch.tensor([eta, 1e-3, eta, 1e-3], dtype=torch.float64)
    smallest = 2.0**-149  # fp32's smallest subnormal: the least non-zero value there is
    a = torch.tensor([0.0, 1.0 + 5e-4, smallest, -2.0], dtype=torch.float64)
    got = usage_of(a, r, bound, eta)
    # 5e-4 / 1e-3 (both exact in binary to well within 1e-12 relative)
    assert got.usage == pytest.approx(0.5, rel=1e-12)
    assert got.broken_zeros == 1
    a[2] = 1e-3
    assert usage_of(a, r, bound, eta).broken_zeros == 1
    assert bound_usage(a, r, bound) > 1e42  # the ratio it replaces: 1e-3 / eta = 1.4e+42
    a[2] = 0.0
    assert usage_of(a, r, bound, eta) == (pytest.approx(0.5, rel=1e-12), 0)
    a[0] = math.nan  # a non-finite value where 0 is expected is not 0 either
    assert usage_of(a, r, bound, eta).broken_zeros == 1


class PadLeak(Fp32Kernel):
    """The honest FP32 kernel, except y at padding tokens (seq_idx -1, whose expected value is
    exactly 0 with nothing accumulated) holds 1e-3 instead of 0."""

    name = "pad_leak"

    def forward(self, x, weight, bias=None, *, seq_idx=None, **kwargs):
        out = super().forward(x, weight, bias, seq_idx=seq_idx, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        if seq_idx is not None:
            pad = (seq_idx < 0)[:, None, :].expand_as(y)
            y = torch.where(pad, torch.full_like(y, 1e-3), y)
        return (y, out[1]) if isinstance(out, tuple) else y


PADDED = Case("t", "fwd", 3, 8, 1, seqlen=16, seq_lens=(6, 6, -4), x_dtype="bfloat16")


def test_a_kernel_breaking_exact_zeros_fails_and_says_so():
    from convmatrix.core.verdict import describe, output_severity

    honest = run_case(PADDED, Context(Fp32Kernel()))
    assert honest.outcome == "passed", describe(honest)
    assert [o.broken_zeros for o in honest.outputs if o.output == "y"] == [0]
    result = run_case(PADDED, Context(PadLeak()))
    assert result.outcome == "failed"
    (y,) = [o for o in result.outputs if o.output == "y"]
    assert y.broken_zeros == 4 * 8  # 4 padding tokens x 8 channels
    # the other elements are the honest kernel's: their usage is the honest one
    honest_y = next(o for o in honest.outputs if o.output == "y")
    assert y.bound_usage == honest_y.bound_usage <= 1.0
    assert not y.passed and output_severity(y) == math.inf
    lines = describe(result)
    assert any("y: 32 elements expected exactly 0 came out non-zero" in ln for ln in lines), lines


def test_the_words_for_one_broken_zero():
    from convmatrix.core.verdict import broken_zeros_text

    assert broken_zeros_text(1) == "1 element expected exactly 0 came out non-zero"
    assert broken_zeros_text(3) == "3 elements expected exactly 0 came out non-zero"
