"""The framework path ``torch``: what a PyTorch user writes, in the input dtype, on any device.

It is the same-dtype baseline of docs/spec.md §4: a kernel's error is judged against the error this
path makes at the same dtype. Depthwise ``F.conv1d`` with ``groups=C`` over the state-padded
input, SiLU after the bias, autograd for backward. Packed sequences run segment by segment
(a user splits at sequence boundaries); padding tokens output zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convmatrix.kernels.interface.corecall import CoreArgs, CoreCall, update_history
from convmatrix.kernels.interface.protocol import Capabilities, KernelBase
from convmatrix.kernels.interface.semantics import (
    check_forward_args,
    final_state,
    is_silu,
    update_via_forward,
)

__all__ = ["TorchKernel", "torch_forward"]


def _conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    width = weight.shape[1]
    dtype = x.dtype
    if state is None:
        xe = F.pad(x, (width - 1, 0))
    else:
        xe = torch.cat([state.to(dtype), x], dim=2)
    w = weight.to(dtype).unsqueeze(1)
    b = None if bias is None else bias.to(dtype)
    y = F.conv1d(xe, w, b, groups=x.shape[1])
    return F.silu(y) if is_silu(activation) else y


def _packed(x, weight, bias, state, seq_idx, activation) -> torch.Tensor:
    """Split each row at sequence boundaries; the initial state feeds the first segment."""
    rows = []
    ids = seq_idx.tolist()
    for b, row_ids in enumerate(ids):
        pieces, start = [], 0
        for t in range(1, len(row_ids) + 1):
            if t < len(row_ids) and row_ids[t] == row_ids[start]:
                continue
            seg = x[b : b + 1, :, start:t]
            if row_ids[start] < 0:
                pieces.append(torch.zeros_like(seg))
            else:
                seg_state = state[b : b + 1] if (state is not None and start == 0) else None
                pieces.append(_conv(seg, weight, bias, seg_state, activation))
            start = t
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows, dim=0)


def torch_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    return_final_state: bool = False,
    activation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    *_, width = check_forward_args(x, weight, bias, initial_state, seq_idx, activation)
    if seq_idx is None:
        y = _conv(x, weight, bias, initial_state, activation)
    else:
        y = _packed(x, weight, bias, initial_state, seq_idx, activation)
    if not return_final_state:
        return y
    return y, final_state(x, initial_state, width)


def _torch_core(args: CoreArgs) -> CoreCall | None:
    """``F.conv1d`` (+ SiLU) on the state-padded input, weights already in x's dtype and
    shape; backward by autograd of that one graph. Packed sequences have no single core call
    (the path splits them in Python): None."""
    if args.seq_idx is not None:
        return None
    x, state = args.x, args.initial_state
    if args.op == "update":
        x, state = update_history(args)
    width = args.weight.shape[1]
    pad = x.new_zeros(*x.shape[:2], width - 1) if state is None else state
    xe = torch.cat([pad.to(x.dtype), x], dim=2).contiguous()
    w = args.weight.detach().to(x.dtype).unsqueeze(1).contiguous()
    b = None if args.bias is None else args.bias.detach().to(x.dtype).contiguous()
    leaves = [t for t in (xe, w, b) if t is not None]
    grad = args.op in ("fwd_bwd", "bwd")
    for t in leaves:
        t.requires_grad_(grad)

    def forward() -> list[torch.Tensor]:
        with torch.set_grad_enabled(grad):
            y = F.conv1d(xe, w, b, groups=x.shape[1])
            return [F.silu(y) if args.silu else y, xe[:, :, x.shape[2] :]]

    if not grad:
        return lambda: forward()[0].detach()
    assert args.grad_y is not None, "backward core calls need grad_y"
    upstream = [args.grad_y.to(x.dtype)]
    if args.grad_final is not None:
        upstream.append(args.grad_final.to(x.dtype))

    def backward(outs: list[torch.Tensor], retain: bool) -> object:
        used = outs[: len(upstream)]
        return torch.autograd.grad(used, leaves, upstream, retain_graph=retain)

    if args.op == "fwd_bwd":
        return lambda: backward(forward(), False)
    saved = forward()
    return lambda: backward(saved, True)


class TorchKernel(KernelBase):
    name = "torch"
    # F.conv1d, SiLU and autograd compute in the input dtype (the weight is cast to it):
    # every intermediate result is rounded to it (docs/spec.md §4 bound model).
    capabilities = Capabilities(intermediate="input")

    def core_call(self, args: CoreArgs) -> CoreCall | None:  # type: ignore[override]
        return _torch_core(args)

    def forward(self, x, weight, bias=None, **kwargs):  # type: ignore[override]
        return torch_forward(x, weight, bias, **kwargs)

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
        with torch.no_grad():
            return update_via_forward(
                _conv, x, conv_state, weight, bias, activation, cache_seqlens, state_indices
            )
