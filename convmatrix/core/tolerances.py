"""Tolerances are data: a per-(dtype, output) table and the pass policy (docs/spec.md §4).

Errors are measured against the float64 reference computed from the same dtype-rounded inputs,
so what remains is the kernel's own arithmetic: rounding of the output to its dtype (half an
ulp relative: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16) plus accumulation of K products in FP32.

- ``rel`` bounds e_rel = max |a-r| / max(|r|, tau) with tau = ``tau_scale`` x rms(r); near-zero
  outputs (SiLU straddles zero) are judged against the data scale, not their own tiny value.
- ``norm`` bounds e_norm = ||a-r|| / ||r||: rounding spread over every element.
Forward outputs (y, F, dx, dS, state) get 32x the unit roundoff on rel and 8x on norm.
Parameter gradients (dw, db) are reductions over B*L terms and are stored in the weight dtype;
kernels accumulate them in FP32 in a different order than the float64 reference, so they get
their own, looser rows (4x the forward limits), as the seed asks; F and state are copies of
inputs and must be exact up to the storage dtype, but share the forward row for simplicity.
An FP32 tile-boundary bug produces errors of O(1) relative, orders of magnitude above these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from convmatrix.core.bounds import BOUND_MODES, DEFAULT_LAMBDA, DEFAULT_SAFETY, BoundModel
from convmatrix.core.dtypes import UNIT_ROUNDOFF

__all__ = [
    "DEFAULT_TOLERANCES",
    "OUTPUTS",
    "PARAM_GRADS",
    "Policy",
    "Tolerance",
    "Tolerances",
]

OUTPUTS = ("y", "F", "dx", "dw", "db", "dS", "state")
PARAM_GRADS = frozenset({"dw", "db"})


@dataclass(frozen=True)
class Tolerance:
    rel: float  # bound on e_rel
    norm: float  # bound on e_norm


def _default_row(dtype: str, output: str) -> Tolerance:
    u = UNIT_ROUNDOFF[dtype]
    # fp32 is the floor: results stored in fp32 still accumulate K products in fp32.
    u = max(u, 2.0**-24)
    factor = 4.0 if output in PARAM_GRADS else 1.0
    return Tolerance(rel=32 * u * factor, norm=8 * u * factor)


DEFAULT_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    (dt, out): _default_row(dt, out) for dt in UNIT_ROUNDOFF for out in OUTPUTS
}


@dataclass(frozen=True)
class Policy:
    """How a case's outputs are judged.

    ``bound`` (the default): the bound usage max_i |a_i - r_i| / bound_i of the bound model
    (docs/spec.md §4, ``convmatrix.core.bounds``) is at most ``safety``; ``bound_mode``
    (probabilistic | worst_case) and ``bound_lambda`` parametrise the model.
    ``threshold``: e_rel <= rel and e_norm <= norm of the (dtype, output) row.
    ``framework``: flash-attention's rule, e <= factor x (framework path's e) + floor, for e_rel
    and e_norm; an output passes if either rule holds when ``rule`` is ``threshold_or_framework``.
    The policy is this object; its ``rule`` is the name that picks the comparison (``--policy
    RULE`` on the command line, ``policy: {rule: ...}`` in a matrix).
    """

    rule: str = "bound"  # "bound" | "threshold" | "framework" | "threshold_or_framework"
    factor: float = 2.0
    floor: float = 1e-6
    tau_scale: float = 1.0
    safety: float = DEFAULT_SAFETY
    bound_mode: str = "probabilistic"
    bound_lambda: float = DEFAULT_LAMBDA

    def __post_init__(self) -> None:
        if self.bound_mode not in BOUND_MODES:
            raise ValueError(f"unknown bound mode {self.bound_mode!r}: one of {BOUND_MODES}")

    @property
    def model(self) -> BoundModel:
        return BoundModel(self.bound_mode, self.bound_lambda)


@dataclass(frozen=True)
class Tolerances:
    """The table a matrix declares; rows it does not name fall back to the defaults."""

    rows: Mapping[tuple[str, str], Tolerance] = field(default_factory=dict)

    def lookup(self, dtype: str, output: str) -> Tolerance:
        """The limits for ``output`` of a case whose x dtype is ``dtype``."""
        key = (dtype, output)
        if key in self.rows:
            return self.rows[key]
        return DEFAULT_TOLERANCES[key]
