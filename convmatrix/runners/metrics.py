"""Error metrics of one output against the float64 reference (docs/spec.md §4). Pure numerics.

For kernel output ``a`` and reference ``r`` (same shape, any dtype; compared in float64):

- ``e_abs  = max |a - r|``
- ``e_rel  = max |a - r| / max(|r|, tau)`` with ``tau = tau_scale * rms(r)``: near-zero outputs
  (SiLU straddles zero) are judged against the data scale, not their own tiny magnitude;
- ``e_norm = ||a - r||_2 / ||r||_2``: widespread rounding vs a few bad positions.

A non-finite element of ``a`` where ``r`` is finite counts as an infinite difference, so NaN
never compares as "small". 0/0 (an exact zero where the reference is zero) counts as 0.
"""

from __future__ import annotations

import math

import torch

from convmatrix.core.records import ErrorMetrics

__all__ = ["error_metrics", "rms"]

F64 = torch.float64


def rms(r: torch.Tensor) -> float:
    """Root mean square of ``r`` (0 for an empty tensor)."""
    if r.numel() == 0:
        return 0.0
    r = r.detach().to(F64)
    return float(torch.sqrt((r * r).mean()))


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den elementwise with 0/0 = 0 and x/0 = inf."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    out = num / safe
    return torch.where(den > 0, out, torch.where(num > 0, math.inf, 0.0))


def error_metrics(a: torch.Tensor, r: torch.Tensor, tau_scale: float = 1.0) -> ErrorMetrics:
    """Metrics of ``a`` against ``r``; shapes must match (``ValueError`` otherwise)."""
    if tuple(a.shape) != tuple(r.shape):
        raise ValueError(f"shape {tuple(a.shape)} differs from the reference's {tuple(r.shape)}")
    scale = rms(r)
    tau = tau_scale * scale
    if r.numel() == 0:
        return ErrorMetrics(0.0, 0.0, 0.0, tau, scale, None)
    a = a.detach().cpu().to(F64)
    r = r.detach().cpu().to(F64)
    diff = (a - r).abs()
    if not bool(torch.isfinite(diff).all()):  # rare: keep the fast path free of masks
        diff = torch.where(torch.isfinite(a) | ~torch.isfinite(r), diff, math.inf)
        diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)
    flat = int(torch.argmax(diff))
    worst = [int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)]
    e_abs = float(diff.reshape(-1)[flat])  # diff keeps a channel-last layout: no view
    if tau > 0:  # every denominator is positive
        e_rel = float((diff / torch.clamp(r.abs(), min=tau)).max())
    else:
        e_rel = float(_ratio(diff, r.abs()).max())
    e_norm = float(_ratio(torch.linalg.vector_norm(diff), torch.linalg.vector_norm(r)))
    return ErrorMetrics(e_abs, e_rel, e_norm, tau, scale, worst)
