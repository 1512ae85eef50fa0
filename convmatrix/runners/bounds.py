"""Bound usage of one output: the bound model (``convmatrix.core.bounds``) applied to the
reference's magnitudes, with the arithmetic the kernel declares (docs/spec.md §4).

``usage = max_i |a_i - r_i| / bound_i``; 0/0 counts as 0 (an exact zero where nothing was
accumulated), x/0 and a non-finite output as infinite.
"""

from __future__ import annotations

import math

import torch

from convmatrix.core.bounds import Arithmetic, Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.dtypes import coarser
from convmatrix.core.tolerances import Policy
from convmatrix.core.verdict import judged_dtype

__all__ = ["arithmetic", "bound_of", "bound_usage"]

F64 = torch.float64


def arithmetic(contract: Capabilities, case: Case, output: str) -> Arithmetic:
    """The declared arithmetic of ``output``: the kernel's accumulation and intermediate
    dtypes, the output's judged dtype, and the inputs' storage dtype, the coarser of x and
    the weight: a kernel computing in its inputs' dtypes rounds the weight to x's dtype in
    the forward and partial weight gradients to the weight's (the torch path's packed
    segments each add a gradient to a bf16 weight)."""
    return Arithmetic(
        accumulate=contract.accumulate,
        intermediate=contract.intermediate,
        out_dtype=judged_dtype(output, case),
        in_dtype=coarser(case.x_dtype, case.w_dtype),
    )


def bound_of(
    r: torch.Tensor, m: Magnitudes, contract: Capabilities, case: Case, output: str, policy: Policy
) -> torch.Tensor:
    """bound_i of every element of ``output`` (float64, CPU)."""
    r = r.detach().cpu().to(F64)
    return policy.model.bound(r, m, arithmetic(contract, case, output))


def bound_usage(a: torch.Tensor, r: torch.Tensor, bound: torch.Tensor) -> float:
    """max_i |a_i - r_i| / bound_i (0 for an empty output)."""
    if r.numel() == 0:
        return 0.0
    diff = (a.detach().cpu().to(F64) - r.detach().cpu().to(F64)).abs()
    diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)
    ratio = torch.where(bound > 0, diff / torch.where(bound > 0, bound, 1.0), diff * math.inf)
    ratio = torch.nan_to_num(ratio, nan=0.0)  # 0 * inf: an exact zero with a zero bound
    return float(ratio.max())
