"""A canonical forward through a vLLM-style varlen ``causal_conv1d_fn`` (vLLM's own Triton
kernel and torch_mlu_ops' port of it share the API; ``convmatrix.kernels.adapters.mlu_ops`` lists
it).

- x (B, C, L) → token-major ``(C, B*L)`` (``stride(0) == 1``; a view for dense channel-last
  x), every batch row split into its sequences (runs of ``seq_idx``), delimited by
  ``query_start_loc``;
- one cache line per sequence, ``(N, C, K-1)`` laid out with ``stride(1) == 1`` in x's dtype
  (the API computes in the state dtype); the initial state goes to the line of the first
  sequence of its row (``has_initial_state``), the API reads the line's first K-1 columns, so
  the canonical state is copied unshifted;
- ``pad_slot_id=-1`` and ``cache_indices = arange(N)``: no sequence is padding to the API.
  (vLLM's kernel also compares each program's *sequence number* with ``pad_slot_id``, so a
  pad id of 0 there would skip sequence 0: the forward never passes its null block id.)
- the output ``(C, B*L)`` is viewed back as (B, C, L) (channel-last strides); padding tokens
  (own sequences, never given a state) are zeroed here, as docs/spec.md §2 asks;
- the final state is the line of each row's last sequence after the call (written by the
  API in place): per sequence (``Capabilities.final_state == "per_sequence"``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch

from convmatrix.kernels.adapters.mlu_ops import (
    SequenceRun,
    boundaries,
    check_final_state,
    runs_of,
    token_major,
)
from convmatrix.kernels.interface.protocol import ContractError
from convmatrix.kernels.interface.semantics import check_forward_args

__all__ = ["vllm_style_forward"]


def vllm_style_forward(
    fn: Callable[..., Any],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    activation: str | None,
    widths: Collection[int] | None,
    return_final_state: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A canonical forward (``Kernel.forward``'s result) from one call of ``fn``, without
    autograd (the vLLM-style APIs have no backward)."""
    batch, dim, seqlen, width = check_forward_args(
        x, weight, bias, initial_state, seq_idx, activation
    )
    if widths is not None and width not in widths:
        raise ContractError(f"width {width} not in {sorted(widths)}")
    runs = runs_of(seq_idx, batch, seqlen)
    with torch.no_grad():
        lines = x.new_zeros(len(runs), width - 1, dim).transpose(1, 2)
        has_state = torch.zeros(len(runs), dtype=torch.bool, device=x.device)
        if initial_state is not None:
            for i, run in enumerate(runs):
                if run.start == 0 and not run.padding:
                    lines[i] = initial_state[run.row]
                    has_state[i] = True
        out = fn(
            token_major(x).t(),
            weight,
            bias,
            lines,
            boundaries(runs, seqlen, x.device),
            cache_indices=torch.arange(len(runs), dtype=torch.int32, device=x.device),
            has_initial_state=has_state,
            activation=activation,
            pad_slot_id=-1,
        )
    y = out.t().reshape(batch, seqlen, dim).permute(0, 2, 1)
    if seq_idx is not None:
        y = y * (seq_idx.to(x.device) >= 0)[:, None, :].to(y.dtype)
    if not return_final_state:
        return y
    return y, _final_of_lines(lines, runs, width, batch).to(x.dtype)


def _final_of_lines(
    lines: torch.Tensor, runs: list[SequenceRun], width: int, batch: int
) -> torch.Tensor:
    """The canonical final state (B, C, K-1): the line of each row's last sequence, or
    ``ContractError`` where that differs from the row's last K-1 inputs."""
    check_final_state(runs, width, batch)
    last = {run.row: i for i, run in enumerate(runs)}  # the row's last sequence
    return lines[[last[b] for b in range(batch)]]
