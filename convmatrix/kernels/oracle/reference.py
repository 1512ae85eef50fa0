"""The float64 oracle: docs/spec.md §2, vectorised with torch, explicit backward.

Forward is the window formula ``z[t] = bias + sum_k w[k] * xe[t+k]`` as a loop over the K taps
(``addcmul_``): float64 depthwise ``F.conv1d`` on CPU takes a slow per-channel path (20-70 ms
at C=4128 even for L=1) while the tap loop agrees to 1e-14 and is far faster. Backward never
calls autograd on the forward: ``dz``, ``dxe``, ``dw``, ``db`` follow the formulas of §2, so
an autograd check of the forward against it is an independent test.

Shapes: x (B, C, L), weight (C, K), bias (C,), initial_state (B, C, K-1), seq_idx (B, L),
g = dL/dy (B, C, L), q = dL/dF (B, C, K-1).

With ``magnitudes=True`` both also compute, in the same tap loops, what the bound model of
docs/spec.md §4 needs (``convmatrix.core.bounds.Magnitudes`` per output): the same
computation on absolute values (|b| + sum_k |w_k| |x_{t-k}| for z, sum_k |w_k| |dz| for dx,
sum_{b,t} |dz| |x| for dw...), the reduction length, and for SiLU the sensitivities to the
activation's rounding and to the error of z; |w| counts as at least x's smallest normal
(docs/spec.md §4). One extra ``addcmul_`` per tap in the forward, two per tap in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from convmatrix.core.bounds import Magnitudes
from convmatrix.kernels.interface.corecall import CoreArgs, CoreCall, update_history
from convmatrix.kernels.interface.protocol import Capabilities, KernelBase
from convmatrix.kernels.interface.semantics import (
    check_forward_args,
    is_silu,
    packed_tap_masks,
    update_via_forward,
)

__all__ = [
    "ReferenceKernel",
    "Saved",
    "backward_magnitudes",
    "conv_backward",
    "conv_forward",
    "forward_magnitudes",
    "reference_forward",
]

F64 = torch.float64


@dataclass
class Saved:
    """What backward needs from forward: the extended input, z, masks and flags."""

    xe: torch.Tensor  # (B, C, L+K-1)
    z: torch.Tensor  # (B, C, L), pre-activation
    masks: torch.Tensor | None  # (K, B, L) live taps, packed only
    live: torch.Tensor | None  # (B, L) non-padding tokens, packed only
    silu: bool
    mag_z: torch.Tensor | None = None  # |b| + sum_k |w_k| |xe|: z's magnitude (magnitudes=True)
    n_z: int = 0  # terms of z: K, +1 with a bias
    sig: torch.Tensor | None = None  # sigmoid(z), SiLU only: computed once, used three times
    w_tiny: float = 0.0  # the smallest |w| the magnitudes count: x's smallest normal


# The element-wise passes below work in place on one fresh tensor each: at C=4128, L=4096 a
# fresh float64 tensor per operation costs more in page faults than the arithmetic.


def _silu_d1(z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)."""
    return torch.rsub(s, 1).mul_(z).add_(1).mul_(s)


def _silu_d2(z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """silu''(z) = s (1 - s) (2 + z (1 - 2 s))."""
    out = torch.mul(s, -2).add_(1).mul_(z).add_(2).mul_(s)
    return out.sub_(out * s)


def conv_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    activation: str | None = None,
    magnitudes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, Saved]:
    """(y, final_state, saved) in float64, from any-dtype inputs (upcast exactly); with
    ``magnitudes`` saved also holds z's magnitude (``forward_magnitudes`` reads it)."""
    batch, dim, seqlen, width = check_forward_args(
        x, weight, bias, initial_state, seq_idx, activation
    )
    w = weight.to(F64)
    xe = torch.empty(batch, dim, seqlen + width - 1, dtype=F64, device=x.device)
    xe[:, :, width - 1 :].copy_(x)
    if initial_state is None:
        xe[:, :, : width - 1].zero_()
    else:
        xe[:, :, : width - 1].copy_(initial_state)
    z = xe.new_zeros(batch, dim, seqlen)
    mag = xe.new_zeros(batch, dim, seqlen) if magnitudes else None
    if bias is not None:
        z += bias.to(F64)[None, :, None]
        if mag is not None:
            mag += bias.to(F64).abs()[None, :, None]
    masks = live = None
    if seq_idx is not None:
        masks = packed_tap_masks(seq_idx, width)[:, :, None, :]  # (K, B, 1, L)
        live = seq_idx[:, None, :] >= 0
    xa = xe.abs() if mag is not None else None
    # A kernel may round w to x's dtype, where a weight below the smallest normal loses
    # relative precision (an fp32 weight of 6.8e-7 becomes an fp16 subnormal, 4% off): the
    # magnitudes count every |w| as at least that normal, which bounds the absolute error.
    w_tiny = torch.finfo(x.dtype).tiny if x.dtype.is_floating_point else 0.0
    wa = w.abs().clamp_(min=w_tiny)
    for k in range(width):
        tap = xe[:, :, k : k + seqlen]
        if masks is not None:
            tap = tap * masks[k]
        z.addcmul_(tap, w[None, :, k, None])
        if mag is not None and xa is not None:
            atap = xa[:, :, k : k + seqlen]
            mag.addcmul_(atap if masks is None else atap * masks[k], wa[None, :, k, None])
    del xa
    silu = is_silu(activation)
    sig = torch.sigmoid(z) if silu else None
    y = z * sig if sig is not None else z.clone()
    if live is not None:
        y = y * live
        if mag is not None:
            mag = mag * live
    final = xe[:, :, seqlen:].clone()
    n_z = width + (bias is not None)
    return y, final, Saved(xe, z, masks, live, silu, mag, n_z, sig, w_tiny)


