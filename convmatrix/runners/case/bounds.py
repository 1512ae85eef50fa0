"""Bound usage of one output: the bound model (``convmatrix.core.bounds``) applied to the
reference's magnitudes, with the arithmetic the kernel declares (docs/spec.md §4).

``usage = max_i |a_i - r_i| / bound_i`` over the elements whose bound is not zero; a
non-finite output counts as infinite. An element whose bound is zero (nothing but the output
dtype's subnormal floor ``eta``: the expected value and everything it is built from are zero,
so the only right answer is exactly 0) is not a ratio: one that comes out non-zero is
counted (``Usage.broken_zeros``) and fails the verdict by itself, rather than showing as a
usage of 1e+43 (``|a_i| / eta``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from convmatrix.core.bounds import TINY, Arithmetic, Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.dtypes import coarser
from convmatrix.core.tolerances import Policy
from convmatrix.core.verdict import judged_dtype
from convmatrix.runners.case.metrics import abs_diff

__all__ = ["Usage", "arithmetic", "bound_of", "bound_usage", "usage_of", "zero_floor"]

F64 = torch.float64


# Outputs that sum a window of K taps (plus bias or dF) per element, as opposed to dw/db's
# reduction over B*L tokens.
WINDOW_SUMS = ("y", "dx", "dS")


def arithmetic(contract: Capabilities, case: Case, output: str) -> Arithmetic:
    """The declared arithmetic of ``output``: the kernel's accumulation and intermediate
    dtypes, the output's judged dtype, and the inputs' storage dtype, the coarser of x and
    the weight: a kernel computing in its inputs' dtypes rounds the weight to x's dtype in
    the forward and partial weight gradients to the weight's (the torch path's packed
    segments each add a gradient to a bf16 weight).

    With ``intermediate="input"`` a window sum's partial results are rounded to the input
    dtype too, so it accumulates in that dtype: torch's CPU conv1d backward adds each tap's
    contribution into an input-dtype dx (measured: x=bf16, K=4, |dx - r| up to 3.2 u_bf16
    sum_k |w_k dz|, where one rounding per term allows 1). The B*L reductions of dw/db keep
    the declared accumulation (the torch path's stay within 0.9 of that bound)."""
    in_dtype = coarser(case.x_dtype, case.w_dtype)
    accumulate = contract.accumulate
    if contract.intermediate == "input" and output in WINDOW_SUMS:
        accumulate = coarser(accumulate, in_dtype)
    return Arithmetic(
        accumulate=accumulate,
        intermediate=contract.intermediate,
        out_dtype=judged_dtype(output, case),
        in_dtype=in_dtype,
    )


def bound_of(
    r: torch.Tensor, m: Magnitudes, contract: Capabilities, case: Case, output: str, policy: Policy
) -> torch.Tensor:
    """bound_i of every element of ``output`` (float64, on the reference's device)."""
    r = r.detach().to(F64)  # on the reference's device
    return policy.model.bound(r, m, arithmetic(contract, case, output))


def zero_floor(case: Case, output: str) -> float:
    """``eta``: half the subnormal step of the dtype ``output`` is judged in, the bound of an
    element whose expected value and magnitudes are all zero (0 for float64)."""
    return TINY[judged_dtype(output, case)]


class Usage(NamedTuple):
    """The bound usage of one output (or one block of it)."""

    usage: float  # max |a_i - r_i| / bound_i over the elements whose bound is not zero
    broken_zeros: int  # elements whose bound is zero (expected exactly 0) that are not 0


def usage_of(
    a: torch.Tensor,
    r: torch.Tensor,
    bound: torch.Tensor,
    eta: float = 0.0,
    *,
    diff: torch.Tensor | None = None,
) -> Usage:
    """The usage of ``a`` against ``r`` under ``bound``, with the zero-bound elements
    (``bound_i <= eta``) counted apart: such an element is right only when it is exactly 0
    (then ``|a_i - r_i| = |r_i| < eta``); any non-zero value (at least the output dtype's
    smallest subnormal, twice ``eta``) or non-finite value is counted and left out of the
    maximum. ``diff``: ``abs_diff(a, r)`` when the caller has it already."""
    if r.numel() == 0:
        return Usage(0.0, 0)
    if diff is None:
        diff = abs_diff(a, r)
    if float(bound.min()) > eta:  # the common case: one division, no masks
        return Usage(float(torch.div(diff, bound).max()), 0)
    zero = bound <= eta
    broken = int(torch.logical_and(zero, diff > eta).sum())
    ratio = torch.where(zero, 0.0, diff / torch.where(zero, 1.0, bound))
    return Usage(float(ratio.max()), broken)


def bound_usage(
    a: torch.Tensor, r: torch.Tensor, bound: torch.Tensor, *, diff: torch.Tensor | None = None
) -> float:
    """max_i |a_i - r_i| / bound_i (0 for an empty output), every element a ratio: x/0 and a
    non-finite output are infinite, 0/0 is 0. For two outputs of one kernel that must agree
    within a bound (``runners.case.properties``); an output against the reference: ``usage_of``."""
    if r.numel() == 0:
        return 0.0
    if diff is None:
        diff = abs_diff(a, r)
    if float(bound.min()) > 0:  # the common case: one division, no masks
        return float(torch.div(diff, bound).max())
    ratio = torch.where(bound > 0, diff / torch.where(bound > 0, bound, 1.0), diff * math.inf)
    ratio = torch.nan_to_num(ratio, nan=0.0)  # 0 * inf: an exact zero with a zero bound
    return float(ratio.max())
