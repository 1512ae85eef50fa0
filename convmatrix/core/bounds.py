"""The bound model: how far an honest kernel's output may be from the float64 reference.

docs/spec.md §4 "Bound model". The reference sees the same rounded inputs as the kernel, so
the storage rounding of the inputs is already removed; what remains is the kernel's own
arithmetic, bounded element by element from quantities the reference computes beside each
output (``Magnitudes``):

    bound_i = u_out |r_i|                                  rounding of the result
            + (gamma(n) u_acc [+ u_int]) mag_i             the accumulation of n terms
            + (c_act u_act + u_int) elem_i                 activation / stored intermediates
            + (gamma(n_z) u_acc + u_int) zsens_i           z's error seen through SiLU'
            + eta_out                                      the output dtype's subnormal step

``mag`` is the sum of |terms| the element accumulates (|b| + sum_k |w_k x_{t-k}| for y; the
same sums for dx, dS, and for dw/db over the B*L reduction), ``n`` the number of terms,
``elem`` the sensitivity to a relative error of the element-wise values it is built from (y
after SiLU, dz = g silu'(z) in the backward), ``zsens`` the sensitivity of a backward output
to the error of the recomputed pre-activation z. ``gamma`` is probabilistic by default
(Higham & Mary 2019: with probability at least 1 - 2n exp(-lambda^2 (1-u)^2 / 2) the
accumulated error is below lambda sqrt(n) u; lambda = 6 makes that failure probability
~1e-7 per element at n = 10^4) and the worst-case ``n u / (1 - n u)`` is selectable.

A kernel declares its arithmetic (``Capabilities.accumulate``, ``intermediate``): the
accumulation dtype sets ``u_acc``; ``intermediate="input"`` says intermediate results (z,
SiLU, dz, a reduction's partial results, the weight cast to x's dtype) are rounded to the
input dtype, so ``u_int`` and the output rounding are at least the input dtype's and every
accumulated term carries one more rounding (the ``[+ u_int]``).

``usage = max_i |a_i - r_i| / bound_i``: the verdict allows ``safety`` (2, for the terms the
model rounds down: a few operations per activation, FMAs counted once). No torch import: the
functions take floats or tensors alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from convmatrix.core.dtypes import UNIT_ROUNDOFF

__all__ = [
    "ACT_OPS",
    "BOUND_MODES",
    "DEFAULT_LAMBDA",
    "DEFAULT_SAFETY",
    "INTERMEDIATES",
    "TINY",
    "Arithmetic",
    "BoundModel",
    "Magnitudes",
    "gamma",
]

BOUND_MODES = ("probabilistic", "worst_case")
INTERMEDIATES = ("fp32", "input")
DEFAULT_LAMBDA = 6.0
# The verdict's allowance over the model: the model counts an FMA as one rounding and a few
# operations per activation; twice the bound covers what it rounds down and nothing more.
DEFAULT_SAFETY = 2.0
# Rounding steps of an activation and its derivative: sigmoid (exp, add, divide), a product.
ACT_OPS = 5.0
# Half the smallest subnormal step of each dtype: the absolute error of rounding a tiny value.
TINY = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134, "float64": 2.0**-1075}


def gamma(n: Any, u: float, mode: str = "probabilistic", lam: float = DEFAULT_LAMBDA) -> Any:
    """The relative error factor of accumulating n terms at unit roundoff u.

    ``probabilistic``: lambda sqrt(n) u (Higham & Mary 2019, Theorem 3.1, rounding errors
    independent with mean zero), or the worst case where that is smaller (n < lambda^2);
    ``worst_case``: n u / (1 - n u) (Higham, Accuracy and Stability, §3.1), infinite once
    n u >= 1. ``n`` may be an int or a tensor.
    """
    if mode not in BOUND_MODES:
        raise ValueError(f"unknown bound mode {mode!r}: one of {BOUND_MODES}")
    nu = n * u
    if isinstance(nu, int | float):
        worst = nu / (1 - nu) if nu < 1 else math.inf
    else:
        worst = nu / (1 - nu).clamp(min=0)
    if mode == "worst_case":
        return worst
    # The worst case always holds; it is the smaller one below n = lambda^2 (36 terms).
    prob = lam * (n**0.5) * u
    return min(prob, worst) if isinstance(prob, int | float) else prob.minimum(worst)


@dataclass
class Magnitudes:
    """What the reference computes beside one output (tensors of its shape, or None)."""

    mag: Any  # sum of |terms| of the output's accumulation
    n: int  # terms per element
    elem: Any = None  # sensitivity to element-wise rounding (activation, stored intermediates)
    zsens: Any = None  # sensitivity to the pre-activation's error (SiLU backward)
    n_z: int = 0  # terms of the pre-activation z


@dataclass(frozen=True)
class Arithmetic:
    """A kernel's declared arithmetic for one output: accumulation and intermediate dtypes,
    the output's storage dtype and the input (x) dtype."""

    accumulate: str = "float32"
    intermediate: str = "fp32"  # "fp32" | "input"
    out_dtype: str = "float32"
    in_dtype: str = "float32"

    def units(self) -> tuple[float, float, float]:
        """(u_out, u_acc, u_int): the output rounding, accumulation and intermediate units."""
        u_fp32 = UNIT_ROUNDOFF["float32"]
        u_in = UNIT_ROUNDOFF[self.in_dtype]
        u_int = max(u_fp32, u_in) if self.intermediate == "input" else u_fp32
        u_out = UNIT_ROUNDOFF[self.out_dtype]
        if self.intermediate == "input":
            u_out = max(u_out, u_in)  # computed in the input dtype, then stored
        return u_out, UNIT_ROUNDOFF[self.accumulate], u_int


@dataclass(frozen=True)
class BoundModel:
    """The model's parameters (a matrix's ``policy:`` or the CLI choose them)."""

    mode: str = "probabilistic"
    lam: float = DEFAULT_LAMBDA

    def bound(self, r: Any, m: Magnitudes, arith: Arithmetic) -> Any:
        """bound_i for reference values ``r`` (absolute values taken here) and magnitudes."""
        u_out, u_acc, u_int = arith.units()
        out = u_out * abs(r) + TINY[arith.out_dtype]  # fresh: the terms below add in place
        if m.n > 0 and m.mag is not None:
            coeff = gamma(m.n, u_acc, self.mode, self.lam)
            if arith.intermediate == "input":
                coeff = coeff + u_int  # every term's factors rounded to the input dtype
            out = _plus(out, coeff, m.mag)
        if m.elem is not None:
            out = _plus(out, ACT_OPS * u_int + u_int, m.elem)
        if m.zsens is not None:
            out = _plus(out, gamma(max(m.n_z, 1), u_acc, self.mode, self.lam) + u_int, m.zsens)
        return out


def _plus(out: Any, coeff: Any, t: Any) -> Any:
    """out + coeff * t, in place on a tensor ``out`` (a fresh tensor per term at C=4128,
    L=4096 costs more in page faults than the arithmetic)."""
    if hasattr(out, "add_") and isinstance(coeff, int | float):
        return out.add_(t, alpha=coeff)
    return out + coeff * t
