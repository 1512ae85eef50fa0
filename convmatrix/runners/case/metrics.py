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
from convmatrix.runners.case.transposed import copy_into

__all__ = ["ErrorSums", "abs_diff", "error_metrics", "rms", "unravel"]

F64 = torch.float64


def rms(r: torch.Tensor) -> float:
    """Root mean square of ``r`` (0 for an empty tensor)."""
    if r.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(r.detach(), dtype=F64)) / math.sqrt(r.numel())


def abs_diff(a: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """|a - r| in float64 on ``r``'s device (the host, or the case's device when the reference
    runs there), in ``r``'s memory layout; a non-finite difference (NaN or inf in ``a`` or
    ``r``) is +inf.

    ``a`` is copied into r's layout first (``transposed.copy_into``): a kernel's channel-last
    output against a channel-first reference would otherwise make every later element-wise
    pass a strided one (3-7x slower at C=4128, L=4096). Every pass but the copy works in
    place: fresh tensors of that size cost more in page faults than in arithmetic.
    """
    r = r.detach()
    out = copy_into(torch.empty_like(r, dtype=F64), a.detach())
    out.sub_(r).abs_()
    if out.numel() and not math.isfinite(
        float(out.max())
    ):  # NaN propagates to the max; rare: no masks
        out.nan_to_num_(nan=math.inf, posinf=math.inf)
    return out


def unravel(flat: int, shape: tuple[int, ...] | torch.Size) -> list[int]:
    """The index of element ``flat`` of a tensor of ``shape`` (row-major), in Python:
    ``torch.unravel_index`` costs about half a millisecond a call, on every output block."""
    where = []
    for size in reversed(tuple(shape)):
        flat, i = divmod(flat, size) if size else (flat, 0)
        where.append(i)
    return where[::-1]


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den elementwise with 0/0 = 0 and x/0 = inf."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    out = num / safe
    return torch.where(den > 0, out, torch.where(num > 0, math.inf, 0.0))


class ErrorSums:
    """The three errors of one output, accumulated over blocks of its channels.

    ``add`` takes one block (a channel slice of the output and of the reference) at a time,
    so a large case is judged while its blocks are in cache. e_rel needs tau, the rms of the
    whole reference: the reference is kept (``r_store``, which several outputs compared with
    the same reference share) and ``metrics`` takes the ratio in a second pass over the
    blocks. Kept are the reference's values, not |a - r| and |r|: fresh memory costs a page
    fault per 4 KiB, and one store is a quarter of four.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        channel_dim: int,
        r_store: torch.Tensor | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.shape, self.dim = shape, channel_dim
        self.owns_store = r_store is None
        if r_store is None:  # on the reference's device (``device``; None: the host)
            r_store = torch.empty(shape, dtype=F64, device=device)
        self.r_store = r_store
        self.sumsq_r = self.sumsq_d = 0.0
        self.e_abs, self.worst = -1.0, None
        self.blocks: list[slice | None] = []
        self.whole: torch.Tensor | None = None  # |a - r| of an output seen in one block

    def part(self, t: torch.Tensor, block: slice | None) -> torch.Tensor:
        """Channels ``block`` of ``t`` (all for None)."""
        return t if block is None else t.narrow(self.dim, block.start, block.stop - block.start)

    def add(
        self, block: slice | None, a: torch.Tensor, r: torch.Tensor, diff: torch.Tensor | None
    ) -> None:
        """One block: ``a`` and ``r`` of the block's shape, ``diff`` = ``abs_diff(a, r)``."""
        if r.numel() == 0:
            return
        self.blocks.append(block)
        if diff is None:
            diff = abs_diff(a, r)
        if block is None:  # the second pass (e_rel) reads it instead of computing it again
            self.whole = diff
        if self.owns_store:
            self.part(self.r_store, block).copy_(r)
        self.sumsq_r += float(torch.linalg.vector_norm(r, dtype=F64)) ** 2
        self.sumsq_d += float(torch.linalg.vector_norm(diff)) ** 2
        flat = int(torch.argmax(diff))
        worst = unravel(flat, diff.shape)
        value = float(diff[tuple(worst)])
        if value > self.e_abs or self.worst is None:
            if block is not None:
                worst[self.dim] += block.start
            self.e_abs, self.worst = value, worst

    def metrics(self, a: torch.Tensor, tau_scale: float) -> ErrorMetrics:
        """The metrics of ``a`` (the whole output ``add`` saw block by block)."""
        n = math.prod(self.shape)
        scale = math.sqrt(self.sumsq_r / n) if n else 0.0
        tau = tau_scale * scale
        if n == 0:
            return ErrorMetrics(0.0, 0.0, 0.0, tau, scale, None)
        e_rel = 0.0
        for block in self.blocks:
            r = self.part(self.r_store, block)
            if block is None and self.whole is not None:  # a caller's: not changed in place
                d = self.whole / r.abs().clamp_(min=tau) if tau > 0 else self.whole
            else:
                d = abs_diff(self.part(a, block), r)
                if tau > 0:
                    d.div_(r.abs().clamp_(min=tau))
            if tau > 0:  # every denominator is positive
                e_rel = max(e_rel, float(d.max()))
            else:
                e_rel = max(e_rel, float(_ratio(d, r.abs()).max()))
        r_norm, d_norm = math.sqrt(self.sumsq_r), math.sqrt(self.sumsq_d)
        e_norm = d_norm / r_norm if r_norm > 0 else (math.inf if d_norm > 0 else 0.0)
        return ErrorMetrics(self.e_abs, e_rel, e_norm, tau, scale, self.worst)


def error_metrics(
    a: torch.Tensor, r: torch.Tensor, tau_scale: float = 1.0, *, diff: torch.Tensor | None = None
) -> ErrorMetrics:
    """Metrics of ``a`` against ``r``; shapes must match (``ValueError`` otherwise). ``diff``:
    ``abs_diff(a, r)`` when the caller has it already (the bound usage needs it too)."""
    if tuple(a.shape) != tuple(r.shape):
        raise ValueError(f"shape {tuple(a.shape)} differs from the reference's {tuple(r.shape)}")
    r = r.detach().to(F64)
    sums = ErrorSums(tuple(r.shape), 0, r_store=r)
    sums.add(None, a, r, diff)
    return sums.metrics(a, tau_scale)
