"""Precision-defect kernels: correct formulas, wrong arithmetic, declared as honest FP32 kernels.

Each is the same FP32 implementation of docs/spec.md §2 (``Fp32Kernel``: taps accumulated in
FP32 from the stored inputs, SiLU in FP32, backward by the formulas, results rounded once to
their storage dtype) with one precision defect of the kind a port to a half-precision path
makes. The defects act only when x is stored in a half-precision dtype (fp16 or bf16), as
they would in a kernel whose FP32 path is right; each declares the default arithmetic
(``accumulate`` FP32, ``intermediate`` FP32), so the bound model holds it to what it claims.

| kernel | defect |
|---|---|
| ``HalfAccumulation`` | the K-tap sum accumulated in the input dtype (each partial sum rounded) |
| ``HalfTanhSilu`` | SiLU as z/2 (1 + tanh(z/2)) evaluated in the input dtype |
| ``StorageIntermediates`` | z rounded to the input dtype before SiLU, dz before the backward sums |
| ``HalfTreeReduction`` | dw/db reduced over B*L by a pairwise tree whose levels are rounded |
| ``HalfRunningSum`` | dw/db accumulated token by token in the input dtype |
| ``Bf16Products`` | every product w_k x_{t-k} rounded to bfloat16 before the FP32 sum |

``benchmarks/bench_bounds.py --defects`` says which policy catches each on which matrix.

``SUBTLE`` holds a defect that stays under its bound, so its cases pass; only the
error-regression rule can notice it (docs/regression-rule.md):

- ``ChoppedRunningSum``: dw/db accumulated token by token in FP32 with every add rounded
  toward zero (an accumulator without round-to-nearest), at every dtype.

Its rounding errors all point toward zero instead of averaging out: on the benchmark's cases
(nightly, and B*L up to 16384 in ``benchmarks/long_reductions.matrix.yaml``) its fp32 dw uses
up to 0.46 of the bound, a hundred to a few thousand times what the honest kernel uses.
"""

from __future__ import annotations

import torch

from convmatrix.kernels.interface.protocol import Capabilities, KernelBase
from convmatrix.kernels.interface.semantics import (
    check_forward_args,
    is_silu,
    packed_tap_masks,
    update_via_forward,
)

__all__ = [
    "DEFECTS",
    "SUBTLE",
    "Bf16Products",
    "ChoppedRunningSum",
    "Fp32Kernel",
    "HalfAccumulation",
    "HalfRunningSum",
    "HalfTanhSilu",
    "HalfTreeReduction",
    "StorageIntermediates",
]

F32 = torch.float32
HALF = (torch.float16, torch.bfloat16)


