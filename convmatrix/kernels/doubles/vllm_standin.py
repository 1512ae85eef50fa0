"""An in-project implementation of vLLM's causal conv1d API, written from the reference, so the
``vllm`` adapter's translation runs on a CPU (as ``mlu_standin`` does for torch_mlu_ops).

Not a mock of a convmatrix part: the API's conventions as read in vLLM's
``vllm/model_executor/layers/mamba/ops/causal_conv1d.py`` (commit 533d3378ca79, listed in
``convmatrix.kernels.adapters.vllm``), the arithmetic the float64 reference rounded once:

- ``causal_conv1d_fn``: the varlen forward of torch_mlu_ops' port, the same API and state
  convention (first K-1 columns of each cache line read and written), reused from
  ``mlu_standin``;
- ``causal_conv1d_update``: the history is the *first* K-1 columns of
  ``conv_state[conv_state_indices[b]]``, only those columns shift (the rest of a longer state
  is neither read nor written); a row whose index equals ``pad_slot_id`` is skipped and its
  output left unwritten; y is written into x (``out = x``) when x is already in the state
  dtype; ``conv_state_indices`` is required (the kernel loads it unconditionally).
"""

from __future__ import annotations

from typing import Any

import torch

from convmatrix.kernels.doubles.mlu_standin import causal_conv1d_fn
from convmatrix.kernels.interface.semantics import is_silu
from convmatrix.kernels.oracle.reference import conv_forward

__all__ = ["PAD_SLOT_ID", "causal_conv1d_fn", "causal_conv1d_update"]

PAD_SLOT_ID = -1  # vllm.attention.backends.utils.PAD_SLOT_ID, the API's default pad_slot_id


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: bool | str | None = None,
    conv_state_indices: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    max_query_len: int = -1,
    pad_slot_id: int = PAD_SLOT_ID,
    **unsupported: Any,
) -> torch.Tensor:
    """x (B, D, T) or (B, D) → y of the same shape, written into x when the dtypes allow."""
    if (
        num_accepted_tokens is not None
        or query_start_loc is not None
        or any(v is not None for v in unsupported.values())
    ):
        raise NotImplementedError("the stand-in covers the plain decode path the adapter uses")
    if conv_state_indices is None:
        raise ValueError("conv_state_indices is required (the kernel loads it unconditionally)")
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    elif activation is not None:
        assert is_silu(activation)
    original = x.dtype
    x = x.to(conv_state.dtype)
    unsqueeze = x.dim() == 2
    if unsqueeze:
        x = x.unsqueeze(-1)
    halo = weight.shape[1] - 1
    act = None if activation is None else "silu"
    out = x  # vLLM at 533d337: "overwrite on 'x' directly, rather than creating a new tensor"
    for b, line in enumerate(conv_state_indices.tolist()):
        if line == pad_slot_id:
            continue
        if not 0 <= line < conv_state.shape[0]:
            raise IndexError(f"conv_state_indices[{b}] = {line}: the kernel reads outside the pool")
        history = conv_state[line, :, :halo][None]
        y, final, _ = conv_forward(x[b : b + 1], weight, bias, history, None, act)
        out[b] = y[0].to(out.dtype)
        conv_state[line, :, :halo] = final[0].to(conv_state.dtype)
    if unsqueeze:
        out = out.squeeze(-1)
    return out.to(original)