def forward_magnitudes(saved: Saved, y: torch.Tensor) -> Magnitudes:
    """y's magnitudes from a ``conv_forward(..., magnitudes=True)``: z's accumulation seen
    through SiLU' (first order), and the activation's own rounding (|y|, plus |silu'(z) z|
    for z rounded before the activation)."""
    assert saved.mag_z is not None, "conv_forward(..., magnitudes=True) first"
    if not saved.silu:
        return Magnitudes(saved.mag_z, saved.n_z)
    assert saved.sig is not None
    d1 = _silu_d1(saved.z, saved.sig).abs_()
    if saved.live is not None:
        d1.mul_(saved.live)
    elem = saved.z.abs().mul_(d1).add_(y.abs())
    return Magnitudes(d1.mul_(saved.mag_z), saved.n_z, elem=elem)


def conv_backward(
    saved: Saved, weight: torch.Tensor, g: torch.Tensor, q: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias, dinitial_state) in float64 from g = dL/dy and q = dL/dF.

    dz = g * silu'(z); dxe[j] = sum_k w[k] dz[j-k] (live taps) + q[j-L] for j >= L;
    dx = dxe[K-1:], dS = dxe[:K-1]; dw[c,k] = sum_{b,t} dz xe[t+k]; db[c] = sum_{b,t} dz.
    """
    return _backward(saved, weight, g, q, False)[0]


def backward_magnitudes(
    saved: Saved, weight: torch.Tensor, g: torch.Tensor, q: torch.Tensor | None
) -> tuple[tuple[torch.Tensor, ...], dict[str, Magnitudes]]:
    """``conv_backward``'s values and the magnitudes of dx, dw, db, dS (``saved`` from a
    ``conv_forward(..., magnitudes=True)``)."""
    values, mags = _backward(saved, weight, g, q, True)
    assert mags is not None
    return values, mags


def _backward(
    saved: Saved, weight: torch.Tensor, g: torch.Tensor, q: torch.Tensor | None, magnitudes: bool
) -> tuple[tuple[torch.Tensor, ...], dict[str, Magnitudes] | None]:
    xe, z = saved.xe, saved.z
    w = weight.to(F64)
    width = w.shape[1]
    seqlen = z.shape[2]
    g = g.to(F64)
    sig = saved.sig
    assert sig is not None or not saved.silu
    dz = _silu_d1(z, sig).mul_(g) if sig is not None else g
    # zsens: |g| |silu''(z)| mag_z, the first-order effect of z's error on dz
    sens = None
    if magnitudes and sig is not None:
        sens = _silu_d2(z, sig).mul_(g).abs_().mul_(saved.mag_z)
    if saved.live is not None:
        dz = dz * saved.live
        sens = None if sens is None else sens.mul_(saved.live)
    dxe = torch.zeros_like(xe)
    dw = torch.empty_like(w)
    adz = dz.abs() if magnitudes else None
    xa = xe.abs() if magnitudes else None
    mx = torch.zeros_like(xe) if magnitudes else None
    mw = torch.empty_like(w) if magnitudes else None
    sx = torch.zeros_like(xe) if sens is not None else None
    sw = torch.empty_like(w) if sens is not None else None
    buf = torch.empty_like(z)  # one product buffer for every per-channel reduction

    def channel_sums(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mul(a, b, out=buf).sum(dim=(0, 2))

    for k in range(width):
        mask = None if saved.masks is None else saved.masks[k]
        dzk = dz if mask is None else dz * mask
        tap = xe[:, :, k : k + seqlen]
        dxe[:, :, k : k + seqlen].addcmul_(dzk, w[None, :, k, None])
        dw[:, k] = channel_sums(dzk, tap)
        if adz is not None and xa is not None and mx is not None and mw is not None:
            adzk = adz if mask is None else adz * mask
            atap = xa[:, :, k : k + seqlen]
            wk = w[None, :, k, None].abs().clamp_(min=saved.w_tiny)
            mx[:, :, k : k + seqlen].addcmul_(adzk, wk)
            mw[:, k] = channel_sums(adzk, atap)
            if sens is not None and sx is not None and sw is not None:
                sk = sens if mask is None else sens * mask
                sx[:, :, k : k + seqlen].addcmul_(sk, wk)
                sw[:, k] = channel_sums(sk, atap)
    del xa
    if q is not None:
        dxe[:, :, seqlen:] += q.to(F64)
        if mx is not None:
            mx[:, :, seqlen:] += q.to(F64).abs()
    db = dz.sum(dim=(0, 2))
    values = (dxe[:, :, width - 1 :], dw, db, dxe[:, :, : width - 1])
    if adz is None or mx is None or mw is None:
        return values, None
    n_x = width + (q is not None)
    n_p = g.shape[0] * seqlen
    silu = saved.silu

    def mags(m: torch.Tensor, s: torch.Tensor | None, n: int) -> Magnitudes:
        return Magnitudes(m, n, elem=m if silu else None, zsens=s, n_z=saved.n_z)

    return values, {
        "dx": mags(mx[:, :, width - 1 :], None if sx is None else sx[:, :, width - 1 :], n_x),
        "dS": mags(mx[:, :, : width - 1], None if sx is None else sx[:, :, : width - 1], n_x),
        "dw": mags(mw, sw, n_p),
        "db": mags(adz.sum(dim=(0, 2)), None if sens is None else sens.sum(dim=(0, 2)), n_p),
    }


class _ReferenceFunction(torch.autograd.Function):
    """Autograd wrapper whose backward is ``conv_backward`` (no autograd on the forward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, seq_idx, activation):  # type: ignore[override]
        y, final, saved = conv_forward(x, weight, bias, initial_state, seq_idx, activation)
        ctx.saved = saved
        ctx.save_for_backward(weight)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.state_dtype = None if initial_state is None else initial_state.dtype
        return y, final

    @staticmethod
    def backward(ctx, g, q):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        dx, dw, db, ds = conv_backward(ctx.saved, weight, g, q)
        x_dt, w_dt, b_dt = ctx.dtypes
        return (
            dx.to(x_dt),
            dw.to(w_dt),
            None if b_dt is None else db.to(b_dt),
            None if ctx.state_dtype is None else ds.to(ctx.state_dtype),
            None,
            None,
        )


