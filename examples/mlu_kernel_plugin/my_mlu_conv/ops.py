"""The team's operator as a torch custom op, dispatched per device by torch.library.

``my_mlu_conv::causal_conv1d_fwd(x, weight, bias, initial_state, silu) -> y`` has a portable
implementation (FP32 tap loop, registered for every device) so the example runs anywhere.
On an MLU machine, ``register_mlu()`` points the op's ``mlu`` dispatch key at the team's BANG C
extension (built with torch_mlu's ``BuildExtension``; a module ``my_mlu_conv._bang`` exposing
``causal_conv1d_fwd`` with the same signature). Callers never change: they call
``torch.ops.my_mlu_conv.causal_conv1d_fwd`` and the tensors' device picks the implementation.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["causal_conv1d_fwd", "register_mlu"]


@torch.library.custom_op("my_mlu_conv::causal_conv1d_fwd", mutates_args=())
def causal_conv1d_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    silu: bool,
) -> torch.Tensor:
    """y = act(bias + sum_k weight[:, k] * xe[t + k]), xe = cat(state or zeros, x); FP32 sums."""
    width = weight.shape[1]
    batch, dim, seqlen = x.shape
    if initial_state is None:
        initial_state = x.new_zeros(batch, dim, width - 1)
    xe = torch.cat([initial_state.to(x.dtype), x], dim=2).float()
    z = torch.zeros(batch, dim, seqlen, device=x.device)
    if bias is not None:
        z += bias.float()[None, :, None]
    w = weight.float()
    for k in range(width):
        z += xe[:, :, k : k + seqlen] * w[None, :, k, None]
    return (z * torch.sigmoid(z) if silu else z).to(x.dtype)


@causal_conv1d_fwd.register_fake
def _(x, weight, bias, initial_state, silu):
    return torch.empty_like(x)


def register_mlu() -> bool:
    """Route the op's MLU dispatch to the BANG C extension when torch_mlu and it are present."""
    try:
        importlib.import_module("torch_mlu")
        bang = importlib.import_module("my_mlu_conv._bang")
    except ImportError:
        return False
    causal_conv1d_fwd.register_kernel("mlu")(bang.causal_conv1d_fwd)
    return True
