"""The performance model of docs/spec.md §5: ``t >= max(F / P_eff, D / BW_eff)``.

F counts the arithmetic the operator must do and D the bytes it must move (read every input
once, write every output once), from a case's shapes alone. P_eff and BW_eff are *measured* on
the device (fused multiply-adds on a cache-resident buffer; a copy of D bytes — Dao's own
yardstick, "as fast as a memcpy"), never peak sheet numbers. Efficiency = time floor / measured.

Flop conventions (multiply and add count separately), per output element:
- z: K multiplies + K-1 adds (+1 with bias); SiLU: sigmoid 3 (exp, add, reciprocal) + 1 mul.
- backward: with SiLU, z is recomputed (as above) and dz = g * s * (1 + z (1 - s)) costs 3 + 5;
  dx: K multiplies + K-1 adds; dw: K multiplies + K adds; db: 1 add; dF: 1 add per state entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from convmatrix.core.case import Case
from convmatrix.core.dtypes import ITEMSIZE

__all__ = ["Rates", "Work", "efficiency", "time_floor", "work_of"]

SILU_FLOPS = 4
SILU_GRAD_FLOPS = 8


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)


def _z_flops(case: Case) -> int:
    return 2 * case.width - 1 + int(case.bias)


def forward_work(case: Case) -> Work:
    b, c, n, k = case.batch, case.dim, case.seqlen or 0, case.width
    sx, sw = ITEMSIZE[case.x_dtype], ITEMSIZE[case.w_dtype]
    silu = case.activation == "silu"
    flops = b * c * n * (_z_flops(case) + SILU_FLOPS * silu)
    state = b * c * (k - 1) * sx
    moved = 2 * b * c * n * sx + c * k * sw + case.bias * c * sw
    moved += state * (case.initial_state not in (None, "none")) + state * bool(case.final_state)
    moved += b * n * 4 * (case.seq_lens is not None)  # int32 seq_idx
    return Work(flops, moved)


def backward_work(case: Case) -> Work:
    b, c, n, k = case.batch, case.dim, case.seqlen or 0, case.width
    sx, sw = ITEMSIZE[case.x_dtype], ITEMSIZE[case.w_dtype]
    silu = case.activation == "silu"
    per = (2 * k - 1) + 2 * k + int(case.bias)
    if silu:
        per += _z_flops(case) + SILU_GRAD_FLOPS
    init = case.initial_state not in (None, "none")
    dfinal = bool(case.final_state) and case.dfinal == "random"
    flops = b * c * n * per + b * c * (k - 1) * dfinal
    state = b * c * (k - 1) * sx
    # read x, g; write dx; weight in, dw out; bias read (SiLU recompute) and db out
    moved = 3 * b * c * n * sx + 2 * c * k * sw + case.bias * c * sw * (1 + silu)
    moved += 2 * state * init + state * dfinal  # initial state in, dS out; q in
    moved += b * n * 4 * (case.seq_lens is not None)
    return Work(flops, moved)


def update_work(case: Case) -> Work:
    """One decode step of ``tokens`` tokens (the timed unit of an update case)."""
    b, c, t, k = case.batch, case.dim, case.tokens or 0, case.width
    s = case.state_len or (k - 1)
    sx, sw = ITEMSIZE[case.x_dtype], ITEMSIZE[case.w_dtype]
    flops = b * c * t * (_z_flops(case) + SILU_FLOPS * (case.activation == "silu"))
    moved = 2 * b * c * t * sx + c * k * sw + case.bias * c * sw
    # history read; the shifting state is rewritten whole, the ring only gets the new tokens
    moved += b * c * (k - 1) * sx + (
        b * c * min(t, s) * sx if case.circular else 2 * b * c * s * sx
    )
    moved += b * 4 * (bool(case.circular) + bool(case.slots))  # int32 cache_seqlens / slots
    return Work(flops, moved)


def work_of(case: Case) -> Work:
    """The work of one timed call of ``case`` (forward, forward+backward, or one update)."""
    if case.op == "update":
        return update_work(case)
    work = forward_work(case)
    return work + backward_work(case) if case.op == "fwd_bwd" else work


@dataclass(frozen=True)
class Rates:
    bandwidth: float  # bytes/s, from clone
    compute: float  # flop/s, from a fused multiply-add


def time_floor(work: Work, rates: Rates) -> float:
    return max(work.flops / rates.compute, work.bytes / rates.bandwidth)


def efficiency(floor_s: float, measured_s: float) -> float:
    return floor_s / measured_s if measured_s > 0 else float("nan")
