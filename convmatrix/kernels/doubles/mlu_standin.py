"""In-project implementations of torch_mlu_ops' causal conv1d APIs, written from the reference.

Not mocks of convmatrix parts: reference implementations of a third-party API (signatures and
state conventions as listed in ``convmatrix.kernels.adapters.mlu_ops``), so the MLU adapters'
translation (token-major 2-D x, ``query_start_loc`` / ``cu_seqlens``, state width W vs W-1, first
vs last W-1 columns, in-place state writes) can be tested on CPU. The arithmetic is the float64
reference per sequence, rounded to the output dtype once; the library's own checks are
reproduced (``ValueError`` for widths above 4 / final states, ``AssertionError`` for a
conv_states layout the kernel would misread).
"""

from __future__ import annotations

from typing import Any

import torch

from convmatrix.kernels.adapters.mlu_ops import MluOps
from convmatrix.kernels.interface.semantics import is_silu
from convmatrix.kernels.oracle.reference import conv_forward, reference_forward

__all__ = ["STANDIN_OPS", "causal_conv1d", "causal_conv1d_fn", "causal_conv1d_update"]


def _activation(activation: Any) -> str | None:
    return "silu" if activation is True or is_silu(activation) else None


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: Any = "silu",
    pad_slot_id: int = -1,
    **_: Any,
) -> torch.Tensor:
    """vLLM-style varlen forward: x (dim, tokens) → out (dim, tokens); conv_states updated.

    Sequence i: tokens ``query_start_loc[i]:query_start_loc[i+1]``, cache line
    ``cache_indices[i]`` (i when None; ``pad_slot_id`` = not processed, output left unwritten),
    initial state = the line's first K-1 columns when ``has_initial_state[i]`` else zeros;
    afterwards the line's first K-1 columns hold the last K-1 inputs of (state, tokens).
    """
    if x.shape[0] != weight.shape[0]:
        raise ValueError("[CausalConv1d] x.shape[0] must be equal to weight.shape[0].")
    if weight.shape[-1] > 4:
        raise ValueError("[CausalConv1d] weight.shape[-1] must be less than or equal to 4.")
    assert conv_states.stride(1) == 1, "conv_states must be (lines, dim, width) with dim stride 1"
    width = weight.shape[1]
    halo = width - 1
    assert conv_states.shape[1] == x.shape[0] and conv_states.shape[2] >= halo
    original = x.dtype
    x = x.to(conv_states.dtype)  # the library computes in the state dtype
    out = torch.full_like(x, float("nan"))  # unwritten entries stay visible
    starts = query_start_loc.tolist()
    for i in range(len(starts) - 1):
        line = i if cache_indices is None else int(cache_indices[i])
        if line == pad_slot_id:
            continue
        seq = x[:, starts[i] : starts[i + 1]][None]  # (1, dim, n)
        use_state = has_initial_state is not None and bool(has_initial_state[i])
        state = conv_states[line, :, :halo][None] if use_state else None
        y, final, _ = conv_forward(seq, weight, bias, state, None, _activation(activation))
        out[:, starts[i] : starts[i + 1]] = y[0].to(out.dtype)
        conv_states[line, :, :halo] = final[0].to(conv_states.dtype)
    return out.to(original)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    backend: str | None = "triton",
    cu_seqlens: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """fla-style forward (differentiable): x (B, T, D) → (y (B, T, D), None).

    ``initial_state`` (N, D, W): sequence n starts from its last W-1 columns (column 0 is
    never read, so its gradient is 0). With ``cu_seqlens`` x is (1, total, D) and sequence n
    is tokens ``cu_seqlens[n]:cu_seqlens[n+1]``.
    """
    if output_final_state is True:
        raise ValueError("[CausalConv1d] output_final_state true not supported.")
    if backend != "triton":
        raise ValueError(f"[CausalConv1d] Unsupported backend: {backend}")
    if weight is not None and x.shape[-1] != weight.shape[0]:
        raise ValueError("[CausalConv1d] x.shape[-1] must be equal to weight.shape[0].")
    act = _activation(activation)
    if cu_seqlens is None:
        spans = [(n, x[n], initial_state) for n in range(x.shape[0])]
    else:
        bounds = cu_seqlens.tolist()
        spans = [
            (n, x[0, bounds[n] : bounds[n + 1]], initial_state) for n in range(len(bounds) - 1)
        ]
    pieces = []
    for n, tokens, states in spans:
        state = None if states is None else states[n : n + 1, :, 1:]
        y = reference_forward(tokens.t()[None], weight, bias, initial_state=state, activation=act)
        pieces.append(y[0].t())  # (T_n, D)
    y = torch.cat(pieces, 0).reshape(x.shape).to(x.dtype)
    if residual is not None:
        y = y + residual
    return y, None


def causal_conv1d_update(
    x: torch.Tensor,
    cache: torch.Tensor,
    residual: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla-style one-token update: x (N, D), cache (N, D, W) shifted left in place with x in
    its last column; y = sum(cache * weight) + bias (SiLU optional), in x's dtype."""
    assert cache.is_contiguous(), "the kernel addresses cache as a contiguous (N, D, W) block"
    cache[:, :, :-1] = cache[:, :, 1:].clone()
    cache[:, :, -1] = x.to(cache.dtype)
    z = (cache.double() * weight.double()[None]).sum(-1)
    if bias is not None:
        z = z + bias.double()
    y = z * torch.sigmoid(z) if _activation(activation) else z
    if residual is not None:
        y = y + residual.double()
    return y.to(x.dtype), cache


STANDIN_OPS = MluOps(causal_conv1d_fn, causal_conv1d, causal_conv1d_update, label="standin")