def _round(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` rounded to ``dtype`` and back to FP32 (no-op for None)."""
    return t if dtype is None else t.to(dtype).to(F32)


class Fp32Kernel(KernelBase):
    """The honest FP32 implementation the defects modify through their hooks; ``half`` is
    the input dtype when it is fp16/bf16 (the path a defect acts on), else None."""

    name = "fp32"
    capabilities = Capabilities()

    # -- hooks (honest defaults) --------------------------------------------------------------
    def add_tap(self, z: torch.Tensor, tap: torch.Tensor, w: torch.Tensor, half) -> torch.Tensor:
        return z.addcmul_(tap, w)

    def pre_activation(self, z: torch.Tensor, half) -> torch.Tensor:
        return z

    def silu(self, z: torch.Tensor, half) -> torch.Tensor:
        return z * torch.sigmoid(z)

    def grad_z(self, dz: torch.Tensor, half) -> torch.Tensor:
        return dz

    def reduce(self, terms: torch.Tensor, half) -> torch.Tensor:
        """sum over (batch, time) of (B, C, L) terms."""
        return terms.sum(dim=(0, 2))

    # -- the computation ----------------------------------------------------------------------
    def _forward32(self, x, weight, bias, state, seq_idx, silu):
        batch, dim, seqlen = x.shape
        width = weight.shape[1]
        half = x.dtype if x.dtype in HALF else None
        w = weight.to(F32)
        s = x.new_zeros(batch, dim, width - 1) if state is None else state
        xe = torch.cat([s.to(F32), x.to(F32)], dim=2)
        z = torch.zeros(batch, dim, seqlen, dtype=F32, device=x.device)
        if bias is not None:
            z += bias.to(F32)[None, :, None]
        masks = None if seq_idx is None else packed_tap_masks(seq_idx, width)[:, :, None, :]
        for k in range(width):
            tap = xe[:, :, k : k + seqlen]
            if masks is not None:
                tap = tap * masks[k]
            z = self.add_tap(z, tap, w[None, :, k, None], half)
        z = self.pre_activation(z, half)
        y = self.silu(z, half) if silu else z
        if seq_idx is not None:
            y = y * (seq_idx[:, None, :] >= 0)
        return y, xe, z, masks, half

    def _backward32(self, x, weight, bias, state, seq_idx, silu, g, q):
        _, xe, z, masks, half = self._forward32(x, weight, bias, state, seq_idx, silu)
        width, seqlen = weight.shape[1], x.shape[2]
        w = weight.to(F32)
        dz = g.to(F32)
        if silu:
            sg = torch.sigmoid(z)
            dz = dz * sg * (1 + z * (1 - sg))
        if seq_idx is not None:
            dz = dz * (seq_idx[:, None, :] >= 0)
        dz = self.grad_z(dz, half)
        dxe = torch.zeros_like(xe)
        dw = torch.empty_like(w)
        for k in range(width):
            dzk = dz if masks is None else dz * masks[k]
            dxe[:, :, k : k + seqlen].addcmul_(dzk, w[None, :, k, None])
            dw[:, k] = self.reduce(dzk * xe[:, :, k : k + seqlen], half)
        if q is not None:
            dxe[:, :, seqlen:] += q.to(F32)
        db = self.reduce(dz, half)
        return dxe[:, :, width - 1 :], dw, db, dxe[:, :, : width - 1]

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        initial_state: torch.Tensor | None = None,
        seq_idx: torch.Tensor | None = None,
        return_final_state: bool = False,
        activation: str | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_forward_args(x, weight, bias, initial_state, seq_idx, activation)
        silu = is_silu(activation)
        y, final = _Function.apply(x, weight, bias, initial_state, seq_idx, silu, self)
        return (y, final) if return_final_state else y

    def update(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        activation: str | None = None,
        cache_seqlens: torch.Tensor | None = None,
        state_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        def forward(xl, w, b, history, act):
            y = self._forward32(xl, w, b, history, None, is_silu(act))[0]
            return y.to(xl.dtype)

        with torch.no_grad():
            return update_via_forward(
                forward, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, state, seq_idx, silu, kernel):  # type: ignore[override]
        y = kernel._forward32(x, weight, bias, state, seq_idx, silu)[0]
        width, seqlen = weight.shape[1], x.shape[2]
        s = x.new_zeros(x.shape[0], x.shape[1], width - 1) if state is None else state
        final = torch.cat([s.to(x.dtype), x], dim=2)[:, :, seqlen:].clone()
        ctx.save_for_backward(x, weight, bias, state, seq_idx)
        ctx.silu, ctx.kernel = silu, kernel
        return y.to(x.dtype), final

    @staticmethod
    def backward(ctx, g, q):  # type: ignore[override]
        x, weight, bias, state, seq_idx = ctx.saved_tensors
        dx, dw, db, ds = ctx.kernel._backward32(x, weight, bias, state, seq_idx, ctx.silu, g, q)
        return (
            dx.to(x.dtype),
            dw.to(weight.dtype),
            None if bias is None else db.to(bias.dtype),
            None if state is None else ds.to(state.dtype),
            None,
            None,
            None,
        )


class HalfAccumulation(Fp32Kernel):
    """The tap sum kept in the input dtype: every partial sum rounded to fp16/bf16."""

    name = "half_accumulation"

    def add_tap(self, z, tap, w, half):
        return _round(z.addcmul_(tap, w), half)


class HalfTanhSilu(Fp32Kernel):
    """A cheaper SiLU on the half path: z/2 (1 + tanh(z/2)), each step in the input dtype."""

    name = "half_tanh_silu"

    def silu(self, z, half):
        if half is None:
            return super().silu(z, half)
        h = _round(z * 0.5, half)
        return _round(h * _round(1 + _round(torch.tanh(h), half), half), half)


class StorageIntermediates(Fp32Kernel):
    """z stored in the input dtype before the activation, and dz before the backward sums
    (the FP32 registers spilled to a half-precision buffer)."""

    name = "storage_intermediates"

    def pre_activation(self, z, half):
        return _round(z, half)

    def grad_z(self, dz, half):
        return _round(dz, half)


class HalfTreeReduction(Fp32Kernel):
    """dw/db reduced over B*L by a pairwise tree whose every level is rounded to the input
    dtype (a reduction done in the wrong dtype)."""

    name = "half_tree_reduction"

    def reduce(self, terms, half):
        if half is None:
            return super().reduce(terms, half)
        flat = terms.transpose(0, 1).reshape(terms.shape[1], -1)  # (C, B*L)
        while flat.shape[1] > 1:
            if flat.shape[1] % 2:
                flat = torch.cat([flat, flat.new_zeros(flat.shape[0], 1)], dim=1)
            flat = _round(flat[:, 0::2] + flat[:, 1::2], half)
        return flat[:, 0]


class HalfRunningSum(Fp32Kernel):
    """dw/db accumulated token by token in the input dtype."""

    name = "half_running_sum"

    def reduce(self, terms, half):
        if half is None:
            return super().reduce(terms, half)
        flat = terms.transpose(0, 1).reshape(terms.shape[1], -1)
        acc = flat.new_zeros(flat.shape[0])
        for i in range(flat.shape[1]):
            acc = _round(acc + flat[:, i], half)
        return acc


class Bf16Products(Fp32Kernel):
    """Each product w_k x_{t-k} rounded to bfloat16 before the FP32 sum (a bf16 multiplier
    on the half path, even for fp16 inputs)."""

    name = "bf16_products"

    def add_tap(self, z, tap, w, half):
        if half is None:
            return z.addcmul_(tap, w)
        return z.add_(_round(tap * w, torch.bfloat16))


def _chop(exact: torch.Tensor) -> torch.Tensor:
    """Float64 values rounded toward zero to FP32 (truncated, where FP32 adds round to
    nearest)."""
    r = exact.to(F32)
    over = r.double().abs() > exact.abs()
    return torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)


class ChoppedRunningSum(Fp32Kernel):
    """dw/db accumulated token by token in FP32, each add rounded toward zero (the float64
    sum of two FP32 values is exact, then truncated)."""

    name = "chopped_running_sum"

    def reduce(self, terms, half):
        flat = terms.transpose(0, 1).reshape(terms.shape[1], -1)
        acc = flat.new_zeros(flat.shape[0])
        for i in range(flat.shape[1]):
            acc = _chop(acc.double() + flat[:, i].double())
        return acc


DEFECTS = {
    "HalfAccumulation": HalfAccumulation,
    "HalfTanhSilu": HalfTanhSilu,
    "StorageIntermediates": StorageIntermediates,
    "HalfTreeReduction": HalfTreeReduction,
    "HalfRunningSum": HalfRunningSum,
    "Bf16Products": Bf16Products,
}

SUBTLE = {"ChoppedRunningSum": ChoppedRunningSum}