def reference_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    return_final_state: bool = False,
    activation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Differentiable float64 forward (explicit backward); outputs are float64."""
    y, final = _ReferenceFunction.apply(x, weight, bias, initial_state, seq_idx, activation)
    return (y, final) if return_final_state else y


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(F64).contiguous()


def _reference_core(args: CoreArgs) -> CoreCall:
    """``conv_forward`` / ``conv_backward`` on inputs already upcast to contiguous float64 (the
    oracle's own layout); the casts back to the input dtypes are left out."""
    x, state = args.x, args.initial_state
    if args.op == "update":
        x, state = update_history(args)
    x64, w64, b64, s64 = _f64(x), _f64(args.weight), _f64(args.bias), _f64(state)
    g64, q64 = _f64(args.grad_y), _f64(args.grad_final)
    seq_idx = None if args.seq_idx is None else args.seq_idx.cpu()

    def forward() -> tuple[torch.Tensor, torch.Tensor, Saved]:
        return conv_forward(x64, w64, b64, s64, seq_idx, args.activation)

    if args.op in ("fwd", "update"):
        return forward
    assert g64 is not None, "backward core calls need grad_y"
    if args.op == "fwd_bwd":
        return lambda: conv_backward(forward()[2], w64, g64, q64)
    saved = forward()[2]
    return lambda: conv_backward(saved, w64, g64, q64)


class ReferenceKernel(KernelBase):
    """The oracle as a kernel under test: computes in float64, returns the input dtype."""

    name = "reference"
    capabilities = Capabilities()

    def core_call(self, args: CoreArgs) -> CoreCall:  # type: ignore[override]
        return _reference_core(args)

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
        y, final = reference_forward(
            x,
            weight,
            bias,
            initial_state=initial_state,
            seq_idx=seq_idx,
            return_final_state=True,
            activation=activation,
        )
        y = y.to(x.dtype)
        return (y, final.to(x.dtype)) if return_final_state else y

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
        def forward(x, w, b, state, act):
            return conv_forward(x, w, b, state, None, act)[0]

        with torch.no_grad():
            return update_via_forward(
                forward, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )
